//! Stateless runs (MCP 2026-07-28): a verb that needs an answer returns `input_required` and is
//! resumed by the next call that carries the answer; waiting for a run and resuming it.
//!
//! Owns: a pending run between two calls. Must never: resume a run for another principal.

use super::*;

impl McpFront {
    /// Runs a stateless verb call whose client can answer questions: the turn runs on its own
    /// task, and each question the agent asks ends this request with an input-required result
    /// (the retry answers it and waits on, see [`McpFront::wait_run`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn start_stateless_run(
        self: &Arc<Self>,
        verb: Verb,
        args: VerbArgs,
        caller: Caller,
        scope_key: String,
        run_id: String,
        (progress, sent): (Arc<Progress>, Option<tokio::task::JoinHandle<()>>),
        ct: CancellationToken,
    ) -> CallToolResponse {
        let (qtx, questions) = tokio::sync::mpsc::channel::<Asked>(1);
        let (dtx, done) = tokio::sync::oneshot::channel();
        let cancel = CancellationToken::new();
        let front = self.clone();
        let run_cancel = cancel.clone();
        let principal = caller.identity.principal.clone();
        tokio::spawn(async move {
            let scope = front.scope(&scope_key);
            let ask: Arc<Ask> = Arc::new(move |q: Question| {
                let qtx = qtx.clone();
                async move {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    qtx.send((q, tx)).await.ok()?;
                    // Unanswered within the retry window (or the pending call dropped): declined.
                    tokio::time::timeout(PENDING_BIND_TTL, rx)
                        .await
                        .ok()?
                        .ok()?
                }
                .boxed()
            });
            let e = front
                .run_verb(
                    verb,
                    args,
                    &caller,
                    &scope,
                    run_id,
                    &*ask,
                    &*progress,
                    run_cancel,
                    &|_| {},
                )
                .await;
            // The progress notifications go out before the result (see progress_sender).
            drop(progress);
            if let Some(sent) = sent {
                let _ = tokio::time::timeout(Duration::from_secs(2), sent).await;
            }
            let _ = dtx.send(e);
        });
        let (reply, _) = tokio::sync::oneshot::channel();
        let run = PendingRun {
            principal,
            questions,
            done,
            cancel,
            reply,
            plain: true,
            at: Instant::now(),
        };
        self.wait_run(run, ct).await
    }

    /// Waits for the turn's end (its envelope) or its next question (input-required, the run
    /// kept under a fresh requestState handle). The request's own cancellation cancels the turn.
    pub(super) async fn wait_run(
        &self,
        mut run: PendingRun,
        ct: CancellationToken,
    ) -> CallToolResponse {
        tokio::select! {
            e = &mut run.done => match e {
                Ok(e) => envelope_result(&e).into(),
                Err(_) => json_result(json!({"error": "the run ended without a result"}), true).into(),
            },
            q = run.questions.recv() => {
                let Some((q, reply)) = q else {
                    return match run.done.await {
                        Ok(e) => envelope_result(&e).into(),
                        Err(_) => json_result(json!({"error": "the run ended without a result"}), true).into(),
                    };
                };
                let Some((params, plain)) = question_form(&q) else {
                    let _ = reply.send(None);
                    return Box::pin(self.wait_run(run, ct)).await;
                };
                run.reply = reply;
                run.plain = plain;
                run.at = Instant::now();
                let handle = uuid::Uuid::new_v4().to_string();
                {
                    let mut runs = lock(&self.runs);
                    runs.retain(|_, r| r.at.elapsed() < PENDING_BIND_TTL);
                    runs.insert(handle.clone(), run);
                }
                let mut asks = std::collections::BTreeMap::new();
                asks.insert("question".to_string(), InputRequest::Elicitation(ElicitRequest::new(params)));
                CallToolResponse::InputRequired(InputRequiredResult::new(Some(asks), Some(handle)))
            }
            _ = ct.cancelled() => {
                run.cancel.cancel();
                match tokio::time::timeout(self.cancel_grace + Duration::from_secs(5), run.done).await {
                    Ok(Ok(e)) => envelope_result(&e).into(),
                    _ => json_result(json!({"error": "cancelled"}), true).into(),
                }
            }
        }
    }

    /// A stateless retry: the answer to the agent's question, then the wait goes on.
    pub(super) async fn resume_run(
        &self,
        state: &str,
        responses: Option<&rmcp::model::InputResponses>,
        principal: &str,
        ct: CancellationToken,
    ) -> CallToolResponse {
        // The handle is its owner's: checked before it is taken, so a leaked one presented by
        // another caller neither answers nor ends the waiting call.
        let run = {
            let mut m = lock(&self.runs);
            if m.get(state).is_some_and(|r| r.principal == principal) {
                m.remove(state)
            } else {
                None
            }
        };
        let Some(mut run) = run.filter(|r| r.at.elapsed() < PENDING_BIND_TTL) else {
            return json_result(json!({"error": "this call's requestState is unknown or expired; call the tool again"}), true).into();
        };
        let answer = responses
            .and_then(|r| r.get("question"))
            .and_then(|v| serde_json::from_value::<ElicitResult>(v.clone()).ok())
            .map(|r| answer_of(&r, run.plain));
        // The question's answer goes to the turn; the run waits on with a fresh reply.
        let (reply, _) = tokio::sync::oneshot::channel();
        let _ = std::mem::replace(&mut run.reply, reply).send(answer);
        self.wait_run(run, ct).await
    }
}
