//! The shape of what the audit keeps: every free-text field of a record capped, so one request
//! cannot make a record larger than [`MAX_RECORD_TEXT_BYTES`] of text whatever it carried; what
//! a cap cut is counted in the record (`elided_bytes`) and the whole stays identifiable by its
//! digests (`raw_input_sha256` over the raw input, `judged.digest` over the judged action,
//! computed before any cut). Both backends write only what [`bounded`] returns.
//!
//! Must never: change a digest, a verdict, an id or a time (what the record says was decided
//! stays exactly what was decided), or cut a field silently (`elided_bytes` says how much is
//! missing).

use std::borrow::Cow;

use warden_proto::v1 as pb;

/// Cap of one free-text field (a title, a reason, one argv element, one path), in bytes.
pub const TEXT_CAP: usize = 2048;
/// Cap of a short field (an id an agent chose, a rule name, a kind), in bytes.
pub const SHORT_CAP: usize = 256;
/// Most entries kept of a list (argv elements, locations); the rest are counted.
pub const LIST_CAP: usize = 32;
/// Cap of all argv elements together, in bytes.
pub const ARGV_CAP: usize = 8 * 1024;
/// Cap of all judged locations together, in bytes.
pub const LOCATIONS_CAP: usize = 16 * 1024;
/// Cap of the subject's groups together, in bytes (each is a short field).
pub const GROUPS_CAP: usize = 4 * 1024;
/// What every cap together allows, the figure the README states: a record holds at most about
/// this much text (plus its fixed-size digests and numbers).
pub const MAX_RECORD_TEXT_BYTES: usize = 4 * TEXT_CAP // title, reason, cwd, subject's issuer
    + ARGV_CAP
    + LOCATIONS_CAP
    + GROUPS_CAP
    + 12 * SHORT_CAP; // ids, rule, kind, subject

/// What marks a cut: the text goes on with this, then the count of bytes cut.
const CUT: &str = "…";

/// `s` cut to `cap` bytes (on a character boundary), the number of bytes cut added to `elided`.
fn cap_text(s: &mut String, cap: usize, elided: &mut u64) {
    if s.len() <= cap {
        return;
    }
    let mut end = cap.saturating_sub(CUT.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    *elided += (s.len() - end) as u64;
    s.truncate(end);
    s.push_str(CUT);
}

/// A list kept to `max` entries, each capped to `each`, their sum kept to `total`; entries
/// dropped are counted and named by one last entry (`…(+N more, B bytes)`), which the `max`
/// and the `total` include.
fn cap_list(v: &mut Vec<String>, max: usize, each: usize, total: usize, elided: &mut u64) {
    /// Room kept for the last entry that names what was dropped.
    const MARK: usize = 64;
    for s in v.iter_mut() {
        cap_text(s, each, elided);
    }
    let sum = |v: &[String]| v.iter().map(String::len).sum::<usize>();
    if v.len() <= max && sum(v) <= total {
        return;
    }
    let budget = total.saturating_sub(MARK);
    let (mut dropped, mut n) = (0usize, 0usize);
    while v.len() > max.saturating_sub(1) || (v.len() > 1 && sum(v) > budget) {
        let Some(last) = v.pop() else { break };
        dropped += last.len();
        n += 1;
    }
    // One entry alone over the budget is cut instead of dropped.
    if let Some(first) = v.first_mut() {
        cap_text(first, budget, elided);
    }
    *elided += dropped as u64;
    v.push(format!("{CUT}(+{n} more, {dropped} bytes)"));
}

/// Whether `r` needs no cut (the common case: no copy is made).
fn fits(r: &pb::AuditRecord) -> bool {
    let short = |s: &str| s.len() <= SHORT_CAP;
    let text = |s: &str| s.len() <= TEXT_CAP;
    let subject = r.subject.as_ref().is_none_or(|s| {
        [
            &s.principal,
            &s.context_id,
            &s.task_id,
            &s.session_id,
            &s.agent,
            &s.verb,
        ]
        .iter()
        .all(|f| short(f))
            && text(&s.issuer)
            && s.groups.len() <= LIST_CAP
            && s.groups.iter().all(|g| short(g))
            && s.groups.iter().map(String::len).sum::<usize>() <= GROUPS_CAP
    });
    let judged = r.judged.as_ref().is_none_or(|j| {
        short(&j.kind)
            && text(&j.cwd)
            && j.locations.len() <= LIST_CAP
            && j.locations.iter().all(|l| text(l))
            && j.locations.iter().map(String::len).sum::<usize>() <= LOCATIONS_CAP
            && j.argv.len() <= LIST_CAP
            && j.argv.iter().all(|a| text(a))
            && j.argv.iter().map(String::len).sum::<usize>() <= ARGV_CAP
    });
    subject
        && judged
        && short(&r.decision_id)
        && short(&r.request_id)
        && short(&r.tool_kind)
        && text(&r.tool_title)
        && r.option_id.as_deref().is_none_or(short)
        && short(&r.rule)
        && text(&r.reason)
        && short(&r.supersedes_decision_id)
}

/// `record` as the audit keeps it: unchanged when every field is within its cap (no copy),
/// otherwise a copy with each field cut to its cap and `elided_bytes` counting what was cut.
pub fn bounded(record: &pb::AuditRecord) -> Cow<'_, pb::AuditRecord> {
    if fits(record) {
        return Cow::Borrowed(record);
    }
    let mut r = record.clone();
    let mut elided = r.elided_bytes;
    if let Some(s) = r.subject.as_mut() {
        for f in [
            &mut s.principal,
            &mut s.context_id,
            &mut s.task_id,
            &mut s.session_id,
            &mut s.agent,
            &mut s.verb,
        ] {
            cap_text(f, SHORT_CAP, &mut elided);
        }
        cap_text(&mut s.issuer, TEXT_CAP, &mut elided);
        cap_list(&mut s.groups, LIST_CAP, SHORT_CAP, GROUPS_CAP, &mut elided);
    }
    if let Some(j) = r.judged.as_mut() {
        cap_text(&mut j.kind, SHORT_CAP, &mut elided);
        cap_text(&mut j.cwd, TEXT_CAP, &mut elided);
        cap_list(&mut j.argv, LIST_CAP, TEXT_CAP, ARGV_CAP, &mut elided);
        cap_list(
            &mut j.locations,
            LIST_CAP,
            TEXT_CAP,
            LOCATIONS_CAP,
            &mut elided,
        );
    }
    // Ids are the supervisor's and the policy's own; capped all the same, so a peer that is
    // not warden's supervisor cannot make them the large part of a record.
    for f in [
        &mut r.decision_id,
        &mut r.request_id,
        &mut r.tool_kind,
        &mut r.rule,
        &mut r.supersedes_decision_id,
    ] {
        cap_text(f, SHORT_CAP, &mut elided);
    }
    if let Some(o) = r.option_id.as_mut() {
        cap_text(o, SHORT_CAP, &mut elided);
    }
    cap_text(&mut r.tool_title, TEXT_CAP, &mut elided);
    cap_text(&mut r.reason, TEXT_CAP, &mut elided);
    r.elided_bytes = elided;
    Cow::Owned(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn huge() -> pb::AuditRecord {
        pb::AuditRecord {
            decision_id: "d".into(),
            request_id: "r".into(),
            subject: Some(pb::Subject {
                session_id: "s".repeat(100_000),
                issuer: "i".repeat(10_000),
                groups: (0..300)
                    .map(|i| format!("group-{i}-{}", "g".repeat(500)))
                    .collect(),
                ..Default::default()
            }),
            tool_kind: "execute".into(),
            tool_title: "t".repeat(1 << 20),
            raw_input_sha256: "ab".repeat(32),
            verdict: pb::Verdict::Deny as i32,
            rule: "request.malformed.raw-input-too-large".into(),
            reason: "é".repeat(1 << 20),
            judged: Some(pb::JudgedAction {
                kind: "execute".into(),
                argv: vec!["x".repeat(4 << 20), "y".into()],
                locations: (0..1000).map(|i| format!("/root/{i}")).collect(),
                cwd: "/root".into(),
                digest: "sha256:00".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_small_record_is_kept_as_is() {
        let r = pb::AuditRecord {
            decision_id: "d".into(),
            reason: "fine".into(),
            judged: Some(pb::JudgedAction {
                argv: vec!["ls".into(), "-la".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(matches!(bounded(&r), Cow::Borrowed(_)));
    }

    #[test]
    fn every_free_text_field_is_capped_and_the_cut_is_counted() {
        let r = huge();
        let whole = r.encoded_len();
        let b = bounded(&r).into_owned();
        let kept = b.encoded_len();
        assert!(
            kept <= MAX_RECORD_TEXT_BYTES + 1024,
            "{kept} bytes kept of {whole}"
        );
        assert!(kept < 64 * 1024, "{kept}");
        // What identifies the whole, and what was decided, are untouched.
        assert_eq!(b.raw_input_sha256, r.raw_input_sha256);
        assert_eq!(
            b.judged.as_ref().map(|j| &j.digest),
            Some(&"sha256:00".into())
        );
        assert_eq!(b.verdict, r.verdict);
        assert_eq!(b.rule, r.rule);
        // The cut is said: in the count, and at the end of each cut field.
        // (The encoding's own framing of the dropped entries is not text, so not counted.)
        let gone = whole - kept;
        assert!(
            b.elided_bytes as usize > gone * 99 / 100 && b.elided_bytes as usize <= gone,
            "{} of {gone}",
            b.elided_bytes
        );
        assert!(b.tool_title.ends_with(CUT));
        assert!(b.reason.ends_with(CUT) && b.reason.len() <= TEXT_CAP);
        let subject = b.subject.clone().unwrap_or_default();
        assert!(subject.issuer.ends_with(CUT) && subject.issuer.len() <= TEXT_CAP);
        assert!(subject.groups.len() <= LIST_CAP);
        assert!(subject.groups.iter().map(String::len).sum::<usize>() <= GROUPS_CAP);
        assert!(
            subject.groups.last().is_some_and(|g| g.contains("more")),
            "{:?}",
            subject.groups.last()
        );
        let j = b.judged.unwrap_or_default();
        assert!(j.argv[0].ends_with(CUT));
        // The last entry of a cut list names what was dropped (and counts in the cap).
        assert_eq!(j.locations.len(), LIST_CAP);
        assert!(
            j.locations[LIST_CAP - 1].contains("+969 more"),
            "{:?}",
            j.locations.last()
        );
        // Bounding is idempotent: a bounded record fits.
        let once = bounded(&r).into_owned();
        assert!(matches!(bounded(&once), Cow::Borrowed(_)));
    }
}
