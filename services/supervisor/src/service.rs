//! The conversation registry (single-flight open) and the gRPC services it serves:
//! `SupervisorService` (to the gateway only) and `AdminService` (status). The gRPC faces are
//! [`api`]'s, starting a conversation [`start`]'s, the status details [`status`]'s.

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

mod api;
mod start;
mod status;

pub use api::Api;

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
    check_bounded(what, s, MAX_ID)
}

/// A caller's string of at most `max` bytes and no control characters.
fn check_bounded(what: &str, s: &str, max: usize) -> Result<(), Status> {
    if s.len() > max {
        return Err(Status::invalid_argument(format!(
            "{what} is longer than {max} bytes"
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
    // Read-only asked of a conversation that may write: refused, never carried on writable
    // (the other way round it stays read-only, which asks nothing more of anyone).
    if open.profile == pb::Profile::ReadOnly as i32
        && info.profile != warden_sandbox::Profile::ReadOnly
    {
        return Err(Status::failed_precondition(
            "this conversation opened in mode edit (it may change its root); mode read-only or plan needs a new conversation (close this context or use another)",
        ));
    }
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
    check_bounded(what, s, MAX_OPTION)
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
}
