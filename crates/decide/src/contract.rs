//! The contract kit: checks any `PolicyService` implementation through its socket, so
//! warden-policy, warden-approver and any third implementation are held to the same rules.
//!
//! What it checks (each failure is a [`Violation`] naming the check and the case):
//! * `zero-value-deny`: an empty request, and requests an implementation cannot judge
//!   (no tool call, unknown profile, oversized raw input), are answered DENY;
//! * `reason`: every answer has a non-empty reason and a rule name;
//! * `offered-options`: a decision never names an option that was not offered, and an ALLOW
//!   never names an `allow_always` or unknown-kind option;
//! * `floor`: the boundary floor's refusals hold (escapes through `..`, symlinks, siblings named
//!   like the root, foreign-root execution, the read-only profile, elevated plan exits; paths
//!   named only in the raw input, a command's cwd outside the root, raw input that is not JSON,
//!   the agent's own configuration and hooks, boundary roots that are `/`, missing or relative);
//! * `action-digest`: an ALLOW names the digest of the action it judged
//!   (`Decision.action_digest` = [`crate::convert::judged`] of the request), the only ALLOW a
//!   caller acts on;
//! * `deadline`: [`decide_with_deadline`], the caller-side helper the supervisor uses, cuts a
//!   slow implementation off at the deadline and fails closed (see [`SlowPolicy`]).
//!
//! The kit runs on the same host as the implementation: the floor cases use a real directory
//! tree with real symlinks ([`Fixture`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use warden_proto::v1 as pb;
use warden_proto::v1::policy_service_client::PolicyServiceClient;
use warden_proto::v1::policy_service_server::{PolicyService, PolicyServiceServer};

/// One failed check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub check: &'static str,
    pub case: String,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}] {}: {}", self.check, self.case, self.detail)
    }
}

/// A directory tree for the floor cases: `<base>/root` (the boundary root) holding `src/`, a
/// symlink `out -> <base>/outside`, a relative symlink `up -> ../root-evil`, a dangling
/// `dangle -> <base>/nowhere/x`, and the sibling `<base>/root-evil`.
pub struct Fixture {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub base: PathBuf,
}

impl Fixture {
    pub fn new() -> std::io::Result<Self> {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir()?;
        let base = std::fs::canonicalize(dir.path())?;
        let root = base.join("root");
        std::fs::create_dir_all(root.join("src"))?;
        std::fs::create_dir_all(root.join("..notes"))?;
        std::fs::create_dir_all(base.join("root-evil"))?;
        std::fs::create_dir_all(base.join("outside"))?;
        symlink(base.join("outside"), root.join("out"))?;
        symlink("../root-evil", root.join("up"))?;
        symlink(base.join("nowhere/x"), root.join("dangle"))?;
        Ok(Self {
            _dir: dir,
            root,
            base,
        })
    }
}

/// Knobs for implementations that differ legitimately.
#[derive(Debug, Clone)]
pub struct KitOptions {
    /// A raw input this large must be refused (warden-policy's default limit is 256 KiB).
    pub oversized_raw_input_bytes: usize,
    /// The deadline each kit call runs under.
    pub deadline: Duration,
}

impl Default for KitOptions {
    fn default() -> Self {
        Self {
            oversized_raw_input_bytes: 1024 * 1024,
            deadline: Duration::from_secs(5),
        }
    }
}

/// Calls Decide under `deadline` and fails closed: a late, failed or unreadable answer is a
/// DENY with rule `policy_unavailable`. The deadline is sent to the server (as the absolute
/// `deadline_unix_ms` and as `grpc-timeout`) and also enforced here, so a server that ignores it
/// cannot hold the caller.
pub async fn decide_with_deadline(
    client: &mut PolicyServiceClient<Channel>,
    req: pb::DecideRequest,
    deadline: Duration,
) -> pb::Decision {
    let mut req = req;
    req.deadline_unix_ms = std::time::SystemTime::now()
        .checked_add(deadline)
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let mut r = Request::new(req);
    r.set_timeout(deadline);
    // The caller's trace goes on to the policy (the approver's call upstream, say).
    warden_daemon::otel::inject(r.metadata_mut());
    let unavailable = |why: String| pb::Decision {
        decision_id: String::new(),
        verdict: pb::Verdict::Deny as i32,
        option_id: None,
        reason: format!("policy unavailable: {why}"),
        rule: "policy_unavailable".to_string(),
        end_turn: false,
        end_turn_reason: 0,
        request_id: String::new(),
        action_digest: String::new(),
    };
    match tokio::time::timeout(deadline, client.decide(r)).await {
        Err(_) => unavailable(format!("no answer within {} ms", deadline.as_millis())),
        Ok(Err(status)) => unavailable(format!("{:?}: {}", status.code(), status.message())),
        Ok(Ok(resp)) => {
            let d = resp.into_inner();
            // An answer whose verdict this caller does not know is a denial.
            if pb::Verdict::try_from(d.verdict).is_err() {
                return unavailable(format!("unknown verdict value {}", d.verdict));
            }
            d
        }
    }
}

fn opt(id: &str, kind: &str) -> pb::PermissionOption {
    pb::PermissionOption {
        id: id.to_string(),
        name: id.to_string(),
        kind: kind.to_string(),
    }
}

fn claude_options() -> Vec<pb::PermissionOption> {
    vec![
        opt("allow-once", "allow_once"),
        opt("allow-with-updates", "allow_always"),
        opt("reject", "reject_once"),
    ]
}

/// `(owned, allow_execute, profile)` of a case's boundary.
type BoundaryBits = (bool, bool, pb::Profile);
/// A floor case: name, boundary, kind, locations.
type FloorCase = (
    &'static str,
    BoundaryBits,
    &'static str,
    &'static [&'static str],
);

fn request(
    name: &str,
    root: &Path,
    (owned, allow_execute, profile): BoundaryBits,
    kind: &str,
    locations: &[&str],
    options: Vec<pb::PermissionOption>,
) -> pb::DecideRequest {
    pb::DecideRequest {
        request_id: format!("contract-{name}"),
        subject: Some(pb::Subject {
            principal: "contract-kit".into(),
            context_id: "contract".into(),
            task_id: "t".into(),
            session_id: "s".into(),
            agent: "contract".into(),
            verb: "implement".into(),
            groups: Vec::new(),
            issuer: String::new(),
        }),
        boundary: Some(pb::Boundary {
            root: root.display().to_string(),
            owned,
            allow_execute,
            profile: profile as i32,
        }),
        tool_call: Some(pb::ToolCall {
            id: format!("call-{name}"),
            kind: kind.to_string(),
            title: format!("{kind} {}", locations.join(" ")),
            raw_input_json: String::new(),
            locations: locations
                .iter()
                .map(|p| pb::Location {
                    path: p.to_string(),
                    line: None,
                })
                .collect(),
        }),
        options,
        current_mode: "default".into(),
        deadline_unix_ms: 0,
        return_escalations: false,
    }
}

/// What a case requires of the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// Exactly DENY (ESCALATE would let a human loosen the floor).
    Deny,
    /// Anything; only the general checks apply.
    Any,
}

/// Runs every check against the implementation behind `channel`.
pub async fn check_policy_service(
    channel: Channel,
    fixture: &Fixture,
    opts: &KitOptions,
) -> Vec<Violation> {
    let mut client = PolicyServiceClient::new(channel);
    let root = fixture.root.as_path();
    let ws = pb::Profile::WorkspaceWrite;
    let mut cases: Vec<(&'static str, String, pb::DecideRequest, Want)> = Vec::new();
    let mut add = |check: &'static str, name: &str, r: pb::DecideRequest, w: Want| {
        cases.push((check, name.to_string(), r, w));
    };

    // zero value and malformed requests
    add(
        "zero-value-deny",
        "empty request",
        pb::DecideRequest::default(),
        Want::Deny,
    );
    let mut r = request(
        "no-tool",
        root,
        (true, true, ws),
        "read",
        &[],
        claude_options(),
    );
    r.tool_call = None;
    add("zero-value-deny", "no tool call", r, Want::Deny);
    let mut r = request(
        "profile",
        root,
        (true, true, ws),
        "execute",
        &[],
        claude_options(),
    );
    if let Some(b) = r.boundary.as_mut() {
        b.profile = 7;
    }
    add("zero-value-deny", "unknown profile value", r, Want::Deny);
    let mut r = request(
        "big",
        root,
        (true, true, ws),
        "execute",
        &[],
        claude_options(),
    );
    if let Some(t) = r.tool_call.as_mut() {
        t.raw_input_json = format!("\"{}\"", "x".repeat(opts.oversized_raw_input_bytes));
    }
    add("zero-value-deny", "oversized raw input", r, Want::Deny);

    // the floor
    let floor_denies: &[FloorCase] = &[
        ("edit via ..", (true, true, ws), "edit", &["../root-evil/x"]),
        (
            "edit absolute elsewhere",
            (true, true, ws),
            "edit",
            &["/etc/passwd"],
        ),
        (
            "edit through symlink out",
            (true, true, ws),
            "edit",
            &["out/x"],
        ),
        (
            "edit through relative symlink",
            (true, true, ws),
            "edit",
            &["up/x"],
        ),
        (
            "edit dangling symlink out",
            (true, true, ws),
            "edit",
            &["dangle"],
        ),
        (
            "delete one of two outside",
            (true, true, ws),
            "delete",
            &["src/a", "../outside/b"],
        ),
        (
            "edit without locations, foreign root",
            (false, true, ws),
            "edit",
            &[],
        ),
        (
            "execute in foreign root",
            (false, false, ws),
            "execute",
            &[],
        ),
        ("fetch in foreign root", (false, false, ws), "fetch", &[]),
        (
            "unknown kind in foreign root",
            (false, false, ws),
            "frobnicate",
            &[],
        ),
        (
            "read-only profile edit",
            (true, true, pb::Profile::ReadOnly),
            "edit",
            &["src/a"],
        ),
        (
            "read-only profile execute",
            (true, true, pb::Profile::ReadOnly),
            "execute",
            &[],
        ),
    ];
    for (name, bits, kind, locs) in floor_denies {
        let r = request(name, root, *bits, kind, locs, claude_options());
        add("floor", name, r.clone(), Want::Deny);
        // A caller that can ask a person (an approver chaining here) gets the same refusal: the
        // floor is never handed to a person to loosen.
        let asking = pb::DecideRequest {
            return_escalations: true,
            ..r
        };
        add(
            "floor",
            &format!("{name} (caller can ask a person)"),
            asking,
            Want::Deny,
        );
    }
    // the sibling named like the root, as an absolute path
    let sibling = fixture.base.join("root-evil/x").display().to_string();
    add(
        "floor",
        "edit sibling root-evil",
        request(
            "sibling",
            root,
            (true, true, ws),
            "edit",
            &[&sibling],
            claude_options(),
        ),
        Want::Deny,
    );
    // issue 11: what the tool will do, not only its label; agent-control files; untrusted roots
    let with_raw = |name: &str, owned: bool, kind: &str, locs: &[&str], raw: &str| {
        let mut r = request(name, root, (owned, true, ws), kind, locs, claude_options());
        if let Some(t) = r.tool_call.as_mut() {
            t.raw_input_json = raw.to_string();
        }
        r
    };
    let outside = fixture.base.join("outside").display().to_string();
    for (name, owned, kind, locs, raw) in [
        (
            "edit without locations whose raw input names /etc/passwd",
            true,
            "edit",
            &[][..],
            r#"{"file_path":"/etc/passwd","content":"x"}"#.to_string(),
        ),
        (
            "codex changes map outside the root",
            true,
            "edit",
            &[][..],
            format!(r#"{{"changes":{{"{outside}/x":{{"add":{{"content":"x"}}}}}}}}"#),
        ),
        (
            "execute whose cwd is outside the root",
            true,
            "execute",
            &[][..],
            format!(r#"{{"command":["/bin/bash","-lc","true"],"cwd":"{outside}"}}"#),
        ),
        (
            "edit with raw input that is not JSON",
            true,
            "edit",
            &["src/a"][..],
            "{\"file_path\": ".to_string(),
        ),
        (
            "edit the agent's settings inside the root",
            true,
            "edit",
            &[".claude/settings.local.json"][..],
            String::new(),
        ),
        (
            "write the agent's settings by raw input",
            true,
            "edit",
            &[][..],
            r#"{"file_path":".claude/settings.json","content":"{}"}"#.to_string(),
        ),
        (
            "edit a git hook",
            true,
            "edit",
            &[".git/hooks/pre-commit"][..],
            String::new(),
        ),
        (
            "delete .mcp.json",
            false,
            "delete",
            &[".mcp.json"][..],
            String::new(),
        ),
    ] {
        add(
            "floor",
            name,
            with_raw(name, owned, kind, locs, &raw),
            Want::Deny,
        );
    }
    let nowhere = fixture.base.join("nowhere").display().to_string();
    for (name, bad_root) in [
        ("boundary root is /", "/"),
        ("boundary root does not exist", nowhere.as_str()),
        ("boundary root is relative", "relative/root"),
    ] {
        let mut r = request(
            name,
            root,
            (true, true, ws),
            "edit",
            &["x"],
            claude_options(),
        );
        if let Some(b) = r.boundary.as_mut() {
            b.root = bad_root.to_string();
        }
        add("floor", name, r, Want::Deny);
    }
    add(
        "floor",
        "plan exit with only elevated options",
        request(
            "plan-elevated",
            root,
            (true, true, ws),
            "switch_mode",
            &[],
            vec![
                opt("exit-plan-auto", "allow_always"),
                opt("exit-plan-bypass", "allow_always"),
                opt("exit-plan-accept-edits", "allow_once"),
                opt("reject", "reject_once"),
            ],
        ),
        Want::Deny,
    );
    // cases the floor allows: only the general checks (an implementation may be stricter)
    for (name, kind, locs, options) in [
        ("read", "read", vec![], claude_options()),
        ("edit inside", "edit", vec!["src/lib.rs"], claude_options()),
        (
            "edit ..notes",
            "edit",
            vec!["..notes/todo"],
            claude_options(),
        ),
        (
            "only always-allow offered",
            "read",
            vec![],
            vec![
                opt("approved-for-session", "allow_always"),
                opt("abort", "reject_once"),
            ],
        ),
        (
            "unknown option kinds",
            "read",
            vec![],
            vec![opt("yes", "allow_maybe"), opt("no", "nope")],
        ),
        (
            "plan exit with a safe option",
            "switch_mode",
            vec![],
            vec![
                opt("exit-plan-auto", "allow_always"),
                opt("exit-plan-default", "allow_once"),
                opt("reject", "reject_once"),
            ],
        ),
        (
            "codex command",
            "execute",
            vec![],
            vec![
                opt("allow_once", "allow_once"),
                opt("allow_for_session", "allow_always"),
                opt("cancel", "reject_once"),
                opt("decline", "reject_once"),
            ],
        ),
    ] {
        let r = request(name, root, (true, false, ws), kind, &locs, options);
        add("offered-options", name, r, Want::Any);
    }

    let mut out = Vec::new();
    // The wire contract itself: a decision that lost its verdict denies.
    if pb::Decision::default().verdict != pb::Verdict::Deny as i32 {
        out.push(Violation {
            check: "zero-value-deny",
            case: "Decision::default()".into(),
            detail: "the zero verdict is not DENY".into(),
        });
    }
    for (check, name, req, want) in cases {
        let offered = req.options.clone();
        let digest = crate::convert::judged(&req).digest;
        let d = decide_with_deadline(&mut client, req, opts.deadline).await;
        let v = |check: &'static str, detail: String| Violation {
            check,
            case: name.clone(),
            detail,
        };
        if d.rule == "policy_unavailable" {
            // A transport failure is fail-closed on the caller's side, but the implementation
            // must answer the kit's requests.
            if !(check == "zero-value-deny" && name == "oversized raw input") {
                out.push(v("reason", format!("no answer: {}", d.reason)));
            }
            continue;
        }
        if d.reason.trim().is_empty() {
            out.push(v("reason", "empty reason".into()));
        }
        if d.rule.trim().is_empty() {
            out.push(v("reason", "empty rule name".into()));
        }
        if let Some(id) = &d.option_id {
            match offered.iter().find(|o| &o.id == id) {
                None => out.push(v(
                    "offered-options",
                    format!("named {id:?}, which was not offered"),
                )),
                Some(o) if d.verdict == pb::Verdict::Allow as i32 && o.kind != "allow_once" => out
                    .push(v(
                        "offered-options",
                        format!("ALLOW names {id:?} of kind {:?}", o.kind),
                    )),
                Some(o)
                    if d.verdict == pb::Verdict::Deny as i32
                        && o.kind != "reject_once"
                        && o.kind != "reject_always" =>
                {
                    out.push(v(
                        "offered-options",
                        format!("DENY names {id:?} of kind {:?}", o.kind),
                    ))
                }
                Some(_) => {}
            }
        }
        if d.verdict == pb::Verdict::Allow as i32 && d.option_id.is_none() {
            // An ALLOW the caller could only carry out with an always-option is not an allow.
            let has_once = offered.iter().any(|o| o.kind == "allow_once");
            if !has_once {
                out.push(v(
                    "offered-options",
                    "ALLOW although no allow_once option was offered".into(),
                ));
            }
        }
        if d.verdict == pb::Verdict::Allow as i32 && d.action_digest != digest {
            // The caller acts on an ALLOW only for the action it asked about.
            out.push(v(
                "action-digest",
                format!(
                    "ALLOW names action digest {:?}, the request's is {digest:?}",
                    d.action_digest
                ),
            ));
        }
        if name == "plan exit with a safe option"
            && d.verdict == pb::Verdict::Allow as i32
            && d.option_id.as_deref() != Some("exit-plan-default")
        {
            out.push(v(
                "floor",
                format!(
                    "ALLOW of a plan exit must name exit-plan-default, named {:?}",
                    d.option_id
                ),
            ));
        }
        if want == Want::Deny && d.verdict != pb::Verdict::Deny as i32 {
            out.push(v(
                check,
                format!(
                    "expected DENY, got verdict {} (rule {}, reason {})",
                    d.verdict, d.rule, d.reason
                ),
            ));
        }
    }
    out.extend(check_description(&mut client, opts.deadline).await);
    out
}

/// `Describe` answers (UNIMPLEMENTED is allowed: read as "needs no extra time") and never asks a
/// caller for more than `warden_proto::limits::MAX_DECIDE_DEADLINE_MS`.
async fn check_description(
    client: &mut PolicyServiceClient<Channel>,
    patience: Duration,
) -> Vec<Violation> {
    let cap = warden_proto::limits::MAX_DECIDE_DEADLINE_MS;
    let v = |detail: String| Violation {
        check: "describe",
        case: "Describe".into(),
        detail,
    };
    let mut r = Request::new(pb::DescribeRequest {});
    r.set_timeout(patience);
    match tokio::time::timeout(patience, client.describe(r)).await {
        Err(_) => vec![v(format!("no answer within {} ms", patience.as_millis()))],
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Vec::new(),
        Ok(Err(s)) => vec![v(format!("failed: {}: {}", s.code(), s.message()))],
        Ok(Ok(d)) => {
            let d = d.into_inner();
            let mut out = Vec::new();
            if d.decide_deadline_ms > cap {
                out.push(v(format!(
                    "decide_deadline_ms {} is beyond the {cap} ms cap",
                    d.decide_deadline_ms
                )));
            }
            for (agent, ms) in &d.agent_decide_deadline_ms {
                if *ms > cap {
                    out.push(v(format!(
                        "agent {agent:?}: {ms} ms is beyond the {cap} ms cap"
                    )));
                }
            }
            out
        }
    }
}

/// A deliberately slow implementation that answers ALLOW after `delay`: a caller that waits
/// for it, or trusts its late answer, fails the `deadline` check.
#[derive(Debug, Clone)]
pub struct SlowPolicy {
    pub delay: Duration,
}

#[tonic::async_trait]
impl PolicyService for SlowPolicy {
    async fn decide(
        &self,
        _request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::Decision>, Status> {
        tokio::time::sleep(self.delay).await;
        Ok(Response::new(pb::Decision {
            decision_id: "late".into(),
            verdict: pb::Verdict::Allow as i32,
            option_id: None,
            reason: "late allow".into(),
            rule: "slow".into(),
            end_turn: false,
            end_turn_reason: 0,
            request_id: String::new(),
            action_digest: String::new(),
        }))
    }

    /// A deliberately incomplete implementation: it keeps no record to correct.
    async fn withdraw(
        &self,
        _request: Request<pb::WithdrawRequest>,
    ) -> Result<Response<pb::WithdrawResponse>, Status> {
        Err(Status::unimplemented("SlowPolicy keeps no audit"))
    }

    /// Incomplete too: a caller reads UNIMPLEMENTED as "needs no extra time".
    async fn describe(
        &self,
        _request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::PolicyDescription>, Status> {
        Err(Status::unimplemented("SlowPolicy does not describe itself"))
    }

    type DecideStreamStream = crate::DecisionStream;

    /// Without the stream, as an implementation of the contract may be: callers use Decide.
    async fn decide_stream(
        &self,
        _request: Request<tonic::Streaming<pb::DecideRequest>>,
    ) -> Result<Response<Self::DecideStreamStream>, Status> {
        Err(Status::unimplemented(
            "SlowPolicy decides one call at a time",
        ))
    }
}

/// Serves `svc` on a Unix socket at `path` until the returned handle is aborted.
pub fn serve_on_socket<S: PolicyService>(
    svc: S,
    path: &Path,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::UnixListener::bind(path)?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    Ok(tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(PolicyServiceServer::new(svc))
            .serve_with_incoming(incoming)
            .await;
    }))
}

/// The `deadline` check: `decide_with_deadline` against the implementation on `channel` must
/// return a DENY within `deadline` plus a small margin when the implementation is slower.
pub async fn check_deadline_cutoff(channel: Channel, deadline: Duration) -> Vec<Violation> {
    let mut client = PolicyServiceClient::new(channel);
    let t0 = Instant::now();
    let d = decide_with_deadline(&mut client, pb::DecideRequest::default(), deadline).await;
    let took = t0.elapsed();
    let mut out = Vec::new();
    let margin = Duration::from_millis(250);
    if took > deadline + margin {
        out.push(Violation {
            check: "deadline",
            case: "slow implementation".into(),
            detail: format!(
                "the caller waited {} ms for a {} ms deadline",
                took.as_millis(),
                deadline.as_millis()
            ),
        });
    }
    if d.verdict != pb::Verdict::Deny as i32 {
        out.push(Violation {
            check: "deadline",
            case: "slow implementation".into(),
            detail: format!(
                "a late answer was used: verdict {} ({})",
                d.verdict, d.reason
            ),
        });
    }
    out
}
