//! The flags `warden up` gives each daemon: where its sockets, state and logs are in the layout,
//! its metrics address, and the listeners the agents' egress proxy must refuse.

use std::path::Path;

use super::*;

/// Where daemon `name` serves its metrics with `warden up --metrics BASE`: the gateway on BASE,
/// the supervisor on BASE+1, the policy on BASE+2, the approver on BASE+3 (a scrape job per
/// daemon, each named by its port).
pub fn metrics_addr(base: std::net::SocketAddr, name: &str) -> Option<std::net::SocketAddr> {
    let offset = match name {
        "gateway" => 0,
        "supervisor" => 1,
        "policy" => 2,
        "approver" => 3,
        _ => return None,
    };
    let port = base.port().checked_add(offset)?;
    Some(std::net::SocketAddr::new(base.ip(), port))
}

/// The flags that point one daemon at its place in the layout (also used by the test harness).
pub fn daemon_args(name: &str, o: &UpOptions) -> Vec<String> {
    let l = &o.layout;
    let mut sets = vec![
        format!("daemon.state_dir={}", toml_str(&l.state_of(name))),
        format!("daemon.log_format={}", toml_str(Path::new(&o.log_format))),
        format!("listen.socket={}", toml_str(&l.socket_of(name))),
    ];
    if let Some(addr) = o.metrics.and_then(|base| metrics_addr(base, name)) {
        sets.push(format!("daemon.metrics_listen=\"{addr}\""));
    }
    if let Some(level) = &o.log_level {
        sets.push(format!("daemon.log_level={}", toml_str(Path::new(level))));
    }
    match name {
        "policy" => {
            sets.push(format!(
                "admin.socket={}",
                toml_str(&l.policy_admin_socket())
            ));
            if o.approver {
                // Not part of the swap (the approver asks for escalations in each request): what
                // the local demo escalates. Reads pass; every other call the floor allows waits
                // for a person, so `warden send "write hello.txt"` shows the approver at work.
                sets.push("policy.global.mode=\"approve-reads\"".into());
            }
        }
        "approver" => {
            sets.push(format!(
                "admin.socket={}",
                toml_str(&l.approver_admin_socket())
            ));
            sets.push(format!(
                "upstream.socket={}",
                toml_str(&l.socket_of("policy"))
            ));
            sets.push(format!(
                "web.bind={}",
                toml_str(Path::new(&o.approver_http))
            ));
            sets.push(format!(
                "web.token_file={}",
                toml_str(&l.operator_token_file())
            ));
        }
        "supervisor" => {
            // The one line of the swap: the supervisor learns the approver's deadline from it
            // (`PolicyService.Describe`).
            let to = if o.approver { "approver" } else { "policy" };
            sets.push(format!("policy.socket={}", toml_str(&l.socket_of(to))));
            // warden's own doors, which no agent's egress proxy may connect to whatever its
            // allowlist names: the gateway's HTTP listener, its gRPC one when the operator's
            // gateway.toml has one on TCP, and the approver's page.
            let listeners: Vec<String> = warden_listeners(o)
                .iter()
                .map(|a| toml_str(Path::new(a)))
                .collect();
            sets.push(format!("egress.warden_listeners=[{}]", listeners.join(",")));
            // A local deployment is the person's own: `warden send -C DIR` may have the agent
            // work on a copy of a directory of theirs (the supervisor checks it is theirs).
            sets.push("copies.local_dirs=true".into());
        }
        "gateway" => {
            sets.push(format!(
                "supervisor.socket={}",
                toml_str(&l.socket_of("supervisor"))
            ));
            sets.push(format!("http.bind={}", toml_str(Path::new(&o.http))));
            sets.push(format!(
                "http.public_url={}",
                toml_str(Path::new(&format!("http://{}", o.http)))
            ));
            sets.push(format!("auth.token_file={}", toml_str(&l.token_file())));
        }
        _ => {}
    }
    let mut args = Vec::new();
    if let Some(dir) = &o.config_dir {
        let file = crate::layout::file_of(dir, name);
        if file.is_file() {
            args.push("--config".to_string());
            args.push(file.to_string_lossy().into_owned());
        }
    }
    args.extend(sets.into_iter().flat_map(|s| ["--set".to_string(), s]));
    args
}

/// The TCP listeners of the deployment `o` starts: the gateway's HTTP (`--http`), its gRPC
/// listener when `<config>/gateway.toml` puts one on TCP, the approver's page when it is
/// served, and whatever `<config>/supervisor.toml` lists already (the `--set` replaces the
/// file's list, so it is carried over).
pub fn warden_listeners(o: &UpOptions) -> Vec<String> {
    let mut out = vec![o.http.clone()];
    let read = |daemon: &str| {
        o.config_dir.as_ref().and_then(|dir| {
            std::fs::read_to_string(crate::layout::file_of(dir, daemon))
                .ok()?
                .parse::<toml::Table>()
                .ok()
        })
    };
    if let Some(tcp) =
        read("gateway").and_then(|g| g.get("grpc")?.get("tcp")?.as_str().map(str::to_string))
    {
        out.push(tcp);
    }
    if o.approver && !o.approver_http.is_empty() {
        out.push(o.approver_http.clone());
    }
    // Each daemon's metrics listener (`--metrics`).
    if let Some(base) = o.metrics {
        for name in o.daemons() {
            if let Some(a) = metrics_addr(base, name) {
                out.push(a.to_string());
            }
        }
    }
    if let Some(listed) = read("supervisor").and_then(|s| {
        s.get("egress")?
            .get("warden_listeners")?
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect::<Vec<_>>()
            })
    }) {
        out.extend(listed);
    }
    out.sort();
    out.dedup();
    out
}
