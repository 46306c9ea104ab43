//! The real OpenCode under warden, offline: `opencode-ai` 1.18.33 (the built-in `opencode`, a
//! native executable, its own ACP agent with `acp`), installed by `.ci/run` under
//! `<target>/npm/`, driven through the real daemons by the scripted fake OpenAI server's Chat
//! Completions (`tests/fake_models/fake_openai.py`), which warden's managed configuration
//! (`/etc/opencode/opencode.json`) names as its only provider. Every edit and command is asked
//! and warden-policy decides each.
//!
//! Missing installs fail under CI (`CI=true`) and are a printed skip elsewhere.

use std::time::Duration;

use warden_e2e::real::{self, Matrix, OPENCODE, Vocab};

mod real_support;
use real_support::WARM_IDLE;
use warden_proto::v1::Verdict;

fn opencode() -> Matrix {
    Matrix {
        pinned: OPENCODE,
        agent: "opencode",
        vocab: Vocab::OpenCode,
        extra_sets: Vec::new(),
    }
}

/// A write inside the root is asked, ALLOWed and lands; the first turn reached nothing but the
/// fake model, through the egress proxy, every connection recorded under its conversation.
#[tokio::test]
async fn opencode_write_inside_is_allowed_and_lands_through_the_proxy_only() {
    let Some(r) = opencode().write_inside_lands_through_the_proxy_only().await else {
        return;
    };
    let log = r.model.log_text();
    assert!(
        log.contains("/chat/completions") && log.contains("\"bash\""),
        "{log}"
    );
}

#[tokio::test]
async fn opencode_writes_outside_by_dotdot_absolute_and_link_are_denied() {
    opencode().writes_outside_are_denied().await;
}

#[tokio::test]
async fn opencode_shell_writes_stay_in_the_sandbox() {
    opencode().shell_writes_stay_in_the_sandbox().await;
}

#[tokio::test]
async fn opencode_never_gets_an_always_answer() {
    opencode().always_is_never_chosen().await;
}

#[tokio::test]
async fn opencode_settings_written_by_the_model_change_nothing() {
    opencode().model_written_settings_change_nothing().await;
}

#[tokio::test]
async fn opencode_detached_children_die_with_cancel() {
    opencode().detached_children_die_with_cancel().await;
}

/// A misconfigured OpenCode (configuration that is not JSON in `OPENCODE_CONFIG_CONTENT`, an
/// operator's value): the task FAILS and its message carries what OpenCode said on stderr.
#[tokio::test]
async fn opencode_misconfigured_fails_with_its_stderr() {
    let mut m = opencode();
    m.extra_sets.push((
        "supervisor".into(),
        r#"agents.opencode.set_env={ OPENCODE_CONFIG_CONTENT = "{\"permission\": nope" }"#.into(),
    ));
    let Some(r) = m.start().await else { return };
    let sent = m.send(&r, &[]).await;
    assert_eq!(sent.code, Some(1), "{}", sent.shown);
    assert!(sent.shown.contains("[FAILED]"), "{}", sent.shown);
    assert!(
        sent.shown
            .contains("OPENCODE_CONFIG_CONTENT is not valid JSON"),
        "OpenCode's stderr is not in the message: {}",
        sent.shown
    );
}

/// warden's managed configuration is OpenCode's last word. The operator's home template makes
/// a primary agent that allows every command and edit its default, and allows them at the top
/// level too: the session still starts in `build` (the supervisor forces it through the `mode`
/// config option, and says so), and the command is asked. (Without warden's managed file the
/// template's `"bash": "allow"` stands: OpenCode's own default for commands is to run them.)
#[tokio::test]
async fn opencode_reads_wardens_managed_configuration() {
    let template = tempfile::Builder::new()
        .prefix("opencode-home")
        .tempdir_in(warden_e2e::test_root())
        .expect("a home template");
    let config = template.path().join(".config/opencode");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("opencode.json"),
        r#"{"permission": {"bash": "allow", "edit": "allow", "external_directory": "allow"},
            "default_agent": "yolo",
            "agent": {"yolo": {"mode": "primary", "description": "everything allowed",
                               "permission": {"bash": "allow", "edit": "allow"}}}}"#,
    )
    .unwrap();
    let mut m = opencode();
    m.extra_sets.push((
        "supervisor".into(),
        format!(
            "agents.opencode.home={:?}",
            template.path().to_string_lossy()
        ),
    ));
    let Some(r) = m.start().await else { return };
    let evs = real::supervisor_turn(
        &r.d,
        "opencode",
        "opencode-managed-1",
        "t1",
        "",
        real::script(&[Vocab::OpenCode.shell("echo x > {CWD}/x.txt")]),
    )
    .await;
    let asked = real::decisions(&evs);
    assert!(
        asked.iter().any(|p| p.tool_kind == "execute"),
        "the command was not asked: {evs:#?}\n{}",
        r.model.answers()
    );
    let log = std::fs::read_to_string(r.d.log_file("supervisor")).unwrap_or_default();
    let forced = log
        .lines()
        .find(|l| l.contains("started outside its supervised mode"))
        .unwrap_or_default();
    assert_eq!(real::log_field(forced, "from"), Some("yolo"), "{log}");
    assert_eq!(real::log_field(forced, "to"), Some("build"), "{log}");
    assert_eq!(r.in_state("x.txt").len(), 1, "{evs:#?}");
}

/// A `review` conversation runs OpenCode's `plan` agent (`mode=plan`): a write into the root
/// does not land without an ALLOW, and no command runs without being asked.
#[tokio::test]
async fn opencode_review_plans_and_stays_supervised() {
    let Some(r) =
        real_support::review_plans_and_stays_supervised(&opencode(), "opencode-plan-1").await
    else {
        return;
    };
    let log = std::fs::read_to_string(r.d.log_file("supervisor")).unwrap_or_default();
    assert!(
        log.lines()
            .any(|l| l.contains("planning for the verb") && l.contains("value=plan")),
        "the plan mode was not set: {log}"
    );
}

#[tokio::test]
async fn opencode_warm_under_the_proxy_is_handed_out_and_its_first_turn_works() {
    opencode()
        .warm_agent_is_handed_out_through_the_proxy(WARM_IDLE, false)
        .await;
}

/// The network is its model's API and nothing else: a command that opens sockets itself (and a
/// fetch the model asks for) reach nothing, and every connection allowed for the conversation
/// went to the fake model.
#[tokio::test]
async fn opencode_reaches_nothing_but_its_model() {
    real_support::reaches_nothing_but_its_model(
        &opencode(),
        r#"{"tool": "webfetch", "args": {"url": "https://example.com/", "format": "text"}}"#,
    )
    .await;
}

/// OpenCode's search tools (not asked: they only read) run `rg` from `PATH` (`.ci/run` installs
/// ripgrep; without it OpenCode downloads ripgrep from GitHub, which the egress proxy refuses)
/// and find what is in the root, with no connection but the model's.
#[tokio::test]
async fn opencode_search_tools_work_offline() {
    let m = opencode();
    let Some(r) = m.start().await else { return };
    let steps = [
        // Where OpenCode looks for `rg` when none is on `PATH` is read-only: nothing planted
        // there runs for its search tools, outside the shell commands are held in.
        Vocab::OpenCode.shell(
            "mkdir -p ~/.cache/opencode/bin; \
             printf '#!/bin/sh\\ntouch {CWD}/planted-rg-ran\\n' > ~/.cache/opencode/bin/rg; \
             chmod +x ~/.cache/opencode/bin/rg; echo tried > {CWD}/plant-tried.txt; \
             test -e ~/.cache/opencode/bin/rg && echo landed > {CWD}/plant-landed.txt",
        ),
        Vocab::OpenCode.write("{CWD}/needle.txt", "a haystack with one needle-4711 in it"),
        r#"{"tool": "grep", "args": {"pattern": "needle-4711"}}"#.to_string(),
        r#"{"tool": "glob", "args": {"pattern": "**/needle.txt"}}"#.to_string(),
    ];
    let sent = m.send(&r, &steps).await;
    let ctx = r.ctx(&sent);
    assert_eq!(sent.code, Some(0), "{ctx}");
    let records = real::egress_records(&r.d);
    assert!(
        records
            .iter()
            .all(|rec| rec["allowed"] == true && rec["port"] == r.model.port),
        "a connection other than to the fake model: {records:#?}\n{ctx}"
    );
    assert_eq!(r.in_state("plant-tried.txt").len(), 1, "{ctx}");
    assert!(
        r.in_state("plant-landed.txt").is_empty() && r.in_state("planted-rg-ran").is_empty(),
        "{ctx}"
    );
    // What the tools answered went back to the model: the match and the file found.
    let log = r.model.log_text();
    assert!(
        log.matches("needle.txt").count() >= 3 && log.contains("Found 1 match"),
        "{ctx}"
    );
}

/// OpenCode's ACP front is a client of OpenCode's own server, which listens on loopback in the
/// sandbox and answers permission requests for whoever asks. A command allowed once starts a
/// background process that would answer every later request "always" before warden decides,
/// and tries to trace OpenCode: its commands run in `warden-agent-shell`, where neither works,
/// so every later command is still asked (without it, a client taking 1 s to decide was asked
/// for two of three commands, the third ran unasked).
#[tokio::test]
async fn opencode_commands_cannot_answer_its_permission_requests() {
    let m = opencode();
    let Some(r) = m.start().await else { return };
    let poller = r#"
import json, time, urllib.request
def tries(what, f):
    try: return what + ' ' + str(f())
    except Exception as e: return what + ' failed: ' + repr(e)
end = time.time() + 25
while time.time() < end:
    def answer():
        pending = json.load(urllib.request.urlopen('http://127.0.0.1:4096/permission', timeout=2))
        for p in pending:
            req = urllib.request.Request('http://127.0.0.1:4096/permission/%s/reply' % p['id'], data=b'{"reply": "always"}', headers={'Content-Type': 'application/json'}, method='POST')
            urllib.request.urlopen(req, timeout=2)
        return 'answered %d' % len(pending)
    print(tries('poll', answer), flush=True)
    time.sleep(0.05)
"#;
    let tracer = "import ctypes, os, sys\nl = ctypes.CDLL(None, use_errno=True)\nfor p in os.listdir('/proc'):\n    if p.isdigit() and open('/proc/%s/comm' % p).read().strip().startswith('opencode'):\n        print('seize', p, l.ptrace(0x4206, int(p), 0, 0), ctypes.get_errno())\n";
    // The scripts travel in the command, in hex (no quoting to get wrong).
    let hex = |text: &str| -> String { text.bytes().map(|b| format!("{b:02x}")).collect() };
    let unhex = "/usr/bin/python3 -c 'import sys; open(sys.argv[1], \"w\").write(bytes.fromhex(sys.argv[2]).decode())'";
    let steps = [
        Vocab::OpenCode.shell(&format!(
            "{unhex} {{CWD}}/poller.py {}; {unhex} {{CWD}}/tracer.py {}; \
             setsid nohup /usr/bin/python3 {{CWD}}/poller.py > {{CWD}}/poller.log 2>&1 & \
             /usr/bin/python3 {{CWD}}/tracer.py > {{CWD}}/tracer.log 2>&1; sleep 2",
            hex(poller),
            hex(tracer)
        )),
        Vocab::OpenCode.shell("echo two >> {CWD}/count.txt"),
        Vocab::OpenCode.shell("echo three >> {CWD}/count.txt"),
    ];
    let sent = m.send(&r, &steps).await;
    let ctx = r.ctx(&sent);
    let read = |name: &str| {
        r.in_state(name)
            .first()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .unwrap_or_default()
    };
    let polled = read("poller.log");
    assert!(
        polled.contains("poll"),
        "the poller did not run: {polled}\n{ctx}"
    );
    assert!(
        !polled.contains("answered"),
        "it reached OpenCode's server: {polled}\n{ctx}"
    );
    // Refused by the kernel (Landlock: EACCES), not for want of a server.
    assert!(polled.contains("Permission denied"), "{polled}\n{ctx}");
    let traced = read("tracer.log");
    assert!(
        traced.contains("seize") && !traced.contains(" 0 0"),
        "OpenCode was traced: {traced}\n{ctx}"
    );
    assert_eq!(read("count.txt"), "two\nthree\n", "{ctx}");
    assert_eq!(sent.shown.matches("[policy] ALLOW").count(), 3, "{ctx}");
}

/// What OpenCode reads at start, planted by one allowed command (its configuration files and
/// directories, "always" approvals written into its database, shell and git start files),
/// then an idle stop and restart of the same conversation: every command is still asked.
#[tokio::test]
async fn opencode_planted_configuration_changes_nothing_after_an_idle_restart() {
    opencode()
        .planted_configuration_changes_nothing_after_an_idle_restart()
        .await;
}

/// Issue 35: OpenCode's ACP front relays the permission requests of its own sessions only, so
/// a `task` subagent's command waited for an answer that never came and the turn hung until
/// the caller's timeout, the command never decided. Under warden's managed configuration
/// `task` is refused by OpenCode itself: the subagent never starts, its command never runs,
/// and the turn goes on to its next step (asked and decided) and ends at once.
#[tokio::test]
async fn opencode_task_subagent_is_refused_and_the_turn_does_not_hang() {
    let m = opencode();
    let Some(r) = m.start().await else { return };
    let inner = real::script(&[Vocab::OpenCode.shell("echo sub > {CWD}/subagent-ran.txt")]);
    let task = format!(
        r#"{{"tool": "task", "args": {{"description": "run a command", "prompt": {}, "subagent_type": "general"}}}}"#,
        serde_json::Value::String(inner)
    );
    let steps = [
        task,
        Vocab::OpenCode.shell("echo after > {CWD}/after-task.txt"),
    ];
    let t0 = std::time::Instant::now();
    let evs = real::supervisor_turn(
        &r.d,
        "opencode",
        "opencode-task-1",
        "t1",
        "",
        real::script(&steps),
    )
    .await;
    let took = t0.elapsed();
    let ctx = format!("{evs:#?}\n{}", r.model.answers());
    let stop = evs
        .iter()
        .find_map(|e| match &e.event {
            Some(warden_proto::v1::turn_event::Event::Stop(s)) => Some(s.clone()),
            _ => None,
        })
        .expect("a stop");
    assert_eq!(stop.stop_reason, "end_turn", "{ctx}");
    assert!(
        took < Duration::from_secs(60),
        "the turn took {took:?}: {ctx}"
    );
    assert!(
        r.in_state("subagent-ran.txt").is_empty(),
        "the subagent's command ran: {ctx}"
    );
    // Every command that ran was decided.
    let asked = real::decisions(&evs);
    assert!(
        asked
            .iter()
            .any(|p| p.tool_kind == "execute" && p.verdict == Verdict::Allow as i32),
        "{ctx}"
    );
    assert_eq!(r.in_state("after-task.txt").len(), 1, "{ctx}");
}

/// Issue 35: OpenCode's `external_directory` request (ACP kind `other`) names the place
/// outside the root its next tool would reach; it was judged as a bare `other` in an owned root
/// ("other runs in a root warden created"), the place unseen. Now the policy judges the place:
/// the decision names it (`floor.other.reaches-outside-root`: reaching it only lets OpenCode
/// read there, as every agent may; an edit or command there is asked and judged on its own)
/// and the judged action its digest covers lists it.
#[tokio::test]
async fn opencode_external_directory_is_judged_by_the_place_it_names() {
    let m = opencode();
    let Some(r) = m.start().await else { return };
    let steps = [r#"{"tool": "read", "args": {"filePath": "/etc/hosts"}}"#.to_string()];
    let evs = real::supervisor_turn(
        &r.d,
        "opencode",
        "opencode-external-1",
        "t1",
        "",
        real::script(&steps),
    )
    .await;
    let ctx = format!("{evs:#?}\n{}", r.model.answers());
    let asked = real::decisions(&evs);
    let ext = asked
        .iter()
        .find(|p| p.tool_kind == "other")
        .unwrap_or_else(|| panic!("no external_directory request was decided: {ctx}"));
    assert_eq!(ext.verdict, Verdict::Allow as i32, "{ext:?}\n{ctx}");
    assert_eq!(
        ext.rule, "floor.other.reaches-outside-root",
        "{ext:?}\n{ctx}"
    );
    assert!(ext.reason.contains("/etc"), "{ext:?}\n{ctx}");
}
