//! From the wire request to the rules' input, refusing what is malformed.

use std::path::PathBuf;

use warden_proto::v1 as pb;
use warden_rules::{
    Boundary, DecisionInput, OfferedOption, OptionKind, Profile, Subject, ToolCall, ToolKind,
};

use crate::DecideSection;

pub use crate::bounds::Malformed;

fn bad(rule: &'static str, reason: impl Into<String>) -> Malformed {
    Malformed {
        rule,
        reason: reason.into(),
    }
}

/// Converts and checks a request against the limits.
pub fn to_input(
    req: &pb::DecideRequest,
    limits: &DecideSection,
) -> Result<DecisionInput, Malformed> {
    let Some(tool) = req.tool_call.as_ref() else {
        return Err(bad(
            "request.malformed.no-tool-call",
            "the request carries no tool call, so there is nothing to judge",
        ));
    };
    let Some(b) = req.boundary.as_ref() else {
        return Err(bad(
            "request.malformed.no-boundary",
            "the request carries no session boundary",
        ));
    };
    let Some(profile) = Profile::from_wire(b.profile) else {
        return Err(bad(
            "request.malformed.profile",
            format!("unknown boundary profile value {}", b.profile),
        ));
    };
    // Sizes and nesting, checked the way the caller checks them before it sends a request.
    crate::bounds::check(req, &limits.limits())?;
    let mut seen = std::collections::HashSet::new();
    for o in &req.options {
        if o.id.is_empty() {
            return Err(bad(
                "request.malformed.option-id",
                "an offered option has an empty id",
            ));
        }
        if !seen.insert(o.id.as_str()) {
            return Err(bad(
                "request.malformed.option-id",
                format!("option id {:?} is offered twice", o.id),
            ));
        }
    }
    let subject = req.subject.clone().unwrap_or_default();
    Ok(DecisionInput {
        subject: Subject {
            principal: subject.principal,
            agent: subject.agent,
            verb: subject.verb,
            groups: subject.groups,
        },
        boundary: Boundary {
            root: PathBuf::from(&b.root),
            owned: b.owned,
            allow_execute: b.allow_execute,
            profile,
        },
        tool: ToolCall {
            kind_raw: tool.kind.clone(),
            kind: ToolKind::parse(&tool.kind),
            title: tool.title.clone(),
            raw_input_json: tool.raw_input_json.clone(),
            locations: tool
                .locations
                .iter()
                .map(|l| PathBuf::from(&l.path))
                .collect(),
        },
        options: req
            .options
            .iter()
            .map(|o| OfferedOption {
                id: o.id.clone(),
                name: o.name.clone(),
                kind: OptionKind::parse(&o.kind),
            })
            .collect(),
    })
}

/// What the request asks to do, as a decision of it is bound to it (the digest every party
/// computes alike: `warden_rules::JudgedAction`). A request without a tool call judged nothing.
pub fn judged(req: &pb::DecideRequest) -> pb::JudgedAction {
    let Some(tool) = req.tool_call.as_ref() else {
        return pb::JudgedAction::default();
    };
    let root = req.boundary.as_ref().map(|b| b.root.as_str()).unwrap_or("");
    let a = warden_rules::JudgedAction::of(
        std::path::Path::new(root),
        &tool.kind,
        &tool.title,
        tool.locations.iter().map(|l| l.path.as_str()),
        &tool.raw_input_json,
    );
    let digest = a.digest();
    pb::JudgedAction {
        kind: a.kind,
        locations: a.locations,
        argv: a.argv,
        cwd: a.cwd,
        content_sha256: a.content_sha256,
        digest,
    }
}

/// The wire form of why a decision ends the turn.
pub fn end_turn_reason(r: Option<warden_rules::EndTurnReason>) -> pb::EndTurnReason {
    match r {
        None => pb::EndTurnReason::Unspecified,
        Some(warden_rules::EndTurnReason::PermissionPromptUnavailable) => {
            pb::EndTurnReason::PermissionPromptUnavailable
        }
    }
}

pub fn verdict(v: warden_rules::Verdict) -> pb::Verdict {
    match v {
        warden_rules::Verdict::Allow => pb::Verdict::Allow,
        warden_rules::Verdict::Deny => pb::Verdict::Deny,
        warden_rules::Verdict::Escalate => pb::Verdict::Escalate,
    }
}
