//! Generated tonic/prost code for warden's contracts (`proto/warden/v1`) and the A2A 1.0
//! contract the gateway serves over gRPC (`proto/lf/a2a/v1`, vendored), and nothing else.
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

/// `lf.a2a.v1`: the A2A 1.0 `A2AService` and its messages (vendored `a2a.proto`).
pub mod a2a {
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("lf.a2a.v1");
    }
}
