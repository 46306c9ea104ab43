//! The real Gemini CLI under warden, offline: `@google/gemini-cli` 0.61.0 (the built-in
//! `gemini`, its own ACP agent with `--experimental-acp`), installed by `.ci/run` under
//! `<target>/npm/`, driven through the real daemons by the scripted fake Gemini API in
//! `tests/fake_models/fake_gemini.py`. It asks for every edit and command in its `default`
//! approval mode, and warden-policy decides each; it reads and writes itself inside its sandbox
//! (the built-in advertises no `fs/*` to it: Gemini CLI 0.61 cannot create a file through them).
//!
//! Missing installs fail under CI (`CI=true`) and are a printed skip elsewhere.

use std::path::Path;
use warden_e2e::real::{self, GEMINI_CLI, Matrix, Vocab};

mod real_support;
use real_support::WARM_IDLE;

fn gemini() -> Matrix {
    Matrix {
        pinned: GEMINI_CLI,
        agent: "gemini",
        vocab: Vocab::Gemini,
        extra_sets: Vec::new(),
    }
}

/// A write inside the root is asked, ALLOWed and lands; the first turn reached nothing but the
/// fake model, through the egress proxy, every connection recorded under its conversation.
#[tokio::test]
async fn gemini_cli_write_inside_is_allowed_and_lands_through_the_proxy_only() {
    let Some(r) = gemini().write_inside_lands_through_the_proxy_only().await else {
        return;
    };
    // The model was asked in Gemini's API shape, with Gemini CLI's own tools offered.
    let log = r.model.log_text();
    assert!(
        log.contains(":streamGenerateContent") && log.contains("run_shell_command"),
        "{log}"
    );
}

/// Writes outside the root (by `..`, an absolute path, a link planted in the root) never land.
/// Gemini CLI refuses them itself before it asks ("Path not in workspace": it resolves links
/// first); what it would ask for is decided, and nothing of it reaches the disk.
#[tokio::test]
async fn gemini_cli_writes_outside_by_dotdot_absolute_and_link_never_land() {
    let m = gemini();
    let Some(r) = m.start().await else { return };
    let dotdot = real::unique("warden-dotdot");
    let abs = format!("/var/tmp/{}", real::unique("warden-abs"));
    let target_dir = tempfile::Builder::new()
        .prefix("warden-link-target")
        .tempdir_in(warden_e2e::test_root())
        .expect("a link target");
    let via_link = real::unique("warden-via-link");
    let rows = [
        vec![Vocab::Gemini.write(&format!("{{CWD}}/../{dotdot}"), "escaped by dot-dot")],
        vec![Vocab::Gemini.write(&abs, "escaped by an absolute path")],
        vec![
            Vocab::Gemini.shell(&format!(
                "ln -s {} {{CWD}}/planted",
                target_dir.path().display()
            )),
            Vocab::Gemini.write(&format!("{{CWD}}/planted/{via_link}"), "escaped by a link"),
        ],
    ];
    let mut ctx = String::new();
    for steps in &rows {
        let sent = m.send(&r, steps).await;
        ctx = r.ctx(&sent);
        // No write was ALLOWed (the link row's one ALLOW is its `ln`).
        let allows = sent.shown.matches("[policy] ALLOW").count();
        assert!(allows < steps.len(), "{ctx}");
    }
    assert!(r.in_state(&dotdot).is_empty(), "{ctx}");
    assert!(!Path::new(&abs).exists(), "{ctx}");
    assert!(!target_dir.path().join(&via_link).exists(), "{ctx}");
    assert!(r.in_state(&via_link).is_empty(), "{ctx}");
    // The model asked for each, and was told each failed.
    let log = r.model.log_text();
    assert!(log.contains(&dotdot) && log.contains(&via_link), "{ctx}");
    assert!(log.matches("functionResponse").count() >= 3, "{ctx}");
    r.assert_model_reached_through_the_proxy(&ctx);
}

#[tokio::test]
async fn gemini_cli_shell_writes_stay_in_the_sandbox() {
    gemini().shell_writes_stay_in_the_sandbox().await;
}

#[tokio::test]
async fn gemini_cli_never_gets_an_always_answer() {
    gemini().always_is_never_chosen().await;
}

#[tokio::test]
async fn gemini_cli_settings_written_by_the_model_change_nothing() {
    gemini().model_written_settings_change_nothing().await;
}

#[tokio::test]
async fn gemini_cli_detached_children_die_with_cancel() {
    gemini().detached_children_die_with_cancel().await;
}

#[tokio::test]
async fn gemini_cli_misconfigured_fails_with_its_stderr() {
    gemini().misconfigured_fails_with_its_stderr().await;
}

/// Gemini CLI offers no "always" option under warden's settings (`security.disableAlwaysAllow`;
/// without them it offers `proceed_always`): its permission requests, as the turn's transcript
/// recorded them, carry only "Allow" and "Reject", so warden's user layer is the one it read.
#[tokio::test]
async fn gemini_cli_reads_wardens_settings() {
    let m = gemini();
    let Some(r) = m.start().await else { return };
    let evs = real::supervisor_turn(
        &r.d,
        "gemini",
        "gemini-settings-1",
        "t1",
        "",
        real::script(&[Vocab::Gemini.shell("echo x > {CWD}/x.txt")]),
    )
    .await;
    let asked = real::decisions(&evs);
    assert_eq!(asked.len(), 1, "{evs:#?}\n{}", r.model.answers());
    assert_eq!(asked[0].tool_kind, "execute", "{asked:#?}");
    let mut offered = Vec::new();
    for f in walk(&r.d.dir.path().join("supervisor/transcripts")) {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for line in text.lines() {
            if line.contains("permission_request") {
                offered.push(line.to_string());
            }
        }
    }
    assert_eq!(offered.len(), 1, "{offered:#?}");
    assert!(offered[0].contains("allow_once"), "{offered:#?}");
    assert!(
        !offered[0].contains("allow_always") && !offered[0].contains("proceed_always"),
        "an always option was offered: {offered:#?}"
    );
}

/// Every file under `dir` (links not followed).
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        } else if p.is_file() {
            out.push(p);
        }
    }
    out
}

/// A `review` conversation runs Gemini CLI in its `plan` mode (read-only, supervised): no shell
/// is offered to the model and a write into the root does not land. The model's way out of plan
/// mode, `exit_plan_mode` (which would put Gemini CLI back in `default`; its untrusted root
/// allows no other mode), is a permission request warden-policy decides: under the review's
/// read-only profile it is refused, Gemini stays in plan mode, and a write after it does not
/// land either.
#[tokio::test]
async fn gemini_cli_review_plans_and_stays_supervised_after_the_plan() {
    let m = gemini();
    let Some(r) = m.start().await else { return };
    let steps = [
        Vocab::Gemini.write("{CWD}/planned.txt", "written in plan mode"),
        Vocab::Gemini.write("warden-plan.md", "1. Read the code.\n2. Report."),
        r#"{"tool": "exit_plan_mode", "args": {"plan_filename": "warden-plan.md"}}"#.to_string(),
        Vocab::Gemini.write("{CWD}/after-plan.txt", "written after the plan"),
    ];
    let (evs, asked) = real_support::review_turn(&r, "gemini", "gemini-plan-1", &steps).await;
    let answers = r.model.answers();
    let first = r
        .model
        .log_text()
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        first.contains("exit_plan_mode") && !first.contains("run_shell_command"),
        "the model was not asked in plan mode: {answers}"
    );
    assert!(r.in_state("planned.txt").is_empty(), "{evs:#?}\n{answers}");
    assert_eq!(asked.len(), 1, "{asked:#?}\n{answers}");
    assert!(
        asked[0].tool_title.contains("plan approval")
            && asked[0].verdict == warden_proto::v1::Verdict::Deny as i32,
        "{asked:#?}\n{answers}"
    );
    assert!(
        r.in_state("after-plan.txt").is_empty(),
        "{asked:#?}\n{answers}"
    );
    // Still in plan mode after the refusal: the last request offers no shell either.
    let last = r
        .model
        .log_text()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    assert!(
        last.contains("exit_plan_mode") && !last.contains("run_shell_command"),
        "{answers}"
    );
}

#[tokio::test]
async fn gemini_cli_warm_under_the_proxy_is_handed_out_and_its_first_turn_works() {
    gemini()
        .warm_agent_is_handed_out_through_the_proxy(WARM_IDLE, false)
        .await;
}

/// The network is its model's API and nothing else: a fetch the model asks for (`web_fetch`)
/// and a command that opens a socket itself reach nothing, and every connection recorded for
/// the conversation went to the fake model.
#[tokio::test]
async fn gemini_cli_reaches_nothing_but_its_model() {
    real_support::reaches_nothing_but_its_model(
        &gemini(),
        r#"{"tool": "web_fetch", "args": {"prompt": "Summarize http://93.184.215.14/ and https://example.com/"}}"#,
    )
    .await;
}

/// What Gemini CLI reads at start, planted by one allowed command (its `.env` files, system
/// settings and trusted folders named from them, subagents, shell and git start files), then
/// an idle stop and restart of the same conversation: every command is still asked.
#[tokio::test]
async fn gemini_cli_planted_configuration_changes_nothing_after_an_idle_restart() {
    gemini()
        .planted_configuration_changes_nothing_after_an_idle_restart()
        .await;
}

/// Issue 35: Gemini CLI's execute requests name their command only in the tool call's title
/// (its raw input carries none), and every such decision carried the same `action_digest`
/// whatever the command. Now the digest covers the title: two commands of one turn are two
/// different digests in the turn's transcript, each the one its decision was bound to.
#[tokio::test]
async fn gemini_cli_each_command_is_decided_with_its_own_digest() {
    let m = gemini();
    let Some(r) = m.start().await else { return };
    let steps = [
        Vocab::Gemini.shell("echo one > {CWD}/one.txt"),
        Vocab::Gemini.shell("echo two > {CWD}/two.txt"),
    ];
    let evs = real::supervisor_turn(
        &r.d,
        "gemini",
        "gemini-digest-1",
        "t1",
        "",
        real::script(&steps),
    )
    .await;
    let ctx = format!("{evs:#?}\n{}", r.model.answers());
    let executes: Vec<_> = real::decisions(&evs)
        .into_iter()
        .filter(|p| p.tool_kind == "execute")
        .collect();
    assert_eq!(executes.len(), 2, "{ctx}");
    let transcript = evs
        .iter()
        .find_map(|e| match &e.event {
            Some(warden_proto::v1::turn_event::Event::Stop(s)) => Some(s.transcript_path.clone()),
            _ => None,
        })
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| panic!("no transcript: {ctx}"));
    let text = std::fs::read_to_string(&transcript).unwrap_or_default();
    let digests: Vec<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            v.to_string().contains("permission_decision")
                && executes
                    .iter()
                    .any(|p| v.to_string().contains(&p.decision_id))
        })
        .filter_map(|v| {
            let d = v
                .pointer("/data/action_digest")
                .or_else(|| v.get("action_digest"))?;
            d.as_str().map(str::to_string)
        })
        .collect();
    assert_eq!(digests.len(), 2, "{text}\n{ctx}");
    assert!(
        digests.iter().all(|d| d.starts_with("sha256:")),
        "{digests:?}"
    );
    assert_ne!(digests[0], digests[1], "{text}");
}
