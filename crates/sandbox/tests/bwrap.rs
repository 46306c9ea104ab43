//! The OS sandbox (bubblewrap) against real writes and connects. Skips, saying so, when
//! bubblewrap is missing or cannot build a sandbox on this host.

mod common;

use std::net::{TcpListener, UdpSocket};

use common::{Fixture, exists, run};
use warden_sandbox::{Network, Profile};

fn bwrap_fixture(name: &str) -> Option<Fixture> {
    let fx = Fixture::new(name);
    if fx.bwrap.is_none() {
        println!("SKIP: bubblewrap missing or not working on this host (install bubblewrap)");
        return None;
    }
    Some(fx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_outside_the_root_fail_under_both_profiles() {
    let Some(fx) = bwrap_fixture("outside") else {
        return;
    };
    let spawner = fx.spawner(true);
    for profile in [Profile::ReadOnly, Profile::WorkspaceWrite] {
        let root = fx.owned_root(&format!("outside-{profile:?}"), profile);
        let sibling = fx.state_dir().join(format!("outside-{profile:?}"));
        let in_usr = format!("/usr/warden-probe-{}", uuid_like());
        let in_home = format!("/root/warden-probe-{}", uuid_like());
        let script = format!(
            "for t in '{}' '{in_usr}' '{in_home}'; do echo x > \"$t\" 2>/dev/null && echo WROTE $t; done; exit 0",
            sibling.display()
        );
        let (code, out, _) = run(&spawner, fx.spec("outside", root, &script)).await;
        assert_eq!(code, Some(0));
        assert!(!out.contains("WROTE"), "{profile:?}: {out}");
        assert!(
            !exists(&sibling),
            "{profile:?}: sibling of the root written"
        );
        assert!(!exists(in_usr.as_ref()) && !exists(in_home.as_ref()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_profile_cannot_write_inside_the_root_and_workspace_write_can() {
    let Some(fx) = bwrap_fixture("ro") else {
        return;
    };
    let spawner = fx.spawner(true);
    for (profile, should_write) in [(Profile::ReadOnly, false), (Profile::WorkspaceWrite, true)] {
        let root = fx.owned_root(&format!("ro-{profile:?}"), profile);
        let target = root.root.join("file.txt");
        let script = format!("echo hello > '{}'", target.display());
        let (code, _, err) = run(&spawner, fx.spec("ro", root.clone(), &script)).await;
        assert_eq!(code == Some(0), should_write, "{profile:?}: {err}");
        assert_eq!(exists(&target), should_write, "{profile:?}");
        if !should_write {
            assert!(err.contains("Read-only"), "{err}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tmp_is_private() {
    let Some(fx) = bwrap_fixture("tmp") else {
        return;
    };
    let spawner = fx.spawner(true);
    let root = fx.owned_root("tmp", Profile::WorkspaceWrite);
    let name = format!("/tmp/warden-probe-{}", uuid_like());
    let script = format!("echo inside > '{name}' && cat '{name}'");
    let (code, out, err) = run(&spawner, fx.spec("tmp", root, &script)).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out.trim(),
        "inside",
        "the sandbox has a writable /tmp of its own"
    );
    assert!(!exists(name.as_ref()), "the write reached the host's /tmp");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_none_blocks_non_loopback_connects_and_host_allows_them() {
    let Some(fx) = bwrap_fixture("net") else {
        return;
    };
    // A non-loopback address of this host, with a listener on it.
    let local_ip = UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").map(|_| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified());
    let Some(ip) = local_ip else {
        println!("SKIP: this host has no non-loopback address to test network isolation with");
        return;
    };
    let listener = TcpListener::bind((ip, 0)).expect("listen");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });
    let spawner = fx.spawner(true);
    for (network, should_connect) in [(Network::None, false), (Network::Host, true)] {
        let root = fx.owned_root(&format!("net-{network:?}"), Profile::WorkspaceWrite);
        let mut spec = fx.spec("net", root, "");
        spec.program = "bash".into();
        spec.args = vec![
            "-c".into(),
            format!("exec 3<>/dev/tcp/{ip}/{port} && echo connected").into(),
        ];
        spec.network = network;
        let (code, out, err) = run(&spawner, spec).await;
        assert_eq!(
            code == Some(0) && out.contains("connected"),
            should_connect,
            "{network:?}: out={out} err={err}"
        );
        if !should_connect {
            assert!(err.contains("unreachable"), "{err}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_outside_the_system_dirs_still_runs() {
    let Some(fx) = bwrap_fixture("progdir") else {
        return;
    };
    let tools = fx.state_dir().join("tools");
    std::fs::create_dir(&tools).expect("tools dir");
    std::fs::copy("/usr/bin/env", tools.join("my-env")).expect("copy env");
    let spawner = fx.spawner(true);
    let root = fx.owned_root("progdir", Profile::ReadOnly);
    let mut spec = fx.spec("progdir", root, "");
    spec.program = tools.join("my-env");
    spec.args = vec![];
    let (code, out, err) = run(&spawner, spec).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("WARDEN_TREE="));
}

fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}
