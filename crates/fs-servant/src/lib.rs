//! `warden-fs-servant`: the process that carries out an agent's ACP `fs/read_text_file` and
//! `fs/write_text_file` once the supervisor has decided them. It is started inside the agent's
//! own sandbox (the supervisor's `Spawner`, like an ACP terminal: the agent's uid and gid, the
//! same bubblewrap view of the root with its read-only control binds, no capabilities), so a
//! read-only bind, a file mode or a missing capability stops it exactly as it stops the agent.
//!
//! Wire: length-delimited prost messages ([`wire`]) on stdin (requests) and stdout (answers),
//! one answer per request, in order. Every path it is handed is the location the supervisor's
//! decision judged, already resolved: it opens it beneath the root's fd with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` (`RootDir::no_symlinks`), so a component turned
//! into a link since is a refusal, never a different file.
//!
//! Owns: the I/O of one request at a time, bounded (a request frame by [`MAX_REQUEST_BYTES`], a
//! read by the `max_bytes` it is given).
//!
//! Must never: decide anything (it does what it is asked: the supervisor asks only what was
//! decided), follow a symbolic link, or be trusted by the supervisor: it shares the agent's uid,
//! so the agent can kill it, ptrace it or answer in its place; the supervisor bounds, times and
//! checks every answer.
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::path::Path;

use warden_containment::beneath::{BeneathError, ReadSpec, RootDir};

pub mod wire;

use wire::{Failure, FailureKind, Request, Response, request, response};

/// The largest request frame the servant reads: a write's content is one ACP line, which the
/// supervisor bounds at 16 MiB (`warden_acp::DEFAULT_MAX_LINE_BYTES`), plus room for the path.
pub const MAX_REQUEST_BYTES: usize = 17 * 1024 * 1024;

/// The longest length prefix prost writes (a varint of a u64).
const MAX_PREFIX: usize = 10;

/// Why a frame could not be read.
#[derive(Debug)]
pub enum FrameError {
    /// The stream ended between frames (the normal end).
    Closed,
    /// The length prefix is not a varint, or names more than the bound.
    Malformed(String),
    Io(std::io::Error),
}

/// The body length a length-delimited frame's prefix names, once `prefix` holds all of it:
/// `Ok(None)` while more prefix bytes are needed. Shared by both ends (the supervisor reads
/// the prefix byte by byte from an async stream).
pub fn frame_len(prefix: &[u8], max: usize) -> Result<Option<usize>, FrameError> {
    let Some(last) = prefix.last() else {
        return Ok(None);
    };
    if last & 0x80 != 0 {
        return if prefix.len() >= MAX_PREFIX {
            Err(FrameError::Malformed("length prefix too long".into()))
        } else {
            Ok(None)
        };
    }
    let len = prost::decode_length_delimiter(prefix)
        .map_err(|e| FrameError::Malformed(format!("length prefix: {e}")))?;
    if len > max {
        return Err(FrameError::Malformed(format!(
            "a frame of {len} bytes is over the bound of {max}"
        )));
    }
    Ok(Some(len))
}

/// Reads one length-delimited frame of at most `max` bytes.
pub fn read_frame(r: &mut impl Read, max: usize) -> Result<Vec<u8>, FrameError> {
    let mut prefix = Vec::with_capacity(MAX_PREFIX);
    let len = loop {
        let mut b = [0u8; 1];
        match r.read(&mut b) {
            Ok(0) if prefix.is_empty() => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Malformed("the stream ended in a prefix".into())),
            Ok(_) => prefix.push(b[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FrameError::Io(e)),
        }
        if let Some(len) = frame_len(&prefix, max)? {
            break len;
        }
    };
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(FrameError::Io)?;
    Ok(body)
}

/// Carries out one request beneath `root` (which must have been opened `no_symlinks`).
pub fn serve_one(root: &RootDir, req: Request) -> Response {
    let result = match req.op {
        Some(request::Op::Read(r)) => {
            let spec = ReadSpec {
                line: r.line,
                limit: r.limit,
                max_bytes: r.max_bytes,
            };
            root.read_text(Path::new(&r.path), spec)
                .map(response::Result::Text)
                .unwrap_or_else(|e| response::Result::Failure(failure(e)))
        }
        Some(request::Op::Write(w)) => root
            .write_text(Path::new(&w.path), &w.content, None)
            .map(|()| response::Result::Written(wire::Written {}))
            .unwrap_or_else(|e| response::Result::Failure(failure(e))),
        None => response::Result::Failure(Failure {
            kind: FailureKind::Malformed as i32,
            message: "a request without an operation".into(),
        }),
    };
    Response {
        result: Some(result),
    }
}

/// Serves requests from `input` until it ends; answers on `output`.
pub fn serve(
    root: &RootDir,
    input: &mut impl Read,
    output: &mut impl Write,
) -> std::io::Result<()> {
    use prost::Message;
    loop {
        let frame = match read_frame(input, MAX_REQUEST_BYTES) {
            Ok(f) => f,
            Err(FrameError::Closed) => return Ok(()),
            Err(FrameError::Io(e)) => return Err(e),
            // The stream is out of step: nothing after this can be trusted to be a request.
            Err(FrameError::Malformed(m)) => {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, m));
            }
        };
        let answer = match Request::decode(frame.as_slice()) {
            Ok(req) => serve_one(root, req),
            Err(e) => Response {
                result: Some(response::Result::Failure(Failure {
                    kind: FailureKind::Malformed as i32,
                    message: format!("undecodable request: {e}"),
                })),
            },
        };
        output.write_all(&answer.encode_length_delimited_to_vec())?;
        output.flush()?;
    }
}

/// The refusal as the wire carries it: a kind the supervisor maps, and the text for people.
fn failure(e: BeneathError) -> Failure {
    let kind = match &e {
        BeneathError::NotFound(_) => FailureKind::NotFound,
        BeneathError::Outside(_) | BeneathError::RelativeRoot(_) | BeneathError::Symlink(_) => {
            FailureKind::Boundary
        }
        BeneathError::NotRegular(_) | BeneathError::NoFileName(_) => FailureKind::NotRegular,
        BeneathError::HardLinked(_) => FailureKind::HardLinked,
        BeneathError::TooLarge { .. } => FailureKind::TooLarge,
        BeneathError::NotText(_) => FailureKind::NotText,
        BeneathError::Unsupported | BeneathError::Root { .. } | BeneathError::Rights(_) => {
            FailureKind::Unavailable
        }
        BeneathError::Io { source, .. } => match source.raw_os_error() {
            // The agent's own rights refused it: a mode, a read-only bind, no capability.
            Some(n) if n == EACCES || n == EPERM || n == EROFS => FailureKind::Denied,
            _ => FailureKind::Io,
        },
    };
    Failure {
        kind: kind as i32,
        message: e.to_string(),
    }
}

// errno values (asm-generic, every Linux architecture warden builds for).
const EPERM: i32 = 1;
const EACCES: i32 = 13;
const EROFS: i32 = 30;

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    fn frames(reqs: &[Request]) -> Vec<u8> {
        reqs.iter()
            .flat_map(|r| r.encode_length_delimited_to_vec())
            .collect()
    }

    fn answers(mut out: &[u8]) -> Vec<response::Result> {
        let mut v = Vec::new();
        while !out.is_empty() {
            let body = read_frame(&mut out, 1 << 20).unwrap();
            v.push(Response::decode(body.as_slice()).unwrap().result.unwrap());
        }
        v
    }

    #[test]
    fn requests_are_answered_in_order_and_links_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("ro")).unwrap();
        std::os::unix::fs::symlink("ro", root.join("d")).unwrap();
        let r = RootDir::open(&root).unwrap().no_symlinks();
        let write = |p: &str, c: &str| Request {
            op: Some(request::Op::Write(wire::Write {
                path: root.join(p).to_string_lossy().into_owned(),
                content: c.as_bytes().to_vec(),
            })),
        };
        let read = |p: &str, max| Request {
            op: Some(request::Op::Read(wire::Read {
                path: root.join(p).to_string_lossy().into_owned(),
                line: None,
                limit: None,
                max_bytes: max,
            })),
        };
        let input = frames(&[
            write("a.txt", "hello"),
            read("a.txt", 100),
            read("a.txt", 2),
            write("d/x.json", "pwned"),
            read("missing", 100),
            Request { op: None },
        ]);
        let mut out = Vec::new();
        serve(&r, &mut input.as_slice(), &mut out).unwrap();
        let got = answers(&out);
        assert_eq!(got.len(), 6);
        assert_eq!(got[0], response::Result::Written(wire::Written {}));
        assert_eq!(got[1], response::Result::Text("hello".into()));
        let kind = |a: &response::Result| match a {
            response::Result::Failure(f) => f.kind(),
            other => panic!("expected a failure, got {other:?}"),
        };
        assert_eq!(kind(&got[2]), FailureKind::TooLarge);
        assert_eq!(kind(&got[3]), FailureKind::Boundary);
        assert!(!root.join("ro/x.json").exists());
        assert_eq!(kind(&got[4]), FailureKind::NotFound);
        assert_eq!(kind(&got[5]), FailureKind::Malformed);
    }

    #[test]
    fn a_frame_over_the_bound_or_a_broken_prefix_stops_the_servant() {
        let dir = tempfile::tempdir().unwrap();
        let r = RootDir::open(dir.path()).unwrap().no_symlinks();
        let mut huge = Vec::new();
        prost::encode_length_delimiter(MAX_REQUEST_BYTES + 1, &mut huge).unwrap();
        let mut out = Vec::new();
        assert!(serve(&r, &mut huge.as_slice(), &mut out).is_err());
        let endless = [0xffu8; 11];
        assert!(serve(&r, &mut endless.as_slice(), &mut out).is_err());
        assert!(out.is_empty());
        // A stream that ends between frames is the normal end.
        assert!(serve(&r, &mut [0u8; 0].as_slice(), &mut out).is_ok());
        assert!(matches!(frame_len(&[0x80], 10), Ok(None)));
        assert!(matches!(frame_len(&[5], 4), Err(FrameError::Malformed(_))));
    }
}
