//! The `[store]` section: which backend holds a daemon's durable state and, for PostgreSQL,
//! how to reach it. sled is the default, so a configuration without the section (every
//! `warden up`, the Debian package) behaves as before.

use std::path::PathBuf;

use serde::Deserialize;
use warden_daemon::config::{ConfigError, Origin};

/// Where a daemon's durable state lives.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The daemon's own sled store under its state directory (one host, one replica).
    #[default]
    Sled,
    /// A PostgreSQL database shared by the daemon's replicas.
    Postgres,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sled => "sled",
            Backend::Postgres => "postgres",
        }
    }

    /// The sled store `--import-sled` copies from (`<state_dir>/store`), when this backend is
    /// the PostgreSQL it copies into; why not otherwise, in the words every daemon says it.
    pub fn sled_to_import(self, state_dir: &std::path::Path) -> Result<PathBuf, String> {
        if self != Backend::Postgres {
            return Err(
                "--import-sled copies into PostgreSQL: set store.backend = \"postgres\" and store.url"
                    .into(),
            );
        }
        let dir = state_dir.join("store");
        if !dir.is_dir() {
            return Err(format!("no sled store at {} to import", dir.display()));
        }
        Ok(dir)
    }
}

/// `[store]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    #[serde(default)]
    pub backend: Backend,
    /// libpq-style: `postgresql://user@host:5432/db` or `host=/run/postgresql dbname=warden
    /// user=warden` (a directory as host is a Unix socket). Required with `backend =
    /// "postgres"`. A password here is never logged; prefer peer or certificate authentication
    /// over a socket.
    #[serde(default)]
    pub url: String,
    /// Connections this daemon holds at most.
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    /// TLS to the server: `false` (default; a Unix socket or a trusted network), `true`
    /// (required, the server's certificate checked against `tls_ca_file`).
    #[serde(default)]
    pub tls: bool,
    /// PEM file of the certificate authorities the server's certificate must chain to.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// Opening a connection, and waiting for a free one, give up after this long: a daemon
    /// answers (fail closed) rather than hang on a database that is gone.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
}

fn default_pool_size() -> usize {
    8
}

fn default_connect_timeout_ms() -> u64 {
    2_000
}

impl Default for StoreSection {
    fn default() -> Self {
        Self {
            backend: Backend::Sled,
            url: String::new(),
            pool_size: default_pool_size(),
            tls: false,
            tls_ca_file: None,
            connect_timeout_ms: default_connect_timeout_ms(),
        }
    }
}

impl StoreSection {
    /// A section for `url` with the defaults (tests, `warden migrate-store`).
    pub fn postgres(url: impl Into<String>) -> Self {
        Self {
            backend: Backend::Postgres,
            url: url.into(),
            ..Self::default()
        }
    }

    /// Checks what can be checked without connecting; errors name the key.
    pub fn validate(&self, origin: &Origin) -> Result<(), ConfigError> {
        if self.backend == Backend::Sled {
            return Ok(());
        }
        if self.url.trim().is_empty() {
            return Err(ConfigError::invalid(
                origin,
                "store.url",
                "backend = \"postgres\" needs the database's connection string",
            ));
        }
        if let Err(e) = self.url.parse::<tokio_postgres::Config>() {
            return Err(ConfigError::invalid(
                origin,
                "store.url",
                format!("not a PostgreSQL connection string: {e}"),
            ));
        }
        if !(1..=256).contains(&self.pool_size) {
            return Err(ConfigError::invalid(
                origin,
                "store.pool_size",
                "must be between 1 and 256",
            ));
        }
        if !(100..=60_000).contains(&self.connect_timeout_ms) {
            return Err(ConfigError::invalid(
                origin,
                "store.connect_timeout_ms",
                "must be between 100 and 60000",
            ));
        }
        if self.tls && self.tls_ca_file.is_none() {
            return Err(ConfigError::invalid(
                origin,
                "store.tls_ca_file",
                "tls = true checks the server's certificate against these authorities; name the PEM file",
            ));
        }
        Ok(())
    }

    /// Where the database is, for messages and `warden doctor`: host(s) and database name,
    /// never the user's password.
    pub fn describe(&self) -> String {
        match self.backend {
            Backend::Sled => "sled".to_string(),
            Backend::Postgres => match self.url.parse::<tokio_postgres::Config>() {
                Ok(c) => describe_config(&c),
                Err(_) => "postgres (unparsable url)".to_string(),
            },
        }
    }
}

/// `postgres user@host/db` with no password.
pub fn describe_config(c: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = c
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .collect();
    format!(
        "postgres {}@{}/{}",
        c.get_user().unwrap_or(""),
        hosts.join(","),
        c.get_dbname().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Origin {
        Origin::Embedded
    }

    #[test]
    fn import_sled_copies_into_postgres_from_an_existing_sled_store_only() {
        let state = tempfile::tempdir().unwrap();
        let e = Backend::Sled.sled_to_import(state.path()).unwrap_err();
        assert!(e.contains("set store.backend = \"postgres\""), "{e}");
        let e = Backend::Postgres.sled_to_import(state.path()).unwrap_err();
        assert!(e.starts_with("no sled store at "), "{e}");
        std::fs::create_dir(state.path().join("store")).unwrap();
        assert_eq!(
            Backend::Postgres.sled_to_import(state.path()),
            Ok(state.path().join("store"))
        );
    }

    #[test]
    fn sled_needs_nothing_and_postgres_names_the_missing_key() {
        assert!(StoreSection::default().validate(&origin()).is_ok());
        let e = StoreSection {
            backend: Backend::Postgres,
            ..StoreSection::default()
        }
        .validate(&origin())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.contains("store.url"), "{e}");
        let e = StoreSection {
            tls: true,
            ..StoreSection::postgres("host=/tmp dbname=w user=w")
        }
        .validate(&origin())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.contains("store.tls_ca_file"), "{e}");
        let e = StoreSection {
            pool_size: 0,
            ..StoreSection::postgres("host=/tmp dbname=w user=w")
        }
        .validate(&origin())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.contains("store.pool_size"), "{e}");
    }

    #[test]
    fn the_description_never_carries_the_password() {
        let s = StoreSection::postgres("postgresql://alice:s3cret@db.internal:5432/warden");
        let d = s.describe();
        assert_eq!(d, "postgres alice@db.internal/warden");
        assert!(!d.contains("s3cret"));
    }
}
