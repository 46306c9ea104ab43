//! Conversions between the gateway's A2A model (`a2a.rs`, the ProtoJSON form the JSON bindings
//! speak) and the generated `lf.a2a.v1` protobuf messages the gRPC binding speaks. Pure: no I/O.
//!
//! Both are the same schema (`a2a.proto`), so every conversion is field by field; the only
//! representation changes are `google.protobuf.Struct`/`Value` ↔ JSON, `Timestamp` ↔ RFC 3339
//! text, enum numbers ↔ proto names, and `Part.raw` bytes ↔ base64 text.

use base64::Engine;
use prost_types::value::Kind;
use serde_json::{Map, Value};
use warden_proto::a2a::v1 as pb;

use crate::a2a::{
    AgentCard, Artifact, AuthenticationInfo, ListTasksRequest, ListTasksResponse, Message,
    Metadata, Part, PartContent, Role, SendMessageConfiguration, SendMessageRequest,
    StreamResponse, Task, TaskArtifactUpdateEvent, TaskPushNotificationConfig, TaskState,
    TaskStatus, TaskStatusUpdateEvent,
};
use crate::error::A2aError;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

// ------------------------------------------------------------------ JSON <-> google.protobuf

/// JSON → `google.protobuf.Value`.
pub fn value_to_pb(v: &Value) -> prost_types::Value {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(value_to_pb).collect(),
        }),
        Value::Object(o) => Kind::StructValue(map_to_struct(o)),
    };
    prost_types::Value { kind: Some(kind) }
}

/// `google.protobuf.Value` → JSON (a whole number stays an integer in JSON).
pub fn value_from_pb(v: &prost_types::Value) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() < 9.0e15 {
                Value::from(*n as i64)
            } else {
                serde_json::Number::from_f64(*n)
                    .map(Value::Number)
                    .unwrap_or(Value::Null)
            }
        }
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_from_pb).collect()),
        Some(Kind::StructValue(s)) => Value::Object(struct_to_map(s)),
    }
}

pub fn map_to_struct(m: &Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: m.iter().map(|(k, v)| (k.clone(), value_to_pb(v))).collect(),
    }
}

pub fn struct_to_map(s: &prost_types::Struct) -> Map<String, Value> {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value_from_pb(v)))
        .collect()
}

fn meta_to_pb(m: &Option<Metadata>) -> Option<prost_types::Struct> {
    m.as_ref().map(map_to_struct)
}

fn meta_from_pb(s: &Option<prost_types::Struct>) -> Option<Metadata> {
    s.as_ref().map(struct_to_map)
}

/// RFC 3339 text (as the gateway writes it) → `Timestamp`; None when it does not parse.
pub fn timestamp_to_pb(s: &str) -> Option<prost_types::Timestamp> {
    let micros = crate::time::parse_rfc3339(s)?;
    Some(prost_types::Timestamp {
        seconds: micros.div_euclid(1_000_000),
        nanos: (micros.rem_euclid(1_000_000) * 1000) as i32,
    })
}

/// `Timestamp` → RFC 3339 text.
pub fn timestamp_from_pb(t: &prost_types::Timestamp) -> String {
    let micros = t
        .seconds
        .saturating_mul(1_000_000)
        .saturating_add(i64::from(t.nanos) / 1000);
    crate::time::format_micros(micros)
}

fn opt(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

// ------------------------------------------------------------------ enums

pub fn state_to_pb(s: TaskState) -> i32 {
    pb::TaskState::from_str_name(s.as_str())
        .map(|s| s as i32)
        .unwrap_or(0)
}

pub fn state_from_pb(n: i32) -> TaskState {
    pb::TaskState::try_from(n)
        .ok()
        .and_then(|s| TaskState::parse(s.as_str_name()))
        .unwrap_or(TaskState::Unspecified)
}

fn role_to_pb(r: Role) -> i32 {
    match r {
        Role::Unspecified => pb::Role::Unspecified as i32,
        Role::User => pb::Role::User as i32,
        Role::Agent => pb::Role::Agent as i32,
    }
}

fn role_from_pb(n: i32) -> Role {
    match pb::Role::try_from(n) {
        Ok(pb::Role::User) => Role::User,
        Ok(pb::Role::Agent) => Role::Agent,
        _ => Role::Unspecified,
    }
}

// ------------------------------------------------------------------ the model

pub fn part_to_pb(p: &Part) -> pb::Part {
    use pb::part::Content;
    let content = match &p.content {
        PartContent::Text(t) => Content::Text(t.clone()),
        // Base64 as the JSON client sent it; text that is not base64 is carried as its bytes.
        PartContent::Raw(r) => Content::Raw(
            b64()
                .decode(r.as_bytes())
                .unwrap_or_else(|_| r.as_bytes().to_vec()),
        ),
        PartContent::Url(u) => Content::Url(u.clone()),
        PartContent::Data(v) => Content::Data(value_to_pb(v)),
    };
    pb::Part {
        metadata: meta_to_pb(&p.metadata),
        filename: p.filename.clone().unwrap_or_default(),
        media_type: p.media_type.clone().unwrap_or_default(),
        content: Some(content),
    }
}

pub fn part_from_pb(p: &pb::Part) -> Result<Part, A2aError> {
    use pb::part::Content;
    let content = match &p.content {
        Some(Content::Text(t)) => PartContent::Text(t.clone()),
        Some(Content::Raw(b)) => PartContent::Raw(b64().encode(b)),
        Some(Content::Url(u)) => PartContent::Url(u.clone()),
        Some(Content::Data(v)) => PartContent::Data(value_from_pb(v)),
        None => {
            return Err(A2aError::InvalidParams(
                "a part needs one of text, raw, url or data".into(),
            ));
        }
    };
    Ok(Part {
        content,
        metadata: meta_from_pb(&p.metadata),
        filename: opt(&p.filename),
        media_type: opt(&p.media_type),
    })
}

pub fn message_to_pb(m: &Message) -> pb::Message {
    pb::Message {
        message_id: m.message_id.clone(),
        context_id: m.context_id.clone().unwrap_or_default(),
        task_id: m.task_id.clone().unwrap_or_default(),
        role: role_to_pb(m.role),
        parts: m.parts.iter().map(part_to_pb).collect(),
        metadata: meta_to_pb(&m.metadata),
        extensions: m.extensions.clone(),
        reference_task_ids: m.reference_task_ids.clone(),
    }
}

pub fn message_from_pb(m: &pb::Message) -> Result<Message, A2aError> {
    Ok(Message {
        message_id: m.message_id.clone(),
        context_id: opt(&m.context_id),
        task_id: opt(&m.task_id),
        role: role_from_pb(m.role),
        parts: m.parts.iter().map(part_from_pb).collect::<Result<_, _>>()?,
        metadata: meta_from_pb(&m.metadata),
        extensions: m.extensions.clone(),
        reference_task_ids: m.reference_task_ids.clone(),
    })
}

pub fn status_to_pb(s: &TaskStatus) -> pb::TaskStatus {
    pb::TaskStatus {
        state: state_to_pb(s.state),
        message: s.message.as_ref().map(message_to_pb),
        timestamp: s.timestamp.as_deref().and_then(timestamp_to_pb),
    }
}

pub fn artifact_to_pb(a: &Artifact) -> pb::Artifact {
    pb::Artifact {
        artifact_id: a.artifact_id.clone(),
        name: a.name.clone().unwrap_or_default(),
        description: a.description.clone().unwrap_or_default(),
        parts: a.parts.iter().map(part_to_pb).collect(),
        metadata: meta_to_pb(&a.metadata),
        extensions: a.extensions.clone(),
    }
}

pub fn task_to_pb(t: &Task) -> pb::Task {
    pb::Task {
        id: t.id.clone(),
        context_id: t.context_id.clone(),
        status: Some(status_to_pb(&t.status)),
        artifacts: t.artifacts.iter().map(artifact_to_pb).collect(),
        history: t.history.iter().map(message_to_pb).collect(),
        metadata: meta_to_pb(&t.metadata),
    }
}

fn status_update_to_pb(e: &TaskStatusUpdateEvent) -> pb::TaskStatusUpdateEvent {
    pb::TaskStatusUpdateEvent {
        task_id: e.task_id.clone(),
        context_id: e.context_id.clone(),
        status: Some(status_to_pb(&e.status)),
        metadata: meta_to_pb(&e.metadata),
    }
}

fn artifact_update_to_pb(e: &TaskArtifactUpdateEvent) -> pb::TaskArtifactUpdateEvent {
    pb::TaskArtifactUpdateEvent {
        task_id: e.task_id.clone(),
        context_id: e.context_id.clone(),
        artifact: Some(artifact_to_pb(&e.artifact)),
        append: e.append,
        last_chunk: e.last_chunk,
        metadata: meta_to_pb(&e.metadata),
    }
}

pub fn stream_response_to_pb(r: &StreamResponse) -> pb::StreamResponse {
    use pb::stream_response::Payload;
    let payload = match r {
        StreamResponse::Task(t) => Payload::Task(task_to_pb(t)),
        StreamResponse::Message(m) => Payload::Message(message_to_pb(m)),
        StreamResponse::StatusUpdate(e) => Payload::StatusUpdate(status_update_to_pb(e)),
        StreamResponse::ArtifactUpdate(e) => Payload::ArtifactUpdate(artifact_update_to_pb(e)),
    };
    pb::StreamResponse {
        payload: Some(payload),
    }
}

// ------------------------------------------------------------------ requests and responses

/// A gRPC SendMessageRequest as the JSON bindings' request.
pub fn send_request_from_pb(r: &pb::SendMessageRequest) -> Result<SendMessageRequest, A2aError> {
    let message = r
        .message
        .as_ref()
        .ok_or_else(|| A2aError::InvalidParams("message is required".into()))?;
    Ok(SendMessageRequest {
        tenant: opt(&r.tenant),
        message: message_from_pb(message)?,
        configuration: r.configuration.as_ref().map(|c| SendMessageConfiguration {
            accepted_output_modes: c.accepted_output_modes.clone(),
            task_push_notification_config: c
                .task_push_notification_config
                .as_ref()
                .map(push_config_from_pb),
            history_length: c.history_length,
            return_immediately: c.return_immediately,
        }),
        metadata: meta_from_pb(&r.metadata),
    })
}

/// A push config received over gRPC.
pub fn push_config_from_pb(c: &pb::TaskPushNotificationConfig) -> TaskPushNotificationConfig {
    TaskPushNotificationConfig {
        tenant: opt(&c.tenant),
        id: c.id.clone(),
        task_id: c.task_id.clone(),
        url: c.url.clone(),
        token: opt(&c.token),
        authentication: c.authentication.as_ref().map(|a| AuthenticationInfo {
            scheme: a.scheme.clone(),
            credentials: opt(&a.credentials),
        }),
    }
}

/// A push config as gRPC sends it.
pub fn push_config_to_pb(c: &TaskPushNotificationConfig) -> pb::TaskPushNotificationConfig {
    pb::TaskPushNotificationConfig {
        tenant: c.tenant.clone().unwrap_or_default(),
        id: c.id.clone(),
        task_id: c.task_id.clone(),
        url: c.url.clone(),
        token: c.token.clone().unwrap_or_default(),
        authentication: c.authentication.as_ref().map(|a| pb::AuthenticationInfo {
            scheme: a.scheme.clone(),
            credentials: a.credentials.clone().unwrap_or_default(),
        }),
    }
}

pub fn list_request_from_pb(r: &pb::ListTasksRequest) -> ListTasksRequest {
    ListTasksRequest {
        tenant: opt(&r.tenant),
        context_id: opt(&r.context_id),
        status: (r.status != 0).then(|| state_from_pb(r.status)),
        page_size: r.page_size,
        page_token: opt(&r.page_token),
        history_length: r.history_length,
        status_timestamp_after: r.status_timestamp_after.as_ref().map(timestamp_from_pb),
        include_artifacts: r.include_artifacts,
    }
}

pub fn list_response_to_pb(r: &ListTasksResponse) -> pb::ListTasksResponse {
    pb::ListTasksResponse {
        tasks: r.tasks.iter().map(task_to_pb).collect(),
        next_page_token: r.next_page_token.clone(),
        page_size: r.page_size,
        total_size: r.total_size,
    }
}

pub fn card_to_pb(c: &AgentCard) -> pb::AgentCard {
    pb::AgentCard {
        name: c.name.clone(),
        description: c.description.clone(),
        supported_interfaces: c
            .supported_interfaces
            .iter()
            .map(|i| pb::AgentInterface {
                url: i.url.clone(),
                protocol_binding: i.protocol_binding.clone(),
                tenant: String::new(),
                protocol_version: i.protocol_version.clone(),
            })
            .collect(),
        provider: c.provider.as_ref().map(|p| pb::AgentProvider {
            url: p.url.clone(),
            organization: p.organization.clone(),
        }),
        version: c.version.clone(),
        documentation_url: None,
        capabilities: Some(pb::AgentCapabilities {
            streaming: Some(c.capabilities.streaming),
            push_notifications: Some(c.capabilities.push_notifications),
            extensions: Vec::new(),
            extended_agent_card: Some(c.capabilities.extended_agent_card),
        }),
        security_schemes: c
            .security_schemes
            .iter()
            .map(|(k, s)| {
                (
                    k.clone(),
                    pb::SecurityScheme {
                        scheme: if let Some(h) = &s.http_auth_security_scheme {
                            Some(pb::security_scheme::Scheme::HttpAuthSecurityScheme(
                                pb::HttpAuthSecurityScheme {
                                    description: h.description.clone().unwrap_or_default(),
                                    scheme: h.scheme.clone(),
                                    bearer_format: String::new(),
                                },
                            ))
                        } else if let Some(o) = &s.open_id_connect_security_scheme {
                            Some(pb::security_scheme::Scheme::OpenIdConnectSecurityScheme(
                                pb::OpenIdConnectSecurityScheme {
                                    description: o.description.clone().unwrap_or_default(),
                                    open_id_connect_url: o.open_id_connect_url.clone(),
                                },
                            ))
                        } else {
                            s.mtls_security_scheme.as_ref().map(|m| {
                                pb::security_scheme::Scheme::MtlsSecurityScheme(
                                    pb::MutualTlsSecurityScheme {
                                        description: m.description.clone().unwrap_or_default(),
                                    },
                                )
                            })
                        },
                    },
                )
            })
            .collect(),
        security_requirements: c
            .security_requirements
            .iter()
            .map(|r| pb::SecurityRequirement {
                schemes: r
                    .schemes
                    .iter()
                    .map(|(k, l)| {
                        (
                            k.clone(),
                            pb::StringList {
                                list: l.list.clone(),
                            },
                        )
                    })
                    .collect(),
            })
            .collect(),
        default_input_modes: c.default_input_modes.clone(),
        default_output_modes: c.default_output_modes.clone(),
        skills: c
            .skills
            .iter()
            .map(|s| pb::AgentSkill {
                id: s.id.clone(),
                name: s.name.clone(),
                description: s.description.clone(),
                tags: s.tags.clone(),
                examples: s.examples.clone(),
                input_modes: Vec::new(),
                output_modes: Vec::new(),
                security_requirements: Vec::new(),
            })
            .collect(),
        signatures: Vec::new(),
        icon_url: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_values_survive_the_round_trip_through_struct() {
        let v = json!({"a": 1, "b": [true, null, "x", 2.5], "c": {"d": -3}});
        let Value::Object(m) = &v else { unreachable!() };
        assert_eq!(Value::Object(struct_to_map(&map_to_struct(m))), v);
    }

    #[test]
    fn timestamps_round_trip_at_microsecond_precision() {
        let s = crate::time::format_micros(1_764_000_000_123_456);
        let t = timestamp_to_pb(&s).unwrap();
        assert_eq!(t.nanos, 123_456_000);
        assert_eq!(timestamp_from_pb(&t), s);
        assert!(timestamp_to_pb("yesterday").is_none());
    }

    #[test]
    fn parts_keep_their_kind_and_raw_bytes_are_base64_on_the_json_side() {
        let raw = Part {
            content: PartContent::Raw("dGNr".into()),
            metadata: None,
            filename: Some("output.txt".into()),
            media_type: Some("text/plain".into()),
        };
        let p = part_to_pb(&raw);
        assert_eq!(p.content, Some(pb::part::Content::Raw(b"tck".to_vec())));
        assert_eq!(part_from_pb(&p).unwrap(), raw);
        let data = Part::data(json!({"key": "value", "count": 42}));
        assert_eq!(part_from_pb(&part_to_pb(&data)).unwrap(), data);
        assert!(part_from_pb(&pb::Part::default()).is_err());
    }

    #[test]
    fn states_map_by_their_proto_names() {
        for s in [
            TaskState::Submitted,
            TaskState::Working,
            TaskState::InputRequired,
            TaskState::Completed,
            TaskState::Canceled,
            TaskState::Failed,
            TaskState::Rejected,
            TaskState::AuthRequired,
        ] {
            assert_eq!(state_from_pb(state_to_pb(s)), s);
        }
        assert_eq!(state_from_pb(999), TaskState::Unspecified);
    }

    #[test]
    fn a_send_request_without_a_message_is_invalid_params() {
        assert!(matches!(
            send_request_from_pb(&pb::SendMessageRequest::default()),
            Err(A2aError::InvalidParams(_))
        ));
    }
}
