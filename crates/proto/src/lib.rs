//! Generated tonic/prost code for warden's contracts (`proto/warden/v1`), and nothing else.
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

/// The encoded `FileDescriptorSet` of every `warden.v1` file, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/warden_descriptor.bin"));
