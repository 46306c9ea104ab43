//! `[cells]` mode: the supervisor cells of the shared store's registry, and which cell each
//! context's conversation lives on. Reads the registry every `cells.poll_ms` (ages by the
//! store's clock), places a new context on the best of K random live, non-draining cells
//! (`placement.rs`), records context → cell in `placement_contexts`, and hands out one mutual-TLS
//! channel per cell. Each placement it makes is taken off its cell's free slots at once, until
//! a report of the cell that counts it is read (`placement::free_now`): a burst spreads.
//!
//! A cell whose report is older than `cells.lost_after_ms` is lost: every turn streaming from it
//! ends with a `cell-lost` stop at the next poll, and the next message to one of its contexts is
//! placed on another cell, its first event a ContextReset (the same event a caller sees when a
//! supervisor restarts an agent without its session). A turn whose connection to its cell dies
//! (reset, or HTTP/2 keep-alive unanswered) ends `cell-lost` too. A cell that restarted (another
//! `started_at`) keeps its contexts, each told of the reset at its next turn. A conversation left
//! on a lost cell by a move is closed there if that start of the cell comes back
//! (`placement_orphans`). While the registry cannot be read, and for the bound after, no cell is
//! judged: a store outage ends no running turn.
//!
//! The registry's addresses are where to dial, not whom to trust: every channel admits only the
//! cells' SPIFFE ID (`cells.tls.admit`), so a row written by anyone else cannot turn a gateway's
//! turns towards another peer.
//!
//! Must never: run a turn twice (a lost cell's turn ends here and is never sent elsewhere), move
//! a context off a cell that is still live (a draining cell keeps its conversations), or place
//! on a cell that is draining or lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use warden_pgstate::{Pg, PgError};
use warden_proto::v1::supervisor_service_client::SupervisorServiceClient;
use warden_proto::v1::turn_event::Event;
use warden_proto::v1::{ContextReset, Fault, FaultClass, TurnEvent, TurnStop};

use crate::config::CellsSection;
use crate::placement::{CellView, choose, counted, free_now};

/// A turn's events as the core reads them, whichever way they came.
pub type TurnEvents = BoxStream<'static, Result<TurnEvent, tonic::Status>>;

#[derive(Debug, thiserror::Error)]
pub enum CellsError {
    #[error("cells store: {0}")]
    Store(#[from] PgError),
    #[error("cells.tls: {0}")]
    Tls(#[from] warden_daemon::tls::TlsError),
}

/// The registry as last read.
struct Snapshot {
    cells: Vec<CellView>,
    read_at: Instant,
}

/// The cells of the shared store.
pub struct Cells {
    pg: Pg,
    tls: warden_daemon::tls::ClientTls,
    choices: usize,
    lost_after: Duration,
    poll: Duration,
    view: RwLock<Snapshot>,
    channels: Mutex<HashMap<String, (String, SupervisorServiceClient<Channel>)>>,
    /// Per live cell, cancelled when it is found lost (a rejoining cell gets a new one).
    alive: Mutex<HashMap<String, CancellationToken>>,
    /// No cell is judged lost before this: after the registry could not be read, the cells get
    /// `lost_after` to write again (they could not either, when the store was the trouble).
    judge_from: Mutex<Instant>,
    /// This gateway's placements per cell that the cell's last report read may not count yet.
    placed: Mutex<HashMap<String, Vec<Instant>>>,
}

/// Where one context's turns go.
#[derive(Clone)]
pub struct Routed {
    pub client: SupervisorServiceClient<Channel>,
    /// The cell (None: the single `[supervisor]`).
    pub cell: Option<String>,
    /// Placed again on this call because its cell was lost: the reason the caller is told.
    pub reset: Option<String>,
    lost: Option<CancellationToken>,
    /// The gateway's side of the cell's channel and the address dialled (its identity and the
    /// refusal its connection met, for a refused call's fault).
    tls: Option<(warden_daemon::tls::ClientTls, String)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The fault of a turn whose cell is lost (or unreachable when the turn would start).
pub fn cell_lost(message: String) -> Fault {
    Fault {
        class: "cell-lost".into(),
        message,
        fault_class: FaultClass::CellLost as i32,
    }
}

/// The stop a turn ends with when its cell is lost.
pub fn cell_lost_stop(cell: &str, why: &str) -> TurnEvent {
    TurnEvent {
        event: Some(Event::Stop(TurnStop {
            stop_reason: "fault".into(),
            fault: Some(cell_lost(format!(
                "cell {cell} was lost mid-turn ({why}); the turn's outcome there is unknown and it is not run again"
            ))),
            ..Default::default()
        })),
        ..Default::default()
    }
}

impl Routed {
    /// The single supervisor of `[supervisor]`.
    pub fn single(client: SupervisorServiceClient<Channel>) -> Self {
        Self {
            client,
            cell: None,
            reset: None,
            lost: None,
            tls: None,
        }
    }

    /// When `status` (a refused call to this route's cell) is a refused certificate on either
    /// end: the `cell-refused` fault, logged with the identities involved.
    pub fn refused_certificate(&self, status: &tonic::Status) -> Option<Fault> {
        let cell = self.cell.as_deref()?;
        // The status's own chain when it carries the TLS error; else what the connection to
        // the cell noted (a refusal read after the handshake reaches the call only as
        // "operation was canceled").
        let refusal = std::error::Error::source(status)
            .and_then(warden_daemon::tls::refusal)
            .or_else(|| {
                let (tls, addr) = self.tls.as_ref()?;
                tls.refused(addr)
            })?;
        let mine = self
            .tls
            .as_ref()
            .map(|(t, _)| t.identities())
            .unwrap_or_default();
        let message = match &refusal {
            warden_daemon::tls::Refusal::ByPeer(alert) => {
                tracing::error!(cell, identities = ?mine, alert = %alert, "cell refused this gateway's certificate: check the cell's tls.admit and CA against this identity");
                format!(
                    "cell {cell} refused this gateway's certificate (identity {mine:?}, TLS alert {alert}): a configuration error, nothing ran"
                )
            }
            warden_daemon::tls::Refusal::OfPeer(why) => {
                tracing::error!(cell, identities = ?mine, error = %why, "this gateway refused the cell's certificate: check cells.tls.admit and the CA");
                format!(
                    "this gateway refused cell {cell}'s certificate ({why}): a configuration error, nothing ran"
                )
            }
        };
        Some(Fault {
            class: "cell-refused".into(),
            message,
            fault_class: FaultClass::CellRefused as i32,
        })
    }

    /// The turn's events. On a cell: a ContextReset right after the turn starts when the
    /// context was placed again, and a `cell-lost` stop when the cell is found lost or the
    /// stream breaks before the supervisor's own stop.
    pub fn events(&self, stream: tonic::Streaming<TurnEvent>) -> TurnEvents {
        let Some(cell) = self.cell.clone() else {
            return stream.boxed();
        };
        let lost = self.lost.clone().unwrap_or_default();
        struct St {
            inner: tonic::Streaming<TurnEvent>,
            reset: Option<String>,
            held: Option<TurnEvent>,
            done: bool,
        }
        let st = St {
            inner: stream,
            reset: self.reset.clone(),
            held: None,
            done: false,
        };
        futures::stream::unfold((st, lost, cell), |(mut st, lost, cell)| async move {
            if let Some(ev) = st.held.take() {
                return Some((Ok(ev), (st, lost, cell)));
            }
            if st.done {
                return None;
            }
            let next = tokio::select! {
                biased;
                n = st.inner.next() => n,
                _ = lost.cancelled() => {
                    st.done = true;
                    return Some((Ok(cell_lost_stop(&cell, "it stopped reporting to the shared store")), (st, lost, cell)));
                }
            };
            let ev = match next {
                Some(Ok(ev)) => ev,
                Some(Err(status)) => {
                    st.done = true;
                    let why = format!("its connection failed: {}", status.message());
                    return Some((Ok(cell_lost_stop(&cell, &why)), (st, lost, cell)));
                }
                None => {
                    st.done = true;
                    let why = "its stream ended without a stop";
                    return Some((Ok(cell_lost_stop(&cell, why)), (st, lost, cell)));
                }
            };
            if matches!(ev.event, Some(Event::Stop(_))) {
                st.done = true;
            }
            if matches!(ev.event, Some(Event::Started(_)))
                && let Some(reason) = st.reset.take()
            {
                st.held = Some(TurnEvent {
                    event: Some(Event::ContextReset(ContextReset { reason })),
                    ..Default::default()
                });
            }
            Some((Ok(ev), (st, lost, cell)))
        })
        .boxed()
    }
}

/// When a report read at `read_at`, `age_ms` old then, was written (this process's clock).
fn reported_at(read_at: Instant, age_ms: u64) -> Instant {
    read_at
        .checked_sub(Duration::from_millis(age_ms))
        .unwrap_or(read_at)
}

fn random_index(n: usize) -> usize {
    (uuid::Uuid::new_v4().as_u128() % n.max(1) as u128) as usize
}

impl Cells {
    /// Connects, migrates the shared schema, reads the registry once and keeps reading it.
    pub async fn start(
        section: &CellsSection,
        state_dir: &std::path::Path,
    ) -> Result<Arc<Self>, CellsError> {
        let pg = Pg::new(&section.store())?;
        warden_pgstate::migrate::migrate(&pg).await?;
        let me = Arc::new(Self {
            pg,
            tls: warden_daemon::tls::ClientTls::new(&section.tls, state_dir)?,
            choices: section.choices,
            lost_after: Duration::from_millis(section.lost_after_ms),
            poll: Duration::from_millis(section.poll_ms),
            view: RwLock::new(Snapshot {
                cells: Vec::new(),
                read_at: Instant::now(),
            }),
            channels: Mutex::new(HashMap::new()),
            alive: Mutex::new(HashMap::new()),
            judge_from: Mutex::new(Instant::now()),
            placed: Mutex::new(HashMap::new()),
        });
        me.poll_once().await?;
        let weak = Arc::downgrade(&me);
        let every = me.poll;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            let closing = Arc::new(std::sync::atomic::AtomicBool::new(false));
            loop {
                tick.tick().await;
                let Some(me) = weak.upgrade() else { break };
                match me.poll_once().await {
                    Ok(()) => {
                        failing = false;
                        if !closing.swap(true, std::sync::atomic::Ordering::AcqRel) {
                            let (me, closing) = (me.clone(), closing.clone());
                            tokio::spawn(async move {
                                if let Err(e) = me.close_orphans().await {
                                    tracing::debug!(error = %e, "closing conversations left on cells: retried at the next poll");
                                }
                                closing.store(false, std::sync::atomic::Ordering::Release);
                            });
                        }
                    }
                    Err(e) => {
                        if !failing {
                            tracing::warn!(error = %e, "cannot read the cell registry; no new placement until it answers, running turns keep going");
                        }
                        failing = true;
                        *lock(&me.judge_from) = Instant::now() + me.lost_after;
                        // No judgment on what could not be read: an outage of the store must not
                        // end every running turn. A cell that dies meanwhile is still found by
                        // its connection (reset, or the HTTP/2 keep-alive's bound).
                    }
                }
            }
        });
        Ok(me)
    }

    fn lost_after_ms(&self) -> u64 {
        self.lost_after.as_millis() as u64
    }

    async fn poll_once(&self) -> Result<(), PgError> {
        let c = self.pg.client().await?;
        let rows = tokio::time::timeout(
            self.pg.timeout(),
            c.query(
                "SELECT cell_id, address, free_slots, draining,
                        GREATEST(0, (EXTRACT(EPOCH FROM (now() - refreshed_at)) * 1000))::BIGINT,
                        (EXTRACT(EPOCH FROM started_at) * 1000)::BIGINT
                 FROM cell_registry",
                &[],
            ),
        )
        .await
        .map_err(|_| PgError::Timeout(self.pg.timeout().as_millis() as u64))??;
        let mut cells = Vec::with_capacity(rows.len());
        for r in rows {
            let free: i32 = r.try_get(2)?;
            let age: i64 = r.try_get(4)?;
            cells.push(CellView {
                id: r.try_get(0)?,
                address: r.try_get(1)?,
                free_slots: i64::from(free),
                draining: r.try_get(3)?,
                age_ms: age.max(0) as u64,
                started_ms: r.try_get(5)?,
            });
        }
        let read_at = Instant::now();
        // Placements the reports now read count are no longer taken off (nor those on cells
        // gone from the registry).
        lock(&self.placed).retain(|id, placed| {
            if let Some(c) = cells.iter().find(|c| &c.id == id) {
                let reported = reported_at(read_at, c.age_ms);
                placed.retain(|p| !counted(*p, reported));
            }
            cells.iter().any(|c| &c.id == id) && !placed.is_empty()
        });
        if let Ok(mut v) = self.view.write() {
            *v = Snapshot { cells, read_at };
        }
        self.judge();
        Ok(())
    }

    /// The registry now: each age grown by the time since it was read, each cell's free slots
    /// less this gateway's placements its report does not count yet.
    fn cells_now(&self) -> Vec<CellView> {
        let Ok(v) = self.view.read() else {
            return Vec::new();
        };
        let since = v.read_at.elapsed().as_millis() as u64;
        let placed = lock(&self.placed);
        v.cells
            .iter()
            .map(|c| CellView {
                age_ms: c.age_ms.saturating_add(since),
                free_slots: match placed.get(&c.id) {
                    Some(p) => free_now(c.free_slots, reported_at(v.read_at, c.age_ms), p),
                    None => c.free_slots,
                },
                ..c.clone()
            })
            .collect()
    }

    /// Takes back the latest placement counted on `cell` (it did not happen).
    fn unreserve(&self, cell: &str) {
        if let Some(p) = lock(&self.placed).get_mut(cell) {
            p.pop();
        }
    }

    /// Counts a placement on `cell` against its free slots from now on.
    fn reserve(&self, cell: &str) {
        lock(&self.placed)
            .entry(cell.to_string())
            .or_default()
            .push(Instant::now());
    }

    /// Cancels the token of every cell that is lost now (or gone from the registry).
    fn judge(&self) {
        if Instant::now() < *lock(&self.judge_from) {
            return;
        }
        let cells = self.cells_now();
        let bound = self.lost_after_ms();
        let mut alive = lock(&self.alive);
        alive.retain(|id, token| {
            let live = cells.iter().any(|c| &c.id == id && c.live(bound));
            if !live {
                tracing::warn!(cell = %id, bound_ms = bound, "cell lost: no report within the bound; its running turns end cell-lost");
                token.cancel();
            }
            live
        });
    }

    fn client(&self, cell: &str) -> Option<Routed> {
        let view = self.cells_now();
        let c = view.iter().find(|c| c.id == cell)?;
        let client = {
            let mut ch = lock(&self.channels);
            match ch.get(cell) {
                Some((addr, client)) if *addr == c.address => client.clone(),
                _ => {
                    let channel = match self.tls.channel(&c.address) {
                        Ok(ch) => ch,
                        Err(e) => {
                            tracing::warn!(cell, address = %c.address, error = %e, "cannot make a channel to the cell");
                            return None;
                        }
                    };
                    let client = SupervisorServiceClient::new(channel);
                    ch.insert(cell.to_string(), (c.address.clone(), client.clone()));
                    client
                }
            }
        };
        let lost = lock(&self.alive)
            .entry(cell.to_string())
            .or_default()
            .clone();
        Some(Routed {
            client,
            cell: Some(cell.to_string()),
            reset: None,
            lost: Some(lost),
            tls: Some((self.tls.clone(), c.address.clone())),
        })
    }

    /// A new cell for a context, by the best of K.
    fn choose(&self) -> Option<CellView> {
        let view = self.cells_now();
        choose(&view, self.choices, self.lost_after_ms(), random_index).cloned()
    }

    /// The cell of `context_id`, placing it when `place` and it has none or its cell is lost.
    /// A context whose cell restarted since it was placed (another `started_at`: its agents are
    /// gone) stays there, its next turn told of the reset. Ok(None): not placed (and `place`
    /// false), or no cell can take it.
    pub async fn route(
        &self,
        context_id: &str,
        place: Option<&str>,
    ) -> Result<Option<Routed>, PgError> {
        // Bounded: a store that hangs (frozen, partitioned) fails the turn, it does not hold it.
        let bound = self.pg.timeout() * 2;
        tokio::time::timeout(bound, self.route_unbounded(context_id, place))
            .await
            .map_err(|_| PgError::Timeout(bound.as_millis() as u64))?
    }

    async fn route_unbounded(
        &self,
        context_id: &str,
        place: Option<&str>,
    ) -> Result<Option<Routed>, PgError> {
        let c = self.pg.client().await?;
        // The placed cell's registry row is read with the placement, not from the last poll:
        // a cell that restarted a moment ago is seen as restarted at once (it registers before
        // it serves).
        let placed = match c
            .query_opt(
                "SELECT p.cell_id, p.cell_started_ms,
                        (EXTRACT(EPOCH FROM r.started_at) * 1000)::BIGINT,
                        GREATEST(0, (EXTRACT(EPOCH FROM (now() - r.refreshed_at)) * 1000))::BIGINT
                 FROM placement_contexts p LEFT JOIN cell_registry r ON r.cell_id = p.cell_id
                 WHERE p.context_id = $1",
                &[&context_id],
            )
            .await?
        {
            Some(r) => {
                let now: Option<(i64, i64)> = match (r.try_get(2)?, r.try_get(3)?) {
                    (Some(started), Some(age)) => Some((started, age)),
                    _ => None,
                };
                Some((r.try_get::<_, String>(0)?, r.try_get::<_, i64>(1)?, now))
            }
            None => None,
        };
        let bound = self.lost_after_ms();
        let Some((old, started, now)) = placed else {
            let Some(principal) = place else {
                return Ok(None);
            };
            let Some(new) = self.choose() else {
                return Ok(None);
            };
            // Counted before the insert's round trip: the placements of a burst decided
            // meanwhile see it.
            self.reserve(&new.id);
            let inserted = c
                .execute(
                    "INSERT INTO placement_contexts (context_id, cell_id, cell_started_ms, principal)
                     VALUES ($1, $2, $3, $4) ON CONFLICT (context_id) DO NOTHING",
                    &[&context_id, &new.id, &new.started_ms, &principal],
                )
                .await?;
            if inserted == 0 {
                // Another gateway placed it first: follow its choice (and count its placement
                // no more here).
                self.unreserve(&new.id);
                drop(c);
                return Box::pin(self.route_unbounded(context_id, None)).await;
            }
            tracing::info!(context_id, cell = %new.id, "context placed");
            return Ok(self.client(&new.id));
        };
        let (target, reason) = match now {
            // A call about the conversation where it is (cancel, answer, close): only a live
            // cell holds it; a lost one has nothing this gateway can reach.
            Some((_, age)) if place.is_none() && age as u64 <= bound => {
                return Ok(self.client(&old));
            }
            _ if place.is_none() => return Ok(None),
            Some((now_started, age)) if age as u64 <= bound && now_started == started => {
                return Ok(self.client(&old));
            }
            Some((now_started, age)) if age as u64 <= bound => (
                CellView {
                    id: old.clone(),
                    address: String::new(),
                    free_slots: 0,
                    draining: false,
                    age_ms: age as u64,
                    started_ms: now_started,
                },
                format!(
                    "cell {old} restarted since this conversation's last turn; this turn starts a new agent there without the earlier context"
                ),
            ),
            _ => {
                let Some(new) = self.choose() else {
                    return Ok(None);
                };
                let why = format!(
                    "the cell this conversation ran on ({old}) was lost; this turn starts a new agent on cell {} without the earlier context",
                    new.id
                );
                (new, why)
            }
        };
        let lost = target.id != old;
        let mut c = c;
        let tx = c.transaction().await?;
        let moved = tx
            .execute(
                "UPDATE placement_contexts SET cell_id = $4, cell_started_ms = $5, placed_at = now()
                 WHERE context_id = $1 AND cell_id = $2 AND cell_started_ms = $3",
                &[&context_id, &old, &started, &target.id, &target.started_ms],
            )
            .await?;
        if moved > 0 && lost {
            // Its conversation may still be alive there (a partition, not a death): closed
            // once that cell is back (close_orphans).
            tx.execute(
                "INSERT INTO placement_orphans (cell_id, cell_started_ms, context_id, principal)
                 SELECT $2, $3, context_id, principal FROM placement_contexts
                 WHERE context_id = $1
                 ON CONFLICT (cell_id, context_id) DO UPDATE
                     SET cell_started_ms = EXCLUDED.cell_started_ms",
                &[&context_id, &old, &started],
            )
            .await?;
        }
        tx.commit().await?;
        if moved > 0 && lost {
            self.reserve(&target.id);
        }
        if moved == 0 {
            drop(c);
            return Box::pin(self.route_unbounded(context_id, None)).await;
        }
        tracing::warn!(context_id, from = %old, to = %target.id, reason = %reason, "context placed again");
        Ok(self.client(&target.id).map(|mut r| {
            r.reset = Some(reason);
            r
        }))
    }

    /// Closes, on each live cell, the conversations left there when their contexts moved away
    /// while it was lost; forgets those of a cell that restarted since (nothing left to close).
    /// Best effort, a bounded batch per call; what fails is tried at the next.
    async fn close_orphans(&self) -> Result<(), PgError> {
        let c = self.pg.client().await?;
        let rows = c
            .query(
                "SELECT cell_id, cell_started_ms, context_id, principal FROM placement_orphans
                 LIMIT 64",
                &[],
            )
            .await?;
        if rows.is_empty() {
            return Ok(());
        }
        let view = self.cells_now();
        let bound = self.lost_after_ms();
        for r in rows {
            let (cell, started, context_id, principal): (String, i64, String, String) =
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?);
            let Some(now) = view.iter().find(|v| v.id == cell) else {
                continue;
            };
            let done = if now.started_ms != started {
                true
            } else if !now.live(bound) {
                false
            } else if let Some(routed) = self.client(&cell) {
                let req = warden_proto::v1::CloseConversationRequest {
                    context_id: context_id.clone(),
                    principal,
                };
                let mut client = routed.client;
                match tokio::time::timeout(Duration::from_secs(10), client.close_conversation(req))
                    .await
                {
                    Ok(Ok(r)) => {
                        tracing::info!(cell = %cell, context_id = %context_id, found = r.get_ref().closed, "closed a conversation left on a cell that came back");
                        true
                    }
                    _ => false,
                }
            } else {
                false
            };
            if done {
                c.execute(
                    "DELETE FROM placement_orphans WHERE cell_id = $1 AND context_id = $2
                     AND cell_started_ms = $3",
                    &[&cell, &context_id, &started],
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Any live cell (for what every cell answers alike: the agents, the workspaces).
    pub fn any(&self) -> Option<Routed> {
        let id = self.choose().map(|c| c.id).or_else(|| {
            let bound = self.lost_after_ms();
            self.cells_now()
                .into_iter()
                .find(|c| c.live(bound))
                .map(|c| c.id)
        })?;
        self.client(&id)
    }

    /// Forgets a context's placement (the context itself was forgotten).
    pub async fn forget(&self, context_id: &str) -> Result<(), PgError> {
        let c = self.pg.client().await?;
        c.execute(
            "DELETE FROM placement_contexts WHERE context_id = $1",
            &[&context_id],
        )
        .await?;
        Ok(())
    }
}
