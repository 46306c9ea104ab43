//! A `flood` step: many requests of one method sent at once, optionally hostile (huge or deeply
//! nested `rawInput`), to hold the client to its bounds. Must never send more than `MAX_FLOOD`.

use serde_json::{Value, json};

use super::{Flow, Turn};

/// The `flood` fields of the terminal methods.
pub(super) struct FloodExtra {
    pub(super) command: Option<String>,
    pub(super) output_byte_limit: Option<u64>,
    pub(super) terminal_id: Option<String>,
    pub(super) body: Body,
}

/// What a hostile permission flood's requests carry (`Step::Flood`).
#[derive(Default, Clone, Copy)]
pub(super) struct Body {
    pub(super) raw_input_bytes: Option<usize>,
    pub(super) nest_depth: Option<usize>,
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

impl Turn {
    /// `count` requests of `method` sent at once; see `Step::Flood`.
    pub(super) async fn flood(
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
}
