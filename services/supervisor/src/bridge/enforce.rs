//! Binding a decision to what it judged: a request checked against the policy's limits, an
//! ALLOW of this turn taken once for the path and content, or the command and working
//! directory, it judged; anything else decided on its own (what will really run) and enforced.
//!
//! Owns: which ALLOW covers which action, once. Must never: serve an action no ALLOW judged, or
//! reuse an ALLOW.

use super::*;

impl ConvCore {
    /// `dreq` checked against the policy's limits before anything else sees it: over them, it
    /// is replaced by its stand-in (kind, size, digest; never the body) and refused here, never
    /// sent (`policy::refused`); `None` when it is within them.
    pub(super) async fn bound(
        &self,
        dreq: &mut pb::DecideRequest,
    ) -> Option<crate::policy::Decided> {
        let o = self.policy.oversized(dreq).await;
        self.stand_in(dreq, o)
    }

    /// [`Self::bound`] for a request whose raw input (`raw`, still a JSON value) came in a line
    /// of megabytes: serialised and measured on the blocking pool, one at a time per
    /// conversation, so a flood of them holds neither a runtime thread (every other
    /// conversation's tasks) nor more than one CPU.
    pub(super) async fn bound_large(
        &self,
        dreq: &mut pb::DecideRequest,
        raw: serde_json::Value,
    ) -> Result<Option<crate::policy::Decided>, RpcError> {
        let limits = self.policy.limits().await;
        let _one =
            self.bulk.acquire().await.map_err(|e| {
                RpcError::internal(format!("the request could not be measured: {e}"))
            })?;
        let mut d = std::mem::take(dreq);
        let (d, o) = tokio::task::spawn_blocking(move || {
            if let Some(tc) = d.tool_call.as_mut() {
                tc.raw_input_json = raw.to_string();
            }
            let o = crate::policy::oversized_under(&d, &limits);
            (d, o)
        })
        .await
        .map_err(|e| RpcError::internal(format!("the request could not be measured: {e}")))?;
        *dreq = d;
        Ok(self.stand_in(dreq, o))
    }

    /// Replaces an oversized `dreq` by its stand-in; the refusal.
    fn stand_in(
        &self,
        dreq: &mut pb::DecideRequest,
        o: Option<crate::policy::Oversized>,
    ) -> Option<crate::policy::Decided> {
        let o = o?;
        *dreq = o.stand_in(dreq);
        tracing::warn!(
            context_id = %self.info.context_id,
            request_id = %dreq.request_id,
            rule = o.rule,
            bytes = o.bytes,
            "a permission request over the policy's limits"
        );
        Some(crate::policy::refused(&o))
    }

    /// Asks the policy about one permission (unless `refused` already, see [`Self::bound`]),
    /// enforces the answer (option chosen from what was offered, refusals recorded, the caller
    /// told) and reports what was enforced.
    pub(super) async fn enforce(
        &self,
        turn: Option<&Arc<TurnCtx>>,
        dreq: pb::DecideRequest,
        refused: Option<crate::policy::Decided>,
        offered: &[OfferedOption],
        entered: std::time::Instant,
        digest: Option<String>,
    ) -> Enforced {
        let request_id = dreq.request_id.clone();
        let subject = dreq.subject.clone();
        let session_id = dreq
            .subject
            .as_ref()
            .map(|s| s.session_id.clone())
            .unwrap_or_default();
        let (tc_id, kind, title) = dreq
            .tool_call
            .as_ref()
            .map(|t| (t.id.clone(), t.kind.clone(), t.title.clone()))
            .unwrap_or_default();
        let cancelled_now = || Enforced {
            outcome: PermissionOutcome::Cancelled,
            allowed: false,
            decision_id: String::new(),
            action_digest: String::new(),
        };
        // The permission's span, in its turn's trace: the Decide call carries it to the policy.
        let span = match turn {
            Some(t) => {
                tracing::info_span!(parent: &t.input.span, "permission", request_id = %request_id)
            }
            None => tracing::info_span!("permission", request_id = %request_id),
        };
        let decided = match (refused, turn) {
            (Some(d), _) => d,
            (None, Some(t)) => {
                tokio::select! {
                    d = self.policy.decide_judged(dreq, self.deadline, digest).instrument(span) => d,
                    _ = t.cancel.cancelled() => {
                        // The Decide in flight is dropped; whatever it decides is not enforced.
                        self.policy.withdraw_later(request_id, subject, "the turn was cancelled".into());
                        t.emit(cancelled_event(&tc_id, &kind, &title));
                        return cancelled_now();
                    }
                }
            }
            (None, None) => {
                self.policy
                    .decide_judged(dreq, self.deadline, digest)
                    .instrument(span)
                    .await
            }
        };
        let answer = choose_option(
            rules_verdict(decided.verdict),
            decided.option_id.as_deref(),
            offered,
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
            session_id = %session_id,
            task_id = %turn.map(|t| t.input.task_id.as_str()).unwrap_or(""),
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
        if let Some(t) = turn {
            t.record("permission_decision", serde_json::json!({
                "decision_id": decided.decision_id, "verdict": verdict.as_str_name(),
                "rule": decided.rule, "reason": reason, "option_sent": sent, "cancelled": cancelled,
                "action_digest": decided.action_digest,
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
                end_turn: decided.end_turn.is_some() || cancelled,
                policy_latency_micros: decided.latency.as_micros() as u64,
            }));
            if decided.end_turn.is_some() || cancelled {
                // The policy's typed reason, never its rule or reason text, makes this a fault.
                let fault = (decided.end_turn
                    == Some(pb::EndTurnReason::PermissionPromptUnavailable))
                .then(|| {
                    (
                        pb::FaultClass::PermissionPromptUnavailable,
                        decided.reason.clone(),
                    )
                });
                t.request_end(EndRequest::Decision { fault });
            }
        }
        Enforced {
            outcome,
            allowed,
            decision_id: decided.decision_id,
            action_digest: decided.action_digest,
        }
    }

    /// What an ALLOW of `tc` covers: its locations and the paths its raw input names (Claude's
    /// Write has `file_path`, Codex's patches name files), as the policy judged them, each with
    /// the content the raw input carried (`content_sha256`); one write per path, however many
    /// times the call names it. An edit whose raw input carries no content (Claude's Edit names
    /// strings to replace, not the file) covers no write: each is decided with its content.
    pub(super) fn covered_by(
        &self,
        tc: &pb::ToolCall,
        e: &Enforced,
        content_sha256: &str,
    ) -> Vec<CoveredWrite> {
        if content_sha256.is_empty() {
            return Vec::new();
        }
        let mut paths: Vec<PathBuf> = tc
            .locations
            .iter()
            .map(|l| PathBuf::from(&l.path))
            .collect();
        if let Ok(raw) = warden_rules::raw_input_paths(&tc.raw_input_json) {
            let base = raw
                .cwds
                .first()
                .cloned()
                .unwrap_or_else(|| self.info.root.clone());
            paths.extend(raw.changed.iter().map(|p| base.join(p)));
        }
        // A call usually names its file twice (a location and the raw input's `file_path`):
        // resolve each spelling once; every resolution walks the root's ancestors again (one
        // `statx` per component, ten for a root under the supervisor's state directory).
        paths.sort();
        paths.dedup();
        let mut covered: Vec<CoveredWrite> = paths
            .iter()
            .filter_map(|p| self.covered_key(p))
            .map(|path| CoveredWrite {
                path,
                content_sha256: content_sha256.to_string(),
                decision_id: e.decision_id.clone(),
                digest: e.action_digest.clone(),
                tool_call_id: tc.id.clone(),
            })
            .collect();
        covered.sort_by(|x, y| x.path.cmp(&y.path));
        covered.dedup_by(|x, y| x.path == y.path);
        covered
    }

    /// The ALLOW covering a client write of `content_sha256` to `key` in this turn, consumed
    /// (one ALLOW, one write): it judged that path and that content.
    pub(super) fn take_covering(
        &self,
        turn: &TurnCtx,
        key: &Path,
        content_sha256: &str,
    ) -> Option<CoveredWrite> {
        let mut st = turn.lock();
        let i = st
            .allowed_writes
            .iter()
            .position(|c| c.path == key && c.content_sha256 == content_sha256)?;
        Some(st.allowed_writes.swap_remove(i))
    }

    /// Whether an ALLOW of this turn already covers a client read of `key`: a read decided
    /// earlier in the turn (client read or an ALLOWed read tool call), or an edit ALLOWed for
    /// it and not yet written.
    pub(super) fn read_covered(&self, turn: &TurnCtx, key: &Path) -> bool {
        let st = turn.lock();
        st.allowed_reads.iter().any(|p| p == key) || st.allowed_writes.iter().any(|c| c.path == key)
    }

    /// A client read no ALLOW of the turn covers: decided like a read of that location (the
    /// floor allows reads; an operator policy may refuse them). Outside a turn nothing gets
    /// here (`count` refuses it).
    pub(super) async fn decide_read(&self, turn: Option<&Arc<TurnCtx>>, key: &Path) -> Enforced {
        let path = key.to_string_lossy().into_owned();
        self.decide_own(
            turn,
            OwnRequest {
                kind: "read",
                title: format!("fs/read_text_file {path}"),
                raw_input: serde_json::json!({ "path": path }),
                locations: vec![path],
                allow: (READ_OPTION, "Read the file"),
                source: "fs/read_text_file",
            },
        )
        .await
    }

    /// The ALLOW of this turn that judged running `run` in `cwd`, consumed (one ALLOW, one
    /// terminal). Both working directories are compared as resolved now (beneath the root).
    pub(super) fn take_exec(
        &self,
        turn: &TurnCtx,
        run: &[String],
        cwd: &str,
    ) -> Option<AllowedExec> {
        let key = |c: &str| self.covered_key(c).unwrap_or_else(|| PathBuf::from(c));
        let want = key(cwd);
        let mut st = turn.lock();
        let i = st
            .allowed_exec
            .iter()
            .position(|a| warden_rules::command_matches(&a.argv, run) && key(&a.cwd) == want)?;
        Some(st.allowed_exec.swap_remove(i))
    }

    /// A client write no ALLOW covers: decided like an edit of that path, carrying the content
    /// (or, past `INLINE_CONTENT_BYTES`, its hash), so the decision judges and names this write.
    pub(super) async fn decide_write(
        &self,
        turn: &Arc<TurnCtx>,
        path: &str,
        content: &str,
    ) -> Enforced {
        let sha = warden_rules::sha256_hex(content.as_bytes());
        let mut raw = serde_json::json!({"path": path, "bytes": content.len()});
        if content.len() <= INLINE_CONTENT_BYTES {
            raw["content"] = serde_json::Value::from(content);
        } else {
            raw["content_sha256"] = serde_json::Value::from(sha);
        }
        self.decide_own(
            Some(turn),
            OwnRequest {
                kind: "edit",
                title: format!("fs/write_text_file {path}"),
                raw_input: raw,
                locations: vec![path.to_string()],
                allow: (WRITE_OPTION, "Write the file"),
                source: "fs/write_text_file",
            },
        )
        .await
    }

    /// A `terminal/create` no ALLOW judged: decided as an execute of exactly this argv in this
    /// working directory with these environment entries (the title is the command line, the
    /// entries written before it as `NAME=value`; the raw input its argv, cwd and env, which is
    /// what policy rules and a person judge).
    pub(super) async fn decide_exec(
        &self,
        turn: &Arc<TurnCtx>,
        run: &[String],
        cwd: &str,
        env: &[(String, String)],
    ) -> Enforced {
        let mut raw = serde_json::json!({"command": run, "cwd": cwd});
        let mut line: Vec<String> = Vec::new();
        if !env.is_empty() {
            raw["env"] = env
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
                .collect::<serde_json::Map<_, _>>()
                .into();
            line.push("env".into());
            line.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        }
        line.extend(run.iter().cloned());
        self.decide_own(
            Some(turn),
            OwnRequest {
                kind: "execute",
                title: warden_rules::shell_line(&line),
                raw_input: raw,
                locations: Vec::new(),
                allow: (RUN_OPTION, "Run the command"),
                source: "terminal/create",
            },
        )
        .await
    }

    /// Asks `Decide` for something the agent does through the client, offering one allow-once
    /// and one refusal; only the allow option is an ALLOW (a cancel included refuses).
    async fn decide_own(&self, turn: Option<&Arc<TurnCtx>>, own: OwnRequest<'_>) -> Enforced {
        let entered = std::time::Instant::now();
        let request_id = uuid::Uuid::new_v4().simple().to_string();
        let prefix = match own.source {
            "terminal/create" => "terminal",
            "fs/read_text_file" => "fs-read",
            _ => "fs-write",
        };
        let tool_call_id = format!("{prefix}-{request_id}");
        let options = [
            (own.allow.0, own.allow.1, "allow_once"),
            (REFUSE_OPTION, "Refuse", "reject_once"),
        ];
        let (session_id, current_mode) = {
            let l = self.live();
            (l.session_id.clone(), l.current_mode.clone())
        };
        let mut dreq = pb::DecideRequest {
            request_id: request_id.clone(),
            subject: Some(self.info.subject(turn.map(|t| &**t), session_id)),
            boundary: Some(self.info.wire_boundary()),
            tool_call: Some(pb::ToolCall {
                id: tool_call_id.clone(),
                kind: own.kind.into(),
                title: own.title.clone(),
                raw_input_json: own.raw_input.to_string(),
                locations: own
                    .locations
                    .iter()
                    .map(|p| pb::Location {
                        path: p.clone(),
                        line: None,
                    })
                    .collect(),
            }),
            options: options
                .iter()
                .map(|(id, name, kind)| pb::PermissionOption {
                    id: id.to_string(),
                    name: name.to_string(),
                    kind: kind.to_string(),
                })
                .collect(),
            current_mode,
            deadline_unix_ms: 0,
            // The supervisor cannot ask a person: an escalation is a refusal here.
            return_escalations: false,
        };
        let offered: Vec<OfferedOption> = options
            .iter()
            .map(|(id, name, kind)| OfferedOption {
                id: id.to_string(),
                name: name.to_string(),
                kind: warden_rules::OptionKind::parse(kind),
            })
            .collect();
        // A terminal's argv or environment the agent made too large for the policy.
        let refused = self.bound(&mut dreq).await;
        let title = dreq
            .tool_call
            .as_ref()
            .map(|t| t.title.as_str())
            .unwrap_or_default();
        if let Some(turn) = turn {
            turn.lock().permissions += 1;
            turn.record(
                "permission_request",
                serde_json::json!({
                    "request_id": request_id, "tool_call_id": tool_call_id, "kind": own.kind,
                    "title": title, "source": own.source,
                }),
            );
        }
        let mut e = self
            .enforce(turn, dreq, refused, &offered, entered, None)
            .await;
        let allow = own.allow.0;
        e.allowed &=
            matches!(&e.outcome, PermissionOutcome::Selected { option_id } if option_id == allow);
        e
    }
}
