//! A connection's bounds and defaults (`ClientConfig`): what the client reads from the agent,
//! queues for it and handles at once. Owns no state; must never enforce anything itself.

use std::time::Duration;

/// Default bound on one incoming line: 16 MiB.
pub const DEFAULT_MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// Default bound on the agent's requests being handled at once.
pub const DEFAULT_MAX_INCOMING_REQUESTS: usize = 64;
/// Default bound on the bytes of the agent's requests being handled at once: 32 MiB.
pub const DEFAULT_MAX_INCOMING_BYTES: usize = 32 * 1024 * 1024;
/// Default bound on the bytes queued for the agent's stdin and not written yet: 32 MiB.
pub const DEFAULT_MAX_QUEUED_BYTES: usize = 32 * 1024 * 1024;
/// Default bound on the bytes of the agent's updates queued for the caller and not taken: 64 MiB.
pub const DEFAULT_MAX_QUEUED_EVENT_BYTES: usize = 64 * 1024 * 1024;

/// Which JSON type our outgoing request ids use (the agent must echo either).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdStyle {
    /// `0, 1, 2, ...`
    #[default]
    Int,
    /// `"warden-0", "warden-1", ...`
    Str,
}

/// Connection settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Longest accepted incoming line; a longer one is a protocol fault.
    pub max_line_bytes: usize,
    /// Timeout for requests other than `session/prompt` (`None` = wait forever).
    pub request_timeout: Option<Duration>,
    /// How long [`AcpClient::cancel`] waits for the prompt response.
    pub cancel_deadline: Duration,
    /// Id type for our requests.
    pub id_style: IdStyle,
    /// `clientInfo.name`.
    pub client_name: String,
    /// `clientInfo.version`.
    pub client_version: String,
    /// Refuse (answer `-32603`) when the handler picks an option id that was
    /// not offered or has an unknown kind. Only tests turn this off, to see how
    /// an agent reacts to a bogus id.
    pub enforce_offered_options: bool,
    /// After this many lines that are not JSON-RPC, fault the connection
    /// (`None` = log them and keep going).
    pub max_malformed_lines: Option<u64>,
    /// How many permission timings are kept (oldest dropped first), so a
    /// long-lived connection does not grow without bound.
    pub permission_timing_capacity: usize,
    /// The agent's requests handled at once (each is a task holding its answer until it
    /// is queued); one more is answered at once with an error saying so, unhandled.
    pub max_incoming_requests: usize,
    /// Bytes of the lines of the agent's requests being handled at once (each task holds
    /// its request until it is answered): one more whose line would pass it is answered at
    /// once with an error, unhandled. One request alone is always handled, whatever its size
    /// (`max_line_bytes` bounds it).
    pub max_incoming_bytes: usize,
    /// Bytes queued for the agent's stdin and not written yet. A line that would pass it
    /// while the queue is not empty faults the connection (`Fault::InputNotRead`): the
    /// agent stopped reading what it asked for, and the queue must not hold the
    /// supervisor's memory for it. One line alone is always queued, whatever its size.
    pub max_queued_bytes: usize,
    /// Bytes of the agent's updates (and protocol errors) queued for the caller and not
    /// taken from [`AcpEvents`] yet (between turns nobody takes them). One more line past it
    /// faults the connection (`Fault::UpdatesNotTaken`): reading stops, so the agent, not the
    /// caller's memory, waits. One event alone is always queued.
    pub max_queued_event_bytes: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            request_timeout: Some(Duration::from_secs(60)),
            cancel_deadline: Duration::from_secs(10),
            id_style: IdStyle::Int,
            client_name: "warden".into(),
            client_version: env!("CARGO_PKG_VERSION").into(),
            enforce_offered_options: true,
            max_malformed_lines: None,
            permission_timing_capacity: 4096,
            max_incoming_requests: DEFAULT_MAX_INCOMING_REQUESTS,
            max_incoming_bytes: DEFAULT_MAX_INCOMING_BYTES,
            max_queued_bytes: DEFAULT_MAX_QUEUED_BYTES,
            max_queued_event_bytes: DEFAULT_MAX_QUEUED_EVENT_BYTES,
        }
    }
}
