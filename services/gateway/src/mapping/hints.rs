//! Warden's hints in a chunk's `_meta`: `warden.artifact` (a named text, file, url or data
//! artifact), `warden.a2a = "message"` or `"reject"`, read bounded; and the A2A part a hinted chunk
//! becomes.
//!
//! Owns: reading a hint. Must never: fail on a malformed one (it is agent output: the chunk is
//! plain answer text then).

use super::*;

/// Longest `_meta` the gateway reads hints from; a bigger one is treated as having none.
pub const MAX_HINT_META_BYTES: usize = 64 * 1024;

/// Longest artifact id, name, filename or media type taken from a hint.
pub(super) const MAX_HINT_FIELD: usize = 256;

/// The content kind a `warden.artifact` hint asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactKind {
    /// A text part.
    Text,
    /// A file part with inline bytes (`raw`, base64 of the chunk's text).
    File,
    /// A file part by reference (`url`, the chunk's text).
    Url,
    /// A data part (the chunk's text parsed as JSON).
    Data,
}

/// `_meta.warden.artifact` of a message chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactHint {
    pub artifact_id: String,
    pub name: Option<String>,
    pub kind: ArtifactKind,
    pub append: bool,
    pub last_chunk: Option<bool>,
    pub filename: Option<String>,
    pub media_type: Option<String>,
}

/// What warden's hints in a chunk's `_meta` say about the chunk.
#[derive(Debug, Clone, PartialEq)]
pub enum ChunkHint {
    /// No (usable) hint: the chunk is answer text.
    None,
    /// `warden.artifact`: the chunk is (part of) this artifact.
    Artifact(ArtifactHint),
    /// `warden.a2a = "message"`: the chunk is the agent's direct reply.
    Message,
    /// `warden.a2a = "reject"`: the chunk explains that the agent rejects the task.
    Reject,
}

fn hint_str(v: &Value, key: &str) -> Result<Option<String>, ()> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s))
            if !s.is_empty() && s.len() <= MAX_HINT_FIELD && !s.chars().any(char::is_control) =>
        {
            Ok(Some(s.clone()))
        }
        Some(_) => Err(()),
    }
}

fn hint_bool(v: &Value, key: &str) -> Result<Option<bool>, ()> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(()),
    }
}

impl ChunkHint {
    /// Reads the hints of `TextChunk.meta_json`. Anything malformed (bad JSON, wrong types, an
    /// unknown kind, over-long fields) is no hint at all, so the text still reaches the caller.
    pub fn parse(meta_json: &str) -> Self {
        if meta_json.is_empty() || meta_json.len() > MAX_HINT_META_BYTES {
            return Self::None;
        }
        let Ok(meta) = serde_json::from_str::<Value>(meta_json) else {
            return Self::None;
        };
        let Some(w) = meta.get(META_KEY) else {
            return Self::None;
        };
        if let Some(a) = w.get("artifact") {
            return Self::artifact(a).map_or(Self::None, Self::Artifact);
        }
        match w.get("a2a").and_then(Value::as_str) {
            Some("message") => Self::Message,
            Some("reject") => Self::Reject,
            _ => Self::None,
        }
    }

    fn artifact(a: &Value) -> Option<ArtifactHint> {
        let kind = match a.get("kind").and_then(Value::as_str).unwrap_or("text") {
            "text" => ArtifactKind::Text,
            "file" => ArtifactKind::File,
            "url" | "file_url" => ArtifactKind::Url,
            "data" => ArtifactKind::Data,
            _ => return None,
        };
        Some(ArtifactHint {
            artifact_id: hint_str(a, "artifactId").ok()??,
            name: hint_str(a, "name").ok()?,
            kind,
            append: hint_bool(a, "append").ok()?.unwrap_or(false),
            last_chunk: hint_bool(a, "lastChunk").ok()?,
            filename: hint_str(a, "filename").ok()?,
            media_type: hint_str(a, "mediaType").ok()?,
        })
    }
}

/// Standard base64 (RFC 4648, padded), for `raw` file parts.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [
            group[0],
            group.get(1).copied().unwrap_or(0),
            group.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= group.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The A2A part a hinted chunk becomes. Content that does not fit the kind (a data chunk that
/// is not JSON, a URL with spaces) falls back to a text part rather than being dropped.
pub(super) fn hinted_part(hint: &ArtifactHint, text: &str) -> Part {
    let content = match hint.kind {
        ArtifactKind::Text => PartContent::Text(text.to_string()),
        ArtifactKind::File => PartContent::Raw(base64(text.as_bytes())),
        ArtifactKind::Url => {
            let url = text.trim();
            if url.is_empty() || url.chars().any(char::is_whitespace) {
                PartContent::Text(text.to_string())
            } else {
                PartContent::Url(url.to_string())
            }
        }
        ArtifactKind::Data => match serde_json::from_str::<Value>(text) {
            Ok(v) => PartContent::Data(v),
            Err(_) => PartContent::Text(text.to_string()),
        },
    };
    let file_like = matches!(content, PartContent::Raw(_) | PartContent::Url(_));
    Part {
        content,
        metadata: None,
        filename: if file_like {
            hint.filename.clone()
        } else {
            None
        },
        media_type: hint.media_type.clone(),
    }
}
