//! Connecting to another daemon's Unix socket as a gRPC client.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {path}: {source}")]
pub struct ConnectError {
    pub path: PathBuf,
    #[source]
    pub source: tonic::transport::Error,
}

// The URI an `Endpoint` requires; unused, since the connector dials the socket path.
const UNUSED_URI: &str = "http://warden.invalid";

async fn dial(path: PathBuf) -> std::io::Result<TokioIo<tokio::net::UnixStream>> {
    Ok(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
}

/// A lazily connecting channel to the gRPC server at `path`: the first call connects, and a
/// broken connection is re-established on the next call (so a restarted daemon is found again).
pub fn unix_channel(path: &Path) -> Channel {
    let path = path.to_path_buf();
    Endpoint::from_static(UNUSED_URI)
        .connect_with_connector_lazy(tower::service_fn(move |_| dial(path.clone())))
}

/// Connects now, failing when nothing listens at `path`.
pub async fn connect_unix(path: &Path) -> Result<Channel, ConnectError> {
    let p = path.to_path_buf();
    Endpoint::from_static(UNUSED_URI)
        .connect_with_connector(tower::service_fn(move |_| dial(p.clone())))
        .await
        .map_err(|source| ConnectError {
            path: path.to_path_buf(),
            source,
        })
}

/// Asks the daemon at `path` for its overall gRPC health; true when SERVING.
pub async fn healthy(path: &Path) -> bool {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let Ok(ch) = connect_unix(path).await else {
        return false;
    };
    let mut client = HealthClient::new(ch);
    match client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
    {
        Ok(r) => {
            r.into_inner().status
                == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        }
        Err(_) => false,
    }
}
