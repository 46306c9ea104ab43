//! `warden audit tail|show`: the policy service's audit records, read through its admin API.

use std::path::Path;

use warden_terminal_text::Inline;

use warden_proto::v1::admin_service_client::AdminServiceClient;
use warden_proto::v1::{AuditFollowRequest, AuditQueryRequest, AuditRecord, Verdict};

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("{0}")]
    Connect(#[from] warden_daemon::client::ConnectError),
    #[error("audit query refused: {0}")]
    Rpc(#[from] tonic::Status),
    #[error("no decision with id {0}")]
    NotFound(String),
}

fn verdict(v: i32) -> &'static str {
    match Verdict::try_from(v) {
        Ok(Verdict::Allow) => "ALLOW",
        Ok(Verdict::Escalate) => "ESCALATE",
        _ => "DENY",
    }
}

/// One line per record (the decision's local time first); it ends with the digest of the action the decision
/// judged (what an ALLOW is bound to). Every field the agent or the caller could write (title,
/// kind, ids, reason) is escaped: a newline or an escape sequence in a title cannot make a
/// record look like another, or like two.
pub fn line(r: &AuditRecord) -> String {
    format!(
        "{}  {:<8} {:<10} {:<32} rule={} reason=\"{}\" decision={} context={} action={}",
        crate::output::local_time(r.decided_at_unix_ms),
        verdict(r.verdict),
        Inline(&r.tool_kind),
        Inline(&r.tool_title),
        Inline(&r.rule),
        Inline(&r.reason),
        Inline(&r.decision_id),
        Inline(
            r.subject
                .as_ref()
                .map(|s| s.context_id.as_str())
                .unwrap_or("")
        ),
        Inline(r.judged.as_ref().map(|j| j.digest.as_str()).unwrap_or(""))
    )
}

/// Every field of one record, one line each (what the agent or the caller wrote escaped).
pub fn detail(r: &AuditRecord) -> String {
    let s = r.subject.clone().unwrap_or_default();
    let j = r.judged.clone().unwrap_or_default();
    [
        format!("decision_id     {}", r.decision_id),
        format!("request_id      {}", r.request_id),
        format!(
            "decided at      {} ({} ms since the epoch)",
            crate::output::local_time(r.decided_at_unix_ms),
            r.decided_at_unix_ms
        ),
        format!("verdict         {}", verdict(r.verdict)),
        format!(
            "option          {}",
            r.option_id.clone().unwrap_or_default()
        ),
        format!("end_turn        {}", r.end_turn),
        format!("rule            {}", r.rule),
        format!("reason          {}", r.reason),
        format!("tool            {} {:?}", r.tool_kind, r.tool_title),
        format!("raw_input_sha256 {}", r.raw_input_sha256),
        format!("action_digest   {}", j.digest),
        format!("judged argv     {:?} (cwd {:?})", j.argv, j.cwd),
        format!("judged content  {}", j.content_sha256),
        format!("judged paths    {}", j.locations.join(", ")),
        format!("principal       {}", s.principal),
        format!(
            "issuer          {}",
            if s.issuer.is_empty() {
                "- (a static token, or not recorded)"
            } else {
                &s.issuer
            }
        ),
        format!("groups          {}", s.groups.join(", ")),
        format!("context/task    {} / {}", s.context_id, s.task_id),
        format!("session/agent   {} / {}", s.session_id, s.agent),
        format!("verb            {}", s.verb),
        format!("policy_version  {}", r.policy_version),
        format!("latency_us      {}", r.latency_micros),
    ]
    .iter()
    .map(|l| warden_terminal_text::inline(l).into_owned())
    .collect::<Vec<_>>()
    .join("\n")
}

pub async fn query(socket: &Path, req: AuditQueryRequest) -> Result<Vec<AuditRecord>, AuditError> {
    let ch = warden_daemon::client::connect_unix(socket).await?;
    let mut client = AdminServiceClient::new(ch);
    Ok(client.audit_query(req).await?.into_inner().records)
}

/// `audit tail [-f]`: the newest `limit` records, oldest first; with `follow`, the policy's
/// `AuditFollow` stream: the same records, then every record written after them, in the log's
/// order, each once. Should the stream break (the policy restarting), it is asked again from
/// the last record's cursor, so nothing is skipped or printed twice. `json`: one JSON array,
/// or with `follow` one object a line.
pub async fn tail(
    socket: &Path,
    limit: u32,
    context_id: String,
    follow: bool,
    json: bool,
) -> Result<(), AuditError> {
    let print = |r: &AuditRecord| {
        if json {
            crate::output::print_line(&crate::output::audit_json(r));
        } else {
            println!("{}", line(r));
        }
    };
    if follow {
        return follow_from(socket, limit, context_id, &print).await;
    }
    let ch = warden_daemon::client::connect_unix(socket).await?;
    let mut client = AdminServiceClient::new(ch);
    let mut first = client
        .audit_query(AuditQueryRequest {
            limit,
            decision_id: String::new(),
            context_id,
        })
        .await?
        .into_inner()
        .records;
    first.reverse();
    if json {
        let all: Vec<serde_json::Value> = first.iter().map(crate::output::audit_json).collect();
        crate::output::print_doc(&serde_json::Value::Array(all));
        return Ok(());
    }
    first.iter().for_each(print);
    Ok(())
}

/// `audit tail -f`: follows until interrupted; a broken stream is resumed from its cursor.
async fn follow_from(
    socket: &Path,
    backlog: u32,
    context_id: String,
    print: &dyn Fn(&AuditRecord),
) -> Result<(), AuditError> {
    let mut cursor: Option<u64> = None;
    let mut resumed = false;
    loop {
        let streamed = async {
            let ch = warden_daemon::client::connect_unix(socket).await?;
            let mut stream = AdminServiceClient::new(ch)
                .audit_follow(AuditFollowRequest {
                    backlog,
                    context_id: context_id.clone(),
                    after_cursor: cursor,
                })
                .await?
                .into_inner();
            if resumed {
                eprintln!("warden audit: following again");
            }
            while let Some(ev) = stream.message().await? {
                if let Some(r) = &ev.record {
                    print(r);
                }
                cursor = Some(ev.cursor);
            }
            Ok::<(), AuditError>(())
        }
        .await;
        match streamed {
            // Only the policy ends a stream, when it stops: follow it back.
            Ok(()) => {}
            // Never followed: the first connection's failure is the command's.
            Err(e) if cursor.is_none() && !resumed => return Err(e),
            Err(AuditError::Rpc(s)) if s.code() != tonic::Code::Unavailable => {
                return Err(AuditError::Rpc(s));
            }
            Err(_) => {}
        }
        if !resumed {
            eprintln!(
                "warden audit: the policy's stream ended; following again from the last record"
            );
        }
        // Without a record printed yet there is no cursor: the backlog is asked for again,
        // none of it having been printed.
        resumed = true;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

pub async fn show(socket: &Path, id: &str) -> Result<AuditRecord, AuditError> {
    let recs = query(
        socket,
        AuditQueryRequest {
            limit: 1,
            decision_id: id.to_string(),
            context_id: String::new(),
        },
    )
    .await?;
    recs.into_iter()
        .next()
        .ok_or_else(|| AuditError::NotFound(id.to_string()))
}
