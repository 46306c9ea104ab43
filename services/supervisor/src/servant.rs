//! The supervisor's end of a conversation's fs servant (`warden-fs-servant`): the process that
//! carries out a decided `fs/read_text_file` or `fs/write_text_file` inside the agent's own
//! sandbox, with the agent's rights.
//!
//! The servant is started at the conversation's first `fs/*` request through the same
//! `Spawner` as the agent and its terminals (spawn id `<context>~fs`: the conversation's uid, a
//! clean environment, its own process group and cgroup, bubblewrap with the root bound at its
//! own path and its agent-control paths read-only, no network, every capability dropped), and
//! lives until the conversation's agent is stopped. It is handed the location the decision
//! judged (the resolved path) and opens it without following any symbolic link.
//!
//! It shares the agent's uid, so the agent can kill it, ptrace it or speak in its place: every
//! answer is bounded (a read's text by its `max_bytes`), checked (the answer must be the one the
//! request calls for) and timed ([`ANSWER_TIMEOUT`]); a servant that dies, lies about the frame
//! or is late is killed and the request fails — the next request starts a new one.
//!
//! Must never: open an agent's file itself, hang a request on a servant that does not answer,
//! or trust a byte the servant sends beyond its bound.

use std::path::Path;
#[cfg(test)]
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use warden_containment::beneath::ReadSpec;
use warden_fs_servant::wire::{self, FailureKind, Request, Response, request, response};

use crate::shared::Shared;

/// The longest one request may wait for the servant's answer (writing the request included).
/// A local read or write of a bounded file: seconds only when the host is starved or the
/// servant is stopped (by the agent, which shares its uid).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Room for the frame's own fields around a read's text.
const FRAME_OVERHEAD: usize = 1024;

/// Why a request was not carried out.
#[derive(Debug, thiserror::Error)]
pub enum ServantError {
    /// The servant refused it: the agent's own rights, a link in the path, a missing file...
    #[error("{path}: {kind:?}")]
    Refused { kind: FailureKind, path: String },
    /// No servant could carry it out (it could not start, died, answered out of step or late).
    #[error("the fs servant {0}")]
    Unavailable(String),
}

/// How a servant is started.
enum Launch {
    /// Through the daemon's spawner, inside the conversation's sandbox.
    Spawn {
        shared: Arc<Shared>,
        context_id: String,
        boundary: warden_sandbox::Boundary,
    },
    /// The servant's own serving loop on a thread of this process (unit tests of the handler,
    /// which have no spawner): the same code, without the sandbox.
    #[cfg(test)]
    InProcess { root: PathBuf },
}

struct Running {
    /// `None` for an in-process servant.
    tree: Option<warden_sandbox::ProcessTree>,
    tx: Box<dyn AsyncWrite + Send + Unpin>,
    rx: BufReader<Box<dyn AsyncRead + Send + Unpin>>,
}

/// One conversation's servant, started on first use, one request at a time.
pub struct Servant {
    launch: Launch,
    running: tokio::sync::Mutex<Option<Running>>,
    grace: Duration,
}

impl Servant {
    /// A servant for `context_id`'s conversation, spawned contained in `boundary` when first
    /// needed.
    pub fn spawned(
        shared: Arc<Shared>,
        context_id: String,
        boundary: warden_sandbox::Boundary,
    ) -> Self {
        let grace = shared.settings().limits().kill_grace();
        Self {
            launch: Launch::Spawn {
                shared,
                context_id,
                boundary,
            },
            running: tokio::sync::Mutex::new(None),
            grace,
        }
    }

    #[cfg(test)]
    pub fn in_process(root: &Path) -> Self {
        Self {
            launch: Launch::InProcess {
                root: root.to_path_buf(),
            },
            running: tokio::sync::Mutex::new(None),
            grace: Duration::from_millis(100),
        }
    }

    /// Reads the text of `path` (a resolved location inside the root), at most
    /// `spec.max_bytes` of it.
    pub async fn read(&self, path: &Path, spec: ReadSpec) -> Result<String, ServantError> {
        let req = Request {
            op: Some(request::Op::Read(wire::Read {
                path: path.to_string_lossy().into_owned(),
                line: spec.line,
                limit: spec.limit,
                max_bytes: spec.max_bytes,
            })),
        };
        let max = usize::try_from(spec.max_bytes)
            .unwrap_or(usize::MAX)
            .saturating_add(FRAME_OVERHEAD);
        match self.call(req, max, path).await? {
            response::Result::Text(t) if t.len() as u64 <= spec.max_bytes => Ok(t),
            other => Err(self.out_of_step(&other).await),
        }
    }

    /// Writes `content` to `path` (a resolved location inside the root).
    pub async fn write(&self, path: &Path, content: &[u8]) -> Result<(), ServantError> {
        let req = Request {
            op: Some(request::Op::Write(wire::Write {
                path: path.to_string_lossy().into_owned(),
                content: content.to_vec(),
            })),
        };
        match self.call(req, FRAME_OVERHEAD, path).await? {
            response::Result::Written(_) => Ok(()),
            other => Err(self.out_of_step(&other).await),
        }
    }

    /// Stops the servant (the conversation's agent is being stopped); a later request starts
    /// a new one.
    pub async fn stop(&self) {
        let taken = self.running.lock().await.take();
        if let Some(r) = taken {
            self.kill(r).await;
        }
    }

    /// An answer that is not the one the request calls for: the servant is not to be believed
    /// any more.
    async fn out_of_step(&self, got: &response::Result) -> ServantError {
        let what = match got {
            response::Result::Text(_) => "a text",
            response::Result::Written(_) => "a write",
            response::Result::Failure(_) => "a failure",
        };
        self.stop().await;
        ServantError::Unavailable(format!(
            "answered out of step ({what} that does not fit the request)"
        ))
    }

    /// Sends one request and reads its answer, starting the servant if none runs. A failure of
    /// the exchange kills the servant.
    async fn call(
        &self,
        req: Request,
        max_answer: usize,
        path: &Path,
    ) -> Result<response::Result, ServantError> {
        let mut slot = self.running.lock().await;
        if slot.is_none() {
            *slot = Some(self.start()?);
        }
        let Some(running) = slot.as_mut() else {
            return Err(ServantError::Unavailable("did not start".into()));
        };
        let frame = req.encode_length_delimited_to_vec();
        let answered =
            tokio::time::timeout(ANSWER_TIMEOUT, exchange(running, &frame, max_answer)).await;
        let answer = match answered {
            Ok(Ok(a)) => a,
            Ok(Err(why)) => {
                if let Some(r) = slot.take() {
                    self.kill(r).await;
                }
                return Err(ServantError::Unavailable(why));
            }
            Err(_) => {
                if let Some(r) = slot.take() {
                    self.kill(r).await;
                }
                return Err(ServantError::Unavailable(format!(
                    "did not answer within {} s",
                    ANSWER_TIMEOUT.as_secs()
                )));
            }
        };
        drop(slot);
        match answer.result {
            Some(response::Result::Failure(f)) => Err(ServantError::Refused {
                kind: FailureKind::try_from(f.kind).unwrap_or(FailureKind::Unspecified),
                path: path.display().to_string(),
            }),
            Some(r) => Ok(r),
            None => Err(ServantError::Refused {
                kind: FailureKind::Unspecified,
                path: path.display().to_string(),
            }),
        }
    }

    fn start(&self) -> Result<Running, ServantError> {
        match &self.launch {
            Launch::Spawn {
                shared,
                context_id,
                boundary,
            } => spawn(shared, context_id, boundary),
            #[cfg(test)]
            Launch::InProcess { root } => in_process(root),
        }
    }

    async fn kill(&self, r: Running) {
        drop(r.tx);
        if let Some(mut tree) = r.tree {
            let _ = tree
                .kill(warden_sandbox::KillOptions::with_grace(self.grace))
                .await;
        }
    }
}

/// Writes `frame` and reads one answer of at most `max` bytes.
async fn exchange(r: &mut Running, frame: &[u8], max: usize) -> Result<Response, String> {
    r.tx.write_all(frame)
        .await
        .map_err(|e| format!("is gone ({e})"))?;
    r.tx.flush().await.map_err(|e| format!("is gone ({e})"))?;
    let mut prefix = Vec::with_capacity(10);
    let len = loop {
        let b = r.rx.read_u8().await.map_err(|e| format!("is gone ({e})"))?;
        prefix.push(b);
        match warden_fs_servant::frame_len(&prefix, max) {
            Ok(Some(len)) => break len,
            Ok(None) => {}
            Err(e) => return Err(format!("answered out of bounds ({e:?})")),
        }
    };
    let mut body = vec![0u8; len];
    r.rx.read_exact(&mut body)
        .await
        .map_err(|e| format!("is gone mid-answer ({e})"))?;
    Response::decode(body.as_slice()).map_err(|e| format!("answered garbage ({e})"))
}

/// Starts the servant through the daemon's spawner, exactly as contained as the agent.
fn spawn(
    shared: &Shared,
    context_id: &str,
    boundary: &warden_sandbox::Boundary,
) -> Result<Running, ServantError> {
    let program = crate::config::shipped_binary("warden-fs-servant")
        .map_err(|e| ServantError::Unavailable(format!("cannot start: {e}")))?;
    let env = warden_sandbox::EnvPolicy::new([""; 0], [""; 0])
        .map_err(|e| ServantError::Unavailable(format!("cannot start: {e}")))?
        .build_from(std::iter::empty::<(std::ffi::OsString, std::ffi::OsString)>());
    let mut spec = warden_sandbox::SpawnSpec::new(
        format!("{context_id}~fs"),
        program,
        boundary.clone(),
        env,
        shared.depth,
    );
    spec.args = vec!["--root".into(), boundary.root.clone().into_os_string()];
    spec.network = warden_sandbox::Network::None;
    let spawned = shared
        .spawner
        .spawn(spec)
        .map_err(|e| ServantError::Unavailable(format!("cannot start: {e}")))?;
    let mut tree = spawned.tree;
    let stdin = tree
        .take_stdin()
        .ok_or_else(|| ServantError::Unavailable("has no stdin".into()))?;
    // What it says on stderr is the agent's to write too: read and dropped, never kept.
    let mut stderr = spawned.stderr;
    tokio::spawn(async move {
        let mut sink = [0u8; 4096];
        while matches!(stderr.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    tracing::info!(
        context_id,
        bwrap = spawned.containment.bwrap,
        "fs servant started"
    );
    Ok(Running {
        tree: Some(tree),
        tx: Box::new(stdin),
        rx: BufReader::new(Box::new(spawned.stdout)),
    })
}

#[cfg(test)]
fn in_process(root: &Path) -> Result<Running, ServantError> {
    let dir = warden_containment::beneath::RootDir::open(root)
        .map_err(|e| ServantError::Unavailable(e.to_string()))?
        .no_symlinks();
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| ServantError::Unavailable(e.to_string()))?;
    std::thread::spawn(move || {
        let Ok(mut input) = theirs.try_clone() else {
            return;
        };
        let mut output = theirs;
        let _ = warden_fs_servant::serve(&dir, &mut input, &mut output);
    });
    ours.set_nonblocking(true)
        .map_err(|e| ServantError::Unavailable(e.to_string()))?;
    let ours = tokio::net::UnixStream::from_std(ours)
        .map_err(|e| ServantError::Unavailable(e.to_string()))?;
    let (rx, tx) = ours.into_split();
    Ok(Running {
        tree: None,
        tx: Box::new(tx),
        rx: BufReader::new(Box::new(rx)),
    })
}
