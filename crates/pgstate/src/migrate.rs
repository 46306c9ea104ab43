//! The schema's versioned migrations, kept in `migrations/` and compiled in, applied at start
//! in one transaction under a PostgreSQL advisory lock: replicas starting together queue on the
//! lock, the first applies what is missing, the others find it applied. A migration once
//! released is never edited (its text's digest is recorded and checked); a change is a new
//! file with the next number.

use sha2::{Digest, Sha256};

use crate::error::PgError;
use crate::pool::Pg;

/// One migration.
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// One migration of `migrations/NNNN_name.sql`: its version, its name and its text, named once.
macro_rules! migration {
    ($version:literal, $file:literal, $name:literal) => {
        Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../migrations/", $file, "_", $name, ".sql")),
        }
    };
}

/// Every migration, in order. Each daemon's tables are prefixed with its name (`policy_`,
/// `approver_`, the gateway's next); a daemon reads and writes only its own.
pub const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001", "policy_audit"),
    migration!(2, "0002", "approver_queue"),
    migration!(3, "0003", "policy_audit_request"),
    migration!(4, "0004", "gateway_tasks"),
    migration!(5, "0005", "gateway_answers"),
    migration!(6, "0006", "cells"),
    migration!(7, "0007", "placement_orphans"),
];

/// The key of the advisory lock migrations run under ("warden" in ASCII, then 1): held for the
/// migrating transaction only, released at its commit or rollback.
pub const LOCK_KEY: i64 = 0x7761_7264_656e_0001;

/// The newest version this binary knows.
pub fn latest() -> i32 {
    MIGRATIONS.last().map(|m| m.version).unwrap_or(0)
}

fn digest(sql: &str) -> String {
    hex::encode(Sha256::digest(sql.as_bytes()))
}

const CREATE_SCHEMA_TABLE: &str = "CREATE TABLE IF NOT EXISTS warden_schema (
    version    INT PRIMARY KEY,
    name       TEXT NOT NULL,
    sha256     TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)";

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The versions this call applied (empty when another replica had).
    pub applied: Vec<i32>,
    /// The schema's version now.
    pub version: i32,
}

/// Applies the missing migrations under the advisory lock. Refuses a schema newer than this
/// binary, or one whose applied migration text differs from this binary's.
pub async fn migrate(pg: &Pg) -> Result<Migrated, PgError> {
    let mut client = pg.client().await?;
    let tx = client.transaction().await?;
    // Waits for a replica migrating at the same moment; released at commit.
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
        .await?;
    tx.batch_execute(CREATE_SCHEMA_TABLE).await?;
    let rows = tx
        .query("SELECT version, name, sha256 FROM warden_schema", &[])
        .await?;
    let done = verify(&rows)?;
    let mut applied = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| !done.contains(&m.version)) {
        tx.batch_execute(m.sql)
            .await
            .map_err(|source| PgError::Migration {
                version: m.version,
                name: m.name,
                source,
            })?;
        tx.execute(
            "INSERT INTO warden_schema (version, name, sha256) VALUES ($1, $2, $3)",
            &[&m.version, &m.name, &digest(m.sql)],
        )
        .await?;
        applied.push(m.version);
    }
    tx.commit().await?;
    if !applied.is_empty() {
        tracing::info!(target = %pg.target(), ?applied, version = latest(), "database schema migrated");
    }
    Ok(Migrated {
        applied,
        version: latest(),
    })
}

/// The applied versions, after checking each against this binary's migrations.
fn verify(rows: &[tokio_postgres::Row]) -> Result<Vec<i32>, PgError> {
    let mut done = Vec::with_capacity(rows.len());
    for row in rows {
        let version: i32 = row.try_get(0)?;
        let name: String = row.try_get(1)?;
        let sha: String = row.try_get(2)?;
        match MIGRATIONS.iter().find(|m| m.version == version) {
            None => {
                return Err(PgError::SchemaTooNew {
                    found: version,
                    known: latest(),
                });
            }
            Some(m) if digest(m.sql) != sha => {
                return Err(PgError::MigrationChanged { version, name });
            }
            Some(_) => done.push(version),
        }
    }
    Ok(done)
}

/// `--check-config`: the database answers and holds every migration this binary knows (and
/// none it does not). Changes nothing.
pub async fn check(pg: &Pg) -> Result<i32, PgError> {
    let client = pg.client().await?;
    let exists: bool = client
        .query_one("SELECT to_regclass('warden_schema') IS NOT NULL", &[])
        .await?
        .try_get(0)?;
    if !exists {
        return Err(PgError::NotMigrated(
            "no warden_schema table: start the daemon once (it migrates) or run its migration"
                .into(),
        ));
    }
    let rows = client
        .query("SELECT version, name, sha256 FROM warden_schema", &[])
        .await?;
    let done = verify(&rows)?;
    let missing: Vec<String> = MIGRATIONS
        .iter()
        .filter(|m| !done.contains(&m.version))
        .map(|m| format!("{} ({})", m.version, m.name))
        .collect();
    if !missing.is_empty() {
        return Err(PgError::NotMigrated(format!(
            "missing migrations {}",
            missing.join(", ")
        )));
    }
    Ok(latest())
}
