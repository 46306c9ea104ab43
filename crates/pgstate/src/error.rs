//! Typed errors: each says what was being done, none carries a password.

/// What went wrong talking to PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("store.url is not a PostgreSQL connection string: {0}")]
    Url(#[source] tokio_postgres::Error),
    #[error("store TLS: {0}")]
    Tls(String),
    #[error("cannot build the PostgreSQL pool: {0}")]
    Build(String),
    #[error("no PostgreSQL connection within {timeout_ms} ms ({target}): {reason}")]
    Unavailable {
        target: String,
        timeout_ms: u64,
        reason: String,
    },
    #[error("PostgreSQL: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("PostgreSQL did not answer within {0} ms")]
    Timeout(u64),
    #[error(
        "the database schema is at version {found}, newer than this binary knows ({known}): run the newer warden, or restore"
    )]
    SchemaTooNew { found: i32, known: i32 },
    #[error("the database schema is not migrated: {0}")]
    NotMigrated(String),
    #[error("migration {version} ({name}) failed: {source}")]
    Migration {
        version: i32,
        name: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error(
        "migration {version} ({name}) was applied with different text than this binary's: the repository's migrations must never be edited once released"
    )]
    MigrationChanged { version: i32, name: String },
}

impl PgError {
    /// Whether the error means the database could not be reached (as opposed to a refusal of
    /// what was asked): callers count these as "not audited", say.
    pub fn is_unavailable(&self) -> bool {
        match self {
            PgError::Unavailable { .. } | PgError::Timeout(_) => true,
            PgError::Db(e) => e.is_closed() || e.as_db_error().is_none(),
            _ => false,
        }
    }
}
