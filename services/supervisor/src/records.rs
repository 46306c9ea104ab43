//! Records under the state directory (seed 004): one bounded transcript per turn, sanitized
//! incident records for every fault, one health line per finished turn, and one bounded file of
//! egress connections per conversation (`egress/<context>.jsonl`, agents with `network =
//! "proxy"`).
//!
//! Incident records never hold argv or environment: only the fault class, reason, agent, verb,
//! profile, budget and transcript path. The health file and every record refuse symlinks and
//! hard links: new files are created with `O_EXCL | O_NOFOLLOW`, and the append-only health file
//! is opened with `O_NOFOLLOW | O_NONBLOCK` and must be a regular file with a single link.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot create {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing {path}: {why}")]
    Refused { path: PathBuf, why: &'static str },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A caller-chosen string made safe for a file name: ASCII letters, digits, `-`, `_`, at most
/// 32 characters; everything else becomes `_`. Never empty.
pub fn label(s: &str) -> String {
    let l: String = s
        .chars()
        .take(32)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if l.is_empty() { "_".into() } else { l }
}

fn ensure_dir(p: &Path) -> Result<(), RecordError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(p)
        .map_err(|source| RecordError::Create {
            path: p.to_path_buf(),
            source,
        })?;
    let meta = std::fs::symlink_metadata(p).map_err(|source| RecordError::Create {
        path: p.to_path_buf(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(RecordError::Refused {
            path: p.to_path_buf(),
            why: "not a directory (a symlink?)",
        });
    }
    Ok(())
}

/// Creates a new file; an existing name (file, symlink, hard link) is refused.
fn create_new(path: &Path) -> Result<File, RecordError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| RecordError::Create {
            path: path.to_path_buf(),
            source,
        })
}

/// Where records go.
#[derive(Debug, Clone)]
pub struct Records {
    root: PathBuf,
    transcript_limit: usize,
}

impl Records {
    /// Makes `<state>/transcripts` and `<state>/incidents`.
    pub fn new(state_dir: &Path, transcript_limit: usize) -> Result<Self, RecordError> {
        ensure_dir(&state_dir.join("transcripts"))?;
        ensure_dir(&state_dir.join("incidents"))?;
        // The agents' egress sockets live below: searchable (never listable) for the agent
        // uid, which bubblewrap binds them as.
        let egress = state_dir.join("egress");
        ensure_dir(&egress)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&egress, std::fs::Permissions::from_mode(0o711)).map_err(
                |source| RecordError::Create {
                    path: egress.clone(),
                    source,
                },
            )?;
        }
        // Socket directories of a previous run's agents (each proxy removes its own when it
        // stops; a crash leaves them). Only directories: the records stay.
        for e in std::fs::read_dir(&egress).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        Ok(Records {
            root: state_dir.to_path_buf(),
            transcript_limit,
        })
    }

    pub fn health_path(&self) -> PathBuf {
        self.root.join("health.jsonl")
    }

    pub fn incidents_dir(&self) -> PathBuf {
        self.root.join("incidents")
    }

    /// A new transcript for one turn of the conversation labelled `context`.
    pub fn transcript(&self, context: &str, turn: &str) -> Result<Transcript, RecordError> {
        let dir = self.root.join("transcripts").join(label(context));
        ensure_dir(&dir)?;
        let name = format!(
            "{}-{}-{}.jsonl",
            now_ms(),
            label(turn),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let path = dir.join(name);
        let file = create_new(&path)?;
        Ok(Transcript {
            path,
            out: Some(BufWriter::new(file)),
            written: 0,
            limit: self.transcript_limit,
            truncated: false,
        })
    }

    /// Writes one incident record; returns its path.
    pub fn incident(&self, inc: &Incident) -> Result<PathBuf, RecordError> {
        let path = self.incidents_dir().join(format!(
            "{}-{}-{}.json",
            inc.at_unix_ms,
            label(&inc.class),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        let mut f = create_new(&path)?;
        let text = serde_json::to_vec_pretty(inc).unwrap_or_default();
        f.write_all(&text)
            .and_then(|_| f.write_all(b"\n"))
            .map_err(|source| RecordError::Write {
                path: path.clone(),
                source,
            })?;
        Ok(path)
    }

    /// Where a conversation's egress connections are recorded.
    pub fn egress_path(&self, context: &str) -> PathBuf {
        self.root
            .join("egress")
            .join(format!("{}.jsonl", label(context)))
    }

    /// Appends one connection to the conversation's egress record (same refusals as the health
    /// file). Past [`EGRESS_RECORD_BYTES`] one `truncated` line is written and later ones are
    /// dropped (the daemon log still has each).
    pub fn egress(&self, context: &str, rec: &EgressRecord) -> Result<(), RecordError> {
        let path = self.egress_path(context);
        let mut f = open_append(&path)?;
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len >= EGRESS_RECORD_BYTES {
            return Ok(());
        }
        let mut line = serde_json::to_vec(rec).unwrap_or_default();
        if len + line.len() as u64 + 1 >= EGRESS_RECORD_BYTES {
            line = br#"{"truncated":true}"#.to_vec();
        }
        line.push(b'\n');
        f.write_all(&line)
            .map_err(|source| RecordError::Write { path, source })
    }

    /// Appends one line to `health.jsonl`, refusing a symlink, a FIFO or any non-regular file,
    /// and a file with more than one link.
    pub fn health(&self, h: &Health) -> Result<(), RecordError> {
        let path = self.health_path();
        let mut f = open_append(&path)?;
        let mut line = serde_json::to_vec(h).unwrap_or_default();
        line.push(b'\n');
        f.write_all(&line)
            .map_err(|source| RecordError::Write { path, source })
    }
}

/// The most one conversation's egress record holds.
pub const EGRESS_RECORD_BYTES: u64 = 1024 * 1024;

/// One connection through an agent's egress proxy.
#[derive(Debug, Clone, Serialize)]
pub struct EgressRecord {
    pub at_unix_ms: u64,
    pub context_id: String,
    /// The turn running when the connection was made ("" between turns).
    pub task_id: String,
    pub agent: String,
    /// "connect" (a tunnel), "connect-mirrored" (a tunnel the relay opened for a connection the
    /// agent made to a mirrored loopback address; the relay's mark, informational), "forward"
    /// (plain HTTP), "invalid" (no destination could be read).
    pub kind: &'static str,
    pub host: String,
    pub port: u16,
    /// The checked address connected to; for a refusal of what the name resolved to, every
    /// address it resolved to (comma-separated); "" when refused before resolving.
    pub address: String,
    pub allowed: bool,
    /// The status answered to the agent (200 for an open tunnel, 403 refused, ...).
    pub status: u16,
    /// Why it was refused or failed ("" when allowed and it worked).
    pub reason: String,
    /// The allowlist setting that let it through, or that would have to.
    pub setting: String,
    /// Bytes from the agent to the destination and back.
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
}

/// Opens an append-only record file, refusing a symlink, a FIFO or any non-regular file, and a
/// file with more than one link.
fn open_append(path: &Path) -> Result<File, RecordError> {
    let path = path.to_path_buf();
    let f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        // NONBLOCK: a FIFO planted in its place cannot stall the open.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|source| {
            if source.raw_os_error() == Some(libc::ELOOP) {
                RecordError::Refused {
                    path: path.clone(),
                    why: "it is a symlink",
                }
            } else {
                RecordError::Create {
                    path: path.clone(),
                    source,
                }
            }
        })?;
    let meta = f.metadata().map_err(|source| RecordError::Write {
        path: path.clone(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(RecordError::Refused {
            path,
            why: "not a regular file",
        });
    }
    if meta.nlink() != 1 {
        return Err(RecordError::Refused {
            path,
            why: "it has more than one link",
        });
    }
    Ok(f)
}

/// One turn's transcript: JSON lines, bounded; past the bound one `truncated` line is written
/// and the rest is dropped.
pub struct Transcript {
    path: PathBuf,
    out: Option<BufWriter<File>>,
    written: usize,
    limit: usize,
    truncated: bool,
}

/// Room kept for the final truncation marker.
const WRAPPER_RESERVE: usize = 128;

impl Transcript {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// Appends `{"t":ms,"kind":kind,"data":data}`.
    pub fn record(&mut self, kind: &str, data: &serde_json::Value) {
        if self.truncated {
            return;
        }
        let Some(out) = self.out.as_mut() else {
            return;
        };
        // Serialized from borrowed parts: no copy of `data` into an intermediate tree.
        #[derive(Serialize)]
        struct Line<'a> {
            t: u64,
            kind: &'a str,
            data: &'a serde_json::Value,
        }
        let mut bytes = Vec::with_capacity(256);
        if serde_json::to_writer(
            &mut bytes,
            &Line {
                t: now_ms(),
                kind,
                data,
            },
        )
        .is_err()
        {
            return;
        }
        bytes.push(b'\n');
        if self.written + bytes.len() + WRAPPER_RESERVE > self.limit {
            self.truncated = true;
            let marker = format!(
                "{{\"t\":{},\"kind\":\"truncated\",\"data\":{{\"limit\":{}}}}}\n",
                now_ms(),
                self.limit
            );
            let _ = out.write_all(marker.as_bytes());
            self.written += marker.len();
            return;
        }
        if out.write_all(&bytes).is_err() {
            self.out = None;
            return;
        }
        self.written += bytes.len();
    }

    pub fn finish(&mut self) {
        if let Some(mut out) = self.out.take() {
            let _ = out.flush();
        }
    }
}

impl Drop for Transcript {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A sanitized fault record. No argv, no environment, no task text.
#[derive(Debug, Clone, Serialize)]
pub struct Incident {
    pub class: String,
    pub reason: String,
    /// A start-up failure's last 4 KiB of the agent's stderr, values of secret-looking
    /// environment variables masked (why the agent would not start, in its own words).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub stderr_tail: String,
    pub agent: String,
    pub verb: String,
    pub profile: String,
    pub budget_secs: u64,
    pub transcript_path: String,
    pub context_label: String,
    pub turn_label: String,
    pub at_unix_ms: u64,
}

/// One finished turn.
#[derive(Debug, Clone, Serialize)]
pub struct Health {
    pub at_unix_ms: u64,
    pub agent: String,
    pub verb: String,
    pub profile: String,
    pub duration_ms: u64,
    pub stop_reason: String,
    pub fault: Option<String>,
    pub refusals: usize,
    pub permissions: usize,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> Health {
        Health {
            at_unix_ms: 1,
            agent: "a".into(),
            verb: "task".into(),
            profile: "read-only".into(),
            duration_ms: 2,
            stop_reason: "end_turn".into(),
            fault: None,
            refusals: 0,
            permissions: 0,
            input_tokens: 0,
            output_tokens: 0,
            total_tokens: 0,
        }
    }

    #[test]
    fn labels_are_safe() {
        assert_eq!(label("../../etc"), "______etc");
        assert_eq!(label(""), "_");
        assert_eq!(label("ctx-1_a"), "ctx-1_a");
        assert_eq!(label(&"x".repeat(100)).len(), 32);
    }

    #[test]
    fn health_refuses_symlink_and_hard_link() {
        let d = tempfile::tempdir().unwrap();
        let r = Records::new(d.path(), 1024).unwrap();
        r.health(&health()).unwrap();
        r.health(&health()).unwrap();
        let text = std::fs::read_to_string(r.health_path()).unwrap();
        assert_eq!(text.lines().count(), 2);

        // A hard link to the health file elsewhere: refused, target untouched.
        let other = d.path().join("elsewhere");
        std::fs::hard_link(r.health_path(), &other).unwrap();
        assert!(matches!(
            r.health(&health()),
            Err(RecordError::Refused { .. })
        ));
        assert_eq!(std::fs::read_to_string(&other).unwrap().lines().count(), 2);

        // A symlink in its place: refused, target untouched.
        std::fs::remove_file(r.health_path()).unwrap();
        let target = d.path().join("target");
        std::fs::write(&target, "keep\n").unwrap();
        std::os::unix::fs::symlink(&target, r.health_path()).unwrap();
        assert!(matches!(
            r.health(&health()),
            Err(RecordError::Refused { .. })
        ));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep\n");
    }

    #[test]
    fn health_refuses_a_fifo_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let r = Records::new(d.path(), 1024).unwrap();
        nix::unistd::mkfifo(&r.health_path(), nix::sys::stat::Mode::S_IRWXU).unwrap();
        // O_WRONLY|O_NONBLOCK on a FIFO without a reader fails (ENXIO) rather than blocking.
        assert!(r.health(&health()).is_err());
    }

    #[test]
    fn transcript_is_bounded() {
        let d = tempfile::tempdir().unwrap();
        let r = Records::new(d.path(), 1024).unwrap();
        let mut t = r.transcript("../ctx", "turn/1").unwrap();
        assert!(t.path().starts_with(d.path().join("transcripts")));
        for i in 0..200 {
            t.record("chunk", &serde_json::json!({"i": i, "text": "hello world"}));
        }
        t.finish();
        assert!(t.truncated());
        let len = std::fs::metadata(t.path()).unwrap().len();
        assert!(len <= 1024, "{len}");
        let text = std::fs::read_to_string(t.path()).unwrap();
        assert!(text.lines().last().unwrap().contains("truncated"));
    }

    #[test]
    fn incidents_hold_only_sanitized_fields() {
        let d = tempfile::tempdir().unwrap();
        let r = Records::new(d.path(), 1024).unwrap();
        let p = r
            .incident(&Incident {
                class: "timeout".into(),
                reason: "hard cutoff".into(),
                stderr_tail: String::new(),
                agent: "scripted".into(),
                verb: "task".into(),
                profile: "read-only".into(),
                budget_secs: 1,
                transcript_path: "/x".into(),
                context_label: label("c"),
                turn_label: label("t"),
                at_unix_ms: 5,
            })
            .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert!(!keys.iter().any(|k| k.contains("arg") || k.contains("env")));
    }
}
