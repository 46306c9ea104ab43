//! Tracing setup: human or JSON lines on stderr, filtered by `RUST_LOG` or the configured level.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `format` is `human` or `json`; anything else means human.
/// Safe to call twice (the second call is ignored).
pub fn init(format: &str, level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if format == "json" {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init()
    } else {
        builder.with_ansi(false).try_init()
    };
}
