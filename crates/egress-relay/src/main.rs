//! `warden-egress-relay`: runs inside an agent's sandbox (its own network namespace, loopback
//! only) in front of the agent. It listens on the loopback proxy port (`--listen`) and on each
//! mirrored loopback address (`--mirror`, the explicitly allowed `127.0.0.1:PORT` destinations),
//! carries every accepted connection to the supervisor's egress proxy over the Unix socket bound
//! into the sandbox (`--socket`) — a mirrored one as a `CONNECT` to that same address — and
//! starts the agent (`-- PROGRAM ARGS…`) as its child with the same stdin, stdout and stderr. It
//! forwards SIGTERM, SIGINT and SIGHUP to the agent and exits with the agent's status.
//!
//! Owns: nothing that matters for security. Everything in the sandbox is untrusted, this relay
//! included: the agent may kill it or talk to the socket itself; the supervisor's proxy is the
//! only enforcement point.
//!
//! Must never: write to stdout (it is the agent's ACP stream), read stdin, or decide where a
//! connection may go.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::Semaphore;

/// Connections relayed at once; more wait in the listener's backlog.
const MAX_CONNECTIONS: usize = 256;
/// The mark of a mirrored connection's CONNECT (`warden_egress::MIRROR_HEADER`; spelled here
/// so the relay stays free of dependencies).
const MIRROR_HEADER: &str = "X-Warden-Egress-Mirror";
/// The longest answer head the proxy sends to a mirrored connection's CONNECT.
const MAX_ANSWER_HEAD: usize = 16 * 1024;

struct Args {
    socket: PathBuf,
    listen: SocketAddr,
    mirrors: Vec<SocketAddr>,
    program: String,
    args: Vec<String>,
}

fn usage(why: &str) -> String {
    format!(
        "warden-egress-relay: {why}\nusage: warden-egress-relay --socket PATH --listen ADDR:PORT [--mirror ADDR:PORT]... -- PROGRAM [ARGS...]"
    )
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut socket, mut listen, mut mirrors) = (None, None, Vec::new());
    loop {
        let Some(a) = it.next() else {
            return Err(usage("no program after --"));
        };
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| usage(&format!("{name} needs a value")))
        };
        match a.as_str() {
            "--socket" => socket = Some(PathBuf::from(value("--socket")?)),
            "--listen" => {
                let v = value("--listen")?;
                listen = Some(
                    v.parse()
                        .map_err(|_| usage(&format!("{v:?} is not ADDR:PORT")))?,
                )
            }
            "--mirror" => {
                let v = value("--mirror")?;
                mirrors.push(
                    v.parse()
                        .map_err(|_| usage(&format!("{v:?} is not ADDR:PORT")))?,
                )
            }
            "--" => break,
            other => return Err(usage(&format!("unknown argument {other:?}"))),
        }
    }
    let program = it.next().ok_or_else(|| usage("no program after --"))?;
    Ok(Args {
        socket: socket.ok_or_else(|| usage("--socket is required"))?,
        listen: listen.ok_or_else(|| usage("--listen is required"))?,
        mirrors,
        program,
        args: it.collect(),
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(125);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warden-egress-relay: cannot start: {e}");
            return ExitCode::from(125);
        }
    };
    ExitCode::from(rt.block_on(run(args)))
}

async fn run(a: Args) -> u8 {
    // Every listener is bound before the agent starts: its first connection finds them.
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let socket = Arc::new(a.socket);
    let mut listeners = Vec::new();
    for (addr, mirror) in
        std::iter::once((a.listen, false)).chain(a.mirrors.iter().map(|m| (*m, true)))
    {
        match TcpListener::bind(addr).await {
            Ok(l) => listeners.push((l, mirror.then_some(addr))),
            Err(e) => {
                eprintln!("warden-egress-relay: cannot listen on {addr}: {e}");
                return 125;
            }
        }
    }
    for (l, mirror) in listeners {
        tokio::spawn(accept(l, mirror, socket.clone(), limit.clone()));
    }
    let mut child = match tokio::process::Command::new(&a.program)
        .args(&a.args)
        .stdin(std::process::Stdio::inherit())
        .stdout(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("warden-egress-relay: cannot start {}: {e}", a.program);
            return 127;
        }
    };
    let pid = child.id().map(|p| nix::unistd::Pid::from_raw(p as i32));
    use tokio::signal::unix::{SignalKind, signal};
    for (kind, sig) in [
        (SignalKind::terminate(), nix::sys::signal::Signal::SIGTERM),
        (SignalKind::interrupt(), nix::sys::signal::Signal::SIGINT),
        (SignalKind::hangup(), nix::sys::signal::Signal::SIGHUP),
    ] {
        if let (Ok(mut s), Some(pid)) = (signal(kind), pid) {
            tokio::spawn(async move {
                while s.recv().await.is_some() {
                    let _ = nix::sys::signal::kill(pid, sig);
                }
            });
        }
    }
    let status = child.wait().await;
    match status {
        Ok(st) => {
            use std::os::unix::process::ExitStatusExt;
            match (st.code(), st.signal()) {
                (Some(c), _) => c.clamp(0, 255) as u8,
                (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
                _ => 1,
            }
        }
        Err(e) => {
            eprintln!("warden-egress-relay: waiting for the agent: {e}");
            1
        }
    }
}

async fn accept(
    l: TcpListener,
    mirror: Option<SocketAddr>,
    socket: Arc<PathBuf>,
    limit: Arc<Semaphore>,
) {
    loop {
        let Ok(permit) = limit.clone().acquire_owned().await else {
            return;
        };
        let (tcp, _) = match l.accept().await {
            Ok(c) => c,
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let socket = socket.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = relay(tcp, mirror, &socket).await {
                eprintln!("warden-egress-relay: connection: {e}");
            }
        });
    }
}

async fn relay(
    mut tcp: TcpStream,
    mirror: Option<SocketAddr>,
    socket: &std::path::Path,
) -> std::io::Result<()> {
    let mut up = UnixStream::connect(socket).await?;
    if let Some(dest) = mirror {
        // The connection was made to this address directly (a client that bypasses the proxy
        // for loopback): ask the proxy for a tunnel there, then hand over.
        up.write_all(
            format!("CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n{MIRROR_HEADER}: 1\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        let end = loop {
            let n = up.read(&mut buf).await?;
            if n == 0 {
                return Err(std::io::Error::other("the proxy closed before answering"));
            }
            head.extend_from_slice(&buf[..n]);
            if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if head.len() > MAX_ANSWER_HEAD {
                return Err(std::io::Error::other("the proxy's answer head is too long"));
            }
        };
        let status = head.split(|b| *b == b' ').nth(1).unwrap_or_default();
        if status != b"200" {
            // Refused: the client sees its connection closed (the proxy recorded why).
            return Ok(());
        }
        tcp.write_all(&head[end..]).await?;
    }
    tokio::io::copy_bidirectional(&mut tcp, &mut up)
        .await
        .map(|_| ())
}
