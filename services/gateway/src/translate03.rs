//! A2A 0.3 ⇄ 1.0 as pure translation functions: a 0.3 request's JSON becomes the 1.0 request
//! the core serves, and the core's answers, events, errors and card become 0.3 JSON.
//!
//! Two 0.3 wire shapes exist and both are here: the JSON-RPC binding's JSON (`kind`
//! discriminators, lower-case kebab states, `final` on status events, `file: {bytes|uri}` parts)
//! and the REST binding's ProtoJSON of 0.3's `a2a.v1` proto (`content` parts, `file_with_uri`,
//! `TASK_STATE_CANCELLED`, `tasks/{id}` resource names).
//! Owns: the translation only (the bottom floor: A2A types in, JSON out, and back). Must never:
//! hold task logic or know a transport — the 0.3 routes (`compat03.rs`) and the card use it, so
//! 0.3 and 1.0 callers see the same tasks.

use serde_json::{Map, Value, json};

use crate::a2a::{
    AuthenticationInfo, Message, Part, PartContent, Role, SendMessageConfiguration,
    SendMessageRequest, StreamResponse, TaskPushNotificationConfig, TaskState,
};
use crate::endpoints::{JSONRPC_BINDING, REST_BINDING};
use crate::error::A2aError;

/// The version string of the 0.3 interfaces on the card.
pub const VERSION_03: &str = "0.3.0";

/// A request speaks 0.3 when it names no version (spec: "empty value = 0.3") or names 0.3.
pub fn speaks_03(version: Option<&str>) -> bool {
    matches!(version, None | Some("0.3") | Some("0.3.0"))
}

/// The 0.3 JSON-RPC method names.
pub fn is_03_method(m: &str) -> bool {
    matches!(
        m,
        "message/send"
            | "message/stream"
            | "tasks/get"
            | "tasks/cancel"
            | "tasks/resubscribe"
            | "tasks/pushNotificationConfig/set"
            | "tasks/pushNotificationConfig/get"
            | "tasks/pushNotificationConfig/list"
            | "tasks/pushNotificationConfig/delete"
            | "agent/getAuthenticatedExtendedCard"
    )
}

/// The two 0.3 shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// JSON-RPC: `kind` discriminators, kebab-case states.
    Rpc,
    /// REST: ProtoJSON of the 0.3 proto.
    Proto,
}

// ------------------------------------------------------------------ 1.0 → 0.3

fn obj(pairs: Vec<(&str, Option<Value>)>) -> Value {
    let mut m = Map::new();
    for (k, v) in pairs {
        if let Some(v) = v {
            m.insert(k.to_string(), v);
        }
    }
    Value::Object(m)
}

fn s(v: &Option<String>) -> Option<Value> {
    v.as_ref().map(|x| Value::String(x.clone()))
}

fn meta(m: &Option<crate::a2a::Metadata>) -> Option<Value> {
    m.as_ref().map(|m| Value::Object(m.clone()))
}

fn list(v: &[String]) -> Option<Value> {
    (!v.is_empty()).then(|| json!(v))
}

/// `TASK_STATE_INPUT_REQUIRED` → `input-required` (JSON-RPC) or the 0.3 proto name.
pub fn state_out(state: TaskState, shape: Shape) -> String {
    match (shape, state) {
        (Shape::Rpc, TaskState::Unspecified) => "unknown".into(),
        (Shape::Rpc, s) => s
            .as_str()
            .trim_start_matches("TASK_STATE_")
            .to_ascii_lowercase()
            .replace('_', "-"),
        (Shape::Proto, TaskState::Canceled) => "TASK_STATE_CANCELLED".into(),
        (Shape::Proto, s) => s.as_str().into(),
    }
}

fn part_out(p: &Part, shape: Shape) -> Value {
    let m = meta(&p.metadata);
    match (shape, &p.content) {
        (Shape::Rpc, PartContent::Text(t)) => obj(vec![
            ("kind", Some(json!("text"))),
            ("text", Some(json!(t))),
            ("metadata", m),
        ]),
        (Shape::Rpc, PartContent::Raw(b)) => obj(vec![
            ("kind", Some(json!("file"))),
            (
                "file",
                Some(obj(vec![
                    ("bytes", Some(json!(b))),
                    ("mimeType", s(&p.media_type)),
                    ("name", s(&p.filename)),
                ])),
            ),
            ("metadata", m),
        ]),
        (Shape::Rpc, PartContent::Url(u)) => obj(vec![
            ("kind", Some(json!("file"))),
            (
                "file",
                Some(obj(vec![
                    ("uri", Some(json!(u))),
                    ("mimeType", s(&p.media_type)),
                    ("name", s(&p.filename)),
                ])),
            ),
            ("metadata", m),
        ]),
        (Shape::Rpc, PartContent::Data(d)) => obj(vec![
            ("kind", Some(json!("data"))),
            ("data", Some(data_object(d))),
            ("metadata", m),
        ]),
        (Shape::Proto, PartContent::Text(t)) => {
            obj(vec![("text", Some(json!(t))), ("metadata", m)])
        }
        (Shape::Proto, PartContent::Raw(b)) => obj(vec![
            (
                "file",
                Some(obj(vec![
                    ("fileWithBytes", Some(json!(b))),
                    ("mimeType", s(&p.media_type)),
                    ("name", s(&p.filename)),
                ])),
            ),
            ("metadata", m),
        ]),
        (Shape::Proto, PartContent::Url(u)) => obj(vec![
            (
                "file",
                Some(obj(vec![
                    ("fileWithUri", Some(json!(u))),
                    ("mimeType", s(&p.media_type)),
                    ("name", s(&p.filename)),
                ])),
            ),
            ("metadata", m),
        ]),
        (Shape::Proto, PartContent::Data(d)) => obj(vec![
            ("data", Some(json!({"data": data_object(d)}))),
            ("metadata", m),
        ]),
    }
}

/// 0.3 data parts hold an object; other JSON values are wrapped as `{"value": …}`.
fn data_object(d: &Value) -> Value {
    if d.is_object() {
        d.clone()
    } else {
        json!({"value": d})
    }
}

pub fn message_out(m: &Message, shape: Shape) -> Value {
    let role = match (shape, m.role) {
        (Shape::Rpc, Role::Agent) => "agent",
        (Shape::Rpc, _) => "user",
        (Shape::Proto, Role::Agent) => "ROLE_AGENT",
        (Shape::Proto, _) => "ROLE_USER",
    };
    let parts: Vec<Value> = m.parts.iter().map(|p| part_out(p, shape)).collect();
    obj(vec![
        ("kind", (shape == Shape::Rpc).then(|| json!("message"))),
        ("messageId", Some(json!(m.message_id))),
        ("contextId", s(&m.context_id)),
        ("taskId", s(&m.task_id)),
        ("role", Some(json!(role))),
        (
            if shape == Shape::Rpc {
                "parts"
            } else {
                "content"
            },
            Some(Value::Array(parts)),
        ),
        ("metadata", meta(&m.metadata)),
        ("extensions", list(&m.extensions)),
        (
            "referenceTaskIds",
            if shape == Shape::Rpc {
                list(&m.reference_task_ids)
            } else {
                None
            },
        ),
    ])
}

fn status_out(st: &crate::a2a::TaskStatus, shape: Shape) -> Value {
    obj(vec![
        ("state", Some(json!(state_out(st.state, shape)))),
        (
            "message",
            st.message.as_ref().map(|m| message_out(m, shape)),
        ),
        ("timestamp", s(&st.timestamp)),
    ])
}

fn artifact_out(a: &crate::a2a::Artifact, shape: Shape) -> Value {
    obj(vec![
        ("artifactId", Some(json!(a.artifact_id))),
        ("name", s(&a.name)),
        ("description", s(&a.description)),
        (
            "parts",
            Some(Value::Array(
                a.parts.iter().map(|p| part_out(p, shape)).collect(),
            )),
        ),
        ("metadata", meta(&a.metadata)),
        ("extensions", list(&a.extensions)),
    ])
}

pub fn task_out(t: &crate::a2a::Task, shape: Shape) -> Value {
    obj(vec![
        ("kind", (shape == Shape::Rpc).then(|| json!("task"))),
        ("id", Some(json!(t.id))),
        ("contextId", Some(json!(t.context_id))),
        ("status", Some(status_out(&t.status, shape))),
        (
            "artifacts",
            (!t.artifacts.is_empty()).then(|| {
                Value::Array(t.artifacts.iter().map(|a| artifact_out(a, shape)).collect())
            }),
        ),
        (
            "history",
            (!t.history.is_empty())
                .then(|| Value::Array(t.history.iter().map(|m| message_out(m, shape)).collect())),
        ),
        ("metadata", meta(&t.metadata)),
    ])
}

/// One stream event: bare with `kind` for JSON-RPC, wrapped in its oneof member for REST.
pub fn event_out(ev: &StreamResponse, shape: Shape) -> Value {
    let (member, body) = match ev {
        StreamResponse::Task(t) => ("task", task_out(t, shape)),
        StreamResponse::Message(m) => ("message", message_out(m, shape)),
        StreamResponse::StatusUpdate(e) => (
            "statusUpdate",
            obj(vec![
                (
                    "kind",
                    (shape == Shape::Rpc).then(|| json!("status-update")),
                ),
                ("taskId", Some(json!(e.task_id))),
                ("contextId", Some(json!(e.context_id))),
                ("status", Some(status_out(&e.status, shape))),
                (
                    "final",
                    Some(json!(
                        e.status.state.is_terminal() || e.status.state.is_interrupted()
                    )),
                ),
                ("metadata", meta(&e.metadata)),
            ]),
        ),
        StreamResponse::ArtifactUpdate(e) => (
            "artifactUpdate",
            obj(vec![
                (
                    "kind",
                    (shape == Shape::Rpc).then(|| json!("artifact-update")),
                ),
                ("taskId", Some(json!(e.task_id))),
                ("contextId", Some(json!(e.context_id))),
                ("artifact", Some(artifact_out(&e.artifact, shape))),
                ("append", e.append.then_some(json!(true))),
                ("lastChunk", e.last_chunk.then_some(json!(true))),
                ("metadata", meta(&e.metadata)),
            ]),
        ),
    };
    match shape {
        Shape::Rpc => body,
        Shape::Proto => json!({ member: body }),
    }
}

/// A push config in 0.3 form: JSON-RPC `{taskId, pushNotificationConfig}`, REST
/// `{name: "tasks/{t}/pushNotificationConfigs/{id}", pushNotificationConfig}`.
pub fn push_out(c: &TaskPushNotificationConfig, shape: Shape) -> Value {
    let inner = obj(vec![
        ("id", Some(json!(c.id))),
        ("url", Some(json!(c.url))),
        ("token", s(&c.token)),
        (
            "authentication",
            c.authentication.as_ref().map(|a| {
                obj(vec![
                    ("schemes", Some(json!([a.scheme]))),
                    ("credentials", s(&a.credentials)),
                ])
            }),
        ),
    ]);
    match shape {
        Shape::Rpc => json!({"taskId": c.task_id, "pushNotificationConfig": inner}),
        Shape::Proto => json!({
            "name": format!("tasks/{}/pushNotificationConfigs/{}", c.task_id, c.id),
            "pushNotificationConfig": inner,
        }),
    }
}

/// The error as 0.3 clients read it: JSON-RPC keeps code and message (no 1.0 `data` array);
/// REST is `{type, message}` with the type name the 0.3 SDKs map back to their error classes.
pub fn error_out(e: &A2aError) -> Value {
    json!({"code": e.code(), "message": e.to_string()})
}

pub fn error_type(e: &A2aError) -> &'static str {
    match e {
        A2aError::ParseError(_) => "JSONParseError",
        A2aError::InvalidRequest(_)
        | A2aError::PayloadTooLarge(_)
        | A2aError::RequestTimeout(_) => "InvalidRequestError",
        // 0.3 has no error class for it; the SDKs show the message of an unknown type.
        A2aError::ResourceExhausted(_) => "ResourceExhaustedError",
        A2aError::MethodNotFound(_) => "MethodNotFoundError",
        A2aError::InvalidParams(_) => "InvalidParamsError",
        A2aError::Internal(_) => "InternalError",
        A2aError::TaskNotFound(_) => "TaskNotFoundError",
        A2aError::TaskNotCancelable(_) => "TaskNotCancelableError",
        A2aError::PushNotificationNotSupported => "PushNotificationNotSupportedError",
        A2aError::UnsupportedOperation(_) => "UnsupportedOperationError",
        A2aError::ContentTypeNotSupported(_) => "ContentTypeNotSupportedError",
        A2aError::InvalidAgentResponse(_) => "InvalidAgentResponseError",
        A2aError::ExtendedAgentCardNotConfigured => "AuthenticatedExtendedCardNotConfiguredError",
        A2aError::ExtensionSupportRequired(_) | A2aError::VersionNotSupported(_) => {
            "UnsupportedOperationError"
        }
    }
}

// ------------------------------------------------------------------ 0.3 → 1.0

/// The first of several spellings of a member (camelCase and the proto field name).
pub fn member<'a>(v: &'a Value, names: &[&str]) -> Option<&'a Value> {
    names
        .iter()
        .find_map(|n| v.get(*n))
        .filter(|x| !x.is_null())
}

pub fn str_member(v: &Value, names: &[&str]) -> Option<String> {
    member(v, names).and_then(Value::as_str).map(str::to_string)
}

pub fn bad(what: impl Into<String>) -> A2aError {
    A2aError::InvalidParams(what.into())
}

fn metadata_in(v: &Value) -> Result<Option<crate::a2a::Metadata>, A2aError> {
    match member(v, &["metadata"]) {
        None => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m.clone())),
        Some(_) => Err(bad("metadata must be an object")),
    }
}

fn part_in(p: &Value) -> Result<Part, A2aError> {
    let metadata = metadata_in(p)?;
    let file_part = |f: &Value, uri: &[&str], bytes: &[&str]| -> Result<Part, A2aError> {
        let media_type = str_member(f, &["mimeType", "mime_type"]);
        let filename = str_member(f, &["name"]);
        let content = if let Some(u) = str_member(f, uri) {
            PartContent::Url(u)
        } else if let Some(b) = str_member(f, bytes) {
            PartContent::Raw(b)
        } else {
            return Err(bad("a file part needs bytes or uri"));
        };
        Ok(Part {
            content,
            metadata: metadata.clone(),
            filename,
            media_type,
        })
    };
    let kind = p.get("kind").and_then(Value::as_str);
    if let Some(t) = p.get("text").and_then(Value::as_str)
        && kind.is_none_or(|k| k == "text")
    {
        return Ok(Part {
            metadata,
            ..Part::text(t)
        });
    }
    if let Some(f) = p.get("file").filter(|f| f.is_object()) {
        return file_part(
            f,
            &["uri", "fileWithUri", "file_with_uri"],
            &["bytes", "fileWithBytes", "file_with_bytes"],
        );
    }
    if let Some(d) = p.get("data") {
        // JSON-RPC: `data` is the object; REST ProtoJSON: `data: {data: {…}}`.
        let value = match (kind, d.get("data")) {
            (None, Some(inner)) if d.as_object().is_some_and(|o| o.len() == 1) => inner.clone(),
            _ => d.clone(),
        };
        return Ok(Part {
            metadata,
            ..Part::data(value)
        });
    }
    Err(bad(
        "a 0.3 part needs kind text (text), file (file.bytes|uri) or data (data)",
    ))
}

pub fn message_in(m: &Value) -> Result<Message, A2aError> {
    if !m.is_object() {
        return Err(bad("message must be an object"));
    }
    let role = match member(m, &["role"]).and_then(Value::as_str) {
        Some("user") | Some("ROLE_USER") => Role::User,
        Some("agent") | Some("ROLE_AGENT") => Role::Agent,
        Some(other) => return Err(bad(format!("message.role {other:?} is not user or agent"))),
        None => return Err(bad("message.role is required")),
    };
    let parts = member(m, &["parts", "content"])
        .and_then(Value::as_array)
        .ok_or_else(|| bad("message.parts is required"))?
        .iter()
        .map(part_in)
        .collect::<Result<Vec<_>, _>>()?;
    let strings = |names: &[&str]| -> Vec<String> {
        member(m, names)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(Message {
        message_id: str_member(m, &["messageId", "message_id"])
            .ok_or_else(|| bad("message.messageId is required"))?,
        context_id: str_member(m, &["contextId", "context_id"]),
        task_id: str_member(m, &["taskId", "task_id"]),
        role,
        parts,
        metadata: metadata_in(m)?,
        extensions: strings(&["extensions"]),
        reference_task_ids: strings(&["referenceTaskIds", "reference_task_ids"]),
    })
}

pub fn push_in(c: &Value, task_id: Option<&str>) -> Result<TaskPushNotificationConfig, A2aError> {
    let auth = member(c, &["authentication"]).map(|a| {
        let scheme = member(a, &["schemes"])
            .and_then(Value::as_array)
            .and_then(|s| s.first())
            .and_then(Value::as_str)
            .or_else(|| a.get("scheme").and_then(Value::as_str))
            .unwrap_or("Bearer")
            .to_string();
        AuthenticationInfo {
            scheme,
            credentials: str_member(a, &["credentials"]),
        }
    });
    Ok(TaskPushNotificationConfig {
        tenant: None,
        id: str_member(c, &["id"]).unwrap_or_default(),
        task_id: task_id.unwrap_or_default().to_string(),
        url: str_member(c, &["url"])
            .ok_or_else(|| bad("pushNotificationConfig.url is required"))?,
        token: str_member(c, &["token"]),
        authentication: auth,
    })
}

/// A 0.3 send (JSON-RPC `MessageSendParams` or REST `SendMessageRequest`) as the 1.0 request.
/// JSON-RPC blocks unless `configuration.blocking` is false; in REST's ProtoJSON a false
/// `blocking` is the proto default and so is left out: a configuration without `blocking: true`
/// does not block (as 0.3 servers read it).
pub fn send_in(p: &Value, shape: Shape) -> Result<SendMessageRequest, A2aError> {
    let message =
        message_in(member(p, &["message", "request"]).ok_or_else(|| bad("message is required"))?)?;
    let configuration = match member(p, &["configuration"]) {
        None => None,
        Some(c) => Some(SendMessageConfiguration {
            accepted_output_modes: member(c, &["acceptedOutputModes", "accepted_output_modes"])
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            task_push_notification_config: member(
                c,
                &[
                    "pushNotificationConfig",
                    "pushNotification",
                    "push_notification",
                ],
            )
            .map(|x| push_in(x, None))
            .transpose()?,
            history_length: member(c, &["historyLength", "history_length"])
                .and_then(Value::as_i64)
                .map(|n| n.clamp(i32::MIN as i64, i32::MAX as i64) as i32),
            return_immediately: match (shape, member(c, &["blocking"]).and_then(Value::as_bool)) {
                (_, Some(b)) => !b,
                (Shape::Rpc, None) => false,
                (Shape::Proto, None) => true,
            },
        }),
    };
    Ok(SendMessageRequest {
        tenant: None,
        message,
        configuration,
        metadata: metadata_in(p)?,
    })
}

// ------------------------------------------------------------------ the card

/// The card as JSON with the 0.3 fields added beside the 1.0 ones (a 0.3 client reads `url`,
/// `preferredTransport`, `additionalInterfaces`, `protocolVersion`, `security`,
/// `supportsAuthenticatedExtendedCard` and a `type` in each security scheme; a 1.0 client
/// ignores them). The 0.3 entries of `supportedInterfaces` are on every card
/// ([`interfaces_03`]).
pub fn card_json(card: &crate::a2a::AgentCard) -> Value {
    let mut v = serde_json::to_value(card).unwrap_or(Value::Null);
    let json_ifaces: Vec<(String, String)> = card
        .supported_interfaces
        .iter()
        .filter(|i| {
            (i.protocol_binding == JSONRPC_BINDING || i.protocol_binding == REST_BINDING)
                && i.protocol_version == crate::a2a::PROTOCOL_VERSION
        })
        .map(|i| (i.protocol_binding.clone(), i.url.clone()))
        .collect();
    let Some(o) = v.as_object_mut() else {
        return v;
    };
    if let Some((_, url)) = json_ifaces.iter().find(|(b, _)| b == JSONRPC_BINDING) {
        o.insert("url".into(), json!(url));
        o.insert("preferredTransport".into(), json!(JSONRPC_BINDING));
    }
    o.insert(
        "additionalInterfaces".into(),
        Value::Array(
            json_ifaces
                .iter()
                .map(|(b, u)| json!({"url": u, "transport": b}))
                .collect(),
        ),
    );
    o.insert("protocolVersion".into(), json!(VERSION_03));
    o.insert(
        "supportsAuthenticatedExtendedCard".into(),
        json!(card.capabilities.extended_agent_card),
    );
    o.insert(
        "security".into(),
        Value::Array(
            card.security_requirements
                .iter()
                .map(|r| {
                    Value::Object(
                        r.schemes
                            .iter()
                            .map(|(k, l)| (k.clone(), json!(l.list)))
                            .collect(),
                    )
                })
                .collect(),
        ),
    );
    if let Some(Value::Object(schemes)) = o.get_mut("securitySchemes") {
        for (name, scheme) in schemes.iter_mut() {
            if let (Some(sch), Some(card_scheme)) =
                (scheme.as_object_mut(), card.security_schemes.get(name))
            {
                if let Some(h) = &card_scheme.http_auth_security_scheme {
                    sch.insert("type".into(), json!("http"));
                    sch.insert("scheme".into(), json!(h.scheme.to_ascii_lowercase()));
                } else if let Some(o) = &card_scheme.open_id_connect_security_scheme {
                    sch.insert("type".into(), json!("openIdConnect"));
                    sch.insert("openIdConnectUrl".into(), json!(o.open_id_connect_url));
                } else if card_scheme.mtls_security_scheme.is_some() {
                    sch.insert("type".into(), json!("mutualTLS"));
                }
            }
        }
    }
    v
}

/// One `0.3.0` interface per 1.0 JSON interface (same URL): how a card says 0.3 is served there.
pub fn interfaces_03(ifaces: &[crate::a2a::AgentInterface]) -> Vec<crate::a2a::AgentInterface> {
    ifaces
        .iter()
        .filter(|i| i.protocol_binding == JSONRPC_BINDING || i.protocol_binding == REST_BINDING)
        .map(|i| crate::a2a::AgentInterface {
            url: i.url.clone(),
            protocol_binding: i.protocol_binding.clone(),
            protocol_version: VERSION_03.into(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_shapes_carry_kind_and_kebab_states() {
        assert_eq!(
            state_out(TaskState::InputRequired, Shape::Rpc),
            "input-required"
        );
        assert_eq!(state_out(TaskState::Canceled, Shape::Rpc), "canceled");
        assert_eq!(
            state_out(TaskState::Canceled, Shape::Proto),
            "TASK_STATE_CANCELLED"
        );
        let m = Message::agent_text("t", "c", "hi", None);
        let v = message_out(&m, Shape::Rpc);
        assert_eq!(v["kind"], "message");
        assert_eq!(v["role"], "agent");
        assert_eq!(v["parts"][0], json!({"kind": "text", "text": "hi"}));
        let p = message_out(&m, Shape::Proto);
        assert_eq!(p["role"], "ROLE_AGENT");
        assert_eq!(p["content"][0], json!({"text": "hi"}));
        assert!(p.get("kind").is_none());
    }

    #[test]
    fn a_captured_0_3_send_parses_into_the_1_0_request() {
        let req = send_in(&json!({
            "message": {"kind": "message", "messageId": "m1", "role": "user",
                        "parts": [{"kind": "text", "text": "hi"},
                                  {"kind": "file", "file": {"uri": "https://x/f.txt", "mimeType": "text/plain", "name": "f.txt"}},
                                  {"kind": "data", "data": {"k": 1}}]},
            "configuration": {"blocking": false, "historyLength": 2,
                              "pushNotificationConfig": {"url": "http://example.com/h", "token": "t",
                                                         "authentication": {"schemes": ["Bearer"], "credentials": "c"}}}
        }), Shape::Rpc)
        .unwrap();
        assert_eq!(req.message.role, Role::User);
        assert_eq!(
            req.message.parts[1].content,
            PartContent::Url("https://x/f.txt".into())
        );
        assert_eq!(
            req.message.parts[2].content,
            PartContent::Data(json!({"k": 1}))
        );
        let c = req.configuration.unwrap();
        assert!(c.return_immediately);
        assert_eq!(c.history_length, Some(2));
        let push = c.task_push_notification_config.unwrap();
        assert_eq!(push.authentication.unwrap().scheme, "Bearer");
        // The REST (0.3 ProtoJSON, proto field names) form of the same.
        let req = send_in(&json!({
            "request": {"message_id": "m2", "role": "ROLE_USER",
                        "content": [{"text": "a"}, {"file": {"file_with_bytes": "dGNr", "mime_type": "text/plain"}},
                                    {"data": {"data": {"k": 2}}}]},
            "configuration": {"blocking": true}
        }), Shape::Proto)
        .unwrap();
        assert_eq!(req.message.message_id, "m2");
        assert_eq!(
            req.message.parts[1].content,
            PartContent::Raw("dGNr".into())
        );
        assert_eq!(
            req.message.parts[2].content,
            PartContent::Data(json!({"k": 2}))
        );
        assert!(!req.configuration.unwrap().return_immediately);
        assert!(
            send_in(
                &json!({"message": {"messageId": "m", "role": "robot", "parts": []}}),
                Shape::Rpc
            )
            .is_err()
        );
        assert!(send_in(&json!({"message": {"messageId": "m", "role": "user", "parts": [{"kind": "file", "file": {}}]}}), Shape::Rpc).is_err());
        // REST: a configuration without `blocking` (the proto default, false) does not block.
        let r = send_in(
            &json!({"message": {"messageId": "m", "role": "ROLE_USER", "content": [{"text": "x"}]},
                                "configuration": {"historyLength": 1}}),
            Shape::Proto,
        )
        .unwrap();
        assert!(r.configuration.unwrap().return_immediately);
    }

    #[test]
    fn status_events_say_final_at_terminal_and_interrupted_states() {
        let ev = |state| {
            StreamResponse::StatusUpdate(crate::a2a::TaskStatusUpdateEvent {
                task_id: "t".into(),
                context_id: "c".into(),
                status: crate::a2a::TaskStatus {
                    state,
                    message: None,
                    timestamp: None,
                },
                metadata: None,
            })
        };
        let w = event_out(&ev(TaskState::Working), Shape::Rpc);
        assert_eq!(
            (w["kind"].as_str(), w["final"].as_bool()),
            (Some("status-update"), Some(false))
        );
        assert_eq!(
            event_out(&ev(TaskState::Completed), Shape::Rpc)["final"],
            true
        );
        assert_eq!(
            event_out(&ev(TaskState::InputRequired), Shape::Proto)["statusUpdate"]["final"],
            true
        );
    }
}
