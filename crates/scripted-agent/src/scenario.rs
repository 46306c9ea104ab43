//! Scenario format, where a turn's steps come from (inline JSON, TCK prefix,
//! scenario file, or the demo reading of a plain prompt).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::vocab::Vocab;

/// What the agent does when the client sends `session/cancel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnCancel {
    /// Answer the prompt `stopReason: cancelled` (what the spec requires).
    #[default]
    Cancelled,
    /// Misbehave: answer `end_turn` after a cancel.
    EndTurn,
    /// Misbehave: never answer the prompt.
    Never,
}

/// A scenario: settings plus the steps of each turn.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Default option vocabulary of permission steps.
    #[serde(default)]
    pub vocabulary: Option<Vocab>,
    /// Mode a new session starts in (`"adapter"` = the real adapter's default,
    /// e.g. `auto` for claude-0.101, `agent` for codex-2.6). Without it the
    /// session starts in the adapter's prompting mode.
    #[serde(default)]
    pub initial_mode: Option<String>,
    /// Switch the session to this mode when the turn starts.
    #[serde(default)]
    pub mode: Option<String>,
    /// Cancel behaviour.
    #[serde(default)]
    pub on_cancel: OnCancel,
    /// Permission report file (JSON lines), relative to the session cwd.
    #[serde(default)]
    pub report: Option<String>,
    /// Use string (UUID) ids for the agent's requests (default: codex-0.16 yes).
    #[serde(default)]
    pub string_ids: Option<bool>,
    /// Keep running after stdin closes.
    #[serde(default)]
    pub ignore_stdin_eof: bool,
    /// Steps of every turn (when `turns` is empty).
    #[serde(default)]
    pub steps: Vec<Step>,
    /// Steps per turn, in order; the last one repeats.
    #[serde(default)]
    pub turns: Vec<Vec<Step>>,
}

impl Scenario {
    /// Steps for the `n`th prompt (0-based).
    pub fn steps_for(&self, n: usize) -> Vec<Step> {
        if self.turns.is_empty() {
            self.steps.clone()
        } else {
            self.turns[n.min(self.turns.len() - 1)].clone()
        }
    }
}

/// A permission-asking tool call.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolStep {
    /// `edit`, `read`, `delete`, `execute`, `fetch`, `search`, `other`.
    pub kind: String,
    /// File path (relative to cwd, or absolute).
    #[serde(default)]
    pub path: Option<String>,
    /// New file content for `edit`.
    #[serde(default)]
    pub content: Option<String>,
    /// Shell command for `execute` (run with `sh -c`).
    #[serde(default)]
    pub command: Option<String>,
    /// Title override.
    #[serde(default)]
    pub title: Option<String>,
    /// Vocabulary override.
    #[serde(default)]
    pub vocabulary: Option<Vocab>,
    /// `true`: always ask; `false`: never ask; absent: as the adapter in its mode.
    #[serde(default)]
    pub ask: Option<bool>,
    /// Offer the "always" option where the adapter only sometimes does.
    #[serde(default)]
    pub offer_always: Option<bool>,
    /// Codex: offer the turn-keeping refusal (`denied` / `decline`).
    #[serde(default)]
    pub offer_decline: Option<bool>,
    /// Extra raw options appended to the offered list (e.g. an unknown kind).
    #[serde(default)]
    pub extra_options: Vec<Value>,
    /// `client` (fs/*, terminal/*) or `direct`; default: as the adapter does.
    #[serde(default)]
    pub via: Option<String>,
    /// Tool call id override.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// Send `$/cancel_request` for the permission request after this long
    /// (the client must still answer it, with `cancelled`).
    #[serde(default)]
    pub withdraw_after_ms: Option<u64>,
    /// A hostile agent: once allowed, run this command instead of `command`.
    #[serde(default)]
    pub then_run: Option<String>,
    /// A hostile agent: once allowed, write this content instead of `content`.
    #[serde(default)]
    pub then_write: Option<String>,
    /// A hostile agent: the `terminal/create` of an allowed execute carries these environment
    /// entries (`{"NAME": "value"}`), which the decision did not see.
    #[serde(default)]
    pub then_env: Option<std::collections::BTreeMap<String, String>>,
    /// A hostile agent: the `terminal/create` of this execute names this program and these
    /// arguments (`[program, arg…]`) instead of `sh -c <command>`.
    #[serde(default)]
    pub then_argv: Option<Vec<String>>,
}

/// How a `connect` step reaches its destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectVia {
    #[default]
    Proxy,
    Direct,
    ProxyRaw,
    Socket,
}

/// One scenario step.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// `agent_message_chunk`.
    Message {
        /// Text.
        text: String,
    },
    /// `agent_thought_chunk`.
    Thought {
        /// Text.
        text: String,
    },
    /// `user_message_chunk`.
    UserMessage {
        /// Text.
        text: String,
    },
    /// `plan` with entries `{content, priority, status}`.
    Plan {
        /// Entries.
        entries: Vec<Value>,
    },
    /// `usage_update`.
    Usage {
        /// Used tokens.
        used: u64,
        /// Context size.
        size: u64,
        /// Optional cost.
        #[serde(default)]
        cost: Option<Value>,
    },
    /// `available_commands_update`.
    Commands {
        /// Commands `{name, description}`.
        commands: Vec<Value>,
    },
    /// Any `session/update` body (e.g. an unknown variant).
    Update {
        /// The `update` object.
        update: Value,
    },
    /// A raw line on stdout.
    Raw {
        /// The line.
        line: String,
    },
    /// A line that is not JSON.
    Malformed {
        /// The line (default: broken JSON).
        #[serde(default)]
        line: Option<String>,
    },
    /// A valid `agent_message_chunk` line of about `bytes` bytes.
    Oversized {
        /// Size.
        bytes: usize,
    },
    /// `elicitation/create`, then a message with the answer.
    Question {
        /// The question.
        message: String,
        /// Form schema (default: one string field `answer`).
        #[serde(default)]
        schema: Option<Value>,
        /// Ask again while the answering message's id (`_meta.warden.messageId` of the answer)
        /// starts with this prefix (the TCK's multi-turn input: every `tck-input-required`
        /// follow-up is asked again, another message moves on).
        #[serde(default)]
        again_while_message_id: Option<String>,
    },
    /// A tool call with a permission request.
    Tool(Box<ToolStep>),
    /// Ask to leave plan mode (Claude ExitPlanMode, Codex 2.6 plan review).
    PlanExit {
        /// Vocabulary override.
        #[serde(default)]
        vocabulary: Option<Vocab>,
        /// Plan text.
        #[serde(default)]
        plan: Option<String>,
    },
    /// Switch mode and emit `current_mode_update`.
    Mode {
        /// Mode id.
        mode: String,
    },
    /// Sleep (cancellable).
    Sleep {
        /// Milliseconds.
        ms: u64,
    },
    /// Spawn a sleeping child (for containment tests).
    Spawn {
        /// The child ignores SIGTERM.
        #[serde(default)]
        ignore_term: bool,
        /// The child starts a grandchild that calls setsid and ignores SIGTERM.
        #[serde(default)]
        grandchild_setsid: bool,
        /// Each process appends its pid here (relative to cwd).
        #[serde(default)]
        pid_file: Option<String>,
        /// How long they sleep (default 10 minutes).
        #[serde(default)]
        sleep_ms: Option<u64>,
    },
    /// A message saying the session's model and thought level (`model=… thought_level=…`).
    ReportConfig,
    /// Open a network connection and report the outcome as a message line
    /// `connect-result: {json}` (for egress tests).
    Connect {
        /// Destination host (a name or an IP literal, as sent).
        #[serde(default)]
        host: String,
        /// Destination port.
        #[serde(default)]
        port: u16,
        /// `proxy` (a CONNECT through `HTTPS_PROXY`), `direct` (straight to host:port),
        /// `proxy_raw` (`send` verbatim to the proxy port), `socket` (`send` verbatim to the
        /// egress proxy's Unix socket itself, bypassing the relay).
        #[serde(default)]
        via: ConnectVia,
        /// Bytes to send once connected (after the tunnel is open with `proxy`).
        #[serde(default)]
        send: Option<String>,
        /// How long to wait for the answer (default 3000 ms).
        #[serde(default)]
        read_ms: Option<u64>,
    },
    /// Send `count` requests of `method` at once, without waiting for answers (a hostile
    /// agent's flood), then report `flood-result: {"ok","errors","first_error"}` once every one
    /// is answered — or, with `stop_reading`, stop reading stdin first and never finish (the
    /// answers pile up at the client).
    Flood {
        /// `fs/read_text_file` (default), `fs/write_text_file`, `session/request_permission`,
        /// `elicitation/create`, `terminal/create` (`sh -c command`, never released) or
        /// `terminal/output` (of `terminal_id`).
        #[serde(default = "default_flood_method")]
        method: String,
        /// How many.
        count: usize,
        /// The file read (relative to the cwd or absolute), for `fs/read_text_file`.
        #[serde(default)]
        path: Option<String>,
        /// Stop reading stdin before sending.
        #[serde(default)]
        stop_reading: bool,
        /// The command of each `terminal/create` (`sh -c`; default `true`).
        #[serde(default)]
        command: Option<String>,
        /// The `outputByteLimit` of each `terminal/create` (none by default).
        #[serde(default)]
        output_byte_limit: Option<u64>,
        /// The terminal `terminal/output` asks for.
        #[serde(default)]
        terminal_id: Option<String>,
        /// `session/request_permission` only: each request is an `execute` whose raw input's
        /// `command` is a string of this many bytes (a hostile agent's oversized body).
        #[serde(default)]
        raw_input_bytes: Option<usize>,
        /// `session/request_permission` only: each request is an `execute` whose raw input
        /// holds arrays nested this deep (a hostile agent's deeply nested body).
        #[serde(default)]
        nest_depth: Option<usize>,
    },
    /// A hostile agent that goes on after its turn: `steps` run in the background `ms` after
    /// this turn's prompt is answered (the turn itself goes on at once). Their message lines
    /// are not sent (nobody reads them between turns) but kept for `after_turn_report`.
    AfterTurn {
        /// Delay after the prompt's answer.
        #[serde(default)]
        ms: u64,
        /// What to do then.
        steps: Vec<Step>,
    },
    /// Wait for the `after_turn` steps of an earlier turn to finish, then send what they would
    /// have said, one message line `after-turn: <text>` each.
    AfterTurnReport,
    /// Write this many bytes to stderr.
    Stderr {
        /// Size.
        bytes: usize,
    },
    /// Exit the process with this code (mid-turn, no answer).
    Exit {
        /// Exit code.
        code: i32,
    },
    /// Abort the process (SIGABRT) mid-turn.
    Crash,
    /// Never finish the turn (unless cancelled).
    Hang,
    /// End the turn now with this stop reason.
    Stop {
        /// `end_turn`, `max_tokens`, `refusal`, `cancelled`, ...
        reason: String,
    },
    /// Answer the prompt with a JSON-RPC error.
    Error {
        /// Code.
        code: i64,
        /// Message.
        message: String,
    },
}

fn default_flood_method() -> String {
    "fs/read_text_file".into()
}

/// Inline scenario in a prompt: the whole text is a JSON object, or it has a
/// fenced json block. `None` = not inline; `Some(Err)` = inline but invalid.
pub fn inline_scenario(text: &str) -> Option<Result<Scenario, String>> {
    let t = text.trim();
    let body = if t.starts_with('{') {
        t.to_string()
    } else if let Some(start) = t.find("```json") {
        let rest = &t[start + 7..];
        let end = rest.find("```")?;
        rest[..end].to_string()
    } else {
        return None;
    };
    Some(serde_json::from_str::<Scenario>(&body).map_err(|e| format!("bad inline scenario: {e}")))
}

/// The A2A TCK behaviours, keyed on the messageId prefix (a2a-tck 1.0
/// `scenarios/*.feature`, with the texts those scenarios name).
///
/// ACP has no notion of A2A artifacts or replies, so the chunks say what they are in
/// `_meta.warden` (read by the gateway, passed through by the supervisor as
/// `TextChunk.meta_json`): `artifact = {artifactId, name, kind: text|file|url|data, append?,
/// lastChunk?, filename?, mediaType?}` puts the chunk's text into that artifact (a file's bytes, a
/// URL, JSON data); `a2a = "message"` marks a direct reply; `a2a = "reject"` marks the reason of a
/// rejection (the turn then stops with `refusal`). Every one is a plain `text` chunk, so a client
/// that ignores the hints still sees the content.
pub fn tck_steps(message_id: &str) -> Option<Vec<Step>> {
    let msg = |t: &str| Step::Message { text: t.into() };
    let chunk = |text: &str, meta: Value| Step::Update {
        update: json!({"sessionUpdate": "agent_message_chunk",
                       "content": {"type": "text", "text": text}, "_meta": {"warden": meta}}),
    };
    let text_artifact = |text: &str| {
        chunk(
            text,
            json!({"artifact": {"artifactId": "text-artifact", "name": "text-artifact", "kind": "text"}}),
        )
    };
    let file_artifact = || {
        chunk(
            "tck",
            json!({"artifact": {"artifactId": "file-artifact", "name": "file-artifact", "kind": "file",
                                "filename": "output.txt", "mediaType": "text/plain"}}),
        )
    };
    let end = || Step::Stop {
        reason: "end_turn".into(),
    };
    let working = || Step::Thought {
        text: "working".into(),
    };
    // A streamed artifact comes a moment after WORKING, as a real agent's would.
    let streamed = |artifact: Step| vec![working(), Step::Sleep { ms: 200 }, artifact, end()];
    let id = message_id;
    let steps = if id.starts_with("tck-complete-task") {
        vec![msg("Hello from TCK"), end()]
    } else if id.starts_with("tck-artifact-text") {
        vec![text_artifact("Generated text content"), end()]
    } else if id.starts_with("tck-artifact-file-url") {
        vec![
            chunk(
                "https://example.com/output.txt",
                json!({"artifact": {"artifactId": "file-url-artifact", "name": "file-url-artifact",
                                    "kind": "url", "filename": "output.txt", "mediaType": "text/plain"}}),
            ),
            end(),
        ]
    } else if id.starts_with("tck-artifact-file") {
        vec![file_artifact(), end()]
    } else if id.starts_with("tck-artifact-data") {
        vec![
            chunk(
                r#"{"key": "value", "count": 42}"#,
                json!({"artifact": {"artifactId": "data-artifact", "name": "data-artifact", "kind": "data"}}),
            ),
            end(),
        ]
    } else if id.starts_with("tck-message-response") {
        vec![
            chunk("Direct message response", json!({"a2a": "message"})),
            end(),
        ]
    } else if id.starts_with("tck-input-required") {
        vec![
            Step::Question {
                message: "Please provide input".into(),
                schema: None,
                again_while_message_id: Some("tck-input-required".into()),
            },
            msg("Hello from TCK"),
            end(),
        ]
    } else if id.starts_with("tck-reject-task") {
        vec![
            chunk("rejected", json!({"a2a": "reject"})),
            Step::Stop {
                reason: "refusal".into(),
            },
        ]
    } else if id.starts_with("tck-stream-artifact-chunked") {
        let mut v = vec![working()];
        for (i, text) in ["chunk-1 ", "chunk-2"].into_iter().enumerate() {
            v.push(Step::Sleep { ms: 50 });
            v.push(chunk(
                text,
                json!({"artifact": {"artifactId": "chunked", "name": "chunked", "kind": "text",
                        "append": i > 0, "lastChunk": i == 1}}),
            ));
        }
        v.push(end());
        v
    } else if id.starts_with("tck-stream-artifact-text") {
        streamed(text_artifact("Streamed text content"))
    } else if id.starts_with("tck-stream-artifact-file") {
        streamed(file_artifact())
    } else if id.starts_with("tck-stream-ordering-001") {
        streamed(text_artifact("Ordered output"))
    } else if id.starts_with("tck-stream-001") {
        streamed(text_artifact("Stream hello from TCK"))
    } else if id.starts_with("tck-stream-002") {
        vec![end()]
    } else if id.starts_with("tck-stream-003") {
        streamed(text_artifact("Stream task lifecycle"))
    } else if id.starts_with("tck-stream-") {
        streamed(text_artifact("Stream hello from TCK"))
    } else if id.starts_with("test-resubscribe-message-id") {
        vec![
            working(),
            Step::Sleep { ms: 4000 },
            msg("Hello from TCK"),
            end(),
        ]
    } else {
        return None;
    };
    Some(steps)
}

/// The demo reading of a plain prompt: `write FILE [with TEXT]`,
/// `run COMMAND`, `read FILE`, `delete FILE`; anything else gets an echo.
pub fn demo_steps(text: &str) -> Vec<Step> {
    let t = text.trim();
    // ASCII lowercasing keeps byte offsets valid for slicing `t`.
    let lower = t.to_ascii_lowercase();
    let after = |n: usize| t.get(n..).unwrap_or("").trim().to_string();
    let first_word = |s: &str| {
        s.split_whitespace()
            .next()
            .unwrap_or("")
            .trim_matches(|c| c == '"' || c == '\'' || c == '`')
            .to_string()
    };
    let tool = |kind: &str,
                path: Option<String>,
                command: Option<String>,
                content: Option<String>,
                title: String| {
        Step::Tool(Box::new(ToolStep {
            kind: kind.into(),
            path,
            command,
            content,
            title: Some(title),
            ask: Some(true),
            ..ToolStep::default()
        }))
    };
    for verb in ["write ", "create "] {
        if lower.starts_with(verb) {
            let rest = after(verb.len());
            let name = first_word(&rest);
            if name.is_empty() {
                break;
            }
            let content = ["with ", "containing "]
                .iter()
                .find_map(|k| {
                    rest.to_ascii_lowercase()
                        .find(k)
                        .map(|i| rest[i + k.len()..].to_string())
                })
                .map(|c| format!("{}\n", c.trim_matches(|c| c == '"' || c == '\'')))
                .unwrap_or_else(|| "Hello from warden's scripted agent\n".into());
            return vec![
                Step::Message {
                    text: format!("I'll write {name}."),
                },
                tool(
                    "edit",
                    Some(name.clone()),
                    None,
                    Some(content),
                    format!("Write {name}"),
                ),
            ];
        }
    }
    for verb in ["run ", "execute "] {
        if lower.starts_with(verb) {
            let cmd = after(verb.len()).trim_matches('`').to_string();
            return vec![
                Step::Message {
                    text: format!("I'll run `{cmd}`."),
                },
                tool(
                    "execute",
                    None,
                    Some(cmd.clone()),
                    None,
                    format!("Run `{cmd}`"),
                ),
            ];
        }
    }
    for (verb, kind, label) in [
        ("read ", "read", "Read"),
        ("cat ", "read", "Read"),
        ("delete ", "delete", "Delete"),
        ("rm ", "delete", "Delete"),
    ] {
        if lower.starts_with(verb) {
            let name = first_word(&after(verb.len()));
            if name.is_empty() {
                break;
            }
            return vec![tool(
                kind,
                Some(name.clone()),
                None,
                None,
                format!("{label} {name}"),
            )];
        }
    }
    vec![Step::Message {
        text: format!(
            "warden-scripted-agent received: {t}\nTry \"write hello.txt\", \"run ls\", \"read FILE\", or send a JSON scenario."
        ),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_forms() {
        assert!(inline_scenario("write hello.txt").is_none());
        let s = inline_scenario(
            r#"{"vocabulary":"codex-2.6","steps":[{"type":"message","text":"hi"}]}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.vocabulary, Some(Vocab::Codex26));
        let s = inline_scenario("please\n```json\n{\"steps\":[{\"type\":\"crash\"}]}\n```")
            .unwrap()
            .unwrap();
        assert!(matches!(s.steps[0], Step::Crash));
        assert!(
            inline_scenario(r#"{"steps":[{"type":"nope"}]}"#)
                .unwrap()
                .is_err()
        );
        assert!(inline_scenario(r#"{"stepz":[]}"#).unwrap().is_err());
    }

    #[test]
    fn demo_reads_intent() {
        let s = demo_steps("write notes/a.txt with hi there");
        let Step::Tool(t) = &s[1] else { panic!() };
        assert_eq!(t.path.as_deref(), Some("notes/a.txt"));
        assert_eq!(t.content.as_deref(), Some("hi there\n"));
        assert_eq!(t.title.as_deref(), Some("Write notes/a.txt"));
        let s = demo_steps("run ls -la");
        let Step::Tool(t) = &s[1] else { panic!() };
        assert_eq!(t.command.as_deref(), Some("ls -la"));
        assert!(matches!(demo_steps("hello")[0], Step::Message { .. }));
        // Multi-byte text never breaks slicing.
        for t in [
            "WRİTE İİ.txt with İ",
            "write ü.txt WİTH ß",
            "run",
            "write ",
            "İwrite x",
            "rm \u{212A}",
        ] {
            let _ = demo_steps(t);
        }
    }

    #[test]
    fn shipped_scenarios_parse() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_some_and(|e| e == "json") {
                let text = std::fs::read_to_string(&p).unwrap();
                let s: Scenario =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                assert!(
                    !s.steps.is_empty() || !s.turns.is_empty(),
                    "{}",
                    p.display()
                );
                n += 1;
            }
        }
        assert!(n >= 5);
    }

    #[test]
    fn tck_prefixes() {
        assert!(tck_steps("tck-complete-task-123").is_some());
        assert!(tck_steps("tck-artifact-file-url-1").is_some());
        assert!(tck_steps("tck-stream-001").is_some());
        assert!(tck_steps("other").is_none());
    }

    /// The hinted chunks of a TCK behaviour: (text, `_meta.warden`).
    fn hinted(id: &str) -> Vec<(String, Value)> {
        tck_steps(id)
            .unwrap()
            .into_iter()
            .filter_map(|s| match s {
                Step::Update { update } => Some((
                    update["content"]["text"].as_str().unwrap().to_string(),
                    update["_meta"]["warden"].clone(),
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn tck_artifacts_are_text_chunks_with_warden_hints() {
        // Every hinted chunk is plain text: a client that ignores the hints still sees it.
        let data = hinted("tck-artifact-data-x");
        assert_eq!(data[0].1["artifact"]["kind"], "data");
        let v: Value = serde_json::from_str(&data[0].0).unwrap();
        assert_eq!(v, json!({"key": "value", "count": 42}));
        let file = hinted("tck-artifact-file-x");
        assert_eq!(file[0].1["artifact"]["kind"], "file");
        assert_eq!(file[0].1["artifact"]["filename"], "output.txt");
        assert_eq!(file[0].1["artifact"]["mediaType"], "text/plain");
        let url = hinted("tck-artifact-file-url-x");
        assert_eq!(url[0].1["artifact"]["kind"], "url");
        assert_eq!(url[0].0, "https://example.com/output.txt");
        assert_eq!(hinted("tck-artifact-text-x")[0].0, "Generated text content");
        assert_eq!(
            hinted("tck-message-response-x")[0].1,
            json!({"a2a": "message"})
        );
        let chunked = hinted("tck-stream-artifact-chunked-x");
        assert_eq!(chunked.len(), 2);
        assert_eq!(chunked[0].1["artifact"]["append"], false);
        assert_eq!(chunked[1].1["artifact"]["append"], true);
        assert_eq!(chunked[1].1["artifact"]["lastChunk"], true);
    }

    #[test]
    fn tck_reject_says_so_before_its_refusal_stop() {
        let steps = tck_steps("tck-reject-task-x").unwrap();
        assert_eq!(hinted("tck-reject-task-x")[0].1, json!({"a2a": "reject"}));
        assert!(matches!(steps.last(), Some(Step::Stop { reason }) if reason == "refusal"));
    }
}
