use super::fds::DATA_FD_MIN;
use super::host::{HostCommand, host_env};
use super::*;
use crate::control::ControlBind;
use crate::env::DepthGuard;
use crate::env::EnvPolicy;
use crate::etc::{AdapterPolicy, EtcBind, etc_plan};
use crate::identity::AgentIdentity;
use crate::roots::{Boundary, Profile};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

fn args_of(profile: Profile, control: &[ControlBind]) -> Vec<String> {
    args_with(profile, control, Network::None, None)
}

fn args_with(
    profile: Profile,
    control: &[ControlBind],
    network: Network,
    egress: Option<EgressSpec>,
) -> Vec<String> {
    let env = EnvPolicy::new([""; 0], [""; 0])
        .expect("policy")
        .build_from(std::iter::empty::<(OsString, OsString)>());
    let boundary = Boundary {
        root: PathBuf::from("/srv/sandboxes/r-1"),
        owned: true,
        allow_execute: true,
        profile,
    };
    let spec = SpawnSpec::new(
        "c",
        "/usr/bin/true",
        boundary,
        env,
        DepthGuard::from_marker(None, 1),
    );
    let mut spec = spec;
    spec.network = network;
    spec.egress = egress;
    let who = AgentIdentity {
        uid: 61000,
        gid: 61000,
    };
    let home = PathBuf::from("/srv/homes/c-1");
    let etc = etc_plan(
        Path::new("/etc"),
        who,
        Some(&home),
        &AdapterPolicy::default(),
    );
    let fds: Vec<i32> = (0..etc
        .iter()
        .filter(|b| matches!(b, EtcBind::Data { .. }))
        .count())
        .map(|i| 10 + i as i32)
        .collect();
    let plan = BwrapPlan {
        spec: &spec,
        program: Path::new("/usr/bin/true"),
        cwd: Path::new("/srv/sandboxes/r-1"),
        home: Some(&home),
        etc: &etc,
        data_fds: &fds,
        control,
        git: &[],
    };
    bwrap_args(&plan)
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

fn pos(args: &[String], window: &[&str]) -> Option<usize> {
    args.windows(window.len())
        .position(|w| w.iter().zip(window).all(|(a, b)| a == b))
}

/// The host-side command of a terminal-like spawn whose program, arguments, cwd and
/// environment came from the agent.
fn host_of(
    program: &str,
    args: &[String],
    cwd: &str,
    env: &[(String, String)],
    network: Network,
) -> HostCommand {
    let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    let env = EnvPolicy::new(names, [""; 0]).expect("policy").build_from(
        env.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    let boundary = Boundary {
        root: PathBuf::from("/srv/sandboxes/r-1"),
        owned: true,
        allow_execute: true,
        profile: Profile::WorkspaceWrite,
    };
    let mut spec = SpawnSpec::new(
        "c~term-1",
        program,
        boundary,
        env.clone(),
        DepthGuard::from_marker(None, 1),
    );
    spec.args = args.iter().map(OsString::from).collect();
    spec.cwd = Some(PathBuf::from(cwd));
    spec.network = network;
    spec.agent_supplied = true;
    if network == Network::Proxy {
        spec.egress = Some(EgressSpec {
            relay: PathBuf::from("/opt/warden/bin/warden-egress-relay"),
            socket_dir: PathBuf::from("/srv/state/egress/c-1"),
            port: 3128,
            mirrors: vec![],
            loopback_direct: false,
        });
    }
    let program = agent_program(Path::new(program)).expect("program");
    let plan = HostPlan {
        bwrap: Some((
            Path::new("/usr/bin/bwrap"),
            12,
            BwrapPlan {
                spec: &spec,
                program: &program,
                cwd: Path::new(cwd),
                home: None,
                etc: &[],
                data_fds: &[],
                control: &[],
                git: &[],
            },
        )),
        spec: &spec,
        program: &program,
        env: &env,
        child_depth: 1,
        marker: "m",
    };
    host_command(&plan)
}

/// The words of a host command up to (and with) the `--` after which bubblewrap only hands
/// the rest to exec inside the sandbox.
fn before_program(h: &HostCommand, tail: usize) -> Vec<OsString> {
    h.args[..h.args.len() - tail].to_vec()
}

proptest::proptest! {
    /// Whatever the agent puts in a terminal's program, arguments, working directory and
    /// environment, the host side runs the same: the gate and bubblewrap with the fixed
    /// environment and the same arguments up to the program; the agent's values are only
    /// in the bytes bubblewrap reads from its `--args` fd and after the last `--`.
    #[test]
    fn agent_values_never_reach_the_host_side_of_a_spawn(
        program in "(/[a-z./]{1,12}|[a-z]{1,8}|/proc/self/fd/[0-9]{1,3}/build\\.sh)",
        args in proptest::collection::vec("[ -~]{0,16}", 0..4),
        cwd in "/srv/sandboxes/r-1(/[a-z.]{1,6}){0,3}",
        env in proptest::collection::vec(
            (
                "(LD_PRELOAD|LD_AUDIT|LD_LIBRARY_PATH|BASH_ENV|ENV|PATH|GCONV_PATH|HOME|[A-Z_]{1,10})",
                "[ -~]{0,24}",
            ),
            0..6,
        ),
        proxy in proptest::bool::ANY,
    ) {
        let network = if proxy { Network::Proxy } else { Network::None };
        let h = host_of(&program, &args, &cwd, &env, network);
        let template = host_of("/bin/true", &[], "/srv/sandboxes/r-1", &[], network);
        proptest::prop_assert_eq!(&h.env, &host_env(1, "m"));
        proptest::prop_assert_eq!(&template.env, &host_env(1, "m"));
        proptest::prop_assert_eq!(
            before_program(&h, 1 + args.len()),
            before_program(&template, 1)
        );
        let inside = h.inside.clone().unwrap_or_default();
        let words: Vec<&[u8]> = inside.split(|b| *b == 0).collect();
        proptest::prop_assert_eq!(words[0], b"--clearenv".as_slice());
        for (k, v) in &env {
            let set = words
                .windows(3)
                .any(|w| w[0] == b"--setenv" && w[1] == k.as_bytes() && w[2] == v.as_bytes());
            let last = env.iter().rev().find(|(k2, _)| k2 == k).map(|(_, v2)| v2);
            if last == Some(v) {
                proptest::prop_assert!(set, "{} not set inside", k);
            }
        }
    }
}

#[test]
fn a_nul_in_the_environment_is_refused_before_anything_runs() {
    let env = EnvPolicy::new(["X"], [""; 0])
        .expect("policy")
        .build_from([(OsString::from("X"), OsString::from("a\0--bind\0/\0/"))]);
    assert!(check_env(&env).is_err());
    assert!(agent_program(Path::new("/bin/true\0x")).is_err());
    assert!(agent_program(Path::new("bin/true")).is_err());
    assert!(agent_program(Path::new("true")).is_ok());
}

#[test]
fn proxy_egress_is_its_own_namespace_with_the_socket_read_only_and_the_relay_bound() {
    let e = EgressSpec {
        relay: PathBuf::from("/opt/warden/bin/warden-egress-relay"),
        socket_dir: PathBuf::from("/srv/state/egress/c-1"),
        port: 3128,
        mirrors: vec![],
        loopback_direct: false,
    };
    let a = args_with(Profile::WorkspaceWrite, &[], Network::Proxy, Some(e));
    assert!(a.iter().any(|x| x == "--unshare-net"), "{a:?}");
    let sock = pos(
        &a,
        &["--ro-bind", "/srv/state/egress/c-1", EGRESS_DIR_INSIDE],
    )
    .unwrap();
    let relay = pos(&a, &["--ro-bind", "/opt/warden/bin", "/opt/warden/bin"]).unwrap();
    let ro = pos(&a, &["--remount-ro", "/"]).unwrap();
    assert!(sock < ro && relay < ro, "{a:?}");
    let host = args_with(Profile::WorkspaceWrite, &[], Network::Host, None);
    assert!(!host.iter().any(|x| x == "--unshare-net"), "{host:?}");
    assert!(!host.iter().any(|x| x == EGRESS_DIR_INSIDE), "{host:?}");
}

#[test]
fn bwrap_gets_a_new_session_and_no_whole_etc() {
    let a = args_of(Profile::WorkspaceWrite, &[]);
    assert!(a.iter().any(|x| x == "--new-session"), "{a:?}");
    assert!(pos(&a, &["--ro-bind", "/etc", "/etc"]).is_none(), "{a:?}");
    for never in ["/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh"] {
        assert!(!a.iter().any(|x| x == never), "{never} in {a:?}");
    }
    for generated in [
        "/etc/passwd",
        "/etc/group",
        "/etc/claude-code/managed-settings.json",
        "/etc/codex/requirements.toml",
    ] {
        let i = a.iter().position(|x| x == generated).unwrap_or(0);
        assert!(i >= 2 && a[i - 2] == "--ro-bind-data", "{generated}: {a:?}");
        assert!(a[i - 1].parse::<i32>().is_ok_and(|fd| fd >= DATA_FD_MIN));
    }
}

#[test]
fn control_paths_are_bound_read_only_after_the_writable_root_and_home() {
    let bind = |p: &str, pin_only| ControlBind {
        path: PathBuf::from(p),
        pin_only,
    };
    let ctl = vec![
        bind("/srv/sandboxes/r-1/.claude", false),
        bind("/srv/homes/c-1/.claude", true),
        bind("/srv/homes/c-1/.claude/settings.json", false),
    ];
    let a = args_of(Profile::WorkspaceWrite, &ctl);
    let root = pos(&a, &["--bind", "/srv/sandboxes/r-1", "/srv/sandboxes/r-1"]).unwrap();
    let home = pos(&a, &["--bind", "/srv/homes/c-1", "/srv/homes/c-1"]).unwrap();
    let mut last = 0;
    for c in &ctl {
        let p = c.path.to_string_lossy();
        let how = if c.pin_only { "--bind" } else { "--ro-bind" };
        let i = pos(&a, &[how, &p, &p]).unwrap_or_else(|| panic!("{p}: {a:?}"));
        assert!(
            i > root && i > home,
            "{p} must be mounted over the writable binds"
        );
        assert!(i > last, "{p} out of order");
        last = i;
    }
}
