//! The caller side of the gateway's A2A HTTP+JSON binding, as `warden send` uses it (and the
//! end-to-end tests, to check a task's state through the same interface a caller has).
//!
//! Owns: one request on one fresh HTTP/1.1 connection (hyper), with the caller token and the
//! `A2A-Version` header; reading a bounded JSON answer. Must never: follow a redirect or talk to
//! anything but the URL `warden up` wrote.

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

/// At most this much of a non-streamed answer is read: it is small JSON (a task, an error).
pub const ANSWER_LIMIT: usize = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the gateway URL {0:?} is not a local http:// URL")]
    Url(String),
    #[error("cannot reach the gateway at {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The token or address cannot be put in a request (e.g. a control character in the file).
    #[error("cannot build the request to the gateway: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("the connection to the gateway failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("cannot read the gateway's answer: {0}")]
    Answer(String),
}

/// Why the gateway a command talks to could not be located.
#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    #[error(
        "warden does not seem to be running: cannot read {path} ({source}); start it with `warden up`"
    )]
    NotRunning {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the caller token {path}: {source}")]
    Token {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// The gateway's `host:port` and the caller's token: `url` or the one `warden up` wrote in the
/// state directory, the token in `token_file` or the one `warden up` generated.
pub fn locate(
    layout: &crate::layout::Layout,
    url: Option<&str>,
    token_file: Option<&std::path::Path>,
) -> Result<(String, String), LocateError> {
    let read = |p: &std::path::Path| std::fs::read_to_string(p).map(|s| s.trim().to_string());
    let url = match url {
        Some(u) => u.to_string(),
        None => {
            let f = layout.url_file();
            read(&f).map_err(|source| LocateError::NotRunning {
                path: f.display().to_string(),
                source,
            })?
        }
    };
    let tf = token_file
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| layout.token_file());
    let token = read(&tf).map_err(|source| LocateError::Token {
        path: tf.display().to_string(),
        source,
    })?;
    Ok((gateway_addr(&url)?, token))
}

/// `host:port` of a local `http://` gateway URL.
pub fn gateway_addr(url: &str) -> Result<String, ClientError> {
    let rest = url
        .trim()
        .strip_prefix("http://")
        .ok_or_else(|| ClientError::Url(url.trim().to_string()))?;
    let addr = rest.split('/').next().unwrap_or("");
    if addr.is_empty() || addr.contains('@') {
        return Err(ClientError::Url(url.trim().to_string()));
    }
    Ok(addr.to_string())
}

/// Sends one request on a fresh HTTP/1.1 connection and returns the response head; the caller
/// reads the body. One connection per request: `send` makes two at most (the stream and a
/// cancel), so a pool would buy nothing.
pub async fn request(
    addr: &str,
    method: Method,
    path: &str,
    token: &str,
    body: Option<&Value>,
) -> Result<Response<Incoming>, ClientError> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|source| ClientError::Connect {
            addr: addr.to_string(),
            source,
        })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    // The connection is driven on its own task until the response body is read or dropped; its
    // errors also surface through `send_request` or the body, where they are reported.
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, addr)
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .header("A2A-Version", "1.0")
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(
            body.map(Value::to_string).unwrap_or_default(),
        )))?;
    Ok(sender.send_request(req).await?)
}

/// The whole (bounded) body of an answer as JSON; `Value::Null` when it is not JSON, with the
/// text kept for messages.
pub async fn read_answer(resp: Response<Incoming>) -> Result<(Value, String), ClientError> {
    let body = Limited::new(resp.into_body(), ANSWER_LIMIT)
        .collect()
        .await
        .map_err(|e| ClientError::Answer(e.to_string()))?
        .to_bytes();
    let text = String::from_utf8_lossy(&body).into_owned();
    Ok((serde_json::from_str(&text).unwrap_or(Value::Null), text))
}

/// GETs `path` and returns the JSON answer, whatever its status (A2A errors are JSON too).
pub async fn get_json(addr: &str, path: &str, token: &str) -> Result<Value, ClientError> {
    let resp = request(addr, Method::GET, path, token, None).await?;
    Ok(read_answer(resp).await?.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_http_urls_are_used() {
        assert_eq!(
            gateway_addr("http://127.0.0.1:7420\n").unwrap(),
            "127.0.0.1:7420"
        );
        assert_eq!(
            gateway_addr("http://127.0.0.1:7420/").unwrap(),
            "127.0.0.1:7420"
        );
        assert!(gateway_addr("https://gw.example").is_err());
        assert!(gateway_addr("http://user@host").is_err());
        assert!(gateway_addr("").is_err());
    }
}
