//! What the agent sends us: its `session/update` notifications and its requests (permission,
//! `fs/*`, terminals, elicitation), each request in a task of its own within
//! `max_incoming_requests` / `max_incoming_bytes`. Must never block the read loop or crash on a
//! bad body.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::connection::{IncomingEntry, Inner, lock};
use crate::events::{AcpEvent, PermissionAnswer, PermissionTiming};
use crate::handler::ClientHandler;
use crate::rpc::{self, RequestId, RpcError};
use crate::types::{
    CreateTerminalRequest, ElicitationRequest, PermissionOutcome, PermissionRequest,
    ReadTextFileRequest, SessionEvent, SessionNotification, TerminalRequest, WriteTextFileRequest,
};

pub(crate) fn on_notification(inner: &Arc<Inner>, method: &str, params: Value, line_bytes: usize) {
    match method {
        "session/update" => {
            let Some(session_id) = params.get("sessionId").and_then(Value::as_str) else {
                inner.malformed("session/update without sessionId".into());
                return;
            };
            let update = params.get("update").unwrap_or(&Value::Null);
            match SessionEvent::from_update(update) {
                Ok(Some(event)) => {
                    inner.event(
                        AcpEvent::Update(SessionNotification {
                            session_id: session_id.to_string(),
                            event,
                            meta: params.get("_meta").cloned(),
                        }),
                        line_bytes,
                    );
                }
                Ok(None) => {
                    inner.unknown_updates.fetch_add(1, Ordering::Relaxed);
                    let kind = update
                        .get("sessionUpdate")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    tracing::info!(session_id, kind, "skipping unknown session/update variant");
                }
                Err(detail) => {
                    tracing::warn!(session_id, %detail, "malformed session/update skipped");
                    let text = format!("malformed session/update: {detail}");
                    let n = text.len();
                    inner.event(AcpEvent::ProtocolError(text), n);
                }
            }
        }
        "$/cancel_request" => {
            let Some(id) = params.get("requestId").and_then(RequestId::from_value) else {
                tracing::warn!("$/cancel_request without a usable requestId");
                return;
            };
            if let Some(entry) = lock(&inner.incoming).get_mut(&id)
                && let Some(c) = entry.cancel.take()
            {
                let _ = c.send(());
            }
        }
        other => tracing::debug!(method = other, "ignoring notification"),
    }
}

pub(crate) fn on_request<H: ClientHandler>(
    inner: &Arc<Inner>,
    handler: &Arc<H>,
    id: RequestId,
    method: String,
    params: Value,
    line_bytes: usize,
) {
    let received = Instant::now();
    let received_at = SystemTime::now();
    let session_id = params
        .get("sessionId")
        .and_then(Value::as_str)
        .map(str::to_string);
    let (cancel_tx, cancel_rx) = oneshot::channel();
    let is_permission = method == "session/request_permission";
    {
        let mut incoming = lock(&inner.incoming);
        if incoming.len() >= inner.config.max_incoming_requests {
            // Not handled: no task, no answer held. The agent must wait for its answers.
            drop(incoming);
            tracing::warn!(request_id = %id, method, limit = inner.config.max_incoming_requests,
                "agent request refused: too many of its requests in flight");
            inner.send_line(rpc::response_line(
                &id,
                Err(RpcError::internal(format!(
                    "too many requests in flight: at most {} of this agent's requests are handled at once; wait for their answers",
                    inner.config.max_incoming_requests
                ))),
            ));
            return;
        }
        let held: usize = incoming.values().map(|e| e.bytes).sum();
        if !incoming.is_empty() && held.saturating_add(line_bytes) > inner.config.max_incoming_bytes
        {
            // Not handled either: what the agent's requests hold waiting for their answers is
            // bounded in bytes, not only in count.
            drop(incoming);
            tracing::warn!(request_id = %id, method, held, line_bytes,
                limit = inner.config.max_incoming_bytes,
                "agent request refused: too many bytes of its requests in flight");
            inner.send_line(rpc::response_line(
                &id,
                Err(RpcError::internal(format!(
                    "too many bytes of requests in flight: this agent's requests being handled \
                     hold {held} bytes and this one has {line_bytes}, past {}; wait for their answers",
                    inner.config.max_incoming_bytes
                ))),
            ));
            return;
        }
        if incoming.contains_key(&id) {
            // Two live requests with one id could not be told apart when answered.
            drop(incoming);
            tracing::warn!(request_id = %id, method, "agent reused the id of a pending request");
            inner.send_line(rpc::response_line(
                &id,
                Err(RpcError::new(
                    rpc::codes::INVALID_REQUEST,
                    "id already in use by a pending request",
                )),
            ));
            return;
        }
        incoming.insert(
            id.clone(),
            IncomingEntry {
                bytes: line_bytes,
                session_id,
                is_permission,
                cancel: Some(cancel_tx),
            },
        );
    }
    let inner = inner.clone();
    let handler = handler.clone();
    tokio::spawn(async move {
        let answer = if is_permission {
            handle_permission(
                &inner,
                &handler,
                &id,
                params,
                cancel_rx,
                Received {
                    at: received,
                    at_wall: received_at,
                    line_bytes,
                },
            )
            .await
        } else {
            tokio::select! {
                r = dispatch(&inner, &handler, &method, params) => r,
                Ok(()) = cancel_rx => Err(RpcError::cancelled()),
            }
        };
        lock(&inner.incoming).remove(&id);
        if let Err(e) = &answer {
            tracing::debug!(request_id = %id, method, code = e.code, "answering with an error");
        }
        inner.send_line(rpc::response_line(&id, answer));
    });
}

/// When and in how many bytes an agent's request arrived.
pub(crate) struct Received {
    at: Instant,
    at_wall: SystemTime,
    line_bytes: usize,
}

pub(crate) async fn handle_permission<H: ClientHandler>(
    inner: &Arc<Inner>,
    handler: &Arc<H>,
    id: &RequestId,
    params: Value,
    cancel_rx: oneshot::Receiver<()>,
    received: Received,
) -> Result<Value, RpcError> {
    let Received {
        at: received,
        at_wall: received_at,
        line_bytes,
    } = received;
    let mut req: PermissionRequest = match serde_json::from_value(params) {
        Ok(r) => r,
        Err(e) => {
            return Err(RpcError::invalid_params(format!(
                "bad permission request: {e}"
            )));
        }
    };
    let session_id = req.session_id.clone();
    let tool_call_id = req.tool_call.tool_call_id.clone();
    req.line_bytes = line_bytes;
    // What was offered, to check the answer against: the options only, never a copy of a raw
    // input of megabytes.
    let offered = PermissionRequest {
        session_id: String::new(),
        tool_call: Default::default(),
        options: req.options.clone(),
        meta: None,
        line_bytes: 0,
    };
    let outcome = tokio::select! {
        r = handler.request_permission(req) => r,
        Ok(()) = cancel_rx => Ok(PermissionOutcome::Cancelled),
    };
    let outcome = match outcome {
        Ok(PermissionOutcome::Selected { option_id })
            if inner.config.enforce_offered_options && !offered.offers(&option_id) =>
        {
            tracing::error!(
                session_id,
                option_id,
                "handler picked an option that was not offered; refusing to send it"
            );
            Err(RpcError::internal(
                "client chose an option that was not offered",
            ))
        }
        other => other,
    };
    let answer = match &outcome {
        Ok(PermissionOutcome::Selected { option_id }) => {
            PermissionAnswer::Selected(option_id.clone())
        }
        Ok(PermissionOutcome::Cancelled) => PermissionAnswer::Cancelled,
        Err(e) => PermissionAnswer::Error(e.code),
    };
    let elapsed = received.elapsed();
    // The caller logs each decision at info; a selected option is only repeated here at debug
    // (one formatted line per permission is a measurable share of the round trip). Cancelled
    // and refused answers are rare and stay visible.
    if matches!(answer, PermissionAnswer::Selected(_)) {
        tracing::debug!(
            session_id,
            tool_call_id,
            ?answer,
            elapsed_us = elapsed.as_micros() as u64,
            "permission answered"
        );
    } else {
        tracing::info!(
            session_id,
            tool_call_id,
            ?answer,
            elapsed_us = elapsed.as_micros() as u64,
            "permission answered"
        );
    }
    let mut timings = lock(&inner.timings);
    if timings.len() >= inner.config.permission_timing_capacity.max(1) {
        timings.pop_front();
    }
    timings.push_back(PermissionTiming {
        session_id,
        request_id: id.clone(),
        tool_call_id,
        received_at,
        elapsed,
        answer,
    });
    drop(timings);
    outcome.map(|o| o.to_result())
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    serde_json::from_value(params).map_err(|e| RpcError::invalid_params(e.to_string()))
}

pub(crate) async fn dispatch<H: ClientHandler>(
    inner: &Arc<Inner>,
    handler: &Arc<H>,
    method: &str,
    params: Value,
) -> Result<Value, RpcError> {
    let caps = lock(&inner.advertised).unwrap_or_default();
    let gate = |ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(RpcError::method_not_found(method))
        }
    };
    match method {
        "fs/read_text_file" => {
            gate(caps.fs.read_text_file)?;
            let req: ReadTextFileRequest = parse(params)?;
            let content = handler.read_text_file(req).await?;
            Ok(json!({"content": content}))
        }
        "fs/write_text_file" => {
            gate(caps.fs.write_text_file)?;
            let req: WriteTextFileRequest = parse(params)?;
            handler.write_text_file(req).await?;
            Ok(json!({}))
        }
        "terminal/create" => {
            gate(caps.terminal)?;
            let req: CreateTerminalRequest = parse(params)?;
            let terminal_id = handler.create_terminal(req).await?;
            Ok(json!({"terminalId": terminal_id}))
        }
        "terminal/output" => {
            gate(caps.terminal)?;
            let r = handler
                .terminal_output(parse::<TerminalRequest>(params)?)
                .await?;
            serde_json::to_value(r).map_err(|e| RpcError::internal(e.to_string()))
        }
        "terminal/wait_for_exit" => {
            gate(caps.terminal)?;
            let r = handler
                .wait_for_terminal_exit(parse::<TerminalRequest>(params)?)
                .await?;
            serde_json::to_value(r).map_err(|e| RpcError::internal(e.to_string()))
        }
        "terminal/kill" => {
            gate(caps.terminal)?;
            handler
                .kill_terminal(parse::<TerminalRequest>(params)?)
                .await?;
            Ok(json!({}))
        }
        "terminal/release" => {
            gate(caps.terminal)?;
            handler
                .release_terminal(parse::<TerminalRequest>(params)?)
                .await?;
            Ok(json!({}))
        }
        "elicitation/create" => {
            gate(caps.elicitation)?;
            let req = ElicitationRequest::from_params(&params).map_err(RpcError::invalid_params)?;
            Ok(handler.elicitation(req).await?.to_result())
        }
        other => handler.ext_request(other.to_string(), params).await,
    }
}
