//! The host side of a spawn (`host_command`): the gate shell and bubblewrap on a fixed
//! environment ([`HOST_PATH`], depth and tree markers), the program's own environment and cwd handed
//! to bubblewrap through its `--args` fd. Pure; must never put the agent's environment on the host side.

use std::ffi::OsString;
use std::path::Path;

use super::{
    BwrapPlan, EGRESS_DIR_INSIDE, EGRESS_SOCKET_NAME, GATE, Network, SpawnSpec, bwrap_args,
    dynamic_loaders,
};
use crate::env::{ChildEnv, DEPTH_ENV, TREE_MARKER_ENV};

/// The variables every process warden starts on the host side of a sandbox (the gate shell and
/// bubblewrap) runs with, whatever the spawn: written here, nothing from the agent or its
/// configured environment (a dynamic-loader or shell variable there would run the agent's
/// code outside its sandbox, as its uid, in the host's namespaces).
pub const HOST_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// The fixed host-side environment of a spawn: [`HOST_PATH`], and the depth and tree markers
/// (the kill ladder's fallback finds the tree's processes by the marker, bubblewrap included).
pub(crate) fn host_env(child_depth: u32, marker: &str) -> Vec<(OsString, OsString)> {
    vec![
        ("PATH".into(), HOST_PATH.into()),
        (DEPTH_ENV.into(), child_depth.to_string().into()),
        (TREE_MARKER_ENV.into(), marker.into()),
    ]
}

/// Everything [`host_command`] turns into the host-side command.
pub(crate) struct HostPlan<'a> {
    /// bubblewrap's path, the fd it reads the sandbox's environment and working directory from
    /// (`--args`), and its binds; `None` without bubblewrap.
    pub bwrap: Option<(&'a Path, i32, BwrapPlan<'a>)>,
    pub spec: &'a SpawnSpec,
    pub program: &'a Path,
    pub env: &'a ChildEnv,
    pub child_depth: u32,
    pub marker: &'a str,
}

/// The host side of one spawn: the gate shell's arguments (after `/bin/sh`), its environment,
/// and what bubblewrap reads from the `--args` fd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostCommand {
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    /// NUL-separated bubblewrap arguments: `--clearenv`, one `--setenv` per variable of the
    /// program's environment, `--chdir`. Read from an fd so that neither the host-side
    /// environment nor a command line any user can read (`/proc/PID/cmdline`) carries them.
    pub inside: Option<Vec<u8>>,
}

/// The host-side command of a spawn. With bubblewrap, its environment is [`host_env`] and its
/// arguments up to the `--` before the program depend only on warden's own plan (binds, the
/// fd numbers): the agent's environment and working directory are in `inside`, the program and
/// its arguments after that `--`, where bubblewrap only hands them to `execvp` inside the
/// sandbox (which looks the program up in the sandbox's own view and `PATH`). Without
/// bubblewrap there is no inside: the program runs on the host as the agent's uid, and the
/// gate (the same uid, with no more power) carries its environment.
pub(crate) fn host_command(plan: &HostPlan<'_>) -> HostCommand {
    let spec = plan.spec;
    let mut args: Vec<OsString> = vec!["-c".into(), GATE.into(), "warden-gate".into()];
    let mut inside = None;
    let env = match &plan.bwrap {
        Some((bwrap, args_fd, binds)) => {
            args.push(bwrap.as_os_str().to_os_string());
            args.push("--args".into());
            args.push(args_fd.to_string().into());
            args.extend(bwrap_args(binds));
            args.push("--".into());
            let mut words: Vec<&std::ffi::OsStr> = vec!["--clearenv".as_ref()];
            let depth = plan.child_depth.to_string();
            for (k, v) in plan.env.iter().chain([
                (DEPTH_ENV.as_ref(), depth.as_ref()),
                (TREE_MARKER_ENV.as_ref(), plan.marker.as_ref()),
            ]) {
                words.extend(["--setenv".as_ref(), k, v]);
            }
            words.extend(["--chdir".as_ref(), binds.cwd.as_os_str()]);
            let mut bytes = Vec::new();
            for w in words {
                bytes.extend_from_slice(w.as_encoded_bytes());
                bytes.push(0);
            }
            inside = Some(bytes);
            host_env(plan.child_depth, plan.marker)
        }
        None => plan
            .env
            .iter()
            .map(|(k, v)| (k.to_os_string(), v.to_os_string()))
            .chain(host_env(plan.child_depth, plan.marker).into_iter().skip(1))
            .collect(),
    };
    if let Some(x) = &spec.exec_only {
        args.push(x.launcher.clone().into());
        let relay = match (spec.network, &spec.egress) {
            (Network::Proxy, Some(e)) => Some(e.relay.clone()),
            _ => None,
        };
        for p in x
            .allow
            .iter()
            .cloned()
            .chain([plan.program.to_path_buf()])
            .chain(relay)
            .chain(dynamic_loaders())
        {
            args.push("--allow".into());
            args.push(p.into());
        }
        args.push("--".into());
    }
    if let (Network::Proxy, Some(e)) = (spec.network, &spec.egress) {
        args.push(e.relay.clone().into());
        args.push("--socket".into());
        args.push(Path::new(EGRESS_DIR_INSIDE).join(EGRESS_SOCKET_NAME).into());
        args.push("--listen".into());
        args.push(format!("127.0.0.1:{}", e.port).into());
        for m in &e.mirrors {
            args.push("--mirror".into());
            args.push(m.to_string().into());
        }
        args.push("--".into());
    }
    args.push(plan.program.as_os_str().to_os_string());
    args.extend(spec.args.iter().cloned());
    HostCommand { args, env, inside }
}
