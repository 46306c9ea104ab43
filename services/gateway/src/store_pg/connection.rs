//! A [`PgStore`]'s side of the connection: made with its replica's owner id and its notes
//! forwarded, every statement bounded in time, values encoded and rows decoded, an orphan's
//! task ended FAILED in one transaction.
//!
//! Owns: how the store talks to PostgreSQL. Must never: decide what a task operation means (the
//! `TaskBackend` impl in `store_pg.rs` does).

use super::*;

pub(super) fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, TaskStoreError> {
    serde_json::to_vec(value).map_err(TaskStoreError::Encode)
}

pub(super) fn decode<T: for<'de> serde::Deserialize<'de>>(
    what: &str,
    bytes: &[u8],
) -> Result<T, TaskStoreError> {
    serde_json::from_slice(bytes).map_err(|source| TaskStoreError::Corrupt {
        key: what.to_string(),
        source,
    })
}

pub(super) fn now_micros() -> i64 {
    crate::time::now_micros()
}

pub(super) fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A value of `gateway_history`: one message, or a segment of consecutive ones.
#[derive(serde::Deserialize)]
#[serde(untagged)]
pub(super) enum StoredHistory {
    Segment(Vec<Message>),
    One(Box<Message>),
}

impl PgStore {
    /// A store on `pg` (migrated by the caller), listening for other replicas' changes.
    pub fn new(pg: Pg) -> Self {
        Self::with_owner(pg, uuid::Uuid::new_v4().to_string())
    }

    /// A store writing as `owner` (`--import-sled`: one fixed owner, so a second run may
    /// rewrite what an interrupted first one wrote; imported tasks are all ended).
    pub fn with_owner(pg: Pg, owner: String) -> Self {
        let listener = warden_pgstate::listen::Listener::spawn(pg.clone(), &[CHANNEL]);
        let (changes, _) = broadcast::channel(4096);
        let mut notes = listener.subscribe();
        let tx = changes.clone();
        let forward = tokio::spawn(async move {
            loop {
                match notes.recv().await {
                    Ok(warden_pgstate::listen::Note::Notify { payload, .. }) => {
                        let _ = tx.send(payload);
                    }
                    // Notes were lost (reconnected, or fell behind): "" = anything may have
                    // changed; a follower reads its task again.
                    Ok(warden_pgstate::listen::Note::Resync)
                    | Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = tx.send(String::new());
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        PgStore {
            pg,
            owner,
            changes,
            _listener: listener,
            _forward: forward,
        }
    }

    /// This replica's id (its leases).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub(super) async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, TaskStoreError>>,
    ) -> Result<T, TaskStoreError> {
        tokio::time::timeout(STATEMENT_BOUND, fut)
            .await
            .map_err(|_| PgError::Timeout(STATEMENT_BOUND.as_millis() as u64))?
    }

    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, TaskStoreError> {
        self.bounded(async {
            let c = self.pg.client().await?;
            Ok(c.query(sql, params).await.map_err(PgError::from)?)
        })
        .await
    }

    pub(super) async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, TaskStoreError> {
        self.bounded(async {
            let c = self.pg.client().await?;
            Ok(c.execute(sql, params).await.map_err(PgError::from)?)
        })
        .await
    }

    pub(super) fn head_of(row: &tokio_postgres::Row) -> Result<TaskRecord, TaskStoreError> {
        let id: String = row.try_get(0).map_err(PgError::from)?;
        let bytes: Vec<u8> = row.try_get(1).map_err(PgError::from)?;
        decode(&format!("gateway_tasks {id}"), &bytes)
    }

    /// Ends one orphaned task FAILED (unless it ended meanwhile); inside `tx`.
    pub(super) async fn fail_orphan(
        tx: &tokio_postgres::Transaction<'_>,
        mut rec: TaskRecord,
        why: &str,
    ) -> Result<Option<TaskRecord>, TaskStoreError> {
        let rows = tx
            .query(
                "SELECT value FROM gateway_history WHERE task_id = $1 ORDER BY seq",
                &[&rec.task.id],
            )
            .await
            .map_err(PgError::from)?;
        let mut count = 0u64;
        for r in &rows {
            let bytes: Vec<u8> = r.try_get(0).map_err(PgError::from)?;
            count += match decode::<StoredHistory>("gateway_history", &bytes)? {
                StoredHistory::One(_) => 1,
                StoredHistory::Segment(ms) => ms.len() as u64,
            };
        }
        let now = now_micros();
        let msg = orphaned_message(&rec, why);
        tx.execute(
            "INSERT INTO gateway_history (task_id, seq, value) VALUES ($1, $2, $3)
             ON CONFLICT (task_id, seq) DO UPDATE SET value = EXCLUDED.value",
            &[&rec.task.id, &i64_of(count), &encode(&msg)?],
        )
        .await
        .map_err(PgError::from)?;
        rec.task.status = TaskStatus {
            state: TaskState::Failed,
            message: Some(msg),
            timestamp: Some(crate::time::format_micros(now)),
        };
        rec.status_micros = now;
        rec.task.history.clear();
        rec.task.artifacts.clear();
        let n = tx
            .execute(
                "UPDATE gateway_tasks SET terminal = true, status_micros = $2, head = $3
                 WHERE id = $1 AND NOT terminal",
                &[&rec.task.id, &now, &encode(&rec)?],
            )
            .await
            .map_err(PgError::from)?;
        tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &rec.task.id])
            .await
            .map_err(PgError::from)?;
        Ok((n == 1).then_some(rec))
    }
}
