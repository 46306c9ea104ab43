//! What the real-adapter tests share: the pinned adapters `.ci/run` installs under
//! `<target>/npm/<name>-<version>` (missing: a failure under CI, a printed skip elsewhere), the
//! scripted fake model servers in `tests/fake_models/` (started on loopback, killed on drop), a
//! deployment whose supervisor runs one adapter against one of them, and `warden send`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{Deployment, Options, bin_dir, binary, run_with_deadline};

/// One pinned adapter as `.ci/run` installs it.
#[derive(Debug, Clone, Copy)]
pub struct Pinned {
    /// `<package>@<version>`, as an agent entry's `adapter` names it.
    pub spec: &'static str,
    /// Which fake model it talks to.
    pub model: ModelKind,
}

pub const CLAUDE_CODE_ACP: Pinned = Pinned {
    spec: "@zed-industries/claude-code-acp@0.16.2",
    model: ModelKind::Anthropic,
};
pub const CLAUDE_AGENT_ACP: Pinned = Pinned {
    spec: "@agentclientprotocol/claude-agent-acp@0.101.0",
    model: ModelKind::Anthropic,
};
pub const CODEX_ACP_016: Pinned = Pinned {
    spec: "@zed-industries/codex-acp@0.16.0",
    model: ModelKind::OpenAi,
};
pub const CODEX_ACP_26: Pinned = Pinned {
    spec: "@agentclientprotocol/codex-acp@2.6.0",
    model: ModelKind::OpenAi,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    Anthropic,
    OpenAi,
}

/// Where `.ci/run` installs the adapters (`WARDEN_ADAPTERS_DIR` overrides).
pub fn adapters_dir() -> PathBuf {
    match std::env::var_os("WARDEN_ADAPTERS_DIR") {
        Some(d) => PathBuf::from(d),
        None => bin_dir()
            .parent()
            .map(|t| t.join("npm"))
            .unwrap_or_else(|| PathBuf::from("target/npm")),
    }
}

/// The package directory of `p` when it and Node.js are installed. Missing: panics under CI
/// (`CI=true`), else prints why the test is skipped and returns `None`.
pub fn installed(p: Pinned) -> Option<PathBuf> {
    let at = p.spec.rfind('@').unwrap_or(0);
    let (name, version) = (&p.spec[..at], &p.spec[at + 1..]);
    let short = name.rsplit('/').next().unwrap_or(name);
    let pkg = adapters_dir()
        .join(format!("{short}-{version}"))
        .join("node_modules")
        .join(name);
    let why = if !pkg.join("package.json").is_file() {
        format!(
            "{} is missing (`.ci/run` installs {} there)",
            pkg.display(),
            p.spec
        )
    } else if !Path::new("/usr/bin/node").is_file() && !Path::new("/usr/local/bin/node").is_file() {
        "node is not installed".to_string()
    } else {
        return Some(pkg);
    };
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{why}");
    }
    eprintln!("SKIPPED: {why}");
    None
}

/// A fake model server; killed when dropped.
pub struct FakeModel {
    _child: tokio::process::Child,
    pub port: u16,
    pub log: PathBuf,
}

impl FakeModel {
    /// Starts the fake for `kind` with its request log in `dir`.
    pub async fn start(kind: ModelKind, dir: &Path) -> FakeModel {
        let (script, log) = match kind {
            ModelKind::Anthropic => ("fake_anthropic.py", dir.join("fake-anthropic.jsonl")),
            ModelKind::OpenAi => ("fake_openai.py", dir.join("fake-openai.jsonl")),
        };
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fake_models")
            .join(script);
        let mut child = tokio::process::Command::new("python3")
            .arg(&script)
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs the fake model server");
        let out = child.stdout.take().expect("its stdout");
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(10),
            BufReader::new(out).read_line(&mut line),
        )
        .await
        .expect("the fake model server says its port within 10 s")
        .expect("read its port");
        FakeModel {
            _child: child,
            port: line.trim().parse().expect("a port number"),
            log,
        }
    }

    /// What the model was asked so far (one JSON line per request).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// One line per request: its path and what the fake answered (for failure messages).
    pub fn answers(&self) -> String {
        self.log_text()
            .lines()
            .map(|l| match serde_json::from_str::<serde_json::Value>(l) {
                Ok(v) => format!(
                    "{} {} tools={} cwd={} -> {}",
                    v["method"], v["path"], v["tools"], v["cwd"], v["answer"]
                ),
                Err(_) => l.chars().take(300).collect(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The supervisor settings (`--set` values) that run `p` as agent `name` against `model`.
pub fn agent_sets(name: &str, p: Pinned, model: &FakeModel) -> Vec<(String, String)> {
    let sup = |kv: String| ("supervisor".to_string(), kv);
    let env = match p.model {
        ModelKind::Anthropic => format!(
            "{{ ANTHROPIC_BASE_URL = \"http://127.0.0.1:{}\", ANTHROPIC_API_KEY = \"sk-ant-fake-key\", \
             IS_SANDBOX = \"1\", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = \"1\", \
             DISABLE_AUTOUPDATER = \"1\", DISABLE_TELEMETRY = \"1\", DISABLE_ERROR_REPORTING = \"1\" }}",
            model.port
        ),
        ModelKind::OpenAi => format!(
            "{{ OPENAI_BASE_URL = \"http://127.0.0.1:{}/v1\", OPENAI_API_KEY = \"sk-fake-openai-key\" }}",
            model.port
        ),
    };
    vec![
        sup(format!(
            "adapters.dir={:?}",
            adapters_dir().to_string_lossy()
        )),
        sup(format!("agents.{name}.command=\"\"")),
        sup(format!("agents.{name}.adapter={:?}", p.spec)),
        // For now: the agent shares the host's network to reach the fake model on loopback.
        sup(format!("agents.{name}.network=\"host\"")),
        sup(format!("agents.{name}.set_env={env}")),
        sup("limits.handshake_deadline_ms=60000".into()),
    ]
}

/// Starts policy, supervisor and gateway with `sets` and writes the URL file `warden` reads.
pub async fn deploy(mut d: Deployment, sets: Vec<(String, String)>) -> Deployment {
    d.opts.sets.extend(sets);
    for name in ["policy", "supervisor", "gateway"] {
        d.start(name).await;
    }
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    d
}

/// A fresh deployment (state under the target directory).
pub fn deployment() -> Deployment {
    Deployment::new(Options::default())
}

/// What `warden send` showed and how it ended.
pub struct Sent {
    pub code: Option<i32>,
    pub shown: String,
}

/// `warden send --agent AGENT TEXT` (plus `extra` flags) within `deadline`.
pub async fn send(
    d: &Deployment,
    agent: &str,
    text: &str,
    extra: &[&str],
    deadline: Duration,
) -> Sent {
    let state = d.dir.path().to_string_lossy().to_string();
    let mut cmd = tokio::process::Command::new(binary("warden"));
    cmd.args(["--state-dir", &state, "send", "--agent", agent])
        .args(extra)
        .arg(text)
        .stdin(Stdio::null());
    let t0 = std::time::Instant::now();
    let out = run_with_deadline(&mut cmd, deadline)
        .await
        .expect("warden send finishes");
    eprintln!("warden send --agent {agent}: {:?}", t0.elapsed());
    Sent {
        code: out.status.code(),
        shown: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Files named `name` anywhere under `dir` (links not followed).
pub fn find(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    find_into(dir, name, &mut out);
    out
}

fn find_into(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.file_name().is_some_and(|n| n == name) {
            out.push(p.clone());
        }
        if p.is_dir() && !p.is_symlink() {
            find_into(&p, name, out);
        }
    }
}

/// A name no other test run uses (files the agent is asked to write outside its root).
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}
