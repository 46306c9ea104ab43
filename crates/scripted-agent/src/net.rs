//! The `connect` step: one network connection made the way a test asks (through the proxy the
//! environment names, directly, or raw bytes to the proxy or its socket), reported as JSON.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::scenario::ConnectVia;

/// The egress proxy's socket as the sandbox shows it.
const PROXY_SOCKET: &str = "/run/warden-egress/proxy.sock";
/// What is kept of an answer.
const MAX_RECEIVED: usize = 4096;

/// Makes the connection and reports `{host, port, via, status, error, received}` as JSON text.
pub async fn connect(host: &str, port: u16, via: ConnectVia, send: &str, wait: Duration) -> String {
    let via_name = match via {
        ConnectVia::Proxy => "proxy",
        ConnectVia::Direct => "direct",
        ConnectVia::ProxyRaw => "proxy_raw",
        ConnectVia::Socket => "socket",
    };
    let mut report = json!({"host": host, "port": port, "via": via_name, "status": "", "error": "", "received": ""});
    let r = tokio::time::timeout(
        wait + Duration::from_secs(2),
        attempt(host, port, via, send, wait, &mut report),
    )
    .await;
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => report["error"] = Value::String(e),
        Err(_) => report["error"] = Value::String("timed out".into()),
    }
    report.to_string()
}

fn proxy_addr() -> Result<String, String> {
    let url = std::env::var("HTTPS_PROXY")
        .or_else(|_| std::env::var("https_proxy"))
        .map_err(|_| "no HTTPS_PROXY in the environment".to_string())?;
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("HTTPS_PROXY {url:?} is not http://"))?;
    Ok(rest.trim_end_matches('/').to_string())
}

async fn attempt(
    host: &str,
    port: u16,
    via: ConnectVia,
    send: &str,
    wait: Duration,
    report: &mut Value,
) -> Result<(), String> {
    match via {
        ConnectVia::Direct => {
            let mut s = tokio::net::TcpStream::connect((host, port))
                .await
                .map_err(|e| format!("connect: {e}"))?;
            exchange(&mut s, send.as_bytes(), wait, report).await
        }
        ConnectVia::ProxyRaw => {
            let mut s = tokio::net::TcpStream::connect(proxy_addr()?)
                .await
                .map_err(|e| format!("connect to the proxy: {e}"))?;
            exchange(&mut s, send.as_bytes(), wait, report).await
        }
        ConnectVia::Socket => {
            let mut s = tokio::net::UnixStream::connect(PROXY_SOCKET)
                .await
                .map_err(|e| format!("connect to {PROXY_SOCKET}: {e}"))?;
            exchange(&mut s, send.as_bytes(), wait, report).await
        }
        ConnectVia::Proxy => {
            let mut s = tokio::net::TcpStream::connect(proxy_addr()?)
                .await
                .map_err(|e| format!("connect to the proxy: {e}"))?;
            let authority = if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            s.write_all(
                format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes(),
            )
            .await
            .map_err(|e| format!("send CONNECT: {e}"))?;
            // The answer head, byte by byte (nothing after it may be swallowed).
            let mut head = Vec::new();
            let read_head = async {
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => head.push(b[0]),
                    }
                }
            };
            let _ = tokio::time::timeout(wait, read_head).await;
            let text = String::from_utf8_lossy(&head).into_owned();
            report["status"] = Value::String(text.lines().next().unwrap_or("").to_string());
            if !text.starts_with("HTTP/1.1 200") && !text.starts_with("HTTP/1.0 200") {
                // The refusal's body says why.
                let mut body = Vec::new();
                let _ = tokio::time::timeout(wait, read_some(&mut s, &mut body)).await;
                report["received"] = Value::String(String::from_utf8_lossy(&body).into_owned());
                return Ok(());
            }
            exchange(&mut s, send.as_bytes(), wait, report).await
        }
    }
}

async fn read_some<S: AsyncRead + Unpin>(s: &mut S, out: &mut Vec<u8>) {
    let mut buf = [0u8; 1024];
    while out.len() < MAX_RECEIVED {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n.min(MAX_RECEIVED - out.len())]),
        }
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    send: &[u8],
    wait: Duration,
    report: &mut Value,
) -> Result<(), String> {
    if !send.is_empty() {
        s.write_all(send).await.map_err(|e| format!("send: {e}"))?;
    }
    let mut got = Vec::new();
    let _ = tokio::time::timeout(wait, read_some(s, &mut got)).await;
    let text = String::from_utf8_lossy(&got).into_owned();
    if report["status"].as_str().is_some_and(str::is_empty) {
        report["status"] = Value::String(text.lines().next().unwrap_or("").to_string());
    }
    report["received"] = Value::String(text);
    Ok(())
}
