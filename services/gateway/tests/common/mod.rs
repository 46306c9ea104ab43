//! A small HTTP/1.0 client for the end-to-end tests: plain requests and incremental SSE reads
//! against a running gateway. HTTP/1.0 makes every response close-delimited, so no chunked
//! decoding is needed and a dropped reader is a real client disconnect.

#![allow(dead_code)]

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct Gw {
    pub addr: String,
    pub token: String,
}

pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// An open SSE response.
pub struct Sse {
    sock: TcpStream,
    buf: Vec<u8>,
    pub status: u16,
}

impl Sse {
    /// The next `data:` payload, or None when the server closed the stream.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(p) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let event = String::from_utf8_lossy(&self.buf[..p]).to_string();
                self.buf.drain(..p + 2);
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                    .collect();
                if data.is_empty() {
                    continue; // keep-alive comment
                }
                return Some(serde_json::from_str(&data.join("\n")).expect("SSE data is JSON"));
            }
            let mut tmp = [0u8; 16384];
            let n = tokio::time::timeout(Duration::from_secs(30), self.sock.read(&mut tmp))
                .await
                .expect("SSE event within 30 s")
                .ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&tmp[..n]);
        }
    }

    /// Every remaining event until the server closes the stream.
    pub async fn rest(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(v) = self.next().await {
            out.push(v);
        }
        out
    }
}

async fn send(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> TcpStream {
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\nA2A-Version: 1.0\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        ));
    } else {
        req.push_str("\r\n");
    }
    let mut sock = TcpStream::connect(addr).await.expect("gateway reachable");
    sock.write_all(req.as_bytes())
        .await
        .expect("request written");
    sock
}

async fn read_head(sock: &mut TcpStream, buf: &mut Vec<u8>) -> (u16, String) {
    loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..p]).to_string();
            buf.drain(..p + 4);
            let status = head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            return (status, head);
        }
        let mut tmp = [0u8; 16384];
        let n = tokio::time::timeout(Duration::from_secs(60), sock.read(&mut tmp))
            .await
            .expect("response within 60 s")
            .expect("read");
        assert!(n > 0, "connection closed before the response head");
        buf.extend_from_slice(&tmp[..n]);
    }
}

impl Gw {
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Reply {
        let text = body.map(|b| b.to_string());
        let mut sock = send(&self.addr, method, path, token, text.as_deref()).await;
        let mut buf = Vec::new();
        let (status, head) = read_head(&mut sock, &mut buf).await;
        tokio::time::timeout(Duration::from_secs(60), sock.read_to_end(&mut buf))
            .await
            .expect("body within 60 s")
            .expect("read body");
        Reply {
            status,
            head,
            body: String::from_utf8_lossy(&buf).into_owned(),
        }
    }

    /// A JSON-RPC call with this gateway's token; the whole response object.
    pub async fn rpc_as(&self, token: &str, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        self.request("POST", "/a2a/jsonrpc", Some(token), Some(&body))
            .await
            .json()
    }

    pub async fn rpc(&self, method: &str, params: Value) -> Value {
        self.rpc_as(&self.token.clone(), method, params).await
    }

    /// Opens an SSE response (POST with a body, or GET without).
    pub async fn sse(&self, method: &str, path: &str, body: Option<&Value>) -> Sse {
        self.sse_as(&self.token.clone(), method, path, body).await
    }

    pub async fn sse_as(&self, token: &str, method: &str, path: &str, body: Option<&Value>) -> Sse {
        let text = body.map(|b| b.to_string());
        let mut sock = send(&self.addr, method, path, Some(token), text.as_deref()).await;
        let mut buf = Vec::new();
        let (status, head) = read_head(&mut sock, &mut buf).await;
        assert!(
            head.to_ascii_lowercase().contains("text/event-stream") || status != 200,
            "{head}"
        );
        Sse { sock, buf, status }
    }

    /// Polls GetTask until `pred` holds (10 s).
    pub async fn wait_task(&self, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let r = self.rpc("GetTask", json!({"id": id})).await;
            let task = r["result"].clone();
            if pred(&task) {
                return task;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "task {id} never reached the state: {task}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A user message; `text` may be an inline scenario for the scripted agent.
pub fn message(id: &str, text: &str, extra: Value) -> Value {
    let mut m = json!({"messageId": id, "role": "ROLE_USER", "parts": [{"text": text}]});
    if let (Some(o), Some(e)) = (m.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            o.insert(k.clone(), v.clone());
        }
    }
    m
}

pub fn state(task: &Value) -> &str {
    task["status"]["state"].as_str().unwrap_or("")
}

pub fn status_text(task: &Value) -> String {
    task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// The kinds (`warden.kind`) and states of a stream's status updates, for readable asserts.
pub fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            let e = e.get("result").unwrap_or(e);
            if e.get("task").is_some() {
                "task".to_string()
            } else if e.get("artifactUpdate").is_some() {
                "artifact".to_string()
            } else if let Some(s) = e.get("statusUpdate") {
                let st = s["status"]["state"]
                    .as_str()
                    .unwrap_or("")
                    .trim_start_matches("TASK_STATE_")
                    .to_lowercase();
                match s["status"]["message"]["metadata"]["warden"]["kind"].as_str() {
                    Some(k) => format!("{st}:{k}"),
                    None => st,
                }
            } else {
                format!("?{e}")
            }
        })
        .collect()
}
