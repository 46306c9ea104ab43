//! The egress proxy of one agent (`network = "proxy"`): an HTTP proxy on a Unix socket bound
//! into the agent's sandbox, where the relay inside (`warden-egress-relay`) carries every
//! connection the agent makes. It serves `CONNECT host:port` (tunnels) and absolute-form
//! plain-HTTP requests, each only to a destination the agent's allowlist names, and records
//! every connection, allowed or refused, with the conversation.
//!
//! Owns: the socket's directory (made per agent under `<state>/egress/`, removed when the proxy
//! is dropped), the per-connection checks (peer uid, the request head, the allowlist, every
//! address the name resolves to — off the runtime thread, with a deadline — and the connection
//! to the checked address itself, never to the name again), the bound on connections at once
//! and on buffers, and the report of each connection.
//!
//! A warm agent's proxy (`pool.rs`) runs before the agent has a conversation: until the pool
//! hands the agent to one ([`Report::context_id`] is None) every connection is refused before
//! its request is read, nothing is forwarded, and the report counts it (such an agent is never
//! handed out). After the take every connection is reported to the taking conversation.
//!
//! Must never: connect anywhere the allowlist does not name (it runs with the supervisor's
//! rights, so a connection it makes is made as the supervisor); connect to a listener of the
//! warden it belongs to (`[egress] warden_listeners`: the gateway, the approver's page), whatever
//! the allowlist names — an agent does not come back in through warden's own doors; resolve a
//! name twice for one connection; block the runtime; trust anything that arrives on the socket
//! (the agent may speak to it directly). The address classification is `warden_egress`'s, not
//! this file's.
//!
//! Each connection it makes is the agent's in the kernel's eyes: its socket is created with the
//! agent's uid as its owner (`setfsuid` around `socket(2)`), so the socket table shows the
//! agent's uid (the gateway counts a call arriving that way as nested, `peer.rs`) and a host
//! firewall's owner match sees the agent, not the supervisor.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use warden_egress::{
    Allowlist, Destination, MAX_HEAD_BYTES, ProxyRequest, check_addresses, head_end, parse_request,
};

use crate::records::{EgressRecord, now_ms};

/// How long the agent has to send a request head.
const HEAD_DEADLINE: Duration = Duration::from_secs(10);
/// How long resolving a name may take.
const RESOLVE_DEADLINE: Duration = Duration::from_secs(5);
/// How long connecting to the checked address may take.
const CONNECT_DEADLINE: Duration = Duration::from_secs(10);
/// The characters of the spawn id's label in the socket directory's name.
const DIR_LABEL_CHARS: usize = 12;
/// Each direction of a relayed connection buffers at most this much.
const RELAY_BUFFER: usize = 16 * 1024;

/// Where one connection's outcome goes (the conversation: its records, log, turn).
pub trait Report: Send + Sync + 'static {
    /// The conversation connections are reported to (its context id), asked as each connection
    /// arrives; None while the agent has none (a warm agent not taken yet): the connection is
    /// refused unread and unforwarded, and the report counts it.
    fn context_id(&self) -> Option<String>;
    /// The turn running now (its task id), for the record.
    fn task_id(&self) -> String;
    /// One connection finished or was refused.
    fn connection(&self, rec: &EgressRecord);
}

/// What one agent's proxy enforces.
pub struct ProxyConfig {
    /// What the socket directory and the log lines are named by: the agent's spawn id (the
    /// conversation's context id, or a warm agent's pool id).
    pub label: String,
    pub agent: String,
    pub allow: Allowlist,
    /// The only uid that may connect to the socket (the agent's).
    pub peer_uid: u32,
    /// Connections open at once; more are answered 503.
    pub max_connections: usize,
    /// The listeners of this warden: refused whatever `allow` says.
    pub warden: WardenListeners,
}

/// The TCP listeners of the warden a supervisor belongs to (`[egress] warden_listeners`).
#[derive(Debug, Clone, Default)]
pub struct WardenListeners(Vec<SocketAddr>);

impl WardenListeners {
    pub fn new(listeners: Vec<SocketAddr>) -> Self {
        WardenListeners(listeners)
    }

    /// The listener a connection to `to` would reach: the same port and the same address (an
    /// IPv4-mapped spelling is its IPv4 address), or any address of this host for a listener
    /// on 0.0.0.0 / `::`; a connection to 0.0.0.0 / `::` itself reaches this host too.
    pub fn reached_by(&self, to: SocketAddr) -> Option<SocketAddr> {
        let ip = canonical(to.ip());
        self.0.iter().copied().find(|l| {
            if l.port() != to.port() {
                return false;
            }
            let lip = canonical(l.ip());
            if lip == ip {
                return true;
            }
            if ip.is_unspecified() {
                return is_local(lip);
            }
            lip.is_unspecified() && is_local(ip)
        })
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// Whether `ip` is an address of this host: loopback, unspecified, or one a socket can be
/// bound to here (the kernel's own answer, whatever the interfaces are named). Any answer but
/// "not available here" counts as local: a doubt refuses.
fn is_local(ip: IpAddr) -> bool {
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    match std::net::UdpSocket::bind(SocketAddr::new(ip, 0)) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() != Some(libc::EADDRNOTAVAIL),
    }
}

/// A TCP socket for a connection made for the agent, owned by the agent's uid: the socket's
/// owner is its creator's fsuid, set for this thread around `socket(2)` and set back at once
/// (nothing awaits in between, so nothing else runs on this thread meanwhile). Without the
/// right to switch (a supervisor that is neither root nor holds CAP_SETUID) the fsuid does
/// not change and the socket is the supervisor's, as it always was.
fn agent_socket(to: SocketAddr, uid: u32) -> std::io::Result<TcpSocket> {
    let me = nix::unistd::geteuid();
    let switch = uid != me.as_raw();
    let before = switch.then(|| nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid)));
    let sock = if to.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    };
    if let Some(prev) = before {
        nix::unistd::setfsuid(prev);
    }
    sock
}

/// A running proxy; dropping it closes the socket, ends every connection and removes the
/// directory.
pub struct EgressProxy {
    dir: PathBuf,
    cancel: CancellationToken,
}

impl EgressProxy {
    /// Makes `<egress_root>/<label, at most 12 characters>-<random>/proxy.sock` and starts
    /// serving it. The label is cut short because a socket's path is bounded (108 bytes): a
    /// warm agent's pool id alone is 32 characters of label.
    pub fn start(
        egress_root: &Path,
        cfg: ProxyConfig,
        report: Arc<dyn Report>,
    ) -> Result<Self, String> {
        let label: String = crate::records::label(&cfg.label)
            .chars()
            .take(DIR_LABEL_CHARS)
            .collect();
        let dir = egress_root.join(format!(
            "{label}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        std::fs::create_dir(&dir).map_err(|e| {
            format!(
                "cannot make the egress socket directory {}: {e}",
                dir.display()
            )
        })?;
        // Searchable for the agent's uid, listable by nobody else; the socket is open to
        // connect and each peer's uid is checked.
        let set = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
                .map_err(|e| format!("chmod {}: {e}", p.display()))
        };
        let cleanup = |e: String| {
            let _ = std::fs::remove_dir_all(&dir);
            e
        };
        set(&dir, 0o711).map_err(cleanup)?;
        let socket = dir.join(warden_sandbox::EGRESS_SOCKET_NAME);
        let listener = UnixListener::bind(&socket)
            .map_err(|e| cleanup(format!("cannot listen on {}: {e}", socket.display())))?;
        set(&socket, 0o666).map_err(cleanup)?;
        let cancel = CancellationToken::new();
        let ctx = Arc::new(Ctx {
            limit: Arc::new(Semaphore::new(cfg.max_connections.max(1))),
            cfg,
            report,
        });
        tokio::spawn(serve(listener, ctx, cancel.clone()));
        Ok(Self { dir, cancel })
    }

    /// The directory bound into the sandbox.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.cancel.cancel();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Ctx {
    cfg: ProxyConfig,
    report: Arc<dyn Report>,
    limit: Arc<Semaphore>,
}

impl Ctx {
    fn setting(&self) -> String {
        format!("agents.{}.egress_allow", self.cfg.agent)
    }
}

async fn serve(listener: UnixListener, ctx: Arc<Ctx>, cancel: CancellationToken) {
    loop {
        let stream = tokio::select! {
            () = cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(spawn_id = %ctx.cfg.label, error = %e, "egress proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        match stream.peer_cred() {
            Ok(c) if c.uid() == ctx.cfg.peer_uid => {}
            other => {
                tracing::warn!(spawn_id = %ctx.cfg.label, peer = ?other.map(|c| c.uid()), "egress proxy: a connection from another uid refused");
                continue;
            }
        }
        // No conversation yet (a warm agent): refused before a byte of it is read.
        let Some(context_id) = ctx.report.context_id() else {
            tracing::warn!(spawn_id = %ctx.cfg.label, "egress proxy: a connection before the agent has a conversation refused");
            crate::metrics::egress_connection(false, 403);
            let mut s = stream;
            tokio::spawn(async move {
                let _ = answer(
                    &mut s,
                    403,
                    "this agent has no conversation yet: nothing is forwarded",
                )
                .await;
            });
            continue;
        };
        let permit = match ctx.limit.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    let why = format!(
                        "more than {} connections at once (limits.egress_connections)",
                        ctx.cfg.max_connections
                    );
                    let mut rec = Outcome::new("invalid");
                    rec.refuse(503, why.clone(), "limits.egress_connections".into());
                    let mut s = stream;
                    let _ = answer(&mut s, 503, &why).await;
                    finish(&ctx, &context_id, rec, Instant::now());
                });
                continue;
            }
        };
        let ctx = ctx.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let started = Instant::now();
            let rec = tokio::select! {
                () = cancel.cancelled() => return,
                rec = handle(stream, &ctx) => rec,
            };
            finish(&ctx, &context_id, rec, started);
        });
    }
}

/// A connection's outcome as it is learned.
struct Outcome {
    kind: &'static str,
    dest: Option<Destination>,
    address: String,
    allowed: bool,
    status: u16,
    reason: String,
    setting: String,
    up: u64,
    down: u64,
}

impl Outcome {
    fn new(kind: &'static str) -> Self {
        Outcome {
            kind,
            dest: None,
            address: String::new(),
            allowed: false,
            status: 0,
            reason: String::new(),
            setting: String::new(),
            up: 0,
            down: 0,
        }
    }
    fn refuse(&mut self, status: u16, reason: String, setting: String) {
        self.allowed = false;
        self.status = status;
        self.reason = reason;
        self.setting = setting;
    }
}

fn finish(ctx: &Ctx, context_id: &str, o: Outcome, started: Instant) {
    let (host, port) = o
        .dest
        .as_ref()
        .map(|d| (d.host.clone(), d.port))
        .unwrap_or_default();
    let rec = EgressRecord {
        at_unix_ms: now_ms(),
        context_id: context_id.to_string(),
        task_id: ctx.report.task_id(),
        agent: ctx.cfg.agent.clone(),
        kind: o.kind,
        host,
        port,
        address: o.address,
        allowed: o.allowed,
        status: o.status,
        reason: o.reason,
        setting: o.setting,
        bytes_up: o.up,
        bytes_down: o.down,
        duration_ms: started.elapsed().as_millis() as u64,
    };
    crate::metrics::egress_connection(rec.allowed, rec.status);
    ctx.report.connection(&rec);
}

/// The message an agent's caller reads for a connection that did not go through: "refused" when
/// the rules said no (403) or the request was unreadable (4xx), "failed" when the destination
/// could not be resolved or reached (5xx).
pub fn refusal_message(rec: &EgressRecord) -> String {
    let what = if rec.status >= 500 {
        "failed"
    } else {
        "refused"
    };
    if rec.host.is_empty() {
        format!("egress request {what}: {}", rec.reason)
    } else {
        let d = Destination {
            host: rec.host.clone(),
            port: rec.port,
        };
        format!("egress to {d} {what}: {}", rec.reason)
    }
}

/// Serves one connection to its end.
async fn handle(mut s: UnixStream, ctx: &Ctx) -> Outcome {
    let mut o = Outcome::new("invalid");
    let (head, rest) = match read_head(&mut s).await {
        Ok(h) => h,
        Err((status, why)) => {
            o.refuse(status, why.clone(), String::new());
            if status != 0 {
                let _ = answer(&mut s, status, &why).await;
            }
            return o;
        }
    };
    let req = match parse_request(&head) {
        Ok(r) => r,
        Err(e) => {
            let why = e.to_string();
            o.refuse(e.status(), why.clone(), String::new());
            let _ = answer(&mut s, e.status(), &why).await;
            return o;
        }
    };
    o.kind = match req {
        ProxyRequest::Connect { mirrored: true, .. } => "connect-mirrored",
        ProxyRequest::Connect { .. } => "connect",
        ProxyRequest::Forward { .. } => "forward",
    };
    let dest = req.dest().clone();
    o.dest = Some(dest.clone());
    let Some(matched) = ctx.cfg.allow.find(&dest) else {
        let why = format!("not in [agents.{}] egress_allow", ctx.cfg.agent);
        o.refuse(403, why, ctx.setting());
        let _ = answer(&mut s, 403, &refusal_text(&dest, &o.reason)).await;
        return o;
    };
    o.setting = matched.source.clone();
    let addrs = match resolve(&dest).await {
        Ok(a) => a,
        Err(why) => {
            o.refuse(502, why, matched.source.clone());
            let _ = answer(&mut s, 502, &refusal_text(&dest, &o.reason)).await;
            return o;
        }
    };
    let addr = match check_addresses(&dest, &matched, &addrs) {
        Ok(a) => a,
        Err(why) => {
            // Every address the name resolved to, for the record.
            o.address = addrs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",");
            o.refuse(403, why, matched.source.clone());
            let _ = answer(&mut s, 403, &refusal_text(&dest, &o.reason)).await;
            return o;
        }
    };
    o.address = addr.to_string();
    if let Some(l) = ctx.cfg.warden.reached_by(addr) {
        let why = format!(
            "{addr} reaches this warden's own listener {l} (egress.warden_listeners): agents do not come back in through the egress proxy"
        );
        o.refuse(403, why, "egress.warden_listeners".into());
        let _ = answer(&mut s, 403, &refusal_text(&dest, &o.reason)).await;
        return o;
    }
    let connect = async { agent_socket(addr, ctx.cfg.peer_uid)?.connect(addr).await };
    let mut up: TcpStream = match tokio::time::timeout(CONNECT_DEADLINE, connect).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            o.refuse(
                502,
                format!("cannot connect to {addr}: {e}"),
                matched.source.clone(),
            );
            let _ = answer(&mut s, 502, &o.reason).await;
            return o;
        }
        Err(_) => {
            o.refuse(
                504,
                format!("connecting to {addr} timed out"),
                matched.source.clone(),
            );
            let _ = answer(&mut s, 504, &o.reason).await;
            return o;
        }
    };
    o.allowed = true;
    let first = match &req {
        ProxyRequest::Connect { .. } => {
            if s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .is_err()
            {
                return o;
            }
            o.status = 200;
            Vec::new()
        }
        ProxyRequest::Forward { head, .. } => head.clone(),
    };
    if up.write_all(&first).await.is_err() || up.write_all(&rest).await.is_err() {
        o.reason = "the destination closed the connection".into();
        return o;
    }
    o.up = (first.len() + rest.len()) as u64;
    match tokio::io::copy_bidirectional_with_sizes(&mut s, &mut up, RELAY_BUFFER, RELAY_BUFFER)
        .await
    {
        Ok((a, b)) => {
            o.up += a;
            o.down += b;
        }
        Err(e) => o.reason = format!("relay ended: {e}"),
    }
    if o.status == 0 {
        o.status = 200;
    }
    o
}

fn refusal_text(dest: &Destination, why: &str) -> String {
    format!("egress to {dest} refused: {why}")
}

/// Reads the request head (bounded, with a deadline): (head, bytes after it). The error is the
/// status to answer (0: the peer went away, answer nothing) and why.
async fn read_head(s: &mut UnixStream) -> Result<(Vec<u8>, Vec<u8>), (u16, String)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    let read = async {
        loop {
            let n = s
                .read(&mut chunk)
                .await
                .map_err(|e| (0, format!("reading the request: {e}")))?;
            if n == 0 {
                return Err((0, "the connection closed before a request head".to_string()));
            }
            let from = buf.len().saturating_sub(3);
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = head_end(&buf[from..]).map(|e| e + from) {
                let rest = buf.split_off(end);
                return Ok((std::mem::take(&mut buf), rest));
            }
            if buf.len() > MAX_HEAD_BYTES {
                return Err((
                    431,
                    format!("the request head is longer than {MAX_HEAD_BYTES} bytes"),
                ));
            }
        }
    };
    tokio::time::timeout(HEAD_DEADLINE, read)
        .await
        .unwrap_or_else(|_| Err((408, format!("no request head within {HEAD_DEADLINE:?}"))))
}

/// Every address `d` resolves to, off the runtime thread (tokio's resolver runs getaddrinfo on
/// the blocking pool) and within a deadline. An IP literal is its own answer.
async fn resolve(d: &Destination) -> Result<Vec<SocketAddr>, String> {
    if let Some(ip) = d.ip() {
        return Ok(vec![SocketAddr::new(ip, d.port)]);
    }
    let addrs: Vec<SocketAddr> = tokio::time::timeout(
        RESOLVE_DEADLINE,
        tokio::net::lookup_host((d.host.as_str(), d.port)),
    )
    .await
    .map_err(|_| format!("resolving {} timed out", d.host))?
    .map_err(|e| format!("cannot resolve {}: {e}", d.host))?
    .collect();
    Ok(addrs)
}

/// An error answer (closes the connection after it).
async fn answer(s: &mut UnixStream, status: u16, why: &str) -> std::io::Result<()> {
    let text = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    let body = format!("{why}\n");
    let msg = format!(
        "HTTP/1.1 {status} {text}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\nX-Warden-Egress: refused\r\n\r\n{body}",
        body.len()
    );
    s.write_all(msg.as_bytes()).await?;
    s.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Seen(Mutex<Vec<EgressRecord>>, Mutex<Option<String>>);

    impl Seen {
        fn bound() -> Self {
            Seen(Mutex::default(), Mutex::new(Some("c".into())))
        }
    }

    impl Report for Seen {
        fn context_id(&self) -> Option<String> {
            self.1.lock().unwrap().clone()
        }
        fn task_id(&self) -> String {
            "t".into()
        }
        fn connection(&self, rec: &EgressRecord) {
            self.0.lock().unwrap().push(rec.clone());
        }
    }

    fn proxy(dir: &Path, peer_uid: u32, max: usize, allow: &[&str]) -> (EgressProxy, Arc<Seen>) {
        proxy_for(dir, peer_uid, max, allow, Seen::bound())
    }

    fn proxy_for(
        dir: &Path,
        peer_uid: u32,
        max: usize,
        allow: &[&str],
        seen: Seen,
    ) -> (EgressProxy, Arc<Seen>) {
        let mut l = Allowlist::new();
        for a in allow {
            l.push(warden_egress::AllowEntry::parse(a).unwrap(), "test");
        }
        let seen = Arc::new(seen);
        let p = EgressProxy::start(
            dir,
            ProxyConfig {
                label: "c".into(),
                agent: "a".into(),
                allow: l,
                peer_uid,
                max_connections: max,
                warden: WardenListeners::default(),
            },
            seen.clone(),
        )
        .unwrap();
        (p, seen)
    }

    async fn ask(p: &EgressProxy, req: &str) -> String {
        let mut s = UnixStream::connect(p.dir().join(warden_sandbox::EGRESS_SOCKET_NAME))
            .await
            .unwrap();
        let _ = s.write_all(req.as_bytes()).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    fn me() -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    #[tokio::test]
    async fn another_uid_gets_nothing_and_the_agent_uid_gets_the_rules() {
        let dir = tempfile::tempdir().unwrap();
        let (p, seen) = proxy(dir.path(), me().wrapping_add(1), 4, &[]);
        let got = ask(&p, "CONNECT evil.example:443 HTTP/1.1\r\n\r\n").await;
        assert_eq!(got, "", "a peer of another uid is dropped unanswered");
        assert!(seen.0.lock().unwrap().is_empty());
        let (p, seen) = proxy(dir.path(), me(), 4, &[]);
        let got = ask(&p, "CONNECT evil.example:443 HTTP/1.1\r\n\r\n").await;
        assert!(got.starts_with("HTTP/1.1 403 "), "{got}");
        assert!(
            got.contains("egress to evil.example:443 refused: not in [agents.a] egress_allow"),
            "{got}"
        );
        let recs = seen.0.lock().unwrap().clone();
        assert_eq!(recs.len(), 1);
        assert_eq!(
            (recs[0].host.as_str(), recs[0].port, recs[0].allowed),
            ("evil.example", 443, false)
        );
        assert_eq!(recs[0].setting, "agents.a.egress_allow");
        assert_eq!(recs[0].task_id, "t");
    }

    #[tokio::test]
    async fn connections_over_the_limit_get_503_and_the_tunnel_relays_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = echo.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 64];
                    if let Ok(n) = s.read(&mut b).await {
                        let _ = s.write_all(&b[..n]).await;
                    }
                });
            }
        });
        let (p, seen) = proxy(dir.path(), me(), 1, &[&format!("127.0.0.1:{port}")]);
        // One connection holds the only slot (it sends nothing yet).
        let sock = p.dir().join(warden_sandbox::EGRESS_SOCKET_NAME);
        let mut held = UnixStream::connect(&sock).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let got = ask(&p, &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")).await;
        assert!(got.starts_with("HTTP/1.1 503 "), "{got}");
        assert!(got.contains("limits.egress_connections"), "{got}");
        // The held one goes on: a tunnel, with bytes sent right after the head.
        held.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nping").as_bytes())
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), held.read_to_end(&mut out)).await;
        assert_eq!(
            String::from_utf8_lossy(&out),
            "HTTP/1.1 200 Connection established\r\n\r\nping"
        );
        drop(held);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let recs = seen.0.lock().unwrap().clone();
        let ok = recs
            .iter()
            .find(|r| r.allowed)
            .expect("the tunnel is recorded");
        assert_eq!(ok.address, format!("127.0.0.1:{port}"));
        assert_eq!((ok.bytes_up, ok.bytes_down), (4, 4));
        assert!(recs.iter().any(|r| r.status == 503));
        // Dropping the proxy removes its directory.
        let d = p.dir().to_path_buf();
        drop(p);
        assert!(!d.exists());
    }

    #[tokio::test]
    async fn before_a_conversation_nothing_is_forwarded_and_after_it_the_conversation_gets_it() {
        let dir = tempfile::tempdir().unwrap();
        let dest = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = dest.local_addr().unwrap().port();
        let reached = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let r = reached.clone();
        tokio::spawn(async move {
            while let Ok((_s, _)) = dest.accept().await {
                r.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let (p, seen) = proxy_for(
            dir.path(),
            me(),
            4,
            &[&format!("127.0.0.1:{port}")],
            Seen::default(),
        );
        let req = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n");
        let got = ask(&p, &req).await;
        assert!(got.starts_with("HTTP/1.1 403 "), "{got}");
        assert!(got.contains("no conversation yet"), "{got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            reached.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "an allowed destination is not connected to before the agent has a conversation"
        );
        assert!(seen.0.lock().unwrap().is_empty());
        *seen.1.lock().unwrap() = Some("taker".into());
        let got = ask(&p, &req).await;
        assert!(got.starts_with("HTTP/1.1 200 "), "{got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(reached.load(std::sync::atomic::Ordering::Relaxed), 1);
        let recs = seen.0.lock().unwrap().clone();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].context_id, "taker");
        assert!(recs[0].allowed);
    }

    #[tokio::test]
    async fn a_long_spawn_id_names_the_socket_directory_by_its_first_characters() {
        let dir = tempfile::tempdir().unwrap();
        let p = EgressProxy::start(
            dir.path(),
            ProxyConfig {
                label: "warden-pool~scripted~0123456789abcdef0123456789abcdef".into(),
                agent: "a".into(),
                allow: Allowlist::new(),
                peer_uid: me(),
                max_connections: 1,
                warden: WardenListeners::default(),
            },
            Arc::new(Seen::bound()),
        )
        .unwrap();
        let name = p.dir().file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("warden-pool_-"), "{name}");
        assert_eq!(name.len(), DIR_LABEL_CHARS + 1 + 8, "{name}");
    }

    #[test]
    fn every_spelling_of_a_warden_listener_is_recognised() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let w = WardenListeners::new(vec![
            a("127.0.0.1:8080"),
            a("0.0.0.0:7421"),
            a("[::]:50051"),
        ]);
        // The loopback listener: its own address, its IPv4-mapped form and 0.0.0.0 (which
        // connects to this host); not another port, not another loopback address.
        assert_eq!(w.reached_by(a("127.0.0.1:8080")), Some(a("127.0.0.1:8080")));
        assert!(w.reached_by(a("[::ffff:127.0.0.1]:8080")).is_some());
        assert!(w.reached_by(a("0.0.0.0:8080")).is_some());
        assert!(w.reached_by(a("127.0.0.1:8081")).is_none());
        assert!(w.reached_by(a("127.0.0.2:8080")).is_none());
        // Wildcard listeners: every address of this host, loopback or not, either family.
        for to in [
            "127.0.0.1:7421",
            "127.0.0.9:7421",
            "[::1]:50051",
            "127.0.0.1:50051",
        ] {
            assert!(w.reached_by(a(to)).is_some(), "{to}");
        }
        // This host's own non-loopback addresses, as the kernel lists them.
        if let Ok(sock) = std::net::UdpSocket::bind("0.0.0.0:0")
            && sock.connect("192.0.2.1:9").is_ok()
            && let Ok(local) = sock.local_addr()
            && !local.ip().is_unspecified()
        {
            assert!(
                w.reached_by(SocketAddr::new(local.ip(), 7421)).is_some(),
                "{local}"
            );
        }
        // Not this host: a documentation address on the wildcard's port.
        assert!(w.reached_by(a("192.0.2.1:7421")).is_none());
        assert!(w.reached_by(a("[2001:db8::1]:50051")).is_none());
    }
}
