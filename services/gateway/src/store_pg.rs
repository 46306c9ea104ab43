//! The task store in PostgreSQL (`[store] backend = "postgres"`), shared by gateway replicas:
//! tables `gateway_tasks`, `gateway_history`, `gateway_artifacts`, `gateway_push`,
//! `gateway_contexts` (migration 0004 of `warden-pgstate`). Values are the same JSON the sled
//! backend keeps, as bytes; the columns beside them are what queries filter on.
//!
//! Across replicas:
//! - every write of a task's head, history or artifacts NOTIFYs [`CHANNEL`] with the task id in
//!   the same statement (delivered when, and only if, it commits): a replica that did not start
//!   the turn follows the task by reading it again on each note (`core/follow.rs`, `follow`);
//! - a terminal head is never overwritten (`ON CONFLICT ... WHERE NOT terminal`): the first
//!   end a task reaches on any replica is the one that stands;
//! - each replica has an id of its own (`owner`) and renews a lease on every task it follows;
//!   a task whose lease ran out was followed by a replica that died, and [`PgStore::recover`]
//!   (run by every replica's lease loop) ends it FAILED instead of leaving it WORKING;
//! - retention and `max_tasks` are computed by one query over every replica's tasks, sweeps
//!   serialized by an advisory lock.
//!
//! How a statement reaches PostgreSQL (bounded, encoded, decoded) is [`connection`]'s.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::broadcast;
use warden_pgstate::tokio_postgres::{self, types::ToSql};
use warden_pgstate::{Pg, PgError};

use crate::a2a::{Artifact, Message, TaskState, TaskStatus};
use crate::store::{
    ArtifactChunk, ContextRecord, ContextUsage, Pruned, PushRecord, TaskBackend, TaskRecord,
    TaskStoreError, merge_artifact_chunks, orphaned_message,
};

mod connection;

use connection::{StoredHistory, decode, encode, i64_of, now_micros};

/// The notification channel; the payload is a task id.
pub const CHANNEL: &str = "warden_gateway";

/// The note (on [`CHANNEL`]) that an answer was held or delivered: never a task id.
pub const ANSWER_NOTE: &str = "answer";

/// How long a task's lease lasts without renewal. The lease loop renews every third of it, so
/// a replica that stopped is noticed within this long.
pub const LEASE: Duration = Duration::from_secs(6);

/// The advisory lock sweeps take (one replica prunes at a time): "warden" in ASCII, then 4.
const SWEEP_LOCK: i64 = 0x7761_7264_656e_0004;

/// One statement may take at most this long (a database that stopped answering is an error,
/// not a gateway that hangs).
const STATEMENT_BOUND: Duration = Duration::from_secs(15);

pub struct PgStore {
    pg: Pg,
    /// This replica's id in `gateway_tasks.owner`.
    owner: String,
    changes: broadcast::Sender<String>,
    _listener: warden_pgstate::listen::Listener,
    _forward: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("target", &self.pg.target())
            .field("owner", &self.owner)
            .finish()
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self._forward.abort();
    }
}

#[tonic::async_trait]
impl TaskBackend for PgStore {
    async fn put_head(&self, record: &TaskRecord) -> Result<(), TaskStoreError> {
        let mut head = record.clone();
        head.task.history.clear();
        head.task.artifacts.clear();
        let terminal = head.task.status.state.is_terminal();
        let lease = now_micros().saturating_add(LEASE.as_micros() as i64);
        // The first end a task reaches stands: a terminal head is never rewritten (a replica
        // that finds its lease taken over cannot bring a FAILED task back to WORKING).
        self.query(
            "WITH up AS (
                INSERT INTO gateway_tasks
                    (id, principal, context_id, terminal, status_micros, owner, lease_micros, head)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                ON CONFLICT (id) DO UPDATE SET
                    terminal = EXCLUDED.terminal, status_micros = EXCLUDED.status_micros,
                    head = EXCLUDED.head
                WHERE NOT gateway_tasks.terminal AND gateway_tasks.owner = EXCLUDED.owner
                RETURNING id)
             SELECT pg_notify($9, id) FROM up",
            &[
                &head.task.id,
                &head.principal,
                &head.task.context_id,
                &terminal,
                &head.status_micros,
                &self.owner,
                &lease,
                &encode(&head)?,
                &CHANNEL,
            ],
        )
        .await?;
        Ok(())
    }

    async fn head(&self, task_id: &str) -> Result<Option<TaskRecord>, TaskStoreError> {
        let rows = self
            .query(
                "SELECT id, head FROM gateway_tasks WHERE id = $1",
                &[&task_id],
            )
            .await?;
        rows.first().map(Self::head_of).transpose()
    }

    async fn heads_of(&self, principal: &str) -> Result<Vec<TaskRecord>, TaskStoreError> {
        let rows = self
            .query(
                "SELECT id, head FROM gateway_tasks WHERE principal = $1",
                &[&principal],
            )
            .await?;
        rows.iter().map(Self::head_of).collect()
    }

    async fn put_history_segment(
        &self,
        task_id: &str,
        first_seq: u64,
        msgs: &[Message],
    ) -> Result<(), TaskStoreError> {
        let value = match msgs {
            [] => return Ok(()),
            [one] => encode(one)?,
            many => encode(&many)?,
        };
        self.query(
            "WITH up AS (
                INSERT INTO gateway_history (task_id, seq, value)
                SELECT $1, $2, $3 WHERE EXISTS (
                    SELECT 1 FROM gateway_tasks WHERE id = $1 AND owner = $5)
                ON CONFLICT (task_id, seq) DO UPDATE SET value = EXCLUDED.value
                RETURNING task_id)
             SELECT pg_notify($4, task_id) FROM up",
            &[&task_id, &i64_of(first_seq), &value, &CHANNEL, &self.owner],
        )
        .await?;
        Ok(())
    }

    async fn history(&self, task_id: &str) -> Result<Vec<Message>, TaskStoreError> {
        let rows = self
            .query(
                "SELECT value FROM gateway_history WHERE task_id = $1 ORDER BY seq",
                &[&task_id],
            )
            .await?;
        let mut out = Vec::new();
        for r in &rows {
            let bytes: Vec<u8> = r.try_get(0).map_err(PgError::from)?;
            match decode::<StoredHistory>(&format!("gateway_history {task_id}"), &bytes)? {
                StoredHistory::One(m) => out.push(*m),
                StoredHistory::Segment(ms) => out.extend(ms),
            }
        }
        Ok(out)
    }

    async fn put_artifact_chunks(
        &self,
        task_id: &str,
        chunks: &[(u32, u64, ArtifactChunk)],
    ) -> Result<(), TaskStoreError> {
        if chunks.is_empty() {
            return Ok(());
        }
        let mut idx = Vec::with_capacity(chunks.len());
        let mut nums = Vec::with_capacity(chunks.len());
        let mut values = Vec::with_capacity(chunks.len());
        for (i, n, c) in chunks {
            idx.push(i32::try_from(*i).unwrap_or(i32::MAX));
            nums.push(i64_of(*n));
            values.push(encode(c)?);
        }
        // One statement for the batch: atomic, as sled's batch is.
        self.query(
            "WITH up AS (
                INSERT INTO gateway_artifacts (task_id, idx, chunk, value)
                SELECT $1, i, n, v FROM unnest($2::int[], $3::bigint[], $4::bytea[]) AS u(i, n, v)
                WHERE EXISTS (SELECT 1 FROM gateway_tasks WHERE id = $1 AND owner = $6)
                ON CONFLICT (task_id, idx, chunk) DO UPDATE SET value = EXCLUDED.value
                RETURNING task_id)
             SELECT pg_notify($5, $1) WHERE EXISTS (SELECT 1 FROM up)",
            &[&task_id, &idx, &nums, &values, &CHANNEL, &self.owner],
        )
        .await?;
        Ok(())
    }

    async fn artifacts(&self, task_id: &str) -> Result<Vec<Artifact>, TaskStoreError> {
        let rows = self
            .query(
                "SELECT idx, value FROM gateway_artifacts WHERE task_id = $1 ORDER BY idx, chunk",
                &[&task_id],
            )
            .await?;
        let mut chunks = Vec::with_capacity(rows.len());
        for r in &rows {
            let idx: i32 = r.try_get(0).map_err(PgError::from)?;
            let bytes: Vec<u8> = r.try_get(1).map_err(PgError::from)?;
            chunks.push((
                idx as u32,
                decode::<ArtifactChunk>(&format!("gateway_artifacts {task_id}"), &bytes)?,
            ));
        }
        Ok(merge_artifact_chunks(chunks))
    }

    async fn context(&self, context_id: &str) -> Result<Option<ContextRecord>, TaskStoreError> {
        let rows = self
            .query(
                "SELECT value FROM gateway_contexts WHERE id = $1",
                &[&context_id],
            )
            .await?;
        match rows.first() {
            Some(r) => {
                let bytes: Vec<u8> = r.try_get(0).map_err(PgError::from)?;
                Ok(Some(decode(
                    &format!("gateway_contexts {context_id}"),
                    &bytes,
                )?))
            }
            None => Ok(None),
        }
    }

    async fn put_context(
        &self,
        context_id: &str,
        rec: &ContextRecord,
    ) -> Result<(), TaskStoreError> {
        // The principal never changes once stored (claim_context decides it once).
        self.execute(
            "INSERT INTO gateway_contexts (id, principal, value) VALUES ($1, $2, $3)
             ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value
             WHERE gateway_contexts.principal = EXCLUDED.principal",
            &[&context_id, &rec.principal, &encode(rec)?],
        )
        .await?;
        Ok(())
    }

    async fn claim_context(
        &self,
        context_id: &str,
        fresh: &ContextRecord,
    ) -> Result<ContextRecord, TaskStoreError> {
        let fresh_bytes = encode(fresh)?;
        self.bounded(async {
            let mut c = self.pg.client().await?;
            let tx = c.transaction().await.map_err(PgError::from)?;
            let inserted = tx
                .execute(
                    "INSERT INTO gateway_contexts (id, principal, value) VALUES ($1, $2, $3)
                     ON CONFLICT (id) DO NOTHING",
                    &[&context_id, &fresh.principal, &fresh_bytes],
                )
                .await
                .map_err(PgError::from)?;
            let rec = if inserted == 1 {
                fresh.clone()
            } else {
                let row = tx
                    .query_one(
                        "SELECT value FROM gateway_contexts WHERE id = $1 FOR UPDATE",
                        &[&context_id],
                    )
                    .await
                    .map_err(PgError::from)?;
                let bytes: Vec<u8> = row.try_get(0).map_err(PgError::from)?;
                let mut rec: ContextRecord =
                    decode(&format!("gateway_contexts {context_id}"), &bytes)?;
                if rec.principal == fresh.principal {
                    rec.last_task_micros = fresh.last_task_micros;
                    rec.closed_micros = None;
                    tx.execute(
                        "UPDATE gateway_contexts SET value = $2 WHERE id = $1",
                        &[&context_id, &encode(&rec)?],
                    )
                    .await
                    .map_err(PgError::from)?;
                }
                rec
            };
            tx.commit().await.map_err(PgError::from)?;
            Ok(rec)
        })
        .await
    }

    async fn contexts(&self) -> Result<Vec<(String, ContextRecord)>, TaskStoreError> {
        let rows = self
            .query("SELECT id, value FROM gateway_contexts ORDER BY id", &[])
            .await?;
        rows.iter()
            .map(|r| {
                let id: String = r.try_get(0).map_err(PgError::from)?;
                let bytes: Vec<u8> = r.try_get(1).map_err(PgError::from)?;
                let rec = decode(&format!("gateway_contexts {id}"), &bytes)?;
                Ok((id, rec))
            })
            .collect()
    }

    async fn forget_context(
        &self,
        context_id: &str,
        seen: &ContextRecord,
    ) -> Result<bool, TaskStoreError> {
        self.bounded(async {
            let mut c = self.pg.client().await?;
            let tx = c.transaction().await.map_err(PgError::from)?;
            let rows = tx
                .query(
                    "SELECT value FROM gateway_contexts WHERE id = $1 FOR UPDATE",
                    &[&context_id],
                )
                .await
                .map_err(PgError::from)?;
            let Some(row) = rows.first() else {
                return Ok(false);
            };
            let bytes: Vec<u8> = row.try_get(0).map_err(PgError::from)?;
            let now: ContextRecord = decode(&format!("gateway_contexts {context_id}"), &bytes)?;
            // Not while a task of the context runs on any replica.
            let busy: bool = tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM gateway_tasks WHERE context_id = $1 AND NOT terminal)",
                    &[&context_id],
                )
                .await
                .map_err(PgError::from)?
                .try_get(0)
                .map_err(PgError::from)?;
            if now != *seen || busy {
                return Ok(false);
            }
            tx.execute("DELETE FROM gateway_contexts WHERE id = $1", &[&context_id])
                .await
                .map_err(PgError::from)?;
            tx.commit().await.map_err(PgError::from)?;
            Ok(true)
        })
        .await
    }

    async fn delete_tasks(&self, task_ids: &[&str]) -> Result<(), TaskStoreError> {
        if task_ids.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = task_ids.to_vec();
        // History, artifacts and push configs go with their head (ON DELETE CASCADE).
        self.execute("DELETE FROM gateway_tasks WHERE id = ANY($1)", &[&ids])
            .await?;
        Ok(())
    }

    async fn put_push(&self, rec: &PushRecord) -> Result<(), TaskStoreError> {
        self.execute(
            "INSERT INTO gateway_push (task_id, config_id, value) VALUES ($1, $2, $3)
             ON CONFLICT (task_id, config_id) DO UPDATE SET value = EXCLUDED.value",
            &[&rec.config.task_id, &rec.config.id, &encode(rec)?],
        )
        .await?;
        Ok(())
    }

    async fn push_configs(&self, task_id: &str) -> Result<Vec<PushRecord>, TaskStoreError> {
        let rows = self
            .query(
                "SELECT value FROM gateway_push WHERE task_id = $1 ORDER BY config_id COLLATE \"C\"",
                &[&task_id],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let bytes: Vec<u8> = r.try_get(0).map_err(PgError::from)?;
                decode(&format!("gateway_push {task_id}"), &bytes)
            })
            .collect()
    }

    async fn push_config(
        &self,
        task_id: &str,
        id: &str,
    ) -> Result<Option<PushRecord>, TaskStoreError> {
        let rows = self
            .query(
                "SELECT value FROM gateway_push WHERE task_id = $1 AND config_id = $2",
                &[&task_id, &id],
            )
            .await?;
        match rows.first() {
            Some(r) => {
                let bytes: Vec<u8> = r.try_get(0).map_err(PgError::from)?;
                Ok(Some(decode(&format!("gateway_push {task_id}"), &bytes)?))
            }
            None => Ok(None),
        }
    }

    async fn delete_push(&self, task_id: &str, id: &str) -> Result<bool, TaskStoreError> {
        let n = self
            .execute(
                "DELETE FROM gateway_push WHERE task_id = $1 AND config_id = $2",
                &[&task_id, &id],
            )
            .await?;
        Ok(n > 0)
    }

    async fn task_count(&self) -> Result<usize, TaskStoreError> {
        let rows = self
            .query("SELECT count(*) FROM gateway_tasks", &[])
            .await?;
        let n: i64 = match rows.first() {
            Some(r) => r.try_get(0).map_err(PgError::from)?,
            None => 0,
        };
        Ok(n.max(0) as usize)
    }

    async fn flush(&self) -> Result<(), TaskStoreError> {
        // Every statement commits before it returns: nothing is left to make durable.
        Ok(())
    }

    async fn prune(&self, cutoff_micros: i64, max_tasks: usize) -> Result<Pruned, TaskStoreError> {
        let max = i64::try_from(max_tasks).unwrap_or(i64::MAX);
        self.bounded(async {
            let mut c = self.pg.client().await?;
            let tx = c.transaction().await.map_err(PgError::from)?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SWEEP_LOCK])
                .await
                .map_err(PgError::from)?;
            let expired = tx
                .execute(
                    "DELETE FROM gateway_tasks WHERE terminal AND status_micros < $1",
                    &[&cutoff_micros],
                )
                .await
                .map_err(PgError::from)?;
            // Per principal, the oldest terminal tasks beyond max_tasks (running ones count).
            let over = tx
                .execute(
                    "WITH n AS (SELECT principal, count(*) AS total FROM gateway_tasks
                                GROUP BY principal),
                          r AS (SELECT id, principal, row_number() OVER (
                                    PARTITION BY principal
                                    ORDER BY status_micros, id COLLATE \"C\") AS k
                                FROM gateway_tasks WHERE terminal)
                     DELETE FROM gateway_tasks t USING r JOIN n USING (principal)
                     WHERE t.id = r.id AND r.k <= n.total - $1",
                    &[&max],
                )
                .await
                .map_err(PgError::from)?;
            let rows = tx
                .query(
                    "SELECT context_id, count(*), bool_or(NOT terminal), max(status_micros)
                     FROM gateway_tasks GROUP BY context_id",
                    &[],
                )
                .await
                .map_err(PgError::from)?;
            tx.commit().await.map_err(PgError::from)?;
            let mut contexts = HashMap::new();
            for r in &rows {
                let id: String = r.try_get(0).map_err(PgError::from)?;
                let count: i64 = r.try_get(1).map_err(PgError::from)?;
                let busy: bool = r.try_get(2).map_err(PgError::from)?;
                let last: i64 = r.try_get(3).map_err(PgError::from)?;
                contexts.insert(
                    id,
                    ContextUsage {
                        count: count.max(0) as usize,
                        busy,
                        last_status_micros: last,
                    },
                );
            }
            Ok(Pruned {
                deleted: (expired + over) as usize,
                contexts,
            })
        })
        .await
    }

    async fn recover(&self) -> Result<Vec<TaskRecord>, TaskStoreError> {
        self.bounded(async {
            let mut c = self.pg.client().await?;
            let tx = c.transaction().await.map_err(PgError::from)?;
            // Locked, and skipped by a replica already recovering them.
            let rows = tx
                .query(
                    "SELECT id, head FROM gateway_tasks
                     WHERE NOT terminal AND lease_micros < $1 AND owner <> $2
                     FOR UPDATE SKIP LOCKED",
                    &[&now_micros(), &self.owner],
                )
                .await
                .map_err(PgError::from)?;
            let mut changed = Vec::new();
            for r in &rows {
                if let Some(rec) =
                    Self::fail_orphan(&tx, Self::head_of(r)?, "the gateway following it stopped")
                        .await?
                {
                    changed.push(rec);
                }
            }
            tx.commit().await.map_err(PgError::from)?;
            Ok(changed)
        })
        .await
    }

    async fn orphans(&self) -> Result<Vec<TaskRecord>, TaskStoreError> {
        let rows = self
            .query(
                "SELECT id, head FROM gateway_tasks
                 WHERE NOT terminal AND lease_micros < $1 AND owner <> $2",
                &[&now_micros(), &self.owner],
            )
            .await?;
        rows.iter().map(Self::head_of).collect()
    }

    async fn claim_orphan(&self, task_id: &str) -> Result<bool, TaskStoreError> {
        let now = now_micros();
        let lease = now.saturating_add(LEASE.as_micros() as i64);
        let n = self
            .execute(
                "UPDATE gateway_tasks SET owner = $2, lease_micros = $3
                 WHERE id = $1 AND NOT terminal AND lease_micros < $4 AND owner <> $2",
                &[&task_id, &self.owner, &lease, &now],
            )
            .await?;
        Ok(n == 1)
    }

    async fn reset_progress(&self, task_id: &str) -> Result<(), TaskStoreError> {
        self.bounded(async {
            let mut c = self.pg.client().await?;
            let tx = c.transaction().await.map_err(PgError::from)?;
            tx.execute(
                "DELETE FROM gateway_history WHERE task_id = $1 AND seq >= 1",
                &[&task_id],
            )
            .await
            .map_err(PgError::from)?;
            tx.execute(
                "DELETE FROM gateway_artifacts WHERE task_id = $1",
                &[&task_id],
            )
            .await
            .map_err(PgError::from)?;
            tx.commit().await.map_err(PgError::from)?;
            Ok(())
        })
        .await
    }

    async fn fail_task(
        &self,
        rec: TaskRecord,
        why: &str,
    ) -> Result<Option<TaskRecord>, TaskStoreError> {
        self.bounded(async {
            let mut c = self.pg.client().await?;
            let tx = c.transaction().await.map_err(PgError::from)?;
            let failed = Self::fail_orphan(&tx, rec, why).await?;
            tx.commit().await.map_err(PgError::from)?;
            Ok(failed)
        })
        .await
    }

    async fn forward_answer(
        &self,
        task_id: &str,
        request: &[u8],
    ) -> Result<Option<String>, TaskStoreError> {
        let id = uuid::Uuid::new_v4().to_string();
        self.query(
            "WITH up AS (
                INSERT INTO gateway_answers (id, task_id, request) VALUES ($1, $2, $3)
                RETURNING id)
             SELECT pg_notify($4, $5) FROM up",
            &[&id, &task_id, &request, &CHANNEL, &ANSWER_NOTE],
        )
        .await?;
        Ok(Some(id))
    }

    async fn answers_to_deliver(&self) -> Result<Vec<(String, String, Vec<u8>)>, TaskStoreError> {
        let rows = self
            .query(
                "SELECT a.id, a.task_id, a.request FROM gateway_answers a
                 JOIN gateway_tasks t ON t.id = a.task_id
                 WHERE a.outcome IS NULL AND t.owner = $1 AND NOT t.terminal",
                &[&self.owner],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get(0).map_err(PgError::from)?,
                    r.try_get(1).map_err(PgError::from)?,
                    r.try_get(2).map_err(PgError::from)?,
                ))
            })
            .collect()
    }

    async fn set_answer_outcome(
        &self,
        id: &str,
        outcome: Result<(), String>,
    ) -> Result<(), TaskStoreError> {
        let value = encode(&outcome.err().unwrap_or_default())?;
        self.query(
            "WITH up AS (
                UPDATE gateway_answers SET outcome = $2 WHERE id = $1 AND outcome IS NULL
                RETURNING id)
             SELECT pg_notify($3, $4) FROM up",
            &[&id, &value, &CHANNEL, &ANSWER_NOTE],
        )
        .await?;
        Ok(())
    }

    async fn answer_outcome(&self, id: &str) -> Result<Option<Result<(), String>>, TaskStoreError> {
        let rows = self
            .query("SELECT outcome FROM gateway_answers WHERE id = $1", &[&id])
            .await?;
        let Some(row) = rows.first() else {
            return Ok(Some(
                Err("the answer is gone (its task was deleted)".into()),
            ));
        };
        let bytes: Option<Vec<u8>> = row.try_get(0).map_err(PgError::from)?;
        Ok(match bytes {
            None => None,
            Some(b) => {
                let refusal: String = decode("gateway_answers outcome", &b)?;
                Some(if refusal.is_empty() {
                    Ok(())
                } else {
                    Err(refusal)
                })
            }
        })
    }

    async fn renew_leases(&self, live: &[String]) -> Result<Vec<String>, TaskStoreError> {
        if live.is_empty() {
            return Ok(Vec::new());
        }
        let lease = now_micros().saturating_add(LEASE.as_micros() as i64);
        // Tasks this replica follows that another one took over (its lease ran out while this
        // replica could not renew it: a partition from the database longer than the lease).
        let rows = self
            .query(
                "WITH renewed AS (
                    UPDATE gateway_tasks SET lease_micros = $1
                    WHERE id = ANY($2) AND owner = $3 AND NOT terminal RETURNING id)
                 SELECT id FROM gateway_tasks
                 WHERE id = ANY($2) AND owner <> $3 AND id NOT IN (SELECT id FROM renewed)",
                &[&lease, &live, &self.owner],
            )
            .await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<_, String>(0).map_err(PgError::from)?))
            .collect()
    }

    async fn end_if_running(&self, rec: &TaskRecord) -> Result<bool, TaskStoreError> {
        let mut head = rec.clone();
        head.task.history.clear();
        head.task.artifacts.clear();
        let rows = self
            .query(
                "WITH up AS (
                    UPDATE gateway_tasks SET terminal = true, status_micros = $2, head = $3
                    WHERE id = $1 AND NOT terminal RETURNING id)
                 SELECT pg_notify($4, id) FROM up",
                &[
                    &head.task.id,
                    &head.status_micros,
                    &encode(&head)?,
                    &CHANNEL,
                ],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    fn shared(&self) -> bool {
        true
    }

    fn changes(&self) -> Option<broadcast::Receiver<String>> {
        Some(self.changes.subscribe())
    }

    fn describe(&self) -> String {
        self.pg.target().to_string()
    }
}
