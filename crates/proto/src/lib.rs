//! Generated tonic/prost code for warden's contracts (`proto/warden/v1`) and the A2A 1.0
//! contract the gateway serves over gRPC (`proto/lf/a2a/v1`, vendored), and the few numbers
//! the proto files state in words ([`limits`]), and nothing else.
//!
//! This crate must never hold hand-written logic: the proto files are the public contract that
//! operators implement (e.g. a third `PolicyService`), and what is generated from them is all
//! that the services share at the wire level.
#![forbid(unsafe_code)]

/// `warden.v1`: PolicyService, SupervisorService, AdminService, ApprovalService and their messages.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("warden.v1");
}

/// Numbers the contracts state in words, so that every implementation and caller uses the same.
pub mod limits {
    /// The longest `PolicyDescription.decide_deadline_ms` (policy.proto) may be: one hour. An
    /// implementation (warden-approver) refuses to start with a longer one; a caller (the
    /// supervisor) never adopts more than this from a description.
    pub const MAX_DECIDE_DEADLINE_MS: u64 = 3_600_000;

    /// The largest encoded `DecideRequest` (and `Decision`) on `PolicyService`, on `Decide` and
    /// on each message of `DecideStream`: 4 MiB, tonic's own default, set explicitly on both
    /// sides (the policy's and the approver's servers decode at most this; the supervisor's
    /// client encodes at most this and refuses a larger request itself before sending it, so no
    /// message can end the one stream every conversation's decisions travel on).
    pub const MAX_DECIDE_MESSAGE_BYTES: usize = 4 << 20;

    /// The defaults of the request limits a `PolicyService` states in its `PolicyDescription`
    /// (warden-policy's `[decide]`): a request over any of them is malformed, and the caller
    /// refuses it itself instead of sending it.
    pub const DEFAULT_MAX_RAW_INPUT_BYTES: u64 = 256 * 1024;
    pub const DEFAULT_MAX_LOCATIONS: u64 = 256;
    pub const DEFAULT_MAX_OPTIONS: u64 = 32;
    pub const DEFAULT_MAX_TITLE_BYTES: u64 = 64 * 1024;
    /// Nesting of arrays and objects in the raw input's JSON text.
    pub const DEFAULT_MAX_JSON_DEPTH: u64 = 64;

    /// `Subject.groups`: at most this many, each at most `MAX_GROUP_BYTES` (what the gateway
    /// takes from one credential); a request over either is malformed.
    pub const MAX_SUBJECT_GROUPS: usize = 256;
    pub const MAX_GROUP_BYTES: usize = 1024;
}

/// The encoded `FileDescriptorSet` of every `warden.v1` file, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/warden_descriptor.bin"));

/// `lf.a2a.v1`: the A2A 1.0 `A2AService` and its messages (vendored `a2a.proto`).
pub mod a2a {
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("lf.a2a.v1");
    }
}
