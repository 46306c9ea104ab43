//! The sandbox has no seam (issue 35, findings 1 and 2): nothing an agent hands warden in an ACP
//! `terminal/create` — its environment, its program path, its working directory — is read,
//! resolved or applied on the host side of the sandbox.
//!
//! 1. A terminal's environment (`LD_PRELOAD`, `LD_AUDIT`, `LD_LIBRARY_PATH`, `BASH_ENV`, `ENV`,
//!    `PATH`) reaches only the program, inside its sandbox: no process in the host's mount
//!    namespace ever carries it (the test scans `/proc` while the command runs), and the
//!    preloaded library only ever runs inside (it logs the mount namespace it ran in).
//! 2. A terminal's program is found inside the sandbox, never through the supervisor's
//!    `/proc/self`, fds or mount namespace: `/proc/self/fd/N/build.sh` for every N the
//!    supervisor could hold, `/dev/fd/N/…`, `/proc/1/root/<another root>/…` and a symlink
//!    into another conversation's root run nothing of that conversation.
//!
//! Both need a root supervisor and a working bubblewrap (skipped, saying so, elsewhere; a
//! failure under CI).

mod supervisor_support;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use supervisor_support::*;
use warden_proto::v1 as pb;

async fn root_of(c: &mut Client, ctx: &str) -> PathBuf {
    let info = c
        .open_conversation(open(ctx, pb::Profile::WorkspaceWrite))
        .await
        .expect("open")
        .into_inner();
    PathBuf::from(info.root)
}

/// A file owned like `root` (the agent's), with `mode`.
fn plant(root: &Path, name: &str, content: &str, mode: u32) -> PathBuf {
    let p = root.join(name);
    std::fs::write(&p, content).expect("write");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    let m = std::fs::metadata(root).expect("root");
    std::os::unix::fs::chown(&p, Some(m.uid()), Some(m.gid())).expect("chown");
    p
}

/// Every tool call update's text of a turn.
fn tool_texts(evs: &[pb::TurnEvent]) -> Vec<(String, String)> {
    evs.iter()
        .filter_map(|e| match &e.event {
            Some(pb::turn_event::Event::ToolCall(t))
                if t.update && !t.status.is_empty() && t.status != "in_progress" =>
            {
                Some((t.status.clone(), t.content_text.clone()))
            }
            _ => None,
        })
        .collect()
}

/// A value no other process on the host carries by chance.
fn nonce() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{}-{t}", std::process::id())
}

fn mount_ns(pid: &str) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// (pid, mount namespace, comm) of every process whose environment holds `needle`.
fn carrying(needle: &[u8]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if env.windows(needle.len()).any(|w| w == needle) {
            let ns = mount_ns(&pid).unwrap_or_default();
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            out.push((pid, ns, comm.trim().to_string()));
        }
    }
    out
}

const W4: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static void w4_log(const char *how) {
    char ns[128] = {0};
    if (readlink("/proc/self/ns/mnt", ns, sizeof ns - 1) < 0) return;
    const char *out = getenv("W4_OUT");
    if (!out) return;
    FILE *f = fopen(out, "a");
    if (!f) return;
    fprintf(f, "%s %d %s\n", how, (int)getpid(), ns);
    fclose(f);
}
__attribute__((constructor)) static void w4_init(void) { w4_log("preload"); }
unsigned int la_version(unsigned int v) { w4_log("audit"); return v; }
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_terminals_environment_reaches_only_the_program_inside_its_sandbox() {
    if !runs_contained() {
        return;
    }
    let host_ns = mount_ns("self").expect("own mount namespace");
    let d = deploy(&[("supervisor", "agents.scripted.terminal=true")]).await;
    let mut c = client(&d);
    let root = root_of(&mut c, "seam-env").await;

    // The agent's library, as it would have compiled it in its root (the host's gcc is
    // visible in the sandbox); built here so the test does not depend on the sandbox's view.
    let src = root.join("w4.c");
    std::fs::write(&src, W4).expect("source");
    let so = root.join("w4.so");
    let gcc = std::process::Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .expect("gcc");
    assert!(
        gcc.status.success(),
        "{}",
        String::from_utf8_lossy(&gcc.stderr)
    );
    let rc = plant(&root, "rc.sh", "echo sourced >> rc.log\n", 0o755);
    std::fs::create_dir_all(root.join("bin")).expect("bin");
    let log = root.join("preload.log");

    let canary = format!("w4-canary-{}", nonce());
    let so_s = so.to_string_lossy().into_owned();
    let env: BTreeMap<&str, String> = [
        ("W4_CANARY", canary.clone()),
        ("W4_OUT", log.to_string_lossy().into_owned()),
        ("LD_PRELOAD", so_s.clone()),
        ("LD_AUDIT", so_s),
        ("LD_LIBRARY_PATH", root.to_string_lossy().into_owned()),
        ("BASH_ENV", rc.to_string_lossy().into_owned()),
        ("ENV", rc.to_string_lossy().into_owned()),
        ("PATH", format!("{}/bin:/usr/bin:/bin", root.display())),
    ]
    .into_iter()
    .collect();
    let hostile = scenario(json!({"steps": [
        {"type": "tool", "kind": "execute", "command": "sleep 2; echo done-inside",
         "ask": false, "via": "client", "then_env": env}]}));
    let mut stream = start(&mut c, turn("seam-env", "t1", &hostile)).await;

    // Every process that carries the canary while the command runs, and where it runs.
    let needle = format!("W4_CANARY={canary}").into_bytes();
    let watch = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        let until = Instant::now() + Duration::from_secs(6);
        while Instant::now() < until {
            for p in carrying(&needle) {
                if !seen.contains(&p) {
                    seen.push(p);
                }
            }
            std::thread::sleep(Duration::from_millis(15));
        }
        seen
    });
    let evs = collect(&mut stream, Duration::from_secs(30)).await;
    let seen = watch.await.expect("watcher");

    let p = permissions(&evs);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert_eq!(p[0].verdict, pb::Verdict::Allow as i32, "{p:#?}");
    let tools = tool_texts(&evs);
    assert!(
        tools
            .iter()
            .any(|(s, t)| s == "completed" && t.contains("done-inside")),
        "the command ran: {tools:#?}"
    );
    assert!(
        seen.iter().any(|(_, ns, _)| *ns != host_ns),
        "the program inside got its environment (else this test proves nothing): {seen:#?}"
    );
    let outside: Vec<_> = seen.iter().filter(|(_, ns, _)| *ns == host_ns).collect();
    assert!(
        outside.is_empty(),
        "processes on the host side carried the terminal's environment: {outside:#?}"
    );
    let ran = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        ran.lines().any(|l| l.starts_with("preload")),
        "the preloaded library ran inside: {ran:?}"
    );
    for line in ran.lines() {
        assert!(
            !line.ends_with(&host_ns),
            "the agent's library ran in the host's mount namespace: {ran}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_terminals_program_is_found_inside_its_sandbox_never_through_the_supervisor() {
    if !runs_contained() {
        return;
    }
    let d = deploy(&[("supervisor", "agents.scripted.terminal=true")]).await;
    let mut c = client(&d);

    // The victim: a conversation whose root holds a build script and a secret, kept open.
    let victim = root_of(&mut c, "seam-victim").await;
    let secret = format!("victim-secret-{}", nonce());
    plant(&victim, "secret", &secret, 0o600);
    plant(
        &victim,
        "build.sh",
        "#!/bin/sh\necho VICTIM-RAN; cat \"$(dirname \"$0\")/secret\"\n",
        0o755,
    );
    let evs = run(
        &mut c,
        turn(
            "seam-victim",
            "t1",
            &scenario(json!({"steps": [{"type": "message", "text": "hi"}]})),
        ),
    )
    .await;
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{evs:#?}");

    let attacker = root_of(&mut c, "seam-attacker").await;
    plant(&attacker, "mine.sh", "#!/bin/sh\necho MINE-RAN\n", 0o755);
    let link = attacker.join("other");
    std::os::unix::fs::symlink(victim.join("build.sh"), &link).expect("symlink");
    let fdlink = attacker.join("fds");
    std::os::unix::fs::symlink("/proc/self/fd", &fdlink).expect("symlink");

    let mut programs: Vec<String> = (3..=40)
        .map(|n| format!("/proc/self/fd/{n}/build.sh"))
        .collect();
    programs.extend((3..=16).map(|n| format!("/dev/fd/{n}/build.sh")));
    programs.extend((3..=16).map(|n| format!("{}/{n}/build.sh", fdlink.display())));
    programs.push(link.to_string_lossy().into_owned());
    programs.push(format!("/proc/1/root{}/build.sh", victim.display()));
    programs.push(format!(
        "/proc/{}/root{}/build.sh",
        std::process::id(),
        victim.display()
    ));
    // The attacker's own script runs: the way in works, only the other root is out of reach.
    programs.push(attacker.join("mine.sh").to_string_lossy().into_owned());
    // In turns of 24 commands (a turn's text is bounded).
    let mut p = Vec::new();
    let mut tools = Vec::new();
    for (i, chunk) in programs.chunks(24).enumerate() {
        let steps: Vec<_> = chunk
            .iter()
            .map(|p| {
                json!({"type": "tool", "kind": "execute", "command": p, "ask": false,
                       "via": "client", "then_argv": [p]})
            })
            .collect();
        let evs = run(
            &mut c,
            turn(
                "seam-attacker",
                &format!("t{i}"),
                &scenario(json!({ "steps": steps })),
            ),
        )
        .await;
        p.extend(permissions(&evs));
        tools.extend(tool_texts(&evs));
    }
    assert_eq!(p.len(), programs.len(), "each command was decided: {p:#?}");
    assert!(
        p.iter().all(|d| d.verdict == pb::Verdict::Allow as i32),
        "the policy allowed them (so only the spawn stands between them and the other root): {p:#?}"
    );
    assert_eq!(tools.len(), programs.len(), "{tools:#?}");
    for ((status, text), program) in tools.iter().zip(&programs) {
        assert!(
            !text.contains("VICTIM-RAN") && !text.contains(&secret),
            "{program} ran the other conversation's script: {status} {text}"
        );
    }
    let (status, text) = tools.last().expect("last");
    assert_eq!(status, "completed", "{text}");
    assert!(text.contains("MINE-RAN"), "{text}");
}
