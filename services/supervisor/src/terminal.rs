//! ACP terminals (`terminal/*`), served only to agents configured with `terminal = true`.
//!
//! A command runs contained exactly like the agent (same `Spawner`: clean environment, own
//! process group and cgroup, bubblewrap when enabled, a lease, `WARDEN_TREE` marker), with its
//! working directory inside the root, and only once decided (`bridge.rs`: an ALLOW of an
//! `execute` tool call in the current turn that judged exactly this command and cwd, each ALLOW
//! opening one terminal, or a decision of its own). Output is kept as a tail bounded by the
//! request's `outputByteLimit` (and the turn's output bound).
//!
//! What one conversation's terminals hold is capped (`Terminals::reserve`, taken before the
//! command is decided): at most `limits.max_terminals` of them until each is released, and
//! their output tails together within `limits.terminal_output_bytes` — each terminal reserves
//! its whole tail bound up front and its buffer never grows past it, so the bound is on memory,
//! not only on what is shown. Must never: keep a released terminal's output, or grow a tail
//! past its reservation.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use warden_acp::{
    CreateTerminalRequest, RpcError, TerminalExitStatus, TerminalOutputResponse, TerminalRequest,
};

use warden_containment::beneath::RootDir;

use crate::shared::Shared;
use crate::turn::TurnCtx;

/// Where one conversation's terminals run: its id (the spawn label), its boundary as the sandbox
/// enforces it, and its root's directory fd (the only way a `cwd` is checked).
pub struct Target<'a> {
    pub context_id: &'a str,
    /// Whose terminal it is (its CPU group).
    pub principal: &'a str,
    pub boundary: warden_sandbox::Boundary,
    pub files: Option<&'a RootDir>,
}

/// What serving terminals needs from the supervisor (present only when the agent is configured
/// with `terminal = true`).
pub struct TerminalCtx {
    pub shared: Arc<Shared>,
    /// The agent's environment allowlist additions (its terminals get the same).
    pub agent_env: Vec<String>,
    pub network: warden_sandbox::Network,
}

/// Output kept when the request names no limit.
const DEFAULT_OUTPUT_LIMIT: usize = 1024 * 1024;

struct OutBuf {
    bytes: Vec<u8>,
    limit: usize,
    truncated: bool,
}

impl OutBuf {
    /// Keeps the last `limit` bytes. The buffer grows as a `Vec` does (doubling) but never past
    /// `limit`: its capacity is what the terminal reserved, never twice that.
    fn push(&mut self, b: &[u8]) {
        let keep = &b[b.len().saturating_sub(self.limit)..];
        if keep.len() < b.len() {
            self.truncated = true;
        }
        let over = (self.bytes.len() + keep.len()).saturating_sub(self.limit);
        if over > 0 {
            self.bytes.drain(..over);
            self.truncated = true;
        }
        let need = self.bytes.len() + keep.len();
        if need > self.bytes.capacity() {
            let target = need.max(self.bytes.capacity() * 2).min(self.limit);
            self.bytes.reserve_exact(target - self.bytes.len());
        }
        self.bytes.extend_from_slice(keep);
    }

    /// The tail as text, starting at a character boundary.
    fn text(&self) -> String {
        let mut start = 0;
        while start < self.bytes.len() && (self.bytes[start] & 0xC0) == 0x80 {
            start += 1;
        }
        String::from_utf8_lossy(&self.bytes[start..]).into_owned()
    }
}

struct Term {
    out: Mutex<OutBuf>,
    tree: tokio::sync::Mutex<Option<warden_sandbox::ProcessTree>>,
    exit: watch::Sender<Option<TerminalExitStatus>>,
    /// Its place among the conversation's terminals, given back at release.
    slot: Mutex<Option<Slot>>,
}

/// What one conversation's terminals hold at once: how many, and the output bytes reserved.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub terminals: usize,
    pub output_bytes: usize,
}

/// One terminal's share of its conversation's caps (`Terminals::reserve`): taken before its
/// command is decided, given back when it is released — or dropped with the request when the
/// command is refused or cannot start.
pub struct Slot {
    held: Arc<Mutex<Held>>,
    /// The tail this terminal may keep (its output buffer's bound).
    bytes: usize,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        h.terminals = h.terminals.saturating_sub(1);
        h.output_bytes = h.output_bytes.saturating_sub(self.bytes);
    }
}

/// The terminals of one conversation.
#[derive(Default)]
pub struct Terminals {
    map: Mutex<HashMap<String, Arc<Term>>>,
    next: AtomicU64,
    held: Arc<Mutex<Held>>,
}

/// `Terminals::reserve` on its counters (a function of its own so it is tested without a
/// daemon).
fn reserve_in(
    held: &Arc<Mutex<Held>>,
    bytes: usize,
    max_terminals: usize,
    max_bytes: usize,
) -> Result<Slot, RpcError> {
    let mut h = held.lock().unwrap_or_else(|p| p.into_inner());
    if h.terminals >= max_terminals {
        return Err(RpcError::internal(format!(
            "this conversation holds {} terminals, the most it may (limits.max_terminals): \
             release one (terminal/release) before creating another",
            h.terminals
        )));
    }
    if h.output_bytes.saturating_add(bytes) > max_bytes {
        return Err(RpcError::internal(format!(
            "this conversation's terminals hold {} bytes of output and this one would keep up to \
             {bytes} more, past {max_bytes} (limits.terminal_output_bytes): release a terminal, \
             or ask for a smaller outputByteLimit",
            h.output_bytes
        )));
    }
    h.terminals += 1;
    h.output_bytes += bytes;
    Ok(Slot {
        held: held.clone(),
        bytes,
    })
}

fn exit_status(s: Option<std::process::ExitStatus>) -> TerminalExitStatus {
    use std::os::unix::process::ExitStatusExt;
    match s {
        Some(s) => TerminalExitStatus {
            exit_code: s.code().map(|c| c as u32),
            signal: s.signal().map(|n| {
                nix::sys::signal::Signal::try_from(n)
                    .map(|sig| sig.as_str().to_string())
                    .unwrap_or_else(|_| n.to_string())
            }),
        },
        None => TerminalExitStatus {
            exit_code: None,
            signal: Some("SIGKILL".into()),
        },
    }
}

impl Terminals {
    /// What this conversation's terminals hold now.
    pub fn held(&self) -> Held {
        *self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a place for one more terminal of `req` within `limits.max_terminals` and
    /// `limits.terminal_output_bytes`, before anything is decided or run: a conversation at
    /// either cap is refused, naming the key, until it releases a terminal.
    pub fn reserve(
        &self,
        ctx: Option<&TerminalCtx>,
        req: &CreateTerminalRequest,
    ) -> Result<Slot, RpcError> {
        let Some(ctx) = ctx else {
            return Err(RpcError::method_not_found("terminal/create"));
        };
        let settings = ctx.shared.settings();
        let limits = settings.limits();
        let bytes = req
            .output_byte_limit
            .map(|l| usize::try_from(l).unwrap_or(usize::MAX))
            .unwrap_or(DEFAULT_OUTPUT_LIMIT)
            .min(limits.output_bytes);
        reserve_in(
            &self.held,
            bytes,
            limits.max_terminals,
            limits.terminal_output_bytes,
        )
    }

    fn get(&self, id: &str) -> Result<Arc<Term>, RpcError> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
            .ok_or_else(|| RpcError::not_found(format!("no terminal {id:?}")))
    }

    /// `terminal/create`.
    pub async fn create(
        &self,
        ctx: Option<&TerminalCtx>,
        turn: Option<Arc<TurnCtx>>,
        target: Target<'_>,
        slot: Slot,
        req: CreateTerminalRequest,
    ) -> Result<String, RpcError> {
        // Decided by the caller (`bridge.rs`: an ALLOW that judged exactly this command, or a
        // decision of its own); only ever within a turn.
        if turn.is_none() {
            return Err(RpcError::invalid_params("no turn is running"));
        }
        let Some(ctx) = ctx else {
            return Err(RpcError::method_not_found("terminal/create"));
        };
        let shared = &ctx.shared;
        let root = &target.boundary.root;
        let cwd = match &req.cwd {
            Some(c) => {
                let p = Path::new(c);
                // The kernel walks it beneath the root's fd: a directory there now, reached
                // without leaving the root (the spawn resolves it again and refuses an escape).
                let inside = p.is_absolute() && target.files.is_some_and(|f| f.open_dir(p).is_ok());
                if !inside {
                    return Err(RpcError::invalid_params(
                        "cwd is outside the session boundary (or not a directory there)",
                    ));
                }
                p.to_path_buf()
            }
            None => root.clone(),
        };
        let names: Vec<String> = req.env.iter().map(|e| e.name.clone()).collect();
        let policy = warden_sandbox::EnvPolicy::new(
            ctx.agent_env.iter().cloned().chain(names),
            &shared.settings().file.sandbox.env_extra,
        )
        .map_err(|e| RpcError::invalid_params(e.to_string()))?;
        let env = policy.build_from(
            std::env::vars_os().chain(
                req.env
                    .iter()
                    .map(|e| (e.name.clone().into(), e.value.clone().into())),
            ),
        );
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let id = format!("term-{n}");
        let boundary = target.boundary.clone();
        let mut spec = warden_sandbox::SpawnSpec::new(
            format!("{}~{id}", target.context_id),
            req.command.clone(),
            boundary,
            env,
            shared.depth,
        );
        spec.args = req.args.iter().map(Into::into).collect();
        spec.cwd = Some(cwd);
        spec.cpu_group = shared.cpu_group(target.principal);
        spec.network = ctx.network;
        // The program, arguments, cwd and environment are the agent's: the spawn finds the
        // program inside the sandbox and keeps every host-side process on its fixed
        // environment (crates/sandbox spawn.rs `host_command`).
        spec.agent_supplied = true;
        let spawned = shared
            .spawner
            .spawn(spec)
            .map_err(|e| RpcError::internal(format!("cannot start the command: {e}")))?;
        let mut tree = spawned.tree;
        drop(tree.take_stdin());
        // The tail it keeps is what it reserved (`reserve`).
        let limit = slot.bytes;
        let (exit_tx, _) = watch::channel(None);
        let term = Arc::new(Term {
            out: Mutex::new(OutBuf {
                bytes: Vec::new(),
                limit,
                truncated: false,
            }),
            tree: tokio::sync::Mutex::new(Some(tree)),
            exit: exit_tx,
            slot: Mutex::new(Some(slot)),
        });
        for mut r in [
            Box::new(spawned.stdout) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
            Box::new(spawned.stderr),
        ] {
            let t = term.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                while let Ok(n) = r.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut o) = t.out.lock() {
                        o.push(&buf[..n]);
                    }
                }
            });
        }
        // The watcher reaps the command when it exits (killing whatever it left behind).
        let t = term.clone();
        let grace = shared.settings().limits().kill_grace();
        tokio::spawn(async move {
            loop {
                let exited = {
                    let g = t.tree.lock().await;
                    match g.as_ref() {
                        Some(tr) => tr.leader_exited(),
                        None => return,
                    }
                };
                if exited {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let mut g = t.tree.lock().await;
            if let Some(mut tr) = g.take() {
                let r = tr
                    .kill(warden_sandbox::KillOptions::with_grace(grace))
                    .await;
                let status = r.ok().and_then(|r| r.leader_status);
                // Let the readers drain what the command wrote last.
                tokio::time::sleep(Duration::from_millis(20)).await;
                t.exit.send_replace(Some(exit_status(status)));
            }
        });
        tracing::info!(context_id = %target.context_id, terminal_id = %id, "terminal started");
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), term);
        Ok(id)
    }

    pub fn output(&self, req: &TerminalRequest) -> Result<TerminalOutputResponse, RpcError> {
        let t = self.get(&req.terminal_id)?;
        let (output, truncated) = t
            .out
            .lock()
            .map(|o| (o.text(), o.truncated))
            .unwrap_or_default();
        Ok(TerminalOutputResponse {
            output,
            truncated,
            exit_status: t.exit.borrow().clone(),
        })
    }

    pub async fn wait(&self, req: &TerminalRequest) -> Result<TerminalExitStatus, RpcError> {
        let t = self.get(&req.terminal_id)?;
        let mut rx = t.exit.subscribe();
        loop {
            if let Some(s) = rx.borrow_and_update().clone() {
                return Ok(s);
            }
            if rx.changed().await.is_err() {
                return Err(RpcError::internal("terminal went away"));
            }
        }
    }

    /// Kills the command's tree; the id stays valid.
    pub async fn kill(&self, id: &str, grace: Duration) -> Result<(), RpcError> {
        let t = self.get(id)?;
        let mut g = t.tree.lock().await;
        if let Some(mut tr) = g.take() {
            let r = tr
                .kill(warden_sandbox::KillOptions::with_grace(grace))
                .await;
            t.exit
                .send_replace(Some(exit_status(r.ok().and_then(|r| r.leader_status))));
        }
        Ok(())
    }

    /// Kills (if running) and forgets: its output is dropped and its place given back now (its
    /// readers may hold the `Term` a moment longer, never the bytes).
    pub async fn release(&self, id: &str, grace: Duration) -> Result<(), RpcError> {
        self.kill(id, grace).await?;
        let gone = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some(t) = gone {
            if let Ok(mut o) = t.out.lock() {
                o.bytes = Vec::new();
                o.limit = 0;
            }
            drop(t.slot.lock().ok().and_then(|mut s| s.take()));
        }
        Ok(())
    }

    /// Kills every terminal (the agent is being stopped).
    pub async fn kill_all(&self, grace: Duration) {
        let ids: Vec<String> = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        for id in ids {
            let _ = self.release(&id, grace).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_never_holds_more_than_its_bound_not_even_in_capacity() {
        let mut o = OutBuf {
            bytes: Vec::new(),
            limit: 100_000,
            truncated: false,
        };
        for _ in 0..200 {
            o.push(&[b'x'; 8192]);
            assert!(o.bytes.len() <= 100_000);
            assert!(o.bytes.capacity() <= 100_000, "{}", o.bytes.capacity());
        }
        assert!(o.truncated);
        assert_eq!(o.bytes.len(), 100_000);
        // One write larger than the bound keeps its tail.
        let mut o = OutBuf {
            bytes: Vec::new(),
            limit: 4,
            truncated: false,
        };
        o.push(b"abcdefgh");
        assert_eq!(o.text(), "efgh");
        assert!(o.truncated);
    }

    #[test]
    fn slots_count_terminals_and_bytes_and_come_back_when_dropped() {
        let held = Arc::new(Mutex::new(Held::default()));
        let a = reserve_in(&held, 1000, 2, 1500).unwrap();
        let e = reserve_in(&held, 600, 2, 1500).err().unwrap();
        assert!(e.message.contains("limits.terminal_output_bytes"), "{e:?}");
        let b = reserve_in(&held, 500, 2, 1500).unwrap();
        let e = reserve_in(&held, 0, 2, 1500).err().unwrap();
        assert!(e.message.contains("limits.max_terminals"), "{e:?}");
        assert_eq!(
            *held.lock().unwrap(),
            Held {
                terminals: 2,
                output_bytes: 1500
            }
        );
        drop(a);
        assert_eq!(
            *held.lock().unwrap(),
            Held {
                terminals: 1,
                output_bytes: 500
            }
        );
        let _c = reserve_in(&held, 1000, 2, 1500).unwrap();
        drop(b);
        assert_eq!(held.lock().unwrap().terminals, 1);
    }
}
