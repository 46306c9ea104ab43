//! The audit log in PostgreSQL (`[store] backend = "postgres"`), shared by the policy's
//! replicas: table `policy_audit` (migration 0001 of `warden-pgstate`), one row per decision,
//! the prost-encoded record as its bytes.
//!
//! Group commit: appends queue for one writer task; it takes every record queued so far and
//! inserts them with one statement (one implicit transaction, one WAL flush at its commit),
//! then tells each waiter. While a commit is under way the next batch gathers, so concurrent
//! decisions share a commit as they share the sled backend's `fdatasync`. A decision is
//! answered only after the commit of its row returned.
//!
//! A write that fails or does not finish within the connect timeout is an error for every
//! record of its batch: the service answers those decisions DENY (`audit.unavailable`) and
//! counts them. Each row carries its own deadline (its caller's, or the writer's if sooner)
//! and the statement inserts no row whose deadline the server's clock has passed (a hung
//! server thawing, a lock waited for); a record whose caller has already stopped waiting is
//! not sent at all. What is left — a commit that began before a row's deadline and was
//! acknowledged after it — is closed by the service's correction ([`AuditStore::correct`]: an
//! upsert on the decision id, which waits for such a commit and then overwrites its row).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prost::Message;
use tokio::sync::{mpsc, oneshot};
use warden_pgstate::{Pg, PgError};
use warden_proto::v1 as pb;

use crate::audit::AuditError;
use crate::audit_store::AuditStore;
use crate::retention::{Pruned, Retention};

/// A batch holds at most this many records: one statement's arrays stay a few MiB.
const MAX_BATCH: usize = 512;

/// Records waiting for the writer at most; past it an append waits for room (within its
/// caller's deadline).
const QUEUE: usize = 4096;

struct Pending {
    decision_id: String,
    request_id: String,
    context_id: String,
    decided_at: i64,
    bytes: Vec<u8>,
    /// Unix ms after which this row must not land (0 = only the writer's own deadline).
    deadline: i64,
    done: oneshot::Sender<Result<(), String>>,
}

/// The PostgreSQL audit log of one replica.
pub struct PgAudit {
    pg: Pg,
    queue: mpsc::Sender<Pending>,
    stats: Arc<Stats>,
}

/// What the writer did, for tests and Status.
#[derive(Default)]
pub struct Stats {
    /// Statements (transactions) committed.
    pub commits: AtomicU64,
    /// Records committed.
    pub records: AtomicU64,
}

impl PgAudit {
    /// Starts the writer on `pg` (already migrated).
    pub fn start(pg: Pg) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let stats = Arc::new(Stats::default());
        tokio::spawn(writer(pg.clone(), rx, stats.clone()));
        PgAudit {
            pg,
            queue: tx,
            stats,
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    fn timeout_err(&self) -> AuditError {
        AuditError::Pg(PgError::Timeout(self.pg.timeout().as_millis() as u64))
    }

    /// One query, bounded by the connect timeout.
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, AuditError> {
        let run = async {
            let c = self.pg.client().await?;
            Ok::<_, PgError>(c.query(sql, params).await?)
        };
        match tokio::time::timeout(self.pg.timeout(), run).await {
            Ok(r) => r.map_err(AuditError::Pg),
            Err(_) => Err(self.timeout_err()),
        }
    }
}

use warden_pgstate::tokio_postgres;

async fn writer(pg: Pg, mut rx: mpsc::Receiver<Pending>, stats: Arc<Stats>) {
    let mut batch: Vec<Pending> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        // A caller that stopped waiting has answered DENY: its record is not sent at all.
        batch.retain(|p| !p.done.is_closed());
        if batch.is_empty() {
            continue;
        }
        // The server inserts no row once the writer has given up on it or its caller's
        // deadline passed (see `insert`): a statement delayed in a hung server's socket, or
        // behind a lock, does not land later.
        let deadline = now_ms() + pg.timeout().as_millis() as i64;
        let result = match tokio::time::timeout(pg.timeout(), insert(&pg, &batch, deadline)).await {
            Ok(Ok(landed)) => Ok(landed),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no commit within {} ms", pg.timeout().as_millis())),
        };
        match &result {
            Ok(landed) => {
                stats.commits.fetch_add(1, Ordering::Relaxed);
                stats
                    .records
                    .fetch_add(landed.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::error!(records = batch.len(), error = %e, target = %pg.target(), "audit commit failed");
            }
        }
        for p in batch.drain(..) {
            let r = match &result {
                Ok(landed) if landed.contains(&p.decision_id) => Ok(()),
                Ok(_) => Err("not written before its deadline".to_string()),
                Err(e) => Err(e.clone()),
            };
            let _ = p.done.send(r);
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One statement for the whole batch: its implicit transaction commits the rows it inserts or
/// none, and it inserts no row whose deadline (its own, or `deadline_ms` when sooner or unset)
/// the server's clock has passed when it runs (the writer's clock set them; the writer has then
/// answered those decisions DENY). A decision id already present (its correction got there
/// first) is left as it is. Returns the decision ids inserted. The window left is a commit that
/// starts before a deadline and is acknowledged after it, and the clocks' difference between
/// the two hosts; the service's correction closes it.
async fn insert(
    pg: &Pg,
    batch: &[Pending],
    deadline_ms: i64,
) -> Result<std::collections::HashSet<String>, PgError> {
    let client = pg.client().await?;
    let ids: Vec<&str> = batch.iter().map(|p| p.decision_id.as_str()).collect();
    let reqs: Vec<&str> = batch.iter().map(|p| p.request_id.as_str()).collect();
    let ctxs: Vec<&str> = batch.iter().map(|p| p.context_id.as_str()).collect();
    let at: Vec<i64> = batch.iter().map(|p| p.decided_at).collect();
    let recs: Vec<&[u8]> = batch.iter().map(|p| p.bytes.as_slice()).collect();
    let due: Vec<i64> = batch
        .iter()
        .map(|p| match p.deadline {
            0 => deadline_ms,
            d => d.min(deadline_ms),
        })
        .collect();
    let stmt = client
        .prepare_cached(
            "INSERT INTO policy_audit (decision_id, request_id, context_id, decided_at_unix_ms, record)
             SELECT d, r, c, a, rec
               FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::bytea[], $6::int8[])
                    AS u(d, r, c, a, rec, due)
              WHERE extract(epoch FROM clock_timestamp()) * 1000 < due
             ON CONFLICT (decision_id) DO NOTHING
             RETURNING decision_id",
        )
        .await?;
    let rows = client
        .query(&stmt, &[&ids, &reqs, &ctxs, &at, &recs, &due])
        .await?;
    rows.iter()
        .map(|r| r.try_get::<_, String>(0).map_err(PgError::from))
        .collect()
}

fn record_of(row: &tokio_postgres::Row) -> Result<pb::AuditRecord, AuditError> {
    let seq: i64 = row.try_get(0).map_err(PgError::from)?;
    let bytes: &[u8] = row.try_get(1).map_err(PgError::from)?;
    decode(seq, bytes)
}

fn cursored_of(row: &tokio_postgres::Row) -> Result<(u64, pb::AuditRecord), AuditError> {
    let seq: i64 = row.try_get(0).map_err(PgError::from)?;
    Ok((seq.max(0) as u64, record_of(row)?))
}

fn decode(seq: i64, bytes: &[u8]) -> Result<pb::AuditRecord, AuditError> {
    pb::AuditRecord::decode(bytes).map_err(|source| AuditError::Decode {
        key: format!("policy_audit seq {seq}"),
        source,
    })
}

#[tonic::async_trait]
impl AuditStore for PgAudit {
    async fn append(&self, record: &pb::AuditRecord, durable: bool) -> Result<(), AuditError> {
        self.append_by(record, durable, 0).await
    }

    async fn append_by(
        &self,
        record: &pb::AuditRecord,
        _durable: bool,
        deadline_unix_ms: u64,
    ) -> Result<(), AuditError> {
        // What the table keeps is the bounded record (`audit_bounds`).
        let record = &crate::audit_bounds::bounded(record);
        let (done, rx) = oneshot::channel();
        let p = Pending {
            decision_id: record.decision_id.clone(),
            request_id: record.request_id.clone(),
            context_id: record
                .subject
                .as_ref()
                .map(|s| s.context_id.clone())
                .unwrap_or_default(),
            decided_at: record.decided_at_unix_ms.min(i64::MAX as u64) as i64,
            bytes: record.encode_to_vec(),
            deadline: deadline_unix_ms.min(i64::MAX as u64) as i64,
            done,
        };
        match tokio::time::timeout(self.pg.timeout(), self.queue.send(p)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(AuditError::FlushTask("the audit writer stopped".into())),
            Err(_) => return Err(self.timeout_err()),
        }
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(AuditError::Unavailable(e)),
            Err(_) => Err(AuditError::FlushTask("the audit writer stopped".into())),
        }
    }

    /// An upsert on the decision id: a row of that decision committed meanwhile (or one whose
    /// commit is still under way: the unique index makes this wait for it) is overwritten in
    /// place, keeping its position in the log; otherwise the record is added.
    async fn correct(&self, record: &pb::AuditRecord) -> Result<(), AuditError> {
        let record = &crate::audit_bounds::bounded(record);
        let context = record
            .subject
            .as_ref()
            .map(|s| s.context_id.as_str())
            .unwrap_or("");
        let at = record.decided_at_unix_ms.min(i64::MAX as u64) as i64;
        let bytes = record.encode_to_vec();
        self.query(
            "INSERT INTO policy_audit (decision_id, request_id, context_id, decided_at_unix_ms, record)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (decision_id) DO UPDATE SET record = EXCLUDED.record",
            &[&record.decision_id, &record.request_id, &context, &at, &bytes],
        )
        .await
        .map(|_| ())
    }

    async fn by_decision_id(&self, id: &str) -> Result<Option<pb::AuditRecord>, AuditError> {
        let rows = self
            .query(
                "SELECT seq, record FROM policy_audit WHERE decision_id = $1",
                &[&id],
            )
            .await?;
        match rows.first() {
            Some(r) => Ok(Some(record_of(r)?)),
            None => Ok(None),
        }
    }

    async fn newest(
        &self,
        limit: usize,
        context_id: Option<&str>,
    ) -> Result<Vec<pb::AuditRecord>, AuditError> {
        // The same query as `newest_cursored`, without the cursors.
        Ok(self
            .newest_cursored(limit, context_id)
            .await?
            .into_iter()
            .map(|(_, r)| r)
            .collect())
    }

    async fn head(&self) -> Result<u64, AuditError> {
        let rows = self
            .query("SELECT COALESCE(max(seq), 0) FROM policy_audit", &[])
            .await?;
        match rows.first() {
            Some(r) => Ok(r.try_get::<_, i64>(0).map_err(PgError::from)?.max(0) as u64),
            None => Ok(0),
        }
    }

    async fn newest_cursored(
        &self,
        limit: usize,
        context_id: Option<&str>,
    ) -> Result<Vec<(u64, pb::AuditRecord)>, AuditError> {
        let limit = limit.min(100_000) as i64;
        let rows = match context_id {
            Some(c) => {
                self.query(
                    "SELECT seq, record FROM policy_audit WHERE context_id = $1 ORDER BY seq DESC LIMIT $2",
                    &[&c, &limit],
                )
                .await?
            }
            None => {
                self.query(
                    "SELECT seq, record FROM policy_audit ORDER BY seq DESC LIMIT $1",
                    &[&limit],
                )
                .await?
            }
        };
        rows.iter().map(cursored_of).collect()
    }

    async fn after(
        &self,
        cursor: u64,
        limit: usize,
    ) -> Result<Vec<(u64, pb::AuditRecord)>, AuditError> {
        let cursor = cursor.min(i64::MAX as u64) as i64;
        let limit = limit.min(100_000) as i64;
        let rows = self
            .query(
                "SELECT seq, record FROM policy_audit WHERE seq > $1 ORDER BY seq LIMIT $2",
                &[&cursor, &limit],
            )
            .await?;
        rows.iter().map(cursored_of).collect()
    }

    /// `seq` is taken at INSERT and seen at COMMIT: another replica's row with a smaller seq
    /// can appear after a larger one, but only within its writer's deadline (the statement
    /// inserts nothing past it, see `insert`), so a hole older than that stays a hole.
    fn settle(&self) -> std::time::Duration {
        self.pg.timeout() + std::time::Duration::from_secs(1)
    }

    async fn newest_of_request(
        &self,
        request_id: &str,
    ) -> Result<Option<pb::AuditRecord>, AuditError> {
        let rows = self
            .query(
                "SELECT seq, record FROM policy_audit WHERE request_id = $1 ORDER BY seq DESC LIMIT 1",
                &[&request_id],
            )
            .await?;
        rows.first().map(record_of).transpose()
    }

    async fn count(&self) -> Result<u64, AuditError> {
        let rows = self.query("SELECT count(*) FROM policy_audit", &[]).await?;
        match rows.first() {
            Some(r) => Ok(r.try_get::<_, i64>(0).map_err(PgError::from)?.max(0) as u64),
            None => Ok(0),
        }
    }

    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn prune(&self, retention: &Retention) -> Result<Pruned, AuditError> {
        PgAudit::prune(self, retention).await
    }
}

/// Retention (`crate::retention`), kept apart from the append path. Replicas sharing the table
/// each run it: a row is deleted once, by whichever gets to it, and counted by that one.
impl PgAudit {
    /// One retention pass: the oldest rows beyond the newest `max_records`, then the rows among
    /// the oldest `pass` decided before the age bound (rows are numbered in the order they were
    /// committed, so the oldest are first; the primary key's order is the only index used).
    pub async fn prune(&self, retention: &Retention) -> Result<Pruned, AuditError> {
        let pass = retention.pass as i64;
        let mut pruned = Pruned::default();
        if retention.max_records > 0 {
            let max = retention.max_records.min(i64::MAX as u64) as i64;
            let rows = self
                .query(
                    "WITH doomed AS (
                         SELECT seq FROM policy_audit ORDER BY seq
                         LIMIT LEAST($2::int8, GREATEST(0, (SELECT count(*) FROM policy_audit) - $1::int8))
                     )
                     DELETE FROM policy_audit WHERE seq IN (SELECT seq FROM doomed) RETURNING seq",
                    &[&max, &pass],
                )
                .await?;
            pruned.by_count = rows.len() as u64;
        }
        let left = pass - pruned.by_count as i64;
        if retention.cutoff_unix_ms > 0 && left > 0 {
            let cutoff = retention.cutoff_unix_ms.min(i64::MAX as u64) as i64;
            let rows = self
                .query(
                    "WITH oldest AS (
                         SELECT seq, decided_at_unix_ms FROM policy_audit ORDER BY seq LIMIT $2::int8
                     )
                     DELETE FROM policy_audit WHERE seq IN
                         (SELECT seq FROM oldest WHERE decided_at_unix_ms < $1::int8)
                     RETURNING seq",
                    &[&cutoff, &left],
                )
                .await?;
            pruned.by_age = rows.len() as u64;
        }
        Ok(pruned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch the server runs after the writer's deadline inserts nothing (what a statement
    /// held in a frozen server's socket does when it thaws), and says so.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_run_after_the_writers_deadline_inserts_nothing()
    -> Result<(), Box<dyn std::error::Error>> {
        let Some(c) = warden_pgstate::cluster::TestCluster::start_or_skip()? else {
            return Ok(());
        };
        c.create_db("audit")?;
        let pg = Pg::new(&warden_pgstate::StoreSection::postgres(c.url("audit")))?;
        warden_pgstate::migrate::migrate(&pg).await?;
        let pending = |id: &str| Pending {
            decision_id: id.into(),
            request_id: format!("r-{id}"),
            context_id: "c".into(),
            decided_at: 0,
            bytes: pb::AuditRecord {
                decision_id: id.into(),
                ..Default::default()
            }
            .encode_to_vec(),
            deadline: 0,
            done: oneshot::channel().0,
        };
        let late = insert(&pg, &[pending("late")], now_ms() - 1).await?;
        assert!(
            late.is_empty(),
            "a late batch was reported written: {late:?}"
        );
        // Each row by its own deadline: one past it, one within it, in one statement.
        let mut past = pending("caller-gone");
        past.deadline = now_ms() - 1;
        let landed = insert(&pg, &[past, pending("on-time")], now_ms() + 5_000).await?;
        assert_eq!(landed.into_iter().collect::<Vec<_>>(), ["on-time"]);
        let rows = pg
            .client()
            .await?
            .query("SELECT decision_id FROM policy_audit", &[])
            .await?;
        let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        assert_eq!(ids, ["on-time"]);
        Ok(())
    }
}
