//! The queue in PostgreSQL (`[store] backend = "postgres"`), shared by the approver's replicas:
//! table `approver_approvals` (migration 0002 of `warden-pgstate`). Any replica shows and
//! answers any request. The first answer wins across replicas with one conditional UPDATE
//! (`... WHERE id = $1 AND state = 0`); the loser reads the decision that stands. Every change
//! is NOTIFYed on [`CHANNEL`] with the approval's id in the same statement, so it is delivered
//! when (and only if) the change commits; [`crate::queue::Queue`] listens and tells its local
//! waiters and watchers.

use prost::Message;
use warden_pgstate::tokio_postgres::{self, error::SqlState, types::ToSql};
use warden_pgstate::{Pg, PgError};
use warden_proto::v1 as pb;

use crate::queue_store::{
    Held, QueueError, QueueStore, Resolution, ResolveError, now_ms, withdrawn,
};

/// The notification channel; the payload is the approval id.
pub const CHANNEL: &str = "warden_approver";

const PENDING: i32 = pb::ApprovalState::Pending as i32;
const APPROVED: i32 = pb::ApprovalState::Approved as i32;

pub struct PgQueue {
    pg: Pg,
    keep: i64,
}

fn decode(id: &str, bytes: &[u8]) -> Result<pb::Approval, QueueError> {
    pb::Approval::decode(bytes).map_err(|source| QueueError::Decode {
        key: format!("approver_approvals {id}"),
        source,
    })
}

fn approval_of(row: &tokio_postgres::Row) -> Result<pb::Approval, QueueError> {
    let id: &str = row.try_get(0).map_err(PgError::from)?;
    let bytes: &[u8] = row.try_get(1).map_err(PgError::from)?;
    decode(id, bytes)
}

fn ms(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

impl PgQueue {
    pub fn new(pg: Pg, keep: usize) -> Self {
        PgQueue {
            pg,
            keep: keep.min(i64::MAX as usize) as i64,
        }
    }

    /// One statement, bounded by the connect timeout; returns its rows.
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, PgError> {
        let run = async {
            let c = self.pg.client().await?;
            Ok::<_, PgError>(c.query(sql, params).await?)
        };
        tokio::time::timeout(self.pg.timeout(), run)
            .await
            .map_err(|_| PgError::Timeout(self.pg.timeout().as_millis() as u64))?
    }

    async fn one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<pb::Approval>, QueueError> {
        let rows = self.query(sql, params).await?;
        rows.first().map(approval_of).transpose()
    }

    async fn many(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<pb::Approval>, QueueError> {
        let rows = self.query(sql, params).await?;
        rows.iter().map(approval_of).collect()
    }
}

impl PgQueue {
    /// Writes `a` as it is (an import from sled); `false` when its id or request id was
    /// already there (nothing is written twice).
    pub async fn import(&self, a: &pb::Approval) -> Result<bool, QueueError> {
        let request_id = a
            .request
            .as_ref()
            .map(|r| r.request_id.clone())
            .unwrap_or_default();
        let rows = self
            .query(
                "INSERT INTO approver_approvals
                   (id, request_id, state, created_unix_ms, answered_unix_ms, approval)
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING id",
                &[
                    &a.id,
                    &request_id,
                    &(a.state() as i32),
                    &ms(a.created_unix_ms),
                    &ms(a.answered_unix_ms),
                    &a.encode_to_vec(),
                ],
            )
            .await?;
        Ok(!rows.is_empty())
    }
}

#[tonic::async_trait]
impl QueueStore for PgQueue {
    async fn hold(&self, a: &pb::Approval) -> Result<Held, QueueError> {
        let request_id = a
            .request
            .as_ref()
            .map(|r| r.request_id.clone())
            .unwrap_or_default();
        let r = self
            .query(
                "WITH i AS (
                   INSERT INTO approver_approvals (id, request_id, state, created_unix_ms, approval)
                   VALUES ($1, $2, 0, $3, $4) RETURNING id)
                 SELECT pg_notify('warden_approver', id) FROM i",
                &[
                    &a.id,
                    &request_id,
                    &ms(a.created_unix_ms),
                    &a.encode_to_vec(),
                ],
            )
            .await;
        match r {
            Ok(_) => Ok(Held::New),
            // Another replica held the same supervisor request a moment earlier.
            Err(PgError::Db(e)) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                match self.by_request(&request_id).await? {
                    Some(existing) => Ok(Held::Exists(Box::new(existing))),
                    None => Err(QueueError::Pg(PgError::Db(e))),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn get(&self, id: &str) -> Result<Option<pb::Approval>, QueueError> {
        self.one(
            "SELECT id, approval FROM approver_approvals WHERE id = $1",
            &[&id],
        )
        .await
    }

    async fn by_request(&self, request_id: &str) -> Result<Option<pb::Approval>, QueueError> {
        if request_id.is_empty() {
            return Ok(None);
        }
        self.one(
            "SELECT id, approval FROM approver_approvals WHERE request_id = $1",
            &[&request_id],
        )
        .await
    }

    async fn pending(&self, limit: usize) -> Result<Vec<pb::Approval>, QueueError> {
        let limit = limit.min(100_000) as i64;
        self.many(
            "SELECT id, approval FROM approver_approvals WHERE state = 0
             ORDER BY created_unix_ms DESC, id LIMIT $1",
            &[&limit],
        )
        .await
    }

    async fn pending_count(&self) -> Result<usize, QueueError> {
        let rows = self
            .query(
                "SELECT count(*) FROM approver_approvals WHERE state = 0",
                &[],
            )
            .await?;
        match rows.first() {
            Some(r) => Ok(r.try_get::<_, i64>(0).map_err(PgError::from)?.max(0) as usize),
            None => Ok(0),
        }
    }

    async fn history(&self, limit: usize) -> Result<Vec<pb::Approval>, QueueError> {
        let limit = limit.min(100_000) as i64;
        self.many(
            "SELECT id, approval FROM approver_approvals WHERE state <> 0
             ORDER BY answered_unix_ms DESC, id DESC LIMIT $1",
            &[&limit],
        )
        .await
    }

    async fn resolve(&self, id: &str, r: &Resolution) -> Result<pb::Approval, ResolveError> {
        let Some(current) = self.get(id).await? else {
            return Err(ResolveError::NotFound(id.to_string()));
        };
        if current.state() != pb::ApprovalState::Pending {
            return Err(ResolveError::AlreadyDecided(Box::new(current)));
        }
        // A pending row's bytes never change until it is decided, so the decision is computed
        // from them and written only if the row is still pending: of two replicas answering at
        // once, one UPDATE matches, the other matches nothing.
        let a = r.apply(current, now_ms());
        let won = self
            .query(
                "WITH u AS (
                   UPDATE approver_approvals SET state = $2, answered_unix_ms = $3, approval = $4
                   WHERE id = $1 AND state = $5 RETURNING id)
                 SELECT pg_notify('warden_approver', id) FROM u",
                &[
                    &id,
                    &(a.state() as i32),
                    &ms(a.answered_unix_ms),
                    &a.encode_to_vec(),
                    &PENDING,
                ],
            )
            .await
            .map_err(QueueError::from)?;
        if won.is_empty() {
            return match self.get(id).await? {
                Some(stands) => Err(ResolveError::AlreadyDecided(Box::new(stands))),
                None => Err(ResolveError::NotFound(id.to_string())),
            };
        }
        // History stays bounded (best effort: a failure here changes no decision).
        if let Err(e) = self
            .query(
                "DELETE FROM approver_approvals WHERE id IN (
                   SELECT id FROM approver_approvals WHERE state <> 0
                   ORDER BY answered_unix_ms DESC, id DESC OFFSET $1)",
                &[&self.keep],
            )
            .await
        {
            tracing::warn!(error = %e, "cannot trim the approval history");
        }
        Ok(a)
    }

    async fn supersede(&self, id: &str, reason: &str) -> Result<Option<pb::Approval>, QueueError> {
        let Some(current) = self.get(id).await? else {
            return Ok(None);
        };
        if current.state() != pb::ApprovalState::Approved {
            return Ok(None);
        }
        let a = withdrawn(current, reason, now_ms());
        let changed = self
            .query(
                "WITH u AS (
                   UPDATE approver_approvals SET state = $2, approval = $3
                   WHERE id = $1 AND state = $4 RETURNING id)
                 SELECT pg_notify('warden_approver', id) FROM u",
                &[&id, &(a.state() as i32), &a.encode_to_vec(), &APPROVED],
            )
            .await?;
        Ok((!changed.is_empty()).then_some(a))
    }

    fn backend(&self) -> &'static str {
        "postgres"
    }
}
