//! The agent -> supervisor side of one conversation: permissions go to the policy service
//! (never to the caller), questions go to the caller (never to the policy), `fs/*` is served
//! inside the boundary only, through the root's directory fd (`warden_containment::beneath`).
//!
//! A decision is bound to what it judged (`warden_rules::JudgedAction`): a client write is
//! served on an ALLOW of this turn only when that ALLOW judged its path *and* its content (the
//! hash of the raw input's `content`), and a `terminal/create` runs on one only when it judged
//! that command (argv) in that working directory; each ALLOW once. Anything else — another
//! command, other content, an edit whose raw input held no content — is a `Decide` of its own
//! that carries what will really run (argv and cwd, the content or its hash), and its answer is
//! enforced ([`enforce`]). An agent's link to its conversation is [`binding`]'s.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use warden_acp::{
    ClientHandler, ElicitationRequest, ElicitationResponse, PermissionOutcome, PermissionRequest,
    ReadTextFileRequest, RpcError, WriteTextFileRequest,
};
use warden_containment::beneath::ReadSpec;
use warden_fs_servant::wire::FailureKind;
use warden_proto::v1 as pb;
use warden_proto::v1::turn_event::Event;
use warden_rules::{OfferedOption, Outcome, choose_option};

use crate::core::ConvCore;
use crate::policy::rules_verdict;
use crate::servant::ServantError;
use crate::turn::{AllowedExec, Counted, CoveredWrite, EndRequest, TurnCtx};
use tracing::Instrument;

mod binding;
mod enforce;

pub use binding::Binding;

/// Environment entries of a `terminal/create` that an ALLOW of its command still covers: they
/// change how output looks or mark an adapter's own terminal (claude-code-acp sends
/// `CLAUDECODE=1` with every command), never which program runs or what it loads. Every other
/// entry makes the terminal a decision of its own.
const INERT_ENV: &[&str] = &[
    "CLAUDECODE",
    "TERM",
    "COLUMNS",
    "LINES",
    "NO_COLOR",
    "FORCE_COLOR",
    "CLICOLOR",
];

/// The options the supervisor offers the policy for a client write or terminal it asks about
/// itself.
const WRITE_OPTION: &str = "write";
const RUN_OPTION: &str = "run";
const REFUSE_OPTION: &str = "refuse";
/// The options it offers for a client read.
const READ_OPTION: &str = "read";

/// A client write's content up to this size travels in its decision's raw input (so a person
/// at the approver reads what would be written); a longer one by its hash only.
const INLINE_CONTENT_BYTES: usize = 64 * 1024;

/// What enforcing one decision produced.
struct Enforced {
    outcome: PermissionOutcome,
    allowed: bool,
    decision_id: String,
    /// The digest of the action the request asked about (what an ALLOW is bound to).
    action_digest: String,
}

/// A decision the supervisor asks for itself, for what an agent does through the client
/// (a write, a terminal) that no ALLOW of the turn judged.
struct OwnRequest<'a> {
    kind: &'a str,
    title: String,
    raw_input: serde_json::Value,
    locations: Vec<String>,
    /// (id, name, ACP kind) of the allow option; the refusal is always offered.
    allow: (&'a str, &'a str),
    source: &'a str,
}

impl ConvCore {
    /// Counts one request of the agent against this turn's bound (`limits.*_per_turn`). With
    /// no turn running it is refused: it never reaches the policy, a file, a terminal or the
    /// caller, and it is counted (`requests_between_turns`). Charging it to the next turn
    /// instead would let an idle agent spend that turn's quota before the caller asked for
    /// anything, and leave the decision without a task to belong to; an agent that follows ACP
    /// asks only while its `session/prompt` is unanswered, so it never sees this refusal.
    fn count(
        &self,
        turn: Option<&TurnCtx>,
        what: Counted,
        method: &'static str,
    ) -> Result<(), RpcError> {
        match turn {
            Some(t) => t.count(what, &self.quotas),
            None => Err(self.between_turns(method)),
        }
    }

    /// `terminal/output` and `terminal/wait_for_exit` are served within a turn only (a terminal
    /// outlives its turn — an adapter's background command is read again in a later one — but
    /// nobody reads it between turns). `terminal/kill` and `terminal/release` are served
    /// always: they only give back what the conversation holds.
    fn in_turn(&self, method: &'static str) -> Result<(), RpcError> {
        match self.turn() {
            Some(_) => Ok(()),
            None => Err(self.between_turns(method)),
        }
    }

    /// Records and refuses `method` between turns.
    fn between_turns(&self, method: &'static str) -> RpcError {
        crate::metrics::between_turns(method);
        tracing::warn!(
            context_id = %self.info.context_id,
            method,
            "the agent made a request while no turn was running: refused"
        );
        RpcError::invalid_params(format!(
            "no turn is running: {method} is refused between turns"
        ))
    }
}

/// An `fs/*` refusal in JSON-RPC terms: where the path leads is the caller's error (-32602), a
/// missing file is "not found", the rest is internal. The text is the supervisor's own (what
/// the servant says is not passed on: it is as untrusted as the agent).
fn servant_error(e: ServantError, path: &str, read_limit: u64) -> RpcError {
    let kind = match e {
        ServantError::Refused { kind, .. } => kind,
        ServantError::Unavailable(why) => {
            return RpcError::internal(format!("{path} could not be served: the fs servant {why}"));
        }
    };
    match kind {
        FailureKind::NotFound => RpcError::not_found(format!("no such file: {path}")),
        FailureKind::Boundary => RpcError::invalid_params(format!(
            "{path}: a symbolic link where none may be followed, or a way out of the session boundary"
        )),
        FailureKind::NotRegular => {
            RpcError::invalid_params(format!("{path} is not a regular file"))
        }
        FailureKind::HardLinked => RpcError::invalid_params(format!(
            "{path} has other hard links: it is not written through"
        )),
        FailureKind::TooLarge => RpcError::invalid_params(format!(
            "{path} is larger than the read limit of {read_limit} bytes (limits.fs_read_bytes)"
        )),
        FailureKind::NotText => RpcError::invalid_params(format!("{path} is not UTF-8 text")),
        FailureKind::Denied => RpcError::internal(format!(
            "{path}: permission denied (the agent's own rights do not reach it)"
        )),
        FailureKind::Unavailable
        | FailureKind::Io
        | FailureKind::Malformed
        | FailureKind::Unspecified => {
            RpcError::internal(format!("{path} could not be served ({kind:?})"))
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
        mut req: PermissionRequest,
    ) -> Result<PermissionOutcome, RpcError> {
        let entered = std::time::Instant::now();
        let turn = self.turn();
        // Between turns: cancelled (ACP's answer when no prompt turn is running), undecided.
        if turn.is_none() {
            self.between_turns("session/request_permission");
            return Ok(PermissionOutcome::Cancelled);
        }
        self.count(
            turn.as_deref(),
            Counted::Permission,
            "session/request_permission",
        )?;
        let request_id = uuid::Uuid::new_v4().simple().to_string();
        // A request of megabytes is serialised on the blocking pool (see OFF_RUNTIME_BYTES).
        let large_raw = if req.line_bytes >= crate::policy::OFF_RUNTIME_BYTES {
            req.tool_call.raw_input.take()
        } else {
            None
        };
        let mut dreq = self.decide_request(&req, turn.as_deref(), request_id.clone());
        // Over the policy's limits: from here on only its stand-in exists (records, events).
        let refused = match large_raw {
            Some(raw) => self.bound_large(&mut dreq, raw).await?,
            None => self.bound(&mut dreq).await,
        };
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
        let tool_call = dreq.tool_call.clone().unwrap_or_default();
        let judged = crate::translate::judged(&dreq);
        // What the answer must name: computed once here, from the request as sent.
        let digest = judged.digest();
        let e = self
            .enforce(
                turn.as_ref(),
                dreq,
                refused,
                &offered,
                entered,
                Some(digest),
            )
            .await;
        if let Some(t) = &turn
            && e.allowed
        {
            match warden_rules::ToolKind::parse(&kind) {
                warden_rules::ToolKind::SwitchMode => {
                    if let PermissionOutcome::Selected { option_id } = &e.outcome {
                        t.lock().allowed_switches.push(option_id.clone());
                    }
                }
                // What it read is then read through the client without asking again.
                warden_rules::ToolKind::Read => {
                    let covered = self.covered_by(&tool_call, &e, &judged.content_sha256);
                    t.lock()
                        .allowed_reads
                        .extend(covered.into_iter().map(|c| c.path));
                }
                // A command the raw input does not name covers no terminal (each is decided).
                warden_rules::ToolKind::Execute if !judged.argv.is_empty() => {
                    t.lock().allowed_exec.push(AllowedExec {
                        argv: judged.argv,
                        cwd: judged.cwd,
                        decision_id: e.decision_id.clone(),
                        digest: e.action_digest.clone(),
                        tool_call_id: tc_id.clone(),
                    });
                }
                warden_rules::ToolKind::Edit => {
                    let covered = self.covered_by(&tool_call, &e, &judged.content_sha256);
                    t.lock().allowed_writes.extend(covered);
                }
                _ => {}
            }
        }
        Ok(e.outcome)
    }

    async fn read_text_file(&self, req: ReadTextFileRequest) -> Result<String, RpcError> {
        // The turn it is counted against is the one it is decided in (none: refused).
        let turn = self.turn();
        self.count(turn.as_deref(), Counted::Fs, "fs/read_text_file")?;
        // Where it would be read, resolved once: the location the decision judges and the
        // servant opens (without following any link).
        let key = self.fs_location(&req.path)?;
        if !turn.as_ref().is_some_and(|t| self.read_covered(t, &key)) {
            let e = self.decide_read(turn.as_ref(), &key).await;
            if !e.allowed {
                return Err(RpcError::invalid_params(format!(
                    "the read of {} was refused by the policy (decision {})",
                    req.path, e.decision_id
                )));
            }
            if let Some(t) = &turn {
                t.lock().allowed_reads.push(key.clone());
            }
        }
        let spec = ReadSpec {
            line: req.line,
            limit: req.limit,
            max_bytes: self.fs_read_bytes,
        };
        self.servant
            .read(&key, spec)
            .await
            .map_err(|e| servant_error(e, &req.path, self.fs_read_bytes))
    }

    async fn write_text_file(&self, req: WriteTextFileRequest) -> Result<(), RpcError> {
        self.count(self.turn().as_deref(), Counted::Fs, "fs/write_text_file")?;
        if self.info.profile == warden_sandbox::Profile::ReadOnly {
            return Err(RpcError::invalid_params(
                "this conversation is read-only: writes are refused",
            ));
        }
        // Where it would land, resolved once, before anyone is asked: a path that leads outside
        // now is refused outright; the same resolution is the key an ALLOW covers, the location
        // a new decision judges, and what the servant opens — with no symbolic link followed
        // anywhere in it, so a component flipped to a link since is a refusal, never another
        // file.
        let key = self.fs_location(&req.path)?;
        let Some(turn) = self.turn() else {
            return Err(RpcError::invalid_params(
                "no turn is running: a write is served only within a turn",
            ));
        };
        // Covered only by an ALLOW that judged this path and this content.
        let sha = warden_rules::sha256_hex(req.content.as_bytes());
        let covering = self.take_covering(&turn, &key, &sha);
        let decision_id = match covering {
            Some(c) => {
                turn.record(
                    "fs_write",
                    serde_json::json!({
                        "path": req.path, "bytes": req.content.len(), "content_sha256": sha,
                        "covered_by": c.decision_id, "action_digest": c.digest,
                        "tool_call_id": c.tool_call_id,
                    }),
                );
                c.decision_id
            }
            None => {
                let e = self
                    .decide_write(&turn, &key.to_string_lossy(), &req.content)
                    .await;
                if !e.allowed {
                    return Err(RpcError::invalid_params(format!(
                        "the write of {} was refused by the policy (decision {})",
                        req.path, e.decision_id
                    )));
                }
                turn.record(
                    "fs_write",
                    serde_json::json!({
                        "path": req.path, "bytes": req.content.len(), "content_sha256": sha,
                        "decided": e.decision_id, "action_digest": e.action_digest,
                    }),
                );
                e.decision_id
            }
        };
        let written = self.servant.write(&key, req.content.as_bytes()).await;
        tracing::info!(
            context_id = %self.info.context_id,
            task_id = %turn.input.task_id,
            decision_id = %decision_id,
            bytes = req.content.len(),
            ok = written.is_ok(),
            "client write"
        );
        written.map_err(|e| servant_error(e, &req.path, self.fs_read_bytes))
    }

    async fn create_terminal(
        &self,
        req: warden_acp::CreateTerminalRequest,
    ) -> Result<String, RpcError> {
        self.terminal_enabled("terminal/create")?;
        let Some(turn) = self.turn() else {
            return Err(self.between_turns("terminal/create"));
        };
        self.count(Some(&turn), Counted::Terminal, "terminal/create")?;
        // Its place within the conversation's caps, before anything is decided or run (a
        // refusal here costs no decision); given back if it never runs.
        let slot = self.terminals.reserve(self.terminal.as_ref(), &req)?;
        // What would run: the command and its args, in the cwd asked for (the root by default).
        let run: Vec<String> = std::iter::once(req.command.clone())
            .chain(req.args.iter().cloned())
            .collect();
        let cwd = req
            .cwd
            .clone()
            .unwrap_or_else(|| self.info.root.to_string_lossy().into_owned());
        // An ALLOW of the tool call judged its command, not an environment: a terminal that
        // asks for entries (LD_PRELOAD, PATH, BASH_ENV: each changes what runs) is decided on its
        // own, carrying them — all but the few that only say how output looks or that an
        // adapter marks its own terminals with (`INERT_ENV`).
        let env: Vec<(String, String)> = req
            .env
            .iter()
            .filter(|e| !INERT_ENV.contains(&e.name.as_str()))
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect();
        let taken = if env.is_empty() {
            self.take_exec(&turn, &run, &cwd)
        } else {
            None
        };
        let (decision_id, digest) = match taken {
            Some(a) => (a.decision_id, a.digest),
            None => {
                let e = self.decide_exec(&turn, &run, &cwd, &env).await;
                if !e.allowed {
                    return Err(RpcError::invalid_params(format!(
                        "the command {} was refused by the policy (decision {}): a terminal runs \
                         only what an allowed execute judged",
                        warden_rules::shell_line(&run),
                        e.decision_id
                    )));
                }
                (e.decision_id, e.action_digest)
            }
        };
        turn.record(
            "terminal",
            serde_json::json!({
                "argv": run, "cwd": cwd, "env": env.iter().map(|(k, _)| k).collect::<Vec<_>>(),
                "decision_id": decision_id, "action_digest": digest,
            }),
        );
        let files = self.files();
        let target = crate::terminal::Target {
            context_id: &self.info.context_id,
            principal: &self.info.principal,
            boundary: self.info.sandbox_boundary(),
            files: files.as_deref(),
        };
        self.terminals
            .create(self.terminal.as_ref(), Some(turn), target, slot, req)
            .await
    }

    async fn terminal_output(
        &self,
        req: warden_acp::TerminalRequest,
    ) -> Result<warden_acp::TerminalOutputResponse, RpcError> {
        self.terminal_enabled("terminal/output")?;
        self.in_turn("terminal/output")?;
        self.terminals.output(&req)
    }

    async fn wait_for_terminal_exit(
        &self,
        req: warden_acp::TerminalRequest,
    ) -> Result<warden_acp::TerminalExitStatus, RpcError> {
        self.terminal_enabled("terminal/wait_for_exit")?;
        self.in_turn("terminal/wait_for_exit")?;
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
            self.between_turns("elicitation/create");
            return Ok(ElicitationResponse::Cancel);
        };
        self.count(Some(&turn), Counted::Question, "elicitation/create")?;
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
    use std::sync::Mutex;
    use std::time::Duration;

    use warden_containment::beneath::RootDir;

    use super::*;
    use crate::core::{ConvInfo, Live};
    use crate::policy::PolicyClient;
    use crate::turn::{AllowedExec, ToolSeen, TurnCtx, TurnInput};

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
                profile: warden_sandbox::Profile::WorkspaceWrite,
                model: String::new(),
                effort: String::new(),
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
            files: std::sync::RwLock::new(
                RootDir::open(root).map(Arc::new).map_err(|e| e.to_string()),
            ),
            servant: crate::servant::Servant::in_process(root),
            fs_read_bytes: 1024,
            quotas: Default::default(),
            bulk: tokio::sync::Semaphore::new(1),
        }
    }

    fn request(v: serde_json::Value) -> PermissionRequest {
        serde_json::from_value(v).unwrap()
    }

    fn turn_with_seen(id: &str, path: &str) -> Arc<TurnCtx> {
        let (t, _rx) = test_turn();
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
        std::fs::write(dir.path().join("x"), "outside").unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();
        let c = core(&root);
        c.live().turn = Some(turn_with_seen("tc1", "/nowhere"));
        for p in [
            "/etc/passwd".to_string(),
            format!("{}/../x", root.display()),
            format!("{}/up/x", root.display()),
            "relative.txt".to_string(),
        ] {
            let e = c
                .read_text_file(ReadTextFileRequest {
                    session_id: "s1".into(),
                    path: p.clone(),
                    line: None,
                    limit: None,
                })
                .await
                .unwrap_err();
            assert_eq!(e.code, -32602, "read {p}: {e:?}");
            // Refused before any policy is asked (there is none here: asking would fail closed
            // with a different message).
            let e = c
                .write_text_file(WriteTextFileRequest {
                    session_id: "s1".into(),
                    path: p.clone(),
                    content: "pwned".into(),
                })
                .await
                .unwrap_err();
            assert_eq!(e.code, -32602, "write {p}: {e:?}");
            assert!(!e.message.contains("refused by the policy"), "{p}: {e:?}");
        }
        assert_eq!(
            std::fs::read_to_string(dir.path().join("x")).unwrap(),
            "outside"
        );
        // A file inside is read (an ALLOW of the turn covers it: there is no policy here); a read
        // over the bound is refused naming the limit.
        std::fs::write(root.join("in.txt"), "inside\n").unwrap();
        if let Some(t) = c.turn() {
            t.lock()
                .allowed_reads
                .extend([root.join("in.txt"), root.join("big.txt")]);
        }
        let read = |path: String| {
            c.read_text_file(ReadTextFileRequest {
                session_id: "s1".into(),
                path,
                line: None,
                limit: None,
            })
        };
        assert_eq!(
            read(format!("{}/in.txt", root.display())).await.unwrap(),
            "inside\n"
        );
        std::fs::write(root.join("big.txt"), vec![b'a'; 2048]).unwrap();
        let e = read(format!("{}/big.txt", root.display()))
            .await
            .unwrap_err();
        assert!(e.message.contains("fs_read_bytes"), "{e:?}");
    }

    #[tokio::test]
    async fn a_client_write_without_a_covering_allow_is_decided_and_refused_when_the_policy_is_down()
     {
        let dir = tempfile::tempdir().unwrap();
        let c = core(dir.path());
        let (t, mut rx) = test_turn();
        c.live().turn = Some(t.clone());
        let path = format!("{}/new.txt", dir.path().display());
        let e = c
            .write_text_file(WriteTextFileRequest {
                session_id: "s1".into(),
                path: path.clone(),
                content: "x".into(),
            })
            .await
            .unwrap_err();
        assert!(e.message.contains("refused by the policy"), "{e:?}");
        assert!(!dir.path().join("new.txt").exists());
        // The caller saw the decision (a fail-closed DENY) for the write.
        let ev = rx.try_recv().unwrap().unwrap();
        match ev.event {
            Some(Event::Permission(p)) => {
                assert_eq!(p.tool_kind, "edit");
                assert_eq!(p.tool_title, format!("fs/write_text_file {path}"));
                assert_eq!(p.verdict, pb::Verdict::Deny as i32);
            }
            other => panic!("expected a permission event, got {other:?}"),
        }
        // An ALLOW of this turn that judged the path and the content lets exactly one write of
        // that content through; other content is decided (and refused here: no policy).
        t.lock().allowed_writes.push(CoveredWrite {
            path: dir.path().join("new.txt"),
            content_sha256: warden_rules::sha256_hex(b"covered"),
            decision_id: "d1".into(),
            digest: "sha256:00".into(),
            tool_call_id: "tc1".into(),
        });
        let w = |content: &str| {
            c.write_text_file(WriteTextFileRequest {
                session_id: "s1".into(),
                path: path.clone(),
                content: content.into(),
            })
        };
        let e = w("pwned").await.unwrap_err();
        assert!(e.message.contains("refused by the policy"), "{e:?}");
        assert!(!dir.path().join("new.txt").exists());
        w("covered").await.unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("new.txt")).unwrap(),
            "covered"
        );
        assert!(w("again").await.is_err(), "one ALLOW covered two writes");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("new.txt")).unwrap(),
            "covered"
        );
    }

    #[tokio::test]
    async fn a_client_read_without_a_covering_allow_is_decided_and_refused_when_the_policy_is_down()
    {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(root.join("secret.txt"), "the secret").unwrap();
        let c = core(&root);
        let (t, mut rx) = test_turn();
        c.live().turn = Some(t.clone());
        let path = root.join("secret.txt").to_string_lossy().into_owned();
        let read = || {
            c.read_text_file(ReadTextFileRequest {
                session_id: "s1".into(),
                path: path.clone(),
                line: None,
                limit: None,
            })
        };
        let e = read().await.unwrap_err();
        assert!(e.message.contains("refused by the policy"), "{e:?}");
        assert!(!e.message.contains("the secret"), "{e:?}");
        match rx.try_recv().unwrap().unwrap().event {
            Some(Event::Permission(p)) => {
                assert_eq!(p.tool_kind, "read");
                assert_eq!(p.tool_title, format!("fs/read_text_file {path}"));
                assert_eq!(p.verdict, pb::Verdict::Deny as i32);
            }
            other => panic!("expected a permission event, got {other:?}"),
        }
        // A read ALLOW of the turn for that location covers it, as often as it is read.
        t.lock().allowed_reads.push(root.join("secret.txt"));
        assert_eq!(read().await.unwrap(), "the secret");
        assert_eq!(read().await.unwrap(), "the secret");
        // A servant that is gone is an error, and the next request starts a new one.
        c.servant.stop().await;
        assert_eq!(read().await.unwrap(), "the secret");
    }

    #[tokio::test]
    async fn an_allowed_edit_covers_its_locations_and_raw_input_paths_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let c = core(root);
        let tc = pb::ToolCall {
            id: "tc1".into(),
            kind: "edit".into(),
            title: "Write a.txt".into(),
            raw_input_json: serde_json::json!({"file_path": format!("{}/a.txt", root.display()),
                "notebook_path": "nb/b.ipynb"})
            .to_string(),
            locations: vec![pb::Location {
                path: format!("{}/./a.txt", root.display()),
                line: None,
            }],
        };
        let e = Enforced {
            outcome: PermissionOutcome::Cancelled,
            allowed: true,
            decision_id: "d1".into(),
            action_digest: "sha256:11".into(),
        };
        let covered = c.covered_by(&tc, &e, "abcd");
        let paths: Vec<PathBuf> = covered.iter().map(|c| c.path.clone()).collect();
        assert_eq!(paths, vec![root.join("a.txt"), root.join("nb/b.ipynb")]);
        assert!(covered.iter().all(|c| c.decision_id == "d1"
            && c.tool_call_id == "tc1"
            && c.content_sha256 == "abcd"
            && c.digest == "sha256:11"));
        // Without the content judged, an edit covers no write.
        assert!(c.covered_by(&tc, &e, "").is_empty());
    }

    /// A running turn of task `task-1` and its event receiver.
    fn test_turn() -> (Arc<TurnCtx>, crate::turn::EventRx) {
        TurnCtx::new(
            TurnInput {
                id: "t".into(),
                text: "x".into(),
                instructions: String::new(),
                message_id: String::new(),
                task_id: "task-1".into(),
                timeout_secs: 1,
                groups: Vec::new(),
                issuer: String::new(),
                span: tracing::Span::none(),
            },
            1024,
        )
    }

    fn bare_turn() -> Arc<TurnCtx> {
        test_turn().0
    }

    #[tokio::test]
    async fn racing_writes_of_the_judged_content_get_one_through_on_one_allow() {
        let dir = tempfile::tempdir().unwrap();
        let c = Arc::new(core(dir.path()));
        let t = bare_turn();
        c.live().turn = Some(t.clone());
        t.lock().allowed_writes.push(CoveredWrite {
            path: dir.path().join("r.txt"),
            content_sha256: warden_rules::sha256_hex(b"judged"),
            decision_id: "d1".into(),
            digest: "sha256:00".into(),
            tool_call_id: "tc1".into(),
        });
        let path = format!("{}/r.txt", dir.path().display());
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (c, path) = (c.clone(), path.clone());
                tokio::spawn(async move {
                    c.write_text_file(WriteTextFileRequest {
                        session_id: "s1".into(),
                        path,
                        content: "judged".into(),
                    })
                    .await
                })
            })
            .collect();
        let mut ok = 0;
        for task in tasks {
            if task.await.unwrap().is_ok() {
                ok += 1;
            }
        }
        // The rest were decided on their own (and refused: there is no policy here).
        assert_eq!(ok, 1, "one ALLOW, one write");
        assert!(t.lock().allowed_writes.is_empty());
    }

    #[tokio::test]
    async fn an_allowed_execute_covers_only_its_command_in_its_cwd_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        let c = core(&root);
        let t = bare_turn();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        t.lock().allowed_exec.push(AllowedExec {
            argv: s(&["ls"]),
            cwd: root.display().to_string(),
            decision_id: "d1".into(),
            digest: "sha256:00".into(),
            tool_call_id: "tc1".into(),
        });
        let r = root.display().to_string();
        let sub = root.join("sub").display().to_string();
        assert!(
            c.take_exec(&t, &s(&["sh", "-c", "echo pwned > m"]), &r)
                .is_none()
        );
        assert!(c.take_exec(&t, &s(&["ls"]), &sub).is_none(), "another cwd");
        assert!(c.take_exec(&t, &s(&["bash", "-lc", "ls"]), &r).is_none());
        let got = c.take_exec(&t, &s(&["sh", "-c", "ls"]), &format!("{r}/."));
        assert_eq!(got.map(|a| a.decision_id).as_deref(), Some("d1"));
        assert!(c.take_exec(&t, &s(&["ls"]), &r).is_none(), "used once");
    }

    #[tokio::test]
    async fn an_unbound_agent_is_refused_everything_and_counted_then_served_once_bound() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "content").unwrap();
        let b = Binding::unbound();
        let path = dir.path().join("f.txt").to_string_lossy().into_owned();
        let read = || ReadTextFileRequest {
            session_id: "s".into(),
            path: path.clone(),
            line: None,
            limit: None,
        };
        assert!(b.read_text_file(read()).await.is_err());
        let perm = b
            .request_permission(request(serde_json::json!({
                "sessionId": "s",
                "toolCall": {"toolCallId": "t1", "kind": "edit", "title": "edit"},
                "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                            {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]
            })))
            .await
            .unwrap();
        assert_eq!(
            perm,
            PermissionOutcome::Cancelled,
            "never an allow, no policy asked"
        );
        assert_eq!(b.early_requests(), 2);
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let bound = Arc::new(core(&root));
        let t = turn_with_seen("tc1", "/nowhere");
        t.lock().allowed_reads.push(root.join("f.txt"));
        bound.live().turn = Some(t);
        assert!(b.bind(bound));
        assert!(!b.bind(Arc::new(core(&root))), "bound once");
        let req = ReadTextFileRequest {
            session_id: "s".into(),
            path: root.join("f.txt").to_string_lossy().into_owned(),
            line: None,
            limit: None,
        };
        assert_eq!(b.read_text_file(req).await.unwrap(), "content");
        assert_eq!(b.early_requests(), 2);
    }

    #[tokio::test]
    async fn between_turns_every_request_is_refused_without_being_decided() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(root.join("f.txt"), "content").unwrap();
        let c = core(&root);
        let perm = c
            .request_permission(request(serde_json::json!({"sessionId": "s1",
                "toolCall": {"toolCallId": "tc1", "kind": "read", "title": "Read f.txt"},
                "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                            {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]})))
            .await
            .unwrap();
        // Not the refusal a (failed) decision picks: cancelled, no decision asked for.
        assert_eq!(perm, PermissionOutcome::Cancelled);
        let path = root.join("f.txt").to_string_lossy().into_owned();
        let e = c
            .read_text_file(ReadTextFileRequest {
                session_id: "s1".into(),
                path: path.clone(),
                line: None,
                limit: None,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code, -32602, "{e:?}");
        assert!(e.message.contains("between turns"), "{e:?}");
        let e = c
            .write_text_file(WriteTextFileRequest {
                session_id: "s1".into(),
                path: path.clone(),
                content: "pwned".into(),
            })
            .await
            .unwrap_err();
        assert!(e.message.contains("between turns"), "{e:?}");
        assert_eq!(
            std::fs::read_to_string(root.join("f.txt")).unwrap(),
            "content"
        );
        let q = c
            .elicitation(ElicitationRequest {
                session_id: Some("s1".into()),
                message: "?".into(),
                mode: Some("form".into()),
                requested_schema: None,
                raw: serde_json::Value::Null,
            })
            .await
            .unwrap();
        assert_eq!(q, ElicitationResponse::Cancel);
        // Within a turn the same read is served (an ALLOW of the turn covers it).
        let t = bare_turn();
        t.lock().allowed_reads.push(root.join("f.txt"));
        c.live().turn = Some(t);
        let read = ReadTextFileRequest {
            session_id: "s1".into(),
            path,
            line: None,
            limit: None,
        };
        assert_eq!(c.read_text_file(read).await.unwrap(), "content");
    }

    #[tokio::test]
    async fn without_a_policy_a_permission_is_refused_with_an_offered_id() {
        let dir = tempfile::tempdir().unwrap();
        let c = core(dir.path());
        c.live().turn = Some(bare_turn());
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
