//! Serving: every listener gets gRPC health plus its routes behind its peer guard; the daemon
//! reports readiness, runs until SIGTERM/SIGINT (or a listener fails), then drains in-flight calls
//! for at most the configured grace before aborting them.

use std::time::Duration;

use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::service::{InterceptorLayer, Routes};
use tonic_health::server::{HealthReporter, HealthService};

use crate::listener::{BoundListener, Kind};
use crate::peer::PeerStream;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("listener {listener} failed: {source}")]
    Transport {
        listener: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("cannot install signal handler: {0}")]
    Signal(#[source] std::io::Error),
    #[error("a listener task panicked: {0}")]
    Join(String),
}

/// The serving half of a daemon.
pub struct Server {
    daemon: &'static str,
    grace: Duration,
    shutdown: CancellationToken,
    health: HealthReporter,
    tasks: JoinSet<Result<(), ServeError>>,
    sockets: Vec<std::path::PathBuf>,
    listeners: Vec<String>,
    /// SIGTERM and SIGINT, caught from the moment the server exists: before any listener
    /// answers health, so a caller that saw the daemon healthy and stops it gets a graceful
    /// stop, never the default action (death by the signal).
    signals: std::io::Result<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
    /// SIGHUP is caught from the same moment: a reload ([`crate::reload`]), never a death.
    reloads: crate::reload::Reloads,
}

impl Server {
    pub fn new(daemon: &'static str, grace: Duration) -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        let signals = signal(SignalKind::terminate())
            .and_then(|t| signal(SignalKind::interrupt()).map(|i| (t, i)));
        let shutdown = CancellationToken::new();
        let reloads = crate::reload::Reloads::new(daemon);
        match signal(SignalKind::hangup()) {
            // Served from now on, before any listener: a SIGHUP during start-up reloads too.
            Ok(hup) => {
                tokio::spawn(crate::reload::on_hangup(
                    hup,
                    reloads.clone(),
                    shutdown.clone(),
                ));
            }
            Err(e) => {
                tracing::error!(daemon, error = %e, "cannot catch SIGHUP: a reload signal would end the daemon");
            }
        }
        Server {
            daemon,
            grace,
            shutdown,
            health: HealthReporter::new(),
            tasks: JoinSet::new(),
            sockets: Vec::new(),
            listeners: Vec::new(),
            signals,
            reloads,
        }
    }

    /// The daemon's reloads: [`crate::reload::Reloads::set`] gives it its reload function
    /// (run on SIGHUP and by the admin `Reload`); `details` adds the figures to `Status`.
    pub fn reloads(&self) -> crate::reload::Reloads {
        self.reloads.clone()
    }

    /// Cancelled when the daemon begins to shut down; long-running work should watch it.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// The health reporter (the overall "" service is SERVING while the daemon runs).
    pub fn health(&self) -> HealthReporter {
        self.health.clone()
    }

    /// Where the daemon listens, for status answers.
    pub fn listeners(&self) -> Vec<String> {
        self.listeners.clone()
    }

    /// Serves `routes` (plus health) on `listener`, every call checked by its peer guard.
    pub fn serve(&mut self, listener: BoundListener, routes: Routes) {
        let routes = routes.add_service(tonic_health::pb::health_server::HealthServer::new(
            HealthService::from_health_reporter(self.health.clone()),
        ));
        let name = listener.name.clone();
        let describe = listener.describe();
        self.listeners.push(describe.clone());
        let builder = tonic::transport::Server::builder()
            .layer(crate::otel::TraceLayer)
            .layer(InterceptorLayer::new(listener.guard.clone()))
            .add_routes(routes);
        let token = self.shutdown.clone();
        tracing::info!(daemon = self.daemon, listener = %name, at = %describe, "listening");
        // One serving task per listener; only the stream of accepted connections differs.
        macro_rules! spawn_serving {
            ($incoming:expr) => {{
                let incoming = $incoming;
                self.tasks.spawn(async move {
                    builder
                        .serve_with_incoming_shutdown(incoming, token.cancelled_owned())
                        .await
                        .map_err(|source| ServeError::Transport {
                            listener: name,
                            source,
                        })
                });
            }};
        }
        match listener.kind {
            Kind::Unix { listener, path } => {
                self.sockets.push(path);
                // Credentials are read from each socket as it is accepted, not per request.
                spawn_serving!(
                    UnixListenerStream::new(listener).map(|r| r.map(PeerStream::accepted))
                );
            }
            Kind::Tcp {
                listener,
                tls: Some(tls),
            } => spawn_serving!(crate::tls::incoming(listener, tls, name.clone())),
            Kind::Tcp {
                listener,
                tls: None,
            } => spawn_serving!(TcpListenerStream::new(listener)),
        }
    }

    /// [`Server::serve`] for an operators' listener: also gRPC server reflection
    /// (`grpc.reflection.v1` and `v1alpha`) describing every `warden.v1` service and health, so
    /// `grpcurl` and other generic clients need no `.proto` files. Only on admin listeners: what
    /// the daemon-to-daemon sockets speak is fixed by the contracts, and their callers have them.
    ///
    /// `services` names what `routes` serves (e.g. `admin_service_server::SERVICE_NAME`):
    /// reflection lists those and health, not the other `warden.v1` services.
    pub fn serve_admin(&mut self, listener: BoundListener, routes: Routes, services: &[&str]) {
        let routes = match reflection(services) {
            Ok((v1, v1alpha)) => routes.add_service(v1).add_service(v1alpha),
            Err(e) => {
                // The descriptors are compiled in; this cannot fail unless the build is broken.
                tracing::error!(error = %e, "server reflection unavailable");
                routes
            }
        };
        self.serve(listener, routes)
    }

    /// Serves the daemon's Prometheus metrics when `[daemon] metrics_listen` is set (bound now,
    /// so a port in use fails the start-up); the listener ends with the others at shutdown.
    pub async fn serve_metrics(
        &mut self,
        section: &crate::config::DaemonSection,
        exporter: crate::metrics::Exporter,
    ) -> Result<(), crate::listener::ListenerError> {
        let Some(listener) = crate::metrics::bind(section).await? else {
            return Ok(());
        };
        let describe = listener.describe();
        tracing::info!(daemon = self.daemon, listener = "metrics", at = %describe, "listening");
        self.listeners.push(describe);
        let token = self.shutdown.clone();
        let daemon = self.daemon;
        self.tasks.spawn(async move {
            crate::metrics::serve(listener, exporter, token, daemon).await;
            Ok(())
        });
        Ok(())
    }

    /// Reports readiness to systemd, then runs until a signal, a cancelled shutdown token, or a
    /// failed listener. In-flight calls get the grace period; then they are aborted. Socket files
    /// are removed on the way out.
    pub async fn run(mut self) -> Result<(), ServeError> {
        let (mut term, mut int) = std::mem::replace(
            &mut self.signals,
            Err(std::io::Error::other("signals taken")),
        )
        .map_err(ServeError::Signal)?;
        crate::notify::ready();
        // Pings until run returns (the guard is dropped), through the drain as well: a drain
        // that hangs past WatchdogSec= is as dead as a hung runtime.
        let _watchdog = crate::notify::start_watchdog();
        tracing::info!(daemon = self.daemon, "ready");
        let mut failure = None;
        tokio::select! {
            _ = term.recv() => tracing::info!(daemon = self.daemon, "SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!(daemon = self.daemon, "SIGINT: shutting down"),
            _ = self.shutdown.cancelled() => tracing::info!(daemon = self.daemon, "shutdown requested"),
            Some(r) = self.tasks.join_next() => {
                failure = Some(match r {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e),
                    Err(e) => Some(ServeError::Join(e.to_string())),
                });
            }
        }
        crate::notify::stopping();
        self.health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        self.shutdown.cancel();
        let drained = tokio::time::timeout(self.grace, async {
            while let Some(r) = self.tasks.join_next().await {
                if let Ok(Err(e)) = r {
                    tracing::warn!(error = %e, "listener ended with an error");
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                daemon = self.daemon,
                grace_ms = self.grace.as_millis() as u64,
                "in-flight calls did not finish within the grace; aborting them"
            );
            self.tasks.abort_all();
        }
        for s in &self.sockets {
            let _ = std::fs::remove_file(s);
        }
        match failure.flatten() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The reflection services (v1 and the older v1alpha that some clients still ask for) for
/// warden's contracts and gRPC health.
#[allow(clippy::type_complexity)]
fn reflection(
    services: &[&str],
) -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    tonic_reflection::server::Error,
> {
    let builder = || {
        let mut b = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(warden_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name("grpc.health.v1.Health");
        for s in services {
            b = b.with_service_name(*s);
        }
        b
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}
