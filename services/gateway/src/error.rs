//! The A2A error table (spec §5.4, v1.0.1): JSON-RPC codes, `google.rpc.ErrorInfo` details and
//! the HTTP+JSON binding's status codes, in one place so both bindings answer alike.

use serde_json::{Value, json};

/// The `ErrorInfo.domain` the spec assigns to A2A errors.
pub const ERROR_DOMAIN: &str = "a2a-protocol.org";

/// Every error a caller can receive from the A2A surface.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum A2aError {
    // --- JSON-RPC 2.0 standard codes ---
    #[error("{0}")]
    ParseError(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    MethodNotFound(String),
    #[error("{0}")]
    InvalidParams(String),
    #[error("{0}")]
    Internal(String),
    // --- A2A codes ---
    #[error("task not found: {0}")]
    TaskNotFound(String),
    #[error("{0}")]
    TaskNotCancelable(String),
    #[error("push notifications are not supported by this agent")]
    PushNotificationNotSupported,
    #[error("{0}")]
    UnsupportedOperation(String),
    #[error("{0}")]
    ContentTypeNotSupported(String),
    #[error("{0}")]
    InvalidAgentResponse(String),
    #[error("the extended agent card is not configured")]
    ExtendedAgentCardNotConfigured,
    #[error("{0}")]
    ExtensionSupportRequired(String),
    #[error("{0}")]
    VersionNotSupported(String),
    // --- transport-level refusals that have no JSON-RPC code of their own ---
    /// The body is larger than the configured limit.
    #[error("request body exceeds the limit of {0} bytes")]
    PayloadTooLarge(usize),
    /// The body did not arrive within `http.body_read_timeout_ms` (the value, in ms).
    #[error("the request body did not arrive within {0} ms")]
    RequestTimeout(u64),
    /// The caller holds its whole share of something (streams, connections): only it waits.
    #[error("{0}")]
    ResourceExhausted(String),
}

/// The JSON-RPC code of [`A2aError::ResourceExhausted`]: in the implementation-defined server
/// range, beside the A2A codes (-32001..-32009); 429 echoed for recognisability.
pub const RESOURCE_EXHAUSTED_CODE: i64 = -32029;

impl A2aError {
    /// The JSON-RPC error code.
    pub fn code(&self) -> i64 {
        match self {
            Self::ParseError(_) => -32700,
            Self::InvalidRequest(_) | Self::PayloadTooLarge(_) | Self::RequestTimeout(_) => -32600,
            Self::MethodNotFound(_) => -32601,
            Self::InvalidParams(_) => -32602,
            Self::Internal(_) => -32603,
            Self::TaskNotFound(_) => -32001,
            Self::TaskNotCancelable(_) => -32002,
            Self::PushNotificationNotSupported => -32003,
            Self::UnsupportedOperation(_) => -32004,
            Self::ContentTypeNotSupported(_) => -32005,
            Self::InvalidAgentResponse(_) => -32006,
            Self::ExtendedAgentCardNotConfigured => -32007,
            Self::ExtensionSupportRequired(_) => -32008,
            Self::VersionNotSupported(_) => -32009,
            Self::ResourceExhausted(_) => RESOURCE_EXHAUSTED_CODE,
        }
    }

    /// The `ErrorInfo.reason` for A2A-specific errors (none for the JSON-RPC standard ones).
    pub fn reason(&self) -> Option<&'static str> {
        Some(match self {
            Self::TaskNotFound(_) => "TASK_NOT_FOUND",
            Self::TaskNotCancelable(_) => "TASK_NOT_CANCELABLE",
            Self::PushNotificationNotSupported => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            Self::UnsupportedOperation(_) => "UNSUPPORTED_OPERATION",
            Self::ContentTypeNotSupported(_) => "CONTENT_TYPE_NOT_SUPPORTED",
            Self::InvalidAgentResponse(_) => "INVALID_AGENT_RESPONSE",
            Self::ExtendedAgentCardNotConfigured => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
            Self::ExtensionSupportRequired(_) => "EXTENSION_SUPPORT_REQUIRED",
            Self::VersionNotSupported(_) => "VERSION_NOT_SUPPORTED",
            _ => return None,
        })
    }

    /// The HTTP status for the HTTP+JSON binding (and for transport-level refusals on JSON-RPC).
    pub fn http_status(&self) -> http::StatusCode {
        use http::StatusCode as S;
        match self {
            Self::TaskNotFound(_) | Self::MethodNotFound(_) => S::NOT_FOUND,
            Self::Internal(_) | Self::InvalidAgentResponse(_) => S::INTERNAL_SERVER_ERROR,
            Self::PayloadTooLarge(_) => S::PAYLOAD_TOO_LARGE,
            Self::RequestTimeout(_) => S::REQUEST_TIMEOUT,
            Self::ResourceExhausted(_) => S::TOO_MANY_REQUESTS,
            _ => S::BAD_REQUEST,
        }
    }

    /// The `google.rpc.Code` name used in the REST error body.
    pub fn rpc_status(&self) -> &'static str {
        match self {
            Self::TaskNotFound(_) | Self::MethodNotFound(_) => "NOT_FOUND",
            Self::ParseError(_)
            | Self::InvalidRequest(_)
            | Self::InvalidParams(_)
            | Self::ContentTypeNotSupported(_)
            | Self::PayloadTooLarge(_) => "INVALID_ARGUMENT",
            Self::Internal(_) | Self::InvalidAgentResponse(_) => "INTERNAL",
            Self::RequestTimeout(_) => "DEADLINE_EXCEEDED",
            Self::ResourceExhausted(_) => "RESOURCE_EXHAUSTED",
            _ => "FAILED_PRECONDITION",
        }
    }

    fn details(&self) -> Vec<Value> {
        match self.reason() {
            Some(reason) => vec![json!({
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": reason,
                "domain": ERROR_DOMAIN,
                "metadata": {},
            })],
            None => Vec::new(),
        }
    }

    /// The JSON-RPC `error` member.
    pub fn jsonrpc_error(&self) -> Value {
        let mut err = json!({"code": self.code(), "message": self.to_string()});
        let details = self.details();
        if !details.is_empty() {
            err["data"] = Value::Array(details);
        }
        err
    }

    /// A whole JSON-RPC error response for request `id` (`null` when it could not be read).
    pub fn jsonrpc_response(&self, id: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": id, "error": self.jsonrpc_error()})
    }

    /// The HTTP+JSON binding's body (`google.rpc.Status`).
    pub fn rest_body(&self) -> Value {
        json!({"error": {
            "code": self.http_status().as_u16(),
            "status": self.rpc_status(),
            "message": self.to_string(),
            "details": self.details(),
        }})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_matches_the_spec() {
        let rows: Vec<(A2aError, i64, u16, Option<&str>)> = vec![
            (
                A2aError::TaskNotFound("t".into()),
                -32001,
                404,
                Some("TASK_NOT_FOUND"),
            ),
            (
                A2aError::TaskNotCancelable("x".into()),
                -32002,
                400,
                Some("TASK_NOT_CANCELABLE"),
            ),
            (
                A2aError::PushNotificationNotSupported,
                -32003,
                400,
                Some("PUSH_NOTIFICATION_NOT_SUPPORTED"),
            ),
            (
                A2aError::UnsupportedOperation("x".into()),
                -32004,
                400,
                Some("UNSUPPORTED_OPERATION"),
            ),
            (
                A2aError::ContentTypeNotSupported("x".into()),
                -32005,
                400,
                Some("CONTENT_TYPE_NOT_SUPPORTED"),
            ),
            (
                A2aError::InvalidAgentResponse("x".into()),
                -32006,
                500,
                Some("INVALID_AGENT_RESPONSE"),
            ),
            (
                A2aError::ExtendedAgentCardNotConfigured,
                -32007,
                400,
                Some("EXTENDED_AGENT_CARD_NOT_CONFIGURED"),
            ),
            (
                A2aError::ExtensionSupportRequired("x".into()),
                -32008,
                400,
                Some("EXTENSION_SUPPORT_REQUIRED"),
            ),
            (
                A2aError::VersionNotSupported("x".into()),
                -32009,
                400,
                Some("VERSION_NOT_SUPPORTED"),
            ),
            (A2aError::ParseError("x".into()), -32700, 400, None),
            (A2aError::InvalidRequest("x".into()), -32600, 400, None),
            (A2aError::MethodNotFound("x".into()), -32601, 404, None),
            (A2aError::InvalidParams("x".into()), -32602, 400, None),
            (A2aError::Internal("x".into()), -32603, 500, None),
            (A2aError::ResourceExhausted("x".into()), -32029, 429, None),
        ];
        for (err, code, status, reason) in rows {
            assert_eq!(err.code(), code, "{err:?}");
            assert_eq!(err.http_status().as_u16(), status, "{err:?}");
            assert_eq!(err.reason(), reason, "{err:?}");
            let body = err.jsonrpc_response(json!(7));
            assert_eq!(body["error"]["code"], code);
            assert_eq!(body["id"], 7);
            match reason {
                Some(r) => {
                    assert_eq!(body["error"]["data"][0]["reason"], r);
                    assert_eq!(body["error"]["data"][0]["domain"], ERROR_DOMAIN);
                    assert_eq!(
                        body["error"]["data"][0]["@type"],
                        "type.googleapis.com/google.rpc.ErrorInfo"
                    );
                    assert_eq!(err.rest_body()["error"]["details"][0]["reason"], r);
                }
                None => assert!(body["error"].get("data").is_none()),
            }
            assert_eq!(err.rest_body()["error"]["code"], status);
        }
    }
}
