//! One turn of a conversation, from the worker taking it to its last event: admission, the
//! prompt driven against the agent, each ACP event translated and forwarded, the mode judged,
//! the root's changes measured, the turn finished with its stop.
//!
//! Owns: what a running turn does and how it ends. Must never: run two turns of a conversation
//! at once, or end a turn without its final event.

use super::*;

impl Conversation {
    pub(super) async fn run_turn(&self, turn: Arc<TurnCtx>) {
        let started = Instant::now();
        let limits = self.shared.settings().limits().clone();
        let timeout_secs = if turn.input.timeout_secs == 0 {
            limits.turn_timeout_secs
        } else {
            turn.input.timeout_secs
        };
        match self
            .shared
            .records
            .transcript(&self.core.info.context_id, turn.id())
        {
            Ok(t) => turn.lock().transcript = Some(t),
            Err(e) => tracing::warn!(error = %e, "cannot open transcript"),
        }
        // A turn slot first (admission across all conversations), in order, telling the caller
        // its place while it waits; a cancel while waiting ends the turn without running it.
        let permit = if turn.cancel.is_cancelled() {
            None
        } else {
            self.admit(&turn).await
        };
        let stop = match &permit {
            Some(_) if !turn.cancel.is_cancelled() => self.drive(&turn, timeout_secs).await,
            _ => Stop::reason("cancelled"),
        };
        self.finish(&turn, stop, started, timeout_secs);
        drop(permit);
    }

    /// Waits for the turn's slot (`admission`), telling the caller its place. Meanwhile this
    /// conversation's agent is idle and may be asked to make room for a turn that holds a slot
    /// and waits for an agent: it is stopped then (restarted once this turn is admitted), so
    /// the two limits never wait on each other. None when the turn was cancelled first.
    async fn admit(&self, turn: &Arc<TurnCtx>) -> Option<crate::admission::Permit> {
        let ctx = &self.core.info.context_id;
        let admit = self
            .shared
            .admission
            .admit(&self.core.info.principal, &turn.end, |position| {
                turn.emit(Event::Queued(pb::TurnQueued {
                    position: u32::try_from(position).unwrap_or(u32::MAX),
                    admission: true,
                    agent: false,
                }))
            });
        tokio::pin!(admit);
        let evict = self.shared.live.evict_token(ctx);
        let mut stopped = false;
        let permit = loop {
            tokio::select! {
                p = &mut admit => break p,
                _ = async {
                    match &evict {
                        Some(t) => t.cancelled().await,
                        None => std::future::pending().await,
                    }
                }, if !stopped => {
                    stopped = true;
                    self.idle_stop().await;
                }
            }
        };
        if permit.is_some() {
            if !stopped && evict.as_ref().is_some_and(|t| t.is_cancelled()) {
                // Asked to make room just as the slot came: the start that asked counts on it.
                self.idle_stop().await;
            }
            // A busy agent is never stopped to make room.
            self.shared.live.set_busy(ctx, true);
        }
        permit
    }

    async fn drive(&self, turn: &Arc<TurnCtx>, timeout_secs: u64) -> Stop {
        let mut guard = self.proc_.lock().await;
        let mut context_reset = false;
        if guard.is_none() {
            // Idle-stopped (or killed by an earlier turn, or opened while every agent was
            // busy): start it, never silently losing context (session/load of the last
            // session, when there was one).
            let resume = self.last_session.lock().is_ok_and(|s| !s.is_empty());
            match self.start_agent(resume, Some(turn)).await {
                Ok((p, reset)) => {
                    *guard = Some(p);
                    self.st().status = pb::ConversationState::Ready;
                    context_reset = reset;
                }
                Err(_) if turn.end.is_cancelled() => {
                    self.give_back_uid().await;
                    return match turn.end_reason() {
                        Some(EndRequest::Decision {
                            fault: Some((c, m)),
                        }) => Stop::fault(c, m),
                        _ => Stop::reason("cancelled"),
                    };
                }
                Err(e) => {
                    // A failed start holds nothing until the next turn tries again.
                    self.give_back_uid().await;
                    return Stop::fault(e.class(), e.to_string());
                }
            }
        }
        let Some(p) = guard.as_mut() else {
            return Stop::fault(pb::FaultClass::Internal, "agent missing");
        };
        let session_id = self.core.live().session_id.clone();
        // Updates that arrived between turns are not this turn's output; a mode change among
        // them is still checked (an agent may elevate itself while idle).
        let mut idle_mode = self.early_mode.lock().ok().and_then(|mut m| m.take());
        while let Ok(ev) = p.events.try_recv() {
            if let AcpEvent::Update(n) = &ev
                && n.session_id == session_id
                && let SessionEvent::CurrentModeUpdate { current_mode_id } = &n.event
            {
                idle_mode = Some(current_mode_id.clone());
            }
        }
        turn.emit(Event::Started(pb::TurnStarted {
            session_id: session_id.clone(),
            root: self.core.info.root.to_string_lossy().into_owned(),
        }));
        if self
            .ended_before
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            turn.emit(Event::ContextReset(pb::ContextReset {
                reason: "this context's earlier conversation ended (closed by its owner, or after being idle); this turn starts a new agent session without the earlier context".into(),
            }));
        } else if context_reset {
            turn.emit(Event::ContextReset(pb::ContextReset {
                reason: "the agent was restarted and could not load its previous session; this turn starts a new session without the earlier context".into(),
            }));
        }
        self.core.live().turn = Some(turn.clone());
        let early = match idle_mode {
            Some(m) => self.on_mode(p, turn, &session_id, m).await,
            None => None,
        };
        let before = self.root_snapshot().await;
        self.take_baseline(before.as_ref()).await;
        let stop = match early {
            Some(out) => out,
            None => self.drive_inner(p, turn, &session_id, timeout_secs).await,
        };
        self.core.live().turn = None;
        turn.cancel.cancel();
        turn.cancel_questions();
        if stop.kill {
            // What the agent said on stderr before it died goes into the (bounded) transcript,
            // never into the incident record.
            if let (Some((class, _)), Some(p)) = (&stop.stop.fault, guard.as_ref())
                && matches!(class, pb::FaultClass::Crash | pb::FaultClass::Protocol)
            {
                let tail = p.stderr.lock().map(|r| r.text()).unwrap_or_default();
                turn.record("agent_stderr_tail", json!({ "text": tail }));
            }
            self.kill_terminals().await;
            let mut proc_ = guard.take();
            if let Some(pr) = proc_.as_mut() {
                let r = pr.kill(&self.shared).await;
                if let Ok(mut k) = self.last_kill.lock() {
                    *k = r;
                }
            }
            let mut st = self.st();
            if stop.fail_conversation {
                st.status = pb::ConversationState::Failed;
            } else if st.status == pb::ConversationState::Ready {
                st.status = pb::ConversationState::IdleStopped;
            }
        }
        // After the kill, if there was one: nothing of the tree writes any more.
        let after = self.root_snapshot().await;
        let changed_any = match (&before, &after) {
            (Some(b), Some(a)) => !b.changed(a).is_empty(),
            _ => true,
        };
        if changed_any && let Some(a) = &after {
            turn.lock().patch = self.patch_now(a.clone()).await;
        }
        turn.lock().files_changed = match (before, after) {
            (Some(b), Some(a)) => {
                let mut changed: Vec<String> = b
                    .changed(&a)
                    .into_iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .collect();
                let over = changed.len() > FILES_CHANGED_MAX;
                changed.truncate(FILES_CHANGED_MAX);
                (changed, over)
            }
            _ => (Vec::new(), true),
        };
        if stop.kill {
            // The agent is gone until the next turn: so is its uid (after the walk above).
            self.give_back_uid().await;
        }
        stop.stop
    }

    /// At the conversation's first turn (the first whose root could be walked): the root's
    /// content, the baseline of every later turn's diff.
    async fn take_baseline(&self, snap: Option<&warden_containment::beneath::Snapshot>) {
        let Some(snap) = snap else { return };
        if self.baseline.lock().map(|b| b.is_some()).unwrap_or(true) {
            return;
        }
        let core = self.core.clone();
        let snap = snap.clone();
        let taken = tokio::task::spawn_blocking(move || {
            core.files().map(|r| crate::patch::Baseline::take(&r, snap))
        })
        .await
        .ok()
        .flatten();
        if let (Some(b), Ok(mut slot)) = (taken, self.baseline.lock()) {
            *slot = Some(Arc::new(b));
        }
    }

    /// The conversation's change so far: the baseline against the root as `now` shows it.
    async fn patch_now(
        &self,
        now: warden_containment::beneath::Snapshot,
    ) -> Option<crate::patch::Patch> {
        let base = self.baseline.lock().ok()?.clone()?;
        let core = self.core.clone();
        tokio::task::spawn_blocking(move || base.patch(&*core.files()?, &now))
            .await
            .ok()
            .flatten()
    }

    /// The root as it is now (off the runtime threads), or None when it cannot be walked.
    async fn root_snapshot(&self) -> Option<warden_containment::beneath::Snapshot> {
        let core = self.core.clone();
        tokio::task::spawn_blocking(move || {
            core.files().and_then(|r| r.snapshot(ROOT_SNAPSHOT_ENTRIES))
        })
        .await
        .ok()
        .flatten()
    }

    async fn drive_inner(
        &self,
        p: &mut AgentProc,
        turn: &Arc<TurnCtx>,
        session_id: &str,
        timeout_secs: u64,
    ) -> DriveOut {
        let meta = json!({"warden": {
            "messageId": turn.input.message_id,
            "taskId": turn.input.task_id,
            "turnId": turn.input.id,
            "budgetSeconds": timeout_secs,
        }});
        let budget_note = format!(
            "[warden] Time budget for this turn: {timeout_secs} s. Work within it; the turn is stopped at {} s.",
            timeout_secs * 12 / 10
        );
        let mut blocks = vec![json!({"type": "text", "text": turn.input.text})];
        if !turn.input.instructions.is_empty() {
            blocks.push(json!({"type": "text", "text": turn.input.instructions}));
        }
        if self.agent_cfg.budget_in_prompt {
            blocks.push(json!({"type": "text", "text": budget_note}));
        }
        // The transcript is workspace data (seed 004): it may hold the task text; incident
        // records never do.
        turn.record(
            "prompt",
            json!({"text": turn.input.text, "instructions": turn.input.instructions,
                   "message_id": turn.input.message_id,
                   "task_id": turn.input.task_id, "budget_secs": timeout_secs}),
        );
        let client = p.client.clone();
        let sid = session_id.to_string();
        let prompt = client.prompt_blocks(&sid, blocks, meta);
        tokio::pin!(prompt);
        let hard = tokio::time::sleep(Duration::from_millis(timeout_secs.saturating_mul(1200)));
        tokio::pin!(hard);
        let grace = self.shared.settings().limits().cancel_grace();
        let mut cancel_task: Option<
            tokio::task::JoinHandle<Result<warden_acp::CancelReport, AcpError>>,
        > = None;
        let mut events_open = true;
        loop {
            tokio::select! {
                biased;
                ev = p.events.recv(), if events_open => match ev {
                    Some(ev) => {
                        if let Some(out) = self.on_event(p, turn, session_id, ev).await {
                            return out;
                        }
                    }
                    None => events_open = false,
                },
                res = &mut prompt => {
                    // Everything the agent sent before its answer is already queued: drain it.
                    while let Ok(ev) = p.events.try_recv() {
                        if let Some(out) = self.on_event(p, turn, session_id, ev).await {
                            return out;
                        }
                    }
                    let cancelled = turn.end_reason();
                    return match (res, cancelled) {
                        (_, Some(end)) => self.ended(end),
                        (Ok(r), None) => DriveOut::keep(Stop::reason(r.stop_reason.as_str())),
                        (Err(AcpError::Fault(f)), None) => DriveOut::kill(Stop::fault(translate::fault_class(&f), format!("the agent connection failed: {f}"))),
                        (Err(e), None) => DriveOut::keep(Stop::fault(pb::FaultClass::Protocol, format!("session/prompt failed: {e}"))),
                    };
                }
                _ = turn.end.cancelled(), if cancel_task.is_none() => {
                    match turn.end_reason() {
                        Some(EndRequest::OutputLimit) => {
                            return DriveOut::kill(Stop::fault(pb::FaultClass::OutputLimit, format!(
                                "retained output passed {} bytes", self.shared.settings().limits().output_bytes)));
                        }
                        Some(EndRequest::ModeEscalation(m)) => {
                            let mut o = DriveOut::kill(Stop::fault(pb::FaultClass::ModeEscalation, m));
                            o.fail_conversation = true;
                            return o;
                        }
                        // A flood is not cancelled politely: the agent is stopped at once.
                        Some(EndRequest::RequestLimit(m)) => {
                            return DriveOut::kill(Stop::fault(pb::FaultClass::RequestLimit, m));
                        }
                        _ => {}
                    }
                    // Cancel: our pending permission handlers answer `cancelled` (they watch
                    // turn.cancel), then session/cancel, then wait for the prompt response.
                    turn.cancel.cancel();
                    turn.cancel_questions();
                    let c = client.clone();
                    let s = sid.clone();
                    cancel_task = Some(tokio::spawn(async move { c.cancel_with_deadline(&s, grace).await }));
                    if self.stopping.is_cancelled() {
                        return self.ended(turn.end_reason().unwrap_or(EndRequest::Cancel));
                    }
                }
                _ = self.stopping.cancelled(), if cancel_task.is_some() => {
                    // A stop arrived while the cancel grace ran: the kill goes now.
                    return self.ended(turn.end_reason().unwrap_or(EndRequest::Cancel));
                }
                r = async {
                    match cancel_task.as_mut() {
                        Some(h) => h.await,
                        None => std::future::pending().await,
                    }
                }, if cancel_task.is_some() => {
                    let expired = matches!(r, Ok(Ok(ref rep)) if rep.outcome == CancelOutcome::DeadlineExpired)
                        || matches!(r, Ok(Ok(ref rep)) if matches!(rep.outcome, CancelOutcome::PromptEnded(PromptEnd::Fault(_))))
                        || matches!(r, Ok(Err(_)) | Err(_));
                    if expired {
                        let end = turn.end_reason().unwrap_or(EndRequest::Cancel);
                        tracing::info!(context_id = %self.core.info.context_id, turn_id = %turn.id(), "agent did not end the turn within the cancel grace: killing it");
                        return self.ended(end);
                    }
                    // Otherwise the prompt response is (about to be) there; keep looping for it.
                    // Guard against a cancel task that finished while the prompt never answers.
                    if tokio::time::timeout(grace, &mut prompt).await.is_err() {
                        let end = turn.end_reason().unwrap_or(EndRequest::Cancel);
                        return self.ended(end);
                    }
                    while let Ok(ev) = p.events.try_recv() {
                        let _ = self.on_event(p, turn, session_id, ev).await;
                    }
                    let end = turn.end_reason().unwrap_or(EndRequest::Cancel);
                    return self.ended(end);
                }
                _ = &mut hard => {
                    return DriveOut::kill(Stop::fault(pb::FaultClass::Timeout, format!(
                        "no end of turn within the hard cutoff of {} s (1.2 x {timeout_secs} s)", timeout_secs * 12 / 10)));
                }
            }
        }
    }

    fn ended(&self, end: EndRequest) -> DriveOut {
        let stop = match end {
            EndRequest::Cancel => Stop::reason("cancelled"),
            EndRequest::Decision {
                fault: Some((c, m)),
            } => Stop::fault(c, m),
            EndRequest::Decision { fault: None } => Stop::reason("cancelled"),
            EndRequest::OutputLimit => {
                return DriveOut::kill(Stop::fault(
                    pb::FaultClass::OutputLimit,
                    format!(
                        "retained output passed {} bytes",
                        self.shared.settings().limits().output_bytes
                    ),
                ));
            }
            EndRequest::ModeEscalation(m) => {
                let mut o = DriveOut::kill(Stop::fault(pb::FaultClass::ModeEscalation, m));
                o.fail_conversation = true;
                return o;
            }
            EndRequest::RequestLimit(m) => {
                return DriveOut::kill(Stop::fault(pb::FaultClass::RequestLimit, m));
            }
        };
        // The design's cancel sequence ends with a kill: whatever the agent started for the
        // cancelled turn (tools, setsid'ed helpers) must not outlive it. The next turn restarts
        // the agent (session/load when supported).
        DriveOut {
            stop,
            kill: true,
            fail_conversation: false,
        }
    }

    /// Forwards one agent event to the turn. `Some` ends the turn.
    async fn on_event(
        &self,
        p: &mut AgentProc,
        turn: &Arc<TurnCtx>,
        session_id: &str,
        ev: AcpEvent,
    ) -> Option<DriveOut> {
        let n = match ev {
            AcpEvent::Update(n) => n,
            AcpEvent::ProtocolError(e) => {
                turn.record("protocol_error", json!({"error": e}));
                return None;
            }
            AcpEvent::Fault(f) => {
                if turn.end_reason().is_some() {
                    return Some(self.ended(turn.end_reason().unwrap_or(EndRequest::Cancel)));
                }
                return Some(DriveOut::kill(Stop::fault(
                    translate::fault_class(&f),
                    format!("the agent connection failed: {f}"),
                )));
            }
        };
        if n.session_id != session_id {
            return None;
        }
        match n.event {
            SessionEvent::AgentMessageChunk(c) | SessionEvent::AgentThoughtChunk(c)
                if c.content.as_text().is_none() => {}
            SessionEvent::AgentMessageChunk(c) => {
                let text = c.content.as_text().unwrap_or_default().to_string();
                // The chunk's `_meta` travels as JSON text for the gateway (artifact and A2A
                // hints); it is agent output, so it counts against the output limit too.
                let meta_json = translate::chunk_meta_json(&c);
                turn.add_output(text.len() + meta_json.len());
                turn.record("message", json!({"text": text}));
                turn.emit(Event::MessageChunk(pb::TextChunk { text, meta_json }));
            }
            SessionEvent::AgentThoughtChunk(c) => {
                let text = c.content.as_text().unwrap_or_default().to_string();
                let meta_json = translate::chunk_meta_json(&c);
                turn.add_output(text.len() + meta_json.len());
                turn.record("thought", json!({"text": text}));
                turn.emit(Event::ThoughtChunk(pb::TextChunk { text, meta_json }));
            }
            SessionEvent::ToolCall(tc) => {
                let ev = translate::tool_call(tc);
                turn.add_output(ev.content_text.len() + ev.raw_input_json.len());
                turn.lock().tools.insert(
                    ev.tool_call_id.clone(),
                    ToolSeen {
                        kind: ev.kind.clone(),
                        title: ev.title.clone(),
                        locations: ev.locations.clone(),
                        raw_input_json: ev.raw_input_json.clone(),
                    },
                );
                turn.record(
                    "tool_call",
                    json!({"id": ev.tool_call_id, "kind": ev.kind, "title": ev.title}),
                );
                turn.emit(Event::ToolCall(ev));
            }
            SessionEvent::ToolCallUpdate(u) => {
                let ev = translate::tool_call_update(u);
                turn.add_output(ev.content_text.len() + ev.raw_input_json.len());
                {
                    // What the update sent replaces what was seen; what it left out stays.
                    let mut st = turn.lock();
                    let seen = st.tools.entry(ev.tool_call_id.clone()).or_default();
                    if !ev.kind.is_empty() {
                        seen.kind = ev.kind.clone();
                    }
                    if !ev.title.is_empty() {
                        seen.title = ev.title.clone();
                    }
                    if !ev.locations.is_empty() {
                        seen.locations = ev.locations.clone();
                    }
                    if !ev.raw_input_json.is_empty() {
                        seen.raw_input_json = ev.raw_input_json.clone();
                    }
                }
                turn.record(
                    "tool_call_update",
                    json!({"id": ev.tool_call_id, "status": (!ev.status.is_empty()).then_some(&ev.status)}),
                );
                turn.emit(Event::ToolCall(ev));
            }
            SessionEvent::Plan(entries) => {
                turn.emit(Event::Plan(translate::plan(entries)));
            }
            SessionEvent::UsageUpdate(u) => {
                let usage = {
                    let mut st = turn.lock();
                    st.usage.context_used = u.used;
                    st.usage.context_size = u.size;
                    st.usage
                };
                turn.emit(Event::Usage(usage));
            }
            SessionEvent::CurrentModeUpdate { current_mode_id } => {
                return self.on_mode(p, turn, session_id, current_mode_id).await;
            }
            // Adapters also publish the mode as a config option; a change seen only there is
            // still a mode change.
            SessionEvent::ConfigOptionUpdate(options) => {
                if let Some(mode) = translate::mode_from_config_options(&options) {
                    return self.on_mode(p, turn, session_id, mode).await;
                }
            }
            _ => {}
        }
        None
    }

    /// A mode change reported by the agent. An elevated mode that no ALLOW decision led to is
    /// a fault: the supervised mode is set back, or the conversation ends.
    async fn on_mode(
        &self,
        p: &mut AgentProc,
        turn: &Arc<TurnCtx>,
        session_id: &str,
        mode: String,
    ) -> Option<DriveOut> {
        let judged = {
            let mut l = self.core.live();
            let switches = turn.lock().allowed_switches.clone();
            let j = mode::judge(
                &l.agent_mode,
                &mode,
                |m| self.agent_cfg.is_supervised_mode(m),
                &switches,
            );
            if j != ModeJudgement::Unchanged {
                l.agent_mode = mode.clone();
                l.current_mode = mode.clone();
            }
            j
        };
        if judged == ModeJudgement::Unchanged {
            return None;
        }
        let supervised = judged == ModeJudgement::Supervised;
        turn.record("mode", json!({"mode": mode, "supervised": supervised}));
        turn.emit(Event::ModeChange(pb::ModeChange {
            mode_id: mode.clone(),
            supervised,
            by_supervisor: false,
        }));
        match judged {
            ModeJudgement::Unchanged | ModeJudgement::Supervised => return None,
            ModeJudgement::Allowed(i) => {
                turn.lock().allowed_switches.remove(i);
                return None;
            }
            ModeJudgement::Escalation => {}
        }
        let want = self.agent_cfg.supervised_mode.clone();
        let msg = format!(
            "the agent switched itself to the elevated mode {mode:?} without an allowing decision"
        );
        tracing::warn!(context_id = %self.core.info.context_id, mode = %mode, "mode escalation");
        self.incident(
            pb::FaultClass::ModeEscalation,
            &msg,
            turn,
            turn.input.timeout_secs,
        );
        turn.emit(Event::Fault(fault::fault(
            pb::FaultClass::ModeEscalation,
            msg.clone(),
        )));
        let hs = self.shared.settings().limits().handshake();
        let restored = !want.is_empty()
            && matches!(
                tokio::time::timeout(hs, p.client.set_mode(session_id, &want)).await,
                Ok(Ok(()))
            );
        if restored {
            {
                // The agent is in `want` now, whether or not it echoes it: a second escalation
                // to the same mode must be seen as a change again.
                let mut l = self.core.live();
                l.current_mode = want.clone();
                l.agent_mode = want.clone();
            }
            turn.emit(Event::ModeChange(pb::ModeChange {
                mode_id: want,
                supervised: true,
                by_supervisor: true,
            }));
            return None;
        }
        let mut o = DriveOut::kill(Stop::fault(
            pb::FaultClass::ModeEscalation,
            format!("{msg}; the supervised mode could not be restored, the conversation is ended"),
        ));
        o.fail_conversation = true;
        Some(o)
    }

    fn incident(
        &self,
        class: pb::FaultClass,
        reason: &str,
        turn: &TurnCtx,
        budget_secs: u64,
    ) -> String {
        let transcript = turn
            .lock()
            .transcript
            .as_ref()
            .map(|t| t.path().to_string_lossy().into_owned())
            .unwrap_or_default();
        let inc = Incident {
            class: fault::name(class).into(),
            reason: reason.into(),
            stderr_tail: String::new(),
            agent: self.core.info.agent.clone(),
            verb: self.core.info.verb.clone(),
            profile: self.core.info.profile.as_str().into(),
            budget_secs,
            transcript_path: transcript,
            context_label: label(&self.core.info.context_id),
            turn_label: label(turn.id()),
            at_unix_ms: now_ms(),
        };
        match self.shared.records.incident(&inc) {
            Ok(p) => p.to_string_lossy().into_owned(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot write incident record");
                String::new()
            }
        }
    }

    fn finish(&self, turn: &Arc<TurnCtx>, stop: Stop, started: Instant, timeout_secs: u64) {
        let duration = started.elapsed();
        if let Some((class, msg)) = &stop.fault {
            // No agent free within the wait is not the agent's fault: no incident (as at open).
            if *class != pb::FaultClass::Capacity {
                self.incident(*class, msg, turn, timeout_secs);
            }
            turn.emit(Event::Fault(fault::fault(*class, msg.clone())));
        }
        let (
            refusals,
            permissions,
            usage,
            transcript_path,
            (files_changed, files_changed_unknown),
            patch,
        ) = {
            let mut st = turn.lock();
            let path = st
                .transcript
                .as_mut()
                .map(|t| {
                    t.record(
                        "stop",
                        &json!({"reason": stop.reason, "fault": stop.fault.as_ref().map(|f| fault::name(f.0))}),
                    );
                    t.finish();
                    t.path().to_string_lossy().into_owned()
                })
                .unwrap_or_default();
            (
                std::mem::take(&mut st.refusals),
                st.permissions,
                st.usage,
                path,
                std::mem::take(&mut st.files_changed),
                st.patch.take().unwrap_or_default(),
            )
        };
        let health = Health {
            at_unix_ms: now_ms(),
            agent: self.core.info.agent.clone(),
            verb: self.core.info.verb.clone(),
            profile: self.core.info.profile.as_str().into(),
            duration_ms: duration.as_millis() as u64,
            stop_reason: stop.reason.clone(),
            fault: stop.fault.as_ref().map(|f| fault::name(f.0).to_string()),
            refusals: refusals.len(),
            permissions,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens,
        };
        if let Err(e) = self.shared.records.health(&health) {
            tracing::warn!(error = %e, "health record refused");
        }
        tracing::info!(
            context_id = %self.core.info.context_id,
            turn_id = %turn.id(),
            task_id = %turn.input.task_id,
            stop_reason = %stop.reason,
            refusals = refusals.len(),
            duration_ms = duration.as_millis() as u64,
            "turn finished"
        );
        crate::metrics::turn_ended(
            &stop.reason,
            stop.fault.as_ref().map(|f| crate::fault::name(f.0)),
        );
        crate::metrics::turn_took(duration);
        turn.emit(Event::Stop(pb::TurnStop {
            stop_reason: stop.reason,
            refusals,
            fault: stop
                .fault
                .map(|(class, message)| fault::fault(class, message)),
            transcript_path,
            duration_millis: duration.as_millis() as u64,
            files_changed,
            files_changed_unknown,
            diff: patch.text,
            diff_files: patch.files,
            diff_cut: patch.cut,
        }));
    }
}

/// Entries of a root the supervisor walks before and after a turn to see what changed; a larger
/// root reports `files_changed_unknown`.
pub const ROOT_SNAPSHOT_ENTRIES: usize = 50_000;

/// Changed paths reported per turn at most.
pub const FILES_CHANGED_MAX: usize = 256;

/// What the drive loop decided.
struct DriveOut {
    stop: Stop,
    kill: bool,
    fail_conversation: bool,
}

impl DriveOut {
    fn keep(stop: Stop) -> Self {
        DriveOut {
            stop,
            kill: false,
            fail_conversation: false,
        }
    }

    fn kill(stop: Stop) -> Self {
        DriveOut {
            stop,
            kill: true,
            fail_conversation: false,
        }
    }
}
