//! Traces: OpenTelemetry spans from `tracing` (tracing-opentelemetry), exported over OTLP/gRPC
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` names a collector (off otherwise: no exporter, no thread,
//! no span created for a request), and the W3C trace context (`traceparent`) carried between the
//! daemons, so one task is one trace: the caller's HTTP request → the gateway (its task) →
//! `RunTurn` → the supervisor (the turn, each permission) → `Decide` → the policy or the approver
//! (→ the policy).
//!
//! Every listener's requests get a server span whose parent is the caller's `traceparent`
//! header or gRPC metadata ([`TraceLayer`], put on every listener by [`crate::Server`] and on the
//! gateway's HTTP router); a client call carries the current span's context ([`inject`]).
//! The propagation format is the W3C one, parsed and written by the OpenTelemetry SDK's
//! `TraceContextPropagator`.

use std::sync::OnceLock;
use std::task::{Context as TaskContext, Poll};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tonic::codegen::http;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The environment variable that turns tracing on (the OpenTelemetry specification's name):
/// the collector's OTLP/gRPC endpoint, e.g. `http://127.0.0.1:4317`.
pub const ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

struct Exporting {
    provider: SdkTracerProvider,
    /// Drives the exporter's gRPC connection: the SDK's batch processor exports from a thread of
    /// its own, and tonic needs a Tokio reactor for its I/O. Kept for the process's life.
    _runtime: tokio::runtime::Runtime,
}

static EXPORTING: OnceLock<Exporting> = OnceLock::new();

/// Whether spans are exported (the layer is installed and the exporter runs).
pub fn enabled() -> bool {
    EXPORTING.get().is_some()
}

#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    #[error("cannot start the OTLP exporter's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot build the OTLP exporter for {endpoint}: {message}")]
    Exporter { endpoint: String, message: String },
}

/// The collector to export to: the configured one (`[daemon] otlp_endpoint`) first, then
/// [`ENDPOINT_ENV`]; None (tracing off) with neither, or with an empty one.
pub fn endpoint(configured: Option<&str>) -> Option<String> {
    match configured {
        Some(c) => Some(c.trim().to_string()),
        None => std::env::var(ENDPOINT_ENV).ok(),
    }
    .filter(|e| !e.is_empty())
}

/// The tracing layer that turns spans into OpenTelemetry spans of `service` (its
/// `service.name`), when a collector is named ([`endpoint`]); None when none is.
pub fn layer<S>(
    service: &'static str,
    configured: Option<&str>,
) -> Result<Option<impl tracing_subscriber::Layer<S> + 'static>, OtelError>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let Some(endpoint) = endpoint(configured) else {
        return Ok(None);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otlp-export")
        .enable_all()
        .build()
        .map_err(OtelError::Runtime)?;
    let exporter = {
        // The channel is made (lazily connected) on this runtime, which then drives it.
        let _in = runtime.enter();
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .build()
            .map_err(|e| OtelError::Exporter {
                endpoint: endpoint.clone(),
                message: e.to_string(),
            })?
    };
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service)
                .build(),
        )
        .build();
    let tracer = provider.tracer(service);
    let _ = EXPORTING.set(Exporting {
        provider,
        _runtime: runtime,
    });
    Ok(Some(tracing_opentelemetry::layer().with_tracer(tracer)))
}

/// Exports what is buffered and stops the exporter (at the daemon's exit).
pub fn shutdown() {
    if let Some(e) = EXPORTING.get()
        && let Err(err) = e.provider.shutdown()
    {
        tracing::warn!(error = %err, "the OTLP exporter did not shut down cleanly");
    }
}

/// Writes the current span's context as `traceparent` (and `tracestate`) into a gRPC call's
/// metadata; nothing when tracing is off or there is no current span.
pub fn inject(metadata: &mut tonic::metadata::MetadataMap) {
    if !enabled() {
        return;
    }
    let cx = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&cx, &mut MetadataInjector(metadata));
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(k, v);
        }
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The server span of one request: named by method and path, its parent the caller's
/// `traceparent` (a malformed one is ignored by the propagator: the span starts a new trace).
fn request_span<B>(req: &http::Request<B>) -> tracing::Span {
    let span = tracing::info_span!(
        "request",
        otel.name = %format!("{} {}", req.method(), req.uri().path()),
        otel.kind = "server",
    );
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(req.headers()));
    let _ = span.set_parent(parent);
    span
}

/// A tower layer giving every request a server span continued from the caller's trace
/// context (gRPC metadata and HTTP headers alike); a no-op while tracing is off.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceLayer;

impl<S> tower::Layer<S> for TraceLayer {
    type Service = Traced<S>;
    fn layer(&self, inner: S) -> Traced<S> {
        Traced(inner)
    }
}

/// See [`TraceLayer`].
#[derive(Debug, Clone)]
pub struct Traced<S>(S);

impl<S, B> tower::Service<http::Request<B>> for Traced<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = tracing::instrument::Instrumented<S::Future>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let span = if enabled() {
            request_span(&req)
        } else {
            tracing::Span::none()
        };
        let fut = {
            let _in = span.enter();
            self.0.call(req)
        };
        fut.instrument(span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_without_the_endpoint_and_nothing_is_injected() {
        // This test process never sets the endpoint.
        assert!(!enabled());
        let mut md = tonic::metadata::MetadataMap::new();
        inject(&mut md);
        assert!(md.is_empty());
    }

    #[test]
    fn the_configured_collector_is_used_and_an_empty_one_turns_traces_off() {
        assert_eq!(
            endpoint(Some(" http://127.0.0.1:4317 ")).as_deref(),
            Some("http://127.0.0.1:4317")
        );
        // An empty key is an operator turning traces off for this daemon, whatever the
        // environment says.
        assert_eq!(endpoint(Some("")), None);
    }
}
