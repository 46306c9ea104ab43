//! One running agent: the contained process tree, its ACP connection and event receiver, and a
//! bounded ring of its stderr.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use warden_acp::{AcpClient, AcpEvent, ClientCapabilities, ClientConfig, FsCapabilities};

use tokio::process::{ChildStderr, ChildStdin, ChildStdout};

use crate::config::{AgentConfig, Network};
use crate::core::{ConvCore, ConvInfo};
use crate::shared::Shared;

/// Why an agent could not be started. Every variant but `Capacity` is a `startup` fault.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No live-agent slot: every live agent is busy (not the agent's fault, nothing started).
    #[error(transparent)]
    Capacity(#[from] crate::live::Full),
    #[error("cannot start the agent: {0}")]
    Spawn(String),
    #[error("the agent did not answer {0} within the handshake deadline")]
    Handshake(String),
    #[error("the agent broke the protocol during start-up: {0}")]
    Protocol(String),
    #[error("supervised mode unavailable: {0}")]
    Mode(String),
}

impl StartError {
    pub fn class(&self) -> warden_proto::v1::FaultClass {
        match self {
            StartError::Capacity(_) => warden_proto::v1::FaultClass::Capacity,
            _ => warden_proto::v1::FaultClass::Startup,
        }
    }
}

/// The last bytes an agent wrote to stderr.
#[derive(Default)]
pub struct StderrRing {
    buf: VecDeque<u8>,
    cap: usize,
}

impl StderrRing {
    fn push(&mut self, bytes: &[u8]) {
        for b in bytes {
            if self.buf.len() == self.cap {
                self.buf.pop_front();
            }
            self.buf.push_back(*b);
        }
    }
    pub fn text(&self) -> String {
        let v: Vec<u8> = self.buf.iter().copied().collect();
        String::from_utf8_lossy(&v).into_owned()
    }
}

pub struct AgentProc {
    /// This agent's live-agent slot, given back when the agent is dropped (killed, stopped).
    pub slot: crate::live::LiveSlot,
    pub client: AcpClient,
    pub events: mpsc::UnboundedReceiver<AcpEvent>,
    pub tree: Option<warden_sandbox::ProcessTree>,
    pub stderr: Arc<Mutex<StderrRing>>,
    pub load_session: bool,
}

impl AgentProc {
    /// Spawns the agent contained and runs `initialize` within the handshake deadline; an agent
    /// that does not answer is killed.
    pub async fn start(
        shared: &Arc<Shared>,
        core: &Arc<ConvCore>,
        cfg: &AgentConfig,
        home: Option<&std::path::Path>,
    ) -> Result<AgentProc, StartError> {
        // A live-agent slot first: at the limit an idle agent is stopped to make room (its kill
        // takes up to the kill grace).
        // Not before a predecessor's leftovers are gone (start-up reaps them in the background).
        let mut reaped = shared.reaped.clone();
        let _ = reaped.wait_for(|done| *done).await;
        let wait = shared.settings.limits().kill_grace() + std::time::Duration::from_secs(1);
        let slot = shared.live.acquire(&core.info.context_id, wait).await?;
        let (mut tree, stdin, stdout, stderr) = spawn(shared, &core.info, cfg, home)?;
        let ring = Arc::new(Mutex::new(StderrRing {
            buf: VecDeque::new(),
            cap: shared.settings.limits().stderr_ring_bytes,
        }));
        if let Some(mut err) = stderr {
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
            });
        }
        let config = ClientConfig {
            request_timeout: Some(shared.settings.limits().handshake()),
            cancel_deadline: shared.settings.limits().cancel_grace(),
            client_name: "warden-supervisor".into(),
            ..ClientConfig::default()
        };
        let (client, events) = AcpClient::connect(stdout, stdin, core.clone(), config);
        let caps = ClientCapabilities {
            fs: FsCapabilities {
                read_text_file: true,
                write_text_file: true,
            },
            terminal: cfg.terminal,
            elicitation: true,
        };
        let hs = shared.settings.limits().handshake();
        let init = tokio::time::timeout(hs, client.initialize(caps)).await;
        let init = match init {
            Ok(Ok(i)) => i,
            Ok(Err(e)) => {
                kill_tree(shared, &mut tree).await;
                return Err(StartError::Protocol(format!("initialize: {e}")));
            }
            Err(_) => {
                kill_tree(shared, &mut tree).await;
                return Err(StartError::Handshake("initialize".into()));
            }
        };
        Ok(AgentProc {
            slot,
            client,
            events,
            tree: Some(tree),
            stderr: ring,
            load_session: init.agent_capabilities.load_session,
        })
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
    let opts = warden_sandbox::KillOptions::with_grace(shared.settings.limits().kill_grace());
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
);

/// Spawns `cfg` contained in the conversation's root, with the conversation's own home.
fn spawn(
    shared: &Shared,
    info: &ConvInfo,
    cfg: &AgentConfig,
    home: Option<&std::path::Path>,
) -> Result<Spawned, StartError> {
    let program = shared
        .settings
        .agent_program(cfg)
        .map_err(StartError::Spawn)?;
    let keys: Vec<String> = cfg
        .env
        .iter()
        .cloned()
        .chain(cfg.set_env.keys().cloned())
        .collect();
    let policy = warden_sandbox::EnvPolicy::new(keys, &shared.settings.file.sandbox.env_extra)
        .map_err(|e| StartError::Spawn(e.to_string()))?;
    let env = policy.build_from(
        std::env::vars_os().chain(cfg.set_env.iter().map(|(k, v)| (k.into(), v.into()))),
    );
    let boundary = info.sandbox_boundary();
    let mut spec = warden_sandbox::SpawnSpec::new(
        info.context_id.clone(),
        program,
        boundary,
        env,
        shared.depth,
    );
    spec.args = cfg.args.iter().map(Into::into).collect();
    // The conversation's copy, never the operator's template (`cfg.home`).
    spec.home = home.map(std::path::Path::to_path_buf);
    spec.extra_ro_binds = cfg.read_only_paths.clone();
    spec.network = match cfg.network {
        Network::None => warden_sandbox::Network::None,
        Network::Host => warden_sandbox::Network::Host,
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
    Ok((tree, stdin, spawned.stdout, Some(spawned.stderr)))
}
