//! The agent -> supervisor side of one conversation: permissions go to the policy service
//! (never to the caller), questions go to the caller (never to the policy), `fs/*` is served
//! inside the boundary only.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use warden_acp::{
    ClientHandler, ElicitationRequest, ElicitationResponse, PermissionOutcome, PermissionRequest,
    ReadTextFileRequest, RpcError, WriteTextFileRequest,
};
use warden_proto::v1 as pb;
use warden_proto::v1::turn_event::Event;
use warden_rules::{OfferedOption, Outcome, choose_option};

use crate::policy::{PolicyClient, rules_verdict};
use crate::turn::{EndRequest, ToolSeen, TurnCtx};

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
    pub profile: pb::Profile,
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
    pub terminal: Option<crate::terminal::TerminalCtx>,
    pub terminals: crate::terminal::Terminals,
}

impl ConvCore {
    pub fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn turn(&self) -> Option<Arc<TurnCtx>> {
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
            Some(l) if !l.is_empty() => l
                .iter()
                .map(|l| pb::Location {
                    path: l.path.clone(),
                    line: l.line.map(|n| n.min(u32::MAX as u64) as u32),
                })
                .collect(),
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
            subject: Some(pb::Subject {
                principal: self.info.principal.clone(),
                context_id: self.info.context_id.clone(),
                task_id: turn.map(|t| t.input.task_id.clone()).unwrap_or_default(),
                session_id,
                agent: self.info.agent.clone(),
                verb: self.info.verb.clone(),
            }),
            boundary: Some(pb::Boundary {
                root: self.info.root.to_string_lossy().into_owned(),
                owned: self.info.owned,
                allow_execute: self.info.allow_execute,
                profile: self.info.profile as i32,
            }),
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
        }
    }

    /// The kill grace when terminals are served; `-32601` otherwise.
    fn terminal_enabled(&self, method: &str) -> Result<Duration, RpcError> {
        match &self.terminal {
            Some(t) => Ok(t.shared.settings.limits().kill_grace()),
            None => Err(RpcError::method_not_found(method)),
        }
    }

    fn resolve_inside(&self, path: &str) -> Result<PathBuf, RpcError> {
        let p = Path::new(path);
        if !p.is_absolute() {
            return Err(RpcError::invalid_params("path must be absolute"));
        }
        let fs = warden_containment::RealFs;
        match warden_containment::is_inside(&self.info.root, p, &fs) {
            Ok(true) => warden_containment::resolve(p, &self.info.root, &fs)
                .map_err(|e| RpcError::invalid_params(format!("path cannot be resolved: {e}"))),
            Ok(false) => Err(RpcError::invalid_params(
                "path is outside the session boundary",
            )),
            Err(e) => Err(RpcError::invalid_params(format!(
                "path cannot be resolved inside the boundary: {e}"
            ))),
        }
    }
}

fn cancelled_event(tc_id: &str, kind: &str, title: &str) -> Event {
    Event::Permission(pb::PermissionDecisionEvent {
        decision_id: String::new(),
        tool_call_id: tc_id.to_string(),
        tool_kind: kind.to_string(),
        tool_title: title.to_string(),
        verdict: pb::Verdict::Deny as i32,
        rule: "turn.cancelled".into(),
        reason: "the turn is being cancelled".into(),
        option_id_sent: String::new(),
        cancelled: true,
        end_turn: false,
        policy_latency_micros: 0,
    })
}

impl ClientHandler for ConvCore {
    async fn request_permission(
        &self,
        req: PermissionRequest,
    ) -> Result<PermissionOutcome, RpcError> {
        let entered = std::time::Instant::now();
        let turn = self.turn();
        let request_id = uuid::Uuid::new_v4().simple().to_string();
        let dreq = self.decide_request(&req, turn.as_deref(), request_id.clone());
        let (kind, title) = dreq
            .tool_call
            .as_ref()
            .map(|t| (t.kind.clone(), t.title.clone()))
            .unwrap_or_default();
        let tc_id = req.tool_call.tool_call_id.clone();
        let offered: Vec<OfferedOption> = req
            .options
            .iter()
            .map(|o| OfferedOption {
                id: o.option_id.clone(),
                name: o.name.clone(),
                kind: warden_rules::OptionKind::parse(o.kind.as_str()),
            })
            .collect();
        if let Some(t) = &turn {
            t.lock().permissions += 1;
            if t.cancel.is_cancelled() {
                t.emit(cancelled_event(&tc_id, &kind, &title));
                return Ok(PermissionOutcome::Cancelled);
            }
            t.record("permission_request", serde_json::json!({
                "request_id": request_id, "tool_call_id": tc_id, "kind": kind, "title": title,
                "options": req.options.iter().map(|o| serde_json::json!([o.option_id, o.kind.as_str()])).collect::<Vec<_>>(),
            }));
        }
        let decided = match &turn {
            Some(t) => {
                tokio::select! {
                    d = self.policy.decide(dreq, self.deadline) => d,
                    _ = t.cancel.cancelled() => {
                        t.emit(cancelled_event(&tc_id, &kind, &title));
                        return Ok(PermissionOutcome::Cancelled);
                    }
                }
            }
            None => self.policy.decide(dreq, self.deadline).await,
        };
        let answer = choose_option(
            rules_verdict(decided.verdict),
            decided.option_id.as_deref(),
            &offered,
            false,
        );
        let (outcome, sent, cancelled) = match &answer.outcome {
            Outcome::Selected(id) => (
                PermissionOutcome::Selected {
                    option_id: id.clone(),
                },
                id.clone(),
                false,
            ),
            // No refusal was offered: the only safe answer is to cancel the turn.
            Outcome::Cancelled | Outcome::CancelTurn => {
                (PermissionOutcome::Cancelled, String::new(), true)
            }
        };
        let allowed = answer.effective == warden_rules::Verdict::Allow;
        let verdict = if allowed {
            pb::Verdict::Allow
        } else if decided.verdict == pb::Verdict::Escalate {
            pb::Verdict::Escalate
        } else {
            pb::Verdict::Deny
        };
        let reason = if decided.verdict == pb::Verdict::Allow && !allowed {
            format!("{} ({})", decided.reason, answer.reason)
        } else {
            decided.reason.clone()
        };
        tracing::info!(
            context_id = %self.info.context_id,
            session_id = %req.session_id,
            task_id = %turn.as_ref().map(|t| t.input.task_id.as_str()).unwrap_or(""),
            request_id = %request_id,
            decision_id = %decided.decision_id,
            tool_call_id = %tc_id,
            verdict = ?verdict,
            rule = %decided.rule,
            option = %sent,
            latency_us = decided.latency.as_micros() as u64,
            "permission decided"
        );
        self.policy.record(entered.elapsed(), decided.latency);
        if let Some(t) = &turn {
            t.record("permission_decision", serde_json::json!({
                "decision_id": decided.decision_id, "verdict": verdict.as_str_name(),
                "rule": decided.rule, "reason": reason, "option_sent": sent, "cancelled": cancelled,
            }));
            if !allowed {
                t.lock().refusals.push(pb::Refusal {
                    decision_id: decided.decision_id.clone(),
                    tool_call_id: tc_id.clone(),
                    tool_kind: kind.clone(),
                    tool_title: title.clone(),
                    rule: decided.rule.clone(),
                    reason: reason.clone(),
                });
            } else if warden_rules::ToolKind::parse(&kind) == warden_rules::ToolKind::SwitchMode {
                t.lock().allowed_switches.push(sent.clone());
            } else if warden_rules::ToolKind::parse(&kind) == warden_rules::ToolKind::Execute {
                t.lock().allowed_exec += 1;
            }
            t.emit(Event::Permission(pb::PermissionDecisionEvent {
                decision_id: decided.decision_id.clone(),
                tool_call_id: tc_id,
                tool_kind: kind,
                tool_title: title,
                verdict: verdict as i32,
                rule: decided.rule.clone(),
                reason,
                option_id_sent: sent,
                cancelled,
                end_turn: decided.end_turn || cancelled,
                policy_latency_micros: decided.latency.as_micros() as u64,
            }));
            if decided.end_turn || cancelled {
                let fault = (decided.end_turn && decided.rule.contains("prompt-unavailable")
                    || decided.reason.starts_with("PERMISSION_PROMPT_UNAVAILABLE"))
                .then(|| {
                    (
                        "permission-prompt-unavailable".to_string(),
                        decided.reason.clone(),
                    )
                });
                t.request_end(EndRequest::Decision { fault });
            }
        }
        Ok(outcome)
    }

    async fn read_text_file(&self, req: ReadTextFileRequest) -> Result<String, RpcError> {
        let path = self.resolve_inside(&req.path)?;
        let text = tokio::fs::read_to_string(&path).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                RpcError::not_found(format!("no such file: {}", req.path))
            } else {
                RpcError::internal(format!("cannot read {}: {e}", req.path))
            }
        })?;
        if req.line.is_none() && req.limit.is_none() {
            return Ok(text);
        }
        let start = req.line.unwrap_or(1).saturating_sub(1) as usize;
        let limit = req.limit.map(|l| l as usize).unwrap_or(usize::MAX);
        Ok(text.split_inclusive('\n').skip(start).take(limit).collect())
    }

    async fn write_text_file(&self, req: WriteTextFileRequest) -> Result<(), RpcError> {
        if self.info.profile == pb::Profile::ReadOnly {
            return Err(RpcError::invalid_params(
                "this conversation is read-only: writes are refused",
            ));
        }
        let path = self.resolve_inside(&req.path)?;
        tokio::fs::write(&path, req.content.as_bytes())
            .await
            .map_err(|e| RpcError::internal(format!("cannot write {}: {e}", req.path)))
    }

    async fn create_terminal(
        &self,
        req: warden_acp::CreateTerminalRequest,
    ) -> Result<String, RpcError> {
        self.terminals.create(self, req).await
    }

    async fn terminal_output(
        &self,
        req: warden_acp::TerminalRequest,
    ) -> Result<warden_acp::TerminalOutputResponse, RpcError> {
        self.terminal_enabled("terminal/output")?;
        self.terminals.output(&req)
    }

    async fn wait_for_terminal_exit(
        &self,
        req: warden_acp::TerminalRequest,
    ) -> Result<warden_acp::TerminalExitStatus, RpcError> {
        self.terminal_enabled("terminal/wait_for_exit")?;
        self.terminals.wait(&req).await
    }

    async fn kill_terminal(&self, req: warden_acp::TerminalRequest) -> Result<(), RpcError> {
        let grace = self.terminal_enabled("terminal/kill")?;
        self.terminals.kill(&req.terminal_id, grace).await
    }

    async fn release_terminal(&self, req: warden_acp::TerminalRequest) -> Result<(), RpcError> {
        let grace = self.terminal_enabled("terminal/release")?;
        self.terminals.release(&req.terminal_id, grace).await
    }

    async fn elicitation(&self, req: ElicitationRequest) -> Result<ElicitationResponse, RpcError> {
        let Some(turn) = self.turn() else {
            return Ok(ElicitationResponse::Cancel);
        };
        if turn.cancel.is_cancelled() {
            return Ok(ElicitationResponse::Cancel);
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let (tx, rx) = tokio::sync::oneshot::channel();
        turn.lock().questions.insert(id.clone(), tx);
        turn.record("question", serde_json::json!({"question_id": id}));
        turn.emit(Event::Question(pb::Question {
            question_id: id.clone(),
            message: req.message.clone(),
            requested_schema_json: req
                .requested_schema
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_default(),
        }));
        let answer = tokio::select! {
            a = rx => a.unwrap_or(ElicitationResponse::Cancel),
            _ = turn.cancel.cancelled() => ElicitationResponse::Cancel,
        };
        turn.lock().questions.remove(&id);
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::{TurnCtx, TurnInput};

    fn core(root: &Path) -> ConvCore {
        ConvCore {
            info: ConvInfo {
                context_id: "ctx".into(),
                agent: "scripted".into(),
                principal: "p".into(),
                verb: "implement".into(),
                root: root.to_path_buf(),
                owned: true,
                allow_execute: false,
                profile: pb::Profile::WorkspaceWrite,
            },
            live: Mutex::new(Live {
                session_id: "s1".into(),
                current_mode: "default".into(),
                agent_mode: "default".into(),
                turn: None,
            }),
            policy: PolicyClient::new(&root.join("nothing.sock")),
            deadline: Duration::from_millis(50),
            terminal: None,
            terminals: Default::default(),
        }
    }

    fn request(v: serde_json::Value) -> PermissionRequest {
        serde_json::from_value(v).unwrap()
    }

    fn turn_with_seen(id: &str, path: &str) -> Arc<TurnCtx> {
        let (t, _rx) = TurnCtx::new(
            TurnInput {
                id: "t".into(),
                text: "x".into(),
                message_id: String::new(),
                task_id: "task-1".into(),
                timeout_secs: 1,
            },
            1024,
        );
        t.lock().tools.insert(
            id.into(),
            ToolSeen {
                kind: "edit".into(),
                title: "Write a".into(),
                locations: vec![pb::Location {
                    path: path.into(),
                    line: None,
                }],
                raw_input_json: "{\"file_path\":\"a\"}".into(),
            },
        );
        t
    }

    #[tokio::test]
    async fn locations_kind_and_title_are_merged_from_the_earlier_tool_call() {
        let dir = tempfile::tempdir().unwrap();
        let c = core(dir.path());
        let t = turn_with_seen("tc1", "/outside/secret");
        // Claude 0.16 style: the request carries only id and raw input.
        let req = request(serde_json::json!({"sessionId": "s1",
            "toolCall": {"toolCallId": "tc1"},
            "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}]}));
        let d = c.decide_request(&req, Some(&t), "r1".into());
        let tc = d.tool_call.unwrap();
        assert_eq!(tc.kind, "edit");
        assert_eq!(tc.title, "Write a");
        assert_eq!(tc.locations.len(), 1);
        assert_eq!(tc.locations[0].path, "/outside/secret");
        assert_eq!(d.subject.as_ref().unwrap().task_id, "task-1");
        assert_eq!(d.current_mode, "default");
        assert!(d.boundary.unwrap().owned);
    }

    #[tokio::test]
    async fn the_requests_own_locations_win_and_other_ids_are_not_merged() {
        let dir = tempfile::tempdir().unwrap();
        let c = core(dir.path());
        let t = turn_with_seen("tc1", "/inside");
        let req = request(serde_json::json!({"sessionId": "s1",
            "toolCall": {"toolCallId": "tc1", "kind": "delete", "locations": [{"path": "/other"}]},
            "options": []}));
        let tc = c
            .decide_request(&req, Some(&t), "r".into())
            .tool_call
            .unwrap();
        assert_eq!(tc.kind, "delete");
        assert_eq!(tc.locations[0].path, "/other");
        // A different id: nothing merged (an agent cannot borrow another call's locations).
        let req = request(serde_json::json!({"sessionId": "s1",
            "toolCall": {"toolCallId": "tc2"}, "options": []}));
        let tc = c
            .decide_request(&req, Some(&t), "r".into())
            .tool_call
            .unwrap();
        assert!(tc.locations.is_empty() && tc.kind.is_empty());
    }

    #[tokio::test]
    async fn fs_paths_outside_the_root_are_invalid_params() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();
        let c = core(&root);
        for p in [
            "/etc/passwd".to_string(),
            format!("{}/../x", root.display()),
            format!("{}/up/x", root.display()),
            "relative.txt".to_string(),
        ] {
            let e = c.resolve_inside(&p).unwrap_err();
            assert_eq!(e.code, -32602, "{p}");
        }
        assert!(
            c.resolve_inside(&format!("{}/new.txt", root.display()))
                .is_ok()
        );
    }

    #[tokio::test]
    async fn without_a_policy_a_permission_is_refused_with_an_offered_id() {
        let dir = tempfile::tempdir().unwrap();
        let c = core(dir.path());
        let req = request(serde_json::json!({"sessionId": "s1",
            "toolCall": {"toolCallId": "tc9", "kind": "read", "title": "Read x"},
            "options": [{"optionId": "allow-once", "name": "Yes", "kind": "allow_once"},
                        {"optionId": "allow-with-updates", "name": "Always", "kind": "allow_always"},
                        {"optionId": "reject", "name": "No", "kind": "reject_once"}]}));
        let out = c.request_permission(req).await.unwrap();
        assert_eq!(
            out,
            PermissionOutcome::Selected {
                option_id: "reject".into()
            }
        );
    }
}
