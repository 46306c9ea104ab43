//! A real adapter under warden, offline: `@zed-industries/claude-code-acp` 0.16.2 (installed by
//! `.ci/run` under `<target>/npm/`) driven through the real daemons by the scripted fake
//! Anthropic Messages server in `tests/fake_models/`. A Write inside the root is asked, allowed
//! by the policy and lands; a Write to /etc is denied and nothing is written.
//!
//! Skipped, saying so, when node or the installed adapter is missing (run `.ci/run`, or set
//! `WARDEN_CLAUDE_CODE_ACP` to the package's directory).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use warden_e2e::real;
use warden_e2e::{Deployment, Options, bin_dir, binary, run_with_deadline};

/// Where `.ci/run` installs the pinned adapter (`WARDEN_CLAUDE_CODE_ACP` names the package
/// directory itself, inside a `node_modules`).
const INSTALL: &str = "npm/claude-code-acp-0.16.2";
const PACKAGE: &str = "node_modules/@zed-industries/claude-code-acp";

/// The adapter's entry point, or why the test cannot run here.
fn adapter() -> Result<(PathBuf, PathBuf), String> {
    let node = ["/usr/bin/node", "/usr/local/bin/node"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or("node is not installed")?;
    let package = match std::env::var_os("WARDEN_CLAUDE_CODE_ACP") {
        Some(p) => PathBuf::from(p),
        None => bin_dir()
            .parent()
            .map(|t| t.join(INSTALL).join(PACKAGE))
            .ok_or("no target directory")?,
    };
    let entry = package.join("dist/index.js");
    if !entry.is_file() {
        return Err(format!(
            "{} is missing (`.ci/run` installs @zed-industries/claude-code-acp@0.16.2 there)",
            entry.display()
        ));
    }
    Ok((node, entry))
}

/// Files named `name` anywhere under `dir`.
fn find(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            find(&p, name, out);
        } else if p.file_name().is_some_and(|n| n == name) {
            out.push(p);
        }
    }
}

#[tokio::test]
async fn claude_code_acp_writes_inside_the_root_when_allowed_and_nothing_outside_when_denied() {
    let (node, entry) = match adapter() {
        Ok(a) => a,
        Err(why) => {
            eprintln!("SKIPPED claude_code_acp test: {why}");
            return;
        }
    };
    let mut d = Deployment::new(Options::default());
    let model = real::FakeModel::start(real::ModelKind::Anthropic, d.dir.path()).await;
    let base = format!("ANTHROPIC_BASE_URL = \"http://127.0.0.1:{}\", ", model.port);
    d.opts.sets = claude_sets(&node, &entry, &base);
    for name in ["policy", "supervisor", "gateway"] {
        d.start(name).await;
    }
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();

    let script = r#"SCRIPT {"steps": [
        {"tool": ["mcp__acp__Write", "Write"], "input": {"file_path": "{CWD}/hello.txt", "content": "hello from the fake model\n"}},
        {"tool": ["mcp__acp__Write", "Write"], "input": {"file_path": "/etc/warden-claude-denied", "content": "x\n"}}
    ], "final": "done"}"#;
    let state = d.dir.path().to_string_lossy().to_string();
    let mut send = tokio::process::Command::new(binary("warden"));
    send.args([
        "--state-dir",
        &state,
        "send",
        "--agent",
        "claude-test",
        script,
    ])
    .stdin(Stdio::null());
    let out = run_with_deadline(&mut send, Duration::from_secs(120))
        .await
        .unwrap();
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let model_log = std::fs::read_to_string(&model.log).unwrap_or_default();
    let ctx = format!("{shown}\n-- fake model log --\n{model_log}");

    assert!(shown.contains("[policy] ALLOW"), "{ctx}");
    assert!(shown.contains("[policy] DENY"), "{ctx}");
    assert!(shown.contains("/etc/warden-claude-denied"), "{ctx}");
    // The adapter's fs/write_text_file carried exactly the content its Write's raw input held:
    // covered by that ALLOW (issue 24: bound to what it judged), no decision of its own.
    assert_eq!(shown.matches("[policy] ALLOW").count(), 1, "{ctx}");
    assert!(!shown.contains("fs/write_text_file"), "{ctx}");
    // Completed, with a refused permission.
    assert_eq!(out.status.code(), Some(4), "{ctx}");

    let mut written = Vec::new();
    find(&d.dir.path().join("supervisor"), "hello.txt", &mut written);
    assert_eq!(written.len(), 1, "{written:?}\n{ctx}");
    assert_eq!(
        std::fs::read_to_string(&written[0]).unwrap(),
        "hello from the fake model\n"
    );
    assert!(!Path::new("/etc/warden-claude-denied").exists());
    // Both writes were the model's, through the adapter.
    assert!(model_log.contains("hello.txt"), "{ctx}");
    assert!(model_log.contains("/etc/warden-claude-denied"), "{ctx}");
    // ... which reached the model only through the egress proxy: recorded with the conversation.
    let egress = real::egress_records(&d);
    for r in &egress {
        println!("egress: {r}");
    }
    // How the adapter reached it: through HTTPS_PROXY/HTTP_PROXY ("connect"/"forward") or, having
    // bypassed the proxy for loopback, at the mirrored address ("connect-mirrored").
    let kinds: std::collections::BTreeSet<&str> = egress
        .iter()
        .filter(|r| r["allowed"] == true)
        .filter_map(|r| r["kind"].as_str())
        .collect();
    println!("the adapter reached the fake model by: {kinds:?}");
    assert!(
        kinds.contains("connect") || kinds.contains("forward"),
        "the adapter ignored HTTPS_PROXY/HTTP_PROXY (only the mirrored port carried it): {kinds:?}"
    );
    assert!(
        egress.iter().any(|r| r["allowed"] == true
            && r["host"] == "127.0.0.1"
            && r["port"] == model.port
            && r["setting"] == "ANTHROPIC_BASE_URL"
            && r["bytes_down"].as_u64().unwrap_or(0) > 0),
        "no recorded egress to the fake model: {egress:#?}\n{ctx}"
    );
}

#[tokio::test]
async fn a_model_endpoint_not_allowed_fails_the_turn_in_seconds_naming_the_host_and_the_setting() {
    let (node, entry) = match adapter() {
        Ok(a) => a,
        Err(why) => {
            eprintln!("SKIPPED claude_code_acp test: {why}");
            return;
        }
    };
    // No base URL: the adapter calls api.anthropic.com:443, which claude-test's (empty)
    // egress_allow does not name.
    let mut d = Deployment::new(Options::default());
    d.opts.sets = claude_sets(&node, &entry, "");
    for name in ["policy", "supervisor", "gateway"] {
        d.start(name).await;
    }
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let state = d.dir.path().to_string_lossy().to_string();
    let mut send = tokio::process::Command::new(binary("warden"));
    send.args([
        "--state-dir",
        &state,
        "send",
        "--agent",
        "claude-test",
        "say hello",
    ])
    .stdin(Stdio::null());
    let started = std::time::Instant::now();
    let out = run_with_deadline(&mut send, Duration::from_secs(120))
        .await
        .unwrap();
    let took = started.elapsed();
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let egress = real::egress_records(&d);
    let ctx = format!("took {took:?}\n{shown}\n-- egress --\n{egress:#?}");
    assert!(
        shown.contains(
            "egress to api.anthropic.com:443 refused: not in [agents.claude-test] egress_allow"
        ),
        "{ctx}"
    );
    assert_ne!(
        out.status.code(),
        Some(0),
        "the task must not complete: {ctx}"
    );
    assert!(
        egress.iter().any(|r| r["allowed"] == false
            && r["host"] == "api.anthropic.com"
            && r["status"] == 403),
        "{ctx}"
    );
    assert!(
        egress.iter().all(|r| r["allowed"] == false),
        "nothing may have gone out: {ctx}"
    );
    // Seconds after the adapter started, not minutes of retries (start-up included).
    assert!(took < Duration::from_secs(60), "{ctx}");
    println!("refused model endpoint: the task ended after {took:?}");
}

/// Issue 39 with a real adapter: `send -C REPO` has Claude Code (driven by the fake model) read
/// and rewrite a file of a git repository and add one, on warden's copy; REPO is untouched until
/// `tasks apply`, after which `git diff` there (with git's full blob ids) is exactly the task's
/// diff.
#[tokio::test]
async fn claude_code_acp_edits_a_copy_of_a_repository_and_the_diff_applies_back() {
    let (node, entry) = match adapter() {
        Ok(a) => a,
        Err(why) => {
            eprintln!("SKIPPED claude_code_acp test: {why}");
            return;
        }
    };
    let mut d = Deployment::new(Options::default());
    let model = real::FakeModel::start(real::ModelKind::Anthropic, d.dir.path()).await;
    let base = format!("ANTHROPIC_BASE_URL = \"http://127.0.0.1:{}\", ", model.port);
    d.opts.sets = claude_sets(&node, &entry, &base);
    // As `warden up` sets it on a local deployment: copies of the user's own directories.
    d.opts
        .sets
        .push(("supervisor".into(), "copies.local_dirs=true".into()));
    for name in ["policy", "supervisor", "gateway"] {
        d.start(name).await;
    }
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let repo = d.dir.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .current_dir(&repo)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .expect("git runs");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    git(&["init", "-q"]);
    std::fs::write(repo.join("README"), "base\n").unwrap();
    git(&["add", "-A"]);
    git(&["commit", "-qm", "base"]);
    let dir = repo.to_string_lossy().to_string();

    let script = r#"SCRIPT {"steps": [
        {"tool": ["mcp__acp__Read", "Read"], "input": {"file_path": "{CWD}/README"}},
        {"tool": ["mcp__acp__Write", "Write"], "input": {"file_path": "{CWD}/README", "content": "base\nedited by claude\n"}},
        {"tool": ["mcp__acp__Write", "Write"], "input": {"file_path": "{CWD}/src/hello.txt", "content": "hello from the fake model\n"}}
    ], "final": "done"}"#;
    let state = d.dir.path().to_string_lossy().to_string();
    let warden = |args: Vec<String>| {
        let mut c = tokio::process::Command::new(binary("warden"));
        c.args(["--state-dir", &state])
            .args(args)
            .stdin(Stdio::null());
        c
    };
    let mut send = warden(
        [
            "send",
            "--agent",
            "claude-test",
            "-C",
            &dir,
            "-o",
            "json",
            script,
        ]
        .map(String::from)
        .to_vec(),
    );
    let out = run_with_deadline(&mut send, Duration::from_secs(120))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let model_log = std::fs::read_to_string(&model.log).unwrap_or_default();
    let ctx = format!(
        "{stdout}{}\n-- fake model log --\n{model_log}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{ctx}");
    let end: serde_json::Value = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["type"] == "end")
        .unwrap_or_else(|| panic!("no end record: {ctx}"));
    assert_eq!(
        end["filesChanged"],
        serde_json::json!(["README", "src/hello.txt"]),
        "{ctx}"
    );
    // The repository itself is untouched.
    assert_eq!(
        std::fs::read_to_string(repo.join("README")).unwrap(),
        "base\n"
    );
    assert!(!repo.join("src").exists());

    let task = end["taskId"].as_str().unwrap().to_string();
    let mut diff = warden(["tasks", "diff", &task[..8]].map(String::from).to_vec());
    let shown = run_with_deadline(&mut diff, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    let mut apply = warden(
        ["tasks", "apply", &task[..8], "-C", &dir]
            .map(String::from)
            .to_vec(),
    );
    let applied = run_with_deadline(&mut apply, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    git(&["add", "-N", "."]);
    let theirs = git(&["diff", "--no-color", "--no-ext-diff", "--full-index"]);
    assert_eq!(
        theirs, shown,
        "git diff after tasks apply is the task's diff"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("src/hello.txt")).unwrap(),
        "hello from the fake model\n"
    );
}

/// The supervisor's `--set`s of the `claude-test` agent: the installed adapter under node, in
/// its own network namespace (`network = "proxy"`, no `egress_allow` entry), with `base` (an
/// `ANTHROPIC_BASE_URL = "...", ` or nothing) in its fixed environment.
fn claude_sets(node: &Path, entry: &Path, base: &str) -> Vec<(String, String)> {
    // node_modules: the adapter and the Claude Code it runs, read-only inside the sandbox.
    let modules = entry
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let set_env = format!(
        "{{ {base}ANTHROPIC_API_KEY = \"sk-ant-fake-key\", \
         IS_SANDBOX = \"1\", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = \"1\", \
         DISABLE_AUTOUPDATER = \"1\", DISABLE_TELEMETRY = \"1\", DISABLE_ERROR_REPORTING = \"1\" }}"
    );
    let sup = |kv: String| ("supervisor".to_string(), kv);
    vec![
        sup(format!(
            "agents.claude-test.command={:?}",
            node.to_string_lossy()
        )),
        sup(format!(
            "agents.claude-test.args=[{:?}]",
            entry.to_string_lossy()
        )),
        // Its own network namespace: the fake model on loopback is reachable only through the
        // egress proxy, allowed because ANTHROPIC_BASE_URL names it (no egress_allow entry).
        sup("agents.claude-test.network=\"proxy\"".into()),
        sup(format!("agents.claude-test.set_env={set_env}")),
        sup(format!(
            "agents.claude-test.read_only_paths=[{:?}]",
            modules.to_string_lossy()
        )),
        sup("agents.claude-test.supervised_mode=\"default\"".into()),
        sup("agents.claude-test.supervised_modes=[\"plan\"]".into()),
        sup("limits.handshake_deadline_ms=30000".into()),
    ]
}
