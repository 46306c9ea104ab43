//! One `PolicyService.DecideStream` for all of this supervisor's permissions, when the service
//! has it; `Decide` (one call each) when it answers UNIMPLEMENTED, as warden-approver does.
//!
//! A unary call is an HTTP/2 stream of its own: headers encoded and decoded both ways, a stream
//! set up and torn down, a trip through tonic's and tower's per-call layers on each side; on the
//! permission path that was a sixth of the policy's CPU per decision and about as much of the
//! supervisor's. On the stream a decision is one message each way, matched to its request by
//! `request_id` (answers come back as they are ready).
//!
//! What a caller sees is what `Decide` gives it: an answer, or an error status. A stream that
//! cannot be opened gives that error (UNAVAILABLE while the policy is down, which the caller
//! retries); a stream that ends (the policy restarted) fails every request still waiting on it
//! with UNAVAILABLE, and the next request opens a new one (the failed ones are retried by
//! their callers, each as a unary `Decide` of its own, see [`is_ended`]: whatever ended the
//! stream cannot end the next one by being retried on it). No request larger than the
//! contract's message bound is ever put on it (`PolicyClient::oversized`), so a message a
//! service cannot decode never ends it for everyone. A request whose caller stops waiting
//! (its deadline) is forgotten here; a late answer for it is dropped.
//!
//! Must never: hand one request's answer to another (answers are matched by request id only,
//! and a request id is waited for by one caller at a time), or leave a waiter without an answer
//! once its stream has ended.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Status;
use tonic::transport::Channel;
use warden_proto::v1 as pb;
use warden_proto::v1::policy_service_client::PolicyServiceClient;

/// How long a service without the stream is served by `Decide` before it is asked again (one
/// swapped for another while the supervisor runs is found within this).
const UNSUPPORTED_RECHECK: Duration = Duration::from_secs(60);

type Waiter = oneshot::Sender<Result<pb::Decision, Status>>;

/// An open stream: where requests go, and who waits for which answer.
struct Link {
    tx: mpsc::UnboundedSender<pb::DecideRequest>,
    waiting: Mutex<HashMap<String, Waiter>>,
    /// Set by the reader before it fails the waiters (see [`DecisionStream::decide`]).
    ended: AtomicBool,
}

impl Link {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiter>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

enum State {
    Closed,
    Open(Arc<Link>),
    /// The service has no stream (UNIMPLEMENTED) as of then.
    Unsupported(Instant),
}

/// The supervisor's stream of decisions (shared by every conversation).
pub struct DecisionStream {
    state: tokio::sync::Mutex<State>,
}

impl Default for DecisionStream {
    fn default() -> Self {
        DecisionStream {
            state: tokio::sync::Mutex::new(State::Closed),
        }
    }
}

/// Forgets a request whose caller stopped waiting.
struct Forget<'a> {
    link: &'a Link,
    request_id: &'a str,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.link.waiting().remove(self.request_id);
    }
}

impl DecisionStream {
    /// `req` decided on the stream; `None` when the service has no stream (use `Decide`).
    pub async fn decide(
        &self,
        client: &PolicyServiceClient<Channel>,
        req: pb::DecideRequest,
    ) -> Option<Result<pb::Decision, Status>> {
        let request_id = req.request_id.clone();
        let (tx, rx) = oneshot::channel();
        let link = match self.send(client, req, tx).await {
            Ok(Some(l)) => l,
            Ok(None) => return None,
            Err(status) => return Some(Err(status)),
        };
        let _forget = Forget {
            link: &link,
            request_id: &request_id,
        };
        Some(rx.await.unwrap_or_else(|_| Err(ended())))
    }

    /// Registers `waiter` for `req` and sends it on the open stream, opening one if there is
    /// none — with `req` already queued, so it travels with the stream's headers (a policy
    /// that never answers still receives it, as it would a `Decide`). `Ok(None)` for a service
    /// without the stream (`req` was not decided there: the caller uses `Decide`).
    async fn send(
        &self,
        client: &PolicyServiceClient<Channel>,
        req: pb::DecideRequest,
        waiter: Waiter,
    ) -> Result<Option<Arc<Link>>, Status> {
        let mut state = self.state.lock().await;
        match &*state {
            State::Open(l) if !l.ended.load(Ordering::SeqCst) => {
                let link = l.clone();
                drop(state);
                let id = req.request_id.clone();
                link.waiting().insert(id.clone(), waiter);
                // Checked after the insert: a reader that ended before it saw no waiter to
                // fail, and `ended` was set before its sweep, so one of the two sees this one.
                if link.tx.send(req).is_err() || link.ended.load(Ordering::SeqCst) {
                    link.waiting().remove(&id);
                    return Err(ended());
                }
                return Ok(Some(link));
            }
            State::Unsupported(since) if since.elapsed() < UNSUPPORTED_RECHECK => return Ok(None),
            _ => {}
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let link = Arc::new(Link {
            tx,
            waiting: Mutex::new(HashMap::new()),
            ended: AtomicBool::new(false),
        });
        link.waiting().insert(req.request_id.clone(), waiter);
        // Cannot fail: `rx` is still here.
        let _ = link.tx.send(req);
        let mut c = client.clone();
        match c.decide_stream(UnboundedReceiverStream::new(rx)).await {
            Ok(resp) => {
                tokio::spawn(read_answers(resp.into_inner(), link.clone()));
                tracing::debug!("decision stream to the policy service opened");
                *state = State::Open(link.clone());
                Ok(Some(link))
            }
            Err(s) if s.code() == tonic::Code::Unimplemented => {
                tracing::info!(
                    "the policy service has no DecideStream: each permission is one Decide call"
                );
                *state = State::Unsupported(Instant::now());
                Ok(None)
            }
            Err(s) => {
                *state = State::Closed;
                Err(s)
            }
        }
    }
}

/// The mark of [`ended`]'s status (a typed signal: a message text is never parsed).
const ENDED_MARK: &str = "x-warden-stream-ended";

fn ended() -> Status {
    let mut s = Status::unavailable("the decision stream to the policy service ended");
    s.metadata_mut()
        .insert(ENDED_MARK, tonic::metadata::MetadataValue::from_static("1"));
    s
}

/// Whether `status` says the stream a request was on ended (the caller retries it unary: see
/// `PolicyClient::decide`).
pub fn is_ended(status: &Status) -> bool {
    status.code() == tonic::Code::Unavailable && status.metadata().contains_key(ENDED_MARK)
}

/// Hands each answer to its waiter; at the end, fails every waiter left.
async fn read_answers(mut answers: tonic::Streaming<pb::Decision>, link: Arc<Link>) {
    loop {
        match answers.message().await {
            Ok(Some(d)) => {
                let waiter = link.waiting().remove(&d.request_id);
                match waiter {
                    Some(w) => {
                        let _ = w.send(Ok(d));
                    }
                    // Its caller gave up (deadline) or the id was never asked: dropped.
                    None => {
                        tracing::debug!(request_id = %d.request_id, decision_id = %d.decision_id, "an answer nobody waits for")
                    }
                }
            }
            Ok(None) => break,
            Err(status) => {
                tracing::debug!(error = %status, "the decision stream failed");
                break;
            }
        }
    }
    link.ended.store(true, Ordering::SeqCst);
    let left: Vec<Waiter> = link.waiting().drain().map(|(_, w)| w).collect();
    for w in left {
        let _ = w.send(Err(ended()));
    }
}
