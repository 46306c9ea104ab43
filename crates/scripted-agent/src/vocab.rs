//! Option vocabularies of the real adapters and how each reacts to an answer
//! (shared/reference/real-adapters.md and acp.md section 3).

use serde::Deserialize;
use serde_json::{Value, json};

/// Which real adapter the agent imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Vocab {
    /// `@zed-industries/claude-code-acp` 0.16.x
    #[serde(rename = "claude-0.16")]
    Claude016,
    /// `@agentclientprotocol/claude-agent-acp` 0.101.x
    #[serde(rename = "claude-0.101")]
    Claude0101,
    /// `@zed-industries/codex-acp` 0.16.x
    #[serde(rename = "codex-0.16")]
    Codex016,
    /// `@agentclientprotocol/codex-acp` 2.6.x
    #[serde(rename = "codex-2.6")]
    Codex26,
}

impl Vocab {
    pub fn name(self) -> &'static str {
        match self {
            Vocab::Claude016 => "claude-0.16",
            Vocab::Claude0101 => "claude-0.101",
            Vocab::Codex016 => "codex-0.16",
            Vocab::Codex26 => "codex-2.6",
        }
    }

    pub fn parse(s: &str) -> Option<Vocab> {
        serde_json::from_value(Value::from(s)).ok()
    }

    pub fn is_claude(self) -> bool {
        matches!(self, Vocab::Claude016 | Vocab::Claude0101)
    }

    /// Available modes `(id, name)`.
    pub fn modes(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Vocab::Claude016 => &[
                ("default", "Default"),
                ("acceptEdits", "Accept Edits"),
                ("plan", "Plan Mode"),
                ("dontAsk", "Don't Ask"),
                ("bypassPermissions", "Bypass Permissions"),
            ],
            Vocab::Claude0101 => &[
                ("default", "Manual"),
                ("acceptEdits", "Accept Edits"),
                ("plan", "Plan Mode"),
                ("auto", "Auto"),
                ("bypassPermissions", "Bypass Permissions"),
            ],
            Vocab::Codex016 => &[
                ("read-only", "Read Only"),
                ("auto", "Default"),
                ("full-access", "Full Access"),
            ],
            Vocab::Codex26 => &[
                ("read-only", "Read Only"),
                ("workspace-write", "Workspace Write"),
                ("agent", "Auto review"),
                ("agent-full-access", "Full Access"),
            ],
        }
    }

    /// The mode the real adapter starts in.
    pub fn adapter_initial_mode(self) -> &'static str {
        match self {
            Vocab::Claude016 => "default",
            Vocab::Claude0101 => "auto",
            Vocab::Codex016 => "read-only",
            Vocab::Codex26 => "agent",
        }
    }

    /// The mode where the adapter asks (our default, so a demo asks).
    pub fn prompting_mode(self) -> &'static str {
        match self {
            Vocab::Claude016 | Vocab::Claude0101 => "default",
            Vocab::Codex016 | Vocab::Codex26 => "read-only",
        }
    }

    /// Whether a tool of `kind` runs without a request in `mode`
    /// (`Some(true)` = runs, `Some(false)` = refused without asking, `None` = ask).
    pub fn mode_decides(self, mode: &str, kind: &str, inside_cwd: bool) -> Option<bool> {
        let edit = matches!(kind, "edit" | "delete" | "move");
        let reads = matches!(kind, "read" | "search" | "think");
        if reads {
            return Some(true);
        }
        match (self, mode) {
            (Vocab::Claude016 | Vocab::Claude0101, "bypassPermissions") => Some(true),
            (Vocab::Claude0101, "auto") => Some(true),
            (Vocab::Claude016 | Vocab::Claude0101, "acceptEdits") if edit => Some(true),
            (Vocab::Claude016 | Vocab::Claude0101, "plan" | "dontAsk") => Some(false),
            (Vocab::Codex016, "auto") if inside_cwd => Some(true),
            (Vocab::Codex016, "full-access") => Some(true),
            (Vocab::Codex26, "agent" | "agent-full-access") => Some(true),
            _ => None,
        }
    }

    /// Options for a tool permission request.
    pub fn tool_options(
        self,
        kind: &str,
        command: &str,
        offer_always: Option<bool>,
        offer_decline: Option<bool>,
    ) -> Vec<Value> {
        let o = |id: &str, name: &str, k: &str| json!({"optionId": id, "name": name, "kind": k});
        let exec = kind == "execute";
        match self {
            Vocab::Claude016 => vec![
                o("allow_always", "Always Allow", "allow_always"),
                o("allow", "Allow", "allow_once"),
                o("reject", "Reject", "reject_once"),
            ],
            Vocab::Claude0101 => {
                let mut v = vec![o("allow-once", "Yes", "allow_once")];
                // Bash gets an "always" option only when Claude derived a rule.
                if offer_always.unwrap_or(!exec) {
                    let name = if exec {
                        format!("Yes, and don't ask again for `{command}` commands")
                    } else {
                        "Yes, allow all edits during this session".to_string()
                    };
                    v.push(o("allow-with-updates", &name, "allow_always"));
                }
                v.push(o("reject", "No", "reject_once"));
                v
            }
            Vocab::Codex016 if exec => {
                let mut v = vec![o("approved", "Yes, proceed", "allow_once")];
                if offer_always.unwrap_or(true) {
                    v.push(o(
                        "approved-execpolicy-amendment",
                        &format!(
                            "Yes, and don't ask again for commands that start with `{command}`"
                        ),
                        "allow_always",
                    ));
                }
                if offer_decline.unwrap_or(false) {
                    v.push(o(
                        "denied",
                        "No, continue without running it",
                        "reject_once",
                    ));
                }
                v.push(o(
                    "abort",
                    "No, and tell Codex what to do differently",
                    "reject_once",
                ));
                v
            }
            Vocab::Codex016 => vec![
                o("approved", "Yes", "allow_once"),
                o("abort", "No, provide feedback", "reject_once"),
            ],
            Vocab::Codex26 if exec => {
                let mut v = vec![
                    o("allow_once", "Yes", "allow_once"),
                    o(
                        "allow_for_session",
                        "Yes, and don't ask again this session",
                        "allow_always",
                    ),
                ];
                if offer_always.unwrap_or(true) {
                    v.push(o(
                        "accept_execpolicy_amendment",
                        &format!(
                            "Yes, and don't ask again for commands that start with `{command}`"
                        ),
                        "allow_always",
                    ));
                }
                if offer_decline.unwrap_or(true) {
                    v.push(o(
                        "decline",
                        "No, continue without running it",
                        "reject_once",
                    ));
                }
                v.push(o(
                    "cancel",
                    "No, and tell Codex what to do differently",
                    "reject_once",
                ));
                v
            }
            // File changes have no `decline`: any refusal of an edit ends the turn.
            Vocab::Codex26 => vec![
                o("allow_once", "Yes", "allow_once"),
                o(
                    "allow_for_session",
                    "Yes, and don't ask again for these files",
                    "allow_always",
                ),
                o(
                    "cancel",
                    "No, and tell Codex what to do differently",
                    "reject_once",
                ),
            ],
        }
    }

    /// Options for leaving plan mode; `None` if the adapter has no such prompt.
    pub fn plan_options(self) -> Option<Vec<Value>> {
        let o = |id: &str, name: &str, k: &str| json!({"optionId": id, "name": name, "kind": k});
        Some(match self {
            Vocab::Claude016 => vec![
                o("acceptEdits", "Yes, and auto-accept edits", "allow_always"),
                o("default", "Yes, and manually approve edits", "allow_once"),
                o("plan", "No, keep planning", "reject_once"),
            ],
            Vocab::Claude0101 => vec![
                o(
                    "exit-plan-default",
                    "Yes, manually approve edits",
                    "allow_once",
                ),
                o("exit-plan-auto", "Yes, and use auto mode", "allow_always"),
                o(
                    "exit-plan-bypass",
                    "Yes, and bypass permissions",
                    "allow_always",
                ),
                o("reject", "No, keep planning", "reject_once"),
            ],
            Vocab::Codex016 => return None,
            Vocab::Codex26 => vec![
                o("implement_plan", "Yes, implement this plan", "allow_once"),
                o("revise_plan", "No, keep planning", "reject_once"),
            ],
        })
    }
}

/// The client's answer as the agent saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Selected(String),
    Cancelled,
    /// A JSON-RPC error object.
    Error(Value),
}

impl Answer {
    pub fn from_response(r: Result<Value, Value>) -> Answer {
        match r {
            Err(e) => Answer::Error(e),
            Ok(v) => {
                let outcome = v.get("outcome");
                match outcome
                    .and_then(|o| o.get("outcome"))
                    .and_then(Value::as_str)
                {
                    Some("selected") => Answer::Selected(
                        outcome
                            .and_then(|o| o.get("optionId"))
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                    ),
                    Some("cancelled") => Answer::Cancelled,
                    _ => Answer::Error(
                        json!({"code": -32602, "message": "malformed permission answer"}),
                    ),
                }
            }
        }
    }

    pub fn to_json(&self) -> Value {
        match self {
            Answer::Selected(id) => json!({"outcome": "selected", "optionId": id}),
            Answer::Cancelled => json!({"outcome": "cancelled"}),
            Answer::Error(e) => json!({"error": e}),
        }
    }
}

/// What the adapter does with the answer to a tool permission.
#[derive(Debug, Clone, PartialEq)]
pub enum Reaction {
    /// Run the tool. `persist`: write the adapter's "always" rule file;
    /// `remember`: do not ask again for this tool in this session.
    Run { persist: bool, remember: bool },
    /// Do not run; the tool fails with `message`. `end`: the turn ends with
    /// this stop reason, else it goes on.
    Refuse {
        message: String,
        end: Option<&'static str>,
    },
    /// The prompt itself fails with this error (codex-0.16 on a JSON-RPC error).
    FailPrompt(Value),
}

/// Per-adapter reaction to a tool permission answer.
pub fn react_tool(vocab: Vocab, answer: &Answer, offered: &[Value]) -> Reaction {
    let offered_id = |id: &str| {
        offered
            .iter()
            .any(|o| o.get("optionId").and_then(Value::as_str) == Some(id))
    };
    let run = |persist, remember| Reaction::Run { persist, remember };
    let refuse = |m: &str, end| Reaction::Refuse {
        message: m.to_string(),
        end,
    };
    match vocab {
        Vocab::Claude016 => match answer {
            // The adapter tests `=== "allow" || "allow_always"`; anything else denies with interrupt.
            Answer::Selected(id) if id == "allow" => run(false, false),
            Answer::Selected(id) if id == "allow_always" => run(true, true),
            Answer::Selected(_) => refuse("User refused permission to run tool", Some("end_turn")),
            Answer::Cancelled => refuse(
                "Tool permission request failed: Error: Tool use aborted",
                None,
            ),
            Answer::Error(e) => refuse(
                &format!("Tool permission request failed: Error: {}", err_msg(e)),
                None,
            ),
        },
        Vocab::Claude0101 => match answer {
            Answer::Selected(id) if !offered_id(id) => refuse(
                &format!(
                    "Tool permission request failed: Error: Permission option was not offered: {id}"
                ),
                None,
            ),
            Answer::Selected(id) if id == "allow-once" => run(false, false),
            Answer::Selected(id) if id == "allow-with-updates" => run(true, true),
            // `reject` denies without interrupt: the turn goes on.
            Answer::Selected(id) if id == "reject" => {
                refuse("User refused permission to run tool", None)
            }
            Answer::Selected(_) => refuse(
                "Tool permission request failed: Error: Unknown permission option",
                None,
            ),
            Answer::Cancelled => refuse(
                "Tool permission request failed: Error: Tool use aborted",
                None,
            ),
            Answer::Error(e) => refuse(
                &format!("Tool permission request failed: Error: {}", err_msg(e)),
                None,
            ),
        },
        Vocab::Codex016 => match answer {
            Answer::Selected(id) if id == "approved" && offered_id(id) => run(false, false),
            Answer::Selected(id) if id == "approved-execpolicy-amendment" && offered_id(id) => {
                run(true, true)
            }
            Answer::Selected(id) if id == "approved-for-session" && offered_id(id) => {
                run(false, true)
            }
            Answer::Selected(id) if id == "denied" && offered_id(id) => {
                refuse("command denied by the user", None)
            }
            // abort, unknown ids and `cancelled` all map to Abort: the turn is aborted.
            Answer::Selected(_) | Answer::Cancelled => {
                refuse("aborted by the user", Some("cancelled"))
            }
            Answer::Error(e) => Reaction::FailPrompt(e.clone()),
        },
        Vocab::Codex26 => match answer {
            Answer::Selected(id) if id == "allow_once" && offered_id(id) => run(false, false),
            Answer::Selected(id) if id == "allow_for_session" && offered_id(id) => run(false, true),
            Answer::Selected(id) if id == "accept_execpolicy_amendment" && offered_id(id) => {
                run(true, true)
            }
            Answer::Selected(id) if id == "decline" && offered_id(id) => {
                refuse("declined by the user", None)
            }
            // cancel, unknown ids, `cancelled` and errors all become `cancel`: turn interrupted.
            _ => refuse("cancelled by the user", Some("cancelled")),
        },
    }
}

/// What the adapter does with the answer to a plan-exit request.
#[derive(Debug, Clone, PartialEq)]
pub enum PlanReaction {
    /// Leave plan mode into this mode (announced with `current_mode_update`),
    /// or for codex-2.6 switch `collaboration_mode` back to `default`.
    Exit { mode: Option<&'static str> },
    /// Stay in plan mode; `end`: the turn ends with this stop reason.
    Stay { end: Option<&'static str> },
}

pub fn react_plan(vocab: Vocab, answer: &Answer) -> PlanReaction {
    let sel = match answer {
        Answer::Selected(id) => id.as_str(),
        _ => "",
    };
    match vocab {
        Vocab::Claude016 => match sel {
            "default" => PlanReaction::Exit {
                mode: Some("default"),
            },
            "acceptEdits" => PlanReaction::Exit {
                mode: Some("acceptEdits"),
            },
            "plan" => PlanReaction::Stay {
                end: Some("end_turn"),
            },
            _ if matches!(answer, Answer::Selected(_)) => PlanReaction::Stay {
                end: Some("end_turn"),
            },
            _ => PlanReaction::Stay { end: None },
        },
        Vocab::Claude0101 => match sel {
            "exit-plan-default" => PlanReaction::Exit {
                mode: Some("default"),
            },
            "exit-plan-auto" => PlanReaction::Exit { mode: Some("auto") },
            "exit-plan-bypass" => PlanReaction::Exit {
                mode: Some("bypassPermissions"),
            },
            "exit-plan-accept-edits" => PlanReaction::Exit {
                mode: Some("acceptEdits"),
            },
            // deny with interrupt: the turn stops and is reported as a cancellation.
            "reject" => PlanReaction::Stay {
                end: Some("cancelled"),
            },
            _ => PlanReaction::Stay { end: None },
        },
        Vocab::Codex26 if sel == "implement_plan" => PlanReaction::Exit { mode: None },
        _ => PlanReaction::Stay { end: None },
    }
}

fn err_msg(e: &Value) -> String {
    e.get("message")
        .and_then(Value::as_str)
        .unwrap_or("request failed")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(s: &str) -> Answer {
        Answer::Selected(s.into())
    }

    #[test]
    fn claude_016_reject_and_bogus_end_turn() {
        let o = Vocab::Claude016.tool_options("edit", "", None, None);
        assert!(matches!(
            react_tool(Vocab::Claude016, &sel("reject"), &o),
            Reaction::Refuse {
                end: Some("end_turn"),
                ..
            }
        ));
        assert!(matches!(
            react_tool(Vocab::Claude016, &sel("nope"), &o),
            Reaction::Refuse {
                end: Some("end_turn"),
                ..
            }
        ));
        assert_eq!(
            react_tool(Vocab::Claude016, &sel("allow_always"), &o),
            Reaction::Run {
                persist: true,
                remember: true
            }
        );
    }

    #[test]
    fn claude_0101_keeps_going() {
        let o = Vocab::Claude0101.tool_options("execute", "ls", None, None);
        assert_eq!(o.len(), 2);
        assert!(matches!(
            react_tool(Vocab::Claude0101, &sel("reject"), &o),
            Reaction::Refuse { end: None, .. }
        ));
        let Reaction::Refuse { message, .. } = react_tool(Vocab::Claude0101, &sel("x"), &o) else {
            panic!()
        };
        assert!(message.contains("not offered: x"));
    }

    #[test]
    fn codex_aborts() {
        let o = Vocab::Codex016.tool_options("execute", "touch x", None, None);
        assert!(matches!(
            react_tool(Vocab::Codex016, &Answer::Cancelled, &o),
            Reaction::Refuse {
                end: Some("cancelled"),
                ..
            }
        ));
        assert!(matches!(
            react_tool(Vocab::Codex016, &Answer::Error(json!({})), &o),
            Reaction::FailPrompt(_)
        ));
        let o = Vocab::Codex26.tool_options("edit", "", None, None);
        assert!(!o.iter().any(|x| x["optionId"] == "decline"));
        assert!(matches!(
            react_tool(Vocab::Codex26, &sel("decline"), &o),
            Reaction::Refuse {
                end: Some("cancelled"),
                ..
            }
        ));
        let o = Vocab::Codex26.tool_options("execute", "ls", None, None);
        assert!(matches!(
            react_tool(Vocab::Codex26, &sel("decline"), &o),
            Reaction::Refuse { end: None, .. }
        ));
    }
}
