//! `[limits]`: every quota and bound of the supervisor, with its default and its durations.
//!
//! Owns: the limits' names and defaults. Must never: enforce one (the admission, pool and turn
//! modules do).

use super::*;

/// Quotas (seed 004). Every bound is configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Task text over this many bytes is refused before anything starts.
    pub task_text_bytes: usize,
    /// Default turn timeout (the soft budget stated to the agent); hard cutoff at 1.2x.
    pub turn_timeout_secs: u64,
    /// Output retained per turn; beyond it the turn ends with fault `output-limit`.
    pub output_bytes: usize,
    /// Agent stderr kept in a ring of this many bytes.
    pub stderr_ring_bytes: usize,
    /// One transcript file is at most this big.
    pub transcript_bytes: usize,
    /// An idle conversation's agent is stopped after this long (0 = never).
    pub idle_timeout_secs: u64,
    /// An agent that does not answer `initialize` (and `session/new`) within this is killed.
    pub handshake_deadline_ms: u64,
    /// After `session/cancel`, how long the agent has to end the turn before it is killed.
    pub cancel_grace_ms: u64,
    /// SIGTERM → SIGKILL grace when a tree is killed.
    pub kill_grace_ms: u64,
    /// Conversations with a live agent at most (idle-stopped ones do not count): the upper
    /// bound of `max_live_agents`.
    pub max_conversations: usize,
    /// Agents alive at once; 0 = derived from the host's memory (see `live::default_cap`). At
    /// the limit the least recently used idle agent is stopped; with every one busy a start is
    /// refused (RESOURCE_EXHAUSTED / fault `capacity`).
    pub max_live_agents: usize,
    /// Turns running at once across all conversations; 0 = sixteen per core. More wait, in
    /// the fair order (round robin across principals).
    pub max_active_turns: usize,
    /// Turn slots one principal may hold; 0 = `admission::default_share`.
    pub max_active_turns_per_principal: usize,
    /// Open conversations one principal may hold at once (each holds its root's fd and, with
    /// `sandbox.agent_uid_range`, a uid until it is closed); unset = 384, or three quarters of
    /// the uid range when smaller, at least 1; 0 is refused. One more open is refused (RESOURCE_EXHAUSTED, fault `capacity`).
    pub max_open_conversations_per_principal: Option<usize>,
    /// How long a turn waits for a live agent when every one is busy (then fault `capacity`).
    pub capacity_wait_ms: u64,
    /// Turn starts waiting for a live agent at most; one more is refused (fault `capacity`).
    pub max_agent_waiters: usize,
    /// Turns waiting in one conversation's queue at most; more are refused.
    pub max_queued_turns: usize,
    /// Agents starting at once (spawn to `session/new`); 0 = two per core. More wait their turn
    /// before they spawn, so the handshake deadline measures the agent, not a crowd of starts.
    pub max_starting_agents: usize,
    /// Start slots one principal may hold at once; 0 = three quarters of
    /// `max_starting_agents`, at least 1 (`admission::default_share` of it). Waiting starts are
    /// served round robin across principals, so one caller's burst of new contexts cannot
    /// queue another's start behind it (issue 36).
    pub max_starting_agents_per_principal: usize,
    /// One `fs/read_text_file` answer is at most this many bytes (the file, or the selected
    /// lines); a larger one is refused with an error naming this key.
    pub fs_read_bytes: u64,
    /// One agent's requests handled at once (`warden_acp::ClientConfig::max_incoming_requests`);
    /// one more is answered with an error at once, unhandled.
    pub agent_requests_in_flight: usize,
    /// Bytes of the lines of one agent's requests handled at once
    /// (`warden_acp::ClientConfig::max_incoming_bytes`); one more that would pass it is
    /// answered with an error at once, unhandled.
    pub agent_requests_bytes: usize,
    /// Bytes queued for one agent's stdin and not read by it
    /// (`warden_acp::ClientConfig::max_queued_bytes`); past it the agent is stopped with fault
    /// `request-limit`.
    pub agent_queue_bytes: usize,
    /// `fs/read_text_file` and `fs/write_text_file` requests of one turn (0 = unbounded).
    pub fs_requests_per_turn: u32,
    /// Permission requests of one turn (0 = unbounded). A client write no ALLOW covers is
    /// decided too; it counts among `fs_requests_per_turn`.
    pub permissions_per_turn: u32,
    /// `elicitation/create` requests of one turn (0 = unbounded).
    pub questions_per_turn: u32,
    /// `terminal/create` requests of one turn (0 = unbounded); the next is refused and ends the
    /// turn with fault `request-limit`. A terminal no ALLOW of the turn judged is decided on its
    /// own: it counts here, not among `permissions_per_turn`.
    pub terminals_per_turn: u32,
    /// Terminals one conversation holds at once (created, not released yet: running or exited
    /// with their output kept). One more `terminal/create` is refused, before any decision.
    pub max_terminals: usize,
    /// Output one conversation's terminals hold together: each terminal reserves its tail bound
    /// (its `outputByteLimit`, at most `output_bytes`) at creation, and gives it back when
    /// released; a `terminal/create` whose bound does not fit what is left is refused.
    pub terminal_output_bytes: usize,
    /// Connections one agent's egress proxy holds open at once; more are answered 503.
    pub egress_connections: usize,
    /// Refusals of one destination within a turn that end the turn (fault `egress-refused`);
    /// 0 = never.
    pub egress_refusals_end_turn: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            task_text_bytes: 16 * 1024,
            turn_timeout_secs: 600,
            output_bytes: 256 * 1024,
            stderr_ring_bytes: 64 * 1024,
            transcript_bytes: 256 * 1024,
            idle_timeout_secs: 120,
            handshake_deadline_ms: 10_000,
            cancel_grace_ms: 2000,
            kill_grace_ms: 2000,
            max_conversations: 512,
            max_live_agents: 0,
            max_active_turns: 0,
            max_active_turns_per_principal: 0,
            max_open_conversations_per_principal: None,
            capacity_wait_ms: 60_000,
            max_agent_waiters: 1024,
            max_queued_turns: 64,
            max_starting_agents: 0,
            max_starting_agents_per_principal: 0,
            fs_read_bytes: 2 * 1024 * 1024,
            agent_requests_in_flight: warden_acp::DEFAULT_MAX_INCOMING_REQUESTS,
            agent_requests_bytes: warden_acp::DEFAULT_MAX_INCOMING_BYTES,
            agent_queue_bytes: warden_acp::DEFAULT_MAX_QUEUED_BYTES,
            fs_requests_per_turn: 2048,
            permissions_per_turn: 1024,
            questions_per_turn: 16,
            terminals_per_turn: 64,
            max_terminals: 16,
            terminal_output_bytes: 4 * 1024 * 1024,
            egress_connections: 64,
            egress_refusals_end_turn: 3,
        }
    }
}

impl Limits {
    /// The per-turn request bounds.
    pub fn turn_quotas(&self) -> crate::turn::Quotas {
        crate::turn::Quotas {
            fs_requests: self.fs_requests_per_turn,
            permissions: self.permissions_per_turn,
            questions: self.questions_per_turn,
            terminals: self.terminals_per_turn,
        }
    }
    pub fn handshake(&self) -> Duration {
        Duration::from_millis(self.handshake_deadline_ms)
    }
    pub fn cancel_grace(&self) -> Duration {
        Duration::from_millis(self.cancel_grace_ms)
    }
    pub fn kill_grace(&self) -> Duration {
        Duration::from_millis(self.kill_grace_ms)
    }
    pub fn capacity_wait(&self) -> Duration {
        Duration::from_millis(self.capacity_wait_ms)
    }
    pub fn idle(&self) -> Option<Duration> {
        (self.idle_timeout_secs > 0).then(|| Duration::from_secs(self.idle_timeout_secs))
    }
}
