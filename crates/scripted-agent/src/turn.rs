//! One prompt turn: pick the steps, run them, answer the prompt.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::agent::{Agent, Session};
use crate::scenario::{self, OnCancel, Step, ToolStep};
use crate::vocab::{self, Answer, PlanReaction, Reaction, Vocab};

/// Cap on `oversized` / `stderr` sizes: a scenario typo must not exhaust memory.
const MAX_SIZE_STEP: usize = 1 << 30;
/// A flood step sends at most this many requests.
const MAX_FLOOD: usize = 100_000;

/// The `flood` fields of the terminal methods.
struct FloodExtra {
    command: Option<String>,
    output_byte_limit: Option<u64>,
    terminal_id: Option<String>,
    body: Body,
}

/// What a hostile permission flood's requests carry (`Step::Flood`).
#[derive(Default, Clone, Copy)]
struct Body {
    raw_input_bytes: Option<usize>,
    nest_depth: Option<usize>,
}

impl Body {
    fn hostile(&self) -> bool {
        self.raw_input_bytes.is_some() || self.nest_depth.is_some()
    }

    /// `{"command": "xxx…"}` of the size asked, with `"nested": [[[…]]]` as deep as asked.
    fn raw_input(&self) -> Value {
        let mut raw = json!({"command": "x".repeat(self.raw_input_bytes.unwrap_or(4))});
        if let Some(d) = self.nest_depth {
            // Built as text and parsed back, so at most as deep as the JSON parser takes
            // (serde_json's limit, 128, is also what a client's parser refuses past: a deeper
            // line is a `raw` step's business).
            let text = format!("{}{}", "[".repeat(d), "]".repeat(d));
            if let Ok(v) = serde_json::from_str::<Value>(&text) {
                raw["nested"] = v;
            }
        }
        raw
    }
}

/// How the step list ended.
enum Flow {
    Continue,
    End(String),
    Fail(Value),
    Cancelled,
}

/// Turn-wide settings (from the scenario that supplied the steps).
#[derive(Default)]
struct Settings {
    vocab: Option<Vocab>,
    on_cancel: OnCancel,
    report: Option<String>,
    string_ids: Option<bool>,
    demo: bool,
}

struct Turn {
    agent: Arc<Agent>,
    session: Arc<Session>,
    settings: Settings,
    cancel: watch::Receiver<bool>,
    tools: usize,
    /// `after_turn` steps to run once the prompt is answered (delay, steps).
    after: Vec<(u64, Vec<Step>)>,
    /// Running after the turn: message lines go to the session's after-turn log, not the wire.
    capture: bool,
}

fn prompt_text(params: &Value) -> String {
    params
        .get("prompt")
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

pub async fn run_turn(agent: Arc<Agent>, session: Arc<Session>, id: Value, params: Value) {
    session.cancel.send_replace(false);
    let text = prompt_text(&params);
    let n = {
        let mut st = session.st();
        st.history.push((true, text.clone()));
        st.prompts += 1;
        st.prompts - 1
    };
    let message_id = params
        .pointer("/_meta/warden/messageId")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| text.split_whitespace().next().unwrap_or("").to_string());

    let mut settings = Settings::default();
    let steps = if let Some(inline) = scenario::inline_scenario(&text) {
        match inline {
            Ok(s) => {
                apply(&agent, &session, &s, &mut settings);
                s.steps_for(0)
            }
            Err(e) => vec![Step::Message { text: e }],
        }
    } else if let Some(steps) = scenario::tck_steps(&message_id) {
        steps
    } else if let Some(s) = agent.cfg.file_scenario.clone() {
        apply(&agent, &session, &s, &mut settings);
        s.steps_for(n)
    } else {
        settings.demo = true;
        scenario::demo_steps(&text)
    };

    let mut turn = Turn {
        cancel: session.cancel.subscribe(),
        agent: agent.clone(),
        session: session.clone(),
        settings,
        tools: 0,
        after: Vec::new(),
        capture: false,
    };
    let mut flow = Flow::Continue;
    for step in steps {
        if turn.cancelled() {
            flow = Flow::Cancelled;
            break;
        }
        flow = turn.step(step).await;
        if !matches!(flow, Flow::Continue) {
            break;
        }
    }
    if matches!(flow, Flow::Continue) && turn.cancelled() {
        flow = Flow::Cancelled;
    }
    match flow {
        Flow::Continue => agent.respond(&id, json!({"stopReason": "end_turn"})),
        Flow::End(reason) => agent.respond(&id, json!({"stopReason": reason})),
        Flow::Fail(e) => agent.respond_err(&id, e),
        Flow::Cancelled => match turn.settings.on_cancel {
            OnCancel::Cancelled => agent.respond(&id, json!({"stopReason": "cancelled"})),
            OnCancel::EndTurn => agent.respond(&id, json!({"stopReason": "end_turn"})),
            OnCancel::Never => eprintln!(
                "warden-scripted-agent: cancelled; never answering the prompt as the scenario asks"
            ),
        },
    }
    let after = std::mem::take(&mut turn.after);
    if !after.is_empty() {
        let settings = Settings {
            vocab: turn.settings.vocab,
            on_cancel: turn.settings.on_cancel,
            report: turn.settings.report.clone(),
            string_ids: turn.settings.string_ids,
            demo: false,
        };
        let handle = tokio::spawn(after_turn(agent, session.clone(), settings, after));
        session.st().after_turn = Some(handle);
    }
}

/// Runs `after_turn` steps once their turn is answered: no turn is running (nothing cancels
/// them); what they say is kept for `after_turn_report`.
async fn after_turn(
    agent: Arc<Agent>,
    session: Arc<Session>,
    settings: Settings,
    after: Vec<(u64, Vec<Step>)>,
) {
    let (_never, cancel) = watch::channel(false);
    let mut t = Turn {
        agent,
        session,
        settings,
        cancel,
        tools: 0,
        after: Vec::new(),
        capture: true,
    };
    for (ms, steps) in after {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        for step in steps {
            if !matches!(t.step(step).await, Flow::Continue) {
                return;
            }
        }
    }
}

fn apply(agent: &Agent, session: &Session, s: &scenario::Scenario, settings: &mut Settings) {
    settings.vocab = s.vocabulary;
    settings.on_cancel = s.on_cancel;
    settings.report = s.report.clone();
    settings.string_ids = s.string_ids;
    if s.ignore_stdin_eof {
        agent
            .ignore_eof
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let mut st = session.st();
    if let Some(v) = s.vocabulary {
        st.vocab = v;
    }
    if let Some(m) = &s.mode {
        let m = if m == "adapter" {
            st.vocab.adapter_initial_mode().to_string()
        } else {
            m.clone()
        };
        st.mode = m;
    }
}

fn text_content(t: &str) -> Value {
    json!([{"type": "content", "content": {"type": "text", "text": t}}])
}

impl Turn {
    fn cancelled(&self) -> bool {
        *self.cancel.borrow()
    }

    /// Resolves once the client cancelled the turn (works on a clone of the
    /// receiver so it can race other borrows of `self`).
    async fn wait_cancel(&self) {
        let mut rx = self.cancel.clone();
        if rx.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    fn sid(&self) -> String {
        self.session.id.clone()
    }

    fn chunk(&self, kind: &str, text: &str) {
        if self.capture {
            if kind == "agent_message_chunk" {
                self.session
                    .st()
                    .after_turn_log
                    .push(text.trim_end().to_string());
            }
            return;
        }
        self.agent.update(
            &self.sid(),
            json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}}),
        );
        if kind == "agent_message_chunk" {
            self.session.st().history.push((false, text.to_string()));
        }
    }

    fn vocab(&self, over: Option<Vocab>) -> Vocab {
        over.or(self.settings.vocab)
            .unwrap_or_else(|| self.session.st().vocab)
    }

    fn set_mode(&self, mode: &str) {
        self.session.st().mode = mode.to_string();
        self.agent.update(
            &self.sid(),
            json!({"sessionUpdate": "current_mode_update", "currentModeId": mode}),
        );
    }

    async fn step(&mut self, step: Step) -> Flow {
        let sid = self.sid();
        match step {
            Step::Message { text } => self.chunk("agent_message_chunk", &text),
            Step::Thought { text } => self.chunk("agent_thought_chunk", &text),
            Step::UserMessage { text } => self.chunk("user_message_chunk", &text),
            Step::Plan { entries } => self.agent.update(&sid, json!({"sessionUpdate": "plan", "entries": entries})),
            Step::Usage { used, size, cost } => {
                let mut u = json!({"sessionUpdate": "usage_update", "used": used, "size": size});
                if let Some(c) = cost {
                    u["cost"] = c;
                }
                self.agent.update(&sid, u)
            }
            Step::Commands { commands } => self.agent.update(
                &sid,
                json!({"sessionUpdate": "available_commands_update", "availableCommands": commands}),
            ),
            Step::Update { update } => self.agent.update(&sid, update),
            Step::Raw { line } => self.agent.raw(line.into_bytes()),
            Step::Malformed { line } => self
                .agent
                .raw(line.unwrap_or_else(|| "{\"jsonrpc\":\"2.0\", this is not json".into()).into_bytes()),
            Step::Oversized { bytes } => self.agent.update(
                &sid,
                json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x".repeat(bytes.min(MAX_SIZE_STEP))}}),
            ),
            Step::Question { message, schema, again_while_message_id } => {
                return self.question(&message, schema, again_while_message_id.as_deref()).await;
            }
            Step::Tool(t) => return self.tool(*t).await,
            Step::PlanExit { vocabulary, plan } => return self.plan_exit(vocabulary, plan).await,
            Step::Mode { mode } => self.set_mode(&mode),
            Step::ReportConfig => {
                let text = {
                    let st = self.session.st();
                    format!("model={} thought_level={}", st.model, st.thought_level)
                };
                self.chunk("agent_message_chunk", &text)
            }
            Step::Sleep { ms } => {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    _ = self.wait_cancel() => return Flow::Cancelled,
                }
            }
            Step::Spawn { ignore_term, grandchild_setsid, pid_file, sleep_ms } => {
                let pid_file = pid_file.map(|p| self.session.cwd.join(p));
                if let Err(e) = spawn_helper(ignore_term, grandchild_setsid, pid_file.as_deref(), sleep_ms.unwrap_or(600_000)) {
                    self.chunk("agent_message_chunk", &format!("could not spawn the helper: {e}"));
                }
            }
            Step::Connect { host, port, via, send, read_ms } => {
                let wait = Duration::from_millis(read_ms.unwrap_or(3000));
                let out = tokio::select! {
                    r = crate::net::connect(&host, port, via, send.as_deref().unwrap_or(""), wait) => r,
                    _ = self.wait_cancel() => return Flow::Cancelled,
                };
                self.chunk("agent_message_chunk", &format!("connect-result: {out}\n"));
            }
            Step::Flood { method, count, path, stop_reading, command, output_byte_limit, terminal_id, raw_input_bytes, nest_depth } => {
                let body = Body { raw_input_bytes: raw_input_bytes.map(|b| b.min(MAX_SIZE_STEP)), nest_depth: nest_depth.map(|d| d.min(MAX_SIZE_STEP)) };
                let extra = FloodExtra { command, output_byte_limit, terminal_id, body };
                return self.flood(&method, count.min(MAX_FLOOD), path.as_deref(), stop_reading, extra).await;
            }
            Step::AfterTurn { ms, steps } => self.after.push((ms, steps)),
            Step::AfterTurnReport => {
                let running = self.session.st().after_turn.take();
                if let Some(h) = running {
                    tokio::select! {
                        _ = h => {}
                        _ = self.wait_cancel() => return Flow::Cancelled,
                    }
                }
                let log = std::mem::take(&mut self.session.st().after_turn_log);
                for line in log {
                    self.chunk("agent_message_chunk", &format!("after-turn: {line}\n"));
                }
            }
            Step::Stderr { bytes } => {
                use std::io::Write;
                let line = format!("{}\n", "e".repeat(1023));
                let mut err = std::io::stderr().lock();
                let mut left = bytes.min(MAX_SIZE_STEP);
                while left > 0 {
                    let n = left.min(line.len());
                    if err.write_all(&line.as_bytes()[..n]).is_err() {
                        break;
                    }
                    left -= n;
                }
            }
            Step::Exit { code } => {
                self.agent.flush().await;
                std::process::exit(code);
            }
            Step::Crash => {
                self.agent.flush().await;
                std::process::abort();
            }
            Step::Hang => {
                self.wait_cancel().await;
                return Flow::Cancelled;
            }
            Step::Stop { reason } => return Flow::End(reason),
            Step::Error { code, message } => return Flow::Fail(json!({"code": code, "message": message})),
        }
        Flow::Continue
    }

    /// `count` requests of `method` sent at once; see `Step::Flood`.
    async fn flood(
        &mut self,
        method: &str,
        count: usize,
        path: Option<&str>,
        stop_reading: bool,
        extra: FloodExtra,
    ) -> Flow {
        let body = extra.body;
        let sid = self.sid();
        if stop_reading {
            self.agent.stop_reading.send_replace(true);
        }
        let file = path.map(|p| self.session.cwd.join(p));
        let string_ids = self.settings.string_ids.unwrap_or(false);
        let mut answers = Vec::with_capacity(count);
        for i in 0..count {
            let params = match method {
                "session/request_permission" if body.hostile() => json!({"sessionId": sid,
                    "toolCall": {"toolCallId": format!("flood-{i}"), "kind": "execute", "title": format!("Run flood-{i}"),
                        "rawInput": body.raw_input()},
                    "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                                {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}),
                "session/request_permission" => json!({"sessionId": sid,
                    "toolCall": {"toolCallId": format!("flood-{i}"), "kind": "read", "title": format!("Read flood-{i}"),
                        "locations": [{"path": self.session.cwd.join(format!("flood-{i}"))}]},
                    "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                                {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}),
                "fs/write_text_file" => {
                    json!({"sessionId": sid, "path": file.clone().unwrap_or_else(|| self.session.cwd.join("flood.txt")),
                        "content": format!("flood {i}\n")})
                }
                "terminal/create" => {
                    let mut p = json!({"sessionId": sid, "command": "sh",
                        "args": ["-c", extra.command.as_deref().unwrap_or("true")]});
                    if let Some(l) = extra.output_byte_limit {
                        p["outputByteLimit"] = Value::from(l);
                    }
                    p
                }
                "terminal/output" => {
                    json!({"sessionId": sid, "terminalId": extra.terminal_id.as_deref().unwrap_or("term-1")})
                }
                "elicitation/create" => {
                    json!({"sessionId": sid, "mode": "form", "message": format!("flood question {i}"),
                    "requestedSchema": {"type": "object", "properties": {"answer": {"type": "string"}}}})
                }
                _ => {
                    json!({"sessionId": sid, "path": file.clone().unwrap_or_else(|| self.session.cwd.join("flood.txt"))})
                }
            };
            answers.push(self.agent.call(method, params, string_ids).1);
        }
        self.agent.flush().await;
        if stop_reading {
            self.wait_cancel().await;
            return Flow::Cancelled;
        }
        let (mut ok, mut errors, mut first_error) = (0usize, 0usize, Value::Null);
        let mut cancelled = 0usize;
        // Permission answers by option chosen (`cancelled` for a cancelled outcome).
        let mut selected = serde_json::Map::new();
        for rx in answers {
            let a = tokio::select! {
                a = rx => a,
                _ = self.wait_cancel() => return Flow::Cancelled,
            };
            match a {
                Ok(Ok(v)) => {
                    ok += 1;
                    if v.pointer("/outcome/outcome").and_then(Value::as_str) == Some("cancelled") {
                        cancelled += 1;
                    }
                    if method == "session/request_permission"
                        && let Some(key) = v.pointer("/outcome/optionId").and_then(Value::as_str)
                    {
                        let n = selected.get(key).and_then(Value::as_u64).unwrap_or(0);
                        selected.insert(key.to_string(), json!(n + 1));
                    }
                }
                Ok(Err(e)) => {
                    errors += 1;
                    if first_error.is_null() {
                        first_error = e.get("message").cloned().unwrap_or(e);
                    }
                }
                Err(_) => errors += 1,
            }
        }
        let mut result = json!({"ok": ok, "errors": errors, "first_error": first_error});
        // Of the permission answers, how many were `cancelled` and which option the others
        // chose (each only when there is one).
        if cancelled > 0 {
            result["cancelled"] = Value::from(cancelled);
        }
        if !selected.is_empty() {
            result["selected"] = Value::Object(selected);
        }
        self.chunk("agent_message_chunk", &format!("flood-result: {result}\n"));
        Flow::Continue
    }

    async fn question(
        &mut self,
        message: &str,
        schema: Option<Value>,
        again_while: Option<&str>,
    ) -> Flow {
        if !self.agent.cap("/elicitation") {
            self.chunk(
                "agent_message_chunk",
                "(I would ask a question, but the client cannot answer questions)",
            );
            return Flow::Continue;
        }
        let schema = schema.unwrap_or_else(
            || json!({"type": "object", "properties": {"answer": {"type": "string", "title": "Answer"}}, "required": ["answer"]}),
        );
        let answer = loop {
            let (_, rx) = self.agent.call(
                "elicitation/create",
                json!({"sessionId": self.sid(), "mode": "form", "message": message, "requestedSchema": schema.clone()}),
                self.settings.string_ids.unwrap_or(false),
            );
            let answer = tokio::select! {
                a = rx => a,
                _ = self.wait_cancel() => return Flow::Cancelled,
            };
            let again = match (&answer, again_while) {
                (Ok(Ok(v)), Some(prefix)) => v
                    .pointer("/_meta/warden/messageId")
                    .and_then(Value::as_str)
                    .is_some_and(|id| id.starts_with(prefix)),
                _ => false,
            };
            if !again {
                break answer;
            }
        };
        let reply = match answer {
            Ok(Ok(v)) => match v.get("action").and_then(Value::as_str) {
                Some("accept") => format!(
                    "You answered: {}",
                    v.get("content").cloned().unwrap_or(Value::Null)
                ),
                Some("decline") => "You declined to answer.".to_string(),
                _ => "You dismissed the question.".to_string(),
            },
            Ok(Err(e)) => format!("The question failed: {e}"),
            Err(_) => "The question got no answer.".to_string(),
        };
        self.chunk("agent_message_chunk", &reply);
        Flow::Continue
    }

    /// Send a permission request and wait for the answer. After a
    /// `session/cancel` it still waits up to 2 s, since the client must answer
    /// `cancelled` and tests read that from the report.
    async fn ask(
        &mut self,
        tool_call: Value,
        options: &[Value],
        vocab: Vocab,
        what: &str,
        withdraw_after_ms: Option<u64>,
    ) -> (Answer, bool, Value, Duration) {
        let mut withdrawn = false;
        let string_ids = self.settings.string_ids.unwrap_or(vocab == Vocab::Codex016);
        let params = json!({"sessionId": self.sid(), "toolCall": tool_call, "options": options});
        let t0 = Instant::now();
        let (id, mut rx) = self
            .agent
            .call("session/request_permission", params, string_ids);
        let mut cancelled = false;
        let withdraw = async {
            match withdraw_after_ms {
                Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(withdraw);
        let got = loop {
            tokio::select! {
                r = &mut rx => break Some(r),
                _ = self.wait_cancel() => { cancelled = true; break None }
                _ = &mut withdraw, if !withdrawn => {
                    // Like claude-agent-acp: withdraw the request; the client
                    // must still answer it (with `cancelled`).
                    withdrawn = true;
                    self.agent.send(&json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": id}}));
                }
            }
        };
        let got = match got {
            Some(r) => Some(r),
            None => tokio::time::timeout(Duration::from_secs(2), rx).await.ok(),
        };
        let rtt = t0.elapsed();
        let answer = match got {
            Some(Ok(r)) => Answer::from_response(r),
            _ => Answer::Error(
                json!({"code": -32603, "message": format!("no answer to the {what} permission request")}),
            ),
        };
        (answer, cancelled, id, rtt)
    }

    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        vocab: Vocab,
        what: &str,
        id: &Value,
        tool_call_id: &str,
        options: &[Value],
        answer: &Answer,
        rtt: Duration,
        reaction: &str,
        rule: bool,
    ) {
        let ids: Vec<Value> = options
            .iter()
            .filter_map(|o| o.get("optionId").cloned())
            .collect();
        let line = json!({"event": "permission", "vocabulary": vocab.name(), "what": what,
            "session_id": self.sid(), "request_id": id, "tool_call_id": tool_call_id, "options": ids,
            "answer": answer.to_json(), "rtt_us": rtt.as_micros() as u64, "reaction": reaction,
            "always_rule_written": rule});
        self.agent
            .report(&self.session, self.settings.report.as_deref(), &line);
    }

    async fn plan_exit(&mut self, vocabulary: Option<Vocab>, plan: Option<String>) -> Flow {
        let vocab = self.vocab(vocabulary);
        let Some(options) = vocab.plan_options() else {
            self.chunk(
                "agent_message_chunk",
                &format!("({} has no plan review; continuing)", vocab.name()),
            );
            return Flow::Continue;
        };
        self.tools += 1;
        let tcid = format!(
            "{}_plan_{}",
            if vocab.is_claude() { "toolu" } else { "call" },
            self.tools
        );
        let title = if vocab.is_claude() {
            "Ready to code?"
        } else {
            "Implement this plan?"
        };
        let plan = plan.unwrap_or_else(|| "1. Do the work\n2. Check it".into());
        let tc = json!({"toolCallId": tcid, "title": title, "kind": "switch_mode", "status": "pending",
            "content": text_content(&plan), "rawInput": {"plan": plan}});
        if vocab.is_claude() {
            let mut u = tc.clone();
            u["sessionUpdate"] = Value::from("tool_call");
            self.agent.update(&self.sid(), u);
        }
        let (answer, cancelled, id, rtt) = self.ask(tc, &options, vocab, "plan_exit", None).await;
        let reaction = vocab::react_plan(vocab, &answer);
        let label = match &reaction {
            PlanReaction::Exit { mode } => {
                format!("plan_exit:{}", mode.unwrap_or("collaboration_default"))
            }
            PlanReaction::Stay { end: Some(r) } => format!("turn_ended:{r}"),
            PlanReaction::Stay { end: None } => "plan_stay".into(),
        };
        self.report(
            vocab,
            "plan_exit",
            &id,
            &tcid,
            &options,
            &answer,
            rtt,
            &label,
            false,
        );
        if cancelled {
            return Flow::Cancelled;
        }
        let sid = self.sid();
        match reaction {
            PlanReaction::Exit { mode } => {
                self.agent.update(&sid, json!({"sessionUpdate": "tool_call_update", "toolCallId": tcid, "status": "completed"}));
                match mode {
                    Some(m) => self.set_mode(m),
                    None => self.agent.update(&sid, json!({"sessionUpdate": "config_option_update", "configOptions": [
                        {"id": "collaboration_mode", "name": "Collaboration mode", "type": "select", "currentValue": "default",
                         "options": [{"value": "default", "name": "Default"}, {"value": "plan", "name": "Plan"}]}]})),
                }
                Flow::Continue
            }
            PlanReaction::Stay { end } => {
                self.agent.update(&sid, json!({"sessionUpdate": "tool_call_update", "toolCallId": tcid, "status": "failed",
                    "content": text_content("User chose to keep planning")}));
                match end {
                    Some(r) => Flow::End(r.to_string()),
                    None => Flow::Continue,
                }
            }
        }
    }

    async fn tool(&mut self, t: ToolStep) -> Flow {
        let vocab = self.vocab(t.vocabulary);
        let cwd = self.session.cwd.clone();
        let kind = t.kind.clone();
        let abs = t.path.as_ref().map(|p| {
            let p = PathBuf::from(p);
            if p.is_absolute() { p } else { cwd.join(p) }
        });
        let abs_s = abs
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let command = t.command.clone().unwrap_or_default();
        if kind == "execute" && command.is_empty() {
            self.chunk(
                "agent_message_chunk",
                "(scenario error: an execute tool needs a command)",
            );
            return Flow::Continue;
        }
        if matches!(kind.as_str(), "edit" | "read" | "delete") && abs.is_none() {
            self.chunk(
                "agent_message_chunk",
                "(scenario error: this tool needs a path)",
            );
            return Flow::Continue;
        }
        let inside = abs.as_ref().is_none_or(|p| p.starts_with(&cwd));
        self.tools += 1;
        let claude = vocab.is_claude();
        let tcid = t.tool_call_id.clone().unwrap_or_else(|| {
            format!(
                "{}_scripted_{}",
                if claude { "toolu" } else { "call" },
                self.tools
            )
        });
        let content_new = t
            .content
            .clone()
            .unwrap_or_else(|| "Hello from warden's scripted agent\n".into());
        let title = t
            .title
            .clone()
            .unwrap_or_else(|| match (kind.as_str(), claude) {
                ("edit", true) => format!("Write {abs_s}"),
                ("edit", false) => format!("Edit {abs_s}"),
                ("execute", true) => format!("`{command}`"),
                ("execute", false) => command.clone(),
                ("read", _) => format!("Read {abs_s}"),
                ("delete", _) => format!("Delete {abs_s}"),
                (k, _) => k.to_string(),
            });
        let raw_input = match (kind.as_str(), vocab) {
            ("execute", Vocab::Codex016) => {
                json!({"command": ["/bin/bash", "-lc", command], "cwd": cwd,
                "reason": "scripted", "proposed_execpolicy_amendment": command.split_whitespace().collect::<Vec<_>>()})
            }
            ("execute", Vocab::Codex26) => json!({"command": command, "cwd": cwd}),
            ("execute", _) => json!({"command": command, "timeout": 30000}),
            ("edit", _) if claude => json!({"file_path": abs_s, "content": content_new}),
            ("edit", _) => json!({"changes": {abs_s.clone(): {"add": {"content": content_new}}}}),
            _ => json!({"file_path": abs_s}),
        };
        let content = match kind.as_str() {
            "edit" => {
                let old = abs.as_ref().and_then(|p| std::fs::read_to_string(p).ok());
                json!([{"type": "diff", "path": abs_s, "oldText": old, "newText": content_new}])
            }
            "execute" if vocab == Vocab::Codex016 => text_content("scripted command"),
            _ => json!([]),
        };
        let locations = match &abs {
            Some(_) => json!([{"path": abs_s}]),
            None => json!([]),
        };
        let full = json!({"toolCallId": tcid, "title": title, "kind": kind, "status": "pending",
            "content": content, "locations": locations, "rawInput": raw_input});
        let sid = self.sid();
        // Claude streams the tool call before asking; Codex only after approval.
        if claude {
            let mut u = full.clone();
            u["sessionUpdate"] = Value::from("tool_call");
            self.agent.update(&sid, u);
        }
        let key = match (kind.as_str(), claude) {
            ("execute", false) => format!("exec:{command}"),
            (k, _) => k.to_string(),
        };
        let (mode, remembered) = {
            let st = self.session.st();
            (st.mode.clone(), st.remembered.contains(&key))
        };
        let decided = match t.ask {
            Some(true) => None,
            Some(false) => Some(true),
            None if remembered => Some(true),
            None => vocab.mode_decides(&mode, &kind, inside),
        };
        let reaction = match decided {
            Some(true) => Reaction::Run {
                persist: false,
                remember: false,
            },
            Some(false) => Reaction::Refuse {
                message: format!("not allowed in {mode} mode"),
                end: None,
            },
            None => {
                let mut options =
                    vocab.tool_options(&kind, &command, t.offer_always, t.offer_decline);
                options.extend(t.extra_options.iter().cloned());
                let req_tc = if vocab == Vocab::Claude016 {
                    json!({"toolCallId": tcid, "title": title, "rawInput": raw_input})
                } else if claude {
                    full.clone()
                } else {
                    let mut c = full.clone();
                    if kind == "execute" {
                        c.as_object_mut().map(|o| o.remove("locations"));
                    }
                    c
                };
                let (answer, cancelled, id, rtt) = self
                    .ask(req_tc, &options, vocab, "tool", t.withdraw_after_ms)
                    .await;
                let reaction = if cancelled {
                    Reaction::Refuse {
                        message: "cancelled".into(),
                        end: Some("cancelled"),
                    }
                } else {
                    vocab::react_tool(vocab, &answer, &options)
                };
                let (label, rule) = match &reaction {
                    Reaction::Run { persist, .. } => ("ran".to_string(), *persist),
                    Reaction::Refuse { end: Some(r), .. } => (format!("turn_ended:{r}"), false),
                    Reaction::Refuse { end: None, .. } => ("refused".to_string(), false),
                    Reaction::FailPrompt(_) => ("failed_prompt".to_string(), false),
                };
                self.report(
                    vocab, "tool", &id, &tcid, &options, &answer, rtt, &label, rule,
                );
                if cancelled {
                    self.agent.update(&sid, json!({"sessionUpdate": "tool_call_update", "toolCallId": tcid, "status": "failed",
                        "content": text_content("cancelled")}));
                    return Flow::Cancelled;
                }
                reaction
            }
        };
        match reaction {
            Reaction::Run { persist, remember } => {
                if persist && let Err(e) = write_rule(vocab, &cwd, &kind, &command) {
                    eprintln!("warden-scripted-agent: cannot write the always rule: {e}");
                }
                if remember {
                    self.session.st().remembered.insert(key);
                }
                if claude {
                    self.agent.update(&sid, json!({"sessionUpdate": "tool_call_update", "toolCallId": tcid, "status": "in_progress"}));
                } else {
                    let mut u = full.clone();
                    u["sessionUpdate"] = Value::from("tool_call");
                    u["status"] = Value::from("in_progress");
                    self.agent.update(&sid, u);
                }
                let via_client = |cap: &str| match t.via.as_deref() {
                    Some("client") => true,
                    Some(_) => false,
                    None => vocab == Vocab::Claude016 && self.agent.cap(cap),
                };
                let result = match kind.as_str() {
                    "edit" => {
                        let client = via_client("/fs/writeTextFile");
                        let written = t.then_write.as_deref().unwrap_or(&content_new);
                        self.write_file(abs.as_deref(), written, client)
                            .await
                            .map(|_| format!("wrote {abs_s}"))
                    }
                    "read" => {
                        let client = via_client("/fs/readTextFile");
                        self.read_file(abs.as_deref(), client).await
                    }
                    "delete" => match &abs {
                        Some(p) => std::fs::remove_file(p)
                            .map(|_| format!("deleted {abs_s}"))
                            .map_err(|e| e.to_string()),
                        None => Err("no path".into()),
                    },
                    "execute" => {
                        let client = via_client("/terminal");
                        let ran = t.then_run.as_deref().unwrap_or(&command);
                        let env = t.then_env.clone().unwrap_or_default();
                        let argv = match &t.then_argv {
                            Some(v) if !v.is_empty() => v.clone(),
                            _ => vec!["sh".into(), "-c".into(), ran.to_string()],
                        };
                        tokio::select! {
                            r = self.execute(&argv, &cwd, client, &env) => r,
                            _ = self.wait_cancel() => {
                                self.agent.update(&sid, json!({"sessionUpdate": "tool_call_update", "toolCallId": tcid, "status": "failed"}));
                                return Flow::Cancelled;
                            }
                        }
                    }
                    _ => Ok("done".to_string()),
                };
                let (status, text, ran) = match result {
                    Ok(out) => ("completed", out, true),
                    Err(e) => ("failed", e, false),
                };
                self.agent.update(&sid, json!({"sessionUpdate": "tool_call_update", "toolCallId": tcid, "status": status,
                    "content": text_content(&text), "rawOutput": {"output": text}}));
                if self.settings.demo {
                    self.demo_reply(&kind, &t, &command, ran, &text);
                }
                Flow::Continue
            }
            Reaction::Refuse { message, end } => {
                self.agent.update(&sid, json!({"sessionUpdate": "tool_call_update", "toolCallId": tcid, "status": "failed",
                    "content": text_content(&message)}));
                if self.settings.demo && end.is_none() {
                    self.demo_reply(&kind, &t, &command, false, &message);
                }
                match end {
                    Some(r) => Flow::End(r.to_string()),
                    None => Flow::Continue,
                }
            }
            Reaction::FailPrompt(e) => Flow::Fail(e),
        }
    }

    fn demo_reply(&self, kind: &str, t: &ToolStep, command: &str, ran: bool, text: &str) {
        let name = t.path.clone().unwrap_or_default();
        let reply = match (kind, ran) {
            ("edit", true) => format!("I wrote {name}."),
            ("edit", false) => {
                format!("Permission to write {name} was refused ({text}), so I did not write it.")
            }
            ("execute", true) => format!("I ran `{command}`:\n{text}"),
            ("execute", false) => {
                format!("Running `{command}` was refused or failed ({text}), so it did not run.")
            }
            ("read", true) => format!("{name} contains:\n{text}"),
            ("delete", true) => format!("I deleted {name}."),
            (_, _) => format!("The {kind} tool did not run: {text}"),
        };
        self.chunk("agent_message_chunk", &reply);
    }

    async fn write_file(
        &self,
        path: Option<&Path>,
        content: &str,
        client: bool,
    ) -> Result<(), String> {
        let path = path.ok_or("no path")?;
        if client {
            self.agent
                .call_wait(
                    "fs/write_text_file",
                    json!({"sessionId": self.sid(), "path": path, "content": content}),
                )
                .await
                .map(|_| ())
        } else {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
            }
            std::fs::write(path, content).map_err(|e| e.to_string())
        }
    }

    async fn read_file(&self, path: Option<&Path>, client: bool) -> Result<String, String> {
        let path = path.ok_or("no path")?;
        if client {
            let v = self
                .agent
                .call_wait(
                    "fs/read_text_file",
                    json!({"sessionId": self.sid(), "path": path}),
                )
                .await?;
            v.get("content")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| "malformed read answer".into())
        } else {
            std::fs::read_to_string(path).map_err(|e| e.to_string())
        }
    }

    async fn execute(
        &self,
        argv: &[String],
        cwd: &Path,
        client: bool,
        env: &std::collections::BTreeMap<String, String>,
    ) -> Result<String, String> {
        if client {
            let sid = self.sid();
            let env: Vec<Value> = env
                .iter()
                .map(|(k, v)| json!({"name": k, "value": v}))
                .collect();
            let created = self
                .agent
                .call_wait(
                    "terminal/create",
                    json!({"sessionId": sid, "command": argv[0], "args": &argv[1..],
                    "cwd": cwd, "env": env, "outputByteLimit": 1_048_576}),
                )
                .await?;
            let tid = created
                .get("terminalId")
                .and_then(Value::as_str)
                .ok_or("no terminalId")?
                .to_string();
            let p = json!({"sessionId": sid, "terminalId": tid});
            let exit = self
                .agent
                .call_wait("terminal/wait_for_exit", p.clone())
                .await?;
            let out = self.agent.call_wait("terminal/output", p.clone()).await?;
            let _ = self.agent.call_wait("terminal/release", p).await;
            let output = out
                .get("output")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            match exit.get("exitCode").and_then(Value::as_u64) {
                Some(0) => Ok(output),
                other => Err(format!("exit {other:?}: {output}")),
            }
        } else {
            let out = tokio::process::Command::new(&argv[0])
                .args(&argv[1..])
                .current_dir(cwd)
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output()
                .await
                .map_err(|e| e.to_string())?;
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            if text.len() > 65536 {
                let mut cut = text.len() - 65536;
                while !text.is_char_boundary(cut) {
                    cut += 1;
                }
                text = text[cut..].to_string();
            }
            if out.status.success() {
                Ok(text)
            } else {
                Err(format!("{}: {text}", out.status))
            }
        }
    }
}

/// Persist the "always" rule where the real adapter would (inside the cwd),
/// so tests can prove warden never picked an always option.
fn write_rule(vocab: Vocab, cwd: &Path, kind: &str, command: &str) -> std::io::Result<()> {
    if vocab.is_claude() {
        let dir = cwd.join(".claude");
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("settings.local.json");
        let mut settings: Value = std::fs::read_to_string(&file)
            .ok()
            .and_then(|s| serde_json::from_str::<Value>(&s).ok())
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        let rule = match (vocab, kind) {
            (Vocab::Claude016, "execute") => "mcp__acp__Bash".to_string(),
            (Vocab::Claude016, "read") => "mcp__acp__Read".to_string(),
            (Vocab::Claude016, _) => "mcp__acp__Write".to_string(),
            (_, "execute") => format!("Bash({command}:*)"),
            (_, "read") => "Read".to_string(),
            _ => "Write".to_string(),
        };
        if !settings.get("permissions").is_some_and(Value::is_object) {
            settings["permissions"] = json!({});
        }
        if !settings["permissions"]
            .get("allow")
            .is_some_and(Value::is_array)
        {
            settings["permissions"]["allow"] = json!([]);
        }
        if let Some(a) = settings["permissions"]["allow"].as_array_mut() {
            a.push(Value::from(rule));
        }
        std::fs::write(
            file,
            serde_json::to_string_pretty(&settings).unwrap_or_default(),
        )
    } else {
        use std::io::Write;
        let dir = cwd.join(".codex").join("rules");
        std::fs::create_dir_all(&dir)?;
        let words: Vec<String> = command
            .split_whitespace()
            .map(|w| format!("{w:?}"))
            .collect();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("default.rules"))?;
        writeln!(
            f,
            "prefix_rule(pattern=[{}], decision=\"allow\")",
            words.join(", ")
        )
    }
}

/// Spawn `warden-scripted-agent --helper-sleep-ms ...` (a sleeping child).
fn spawn_helper(
    ignore_term: bool,
    grandchild_setsid: bool,
    pid_file: Option<&Path>,
    ms: u64,
) -> std::io::Result<()> {
    let exe = std::env::current_exe()?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("--helper-sleep-ms").arg(ms.to_string());
    if ignore_term {
        cmd.arg("--helper-ignore-term");
    }
    if grandchild_setsid {
        cmd.arg("--helper-grandchild");
    }
    if let Some(p) = pid_file {
        cmd.arg("--helper-pid-file").arg(p);
    }
    // The helper must never write on our stdout: that is the protocol stream.
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    cmd.spawn().map(|_| ())
}

/// The helper process: optionally ignore SIGTERM / setsid / start a grandchild
/// that does both, record its pid, sleep.
pub fn helper_main(
    ms: u64,
    ignore_term: bool,
    setsid: bool,
    grandchild: bool,
    pid_file: Option<PathBuf>,
) -> ExitCode {
    use nix::sys::signal::{SigHandler, Signal, signal};
    if ignore_term {
        // SAFETY: SIG_IGN installs no Rust handler; nothing runs in signal context.
        if let Err(e) = unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) } {
            eprintln!("helper: cannot ignore SIGTERM: {e}");
        }
    }
    if setsid && let Err(e) = nix::unistd::setsid() {
        eprintln!("helper: setsid failed: {e}");
    }
    if let Some(p) = &pid_file {
        use std::io::Write;
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .and_then(|mut f| writeln!(f, "{}", std::process::id()));
        if let Err(e) = res {
            eprintln!("helper: cannot write pid file: {e}");
        }
    }
    if grandchild {
        let spawned = std::env::current_exe().and_then(|exe| {
            let mut c = std::process::Command::new(exe);
            c.arg("--helper-sleep-ms")
                .arg(ms.to_string())
                .arg("--helper-ignore-term")
                .arg("--helper-setsid");
            if let Some(p) = &pid_file {
                c.arg("--helper-pid-file").arg(p);
            }
            c.stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
        });
        if let Err(e) = spawned {
            eprintln!("helper: cannot spawn the grandchild: {e}");
        }
    }
    std::thread::sleep(Duration::from_millis(ms));
    ExitCode::SUCCESS
}
