//! The state one conversation's handlers share: what never changes (`ConvInfo`, including the
//! one conversion of its boundary to the wire and to the sandbox), what the agent last reported
//! (`Live`), and `ConvCore` — the policy client, terminals, the fs servant and the root's
//! directory fd that the ACP handler (`bridge.rs`) and the turn driver (`conversation.rs`) both
//! use.
//!
//! Must never: decide anything, or open an agent's file for `fs/*` other than through
//! `servant` (the agent's rights); `files` is the supervisor's own view, for checking a
//! terminal's working directory and walking the root.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use warden_acp::{PermissionRequest, RpcError};
use warden_containment::beneath::RootDir;
use warden_proto::v1 as pb;

use crate::policy::PolicyClient;
use crate::terminal::{TerminalCtx, Terminals};
use crate::translate;
use crate::turn::{ToolSeen, TurnCtx};

/// What never changes in a conversation.
#[derive(Debug, Clone)]
pub struct ConvInfo {
    pub context_id: String,
    pub agent: String,
    pub principal: String,
    pub verb: String,
    pub root: PathBuf,
    pub owned: bool,
    pub allow_execute: bool,
    /// One profile type for wire, rules and sandbox (`warden_containment::Profile`).
    pub profile: warden_sandbox::Profile,
    /// The caller's model and effort for the session ("" = the agent's default).
    pub model: String,
    pub effort: String,
}

#[derive(Default)]
pub struct Live {
    pub session_id: String,
    pub current_mode: String,
    /// The last mode the agent itself reported (mode update or mode config option), so one
    /// change announced both ways is handled once.
    pub agent_mode: String,
    pub turn: Option<Arc<TurnCtx>>,
}

/// Shared by the conversation and the ACP client's handler.
pub struct ConvCore {
    pub info: ConvInfo,
    pub live: Mutex<Live>,
    pub policy: PolicyClient,
    pub deadline: Duration,
    /// `Some` when the agent is configured with terminals.
    pub terminal: Option<TerminalCtx>,
    pub terminals: Terminals,
    /// The root, held open while the conversation's agent may run: the supervisor's own look at
    /// it (a terminal's working directory, the walk of what a turn changed), never `fs/*`. With
    /// the agent's rights, so it is opened again when the conversation takes another uid of
    /// `sandbox.agent_uid_range` (and closed while it holds none: `Conversation::give_back_uid`).
    pub files: std::sync::RwLock<Result<Arc<RootDir>, String>>,
    /// Carries out `fs/*` inside the agent's sandbox with the agent's rights.
    pub servant: crate::servant::Servant,
    /// `limits.fs_read_bytes`.
    pub fs_read_bytes: u64,
    /// `limits.*_per_turn`: the agent's requests each turn may make.
    pub quotas: crate::turn::Quotas,
    /// One permit: the conversation's work over an agent's line of megabytes, on the blocking
    /// pool, one at a time (`bridge::ConvCore::bound_large`).
    pub bulk: tokio::sync::Semaphore,
}

impl ConvInfo {
    /// The boundary as the policy contract carries it.
    pub fn wire_boundary(&self) -> pb::Boundary {
        pb::Boundary {
            root: self.root.to_string_lossy().into_owned(),
            owned: self.owned,
            allow_execute: self.allow_execute,
            profile: self.profile.wire(),
        }
    }

    /// The boundary as the sandbox enforces it (agents and their terminals).
    pub fn sandbox_boundary(&self) -> warden_sandbox::Boundary {
        warden_sandbox::Boundary {
            root: self.root.clone(),
            owned: self.owned,
            allow_execute: self.allow_execute,
            profile: self.profile,
        }
    }

    /// Who asks, for a Decide of `turn` in `session_id`.
    pub fn subject(&self, turn: Option<&TurnCtx>, session_id: String) -> pb::Subject {
        pb::Subject {
            principal: self.principal.clone(),
            context_id: self.context_id.clone(),
            task_id: turn.map(|t| t.input.task_id.clone()).unwrap_or_default(),
            session_id,
            agent: self.agent.clone(),
            verb: self.verb.clone(),
            // The turn's own caller's, never another turn's of the same principal.
            groups: turn.map(|t| t.input.groups.clone()).unwrap_or_default(),
            issuer: turn.map(|t| t.input.issuer.clone()).unwrap_or_default(),
        }
    }
}

impl ConvCore {
    pub fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The root held open now, if it is.
    pub fn files(&self) -> Option<Arc<RootDir>> {
        match self.files.read() {
            Ok(f) => f.as_ref().ok().cloned(),
            Err(p) => p.into_inner().as_ref().ok().cloned(),
        }
    }

    /// Puts `files` in place of the root held open (a new uid's rights, or none).
    pub fn set_files(&self, files: Result<Arc<RootDir>, String>) {
        match self.files.write() {
            Ok(mut f) => *f = files,
            Err(p) => *p.into_inner() = files,
        }
    }

    pub fn turn(&self) -> Option<Arc<TurnCtx>> {
        self.live().turn.clone()
    }

    /// Builds the DecideRequest: the request's tool call, with kind/title/locations/raw input
    /// filled from the earlier `tool_call` of the same id when the request omits them.
    pub fn decide_request(
        &self,
        req: &PermissionRequest,
        turn: Option<&TurnCtx>,
        request_id: String,
    ) -> pb::DecideRequest {
        let tc = &req.tool_call;
        let seen: ToolSeen = turn
            .and_then(|t| t.lock().tools.get(&tc.tool_call_id).cloned())
            .unwrap_or_default();
        let kind = tc
            .kind
            .as_ref()
            .map(|k| k.as_str().to_string())
            .unwrap_or(seen.kind);
        let title = tc.title.clone().unwrap_or(seen.title);
        let locations = match &tc.locations {
            Some(l) if !l.is_empty() => translate::locations(l),
            _ => seen.locations,
        };
        let raw_input_json = tc
            .raw_input
            .as_ref()
            .map(|v| v.to_string())
            .unwrap_or(seen.raw_input_json);
        let (session_id, current_mode) = {
            let l = self.live();
            (l.session_id.clone(), l.current_mode.clone())
        };
        pb::DecideRequest {
            request_id,
            subject: Some(self.info.subject(turn, session_id)),
            boundary: Some(self.info.wire_boundary()),
            tool_call: Some(pb::ToolCall {
                id: tc.tool_call_id.clone(),
                kind,
                title,
                raw_input_json,
                locations,
            }),
            options: req
                .options
                .iter()
                .map(|o| pb::PermissionOption {
                    id: o.option_id.clone(),
                    name: o.name.clone(),
                    kind: o.kind.as_str().to_string(),
                })
                .collect(),
            current_mode,
            deadline_unix_ms: 0,
            // The supervisor cannot ask a person: an escalation is a refusal here.
            return_escalations: false,
        }
    }

    /// The kill grace when terminals are served; `-32601` otherwise.
    pub fn terminal_enabled(&self, method: &str) -> Result<Duration, RpcError> {
        match &self.terminal {
            Some(t) => Ok(t.shared.settings().limits().kill_grace()),
            None => Err(RpcError::method_not_found(method)),
        }
    }

    /// Where an `fs/*` request naming `path` (absolute, as ACP requires) lands, resolved once
    /// against the root: the location a decision judges and the servant opens (without following
    /// any link, so nothing resolves it differently later). A path that leads outside the root
    /// now is refused outright.
    pub fn fs_location(&self, path: &str) -> Result<PathBuf, RpcError> {
        if !Path::new(path).is_absolute() {
            return Err(RpcError::invalid_params("path must be absolute"));
        }
        self.covered_key(path)
            .filter(|k| k.starts_with(&self.info.root))
            .ok_or_else(|| {
                RpcError::invalid_params(format!("{path} is outside the session boundary"))
            })
    }

    /// The root-relative spelling of a path the agent sent, for matching against what an ALLOW
    /// covered: resolved against the root as far as it exists (the write itself is walked again by
    /// the kernel beneath the root's fd, so this is only a lookup key, never a licence).
    ///
    /// The root was resolved when the conversation opened (an owned root under the canonical
    /// state directory, a workspace through the root check) and its ancestors are not the
    /// agent's: only the components below it are looked up (`Anchored`), one `statx` for a file
    /// at the top of the root instead of one per directory from `/`.
    pub fn covered_key(&self, path: impl AsRef<Path>) -> Option<PathBuf> {
        warden_containment::Anchored::trusting(warden_containment::RealFs, &self.info.root)
            .resolve(path, &self.info.root)
            .ok()
    }
}
