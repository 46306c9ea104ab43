//! The size bounds of a Decide request, checked alike by the caller before it sends one (the
//! supervisor refuses an oversized permission request itself, so it never reaches the stream
//! every conversation's decisions share) and by the implementation that receives one (a request
//! over them is malformed and denied). One function for both sides, so they cannot disagree.
//!
//! Must never: parse the raw input to measure it (a deeply nested text is exactly what must not
//! be handed to a recursive parser), or keep any part of an oversized request beyond its size
//! and digest.

use prost::Message;
use warden_proto::limits;
use warden_proto::v1 as pb;

/// Why a request cannot be decided on its merits; it is denied with this rule and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    pub rule: &'static str,
    pub reason: String,
}

/// The limits a request is held to (`[decide]` of warden-policy, stated in its
/// `PolicyDescription`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_raw_input_bytes: u64,
    pub max_locations: u64,
    pub max_options: u64,
    pub max_title_bytes: u64,
    pub max_json_depth: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_raw_input_bytes: limits::DEFAULT_MAX_RAW_INPUT_BYTES,
            max_locations: limits::DEFAULT_MAX_LOCATIONS,
            max_options: limits::DEFAULT_MAX_OPTIONS,
            max_title_bytes: limits::DEFAULT_MAX_TITLE_BYTES,
            max_json_depth: limits::DEFAULT_MAX_JSON_DEPTH,
        }
    }
}

/// Room left in [`limits::MAX_DECIDE_MESSAGE_BYTES`] for what the caller adds after the check
/// (the deadline) and for the message's framing.
const MESSAGE_MARGIN: usize = 1024;

impl Limits {
    /// What a description states; a zero (not stated) is the contract's default.
    pub fn from_description(d: &pb::PolicyDescription) -> Self {
        let or = |v: u64, default: u64| if v == 0 { default } else { v };
        let def = Limits::default();
        Limits {
            max_raw_input_bytes: or(d.max_raw_input_bytes, def.max_raw_input_bytes),
            max_locations: or(d.max_locations, def.max_locations),
            max_options: or(d.max_options, def.max_options),
            max_title_bytes: or(d.max_title_bytes, def.max_title_bytes),
            max_json_depth: or(d.max_json_depth, def.max_json_depth),
        }
    }

    /// Writes these limits into a description (what a `Describe` answers).
    pub fn describe(&self, d: &mut pb::PolicyDescription) {
        d.max_raw_input_bytes = self.max_raw_input_bytes;
        d.max_locations = self.max_locations;
        d.max_options = self.max_options;
        d.max_title_bytes = self.max_title_bytes;
        d.max_json_depth = self.max_json_depth;
    }
}

fn over(rule: &'static str, what: &str, n: usize, limit: u64) -> Malformed {
    Malformed {
        rule,
        reason: format!("{what} is {n}, over the limit of {limit}"),
    }
}

/// Checks `req` against `limits` and against the message bound of the contract; the first bound
/// it breaks, as the malformed-request rule both sides answer with.
pub fn check(req: &pb::DecideRequest, limits: &Limits) -> Result<(), Malformed> {
    if let Some(tool) = req.tool_call.as_ref() {
        let raw = tool.raw_input_json.len();
        if raw as u64 > limits.max_raw_input_bytes {
            return Err(over(
                "request.malformed.raw-input-too-large",
                "the raw input (bytes)",
                raw,
                limits.max_raw_input_bytes,
            ));
        }
        let title = tool.title.len();
        if title as u64 > limits.max_title_bytes {
            return Err(over(
                "request.malformed.title-too-large",
                "the tool call's title (bytes)",
                title,
                limits.max_title_bytes,
            ));
        }
        if tool.locations.len() as u64 > limits.max_locations {
            return Err(over(
                "request.malformed.too-many-locations",
                "the number of locations",
                tool.locations.len(),
                limits.max_locations,
            ));
        }
        let depth = json_depth(&tool.raw_input_json);
        if depth as u64 > limits.max_json_depth {
            return Err(over(
                "request.malformed.too-deeply-nested",
                "the raw input's nesting depth",
                depth,
                limits.max_json_depth,
            ));
        }
    }
    if let Some(subject) = req.subject.as_ref() {
        if subject.groups.len() > limits::MAX_SUBJECT_GROUPS {
            return Err(over(
                "request.malformed.too-many-groups",
                "the number of the subject's groups",
                subject.groups.len(),
                limits::MAX_SUBJECT_GROUPS as u64,
            ));
        }
        if let Some(g) = subject
            .groups
            .iter()
            .find(|g| g.len() > limits::MAX_GROUP_BYTES)
        {
            return Err(over(
                "request.malformed.group-too-large",
                "a group name (bytes)",
                g.len(),
                limits::MAX_GROUP_BYTES as u64,
            ));
        }
    }
    if req.options.len() as u64 > limits.max_options {
        return Err(over(
            "request.malformed.too-many-options",
            "the number of options",
            req.options.len(),
            limits.max_options,
        ));
    }
    let size = req.encoded_len();
    let bound = limits::MAX_DECIDE_MESSAGE_BYTES - MESSAGE_MARGIN;
    if size > bound {
        return Err(over(
            "request.malformed.request-too-large",
            "the encoded request (bytes)",
            size,
            bound as u64,
        ));
    }
    Ok(())
}

/// The deepest nesting of arrays and objects in a JSON text, counted without parsing it
/// (brackets inside strings, escapes included, do not count). Text that is not JSON is measured
/// the same way; whether it parses is the rules' business.
pub fn json_depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(raw: &str) -> pb::DecideRequest {
        pb::DecideRequest {
            request_id: "r".into(),
            tool_call: Some(pb::ToolCall {
                kind: "execute".into(),
                raw_input_json: raw.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn depth_counts_brackets_outside_strings_only() {
        assert_eq!(json_depth(""), 0);
        assert_eq!(json_depth("{}"), 1);
        assert_eq!(json_depth(r#"{"a":[1,{"b":[]}]}"#), 4);
        assert_eq!(json_depth(r#"{"a":"[[[[{{{{\"]]]"}"#), 1);
        assert_eq!(json_depth(&"[".repeat(10_000)), 10_000);
    }

    #[test]
    fn each_bound_has_its_rule() {
        let l = Limits::default();
        assert!(check(&req(r#"{"command":["ls"]}"#), &l).is_ok());
        let big = format!(r#"{{"command":"{}"}}"#, "x".repeat(300 * 1024));
        assert_eq!(
            check(&req(&big), &l).map_err(|m| m.rule),
            Err("request.malformed.raw-input-too-large")
        );
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        assert_eq!(
            check(&req(&deep), &l).map_err(|m| m.rule),
            Err("request.malformed.too-deeply-nested")
        );
        let ok = format!("{}{}", "[".repeat(64), "]".repeat(64));
        assert!(check(&req(&ok), &l).is_ok());
        let mut r = req("{}");
        if let Some(t) = r.tool_call.as_mut() {
            t.title = "t".repeat(65 * 1024);
        }
        assert_eq!(
            check(&r, &l).map_err(|m| m.rule),
            Err("request.malformed.title-too-large")
        );
        // Within every field's limit, but not within the message bound (many long paths).
        let mut r = req("{}");
        if let Some(t) = r.tool_call.as_mut() {
            t.locations = (0..200)
                .map(|i| pb::Location {
                    path: format!("/{i}/{}", "p".repeat(30_000)),
                    line: None,
                })
                .collect();
        }
        let m = check(&r, &l).err();
        assert_eq!(
            m.as_ref().map(|m| m.rule),
            Some("request.malformed.request-too-large"),
            "{m:?}"
        );
        // The subject's groups: how many, and how long each.
        let mut r = req("{}");
        r.subject = Some(pb::Subject {
            groups: (0..=limits::MAX_SUBJECT_GROUPS)
                .map(|i| format!("g{i}"))
                .collect(),
            ..Default::default()
        });
        assert_eq!(
            check(&r, &l).map_err(|m| m.rule),
            Err("request.malformed.too-many-groups")
        );
        r.subject = Some(pb::Subject {
            groups: vec!["ops".into(), "g".repeat(limits::MAX_GROUP_BYTES + 1)],
            ..Default::default()
        });
        assert_eq!(
            check(&r, &l).map_err(|m| m.rule),
            Err("request.malformed.group-too-large")
        );
        r.subject = Some(pb::Subject {
            groups: vec!["ops".into(); limits::MAX_SUBJECT_GROUPS],
            ..Default::default()
        });
        assert!(check(&r, &l).is_ok());
    }

    #[test]
    fn a_description_states_the_limits_and_zero_is_the_default() {
        let l = Limits {
            max_raw_input_bytes: 1,
            max_locations: 2,
            max_options: 3,
            max_title_bytes: 4,
            max_json_depth: 5,
        };
        let mut d = pb::PolicyDescription::default();
        assert_eq!(Limits::from_description(&d), Limits::default());
        l.describe(&mut d);
        assert_eq!(Limits::from_description(&d), l);
    }
}
