//! One prompt turn: pick the steps, run them, answer the prompt.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::agent::{Agent, Session};
use crate::scenario::{self, OnCancel, Step};
use crate::vocab::Vocab;

mod ask;
mod flood;
mod helper;
mod tool;

use flood::{Body, FloodExtra};
pub use helper::helper_main;
use helper::spawn_helper;

/// Cap on `oversized` / `stderr` sizes: a scenario typo must not exhaust memory.
const MAX_SIZE_STEP: usize = 1 << 30;
/// A flood step sends at most this many requests.
const MAX_FLOOD: usize = 100_000;

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
}
