//! A tool call as the real adapters make it: the permission asked in their vocabulary, then the
//! write, read or command done by the agent itself or through the client (`fs/*`, `terminal/*`),
//! and an "always" answer persisted where the adapter would. Must never act before its answer.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Flow, Turn, text_content};
use crate::scenario::ToolStep;
use crate::vocab::{self, Reaction, Vocab};

impl Turn {
    pub(super) async fn tool(&mut self, t: ToolStep) -> Flow {
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

    pub(super) fn demo_reply(
        &self,
        kind: &str,
        t: &ToolStep,
        command: &str,
        ran: bool,
        text: &str,
    ) {
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

    pub(super) async fn write_file(
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

    pub(super) async fn read_file(
        &self,
        path: Option<&Path>,
        client: bool,
    ) -> Result<String, String> {
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

    pub(super) async fn execute(
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
