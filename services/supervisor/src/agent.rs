//! One running agent: the contained process tree, its ACP connection and event receiver, and a
//! bounded ring of its stderr.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;
use warden_acp::{AcpClient, ClientCapabilities, ClientConfig, FsCapabilities};

use tokio::process::{ChildStderr, ChildStdin, ChildStdout};

mod egress_report;
mod stderr;

use egress_report::*;
pub use stderr::StderrRing;
use stderr::*;

use crate::bridge::Binding;
use crate::config::{AgentConfig, Network};
use crate::core::ConvCore;
use crate::shared::Shared;

/// Why an agent could not be started. Every variant but `Capacity` is a `startup` fault.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No live-agent slot: every live agent is busy (not the agent's fault, nothing started).
    #[error(transparent)]
    Capacity(#[from] crate::live::Full),
    /// Another resource a start needs is held by others (a start slot the turn gave up waiting
    /// for, every uid of `sandbox.agent_uid_range`): fault `capacity`, nothing started.
    #[error("{0}")]
    NoRoom(String),
    #[error("cannot start the agent: {0}")]
    Spawn(String),
    #[error("the agent did not answer {0} within the handshake deadline")]
    Handshake(String),
    #[error("the agent broke the protocol during start-up: {0}")]
    Protocol(String),
    #[error("supervised mode unavailable: {0}")]
    Mode(String),
    /// The caller asked for a model or effort the agent does not offer (not the agent's fault).
    #[error("{0}")]
    OptionNotOffered(String),
    /// A start-up failure after the agent ran, with what it said on stderr (secrets masked):
    /// the only clue an operator gets to a wrong path, a missing package or a refused login.
    #[error(
        "{error}\nthe agent's stderr (last {STDERR_TAIL_BYTES} bytes, secrets masked):\n{tail}"
    )]
    WithStderr {
        error: Box<StartError>,
        tail: String,
    },
}

/// How much of the agent's stderr a start-up fault carries (incident, log, the caller's message).
pub const STDERR_TAIL_BYTES: usize = 4096;

/// Environment names whose values are masked wherever the agent's stderr is shown.
const SECRET_WORDS: [&str; 4] = ["KEY", "TOKEN", "SECRET", "PASSWORD"];

/// Whether an environment variable's name says its value is a secret.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_WORDS.iter().any(|w| upper.contains(w))
}

impl StartError {
    pub fn class(&self) -> warden_proto::v1::FaultClass {
        match self {
            StartError::Capacity(_) | StartError::NoRoom(_) => {
                warden_proto::v1::FaultClass::Capacity
            }
            StartError::OptionNotOffered(_) => warden_proto::v1::FaultClass::OptionNotOffered,
            StartError::WithStderr { error, .. } => error.class(),
            _ => warden_proto::v1::FaultClass::Startup,
        }
    }

    /// The agent's stderr tail this error carries (empty when it has none).
    pub fn stderr_tail(&self) -> &str {
        match self {
            StartError::WithStderr { tail, .. } => tail,
            _ => "",
        }
    }

    /// The error without the stderr tail (short enough for a gRPC status header).
    pub fn headline(&self) -> String {
        match self {
            StartError::WithStderr { error, .. } => error.to_string(),
            e => e.to_string(),
        }
    }
}

pub struct AgentProc {
    /// This agent's live-agent slot, given back when the agent is dropped (killed, stopped).
    pub slot: crate::live::LiveSlot,
    pub client: AcpClient,
    pub events: warden_acp::AcpEvents,
    pub tree: Option<warden_sandbox::ProcessTree>,
    pub stderr: Arc<Mutex<StderrRing>>,
    /// The task copying the agent's stderr into the ring; it ends at EOF (the tree is dead).
    stderr_reader: Option<tokio::task::JoinHandle<()>>,
    pub load_session: bool,
    /// The agent's egress proxy (`network = "proxy"`), closed with the agent.
    pub egress: Option<crate::egress::EgressProxy>,
}

/// Where an agent is spawned: the id its tree, lease and cgroup are named by (the
/// conversation's, or a warm agent's pool id), the configured agent's name, its boundary and its
/// own home.
pub struct Target<'a> {
    pub spawn_id: &'a str,
    pub agent: &'a str,
    /// Whose agent it is (its CPU group, `Shared::cpu_group`); none for a warm pool's agent,
    /// which belongs to nobody until it is adopted.
    pub principal: Option<&'a str>,
    pub boundary: warden_sandbox::Boundary,
    pub home: Option<&'a std::path::Path>,
}

/// The session an agent was given.
pub struct SessionStarted {
    pub session_id: String,
    /// The mode it is in (the supervised mode once forced).
    pub mode: String,
    /// A new session where an earlier one was asked for (context reset).
    pub reset: bool,
    /// The session's config options as the agent listed them (for the caller's model/effort).
    pub config_options: Option<serde_json::Value>,
}

/// `f` within the handshake deadline `hs`; None when it passed or `abort` was cancelled first
/// (a warm agent asked to make room, or the supervisor stopping).
async fn within<F: std::future::Future>(
    hs: std::time::Duration,
    abort: Option<&CancellationToken>,
    f: F,
) -> Option<F::Output> {
    let stop = async {
        match abort {
            Some(t) => t.cancelled().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = tokio::time::timeout(hs, f) => r.ok(),
        _ = stop => None,
    }
}

/// A live-agent slot for `context_id`'s agent, once a predecessor's leftovers are reaped: at
/// the limit a warm agent or an idle agent is stopped to make room (its kill takes up to the
/// kill grace).
pub async fn live_slot(
    shared: &Shared,
    context_id: &str,
    wait: SlotWait<'_>,
) -> Result<crate::live::LiveSlot, StartError> {
    let mut reaped = shared.reaped.clone();
    let _ = reaped.wait_for(|done| *done).await;
    let limits = shared.settings().limits().clone();
    Ok(match wait {
        SlotWait::Open => {
            let wait = limits.kill_grace() + std::time::Duration::from_secs(1);
            shared.live.acquire_now(context_id, wait).await?
        }
        SlotWait::Turn { turn, principal } => {
            shared
                .live
                .acquire_queued(
                    principal,
                    context_id,
                    limits.capacity_wait(),
                    &turn.end,
                    |position| {
                        tracing::info!(context_id, turn_id = %turn.id(), position, "every live agent is busy: the turn waits for one");
                        turn.emit(warden_proto::v1::turn_event::Event::Queued(
                            warden_proto::v1::TurnQueued {
                                position: u32::try_from(position).unwrap_or(u32::MAX),
                                admission: false,
                                agent: true,
                            },
                        ))
                    },
                )
                .await?
        }
    })
}

/// How a start waits for its live-agent slot.
pub enum SlotWait<'a> {
    /// A conversation's open: never queued (`LiveAgents::acquire_now`); with no agent free the
    /// conversation opens without one.
    Open,
    /// A turn's start: queued fairly, its place told on the turn's stream, at most
    /// `limits.capacity_wait_ms`, ended by the turn's cancel.
    Turn {
        turn: &'a crate::turn::TurnCtx,
        principal: &'a str,
    },
}

impl AgentProc {
    /// Spawns the agent contained, in `slot`, and runs `initialize` within the handshake
    /// deadline; an agent that does not answer is killed. Its requests go to `handler`, and so
    /// do its egress proxy's reports (`network = "proxy"`): to the conversation `handler` is
    /// bound to, once it is (a warm agent's, at the take).
    pub async fn start(
        shared: &Arc<Shared>,
        slot: crate::live::LiveSlot,
        target: Target<'_>,
        handler: Arc<Binding>,
        cfg: &AgentConfig,
        abort: Option<&CancellationToken>,
    ) -> Result<AgentProc, StartError> {
        let (tree, stdin, stdout, stderr, secrets, env_names, egress) =
            spawn(shared, &target, cfg, &handler)?;
        let target_id = target.spawn_id.to_string();
        let ring = Arc::new(Mutex::new(StderrRing {
            buf: VecDeque::new(),
            cap: shared.settings().limits().stderr_ring_bytes,
            secrets,
        }));
        let stderr_reader = stderr.map(|mut err| {
            let ring = ring.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = err.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut r) = ring.lock() {
                        r.push(&buf[..n]);
                    }
                }
            })
        });
        let config = ClientConfig {
            request_timeout: Some(shared.settings().limits().handshake()),
            cancel_deadline: shared.settings().limits().cancel_grace(),
            client_name: "warden-supervisor".into(),
            max_incoming_requests: shared.settings().limits().agent_requests_in_flight.max(1),
            max_queued_bytes: shared.settings().limits().agent_queue_bytes,
            max_incoming_bytes: shared.settings().limits().agent_requests_bytes,
            ..ClientConfig::default()
        };
        let (client, events) = AcpClient::connect(stdout, stdin, handler, config);
        let caps = ClientCapabilities {
            fs: FsCapabilities {
                read_text_file: cfg.fs,
                write_text_file: cfg.fs,
            },
            terminal: cfg.terminal,
            elicitation: true,
        };
        let hs = shared.settings().limits().handshake();
        let init = within(hs, abort, client.initialize(caps)).await.ok_or(());
        let mut p = AgentProc {
            slot,
            client,
            events,
            tree: Some(tree),
            stderr: ring,
            stderr_reader,
            load_session: false,
            egress,
        };
        match init {
            Ok(Ok(i)) => {
                p.load_session = i.agent_capabilities.load_session;
                // An adapter that takes its key from the environment (codex-acp: "Use
                // OPENAI_API_KEY") refuses `session/new` until told to use it.
                let Some(method) = i.env_auth_method(|n| env_names.iter().any(|e| e == n)) else {
                    return Ok(p);
                };
                match tokio::time::timeout(hs, p.client.authenticate(&method)).await {
                    Ok(Ok(())) => {
                        tracing::debug!(context_id = %target_id, method = %method, "authenticated from the environment");
                        Ok(p)
                    }
                    Ok(Err(e)) => Err(p
                        .fail(
                            shared,
                            StartError::Protocol(format!("authenticate {method:?}: {e}")),
                        )
                        .await),
                    Err(_) => Err(p
                        .fail(shared, StartError::Handshake("authenticate".into()))
                        .await),
                }
            }
            Ok(Err(e)) => Err(p
                .fail(shared, StartError::Protocol(format!("initialize: {e}")))
                .await),
            Err(_) => Err(p
                .fail(shared, StartError::Handshake("initialize".into()))
                .await),
        }
    }

    /// Gives the agent its session in `root`: `session/load` of `last` when `resume` and the
    /// agent supports it, else `session/new`; then forces `cfg.supervised_mode` (an agent that
    /// does not offer it fails closed). A failure kills the agent.
    pub async fn open_session(
        mut self,
        shared: &Shared,
        cfg: &AgentConfig,
        root: &std::path::Path,
        resume: bool,
        last: &str,
        abort: Option<&CancellationToken>,
    ) -> Result<(AgentProc, SessionStarted), StartError> {
        let p = &mut self;
        let hs = shared.settings().limits().handshake();
        let mut reset = resume;
        let mut modes = None;
        let mut config_options = None;
        let mut session_id = String::new();
        if resume && p.load_session && !last.is_empty() {
            match within(hs, abort, p.client.load_session(last, root))
                .await
                .ok_or(())
            {
                Ok(Ok(r)) => {
                    modes = r.modes;
                    config_options = r.config_options;
                    session_id = last.to_string();
                    reset = false;
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "session/load failed; starting a new session")
                }
                Err(_) => {
                    return Err(self
                        .fail(shared, StartError::Handshake("session/load".into()))
                        .await);
                }
            }
            // The replayed history is not this turn's output.
            while p.events.try_recv().is_ok() {}
        }
        if session_id.is_empty() {
            match within(hs, abort, p.client.new_session(root))
                .await
                .ok_or(())
            {
                Ok(Ok(r)) => {
                    session_id = r.session_id;
                    modes = r.modes;
                    config_options = r.config_options;
                }
                Ok(Err(e)) => {
                    return Err(self
                        .fail(shared, StartError::Protocol(format!("session/new: {e}")))
                        .await);
                }
                Err(_) => {
                    return Err(self
                        .fail(shared, StartError::Handshake("session/new".into()))
                        .await);
                }
            }
        }
        // An agent without the `modes` field may publish its modes as the `mode` config option
        // only (OpenCode 1.18); it is then read, and set, the same way.
        let option_mode = config_options
            .as_ref()
            .and_then(crate::translate::mode_from_config_options);
        let mut current = modes
            .as_ref()
            .map(|m| m.current_mode_id.clone())
            .or(option_mode)
            .unwrap_or_default();
        let want = cfg.supervised_mode.clone();
        if !want.is_empty() {
            let offered = match &modes {
                Some(m) => m.available_modes.iter().any(|x| x.id == want),
                None => config_options
                    .as_ref()
                    .and_then(crate::translate::modes_offered_in_config_options)
                    .is_some_and(|ids| ids.contains(&want)),
            };
            if !offered {
                return Err(self
                    .fail(
                        shared,
                        StartError::Mode(format!(
                            "the agent does not offer the supervised mode {want:?}"
                        )),
                    )
                    .await);
            }
            if current != want {
                // Said, because an adapter whose warden-written settings took effect starts in
                // its supervised mode: this line means they did not (or it has no such setting).
                tracing::info!(session_id = %session_id, from = %current, to = %want, "the agent started outside its supervised mode; setting it");
                match within(hs, abort, p.client.set_mode(&session_id, &want))
                    .await
                    .ok_or(())
                {
                    Ok(Ok(())) => current = want,
                    Ok(Err(e)) => {
                        return Err(self
                            .fail(shared, StartError::Mode(format!("set_mode {want:?}: {e}")))
                            .await);
                    }
                    Err(_) => {
                        return Err(self
                            .fail(shared, StartError::Handshake("session/set_mode".into()))
                            .await);
                    }
                }
            }
            // Mode updates caused by our own set_mode are not escalations.
            while p.events.try_recv().is_ok() {}
        }
        Ok((
            self,
            SessionStarted {
                session_id,
                mode: current,
                reset,
                config_options,
            },
        ))
    }

    /// Kills the tree of an agent whose start failed and returns `error` with the tail of what
    /// the agent wrote to stderr (masked), once the reader has seen the end of it.
    pub async fn fail(mut self, shared: &Shared, error: StartError) -> StartError {
        // An agent that died on its own says how (a signal from outside, an exit code) — the
        // clue when it wrote nothing on stderr.
        let exited_first = self.tree.as_ref().is_some_and(|t| t.leader_exited());
        self.client.close_stdin();
        let status = match self.tree.take() {
            Some(mut t) => {
                let opts = warden_sandbox::KillOptions::with_grace(
                    shared.settings().limits().kill_grace(),
                );
                t.kill(opts).await.ok().and_then(|r| r.leader_status)
            }
            None => None,
        };
        let error = match (exited_first, status, error) {
            (true, Some(st), StartError::Protocol(m)) => {
                StartError::Protocol(format!("{m} (the agent had exited: {st})"))
            }
            (_, _, e) => e,
        };
        if let Some(reader) = self.stderr_reader.take() {
            // The tree is dead, so EOF is near; a descendant that escaped the kill and still
            // holds the pipe must not hold the failure up.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), reader).await;
        }
        let tail = self
            .stderr
            .lock()
            .map(|r| r.tail(STDERR_TAIL_BYTES))
            .unwrap_or_default();
        let tail = tail.trim_end();
        if tail.is_empty() {
            error
        } else {
            StartError::WithStderr {
                error: Box::new(error),
                tail: tail.to_string(),
            }
        }
    }

    /// Kills the whole tree (SIGTERM, grace, SIGKILL). Returns (forced, processes).
    pub async fn kill(&mut self, shared: &Shared) -> (bool, u32) {
        self.client.close_stdin();
        match self.tree.as_mut() {
            Some(t) => {
                let r = kill_tree(shared, t).await;
                self.tree = None;
                r
            }
            None => (false, 0),
        }
    }
}

async fn kill_tree(shared: &Shared, tree: &mut warden_sandbox::ProcessTree) -> (bool, u32) {
    let opts = warden_sandbox::KillOptions::with_grace(shared.settings().limits().kill_grace());
    match tree.kill(opts).await {
        Ok(r) => {
            if r.remaining > 0 {
                tracing::error!(remaining = r.remaining, "agent processes survived the kill");
            }
            (r.forced, r.processes as u32)
        }
        Err(e) => {
            tracing::error!(error = %e, "killing the agent tree failed");
            (false, 0)
        }
    }
}

pub type Spawned = (
    warden_sandbox::ProcessTree,
    ChildStdin,
    ChildStdout,
    Option<ChildStderr>,
    Vec<String>,
    Vec<String>,
    Option<crate::egress::EgressProxy>,
);

/// Spawns `cfg` contained in the target's root, with its own home. `binding`: where a
/// `network = "proxy"` agent's egress proxy reports (the conversation it is bound to; a warm
/// agent's is bound at the take, and until then its proxy forwards nothing).
fn spawn(
    shared: &Shared,
    target: &Target<'_>,
    cfg: &AgentConfig,
    binding: &Arc<Binding>,
) -> Result<Spawned, StartError> {
    let adapter = shared
        .settings()
        .adapter(cfg)
        .transpose()
        .map_err(StartError::Spawn)?;
    let program = match &adapter {
        Some(a) => a.node.clone(),
        None => shared
            .settings()
            .agent_program(cfg)
            .map_err(StartError::Spawn)?,
    };
    // Set last: an operator's `set_env` does not take away what keeps the agent's own
    // configuration warden's.
    let shell = if crate::adapters::talks_to_itself_over_loopback(cfg) {
        Some(crate::config::shipped_binary("warden-agent-shell").map_err(StartError::Spawn)?)
    } else {
        None
    };
    // The home as the agent sees it (the spawn sets `HOME` to its canonical path).
    let home_seen = target
        .home
        .map(|h| std::fs::canonicalize(h).unwrap_or_else(|_| h.to_path_buf()));
    let forced: Vec<(String, String)> = crate::adapters::forced_env(cfg)
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain(crate::adapters::config_env(cfg, home_seen.as_deref()))
        .chain(
            shell
                .iter()
                .flat_map(|s| crate::adapters::agent_shell_env(s)),
        )
        .collect();
    let keys: Vec<String> = cfg
        .env
        .iter()
        .cloned()
        .chain(cfg.set_env.keys().cloned())
        .chain(forced.iter().map(|(k, _)| k.clone()))
        .collect();
    let policy = warden_sandbox::EnvPolicy::new(keys, &shared.settings().file.sandbox.env_extra)
        .map_err(|e| StartError::Spawn(e.to_string()))?;
    let env = policy.build_from(
        std::env::vars_os()
            .chain(cfg.set_env.iter().map(|(k, v)| (k.into(), v.into())))
            .chain(forced.iter().map(|(k, v)| (k.into(), v.into()))),
    );
    let secrets = secret_values(&env);
    let names: Vec<String> = env
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    let base_url = env
        .get("OPENAI_BASE_URL")
        .map(|v| v.to_string_lossy().into_owned());
    let model = env
        .get("OPENAI_MODEL")
        .map(|v| v.to_string_lossy().into_owned());
    let mut spec = warden_sandbox::SpawnSpec::new(
        target.spawn_id.to_string(),
        program,
        target.boundary.clone(),
        env,
        shared.depth,
    );
    spec.cpu_group = target.principal.and_then(|p| shared.cpu_group(p));
    spec.args = adapter
        .iter()
        .filter(|a| !a.native)
        .map(|a| a.entry.clone().into_os_string())
        .chain(cfg.args.iter().map(Into::into))
        .collect();
    // The conversation's copy, never the operator's template (`cfg.home`).
    spec.home = target.home.map(std::path::Path::to_path_buf);
    spec.extra_ro_binds = cfg.read_only_paths.clone();
    if let Some(a) = &adapter {
        spec.extra_ro_binds.push(a.modules.clone());
    }
    spec.extra_ro_binds.extend(shell.iter().cloned());
    // allow_execute = false (in a root warden did not create): the floor denies execute tool
    // calls and terminals, and Landlock stops the agent's own shell — only its program (and an
    // adapter's package directory) may be executed.
    if !target.boundary.owned && !target.boundary.allow_execute {
        spec.exec_only = Some(warden_sandbox::ExecOnly {
            launcher: crate::config::shipped_binary("warden-exec-limit")
                .map_err(StartError::Spawn)?,
            allow: adapter
                .iter()
                .map(|a| a.modules.clone())
                .chain(shell.iter().cloned())
                .collect(),
        });
    }
    spec.adapter_policy =
        crate::adapters::codex_policy(cfg, base_url.as_deref()).map_err(StartError::Spawn)?;
    spec.adapter_policy.claude_managed_mcp = crate::adapters::claude_managed_mcp(cfg);
    spec.adapter_policy.opencode_config =
        crate::adapters::opencode_config(cfg, base_url.as_deref(), model.as_deref())
            .map_err(StartError::Spawn)?;
    spec.network = cfg.network.sandbox();
    let egress = if cfg.network == Network::Proxy {
        let (proxy, e) = start_egress(shared, target, binding, cfg, &spec.env)?;
        spec.egress = Some(e);
        Some(proxy)
    } else {
        None
    };
    spec.limits = warden_sandbox::Limits {
        memory_max: cfg.memory_max_bytes,
        pids_max: cfg.max_processes,
        cpu_max: None,
    };
    let spawned = shared
        .spawner
        .spawn(spec)
        .map_err(|e| StartError::Spawn(e.to_string()))?;
    let mut tree = spawned.tree;
    let stdin = tree
        .take_stdin()
        .ok_or_else(|| StartError::Spawn("the agent has no stdin".into()))?;
    Ok((
        tree,
        stdin,
        spawned.stdout,
        Some(spawned.stderr),
        secrets,
        names,
        egress,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(cap: usize, secrets: &[&str]) -> StderrRing {
        StderrRing {
            buf: VecDeque::new(),
            cap,
            secrets: secrets.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn secret_names_are_recognised_by_their_words() {
        for n in [
            "ANTHROPIC_API_KEY",
            "gh_token",
            "MY_SECRET",
            "DB_PASSWORD",
            "KEYRING",
        ] {
            assert!(is_secret_name(n), "{n}");
        }
        for n in ["HOME", "PATH", "ANTHROPIC_BASE_URL", "IS_SANDBOX"] {
            assert!(!is_secret_name(n), "{n}");
        }
    }

    #[test]
    fn the_tail_masks_secrets_before_it_cuts() {
        let mut r = ring(64, &["sk-long-secret-value", "sk-long"]);
        r.push(b"start sk-long-secret-value and sk-long end");
        assert_eq!(r.tail(4096), "start [masked] and [masked] end");
        // A cut inside a secret's place shows only the mask's end, never the secret's.
        let t = r.tail(20);
        assert!(!t.contains("sk-long"), "{t}");
        assert!(t.ends_with("[masked] end"), "{t}");
    }

    #[test]
    fn the_tail_is_bounded_at_a_character_boundary() {
        let mut r = ring(1024, &[]);
        r.push("ééééé".as_bytes());
        let t = r.tail(3);
        assert_eq!(t, "é");
    }
}
