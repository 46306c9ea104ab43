//! The gRPC faces of the registry: `SupervisorService` (to the gateway only) and `AdminService`
//! (status, audit, reload), each request checked and handed to [`Supervisor`].
//!
//! Owns: the requests' shapes and their checks. Must never: hold a conversation's state of its
//! own, or answer a principal about another's context.

use super::*;

/// The gRPC face (cheap clone).
#[derive(Clone)]
pub struct Api(pub Arc<Supervisor>);

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::TurnEvent, Status>> + Send>>;

/// A turn's events as a caller's stream, sent in batches: a permission's three events in one
/// frame (see `batch`).
fn batched(rx: crate::turn::EventRx) -> EventStream {
    Box::pin(crate::batch::Batched::new(
        UnboundedReceiverStream::new(rx),
        crate::batch::EVENT_WINDOW,
    ))
}

#[tonic::async_trait]
impl SupervisorService for Api {
    async fn open_conversation(
        &self,
        req: Request<pb::OpenConversationRequest>,
    ) -> Result<Response<pb::ConversationInfo>, Status> {
        let r = req.get_ref();
        let c = self
            .0
            .shared
            .fair
            .fair(&r.principal, self.0.open(r))
            .await?;
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
                self.0
                    .shared
                    .fair
                    .fair(&open.principal, self.0.open(&open))
                    .await?
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
        Ok(Response::new(batched(rx)))
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
        Ok(Response::new(batched(rx)))
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
