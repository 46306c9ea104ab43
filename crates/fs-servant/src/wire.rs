//! The supervisor ↔ servant messages (prost, length-delimited on the servant's stdio). Not a
//! public contract: both ends ship in the same package and are upgraded together, so the
//! messages live here rather than in `proto/warden/v1`.
//!
//! Zero values are never permissive: a request without an operation is refused, a response
//! without a result is a failure to the supervisor.

/// One operation, carried out beneath the root.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    #[prost(oneof = "request::Op", tags = "1, 2")]
    pub op: Option<request::Op>,
}

pub mod request {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Op {
        #[prost(message, tag = "1")]
        Read(super::Read),
        #[prost(message, tag = "2")]
        Write(super::Write),
    }
}

/// `fs/read_text_file` of a resolved path: at most `max_bytes`, lines selected as ACP says.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Read {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(uint64, optional, tag = "2")]
    pub line: Option<u64>,
    #[prost(uint64, optional, tag = "3")]
    pub limit: Option<u64>,
    #[prost(uint64, tag = "4")]
    pub max_bytes: u64,
}

/// `fs/write_text_file` of a resolved path.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Write {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(bytes = "vec", tag = "2")]
    pub content: Vec<u8>,
}

/// The answer to one request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    #[prost(oneof = "response::Result", tags = "1, 2, 3")]
    pub result: Option<response::Result>,
}

pub mod response {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Result {
        /// A read's text.
        #[prost(string, tag = "1")]
        Text(String),
        /// A write was made.
        #[prost(message, tag = "2")]
        Written(super::Written),
        #[prost(message, tag = "3")]
        Failure(super::Failure),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Written {}

/// Why a request was not carried out.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Failure {
    #[prost(enumeration = "FailureKind", tag = "1")]
    pub kind: i32,
    /// For people (the supervisor's logs); never parsed.
    #[prost(string, tag = "2")]
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum FailureKind {
    Unspecified = 0,
    NotFound = 1,
    /// Outside the root, or a symbolic link in the path.
    Boundary = 2,
    /// A directory, FIFO or device, or a path naming no file.
    NotRegular = 3,
    HardLinked = 4,
    TooLarge = 5,
    NotText = 6,
    /// The agent's own rights refused it (a file mode, a read-only bind: EACCES, EPERM, EROFS).
    Denied = 7,
    /// The root could not be opened, or the kernel has no openat2.
    Unavailable = 8,
    Io = 9,
    Malformed = 10,
}
