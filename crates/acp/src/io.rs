//! The reader and writer tasks of one connection: bounded NDJSON lines in, batched lines out.
//! Must never wait on a handler or the caller (the reader hands each agent request to its own task).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch};

use crate::connection::{Inner, WriterMsg};
use crate::error::Fault;
use crate::handler::ClientHandler;
use crate::incoming::{on_notification, on_request};
use crate::rpc::{self, Incoming, LineRead, RpcError};

/// Lines already queued are written together, up to this many bytes per write.
pub(crate) const WRITE_BATCH_BYTES: usize = 64 * 1024;

/// A line at least this long is parsed on the blocking pool, not on a runtime thread.
pub(crate) const OFF_RUNTIME_LINE_BYTES: usize = 256 * 1024;

pub(crate) async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut rx: mpsc::UnboundedReceiver<WriterMsg>,
    mut fault: watch::Receiver<Option<Fault>>,
    inner: std::sync::Weak<Inner>,
) {
    let mut batch: Vec<u8> = Vec::new();
    let mut closing = false;
    while !closing {
        // After a fault nothing is sent any more: what is queued is dropped (with the
        // receiver) instead of waiting, perhaps forever, for an agent that does not read.
        let msg = tokio::select! {
            biased;
            _ = fault.wait_for(Option::is_some) => return,
            m = rx.recv() => m,
        };
        let Some(msg) = msg else { break };
        let mut line = match msg {
            WriterMsg::Line(l) => l,
            WriterMsg::Close => break,
        };
        // Lines carry their newline; whatever else is queued already goes in the same write,
        // so a burst of answers costs one syscall (and one wake-up of the agent), not one each.
        loop {
            match rx.try_recv() {
                Ok(WriterMsg::Line(next)) => {
                    if batch.is_empty() {
                        batch = std::mem::take(&mut line);
                    }
                    batch.extend_from_slice(&next);
                    if batch.len() >= WRITE_BATCH_BYTES {
                        break;
                    }
                }
                Ok(WriterMsg::Close) => {
                    closing = true;
                    break;
                }
                Err(_) => break,
            }
        }
        let out = if batch.is_empty() { &line } else { &batch };
        let res = tokio::select! {
            biased;
            _ = fault.wait_for(Option::is_some) => return,
            r = async {
                writer.write_all(out).await?;
                writer.flush().await
            } => r,
        };
        if let Err(e) = res {
            if let Some(inner) = inner.upgrade() {
                inner.set_fault(Fault::WriteFailed(e.to_string()));
            }
            return;
        }
        if let Some(inner) = inner.upgrade() {
            inner.queued_bytes.fetch_sub(out.len(), Ordering::AcqRel);
        }
        batch.clear();
        // A burst must not pin a large buffer for the life of the connection.
        if batch.capacity() > WRITE_BATCH_BYTES * 2 {
            batch = Vec::new();
        }
    }
    let _ = writer.shutdown().await;
}

pub(crate) async fn read_loop<R, H>(reader: R, inner: Arc<Inner>, handler: Arc<H>)
where
    R: AsyncRead + Unpin + Send + 'static,
    H: ClientHandler,
{
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let mut buf = Vec::new();
    let max = inner.config.max_line_bytes;
    loop {
        if inner.current_fault().is_some() {
            return;
        }
        // One huge (allowed) line must not pin its buffer for the life of
        // the connection.
        if buf.capacity() > 1 << 20 {
            buf = Vec::new();
        }
        match rpc::read_line_bounded(&mut reader, &mut buf, max).await {
            Ok(LineRead::Line) => {}
            Ok(LineRead::Eof) => return inner.set_fault(Fault::AgentClosed),
            Ok(LineRead::TooLong) => return inner.set_fault(Fault::OversizedLine { limit: max }),
            Err(e) => return inner.set_fault(Fault::ReadFailed(e.to_string())),
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let classified = if buf.len() >= OFF_RUNTIME_LINE_BYTES {
            // Megabytes of JSON take a runtime thread for tens of milliseconds (more in a debug
            // build): every other conversation's tasks queued behind it would wait that long.
            // Parsed on the blocking pool instead, the operating system shares the CPU.
            let line = std::mem::take(&mut buf);
            match tokio::task::spawn_blocking(move || (rpc::classify(&line), line)).await {
                Ok((c, line)) => {
                    buf = line;
                    c
                }
                Err(e) => return inner.set_fault(Fault::ReadFailed(e.to_string())),
            }
        } else {
            rpc::classify(&buf)
        };
        match classified {
            Err(e) => {
                let shown = String::from_utf8_lossy(&buf[..buf.len().min(120)]).into_owned();
                inner.malformed(format!("not JSON ({e}): {shown}"));
            }
            Ok(Incoming::Invalid { id, reason }) => {
                if let Some(id) = id {
                    inner.send_line(rpc::response_line(
                        &id,
                        Err(RpcError::new(rpc::codes::INVALID_REQUEST, reason.clone())),
                    ));
                }
                inner.malformed(reason);
            }
            Ok(Incoming::Response { id, result }) => inner.on_response(id, result),
            Ok(Incoming::Notification { method, params }) => {
                on_notification(&inner, &method, params, buf.len())
            }
            Ok(Incoming::Request { id, method, params }) => {
                on_request(&inner, &handler, id, method, params, buf.len())
            }
        }
    }
}
