//! The audit log's one seam: [`AuditStore`], with two backends — the sled log of
//! [`crate::audit`] (the default, one host) and PostgreSQL ([`crate::audit_pg`], shared by
//! replicas). The service sees only this trait; both backends keep the same promise: `append`
//! returns only once the record is durable (with `audit.sync`), and concurrent appends share
//! one durability point (the journal's `fdatasync`, or one transaction).

use warden_proto::v1 as pb;

use crate::audit::{AuditError, AuditLog};
use crate::retention::{Pruned, Retention};

/// Where the audit records go.
#[tonic::async_trait]
pub trait AuditStore: Send + Sync {
    /// Appends `record`. Returns once it is durable when `durable` is set (the sled backend
    /// otherwise only writes it; PostgreSQL always commits), and an error when that could not
    /// be done: the caller must then not answer with the decision.
    async fn append(&self, record: &pb::AuditRecord, durable: bool) -> Result<(), AuditError>;

    /// [`append`](Self::append) for a caller that answers at `deadline_unix_ms` (0 = none)
    /// whatever happens: a backend that can refuse to land the record after that time does
    /// (PostgreSQL: the statement inserts nothing once the server's clock passed it). A record
    /// that lands late anyway is replaced by the caller's [`correct`](Self::correct).
    async fn append_by(
        &self,
        record: &pb::AuditRecord,
        durable: bool,
        _deadline_unix_ms: u64,
    ) -> Result<(), AuditError> {
        self.append(record, durable).await
    }

    /// Records what was enforced for a decision whose `append` failed or did not return in
    /// time (the caller answered DENY `audit.unavailable`): `record`, of the same decision id,
    /// replaces whatever record of that decision landed, or is added when none did. From then
    /// on `by_decision_id` and `newest` show `record` and never the one it replaces.
    async fn correct(&self, record: &pb::AuditRecord) -> Result<(), AuditError>;

    /// The record of one decision.
    async fn by_decision_id(&self, id: &str) -> Result<Option<pb::AuditRecord>, AuditError>;

    /// Up to `limit` records, newest first, of one context when `context_id` is given.
    async fn newest(
        &self,
        limit: usize,
        context_id: Option<&str>,
    ) -> Result<Vec<pb::AuditRecord>, AuditError>;

    /// How many records the log holds.
    async fn count(&self) -> Result<u64, AuditError>;

    /// The cursor of the newest record written (0: none). Cursors grow with every record.
    async fn head(&self) -> Result<u64, AuditError>;

    /// Up to `limit` records, newest first, each with its cursor (of one context when given).
    async fn newest_cursored(
        &self,
        limit: usize,
        context_id: Option<&str>,
    ) -> Result<Vec<(u64, pb::AuditRecord)>, AuditError>;

    /// Up to `limit` records after `cursor`, oldest first, each with its cursor (every
    /// context: a follower filters, so it can tell a hole in the cursors from another
    /// context's record).
    async fn after(
        &self,
        cursor: u64,
        limit: usize,
    ) -> Result<Vec<(u64, pb::AuditRecord)>, AuditError>;

    /// How long a hole in the cursors may still fill: a record that took a cursor may become
    /// visible after a later one (another replica's commit) within this time, never after it.
    /// Zero where a record is visible in cursor order (the sled log).
    fn settle(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// The newest record of `request_id` written by any replica sharing this log; `None` for a
    /// log that is this process's alone (its own ledger already knows what it decided).
    async fn newest_of_request(
        &self,
        _request_id: &str,
    ) -> Result<Option<pb::AuditRecord>, AuditError> {
        Ok(None)
    }

    /// `sled` or `postgres`, for Status and `warden doctor`.
    fn backend(&self) -> &'static str;

    /// One retention pass (`crate::retention`): removes, oldest first, at most
    /// `retention.pass` records that are older than its age bound or beyond its count bound,
    /// and says how many for each reason.
    async fn prune(&self, retention: &Retention) -> Result<Pruned, AuditError>;
}

fn context_of(r: &pb::AuditRecord) -> &str {
    r.subject
        .as_ref()
        .map(|s| s.context_id.as_str())
        .unwrap_or("")
}

#[tonic::async_trait]
impl AuditStore for AuditLog {
    async fn append(&self, record: &pb::AuditRecord, durable: bool) -> Result<(), AuditError> {
        if durable {
            self.append_durable(record).await.map(|_| ())
        } else {
            AuditLog::append(self, record).map(|_| ())
        }
    }

    async fn correct(&self, record: &pb::AuditRecord) -> Result<(), AuditError> {
        // A later record of the same decision id: the index moves to it, and readers skip the
        // one it replaces (see `AuditLog::newest`).
        self.append_durable(record).await.map(|_| ())
    }

    async fn by_decision_id(&self, id: &str) -> Result<Option<pb::AuditRecord>, AuditError> {
        AuditLog::by_decision_id(self, id)
    }

    async fn newest(
        &self,
        limit: usize,
        context_id: Option<&str>,
    ) -> Result<Vec<pb::AuditRecord>, AuditError> {
        AuditLog::newest(self, limit, |r| {
            context_id.is_none_or(|c| context_of(r) == c)
        })
    }

    async fn count(&self) -> Result<u64, AuditError> {
        Ok(self.len())
    }

    async fn head(&self) -> Result<u64, AuditError> {
        AuditLog::head(self)
    }

    async fn newest_cursored(
        &self,
        limit: usize,
        context_id: Option<&str>,
    ) -> Result<Vec<(u64, pb::AuditRecord)>, AuditError> {
        AuditLog::newest_cursored(self, limit, |r| {
            context_id.is_none_or(|c| context_of(r) == c)
        })
    }

    async fn after(
        &self,
        cursor: u64,
        limit: usize,
    ) -> Result<Vec<(u64, pb::AuditRecord)>, AuditError> {
        AuditLog::after(self, cursor, limit)
    }

    fn backend(&self) -> &'static str {
        "sled"
    }

    async fn prune(&self, retention: &Retention) -> Result<Pruned, AuditError> {
        AuditLog::prune(self, retention)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sled log's cursors: one per record, growing, `after` giving the records past one in
    /// order (what `AuditFollow` reads), `head` the newest's.
    #[tokio::test]
    async fn the_sled_log_reads_after_a_cursor_in_order() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let log = AuditLog::open(warden_store::Store::open(dir.path())?)?;
        let store: &dyn AuditStore = &log;
        assert_eq!(store.head().await?, 0);
        for i in 0..5 {
            let r = pb::AuditRecord {
                decision_id: format!("d{i}"),
                subject: Some(pb::Subject {
                    context_id: format!("c{}", i % 2),
                    ..Default::default()
                }),
                ..Default::default()
            };
            store.append(&r, i % 2 == 0).await?;
        }
        assert_eq!(store.head().await?, 5);
        let ids = |v: Vec<(u64, pb::AuditRecord)>| {
            v.into_iter()
                .map(|(c, r)| (c, r.decision_id))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            ids(store.after(0, 10).await?),
            (1..=5)
                .map(|c| (c, format!("d{}", c - 1)))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            ids(store.after(3, 10).await?),
            [(4, "d3".to_string()), (5, "d4".to_string())]
        );
        assert_eq!(ids(store.after(1, 2).await?).len(), 2);
        assert!(store.after(5, 10).await?.is_empty());
        assert_eq!(
            ids(store.newest_cursored(2, Some("c0")).await?),
            [(5, "d4".to_string()), (3, "d2".to_string())]
        );
        assert_eq!(store.settle(), std::time::Duration::ZERO);
        Ok(())
    }
}
