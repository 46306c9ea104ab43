//! JSON-RPC 2.0 pieces: ids, error objects, message classification and the
//! bounded NDJSON line reader.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// JSON-RPC error codes used by ACP v1.
pub mod codes {
    /// Invalid JSON was received.
    pub const PARSE_ERROR: i64 = -32700;
    /// The JSON sent is not a valid request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// The method does not exist / is not available (also: capability not advertised).
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid method parameters (also: path outside the session boundary).
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal error.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// The request was cancelled (`$/cancel_request`).
    pub const REQUEST_CANCELLED: i64 = -32800;
    /// Authentication required.
    pub const AUTH_REQUIRED: i64 = -32000;
    /// Resource (file, terminal, session) not found.
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
}

/// A JSON-RPC id. Agents use both integers (Claude adapters) and strings (Codex: UUIDs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequestId {
    /// Integer id.
    Int(i64),
    /// String id.
    Str(String),
}

impl RequestId {
    /// Parse an id from a raw JSON value; `null`, floats, objects are not usable ids.
    pub fn from_value(v: &Value) -> Option<RequestId> {
        match v {
            Value::Number(n) => n.as_i64().map(RequestId::Int),
            Value::String(s) => Some(RequestId::Str(s.clone())),
            _ => None,
        }
    }

    /// The id as JSON.
    pub fn to_value(&self) -> Value {
        match self {
            RequestId::Int(i) => Value::from(*i),
            RequestId::Str(s) => Value::from(s.clone()),
        }
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Int(i) => write!(f, "{i}"),
            RequestId::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// A JSON-RPC error object, sent or received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("JSON-RPC error {code}: {message}")]
pub struct RpcError {
    /// Error code (see [`codes`]).
    pub code: i64,
    /// Human readable message.
    pub message: String,
    /// Optional structured data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    /// An error with the given code and message.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }
    /// `-32602 invalid params`.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(codes::INVALID_PARAMS, message)
    }
    /// `-32601 method not found`.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            codes::METHOD_NOT_FOUND,
            format!("method not found: {method}"),
        )
    }
    /// `-32603 internal error`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(codes::INTERNAL_ERROR, message)
    }
    /// `-32002 resource not found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(codes::RESOURCE_NOT_FOUND, message)
    }
    /// `-32800 request cancelled`.
    pub fn cancelled() -> Self {
        Self::new(codes::REQUEST_CANCELLED, "request cancelled")
    }
}

/// One decoded incoming line.
#[derive(Debug)]
pub(crate) enum Incoming {
    Request {
        id: RequestId,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    Response {
        id: RequestId,
        result: Result<Value, RpcError>,
    },
    /// Valid JSON that is not a usable JSON-RPC message. `id` is set when the
    /// peer can be told (`-32600`).
    Invalid {
        id: Option<RequestId>,
        reason: String,
    },
}

/// Classify a line. `Err` means the line is not JSON at all.
pub(crate) fn classify(line: &[u8]) -> Result<Incoming, serde_json::Error> {
    let v: Value = serde_json::from_slice(line)?;
    let Value::Object(mut obj) = v else {
        return Ok(Incoming::Invalid {
            id: None,
            reason: "message is not a JSON object (batches are not supported)".into(),
        });
    };
    let id_raw = obj.remove("id");
    let id = id_raw.as_ref().and_then(RequestId::from_value);
    if let Some(method) = obj.remove("method") {
        let Value::String(method) = method else {
            return Ok(Incoming::Invalid {
                id,
                reason: "method is not a string".into(),
            });
        };
        let params = obj.remove("params").unwrap_or(Value::Null);
        return Ok(match (id_raw, id) {
            (None, _) => Incoming::Notification { method, params },
            (Some(_), Some(id)) => Incoming::Request { id, method, params },
            (Some(_), None) => Incoming::Invalid {
                id: None,
                reason: format!("request {method} has an unusable id"),
            },
        });
    }
    let Some(id) = id else {
        return Ok(Incoming::Invalid {
            id: None,
            reason: "neither a request nor a response with a usable id".into(),
        });
    };
    if let Some(err) = obj.remove("error") {
        let err = serde_json::from_value::<RpcError>(err).unwrap_or_else(|e| {
            RpcError::internal(format!("peer sent a malformed error object: {e}"))
        });
        return Ok(Incoming::Response {
            id,
            result: Err(err),
        });
    }
    match obj.remove("result") {
        Some(result) => Ok(Incoming::Response {
            id,
            result: Ok(result),
        }),
        None => Ok(Incoming::Invalid {
            id: None,
            reason: "response carries neither result nor error".into(),
        }),
    }
}

/// An outgoing message, serialized straight from borrowed parts: no intermediate `Value` tree and
/// no copy of the params.
#[derive(Serialize)]
struct Outgoing<'a> {
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a RequestId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a RpcError>,
}

impl Outgoing<'_> {
    /// The message as one line, newline included, so the writer sends it with one write.
    fn line(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        // Serializing plain strings, numbers and `Value`s into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, self);
        out.push(b'\n');
        out
    }
}

/// Serialize a request line (trailing newline included).
pub(crate) fn request_line(id: &RequestId, method: &str, params: &Value) -> Vec<u8> {
    Outgoing {
        jsonrpc: "2.0",
        id: Some(id),
        method: Some(method),
        params: Some(params),
        result: None,
        error: None,
    }
    .line()
}

/// Serialize a notification line (trailing newline included).
pub(crate) fn notification_line(method: &str, params: &Value) -> Vec<u8> {
    Outgoing {
        jsonrpc: "2.0",
        id: None,
        method: Some(method),
        params: Some(params),
        result: None,
        error: None,
    }
    .line()
}

/// Serialize a response line (trailing newline included).
pub(crate) fn response_line(id: &RequestId, result: Result<Value, RpcError>) -> Vec<u8> {
    let (result, error) = match &result {
        Ok(v) => (Some(v), None),
        Err(e) => (None, Some(e)),
    };
    Outgoing {
        jsonrpc: "2.0",
        id: Some(id),
        method: None,
        params: None,
        result,
        error,
    }
    .line()
}

/// Result of reading one bounded line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LineRead {
    /// A line is in the buffer (newline stripped).
    Line,
    /// Clean end of stream, nothing buffered.
    Eof,
    /// The line grew past the limit; the stream can no longer be trusted.
    TooLong,
}

/// Read one `\n`-terminated line into `buf` without ever holding more than
/// `max` bytes of it: a peer cannot make us allocate without bound.
pub(crate) async fn read_line_bounded<R: AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<LineRead> {
    buf.clear();
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            // A final line without a newline still counts as a line.
            return Ok(if buf.is_empty() {
                LineRead::Eof
            } else {
                LineRead::Line
            });
        }
        match avail.iter().position(|b| *b == b'\n') {
            Some(i) => {
                if buf.len() + i > max {
                    return Ok(LineRead::TooLong);
                }
                buf.extend_from_slice(&avail[..i]);
                r.consume(i + 1);
                if buf.last() == Some(&b'\r') {
                    buf.pop();
                }
                return Ok(LineRead::Line);
            }
            None => {
                let n = avail.len();
                if buf.len() + n > max {
                    return Ok(LineRead::TooLong);
                }
                buf.extend_from_slice(avail);
                r.consume(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_reader_splits_and_limits() {
        let data: &[u8] = b"{\"a\":1}\r\nabc\n0123456789ABCDEF\nlast";
        let mut r = tokio::io::BufReader::with_capacity(4, data);
        let mut buf = Vec::new();
        assert_eq!(
            read_line_bounded(&mut r, &mut buf, 10).await.unwrap(),
            LineRead::Line
        );
        assert_eq!(buf, b"{\"a\":1}");
        assert_eq!(
            read_line_bounded(&mut r, &mut buf, 10).await.unwrap(),
            LineRead::Line
        );
        assert_eq!(buf, b"abc");
        assert_eq!(
            read_line_bounded(&mut r, &mut buf, 10).await.unwrap(),
            LineRead::TooLong
        );
    }

    #[tokio::test]
    async fn bounded_reader_eof_and_last_line() {
        let data: &[u8] = b"x\nlast";
        let mut r = tokio::io::BufReader::new(data);
        let mut buf = Vec::new();
        assert_eq!(
            read_line_bounded(&mut r, &mut buf, 100).await.unwrap(),
            LineRead::Line
        );
        assert_eq!(
            read_line_bounded(&mut r, &mut buf, 100).await.unwrap(),
            LineRead::Line
        );
        assert_eq!(buf, b"last");
        assert_eq!(
            read_line_bounded(&mut r, &mut buf, 100).await.unwrap(),
            LineRead::Eof
        );
    }

    #[test]
    fn outgoing_lines_are_single_terminated_json_rpc() {
        let id = RequestId::Str("warden-7".into());
        let req = request_line(&id, "session/new", &serde_json::json!({"cwd": "/x"}));
        assert_eq!(req.last(), Some(&b'\n'));
        assert_eq!(req.iter().filter(|b| **b == b'\n').count(), 1);
        let v: Value = serde_json::from_slice(&req).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"jsonrpc": "2.0", "id": "warden-7", "method": "session/new", "params": {"cwd": "/x"}})
        );
        let n: Value =
            serde_json::from_slice(&notification_line("session/cancel", &Value::Null)).unwrap();
        assert_eq!(
            n,
            serde_json::json!({"jsonrpc": "2.0", "method": "session/cancel", "params": null})
        );
        // A `null` result is still a result (the member must be present).
        let ok: Value =
            serde_json::from_slice(&response_line(&RequestId::Int(3), Ok(Value::Null))).unwrap();
        assert_eq!(
            ok,
            serde_json::json!({"jsonrpc": "2.0", "id": 3, "result": null})
        );
        let err: Value = serde_json::from_slice(&response_line(
            &RequestId::Int(4),
            Err(RpcError::cancelled()),
        ))
        .unwrap();
        assert_eq!(
            err,
            serde_json::json!({"jsonrpc": "2.0", "id": 4, "error": {"code": -32800, "message": "request cancelled"}})
        );
    }

    #[test]
    fn classify_kinds() {
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","id":"u-1","method":"fs/read_text_file","params":{}}"#),
            Ok(Incoming::Request {
                id: RequestId::Str(_),
                ..
            })
        ));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"session/update","params":{}}"#),
            Ok(Incoming::Notification { .. })
        ));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","id":3,"result":null}"#),
            Ok(Incoming::Response {
                id: RequestId::Int(3),
                result: Ok(Value::Null)
            })
        ));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"x"}}"#),
            Ok(Incoming::Response { result: Err(_), .. })
        ));
        assert!(matches!(classify(b"[1,2]"), Ok(Incoming::Invalid { .. })));
        assert!(matches!(
            classify(br#"{"id":{"x":1},"method":"m"}"#),
            Ok(Incoming::Invalid { .. })
        ));
        assert!(classify(b"not json").is_err());
    }
}
