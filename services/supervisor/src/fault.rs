//! Turn and start-up faults as the typed `pb::FaultClass` (what programs act on) with the words
//! for people (`Fault.class`), written once, and the gRPC status that carries a refused request's
//! fault as its binary detail (so the gateway never parses a message text).

use prost::Message;
use warden_proto::v1 as pb;

/// The words for a class, as logs, incidents and health records have always spelled them.
pub fn name(class: pb::FaultClass) -> &'static str {
    match class {
        pb::FaultClass::Unspecified => "unspecified",
        pb::FaultClass::Startup => "startup",
        pb::FaultClass::Timeout => "timeout",
        pb::FaultClass::OutputLimit => "output-limit",
        pb::FaultClass::Crash => "crash",
        pb::FaultClass::Protocol => "protocol",
        pb::FaultClass::ModeEscalation => "mode-escalation",
        pb::FaultClass::PolicyUnavailable => "policy-unavailable",
        pb::FaultClass::PromptTooLarge => "prompt-too-large",
        pb::FaultClass::PermissionPromptUnavailable => "permission-prompt-unavailable",
        pb::FaultClass::Internal => "internal",
        pb::FaultClass::Rejected => "rejected",
        pb::FaultClass::SupervisorUnavailable => "supervisor",
        pb::FaultClass::Capacity => "capacity",
        pb::FaultClass::OptionNotOffered => "option-not-offered",
        pb::FaultClass::EgressRefused => "egress-refused",
        pb::FaultClass::RequestLimit => "request-limit",
        pb::FaultClass::CellLost => "cell-lost",
        pb::FaultClass::CellRefused => "cell-refused",
    }
}

/// A fault message with both spellings of its class.
pub fn fault(class: pb::FaultClass, message: impl Into<String>) -> pb::Fault {
    pb::Fault {
        class: name(class).to_string(),
        message: message.into(),
        fault_class: class as i32,
    }
}

/// A refusal of a request for a fault: `code` and a readable message, with the typed fault as
/// the status's binary details.
pub fn status(code: tonic::Code, class: pb::FaultClass, message: String) -> tonic::Status {
    crate::metrics::refused(name(class));
    let detail = fault(class, message.clone()).encode_to_vec();
    tonic::Status::with_details(code, message, detail.into())
}

/// Like [`status`], for a message too long for a header (a start-up fault with the agent's
/// stderr): the status line says `headline`, the typed fault carries the whole `message`.
pub fn status_long(
    code: tonic::Code,
    class: pb::FaultClass,
    headline: String,
    message: String,
) -> tonic::Status {
    crate::metrics::refused(name(class));
    let detail = fault(class, message).encode_to_vec();
    tonic::Status::with_details(code, headline, detail.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_carries_its_fault_as_details() {
        let s = status(
            tonic::Code::Unavailable,
            pb::FaultClass::Startup,
            "the agent did not answer initialize".into(),
        );
        let f = pb::Fault::decode(s.details()).unwrap();
        assert_eq!(f.fault_class(), pb::FaultClass::Startup);
        assert_eq!(f.class, "startup");
        assert_eq!(s.message(), "the agent did not answer initialize");
    }

    #[test]
    fn every_class_has_its_own_name() {
        let all = [
            pb::FaultClass::Unspecified,
            pb::FaultClass::Startup,
            pb::FaultClass::Timeout,
            pb::FaultClass::OutputLimit,
            pb::FaultClass::Crash,
            pb::FaultClass::Protocol,
            pb::FaultClass::ModeEscalation,
            pb::FaultClass::PolicyUnavailable,
            pb::FaultClass::PromptTooLarge,
            pb::FaultClass::PermissionPromptUnavailable,
            pb::FaultClass::Internal,
            pb::FaultClass::Rejected,
            pb::FaultClass::SupervisorUnavailable,
            pb::FaultClass::Capacity,
            pb::FaultClass::OptionNotOffered,
            pb::FaultClass::EgressRefused,
            pb::FaultClass::RequestLimit,
            pb::FaultClass::CellLost,
            pb::FaultClass::CellRefused,
        ];
        let mut names: Vec<&str> = all.iter().map(|c| name(*c)).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
    }
}
