//! Push notifications: a caller's webhook configs for a task (stored with the task) and the
//! delivery of every status change of that task to each of them, in order, with retries.
//!
//! Owns: checking a webhook URL against the operator's `[push]` allowlist, and the delivery
//! workers (one per task and config, so a config's notifications arrive in the order the task
//! changed) with bounded retries and backoff; the delivery counters shown by `warden status`.
//!
//! Must never: connect to an address it has not checked. A webhook host is resolved at each
//! delivery, every address it resolves to must pass the check (loopback, private, link-local,
//! CGNAT, multicast, unspecified and other non-global ranges are refused unless the operator
//! allowed that network explicitly), and the connection goes to the checked address itself
//! (`TcpStream::connect(SocketAddr)`), never to the name again: a DNS answer that changes between
//! check and connect (rebinding) cannot redirect it. Redirects are not followed.
//! Names are resolved on the runtime (`push_limits::Resolver`, never a blocking thread), after
//! every check that needs no lookup, within the principal's share of lookups and deliveries.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::a2a::{StreamResponse, TaskPushNotificationConfig};
use crate::error::A2aError;
use crate::push_limits::{Resolver, Shares};
use crate::store::{PushRecord, TaskStore};

/// Longest accepted config id (the URL's bound is `warden_egress::url::MAX_URL`).
const MAX_ID: usize = 128;

pub use crate::config::PushSection;

/// The one address classification and URL parser (shared with the supervisor's egress proxy).
pub use warden_egress::{Cidr, HttpUrl as WebhookUrl, non_public};

/// The operator's rules for webhook targets.
#[derive(Debug, Clone)]
pub struct TargetPolicy {
    hosts: Vec<String>,
    networks: Vec<Cidr>,
}

impl TargetPolicy {
    pub fn from_config(s: &PushSection) -> Self {
        Self {
            hosts: s
                .allowed_hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
            networks: s
                .allowed_networks
                .iter()
                .filter_map(|n| Cidr::parse(n))
                .collect(),
        }
    }

    pub fn host_allowed(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| {
            h == "*"
                || h == host
                || h.strip_prefix("*.")
                    .is_some_and(|d| host.ends_with(&format!(".{d}")))
        })
    }

    /// Whether a webhook may be at `ip`.
    pub fn address_allowed(&self, ip: IpAddr) -> Result<(), String> {
        match non_public(ip) {
            None => Ok(()),
            Some(_) if self.networks.iter().any(|n| n.contains(ip)) => Ok(()),
            Some(why) => Err(format!(
                "{ip} is a {why} address; webhooks may only reach public addresses unless the operator allows the network (push.allowed_networks)"
            )),
        }
    }

    /// The address to connect to out of what the host resolved to: every one must be allowed
    /// (a name that also resolves to a forbidden address is refused as a whole, so which address
    /// a later lookup returns first cannot matter).
    pub fn pick(&self, host: &str, addrs: &[SocketAddr]) -> Result<SocketAddr, String> {
        let first = addrs
            .first()
            .copied()
            .ok_or_else(|| format!("{host} resolves to no address"))?;
        for a in addrs {
            self.address_allowed(a.ip())
                .map_err(|e| format!("{host} resolves to {e}"))?;
        }
        Ok(first)
    }

    /// What is decided without a lookup: the allowlist, and an IP literal's address (the
    /// address to connect to). `Ok(None)`: the host is a name to resolve.
    pub fn without_lookup(&self, url: &WebhookUrl) -> Result<Option<SocketAddr>, Refusal> {
        if !self.host_allowed(&url.host) {
            return Err(Refusal::Forbidden(format!(
                "webhook host {} is not in the operator's allowlist (push.allowed_hosts)",
                url.host
            )));
        }
        if let Ok(ip) = url.host.parse::<IpAddr>() {
            self.address_allowed(ip).map_err(Refusal::Forbidden)?;
            return Ok(Some(SocketAddr::new(ip, url.port)));
        }
        Ok(None)
    }

    /// Resolves (on the runtime, [`Resolver`]) and checks a webhook; the address to connect to.
    pub async fn resolve(&self, url: &WebhookUrl, dns: &Resolver) -> Result<SocketAddr, Refusal> {
        if let Some(addr) = self.without_lookup(url)? {
            return Ok(addr);
        }
        let addrs = dns
            .lookup(&url.host, url.port)
            .await
            .map_err(Refusal::Unresolved)?;
        self.pick(&url.host, &addrs).map_err(Refusal::Forbidden)
    }
}

/// Why a webhook cannot be reached now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not allowed: the host, or an address it resolves to.
    Forbidden(String),
    /// The name does not resolve (now): a config is still accepted, the check is repeated at
    /// every delivery.
    Unresolved(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Forbidden(s) | Refusal::Unresolved(s) => f.write_str(s),
        }
    }
}

/// Delivery counters (`warden status`, admin Status details).
#[derive(Debug, Clone, Default)]
pub struct PushStats {
    pub delivered: u64,
    pub retries: u64,
    pub failed: u64,
    /// The latest notification given up on: when, task, host, why.
    pub last_failure: Option<String>,
}

/// One config's queue of notifications.
type Queue = mpsc::UnboundedSender<Arc<StreamResponse>>;

/// The push service: config checks, storage and delivery.
pub struct Push {
    settings: PushSection,
    /// The TLS client for https webhooks (public roots plus `push.ca_file`).
    tls: Arc<rustls::ClientConfig>,
    /// The webhook allowlist; replaced whole by a reload (SIGHUP).
    policy: std::sync::RwLock<Arc<TargetPolicy>>,
    store: TaskStore,
    stats: Mutex<PushStats>,
    /// (task id, config id) → the worker delivering that config's notifications in order.
    workers: Mutex<HashMap<(String, String), Queue>>,
    /// Task id → its dispatcher (reads the task's configs for each event, in order).
    tasks: Mutex<HashMap<String, Queue>>,
    /// Webhook host names, resolved on the runtime (`push.nameservers`).
    dns: Resolver,
    /// Lookups in flight for config creation, per principal (refused past the share).
    lookups: Shares,
    /// Deliveries in flight, per principal (waited for in turn).
    deliveries: Shares,
}

impl Push {
    /// `state_dir` resolves a relative `ca_file`. Fails when `ca_file` cannot be read or holds
    /// no certificate.
    pub fn new(
        settings: PushSection,
        store: TaskStore,
        state_dir: &std::path::Path,
    ) -> Result<Arc<Self>, String> {
        let tls = tls_config(
            settings
                .ca_file
                .as_deref()
                .map(|p| state_dir.join(p))
                .as_deref(),
        )?;
        Ok(Arc::new(Self {
            policy: std::sync::RwLock::new(Arc::new(TargetPolicy::from_config(&settings))),
            tls,
            store,
            stats: Mutex::new(PushStats::default()),
            workers: Mutex::new(HashMap::new()),
            tasks: Mutex::new(HashMap::new()),
            dns: Resolver::new(&settings.nameservers),
            lookups: Shares::new(
                settings.max_lookups_per_principal,
                settings.max_lookups,
                ("push.max_lookups_per_principal", "push.max_lookups"),
            ),
            deliveries: Shares::new(
                settings.max_deliveries_per_principal,
                settings.max_deliveries,
                ("push.max_deliveries_per_principal", "push.max_deliveries"),
            ),
            settings,
        }))
    }

    pub fn enabled(&self) -> bool {
        self.settings.enabled
    }

    fn policy(&self) -> Arc<TargetPolicy> {
        match self.policy.read() {
            Ok(g) => g.clone(),
            // Replaced in one assignment: a panic elsewhere cannot leave it half-written.
            Err(p) => p.into_inner().clone(),
        }
    }

    /// A reload's new webhook allowlist (`push.allowed_hosts`, `push.allowed_networks`): every
    /// config checked and every delivery made from now on is held to it.
    pub fn set_allowlist(&self, section: &PushSection) {
        let next = Arc::new(TargetPolicy::from_config(section));
        match self.policy.write() {
            Ok(mut g) => *g = next,
            Err(p) => *p.into_inner() = next,
        }
    }

    pub fn stats(&self) -> PushStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Checks a config (URL, allowlist, id, credentials, room on its task, then what the host
    /// resolves to now) and fills in its id, and its task when `task_id` is known (None: a
    /// config sent with the message that creates the task, bound once the task exists).
    /// Everything that needs no lookup is checked first; a lookup is made within `principal`'s
    /// share of them (ResourceExhausted past it). Refusals are InvalidParams naming the reason.
    pub async fn check(
        &self,
        principal: &str,
        task_id: Option<&str>,
        mut cfg: TaskPushNotificationConfig,
    ) -> Result<TaskPushNotificationConfig, A2aError> {
        if !self.settings.enabled {
            return Err(A2aError::PushNotificationNotSupported);
        }
        if let Some(task_id) = task_id {
            if !cfg.task_id.is_empty() && cfg.task_id != task_id {
                return Err(A2aError::InvalidParams(format!(
                    "the config's taskId {:?} is not the task {task_id:?}",
                    cfg.task_id
                )));
            }
            cfg.task_id = task_id.to_string();
        } else if !cfg.task_id.is_empty() {
            return Err(A2aError::InvalidParams(
                "a push config sent with a new message has no taskId (the task does not exist yet)"
                    .into(),
            ));
        }
        if cfg.id.is_empty() {
            cfg.id = uuid::Uuid::new_v4().to_string();
        }
        check_id(&cfg.id)?;
        if let Some(a) = &cfg.authentication
            && (a.scheme.is_empty()
                || !a
                    .scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-')
                || a.credentials
                    .as_deref()
                    .is_some_and(|c| c.chars().any(|ch| ch.is_control())))
        {
            return Err(A2aError::InvalidParams(
                "authentication.scheme must be an HTTP auth scheme (letters, digits, -) and credentials one line".into(),
            ));
        }
        if cfg
            .token
            .as_deref()
            .is_some_and(|t| t.chars().any(char::is_control) || t.len() > 1024)
        {
            return Err(A2aError::InvalidParams(
                "token must be one line of at most 1024 characters".into(),
            ));
        }
        let url = WebhookUrl::parse(&cfg.url)
            .map_err(|e| A2aError::InvalidParams(format!("webhook url refused: {e}")))?;
        if let Some(task_id) = task_id {
            self.room_for(task_id, &cfg.id).await?;
        }
        let policy = self.policy();
        let resolved = match policy.without_lookup(&url) {
            Ok(Some(addr)) => Ok(addr),
            Ok(None) => {
                let _lookup = self.lookups.try_take(principal, "webhook lookups")?;
                policy.resolve(&url, &self.dns).await
            }
            Err(e) => Err(e),
        };
        match resolved {
            Ok(_) => {}
            // The name may resolve later (or only where deliveries run from): every delivery
            // resolves and checks it again before connecting.
            Err(Refusal::Unresolved(e)) => {
                tracing::warn!(task_id = task_id.unwrap_or(""), host = %url.host, reason = %e, "webhook host does not resolve now; accepted, checked again at each delivery");
            }
            Err(Refusal::Forbidden(e)) => {
                tracing::warn!(task_id = task_id.unwrap_or(""), host = %url.host, reason = %e, "webhook refused");
                return Err(A2aError::InvalidParams(format!("webhook url refused: {e}")));
            }
        }
        Ok(cfg)
    }

    /// Whether `task_id` may have the config `id` (a new one within
    /// `push.max_configs_per_task`, or one it has, replaced).
    async fn room_for(&self, task_id: &str, id: &str) -> Result<(), A2aError> {
        let existing = self.store.push_configs(task_id).await.map_err(store_err)?;
        if existing.len() >= self.settings.max_configs_per_task
            && !existing.iter().any(|r| r.config.id == id)
        {
            return Err(A2aError::InvalidParams(format!(
                "task {task_id} already has {} push configs (push.max_configs_per_task)",
                existing.len()
            )));
        }
        Ok(())
    }

    /// Stores a checked config (replacing one with the same id).
    pub async fn put(
        &self,
        principal: &str,
        cfg: TaskPushNotificationConfig,
    ) -> Result<(), A2aError> {
        // Again: configs stored while this one was checked count too.
        self.room_for(&cfg.task_id, &cfg.id).await?;
        tracing::info!(task_id = %cfg.task_id, config_id = %cfg.id, "push config stored");
        self.store
            .put_push(&PushRecord {
                principal: principal.to_string(),
                config: cfg,
                created_micros: crate::time::now_micros(),
            })
            .await
            .map_err(store_err)
    }

    pub async fn get(
        &self,
        task_id: &str,
        id: &str,
    ) -> Result<TaskPushNotificationConfig, A2aError> {
        self.store
            .push_config(task_id, id)
            .await
            .map_err(store_err)?
            .map(|r| r.config)
            .ok_or_else(|| {
                A2aError::TaskNotFound(format!("{task_id}/pushNotificationConfigs/{id}"))
            })
    }

    pub async fn list(&self, task_id: &str) -> Result<Vec<TaskPushNotificationConfig>, A2aError> {
        Ok(self
            .store
            .push_configs(task_id)
            .await
            .map_err(store_err)?
            .into_iter()
            .map(|r| r.config)
            .collect())
    }

    /// Deletes a config; deleting one that is already gone succeeds too (spec: idempotent).
    pub async fn delete(&self, task_id: &str, id: &str) -> Result<(), A2aError> {
        if self
            .store
            .delete_push(task_id, id)
            .await
            .map_err(store_err)?
        {
            tracing::info!(task_id, config_id = id, "push config deleted");
        }
        Ok(())
    }

    /// A task's status changed: queue the event for each of its configs, in order. Never
    /// blocks (called while the task's state is locked): the event goes to the task's
    /// dispatcher, which reads the task's configs (an await on the store) and hands it to each
    /// config's worker, one event after the other.
    pub fn task_event(self: &Arc<Self>, task_id: &str, ev: &Arc<StreamResponse>) {
        if !self.settings.enabled {
            return;
        }
        let Ok(mut tasks) = self.tasks.lock() else {
            return;
        };
        let tx = tasks.entry(task_id.to_string()).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(self.clone().dispatch(task_id.to_string(), rx));
            tx
        });
        if tx.send(ev.clone()).is_err() {
            let (tx2, rx) = mpsc::unbounded_channel();
            let _ = tx2.send(ev.clone());
            tokio::spawn(self.clone().dispatch(task_id.to_string(), rx));
            *tx = tx2;
        }
    }

    /// One task's events, in order, to each of its configs' workers; ends after a terminal
    /// event with nothing queued behind it.
    async fn dispatch(
        self: Arc<Self>,
        task_id: String,
        mut rx: mpsc::UnboundedReceiver<Arc<StreamResponse>>,
    ) {
        while let Some(ev) = rx.recv().await {
            // The events queued behind it go with it, in order, to the configs of one store
            // read: a read per event was a scan of the store for each of a turn's events, on
            // tasks that mostly have no config at all.
            let mut batch = vec![ev];
            while let Ok(more) = rx.try_recv() {
                batch.push(more);
            }
            let terminal = batch.iter().any(
                |ev| matches!(&**ev, StreamResponse::StatusUpdate(s) if s.status.state.is_terminal()),
            );
            match self.store.push_configs(&task_id).await {
                Ok(configs) if !configs.is_empty() => {
                    for ev in &batch {
                        self.to_workers(&task_id, ev, configs.clone());
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::error!(task_id, error = %e, "cannot read push configs"),
            }
            if terminal {
                let mut t = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
                if rx.is_empty() {
                    t.remove(&task_id);
                    return;
                }
            }
        }
    }

    fn to_workers(
        self: &Arc<Self>,
        task_id: &str,
        ev: &Arc<StreamResponse>,
        configs: Vec<PushRecord>,
    ) {
        if configs.is_empty() {
            return;
        }
        let Ok(mut workers) = self.workers.lock() else {
            return;
        };
        for rec in configs {
            let key = (task_id.to_string(), rec.config.id.clone());
            let tx = workers.entry(key.clone()).or_insert_with(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(self.clone().worker(key.0.clone(), key.1.clone(), rx));
                tx
            });
            if tx.send(ev.clone()).is_err() {
                // The worker ended (after a terminal event); a new one takes this event.
                let (tx2, rx) = mpsc::unbounded_channel();
                let _ = tx2.send(ev.clone());
                tokio::spawn(self.clone().worker(key.0.clone(), key.1.clone(), rx));
                *tx = tx2;
            }
        }
    }

    /// Delivers one config's notifications in order, until a terminal status has been delivered
    /// (or given up on) and the queue is empty.
    async fn worker(
        self: Arc<Self>,
        task_id: String,
        config_id: String,
        mut rx: mpsc::UnboundedReceiver<Arc<StreamResponse>>,
    ) {
        let key = (task_id.clone(), config_id.clone());
        while let Some(ev) = rx.recv().await {
            let terminal =
                matches!(&*ev, StreamResponse::StatusUpdate(s) if s.status.state.is_terminal());
            // Read fresh: a deleted config gets nothing more, a replaced one the new URL.
            match self.store.push_config(&task_id, &config_id).await {
                Ok(Some(rec)) => self.deliver(&rec.principal, &rec.config, &ev).await,
                Ok(None) => {}
                Err(e) => tracing::error!(task_id, error = %e, "cannot read push config"),
            }
            if terminal {
                // Under the lock `task_event` sends with: nothing can be queued between this
                // check and the removal. A later event starts a new worker.
                let mut w = self.workers.lock().unwrap_or_else(|p| p.into_inner());
                if rx.is_empty() {
                    w.remove(&key);
                    return;
                }
            }
        }
    }

    /// POSTs one notification with retries, each try within the config's principal's share of
    /// deliveries (waited for in turn); counts and logs the outcome.
    async fn deliver(
        &self,
        principal: &str,
        cfg: &TaskPushNotificationConfig,
        ev: &StreamResponse,
    ) {
        let body = match serde_json::to_string(ev) {
            Ok(b) => b,
            Err(_) => return,
        };
        let mut wait = Duration::from_millis(self.settings.retry_base_ms);
        let max_wait = Duration::from_millis(self.settings.retry_max_ms);
        let mut last = String::new();
        for attempt in 1..=self.settings.max_attempts {
            let tried = match self.deliveries.take(principal).await {
                Ok(_permit) => self.post_once(cfg, &body).await,
                Err(e) => Err(Failure::Permanent(e.to_string())),
            };
            match tried {
                Ok(()) => {
                    if let Ok(mut s) = self.stats.lock() {
                        s.delivered += 1;
                    }
                    tracing::debug!(task_id = %cfg.task_id, config_id = %cfg.id, attempt, "push notification delivered");
                    return;
                }
                Err(Failure::Permanent(e)) => {
                    last = e;
                    break;
                }
                Err(Failure::Retry(e)) => {
                    last = e;
                    if attempt < self.settings.max_attempts {
                        tracing::info!(task_id = %cfg.task_id, config_id = %cfg.id, attempt, error = %last, "push notification failed; retrying");
                        if let Ok(mut s) = self.stats.lock() {
                            s.retries += 1;
                        }
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(max_wait);
                    }
                }
            }
        }
        let host = WebhookUrl::parse(&cfg.url)
            .map(|u| u.host)
            .unwrap_or_default();
        tracing::warn!(task_id = %cfg.task_id, config_id = %cfg.id, host = %host, error = %last, "push notification given up");
        if let Ok(mut s) = self.stats.lock() {
            s.failed += 1;
            s.last_failure = Some(format!(
                "{} task {} to {host}: {last}",
                crate::time::now_rfc3339(),
                cfg.task_id
            ));
        }
    }

    async fn post_once(&self, cfg: &TaskPushNotificationConfig, body: &str) -> Result<(), Failure> {
        let url = WebhookUrl::parse(&cfg.url).map_err(Failure::Permanent)?;
        // Resolved and checked again now: what the name pointed to at creation proves nothing.
        let policy = self.policy();
        let addr = policy.resolve(&url, &self.dns).await.map_err(|r| match r {
            Refusal::Forbidden(e) => Failure::Permanent(e),
            Refusal::Unresolved(e) => Failure::Retry(e),
        })?;
        let timeout = Duration::from_millis(self.settings.timeout_ms);
        let run = async {
            let tcp = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| Failure::Retry(format!("connect {addr}: {e}")))?;
            let req = self.request(cfg, &url, body)?;
            let status = if url.tls {
                let name =
                    rustls::pki_types::ServerName::try_from(url.host.clone()).map_err(|e| {
                        Failure::Permanent(format!("{} is not a TLS server name: {e}", url.host))
                    })?;
                let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| Failure::Retry(format!("TLS with {}: {e}", url.host)))?;
                exchange(tls, req).await?
            } else {
                exchange(tcp, req).await?
            };
            if status.is_success() {
                Ok(())
            } else if status.is_server_error()
                || status == http::StatusCode::REQUEST_TIMEOUT
                || status == http::StatusCode::TOO_MANY_REQUESTS
            {
                Err(Failure::Retry(format!("the webhook answered {status}")))
            } else {
                Err(Failure::Permanent(format!("the webhook answered {status}")))
            }
        };
        tokio::time::timeout(timeout, run)
            .await
            .unwrap_or_else(|_| Err(Failure::Retry(format!("no answer within {timeout:?}"))))
    }
}

enum Failure {
    Retry(String),
    Permanent(String),
}

impl Push {
    fn request(
        &self,
        cfg: &TaskPushNotificationConfig,
        url: &WebhookUrl,
        body: &str,
    ) -> Result<http::Request<axum::body::Body>, Failure> {
        let mut req = http::Request::builder()
            .method(http::Method::POST)
            .uri(url.target.as_str())
            .header(http::header::HOST, url.authority.as_str())
            .header(http::header::CONTENT_TYPE, crate::endpoints::A2A_JSON)
            .header(http::header::USER_AGENT, "warden-gateway");
        if let Some(t) = &cfg.token {
            req = req.header("X-A2A-Notification-Token", t.as_str());
        }
        if let Some(a) = &cfg.authentication
            && let Some(c) = &a.credentials
        {
            req = req.header(http::header::AUTHORIZATION, format!("{} {c}", a.scheme));
        }
        req.body(axum::body::Body::from(body.to_string()))
            .map_err(|e| Failure::Permanent(format!("cannot build the request: {e}")))
    }
}

/// One HTTP/1.1 request on an open connection (plain or TLS); the answer's status.
async fn exchange<IO>(
    io: IO,
    req: http::Request<axum::body::Body>,
) -> Result<http::StatusCode, Failure>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .map_err(|e| Failure::Retry(format!("HTTP handshake: {e}")))?;
    tokio::spawn(conn);
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| Failure::Retry(format!("POST: {e}")))?;
    Ok(resp.status())
}

/// The TLS client: the public roots, plus the CA certificates of `ca_file` when given.
pub(crate) fn tls_config(
    ca_file: Option<&std::path::Path>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{} is not PEM: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!("{} holds no certificate", path.display()));
        }
        for c in certs {
            roots
                .add(c)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

fn check_id(id: &str) -> Result<(), A2aError> {
    if id.len() > MAX_ID
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(A2aError::InvalidParams(format!(
            "push config id must be at most {MAX_ID} of A-Z a-z 0-9 - _ ."
        )));
    }
    Ok(())
}

fn store_err(e: crate::store::TaskStoreError) -> A2aError {
    tracing::error!(error = %e, "task store failure");
    A2aError::Internal(format!("task store failure: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_allowed_network_opens_only_itself() {
        let p = TargetPolicy::from_config(&PushSection {
            allowed_networks: vec!["127.0.0.1/32".into()],
            ..PushSection::default()
        });
        assert!(p.address_allowed(ip("127.0.0.1")).is_ok());
        assert!(p.address_allowed(ip("127.0.0.2")).is_err());
        assert!(p.address_allowed(ip("::1")).is_err());
        assert!(p.address_allowed(ip("10.0.0.1")).is_err());
        assert!(p.address_allowed(ip("8.8.8.8")).is_ok());
    }

    #[test]
    fn a_name_with_any_forbidden_address_is_refused_whatever_comes_first() {
        let p = TargetPolicy::from_config(&PushSection::default());
        let public: SocketAddr = "8.8.8.8:80".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:80".parse().unwrap();
        assert_eq!(p.pick("h", &[public]).unwrap(), public);
        assert!(p.pick("h", &[public, lo]).is_err());
        assert!(p.pick("h", &[lo, public]).is_err());
        assert!(p.pick("h", &[]).is_err());
    }

    #[test]
    fn host_patterns() {
        let p = TargetPolicy::from_config(&PushSection {
            allowed_hosts: vec!["hooks.example.com".into(), "*.corp.example".into()],
            ..PushSection::default()
        });
        assert!(p.host_allowed("hooks.example.com"));
        assert!(p.host_allowed("a.corp.example"));
        assert!(!p.host_allowed("corp.example"));
        assert!(!p.host_allowed("evilcorp.example"));
        assert!(!p.host_allowed("example.com"));
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_unresolved_not_forbidden() {
        let p = TargetPolicy::from_config(&PushSection::default());
        let u = WebhookUrl::parse("https://no-such-host.invalid/hook").unwrap();
        assert!(matches!(
            p.resolve(&u, &Resolver::new(&[])).await,
            Err(Refusal::Unresolved(_))
        ));
        // The allowlist is still applied first.
        let strict = TargetPolicy::from_config(&PushSection {
            allowed_hosts: vec!["hooks.example.com".into()],
            ..PushSection::default()
        });
        assert!(matches!(
            strict.resolve(&u, &Resolver::new(&[])).await,
            Err(Refusal::Forbidden(_))
        ));
    }

    #[tokio::test]
    async fn literal_and_resolved_targets_are_checked_before_any_connection() {
        let p = TargetPolicy::from_config(&PushSection::default());
        for url in [
            "http://127.0.0.1:1/",
            "http://10.0.0.1/",
            "http://169.254.169.254/latest/meta-data",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://localhost:1/",
        ] {
            let u = WebhookUrl::parse(url).unwrap();
            assert!(
                matches!(
                    p.resolve(&u, &Resolver::new(&[])).await,
                    Err(Refusal::Forbidden(_))
                ),
                "{url} must be refused"
            );
        }
    }
}
