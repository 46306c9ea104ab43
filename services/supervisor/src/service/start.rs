//! Starting a conversation for the registry: its root copied or registered, its identity and
//! uid, its agent started (or a warm one adopted), and what a failed start leaves behind.
//!
//! Owns: the steps from an open request to a live conversation. Must never: leave a half-started
//! conversation registered, or start one for a context another principal holds.

use super::*;

impl Supervisor {
    /// The body of [`Supervisor::open`], with the conversation's slot locked.
    pub(super) async fn start_locked(
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
}
