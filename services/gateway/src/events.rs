//! What a subscriber of a task sees, whatever the binding: the task's snapshot, then its events,
//! ending after the first terminal or interrupted status, or with an error item when the
//! subscriber fell behind.
//!
//! Owns: that sequence (the SSE bindings, the 0.3 routes and gRPC each only change its shape).
//! Must never: know a transport, or keep a stream going past its task's end.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::sync::broadcast;

use crate::a2a::{StreamResponse, Task};
use crate::core::{SharedEvent, Subscription};
use crate::error::A2aError;

/// One item of a task's event stream (every binding's streams).
pub enum StreamItem {
    Event(SharedEvent),
    Error(A2aError),
}

/// The snapshot, then the events of a subscription, ending after the first terminal or
/// interrupted status (or with an error item when the subscriber fell behind).
pub fn stream_items(sub: Subscription) -> impl Stream<Item = StreamItem> {
    // The caller's stream share is held for as long as the stream exists.
    let permit = sub.permit;
    enum St {
        First(Box<Task>, Option<broadcast::Receiver<SharedEvent>>),
        Events(broadcast::Receiver<SharedEvent>),
        Done,
    }
    futures::stream::unfold(St::First(Box::new(sub.task), sub.events), |st| async move {
        match st {
            St::First(task, rx) => {
                let next = match rx {
                    Some(rx) => St::Events(rx),
                    None => St::Done,
                };
                Some((StreamItem::Event(Arc::new(StreamResponse::Task(*task))), next))
            }
            St::Events(mut rx) => match rx.recv().await {
                Ok(ev) => {
                    let end = matches!(&*ev, StreamResponse::StatusUpdate(s)
                        if s.status.state.is_terminal() || s.status.state.is_interrupted());
                    Some((
                        StreamItem::Event(ev),
                        if end { St::Done } else { St::Events(rx) },
                    ))
                }
                Err(broadcast::error::RecvError::Lagged(n)) => Some((
                    StreamItem::Error(A2aError::Internal(format!(
                        "this stream fell {n} events behind and was closed; use SubscribeToTask or GetTask to catch up"
                    ))),
                    St::Done,
                )),
                Err(broadcast::error::RecvError::Closed) => None,
            },
            St::Done => None,
        }
    })
    .map(move |item| {
        let _held = &permit;
        item
    })
}
