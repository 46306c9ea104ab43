//! Asking the client: questions (`elicitation/create`), permission requests and their report, and
//! the plan-mode exit, each in the vocabulary of the adapter being imitated. Must never pick an
//! answer itself.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Flow, Turn, text_content};
use crate::vocab::{self, Answer, PlanReaction, Vocab};

impl Turn {
    pub(super) async fn question(
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
    pub(super) async fn ask(
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
    pub(super) fn report(
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

    pub(super) async fn plan_exit(
        &mut self,
        vocabulary: Option<Vocab>,
        plan: Option<String>,
    ) -> Flow {
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
}
