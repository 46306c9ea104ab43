//! What every `PolicyService` implementation shares (warden-policy, warden-approver, a third
//! one): the limits on a Decide request (`DecideSection`), the conversion from the wire request
//! to the rules' input refusing what is malformed (`convert`, with the digest of the action an
//! ALLOW judged), the filesystem view of one decision (`fsview`), the caller-side helper that
//! bounds a decision by its deadline and fails closed (`contract::decide_with_deadline`), and
//! the contract kit that holds any implementation to the same rules (`contract`).
//!
//! Must never: decide anything itself (the rules do, in `warden-rules`), keep state between
//! decisions, or answer ALLOW for a request it could not convert.

#![forbid(unsafe_code)]

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
    /// Return ESCALATE as is (set when an approver chains to this service); otherwise an
    /// escalation becomes DENY per `non_interactive`.
    #[serde(default)]
    pub return_escalations: bool,
}

fn default_raw() -> usize {
    256 * 1024
}
fn default_locations() -> usize {
    256
}
fn default_options() -> usize {
    32
}

impl Default for DecideSection {
    fn default() -> Self {
        Self {
            max_raw_input_bytes: default_raw(),
            max_locations: default_locations(),
            max_options: default_options(),
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
        ] {
            if v == 0 {
                return Err(ConfigError::invalid(origin, key, "must be at least 1"));
            }
        }
        Ok(())
    }
}
