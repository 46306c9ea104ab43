//! Warm agents: for each agent with `pool_size > 0`, agents spawned ahead of their conversation
//! exactly as a conversation's would be (same sandbox, environment allowlist, fresh home copy,
//! uid, cgroup and limits: the one spawn of `agent.rs`), `initialize`d and given their session
//! (`session/new` + the supervised mode), each waiting in a fresh owned root under an id of its
//! own (`POOL_PREFIX…`, a namespace callers cannot name). Opening a conversation in a fresh
//! owned root with the pool's profile takes one ([`Pool::take`], [`Pool::claim`]): the root's
//! registry entry, the uid, the live-agent slot and the lease are handed to the conversation,
//! the agent's ACP handler is bound to it — and with it, for a `network = "proxy"` agent, its
//! egress proxy, whose connections are from then on recorded under the conversation's context,
//! shown to its caller and counted for its turns — and the pool refills in the background.
//! What the open asks of the session (a model, an effort, planning for its verb) is set on the
//! taken agent by the conversation, the way a cold start sets it (`Conversation::open`); an
//! agent that cannot honour it is killed, not given back.
//!
//! Why the session is made ahead: `session/new` carries only the root's path (which does not
//! change: the directory does not move, only its record) and no MCP servers, and the mode
//! forced is the agent's configuration; nothing of the conversation (context, principal, verb,
//! task) reaches the agent before its first prompt. An agent that acts while it waits gains
//! nothing: its requests are refused unbound (`bridge::Binding`), and so is every connection to
//! its egress proxy, unread and unforwarded (`egress.rs`; counted as a request); at the take its
//! root must hold
//! exactly what the sandbox made (the root itself, mode 0710, and under bubblewrap the empty,
//! read-only agent-control entries) and be as it was after the handshake; its home, outside the
//! adapters' own state directories (`.claude`, `.codex`, `.gemini`: sessions, caches, logs the
//! adapter keeps writing as it runs — Claude's debug log grows while it waits; their
//! configuration files are read-only binds), exactly as it was once it had been quiet for a
//! moment after the handshake; both compared by `RootDir::snapshot_whole` (every entry's inode,
//! size, mode and times, `.git` and the directories themselves included); and the agent must
//! not have asked for anything — otherwise it is killed and the conversation
//! gets a cold start. Updates it sent wait for the first turn, which judges a mode change among
//! them like those of any idle agent.
//!
//! Must never: forward a connection a warm agent makes before it is taken, or report one to a
//! conversation other than the taker's; hand one warm agent (root, home, uid) to two conversations (a warm agent is
//! owned by exactly one place: the ready queue, its maker, or the taker); hand out an agent made
//! from another configuration than the conversation's; take a live-agent slot a conversation
//! waits for (`LiveAgents::try_acquire_spare`); respawn a crashing agent without backoff; or
//! outlive the supervisor (`drain` kills them, removes their roots and homes).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use warden_containment::beneath::{RootDir, Snapshot};

use crate::agent::{AgentProc, SessionStarted, StartError, Target};
use crate::bridge::Binding;
use crate::config::AgentConfig;
use crate::core::ConvCore;
use crate::shared::Shared;

/// The id namespace of warm agents (their roots' registry keys, slots, uids, leases). A
/// caller's context id may not start with it (`service.rs` refuses it).
pub const POOL_PREFIX: &str = "warden-pool~";
/// Whose the pool's start slots are (`Shared::starts`): a name no caller is given, so the pool
/// holds at most one principal's share of the starts, and only when nobody waits.
const POOL_PRINCIPAL: &str = "\u{0}warm-pool";

/// The profile warm agents are made for: what every A2A task opens with. A conversation with
/// another profile spawns its own agent.
pub const POOL_PROFILE: warden_sandbox::Profile = warden_sandbox::Profile::WorkspaceWrite;

/// Entries of a warm root or home that can be checked at the take; a larger home (its
/// template) makes its agents unusable warm (they are discarded, cold starts serve).
const CHECK_ENTRIES: usize = 50_000;

/// The first and the longest wait before another start after a warm agent failed (to start,
/// or by dying while it waited): doubled per failure in a row, reset when one is handed out.
const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// How often a pool that found no free slot or start permit looks again (besides being woken
/// by a slot given back).
const RETRY: Duration = Duration::from_millis(250);

/// One warm agent.
pub struct Warm {
    id: String,
    agent: String,
    cfg: AgentConfig,
    proc_: AgentProc,
    session: SessionStarted,
    binding: Arc<Binding>,
    boundary: warden_sandbox::Boundary,
    home: warden_sandbox::AgentHome,
    ident: Option<warden_sandbox::AgentIdentity>,
    root_dir: Arc<RootDir>,
    home_dir: Arc<RootDir>,
    root_seen: Snapshot,
    home_seen: Snapshot,
    /// Cancelled when it leaves the ready queue (taken or drained): its watcher ends.
    watch: CancellationToken,
}

impl Warm {
    /// The root it waits in (the conversation's, once taken).
    pub fn boundary(&self) -> &warden_sandbox::Boundary {
        &self.boundary
    }
    /// The identity it runs as.
    pub fn identity(&self) -> Option<warden_sandbox::AgentIdentity> {
        self.ident
    }
    /// Its leader's pid (for logs and tests of which agent served).
    pub fn pid(&self) -> Option<i32> {
        self.proc_.tree.as_ref().map(|t| t.leader().pid)
    }
}

/// What a take hands the conversation.
pub struct Claimed {
    pub proc_: AgentProc,
    pub session: SessionStarted,
    pub home: warden_sandbox::AgentHome,
}

/// The warm agents of one agent kind.
struct Kind {
    name: String,
    cfg: AgentConfig,
    size: usize,
    ready: Mutex<VecDeque<Warm>>,
    starting: AtomicUsize,
    /// Failures in a row (start failures and deaths while waiting): the backoff's exponent.
    failures: AtomicU32,
    wake: Notify,
    taken: AtomicU64,
    discarded: AtomicU64,
    died: AtomicU64,
    failed: AtomicU64,
}

impl Kind {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Warm>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the warm agent `id` out of the ready queue, if it is still there.
    fn remove(&self, id: &str) -> Option<Warm> {
        let mut q = self.lock();
        let i = q.iter().position(|w| w.id == id)?;
        q.remove(i)
    }

    fn backoff(&self) -> Duration {
        match self.failures.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            n => BACKOFF_FIRST
                .saturating_mul(1u32 << (n - 1).min(16))
                .min(BACKOFF_MAX),
        }
    }
}

/// The supervisor's warm agents, per agent kind.
pub struct Pool {
    shared: Arc<Shared>,
    kinds: BTreeMap<String, Arc<Kind>>,
    draining: CancellationToken,
    fillers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Pool {
    /// The pools of the configured agents (none running yet: [`Pool::start`]).
    pub fn new(shared: Arc<Shared>) -> Arc<Pool> {
        let settings = shared.settings();
        let s = &*settings;
        let kinds = s
            .agents
            .iter()
            .filter(|(_, a)| s.pool_size(a) > 0)
            .map(|(name, a)| {
                (
                    name.clone(),
                    Arc::new(Kind {
                        name: name.clone(),
                        cfg: a.clone(),
                        size: s.pool_size(a),
                        ready: Mutex::new(VecDeque::new()),
                        starting: AtomicUsize::new(0),
                        failures: AtomicU32::new(0),
                        wake: Notify::new(),
                        taken: AtomicU64::new(0),
                        discarded: AtomicU64::new(0),
                        died: AtomicU64::new(0),
                        failed: AtomicU64::new(0),
                    }),
                )
            })
            .collect();
        Arc::new(Pool {
            shared,
            kinds,
            draining: CancellationToken::new(),
            fillers: Mutex::new(Vec::new()),
        })
    }

    /// Removes what warm agents of a previous run left in the root registry (their trees are
    /// reaped with every other lease, their homes with every other home), then starts filling.
    pub async fn start(self: &Arc<Self>) {
        let roots = self.shared.roots.clone();
        let left = tokio::task::spawn_blocking(move || {
            let ids = roots.ids_with_prefix(POOL_PREFIX).unwrap_or_default();
            for id in &ids {
                if let Err(e) = roots.remove(id) {
                    tracing::warn!(pool_id = %id, error = %e, "cannot remove a previous run's warm root");
                }
            }
            ids.len()
        })
        .await
        .unwrap_or(0);
        if left > 0 {
            tracing::info!(roots = left, "removed the warm roots of a previous run");
        }
        let mut fillers = self.fillers.lock().unwrap_or_else(|p| p.into_inner());
        for kind in self.kinds.values() {
            let me = self.clone();
            let kind = kind.clone();
            fillers.push(tokio::spawn(async move { me.fill(kind).await }));
        }
    }

    /// Keeps `kind`'s ready queue at its size, one start at a time.
    async fn fill(self: Arc<Self>, kind: Arc<Kind>) {
        let mut released = self.shared.live.released();
        let mut reaped = self.shared.reaped.clone();
        let _ = reaped.wait_for(|done| *done).await;
        loop {
            if self.draining.is_cancelled() {
                return;
            }
            if kind.lock().len() >= kind.size {
                tokio::select! {
                    _ = kind.wake.notified() => {}
                    _ = self.draining.cancelled() => return,
                }
                continue;
            }
            let backoff = kind.backoff();
            if !backoff.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = self.draining.cancelled() => return,
                }
            }
            // A start permit and a slot only when free now: conversations never wait behind
            // the pool.
            let id = format!(
                "{POOL_PREFIX}{}~{}",
                kind.name,
                uuid::Uuid::new_v4().simple()
            );
            let permit = self.shared.starts.try_admit(POOL_PRINCIPAL);
            let slot = permit
                .as_ref()
                .and_then(|_| self.shared.live.try_acquire_spare(&id));
            let (Some(permit), Some(slot)) = (permit, slot) else {
                tokio::select! {
                    _ = released.changed() => {}
                    _ = tokio::time::sleep(RETRY) => {}
                    _ = self.draining.cancelled() => return,
                }
                continue;
            };
            kind.starting.fetch_add(1, Ordering::Relaxed);
            let made = self.make(&kind, &id, slot).await;
            kind.starting.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
            match made {
                Ok(w) => self.admit(&kind, w),
                Err(e) => {
                    kind.failed.fetch_add(1, Ordering::Relaxed);
                    if !self.draining.is_cancelled() {
                        kind.failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(agent = %kind.name, error = %e.headline(), stderr_tail = %e.stderr_tail(), next_in_ms = kind.backoff().as_millis() as u64, "a warm agent failed to start");
                    }
                }
            }
        }
    }

    /// Spawns one warm agent in a fresh root and home made for `id`, as a conversation's start
    /// would, and records how its root and home look once it is ready.
    async fn make(
        &self,
        kind: &Kind,
        id: &str,
        slot: crate::live::LiveSlot,
    ) -> Result<Warm, StartError> {
        let sh = &self.shared;
        // Asked to make room, or the supervisor stops: the start is abandoned (killed).
        let abort = self.draining.child_token();
        let evict = sh.live.evict_token(id);
        let stopper = {
            let abort = abort.clone();
            tokio::spawn(async move {
                match evict {
                    Some(e) => tokio::select! {
                        _ = e.cancelled() => abort.cancel(),
                        _ = abort.cancelled() => {}
                    },
                    None => abort.cancel(),
                }
            })
        };
        let res = self.make_inner(kind, id, slot, &abort).await;
        abort.cancel();
        let _ = stopper.await;
        res
    }

    async fn make_inner(
        &self,
        kind: &Kind,
        id: &str,
        slot: crate::live::LiveSlot,
        abort: &CancellationToken,
    ) -> Result<Warm, StartError> {
        let sh = &self.shared;
        let fail =
            |what: &str, e: &dyn std::fmt::Display| StartError::Spawn(format!("{what}: {e}"));
        let ident = sh
            .spawner
            .assign_identity(id)
            .map_err(|e| fail("agent uid", &e))?;
        // From here on every way out gives back what was made.
        let mut undo = Undo {
            shared: sh.clone(),
            id: id.to_string(),
            root: false,
        };
        let boundary = sh
            .roots
            .create(id, "", false, POOL_PROFILE, ident)
            .map_err(|e| fail("cannot make a sandbox", &e))?;
        undo.root = true;
        let home = sh
            .homes
            .create(id, kind.cfg.home.as_deref(), ident)
            .map_err(|e| fail("cannot make the agent home", &e))?;
        let binding = Binding::unbound();
        let target = Target {
            spawn_id: id,
            agent: &kind.name,
            principal: None,
            boundary: boundary.clone(),
            home: Some(home.path()),
        };
        let p = AgentProc::start(sh, slot, target, binding.clone(), &kind.cfg, Some(abort)).await?;
        let (mut p, session) = p
            .open_session(sh, &kind.cfg, &boundary.root, false, "", Some(abort))
            .await?;
        // What the root and home look like once it is ready and they are quiet (an adapter
        // finishes writing its own state, a debug log for one, after its session is made);
        // checked again at the take.
        let opened = {
            let (root_path, home_path) = (boundary.root.clone(), home.path().to_path_buf());
            // Looked at with the agent's rights, like every look at an agent's root or home.
            let rights = ident.map(Into::into);
            tokio::task::spawn_blocking(move || {
                Some((
                    Arc::new(RootDir::open_as(&root_path, rights).ok()?),
                    Arc::new(RootDir::open_as(&home_path, rights).ok()?),
                ))
            })
            .await
            .ok()
            .flatten()
        };
        let seen = match opened {
            Some((r, h)) => settled(
                &r,
                &h,
                sh.spawner.bwrap().is_some(),
                sh.settings().limits().handshake(),
                abort,
            )
            .await
            .map(|(rs, hs)| (r, h, rs, hs)),
            None => None,
        };
        let Some((root_dir, home_dir, root_seen, home_seen)) = seen else {
            p.kill(sh).await;
            return Err(StartError::Spawn(
                "it changed its root before it was asked, or its home did not stop changing \
                 within the handshake deadline (or they cannot be walked)"
                    .into(),
            ));
        };
        if abort.is_cancelled() {
            p.kill(sh).await;
            return Err(StartError::Spawn("stopped before it was ready".into()));
        }
        undo.disarm();
        tracing::info!(agent = %kind.name, pool_id = %id, pid = ?p.tree.as_ref().map(|t| t.leader().pid), "warm agent ready");
        Ok(Warm {
            id: id.to_string(),
            agent: kind.name.clone(),
            cfg: kind.cfg.clone(),
            proc_: p,
            session,
            binding,
            boundary,
            home,
            ident,
            root_dir,
            home_dir,
            root_seen,
            home_seen,
            watch: CancellationToken::new(),
        })
    }

    /// Puts a ready agent in the queue and watches it until it leaves: an agent that dies
    /// while waiting (or is asked to make room) is removed, disposed of and replaced.
    fn admit(self: &Arc<Self>, kind: &Arc<Kind>, w: Warm) {
        let id = w.id.clone();
        let client = w.proc_.client.clone();
        let watch = w.watch.clone();
        let evict = self.shared.live.evict_token(&id);
        kind.lock().push_back(w);
        let me = self.clone();
        let kind = kind.clone();
        tokio::spawn(async move {
            let evicted = async {
                match &evict {
                    Some(e) => e.cancelled().await,
                    None => std::future::pending().await,
                }
            };
            let died = tokio::select! {
                _ = watch.cancelled() => return,
                f = client.faulted() => {
                    tracing::warn!(agent = %kind.name, pool_id = %id, fault = %f, "a warm agent died while it waited");
                    true
                }
                _ = evicted => {
                    tracing::info!(agent = %kind.name, pool_id = %id, "a warm agent stops to make room");
                    false
                }
            };
            if let Some(w) = kind.remove(&id) {
                if died {
                    kind.died.fetch_add(1, Ordering::Relaxed);
                    kind.failures.fetch_add(1, Ordering::Relaxed);
                }
                dispose(&me.shared, w).await;
            }
            kind.wake.notify_one();
        });
    }

    /// A warm agent of `agent` for a conversation with `cfg` and `profile`, out of the queue:
    /// pass it to [`Pool::claim`] at once (a `Warm` dropped otherwise is killed without its root
    /// being removed until the next start). None when there is none the conversation can use.
    pub fn take(
        &self,
        agent: &str,
        cfg: &AgentConfig,
        profile: warden_sandbox::Profile,
    ) -> Option<Warm> {
        if profile != POOL_PROFILE || self.draining.is_cancelled() {
            return None;
        }
        let kind = self.kinds.get(agent)?;
        let w = {
            let mut q = kind.lock();
            // With a uid range a conversation gets the lowest free uid: a warm agent holding
            // another (a lower one was given back since it started) waits for a later one.
            let i = q
                .iter()
                .position(|w| self.shared.spawner.holds_next_identity(&w.id))?;
            q.remove(i)?
        };
        w.watch.cancel();
        kind.wake.notify_one();
        if &w.cfg != cfg {
            // Never the case within one run (the configuration is read once); a reload that
            // changed the agent must not get an agent of the old one.
            tracing::warn!(agent, pool_id = %w.id, "a warm agent of another configuration: discarded");
            let me_kind = kind.clone();
            me_kind.discarded.fetch_add(1, Ordering::Relaxed);
            let shared = self.shared.clone();
            tokio::spawn(async move { dispose(&shared, w).await });
            return None;
        }
        Some(w)
    }

    /// Hands `w` to the conversation of `core` (whose boundary is `w`'s): checks that it is
    /// still alive, asked for nothing and changed nothing in its root and home since it became
    /// ready, then relabels its slot, uid, root record and lease and binds its handler. Any
    /// check failing disposes of it and returns None (the conversation starts cold).
    pub async fn claim(&self, mut w: Warm, core: &Arc<ConvCore>) -> Option<Claimed> {
        let ctx = core.info.context_id.clone();
        let kind = self.kinds.get(&w.agent).cloned();
        let alive = w.proc_.client.fault().is_none()
            && w.proc_.tree.as_ref().is_some_and(|t| !t.leader_exited());
        let asked = w.binding.early_requests();
        let (r, h) = (w.root_dir.clone(), w.home_dir.clone());
        let now = tokio::task::spawn_blocking(move || {
            (
                r.snapshot_whole(CHECK_ENTRIES),
                h.snapshot_whole(CHECK_ENTRIES).map(home_outside_state),
            )
        })
        .await
        .unwrap_or((None, None));
        let bwrap = self.shared.spawner.bwrap().is_some();
        let root_same = now.0.as_ref() == Some(&w.root_seen)
            && now.0.as_ref().is_some_and(|r| fresh_root(r, bwrap));
        let home_same = now.1.as_ref() == Some(&w.home_seen);
        if !(alive && asked == 0 && root_same && home_same) {
            let changed: Vec<String> = [
                now.0.map(|n| w.root_seen.changed(&n)),
                now.1.map(|n| w.home_seen.changed(&n)),
            ]
            .into_iter()
            .flatten()
            .flatten()
            .take(8)
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
            tracing::warn!(context_id = %ctx, pool_id = %w.id, alive, early_requests = asked, root_same, home_same, changed = ?changed, "a warm agent is not handed out: discarded, starting one for the conversation");
            if let Some(k) = &kind {
                k.discarded.fetch_add(1, Ordering::Relaxed);
            }
            dispose(&self.shared, w).await;
            return None;
        }
        // The relabelling: slot, uid (with a range), root record, lease. The first two cannot
        // fail for a context that has no conversation (its open holds the context's slot).
        if !w.proc_.slot.relabel(&ctx) {
            tracing::error!(context_id = %ctx, pool_id = %w.id, "the conversation already holds a live slot: warm agent discarded");
            dispose(&self.shared, w).await;
            return None;
        }
        if let Err(e) = self.shared.spawner.transfer_identity(&w.id, &ctx) {
            tracing::error!(context_id = %ctx, pool_id = %w.id, error = %e, "cannot hand the warm agent's uid over: discarded");
            dispose(&self.shared, w).await;
            return None;
        }
        if let Err(e) = self.shared.roots.rename(&w.id, &ctx, &core.info.principal) {
            tracing::error!(context_id = %ctx, pool_id = %w.id, error = %e, "cannot hand the warm root over: discarded");
            self.shared.spawner.release_identity(&ctx);
            dispose(&self.shared, w).await;
            return None;
        }
        if let Some(t) = w.proc_.tree.as_mut()
            && let Err(e) = t.relabel(&ctx)
        {
            tracing::warn!(context_id = %ctx, error = %e, "cannot rename the lease of the warm agent");
        }
        if !w.binding.bind(core.clone()) {
            // Unreachable: a warm agent is bound only here, once.
            tracing::error!(context_id = %ctx, "warm agent already bound");
        }
        if let Some(k) = &kind {
            k.taken.fetch_add(1, Ordering::Relaxed);
            k.failures.store(0, Ordering::Relaxed);
        }
        tracing::info!(context_id = %ctx, pool_id = %w.id, agent = %w.agent, pid = ?w.pid(), root = %w.boundary.root.display(), "conversation takes a warm agent");
        Some(Claimed {
            proc_: w.proc_,
            session: w.session,
            home: w.home,
        })
    }

    /// The supervisor stops: no more starts, the starts under way end (killed), every warm
    /// agent is killed and its root and home removed.
    pub async fn drain(&self) {
        self.draining.cancel();
        let fillers: Vec<_> =
            std::mem::take(&mut *self.fillers.lock().unwrap_or_else(|p| p.into_inner()));
        for f in fillers {
            let _ = f.await;
        }
        let warm: Vec<Warm> = self
            .kinds
            .values()
            .flat_map(|k| k.lock().drain(..).collect::<Vec<_>>())
            .collect();
        let mut set = tokio::task::JoinSet::new();
        for w in warm {
            let shared = self.shared.clone();
            set.spawn(async move { dispose(&shared, w).await });
        }
        while set.join_next().await.is_some() {}
    }

    /// `Status` figures: per agent `pool.<agent>.{size,ready,starting,taken,discarded,died,
    /// failed}`.
    pub fn figures(&self) -> HashMap<String, String> {
        let mut out = HashMap::new();
        for (name, k) in &self.kinds {
            let mut put = |what: &str, v: String| {
                out.insert(format!("pool.{name}.{what}"), v);
            };
            put("size", k.size.to_string());
            put("ready", k.lock().len().to_string());
            put("starting", k.starting.load(Ordering::Relaxed).to_string());
            put("taken", k.taken.load(Ordering::Relaxed).to_string());
            put("discarded", k.discarded.load(Ordering::Relaxed).to_string());
            put("died", k.died.load(Ordering::Relaxed).to_string());
            put("failed", k.failed.load(Ordering::Relaxed).to_string());
        }
        out
    }
}

/// How long a ready warm agent's root and home must stay unchanged before they are recorded,
/// and how often they are looked at meanwhile. A second, not less: claude-agent-acp rewrites
/// `~/.claude.json` a while after it has answered `session/new`, and on a loaded host (CI, load
/// average 9) that came more than 300 ms after its previous write, so the home was recorded
/// before it and the agent was discarded at its take (`changed=[".claude.json"]`).
const QUIET: Duration = Duration::from_secs(1);
const QUIET_POLL: Duration = Duration::from_millis(100);

/// The root's snapshot as the agent found it (it must be exactly what the sandbox made: see
/// [`fresh_root`]) and the home's once it has not changed for [`QUIET`]; None when the root is
/// not fresh, the home does not settle within `within`, either cannot be walked, or the start
/// is abandoned.
async fn settled(
    root: &Arc<RootDir>,
    home: &Arc<RootDir>,
    bwrap: bool,
    within: Duration,
    abort: &CancellationToken,
) -> Option<(Snapshot, Snapshot)> {
    let deadline = tokio::time::Instant::now() + within;
    let look = |d: &Arc<RootDir>| {
        let d = d.clone();
        async move {
            tokio::task::spawn_blocking(move || d.snapshot_whole(CHECK_ENTRIES))
                .await
                .ok()
                .flatten()
        }
    };
    let root_seen = look(root).await.filter(|r| fresh_root(r, bwrap))?;
    let look_home = || async { look(home).await.map(home_outside_state) };
    let mut last = look_home().await?;
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        if tokio::time::Instant::now() - quiet_since >= QUIET {
            return Some((root_seen, last));
        }
        if tokio::time::Instant::now() >= deadline || abort.is_cancelled() {
            return None;
        }
        tokio::select! {
            _ = tokio::time::sleep(QUIET_POLL) => {}
            _ = abort.cancelled() => return None,
        }
        let now = look_home().await?;
        if now != last {
            last = now;
            quiet_since = tokio::time::Instant::now();
        }
    }
}

/// The adapters' own state directories in a home: where they keep sessions, caches and logs
/// (Claude's debug log grows while it waits), written by the adapter itself as it runs; their
/// configuration files are read-only binds (`HOME_CONTROL`) that cannot change.
const HOME_STATE_DIRS: [&str; 3] = [".claude", ".codex", ".gemini"];

/// A home's snapshot without the adapters' state directories: what a warm agent must leave as
/// it was (shell, git, npm and ssh files, anything else).
fn home_outside_state(mut snap: Snapshot) -> Snapshot {
    snap.retain(|p| {
        !p.components().next().is_some_and(|c| {
            HOME_STATE_DIRS
                .iter()
                .any(|d| c.as_os_str() == std::ffi::OsStr::new(d))
        })
    });
    snap
}

/// Whether a warm root holds exactly what the sandbox made in it: the root directory itself
/// (mode 0710, as `OwnedRoots::create` makes it) and, under bubblewrap, the empty agent-control
/// entries (`ROOT_CONTROL`, bound read-only over the root, so the agent cannot change them);
/// nothing else.
fn fresh_root(snap: &Snapshot, bwrap: bool) -> bool {
    let root_mode = snap.mode_of(std::path::Path::new(".")).map(|m| m & 0o7777);
    root_mode == Some(0o710)
        && snap.paths().all(|p| {
            p == std::path::Path::new(".")
                || (bwrap
                    && p.components().count() == 1
                    && warden_sandbox::ROOT_CONTROL
                        .iter()
                        .any(|(name, _)| p == std::path::Path::new(name)))
        })
}

/// Kills a warm agent that is not handed out and removes what was made for it (root, home,
/// uid; its live slot goes with the agent).
async fn dispose(shared: &Arc<Shared>, mut w: Warm) {
    w.watch.cancel();
    w.proc_.kill(shared).await;
    let roots = shared.roots.clone();
    let id = w.id.clone();
    let home = w.home;
    let removed = tokio::task::spawn_blocking(move || (roots.remove(&id), home.remove())).await;
    if let Ok((r, h)) = removed {
        for e in [r.err(), h.err()].into_iter().flatten() {
            tracing::warn!(pool_id = %w.id, error = %e, "cannot remove a warm agent's root or home");
        }
    }
    shared.spawner.release_identity(&w.id);
    drop(w.proc_);
}

/// Gives back what a warm start made (uid, root) unless disarmed; the home removes itself when
/// dropped, the tree is killed by the failed start itself.
struct Undo {
    shared: Arc<Shared>,
    id: String,
    root: bool,
}

impl Undo {
    fn disarm(mut self) {
        self.root = false;
        self.id.clear();
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if self.id.is_empty() {
            return;
        }
        if self.root
            && let Err(e) = self.shared.roots.remove(&self.id)
        {
            tracing::warn!(pool_id = %self.id, error = %e, "cannot remove the root of a failed warm start");
        }
        self.shared.spawner.release_identity(&self.id);
    }
}
