//! What every `PolicyService` implementation shares (warden-policy, warden-approver, a third
//! one): the limits on a Decide request (`DecideSection`; `bounds`: the one size and nesting
//! check, which the supervisor also runs before it sends a request), the conversion from the wire request
//! to the rules' input refusing what is malformed (`convert`, with the digest of the action an
//! ALLOW judged), the filesystem view of one decision (`fsview`), the caller-side helper that
//! bounds a decision by its deadline and fails closed (`contract::decide_with_deadline`), and
//! the contract kit that holds any implementation to the same rules (`contract`).
//!
//! Must never: decide anything itself (the rules do, in `warden-rules`), keep state between
//! decisions, or answer ALLOW for a request it could not convert.

#![forbid(unsafe_code)]

pub mod bounds;
pub mod contract;
pub mod convert;
pub mod fsview;

use serde::Deserialize;
use tonic::Status;
use warden_daemon::config::{ConfigError, Origin};
use warden_proto::v1 as pb;

/// The answers of one `DecideStream`.
pub type DecisionStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::Decision, Status>> + Send>>;

/// Limits on a Decide request; anything beyond them is malformed and denied.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DecideSection {
    /// Largest raw input (JSON text) accepted, in bytes.
    #[serde(default = "default_raw")]
    pub max_raw_input_bytes: usize,
    /// Most locations one tool call may name.
    #[serde(default = "default_locations")]
    pub max_locations: usize,
    /// Most options one request may carry.
    #[serde(default = "default_options")]
    pub max_options: usize,
    /// Largest tool call title accepted, in bytes.
    #[serde(default = "default_title")]
    pub max_title_bytes: usize,
    /// Deepest nesting of arrays and objects in the raw input's JSON text.
    #[serde(default = "default_depth")]
    pub max_json_depth: usize,
    /// Return ESCALATE as is (set when an approver chains to this service); otherwise an
    /// escalation becomes DENY per `non_interactive`.
    #[serde(default)]
    pub return_escalations: bool,
}

fn default_raw() -> usize {
    warden_proto::limits::DEFAULT_MAX_RAW_INPUT_BYTES as usize
}
fn default_locations() -> usize {
    warden_proto::limits::DEFAULT_MAX_LOCATIONS as usize
}
fn default_options() -> usize {
    warden_proto::limits::DEFAULT_MAX_OPTIONS as usize
}
fn default_title() -> usize {
    warden_proto::limits::DEFAULT_MAX_TITLE_BYTES as usize
}
fn default_depth() -> usize {
    warden_proto::limits::DEFAULT_MAX_JSON_DEPTH as usize
}

impl Default for DecideSection {
    fn default() -> Self {
        Self {
            max_raw_input_bytes: default_raw(),
            max_locations: default_locations(),
            max_options: default_options(),
            max_title_bytes: default_title(),
            max_json_depth: default_depth(),
            return_escalations: false,
        }
    }
}

impl DecideSection {
    /// Every limit at least 1: a zero would deny every request, which is never meant (used by
    /// warden-policy and by warden-approver, which shares this section).
    pub fn validate(&self, origin: &Origin) -> Result<(), ConfigError> {
        for (key, v) in [
            ("decide.max_raw_input_bytes", self.max_raw_input_bytes),
            ("decide.max_locations", self.max_locations),
            ("decide.max_options", self.max_options),
            ("decide.max_title_bytes", self.max_title_bytes),
            ("decide.max_json_depth", self.max_json_depth),
        ] {
            if v == 0 {
                return Err(ConfigError::invalid(origin, key, "must be at least 1"));
            }
        }
        Ok(())
    }

    /// The limits a request is held to (and a `Describe` states).
    pub fn limits(&self) -> bounds::Limits {
        bounds::Limits {
            max_raw_input_bytes: self.max_raw_input_bytes as u64,
            max_locations: self.max_locations as u64,
            max_options: self.max_options as u64,
            max_title_bytes: self.max_title_bytes as u64,
            max_json_depth: self.max_json_depth as u64,
        }
    }
}
