//! The conversation registry (single-flight open) and the gRPC services it serves:
//! `SupervisorService` (to the gateway only) and `AdminService` (status).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::Stream;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status};
use warden_proto::v1 as pb;
use warden_proto::v1::admin_service_server::AdminService;
use warden_proto::v1::supervisor_service_server::SupervisorService;
use warden_proto::v1::turn_event::Event;

use crate::config::{AgentConfig, Network};
use crate::conversation::Conversation;
use crate::core::{ConvCore, ConvInfo, Live};
use crate::shared::Shared;
use crate::turn::{TurnCtx, TurnInput};

/// Longest accepted RunTurnRequest.instructions (a front's scaffolding, not the task).
pub const MAX_INSTRUCTIONS: usize = 4096;

/// How many ended contexts are remembered for their ContextReset (a bounded record).
const ENDED_MEMORY: usize = 4096;

/// Longest accepted context id / turn id (bytes).
const MAX_ID: usize = 256;

/// Why a conversation is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Its owner closed it or its context expired: everything of it goes.
    Ended,
    /// The supervisor stops: the tree goes, the owned root stays for the next start.
    Shutdown,
}

struct Slot {
    conv: tokio::sync::Mutex<Option<Arc<Conversation>>>,
}

/// The supervisor: the registry of conversations.
pub struct Supervisor {
    pub shared: Arc<Shared>,
    /// Warm agents waiting for new conversations.
    pub pool: Arc<crate::pool::Pool>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Cancels for turns of conversations that are not open yet.
    early_cancels: Mutex<HashMap<String, Vec<String>>>,
    /// Contexts whose conversation was closed, newest last (bounded): a new conversation in one
    /// tells its first turn that the context was reset.
    ended: Mutex<std::collections::VecDeque<String>>,
    started: Instant,
    pub listeners: Mutex<Vec<String>>,
    /// Every conversation held open (context id → its principal), counted against
    /// `limits.max_open_conversations_per_principal`: taken before an open starts anything,
    /// given back when the open fails or the conversation closes.
    held: Mutex<HashMap<String, String>>,
}

/// A caller's context id: a valid id outside the warm agents' namespace.
fn check_context_id(s: &str) -> Result<(), Status> {
    check_id("context_id", s)?;
    if s.starts_with(crate::pool::POOL_PREFIX) {
        return Err(Status::invalid_argument(format!(
            "context ids starting with {:?} are reserved",
            crate::pool::POOL_PREFIX
        )));
    }
    Ok(())
}

fn check_id(what: &str, s: &str) -> Result<(), Status> {
    if s.is_empty() {
        return Err(Status::invalid_argument(format!("{what} is required")));
    }
    if s.len() > MAX_ID {
        return Err(Status::invalid_argument(format!(
            "{what} is longer than {MAX_ID} bytes"
        )));
    }
    if s.chars().any(char::is_control) {
        return Err(Status::invalid_argument(format!(
            "{what} contains control characters"
        )));
    }
    Ok(())
}

/// What a principal is told for a context that is another principal's (a live conversation or
/// a root registered to someone else): the same words the gateway uses for a context it knows
/// to be another's, so the answer says nothing the caller could not learn there. Typed
/// REJECTED: the gateway ends the task with it, nothing started.
fn not_yours(context_id: &str) -> Status {
    crate::fault::status(
        tonic::Code::NotFound,
        pb::FaultClass::Rejected,
        format!("context {context_id} not found"),
    )
}

/// A turn of an existing conversation that names a model or effort: the session's were chosen
/// when the conversation opened (set on the agent's session before its first prompt), so a
/// different value is refused (`option-not-offered`, naming what the session runs) rather than
/// silently ignored; the same value, or none, runs. A different model needs a new conversation.
fn same_session_options(
    open: &pb::OpenConversationRequest,
    info: &crate::core::ConvInfo,
) -> Result<(), Status> {
    for (what, wanted, current) in [
        ("model", &open.model, &info.model),
        ("effort", &open.effort, &info.effort),
    ] {
        if wanted.is_empty() || wanted == current {
            continue;
        }
        check_option(what, wanted)?;
        let runs = if current.is_empty() {
            format!("the agent's default {what} (none was asked for when it opened)")
        } else {
            format!("{what} {current:?}")
        };
        return Err(crate::fault::status(
            tonic::Code::FailedPrecondition,
            pb::FaultClass::OptionNotOffered,
            format!(
                "option-not-offered: this conversation's session runs {runs}, chosen when it opened; {what} {wanted:?} needs a new conversation (close this one or use another context)"
            ),
        ));
    }
    Ok(())
}

/// The longest model or effort name a caller may ask for.
const MAX_OPTION: usize = 128;

/// A model or effort name: optional, bounded, printable.
fn check_option(what: &str, s: &str) -> Result<(), Status> {
    if s.len() > MAX_OPTION {
        return Err(Status::invalid_argument(format!(
            "{what} is longer than {MAX_OPTION} bytes"
        )));
    }
    if s.chars().any(char::is_control) {
        return Err(Status::invalid_argument(format!(
            "{what} contains control characters"
        )));
    }
    Ok(())
}

impl Supervisor {
    pub fn new(shared: Shared) -> Arc<Self> {
        let shared = Arc::new(shared);
        Arc::new(Supervisor {
            pool: crate::pool::Pool::new(shared.clone()),
            shared,
            slots: Mutex::new(HashMap::new()),
            early_cancels: Mutex::new(HashMap::new()),
            ended: Mutex::new(std::collections::VecDeque::new()),
            started: Instant::now(),
            listeners: Mutex::new(Vec::new()),
            held: Mutex::new(HashMap::new()),
        })
    }

    fn slot(&self, context_id: &str) -> Arc<Slot> {
        let mut m = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(context_id.to_string())
            .or_insert_with(|| {
                Arc::new(Slot {
                    conv: tokio::sync::Mutex::new(None),
                })
            })
            .clone()
    }

    fn existing(&self, context_id: &str) -> Option<Arc<Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(context_id)
            .cloned()
    }

    /// Open or return the open conversation. Concurrent calls for one context wait on the same
    /// slot, so exactly one agent is started; a failed start leaves nothing behind.
    pub async fn open(
        &self,
        req: &pb::OpenConversationRequest,
    ) -> Result<Arc<Conversation>, Status> {
        check_context_id(&req.context_id)?;
        check_option("model", &req.model)?;
        check_option("effort", &req.effort)?;
        let slot = self.slot(&req.context_id);
        let mut guard = slot.conv.lock().await;
        if let Some(c) = guard.as_ref() {
            let st = c.st().status;
            if !matches!(
                st,
                pb::ConversationState::Closed | pb::ConversationState::Failed
            ) {
                if c.core.info.principal != req.principal {
                    tracing::warn!(context_id = %req.context_id, principal = %req.principal, "open of another principal's conversation refused");
                    return Err(not_yours(&req.context_id));
                }
                return Ok(c.clone());
            }
        }
        // A root outlives its agent (idle stop, restart): it is reopened by its owner only.
        let res = match self.shared.roots.owner(&req.context_id) {
            Ok(Some(o)) if req.workspace.is_empty() && !o.is(&req.principal) => {
                tracing::warn!(context_id = %req.context_id, principal = %req.principal, "open of another principal's sandbox refused");
                Err(not_yours(&req.context_id))
            }
            Ok(_) => match self.hold(&req.context_id, &req.principal) {
                Ok(()) => self.start_locked(req, &mut guard).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(Status::internal(format!("sandbox registry: {e}"))),
        };
        if res.is_err() && guard.is_none() {
            // A refused or failed open leaves no slot and holds nothing of the share.
            self.unhold(&req.context_id);
            drop(guard);
            self.forget(&req.context_id, &slot);
        }
        res
    }

    /// Takes one of `principal`'s open conversations for `context_id` (its slot locked), or
    /// refuses: RESOURCE_EXHAUSTED with fault `capacity`, naming the key. A context it already
    /// holds (a failed conversation reopened) takes nothing more. Refused rather than closing
    /// the principal's oldest idle conversation for it: a close removes that context's root —
    /// the caller's files — which only the caller (or the gateway's idle expiry) may decide.
    fn hold(&self, context_id: &str, principal: &str) -> Result<(), Status> {
        let share = self
            .shared
            .settings()
            .max_open_conversations_per_principal();
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.get(context_id).is_some_and(|p| p == principal) {
            return Ok(());
        }
        let open = held.values().filter(|p| *p == principal).count();
        if open >= share {
            tracing::warn!(
                context_id,
                principal,
                open,
                share,
                "open refused: the principal holds its share of open conversations"
            );
            return Err(crate::fault::status(
                tonic::Code::ResourceExhausted,
                pb::FaultClass::Capacity,
                format!(
                    "capacity: this caller holds {open} open conversations, its share \
                     (limits.max_open_conversations_per_principal = {share}); close one \
                     (or let it expire) to open another"
                ),
            ));
        }
        held.insert(context_id.to_string(), principal.to_string());
        Ok(())
    }

    /// Gives back what [`Supervisor::hold`] took for `context_id`.
    fn unhold(&self, context_id: &str) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(context_id);
    }

    /// The body of [`Supervisor::open`], with the conversation's slot locked.
    async fn start_locked(
        &self,
        req: &pb::OpenConversationRequest,
        guard: &mut Option<Arc<Conversation>>,
    ) -> Result<Arc<Conversation>, Status> {
        let settings = self.shared.settings();
        let s = &*settings;
        let (agent_name, agent_cfg) = s.agent(&req.agent).ok_or_else(|| {
            Status::invalid_argument(format!("no configured agent {:?}", req.agent))
        })?;
        let agent_cfg = agent_cfg.clone();
        // The one conversion of the wire's profile number (zero = read-only).
        let profile = warden_sandbox::Profile::from_wire(req.profile)
            .ok_or_else(|| Status::invalid_argument(format!("unknown profile {}", req.profile)))?;
        // A fresh owned root with the pool's profile: a warm agent serves, if there is one
        // (its root, home and uid become the conversation's; what the request asks of the
        // session — a model, an effort, planning for its verb — is set at the take).
        if req.workspace.is_empty()
            && req.copy_from.is_empty()
            && matches!(self.shared.roots.get(&req.context_id), Ok(None))
            && let Some(w) = self.pool.take(agent_name, &agent_cfg, profile)
            && let Some(res) = self
                .start_warm(req, agent_name, &agent_cfg, profile, w)
                .await
        {
            return res.map(|conv| self.opened(req, guard, conv));
        }
        // The conversation's identity (its own uid when a range is configured) before its root
        // and home are made for it; given back at close, when this open fails, or when its
        // agent stops (`Conversation::give_back_uid`). With every uid of the range held by
        // conversations whose agents run, it opens without one, its root and home the
        // supervisor's (as when given back), and takes one when its agent starts.
        let ident = match self.shared.spawner.assign_identity(&req.context_id) {
            Ok(i) => i,
            Err(e) if crate::conversation::uid_range(&self.shared) => {
                tracing::info!(context_id = %req.context_id, reason = %e, "no agent uid free: opened without one; its agent takes one when it starts");
                None
            }
            Err(e) => return Err(Status::resource_exhausted(e.to_string())),
        };
        let res = self
            .start_with_identity(req, guard, agent_name, agent_cfg, profile, ident)
            .await;
        if res.is_err() {
            self.shared.spawner.release_identity(&req.context_id);
        }
        res
    }

    /// The rest of [`Supervisor::start_locked`] once the conversation holds its identity, split
    /// off so that every way it fails gives the identity back in one place.
    #[allow(clippy::too_many_arguments)]
    async fn start_with_identity(
        &self,
        req: &pb::OpenConversationRequest,
        guard: &mut Option<Arc<Conversation>>,
        agent_name: &str,
        agent_cfg: AgentConfig,
        profile: warden_sandbox::Profile,
        ident: Option<warden_sandbox::AgentIdentity>,
    ) -> Result<Arc<Conversation>, Status> {
        let settings = self.shared.settings();
        let s = &*settings;
        let mut made_root = false;
        let boundary = if req.workspace.is_empty() {
            let existing = self
                .shared
                .roots
                .get(&req.context_id)
                .map_err(|e| Status::internal(format!("sandbox registry: {e}")))?;
            match existing {
                // A root an earlier uid of the range owned (before a close or a restart) is
                // given to this conversation's uid; only ever an owned root.
                Some(b) => {
                    if let Some(i) = ident
                        && std::fs::symlink_metadata(&b.root)
                            .map(|m| std::os::unix::fs::MetadataExt::uid(&m) != i.uid)
                            .unwrap_or(true)
                    {
                        warden_sandbox::chown_tree(&b.root, i).map_err(|e| {
                            Status::internal(format!("cannot give the sandbox to the agent: {e}"))
                        })?;
                    }
                    b
                }
                None => {
                    // Refused before anything is made.
                    if !req.copy_from.is_empty() && !s.file.copies.local_dirs {
                        return Err(Status::failed_precondition(
                            crate::copy::CopyError::Off.to_string(),
                        ));
                    }
                    made_root = true;
                    let b = self
                        .shared
                        .roots
                        .create(&req.context_id, &req.principal, false, profile, ident)
                        .map_err(|e| Status::internal(format!("cannot make a sandbox: {e}")))?;
                    if !req.copy_from.is_empty()
                        && let Err(e) = self.copy_into(req, &b, ident).await
                    {
                        if let Err(e) = self.shared.roots.remove(&req.context_id) {
                            tracing::warn!(context_id = %req.context_id, error = %e, "cannot remove the sandbox of a refused copy");
                        }
                        return Err(e);
                    }
                    b
                }
            }
        } else if !req.copy_from.is_empty() {
            return Err(Status::invalid_argument(
                "copy_from and workspace exclude each other: a conversation works in an operator workspace, or on a copy",
            ));
        } else {
            let w = s.file.workspaces.get(&req.workspace).ok_or_else(|| {
                Status::invalid_argument(format!("no configured workspace {:?}", req.workspace))
            })?;
            self.shared
                .workspaces
                .validate(&w.path, w.allow_execute, profile)
                .map_err(|e| Status::failed_precondition(e.to_string()))?
        };
        let core = self.conv_core(req, agent_name, &agent_cfg, profile, &boundary, ident);
        let home = match self
            .shared
            .homes
            .create(&req.context_id, agent_cfg.home.as_deref(), ident)
        {
            Ok(h) => h,
            Err(e) => {
                if made_root && let Err(e) = self.shared.roots.remove(&req.context_id) {
                    tracing::warn!(context_id = %req.context_id, error = %e, "cannot remove the sandbox of a failed start");
                }
                return Err(Status::internal(format!("cannot make the agent home: {e}")));
            }
        };
        // A failed open drops the home with the conversation (removed on drop).
        let conv = match Conversation::open(core, agent_cfg, self.shared.clone(), home, None).await
        {
            Ok(c) => c,
            Err(e) => {
                // A failed start disposes of what it made: the new, still empty sandbox too.
                if made_root && let Err(e) = self.shared.roots.remove(&req.context_id) {
                    tracing::warn!(context_id = %req.context_id, error = %e, "cannot remove the sandbox of a failed start");
                }
                return Err(self.start_failed(req, agent_name, profile, &e));
            }
        };
        Ok(self.opened(req, guard, conv))
    }

    /// The new root `b` made a copy of `req.copy_from`, with the agent's rights (off the
    /// runtime threads).
    async fn copy_into(
        &self,
        req: &pb::OpenConversationRequest,
        b: &warden_sandbox::Boundary,
        ident: Option<warden_sandbox::AgentIdentity>,
    ) -> Result<(), Status> {
        let caps = self.shared.settings().file.copies.clone();
        let src = req.copy_from.clone();
        let root = b.root.clone();
        let done = tokio::task::spawn_blocking(move || {
            let dst = warden_containment::beneath::RootDir::open_as(&root, ident.map(Into::into))
                .map_err(|e| crate::copy::CopyError::Write(e.to_string()))?;
            crate::copy::copy_into(&src, &dst, &caps)
        })
        .await
        .map_err(|e| Status::internal(format!("the copy stopped: {e}")))?;
        match done {
            Ok(files) => {
                tracing::info!(context_id = %req.context_id, files, "conversation root made as a copy");
                Ok(())
            }
            Err(e @ crate::copy::CopyError::Write(_)) => Err(Status::internal(e.to_string())),
            Err(e) => Err(Status::failed_precondition(e.to_string())),
        }
    }

    /// What a caller is told for a start that failed, recorded as an incident unless it was no
    /// room or a model/effort the agent does not offer (neither is the agent's fault).
    fn start_failed(
        &self,
        req: &pb::OpenConversationRequest,
        agent_name: &str,
        profile: warden_sandbox::Profile,
        e: &crate::agent::StartError,
    ) -> Status {
        tracing::warn!(context_id = %req.context_id, agent = %agent_name, error = %e.headline(), stderr_tail = %e.stderr_tail(), "conversation failed to start");
        let capacity = matches!(
            e,
            crate::agent::StartError::Capacity(_) | crate::agent::StartError::NoRoom(_)
        );
        let not_offered = e.class() == pb::FaultClass::OptionNotOffered;
        if !capacity && !not_offered {
            let _ = self.shared.records.incident(&crate::records::Incident {
                class: crate::fault::name(e.class()).into(),
                reason: e.headline(),
                stderr_tail: e.stderr_tail().to_string(),
                agent: agent_name.to_string(),
                verb: req.verb.clone(),
                profile: profile.as_str().into(),
                budget_secs: 0,
                transcript_path: String::new(),
                context_label: crate::records::label(&req.context_id),
                turn_label: String::new(),
                at_unix_ms: crate::records::now_ms(),
            });
        }
        if capacity {
            crate::fault::status(tonic::Code::ResourceExhausted, e.class(), e.to_string())
        } else if not_offered {
            crate::fault::status(tonic::Code::FailedPrecondition, e.class(), e.headline())
        } else {
            crate::fault::status_long(
                tonic::Code::Unavailable,
                e.class(),
                format!("startup fault: {}", e.headline()),
                format!("startup fault: {e}"),
            )
        }
    }

    /// The conversation's shared state, for its boundary (its identity is the spawner's: the
    /// agent, its terminals and its fs servant all run as it).
    fn conv_core(
        &self,
        req: &pb::OpenConversationRequest,
        agent_name: &str,
        agent_cfg: &AgentConfig,
        profile: warden_sandbox::Profile,
        boundary: &warden_sandbox::Boundary,
        ident: Option<warden_sandbox::AgentIdentity>,
    ) -> Arc<ConvCore> {
        let settings = self.shared.settings();
        let s = &*settings;
        Arc::new(ConvCore {
            info: ConvInfo {
                context_id: req.context_id.clone(),
                agent: agent_name.to_string(),
                principal: req.principal.clone(),
                verb: if req.verb.is_empty() {
                    "task".into()
                } else {
                    req.verb.clone()
                },
                root: boundary.root.clone(),
                owned: boundary.owned,
                allow_execute: boundary.allow_execute,
                profile,
                model: req.model.clone(),
                effort: req.effort.clone(),
            },
            live: Mutex::new(Live::default()),
            policy: self.shared.policy.clone(),
            deadline: s.decide_deadline(agent_cfg),
            terminal: agent_cfg.terminal.then(|| crate::terminal::TerminalCtx {
                shared: self.shared.clone(),
                agent_env: agent_cfg
                    .env
                    .iter()
                    .cloned()
                    .chain(agent_cfg.set_env.keys().cloned())
                    .collect(),
                // Terminals of a proxy agent get no network at all: the proxy serves the
                // agent's own namespace only.
                network: match agent_cfg.network {
                    Network::Proxy => warden_sandbox::Network::None,
                    n => n.sandbox(),
                },
            }),
            terminals: Default::default(),
            // Every look the supervisor takes at the root (the files a turn changed) runs
            // with the agent's rights: its root is its own, and what it closed stays closed.
            files: std::sync::RwLock::new(
                warden_containment::beneath::RootDir::open_as(
                    &boundary.root,
                    ident.map(Into::into),
                )
                .map(Arc::new)
                .map_err(|e| e.to_string()),
            ),
            // fs/* carried out by the agent's own rights (what it creates is the agent's).
            servant: crate::servant::Servant::spawned(
                self.shared.clone(),
                req.context_id.clone(),
                boundary.clone(),
            ),
            fs_read_bytes: s.limits().fs_read_bytes,
            quotas: s.limits().turn_quotas(),
            bulk: tokio::sync::Semaphore::new(1),
        })
    }

    /// Opens the conversation with a warm agent of the pool (its root becomes the
    /// conversation's) and sets what the request asks of its session; None when the warm agent
    /// could not be handed over (then the caller starts one as usual). An agent handed over whose
    /// session options fail (a model it does not offer) is killed, never returned to the pool
    /// (it was used; the pool refills), and the open fails as a cold start's would.
    async fn start_warm(
        &self,
        req: &pb::OpenConversationRequest,
        agent_name: &str,
        agent_cfg: &AgentConfig,
        profile: warden_sandbox::Profile,
        warm: crate::pool::Warm,
    ) -> Option<Result<Arc<Conversation>, Status>> {
        let boundary = warm.boundary().clone();
        let core = self.conv_core(
            req,
            agent_name,
            agent_cfg,
            profile,
            &boundary,
            warm.identity(),
        );
        let claimed = self.pool.claim(warm, &core).await?;
        match Conversation::open(
            core,
            agent_cfg.clone(),
            self.shared.clone(),
            claimed.home,
            Some((claimed.proc_, claimed.session)),
        )
        .await
        {
            Ok(c) => Some(Ok(c)),
            Err(e) => {
                // The agent is dead (killed by the failed open) and its home goes with the
                // conversation; the rest is undone like a cold start's.
                self.shared.spawner.release_identity(&req.context_id);
                if let Err(e) = self.shared.roots.remove(&req.context_id) {
                    tracing::warn!(context_id = %req.context_id, error = %e, "cannot remove the sandbox of a failed start");
                }
                Some(Err(self.start_failed(req, agent_name, profile, &e)))
            }
        }
    }

    /// What every opened conversation is told and registered with.
    fn opened(
        &self,
        req: &pb::OpenConversationRequest,
        guard: &mut Option<Arc<Conversation>>,
        conv: Arc<Conversation>,
    ) -> Arc<Conversation> {
        {
            let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = ended.iter().position(|e| e == &req.context_id) {
                ended.remove(i);
                conv.ended_before
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if let Some(ids) = self
            .early_cancels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&req.context_id)
        {
            for id in ids {
                conv.cancel_turn(&id);
            }
        }
        *guard = Some(conv.clone());
        conv
    }

    fn forget(&self, context_id: &str, slot: &Arc<Slot>) {
        let mut m = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if m.get(context_id).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            m.remove(context_id);
        }
    }

    pub async fn get(&self, context_id: &str) -> Option<Arc<Conversation>> {
        let slot = self.existing(context_id)?;
        let g = slot.conv.lock().await;
        g.clone()
    }

    /// Ends a conversation (its owner closed it, or the gateway's `conversation_ttl` passed):
    /// the tree is killed, the home removed, and an owned root removed after its turns'
    /// transcripts are closed (they live in the state directory, not in the root). An operator
    /// workspace is never removed.
    ///
    /// `principal` (empty: the gateway's own housekeeping, any owner) closes only what is its
    /// own: another principal's conversation or root is left alone and the answer is "not
    /// found". A context with no conversation in memory (the supervisor restarted since) still
    /// has its owned root removed: nothing of an ended context outlives its close.
    pub async fn close(&self, context_id: &str, principal: &str) -> pb::CloseConversationResponse {
        self.close_as(context_id, Ending::Ended, principal).await
    }

    async fn close_as(
        &self,
        context_id: &str,
        ending: Ending,
        principal: &str,
    ) -> pb::CloseConversationResponse {
        // Held like an open holds it, so no open can take up the root while it is removed.
        let slot = match ending {
            Ending::Ended => self.slot(context_id),
            Ending::Shutdown => match self.existing(context_id) {
                Some(s) => s,
                None => return pb::CloseConversationResponse::default(),
            },
        };
        let mut guard = slot.conv.lock().await;
        if !principal.is_empty()
            && guard
                .as_ref()
                .is_some_and(|c| c.core.info.principal != principal)
        {
            return pb::CloseConversationResponse::default();
        }
        let conv = guard.take();
        if conv.is_none() {
            // No agent to stop: the root is what is left of the context (a restart forgot its
            // conversation). Removed under the slot's lock, then the slot goes.
            if ending == Ending::Ended && self.remove_root(context_id, principal).await {
                // Its next conversation is told the context was reset, as after any close.
                self.remember_ended(context_id);
            }
            drop(guard);
            self.forget(context_id, &slot);
            return pb::CloseConversationResponse::default();
        }
        drop(guard);
        self.forget(context_id, &slot);
        self.unhold(context_id);
        match conv {
            Some(c) => {
                self.remember_ended(context_id);
                let (forced, processes) = c.close(ending == Ending::Shutdown).await;
                if ending == Ending::Ended && c.core.info.owned {
                    // The tree is dead and every turn ended (close waited for the active one),
                    // so nothing writes into the root any more.
                    let _ = self.remove_root(context_id, &c.core.info.principal).await;
                }
                pb::CloseConversationResponse {
                    closed: true,
                    forced,
                    processes,
                }
            }
            None => pb::CloseConversationResponse::default(),
        }
    }

    /// Removes the owned root registered for `context_id` if `principal` owns it (empty: any
    /// owner). A root may be large: removed off the runtime thread, before the close is
    /// answered (a caller that reopens the context finds a fresh root).
    fn remember_ended(&self, context_id: &str) {
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        ended.push_back(context_id.to_string());
        while ended.len() > ENDED_MEMORY {
            ended.pop_front();
        }
    }

    /// True when it removed one.
    async fn remove_root(&self, context_id: &str, principal: &str) -> bool {
        let roots = self.shared.roots.clone();
        let id = context_id.to_string();
        let who = principal.to_string();
        let res = tokio::task::spawn_blocking(move || match roots.owner(&id)? {
            // A root recorded before owners were belongs to no caller: any close of its
            // context takes it.
            Some(o)
                if who.is_empty() || o.is(&who) || o == warden_sandbox::RootOwner::Unrecorded =>
            {
                roots.remove(&id).map(|()| true)
            }
            _ => Ok(false),
        })
        .await;
        match res {
            Ok(Ok(true)) => {
                tracing::info!(context_id, "removed the ended conversation's sandbox");
                true
            }
            Ok(Ok(false)) => false,
            Ok(Err(e)) => {
                tracing::warn!(context_id, error = %e, "cannot remove the ended conversation's sandbox");
                false
            }
            Err(e) => {
                tracing::warn!(context_id, error = %e, "sandbox removal did not finish");
                false
            }
        }
    }

    /// Closes everything (shutdown); owned roots stay. The warm agents go first (their roots
    /// and homes with them: they are nobody's).
    pub async fn close_all(self: &Arc<Self>) {
        self.pool.drain().await;
        let ids: Vec<String> = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        let mut set = tokio::task::JoinSet::new();
        for id in ids {
            let me = self.clone();
            // A stop of the supervisor is not the end of the conversation: its root stays for
            // the context's next task after the restart.
            set.spawn(async move { me.close_as(&id, Ending::Shutdown, "").await });
        }
        while set.join_next().await.is_some() {}
    }

    pub async fn conversations(&self) -> Vec<Arc<Conversation>> {
        let slots: Vec<Arc<Slot>> = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let mut out = Vec::new();
        for s in slots {
            if let Ok(g) = s.conv.try_lock()
                && let Some(c) = g.as_ref()
            {
                out.push(c.clone());
            }
        }
        out
    }

    /// The Decide deadlines this supervisor uses now (`warden doctor` compares them with the
    /// approver's): `decide_deadline_ms.own` (the setting), `decide_deadline_ms.described` (what
    /// the policy service asks for; `none` when it did not say), `decide_deadline_ms.effective`,
    /// and `decide_deadline_ms.effective.<agent>` for each configured agent.
    async fn deadline_details(&self) -> HashMap<String, String> {
        let settings = self.shared.settings();
        let s = &*settings;
        let policy = &self.shared.policy;
        let mut out = HashMap::new();
        let own = std::time::Duration::from_millis(s.file.policy.decide_deadline_ms);
        let d = policy.effective_deadline(own, "").await;
        out.insert("decide_deadline_ms.own".into(), ms(d.own));
        out.insert(
            "decide_deadline_ms.described".into(),
            d.described.map(ms).unwrap_or_else(|| "none".into()),
        );
        out.insert("decide_deadline_ms.effective".into(), ms(d.effective));
        if let Some(desc) = policy.description().await {
            out.insert(
                "policy_implementation".into(),
                if desc.implementation.is_empty() {
                    "unnamed".into()
                } else {
                    desc.implementation
                },
            );
        }
        for (name, cfg) in &s.agents {
            let d = policy
                .effective_deadline(s.decide_deadline(cfg), name)
                .await;
            out.insert(
                format!("decide_deadline_ms.effective.{name}"),
                ms(d.effective),
            );
        }
        out
    }

    fn status(&self, count: usize) -> pb::StatusResponse {
        let mut details = HashMap::new();
        details.insert("conversations".to_string(), count.to_string());
        // `warden doctor`: which installed adapter each entry runs, or how to install it.
        for (name, cfg) in &self.shared.settings().agents {
            if let Some(found) = self.shared.settings().adapter(cfg) {
                let v = match found {
                    Ok(a) => format!("{} at {}", cfg.adapter, a.entry.display()),
                    Err(e) => format!("MISSING {e}"),
                };
                details.insert(format!("adapter.{name}"), v);
            }
        }
        details.insert(
            "live_agents".to_string(),
            self.shared.live.live().to_string(),
        );
        details.insert(
            "max_live_agents".to_string(),
            self.shared.live.cap().to_string(),
        );
        // Warm agents (counted among live_agents too) and each pool's figures.
        details.insert(
            "pooled_agents".to_string(),
            self.shared.live.pooled().to_string(),
        );
        details.extend(self.pool.figures());
        // Turns holding their slot and waiting for a live agent (all busy), and how many
        // principals they are of.
        let (agent_waiters, agent_waiting_principals) = self.shared.live.waiting();
        details.insert("turns_waiting_agent".to_string(), agent_waiters.to_string());
        details.insert(
            "principals_waiting_agent".to_string(),
            agent_waiting_principals.to_string(),
        );
        let limits = self.shared.settings().limits().clone();
        details.insert(
            "capacity_wait_ms".to_string(),
            limits.capacity_wait_ms.to_string(),
        );
        details.insert(
            "max_agent_waiters".to_string(),
            limits.max_agent_waiters.to_string(),
        );
        let (running, waiting, cap) = self.shared.admission.figures();
        details.insert("turns_running".to_string(), running.to_string());
        details.insert("turns_waiting_admission".to_string(), waiting.to_string());
        details.insert(
            "principals_waiting_admission".to_string(),
            self.shared.admission.principals_waiting().to_string(),
        );
        details.insert("max_active_turns".to_string(), cap.to_string());
        details.insert(
            "max_active_turns_per_principal".to_string(),
            self.shared.admission.share().to_string(),
        );
        let (starting, starts_waiting, starts_cap) = self.shared.starts.figures();
        details.insert("agents_starting".to_string(), starting.to_string());
        details.insert("starts_waiting".to_string(), starts_waiting.to_string());
        details.insert("max_starting_agents".to_string(), starts_cap.to_string());
        details.insert(
            "max_starting_agents_per_principal".to_string(),
            self.shared.starts.share().to_string(),
        );
        details.insert(
            "max_open_conversations_per_principal".to_string(),
            self.shared
                .settings()
                .max_open_conversations_per_principal()
                .to_string(),
        );
        details.insert(
            "policy_failures".to_string(),
            self.shared.policy.failures().to_string(),
        );
        let ((h50, h99), (d50, d99), total) = self.shared.policy.figures();
        details.insert("permissions".to_string(), total.to_string());
        details.insert("permission_handler_p50_us".to_string(), h50.to_string());
        details.insert("permission_handler_p99_us".to_string(), h99.to_string());
        details.insert("decide_p50_us".to_string(), d50.to_string());
        details.insert("decide_p99_us".to_string(), d99.to_string());
        details.insert(
            "bubblewrap".to_string(),
            self.shared.spawner.bwrap().is_some().to_string(),
        );
        details.insert(
            "cgroup".to_string(),
            self.shared.spawner.cgroups().is_some().to_string(),
        );
        // The uid agents run as: switched, or the supervisor's own ("self").
        details.insert(
            "agent_uid".to_string(),
            match self.shared.spawner.agent_identity() {
                Some(i) => i.uid.to_string(),
                None if !self
                    .shared
                    .settings()
                    .file
                    .sandbox
                    .agent_uid_range
                    .is_empty() =>
                {
                    "per-conversation".to_string()
                }
                None => "self".to_string(),
            },
        );
        warden_daemon::status::response(
            "warden-supervisor",
            self.started,
            self.listeners.lock().map(|l| l.clone()).unwrap_or_default(),
            details,
        )
    }
}

/// The gRPC face (cheap clone).
#[derive(Clone)]
pub struct Api(pub Arc<Supervisor>);

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::TurnEvent, Status>> + Send>>;

#[tonic::async_trait]
impl SupervisorService for Api {
    async fn open_conversation(
        &self,
        req: Request<pb::OpenConversationRequest>,
    ) -> Result<Response<pb::ConversationInfo>, Status> {
        let c = self.0.open(req.get_ref()).await?;
        // No turn follows this open: its agent is idle from now on.
        c.idle_if_unused();
        Ok(Response::new(c.info()))
    }

    async fn close_conversation(
        &self,
        req: Request<pb::CloseConversationRequest>,
    ) -> Result<Response<pb::CloseConversationResponse>, Status> {
        let r = req.get_ref();
        check_context_id(&r.context_id)?;
        Ok(Response::new(
            self.0.close(&r.context_id, &r.principal).await,
        ))
    }

    type RunTurnStream = EventStream;

    async fn run_turn(
        &self,
        req: Request<pb::RunTurnRequest>,
    ) -> Result<Response<Self::RunTurnStream>, Status> {
        let r = req.into_inner();
        check_context_id(&r.context_id)?;
        check_id("turn_id", &r.turn_id)?;
        let limit = self.0.shared.settings().limits().task_text_bytes;
        // Refused before anything starts: no conversation is opened, no agent spawned.
        if r.text.len() > limit {
            return Err(crate::fault::status(
                tonic::Code::InvalidArgument,
                pb::FaultClass::PromptTooLarge,
                format!(
                    "prompt-too-large: task text is {} bytes, the limit is {limit}",
                    r.text.len()
                ),
            ));
        }
        if r.text.trim().is_empty() {
            return Err(Status::invalid_argument("task text is empty"));
        }
        if r.instructions.len() > MAX_INSTRUCTIONS {
            return Err(Status::invalid_argument(format!(
                "instructions are {} bytes, the limit is {MAX_INSTRUCTIONS}",
                r.instructions.len()
            )));
        }
        let principal = r.open.as_ref().map(|o| o.principal.as_str()).unwrap_or("");
        let conv = match self.0.get(&r.context_id).await {
            Some(c)
                if !matches!(
                    c.st().status,
                    pb::ConversationState::Closed | pb::ConversationState::Failed
                ) =>
            {
                // A turn runs in its own principal's conversation only.
                if c.core.info.principal != principal {
                    return Err(not_yours(&r.context_id));
                }
                if let Some(open) = &r.open {
                    same_session_options(open, &c.core.info)?;
                }
                c
            }
            _ => {
                let mut open = r.open.clone().unwrap_or_default();
                if open.context_id.is_empty() {
                    open.context_id = r.context_id.clone();
                }
                if open.context_id != r.context_id {
                    return Err(Status::invalid_argument(
                        "open.context_id differs from context_id",
                    ));
                }
                self.0.open(&open).await?
            }
        };
        let (turn, rx) = TurnCtx::new(
            TurnInput {
                id: r.turn_id.clone(),
                text: r.text,
                instructions: r.instructions,
                message_id: r.message_id,
                span: tracing::info_span!("turn", task_id = %r.task_id, context_id = %r.context_id),
                task_id: r.task_id,
                timeout_secs: r.timeout_seconds as u64,
                groups: r.groups,
                issuer: r.issuer,
            },
            self.0.shared.settings().limits().output_bytes,
        );
        let queued = conv.enqueue(turn.clone());
        // An agent started by this call's open stays busy until its turn is queued (or refused).
        conv.idle_if_unused();
        let pos = queued?;
        if pos > 0 {
            turn.emit(Event::Queued(pb::TurnQueued {
                position: pos as u32,
                admission: false,
                agent: false,
            }));
        }
        // Sent in batches: a permission's three events in one frame (see `batch`).
        Ok(Response::new(Box::pin(crate::batch::Batched::new(
            UnboundedReceiverStream::new(rx),
            crate::batch::EVENT_WINDOW,
        ))))
    }

    type AttachTurnStream = EventStream;

    async fn attach_turn(
        &self,
        req: Request<pb::AttachTurnRequest>,
    ) -> Result<Response<Self::AttachTurnStream>, Status> {
        let r = req.into_inner();
        check_context_id(&r.context_id)?;
        check_id("turn_id", &r.turn_id)?;
        let unknown =
            || Status::not_found(format!("no turn {:?} in {:?}", r.turn_id, r.context_id));
        let conv = self.0.get(&r.context_id).await.ok_or_else(unknown)?;
        // Another principal's conversation does not exist for this caller.
        if conv.core.info.principal != r.principal {
            return Err(not_yours(&r.context_id));
        }
        let turn = conv.turn_to_attach(&r.turn_id).ok_or_else(unknown)?;
        let rx = turn.attach(r.after_seq).ok_or_else(|| {
            Status::out_of_range(format!(
                "the events of turn {:?} after {} are no longer held",
                r.turn_id, r.after_seq
            ))
        })?;
        tracing::info!(context_id = %r.context_id, turn_id = %r.turn_id, after_seq = r.after_seq, "a caller attached to a turn");
        Ok(Response::new(Box::pin(crate::batch::Batched::new(
            UnboundedReceiverStream::new(rx),
            crate::batch::EVENT_WINDOW,
        ))))
    }

    async fn answer_question(
        &self,
        req: Request<pb::AnswerQuestionRequest>,
    ) -> Result<Response<pb::AnswerQuestionResponse>, Status> {
        let r = req.into_inner();
        check_context_id(&r.context_id)?;
        let resp = match r.action.as_str() {
            "accept" => {
                let content = if r.content_json.is_empty() {
                    serde_json::Value::Object(Default::default())
                } else {
                    serde_json::from_str(&r.content_json).map_err(|e| {
                        Status::invalid_argument(format!("content_json is not JSON: {e}"))
                    })?
                };
                warden_acp::ElicitationResponse::Accept {
                    content,
                    message_id: (!r.message_id.is_empty()).then(|| r.message_id.clone()),
                }
            }
            "decline" => warden_acp::ElicitationResponse::Decline,
            "cancel" => warden_acp::ElicitationResponse::Cancel,
            other => {
                return Err(Status::invalid_argument(format!(
                    "action must be accept, decline or cancel, not {other:?}"
                )));
            }
        };
        let delivered = match self.0.get(&r.context_id).await {
            Some(c) => c.answer_question(&r.turn_id, &r.question_id, resp),
            None => false,
        };
        Ok(Response::new(pb::AnswerQuestionResponse { delivered }))
    }

    async fn cancel_turn(
        &self,
        req: Request<pb::CancelTurnRequest>,
    ) -> Result<Response<pb::CancelTurnResponse>, Status> {
        let r = req.into_inner();
        check_context_id(&r.context_id)?;
        check_id("turn_id", &r.turn_id)?;
        let outcome = match self.0.get(&r.context_id).await {
            Some(c) => c.cancel_turn(&r.turn_id),
            None => {
                let mut m = self
                    .0
                    .early_cancels
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if m.len() < 4096 {
                    let v = m.entry(r.context_id.clone()).or_default();
                    if v.len() < 64 {
                        v.push(r.turn_id.clone());
                    }
                }
                "pending"
            }
        };
        Ok(Response::new(pb::CancelTurnResponse {
            outcome: outcome.into(),
        }))
    }

    async fn list_conversations(
        &self,
        req: Request<pb::ListConversationsRequest>,
    ) -> Result<Response<pb::ListConversationsResponse>, Status> {
        let p = &req.get_ref().principal;
        let conversations = self
            .0
            .conversations()
            .await
            .into_iter()
            .filter(|c| p.is_empty() || &c.core.info.principal == p)
            .map(|c| c.info())
            .collect();
        Ok(Response::new(pb::ListConversationsResponse {
            conversations,
        }))
    }

    async fn list_workspaces(
        &self,
        _req: Request<pb::ListWorkspacesRequest>,
    ) -> Result<Response<pb::ListWorkspacesResponse>, Status> {
        use std::os::unix::fs::MetadataExt;
        let settings = self.0.shared.settings();
        let s = &*settings;
        let mut workspaces = Vec::new();
        for (name, w) in &s.file.workspaces {
            // The same rule an open applies: a workspace it would refuse is not offered.
            let Ok(b) = self.0.shared.workspaces.validate(
                &w.path,
                w.allow_execute,
                warden_sandbox::Profile::ReadOnly,
            ) else {
                tracing::warn!(workspace = %name, path = %w.path.display(), "configured workspace refused; not listed");
                continue;
            };
            let identity = std::fs::metadata(&b.root)
                .map(|m| format!("{}:{}", m.dev(), m.ino()))
                .unwrap_or_default();
            workspaces.push(pb::WorkspaceInfo {
                name: name.clone(),
                path: b.root.to_string_lossy().into_owned(),
                allow_execute: w.allow_execute,
                identity,
            });
        }
        Ok(Response::new(pb::ListWorkspacesResponse { workspaces }))
    }

    async fn list_agents(
        &self,
        _req: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, Status> {
        let settings = self.0.shared.settings();
        let s = &*settings;
        let agents = s
            .agents
            .iter()
            .filter(|(_, a)| a.enabled)
            .map(|(name, a)| {
                // What `warden agents` shows and the card leaves off: the adapter or program
                // looked up now (an adapter may be installed after the supervisor started).
                let (runs, unavailable) = match s.adapter(a) {
                    Some(Ok(found)) => (
                        format!("adapter {} at {}", a.adapter, found.entry.display()),
                        String::new(),
                    ),
                    Some(Err(e)) => (format!("adapter {}", a.adapter), e),
                    None => match s.agent_program(a) {
                        Ok(p) if a.command.is_empty() => {
                            (format!("program {}", p.display()), String::new())
                        }
                        Ok(_) => match crate::config::find_program(&a.command) {
                            Ok(p) => (format!("program {}", p.display()), String::new()),
                            Err(e) => (format!("program {}", a.command), e),
                        },
                        Err(e) => (String::new(), e),
                    },
                };
                pb::AgentInfo {
                    name: name.clone(),
                    description: a.description.clone(),
                    runs,
                    unavailable,
                }
            })
            .collect();
        Ok(Response::new(pb::ListAgentsResponse {
            agents,
            default_agent: s.file.agents.default.clone(),
            agent_uids: self
                .0
                .shared
                .spawner
                .agent_uid_ranges()
                .into_iter()
                .map(|(first, last)| pb::UidRange { first, last })
                .collect(),
            supervisor_uid: nix::unistd::getuid().as_raw(),
            task_text_bytes: u32::try_from(s.limits().task_text_bytes).unwrap_or(u32::MAX),
        }))
    }

    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let n = self.0.conversations().await.len();
        let mut st = self.0.status(n);
        st.details.extend(self.0.deadline_details().await);
        self.0.shared.reloads.details(&mut st.details);
        Ok(Response::new(st))
    }
}

#[tonic::async_trait]
impl AdminService for Api {
    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let n = self.0.conversations().await.len();
        let mut st = self.0.status(n);
        st.details.extend(self.0.deadline_details().await);
        self.0.shared.reloads.details(&mut st.details);
        Ok(Response::new(st))
    }

    async fn audit_query(
        &self,
        _req: Request<pb::AuditQueryRequest>,
    ) -> Result<Response<pb::AuditQueryResponse>, Status> {
        Err(Status::unimplemented("audit records live in warden-policy"))
    }

    /// What SIGHUP runs (`main.rs` sets it): the agents, workspaces and limits that can change
    /// while conversations run, from a configuration that loads whole.
    async fn reload(
        &self,
        _req: Request<pb::ReloadRequest>,
    ) -> Result<Response<pb::ReloadResponse>, Status> {
        Ok(Response::new(
            self.0.shared.reloads.reload("admin Reload").await,
        ))
    }

    type AuditFollowStream = futures::stream::Empty<Result<pb::AuditFollowEvent, Status>>;

    async fn audit_follow(
        &self,
        _req: Request<pb::AuditFollowRequest>,
    ) -> Result<Response<Self::AuditFollowStream>, Status> {
        Err(Status::unimplemented("audit records live in warden-policy"))
    }
}

fn ms(d: std::time::Duration) -> String {
    d.as_millis().to_string()
}
