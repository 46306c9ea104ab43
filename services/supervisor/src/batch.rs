//! A turn's event stream, sent to the gateway in batches: an event that follows another within
//! [`EVENT_WINDOW`] waits for the window's end and goes out with whatever else came meanwhile.
//!
//! A permission is three events (the tool call, the decision, the call's update) a few hundred
//! microseconds apart; sent one by one they were three HTTP/2 frames from here (a `writev` each,
//! 15 % of this daemon's CPU per permission) and three wake-ups of the gateway, which then writes
//! three SSE events to its client. tonic encodes every item that is ready when it polls into one
//! frame, so handing it a batch at once is one frame, one wake-up and one client write. An event
//! after a quiet window goes out at once (no delay for the first of a burst); the rest wait at
//! most one window; nothing is dropped or reordered, and the end of the stream releases what is
//! held.
//!
//! Must never: hold an event longer than one window (and the runtime timer's millisecond tick),
//! or change the order of events.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::time::{Instant, Sleep};

/// How long an event may wait for others to go out with it.
pub const EVENT_WINDOW: Duration = Duration::from_millis(1);

/// `inner`, released in batches (see the module).
pub struct Batched<S: Stream> {
    inner: S,
    window: Duration,
    held: VecDeque<S::Item>,
    /// When the last batch began to go out.
    sent_at: Option<Instant>,
    /// Handing out a batch: every held item is released before anything is held again.
    releasing: bool,
    timer: Option<Pin<Box<Sleep>>>,
    ended: bool,
}

impl<S: Stream> Batched<S> {
    pub fn new(inner: S, window: Duration) -> Self {
        Batched {
            inner,
            window,
            held: VecDeque::new(),
            sent_at: None,
            releasing: false,
            timer: None,
            ended: false,
        }
    }
}

impl<S: Stream + Unpin> Stream for Batched<S>
where
    S::Item: Unpin,
{
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = self.get_mut();
        // Take in everything that is ready (registers the waker when nothing more is).
        while !this.ended {
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Ready(Some(item)) => this.held.push_back(item),
                Poll::Ready(None) => this.ended = true,
                Poll::Pending => break,
            }
        }
        if this.releasing {
            if let Some(item) = this.held.pop_front() {
                return Poll::Ready(Some(item));
            }
            this.releasing = false;
        }
        if this.held.is_empty() {
            return if this.ended {
                Poll::Ready(None)
            } else {
                Poll::Pending
            };
        }
        let now = Instant::now();
        let due = this.sent_at.map_or(now, |t| t + this.window);
        if !this.ended && now < due {
            let timer = this
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        this.timer = None;
        this.sent_at = Some(now);
        this.releasing = true;
        Poll::Ready(this.held.pop_front())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::UnboundedReceiverStream;

    /// Everything the stream yields without waiting, as one batch.
    fn ready_now<S: Stream + Unpin>(s: &mut S) -> Vec<S::Item> {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut out = Vec::new();
        while let Poll::Ready(Some(x)) = Pin::new(&mut *s).poll_next(&mut cx) {
            out.push(x);
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_goes_out_at_the_end_of_the_window_after_its_first_event_went_at_once() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut s = Batched::new(UnboundedReceiverStream::new(rx), EVENT_WINDOW);
        tx.send(1).ok();
        assert_eq!(ready_now(&mut s), vec![1], "the first event is not held");
        tokio::time::advance(Duration::from_micros(200)).await;
        tx.send(2).ok();
        tokio::time::advance(Duration::from_micros(200)).await;
        tx.send(3).ok();
        assert!(ready_now(&mut s).is_empty(), "held within the window");
        // The window's end releases both, in order, together.
        let first = poll_fn(|cx| Pin::new(&mut s).poll_next(cx)).await;
        assert_eq!(first, Some(2));
        assert_eq!(ready_now(&mut s), vec![3]);
        // Quiet for longer than a window: the next goes out at once again.
        tokio::time::advance(EVENT_WINDOW * 3).await;
        tx.send(4).ok();
        assert_eq!(ready_now(&mut s), vec![4]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_end_of_the_stream_releases_what_is_held_and_nothing_is_lost_or_reordered() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut s = Batched::new(UnboundedReceiverStream::new(rx), EVENT_WINDOW);
        tx.send(0).ok();
        assert_eq!(ready_now(&mut s), vec![0]);
        for i in 1..1000 {
            tx.send(i).ok();
        }
        drop(tx);
        let mut got = vec![0];
        while let Some(x) = poll_fn(|cx| Pin::new(&mut s).poll_next(cx)).await {
            got.push(x);
        }
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn no_event_waits_longer_than_one_window() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut s = Batched::new(UnboundedReceiverStream::new(rx), EVENT_WINDOW);
        let producer = tokio::spawn(async move {
            for i in 0..50u32 {
                tx.send((i, Instant::now())).ok();
                tokio::time::sleep(Duration::from_micros(150)).await;
            }
        });
        let mut n = 0;
        while let Some((i, sent)) = poll_fn(|cx| Pin::new(&mut s).poll_next(cx)).await {
            assert_eq!(i, n);
            n += 1;
            // tokio's timers tick in milliseconds: a window ends at most one tick late.
            let held = Instant::now() - sent;
            assert!(
                held <= EVENT_WINDOW + Duration::from_millis(1),
                "event {i} held {held:?}"
            );
        }
        assert_eq!(n, 50);
        producer.await.ok();
    }
}
