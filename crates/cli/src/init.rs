//! `warden init [DIR]`: a commented starter configuration for `warden up --config DIR`, one
//! file per daemon in the format of `deploy/config/` (each a complete configuration, so each
//! daemon's `--check-config` accepts it on its own). `warden up` still sets what its layout
//! owns (state directories, sockets, the HTTP address, the token file) over these files.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::layout::Layout;

/// Why the starter set was not written.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("{}: already exists; remove it or choose another directory", .0.display())]
    Exists(PathBuf),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The starter files for `layout`: (daemon, text).
pub fn starter(layout: &Layout) -> Vec<(&'static str, String)> {
    let q = |p: PathBuf| crate::layout::toml_str(&p);
    let policy = format!(
        r#"# warden-policy: decides every permission an agent asks for, and audits each decision.
# Used by `warden up --config DIR`; check it with `warden-policy --check-config --config FILE`.
# `warden up` sets daemon.state_dir, daemon.log_format, listen.socket and admin.socket itself.

[daemon]
state_dir = {state}
# log_level = "info"

[listen]                 # PolicyService.Decide, for the supervisor
socket = {socket}

[admin]                  # AdminService (status, audit, reload), for operators
socket = {admin}

[audit]
sync = true              # fdatasync each decision's record before answering

[policy.global]
# approve-all: what the boundary floor allows is allowed; approve-reads: reads only;
# deny-all. An escalation nobody can answer becomes `non_interactive`.
mode = "approve-all"
non_interactive = "deny"
"#,
        state = q(layout.state_of("policy")),
        socket = q(layout.socket_of("policy")),
        admin = q(layout.policy_admin_socket()),
    );
    let supervisor = format!(
        r#"# warden-supervisor: runs the agents, contained, and asks the policy about every action.
# Keys and defaults: services/supervisor/README.md. `warden up` sets daemon.state_dir,
# daemon.log_format, listen.socket and policy.socket itself.
#
# The agents defined here are the agents callers can use: the gateway asks the supervisor for
# this list (names may hold letters, digits, '-' and '_').

[daemon]
state_dir = {state}

[listen]
socket = {socket}

[policy]
socket = {policy}
# decide_deadline_ms = 200

# [limits]
# turn_timeout_secs = 600
# idle_timeout_secs = 900

[agents]
default = "scripted"

# An agent of your own (an ACP agent on stdio):
# [agents.my-agent]
# description = "what the agent card says about it"
# command = "/usr/bin/node"
# args = ["/opt/adapters/node_modules/@zed-industries/claude-code-acp/dist/index.js"]
# env = ["ANTHROPIC_API_KEY"]          # names passed through from warden up's environment
# set_env = {{ IS_SANDBOX = "1" }}       # fixed values
# network = "proxy"                    # "none" (default) | "proxy" (own namespace, out only
#                                      # through the egress proxy) | "host" (the host's network)
# egress_allow = ["api.anthropic.com:443"]  # with "proxy"; every *_BASE_URL of its env is added
# read_only_paths = ["/opt/adapters"]  # what it may read besides the system under bubblewrap
# supervised_mode = "default"
# pool_size = 1                        # warm agents kept started for new conversations: the
#                                      # first task of a new context does not wait for the
#                                      # adapter to start (0 = none, the default; the built-in
#                                      # scripted agent keeps 1). They count as live agents.

# [sandbox]
# bubblewrap = true
"#,
        state = q(layout.state_of("supervisor")),
        socket = q(layout.socket_of("supervisor")),
        policy = q(layout.socket_of("policy")),
    );
    let gateway = format!(
        r#"# warden-gateway: A2A for callers. `warden up` sets daemon.state_dir, listen.socket,
# supervisor.socket, http.bind, http.public_url and auth.token_file itself (`--http` chooses
# the address). The agents come from the supervisor's configuration.

[daemon]
state_dir = {state}

[listen]
socket = {socket}

[supervisor]
socket = {supervisor}
# turn_timeout_seconds = 0   # 0 = the supervisor's own limit

[http]
bind = "127.0.0.1:7420"
public_url = "http://127.0.0.1:7420"

[auth]
token_file = {token}

# How the card describes an agent (optional; the names come from the supervisor):
# [[agents.list]]
# name = "my-agent"
# description = "..."
# tags = ["coding"]

[card]
name = "warden"

# The MCP front at /mcp (and `warden mcp`); every key has a default:
# [mcp]
# enabled = true
# allowed_origins = []          # browser origins beyond the public URL's (and loopback ones)
# task_max_bytes = 16384        # a longer task is refused before anything starts
# default_timeout_seconds = 600
# max_timeout_seconds = 3600
# job_retention_seconds = 3600  # a finished background job's result is kept this long
# max_jobs = 16                 # background jobs per caller
# max_sessions = 2048           # 2025-11-25 sessions open at once, of every caller
# max_sessions_per_principal = 512  # sessions per caller (default max_sessions / 4)
# session_idle_seconds = 300    # an idle session is ended and its memory handed back
"#,
        state = q(layout.state_of("gateway")),
        socket = q(layout.socket_of("gateway")),
        supervisor = q(layout.socket_of("supervisor")),
        token = q(layout.token_file()),
    );
    let approver = format!(
        r#"# warden-approver (only with `warden up --approver`): what the policy escalates waits for
# a person. `warden up --approver` sets the sockets, upstream and web page itself. The supervisor
# learns approval.deadline_ms from the approver (plus the upstream's budget): no need to raise
# its decide_deadline_ms. At most one hour in all, or the approver refuses to start.

[daemon]
state_dir = {state}

[listen]
socket = {socket}

[admin]
socket = {admin}

[upstream]
socket = {policy}

[approval]
deadline_ms = 300000

[web]
bind = ""
"#,
        state = q(layout.state_of("approver")),
        socket = q(layout.socket_of("approver")),
        admin = q(layout.approver_admin_socket()),
        policy = q(layout.socket_of("policy")),
    );
    vec![
        ("policy", policy),
        ("supervisor", supervisor),
        ("gateway", gateway),
        ("approver", approver),
    ]
}

/// Writes the starter set into `dir` (created 0700 if missing); refuses to overwrite a file.
pub fn write(dir: &Path, layout: &Layout) -> Result<Vec<PathBuf>, InitError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| InitError::Io { path, source }
    };
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io(dir))?;
    }
    let files = starter(layout);
    for (daemon, _) in &files {
        let p = crate::layout::file_of(dir, daemon);
        if p.symlink_metadata().is_ok() {
            return Err(InitError::Exists(p));
        }
    }
    let mut written = Vec::new();
    for (daemon, text) in files {
        let p = crate::layout::file_of(dir, daemon);
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)
            .map_err(io(&p))?;
        f.write_all(text.as_bytes()).map_err(io(&p))?;
        written.push(p);
    }
    Ok(written)
}
