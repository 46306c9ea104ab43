//! Binding listeners: Unix sockets with mode, group and stale-socket handling, or TCP.

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::config::ListenerConfig;
use crate::peer::PeerGuard;

#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    #[error("socket directory {0} does not exist")]
    NoDirectory(PathBuf),
    #[error("socket {0} is in use by a live daemon")]
    InUse(PathBuf),
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("cannot remove stale socket {path}: {source}")]
    Stale {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot bind {what}: {source}")]
    Bind {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set mode/group of {path}: {message}")]
    Permissions { path: PathBuf, message: String },
    #[error("listener has neither a socket nor a tcp address")]
    Unconfigured,
    #[error("{0}")]
    Tls(#[from] crate::tls::TlsError),
}

/// A bound listener and the guard that admits its peers.
#[derive(Debug)]
pub struct BoundListener {
    pub(crate) kind: Kind,
    pub(crate) guard: PeerGuard,
    pub(crate) name: String,
}

#[derive(Debug)]
pub(crate) enum Kind {
    Unix {
        listener: tokio::net::UnixListener,
        path: PathBuf,
    },
    Tcp {
        listener: tokio::net::TcpListener,
        /// Mutual TLS: every connection is handshaken and admitted by identity first.
        tls: Option<std::sync::Arc<crate::tls::ServerTls>>,
    },
}

impl BoundListener {
    /// Where it listens, as `unix:/path` or `tcp:host:port`.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Unix { path, .. } => format!("unix:{}", path.display()),
            Kind::Tcp { listener, tls } => {
                let scheme = if tls.is_some() { "tcp+mtls" } else { "tcp" };
                match listener.local_addr() {
                    Ok(a) => format!("{scheme}:{a}"),
                    Err(_) => format!("{scheme}:?"),
                }
            }
        }
    }

    /// The listener's name in configuration (e.g. `listen`, `admin`).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Binds the listener named `name` (its key in the configuration file).
pub async fn bind(
    name: &str,
    cfg: &ListenerConfig,
    state_dir: &Path,
) -> Result<BoundListener, ListenerError> {
    let guard = PeerGuard::new(name, &cfg.allow_uids, &cfg.allow_gids, cfg.allow_any_peer);
    if let Some(path) = cfg.socket_path(state_dir) {
        let listener = bind_unix(&path, cfg)?;
        return Ok(BoundListener {
            kind: Kind::Unix { listener, path },
            guard,
            name: name.to_string(),
        });
    }
    let Some(addr) = &cfg.tcp else {
        return Err(ListenerError::Unconfigured);
    };
    // The certificate is read before the port is bound: a listener that cannot prove who it
    // is does not start.
    let (tls, guard) = match &cfg.tls {
        Some(t) => (
            Some(std::sync::Arc::new(crate::tls::ServerTls::new(
                t, state_dir,
            )?)),
            PeerGuard::identities(name, &t.admit),
        ),
        None => (None, guard),
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ListenerError::Bind {
            what: addr.clone(),
            source,
        })?;
    Ok(BoundListener {
        kind: Kind::Tcp { listener, tls },
        guard,
        name: name.to_string(),
    })
}

fn bind_unix(path: &Path, cfg: &ListenerConfig) -> Result<tokio::net::UnixListener, ListenerError> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    if !dir.is_dir() {
        return Err(ListenerError::NoDirectory(dir.to_path_buf()));
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            // A live daemon answers a connect; a dead one's socket refuses it and may be replaced.
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => return Err(ListenerError::InUse(path.to_path_buf())),
                Err(e)
                    if e.kind() == ErrorKind::ConnectionRefused
                        || e.kind() == ErrorKind::NotFound =>
                {
                    std::fs::remove_file(path).map_err(|source| ListenerError::Stale {
                        path: path.to_path_buf(),
                        source,
                    })?;
                }
                Err(_) => return Err(ListenerError::InUse(path.to_path_buf())),
            }
        }
        Ok(_) => return Err(ListenerError::NotASocket(path.to_path_buf())),
        Err(_) => {}
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|source| ListenerError::Bind {
        what: path.display().to_string(),
        source,
    })?;
    let perm_err = |message: String| ListenerError::Permissions {
        path: path.to_path_buf(),
        message,
    };
    let mode = cfg.mode_bits().unwrap_or(0o660);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| perm_err(e.to_string()))?;
    if let Some(group) = &cfg.group {
        let g = nix::unistd::Group::from_name(group)
            .map_err(|e| perm_err(e.to_string()))?
            .ok_or_else(|| perm_err(format!("no such group {group:?}")))?;
        nix::unistd::chown(path, None, Some(g.gid)).map_err(|e| perm_err(e.to_string()))?;
    }
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn missing_directory_live_socket_and_stale_socket() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = ListenerConfig::unix(dir.path().join("nope/x.sock"));
        assert!(matches!(
            bind("listen", &cfg, dir.path()).await,
            Err(ListenerError::NoDirectory(_))
        ));

        let cfg = ListenerConfig::unix("x.sock");
        let first = bind("listen", &cfg, dir.path()).await.unwrap();
        assert!(matches!(
            bind("listen", &cfg, dir.path()).await,
            Err(ListenerError::InUse(_))
        ));
        drop(first); // the socket file stays behind, like a crashed daemon's
        let again = bind("listen", &cfg, dir.path()).await.unwrap();
        assert!(again.describe().ends_with("x.sock"));
        let mode = std::fs::metadata(dir.path().join("x.sock"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o660);

        std::fs::write(dir.path().join("plain"), "x").unwrap();
        let cfg = ListenerConfig::unix("plain");
        assert!(matches!(
            bind("listen", &cfg, dir.path()).await,
            Err(ListenerError::NotASocket(_))
        ));
    }
}
