//! Supervisor end to end, issue 24 cases 3 and 8, the hostile way: under a root supervisor with
//! bubblewrap, an agent in an operator workspace it may write to.
//!
//! Case 3 (host code execution through git): the agent writes `.git/commondir = ../.wip` next to
//! a `.wip/config` with `core.fsmonitor` (what was measured), `.git/info/attributes` with a filter,
//! `.git/modules/sub/config`, `.git/worktrees/wt/commondir`, hooks through `commondir`, and a
//! `.git/logs/HEAD` symlink (the host's git appends its reflog line through it); then
//! this test runs real `git status`, `git log` and `git commit` as root on the host in that
//! workspace (and in its submodule and linked worktree). None of the agent's commands may run,
//! and the agent's own `git add` + `git commit` must still land on the host.
//!
//! Case 8 (`allow_execute = false` means it): the agent's own `sh -c 'echo ran > marker'` fails
//! in such a workspace (Landlock's execute right), while the agent itself runs its turn; with
//! `allow_execute = true` the same command runs.
//!
//! Skips, saying so, when the tests do not run as root or bubblewrap does not work here.

mod supervisor_support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use supervisor_support::*;
use warden_proto::v1 as pb;

/// The text of the last tool-call update: the command's output (or its failure).
fn output(evs: &[pb::TurnEvent]) -> String {
    evs.iter()
        .rev()
        .find_map(|e| match &e.event {
            Some(pb::turn_event::Event::ToolCall(t)) if t.update && !t.status.is_empty() => {
                Some(format!("{} {}", t.status, t.content_text))
            }
            _ => None,
        })
        .unwrap_or_default()
}

/// `git ARGS` as root on the host in `dir` (HOME set so no user's configuration is read);
/// returns its stdout and stderr.
fn host_git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("HOME", dir.parent().unwrap_or(dir))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "operator")
        .env("GIT_AUTHOR_EMAIL", "operator@example.invalid")
        .env("GIT_COMMITTER_NAME", "operator")
        .env("GIT_COMMITTER_EMAIL", "operator@example.invalid")
        .env("GIT_ALLOW_PROTOCOL", "file")
        .output()
        .expect("git runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn must_git(dir: &Path, args: &[&str]) {
    let st = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("HOME", dir.parent().unwrap_or(dir))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "operator")
        .env("GIT_AUTHOR_EMAIL", "operator@example.invalid")
        .env("GIT_COMMITTER_NAME", "operator")
        .env("GIT_COMMITTER_EMAIL", "operator@example.invalid")
        .status()
        .expect("git runs");
    assert!(st.success(), "git {args:?} in {}", dir.display());
}

/// `chmod -R a+rwX`: the operator lets the agent's uid write the workspace (root keeps owning
/// it, so root's git trusts it: `safe.directory` is not what stops the attack here).
fn open_to_everyone(p: &Path) {
    let st = Command::new("chmod")
        .args(["-R", "a+rwX"])
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success());
}

/// A fresh directory under the test root, root-owned, searchable by the agent.
fn fresh(name: &str) -> PathBuf {
    let p = parent().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::canonicalize(&p).unwrap()
}

fn workspace_turn(ctx: &str, workspace: &str, scenario_text: &str) -> pb::RunTurnRequest {
    let mut t = turn(ctx, &format!("{ctx}-1"), scenario_text);
    if let Some(o) = t.open.as_mut() {
        o.workspace = workspace.into();
    }
    t
}

fn shell_then_message(cmd: &str) -> String {
    scenario(json!({"steps": [
        {"type": "tool", "kind": "execute", "command": cmd, "ask": false, "via": "direct"},
        {"type": "message", "text": "agent-still-here"}]}))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_cannot_make_the_hosts_git_run_its_commands_and_still_commits() {
    if !runs_contained() {
        return;
    }
    // The operator's repository, with a submodule and a linked worktree inside the workspace.
    let ws = fresh("gitws");
    let marks = fresh("gitmarks");
    let sub_src = fresh("gitsub-src");
    must_git(&sub_src, &["init", "-q", "-b", "main"]);
    std::fs::write(sub_src.join("s.txt"), "s\n").unwrap();
    must_git(&sub_src, &["add", "s.txt"]);
    must_git(&sub_src, &["commit", "-qm", "sub"]);
    must_git(&ws, &["init", "-q", "-b", "main"]);
    std::fs::write(ws.join("f.txt"), "one\n").unwrap();
    must_git(&ws, &["add", "f.txt"]);
    must_git(&ws, &["commit", "-qm", "operator-first"]);
    must_git(
        &ws,
        &[
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "-q",
            &sub_src.display().to_string(),
            "sub",
        ],
    );
    must_git(&ws, &["commit", "-qm", "operator-submodule"]);
    must_git(&ws, &["worktree", "add", "-q", "-b", "side", "wt"]);
    open_to_everyone(&ws);
    assert!(ws.join(".git/modules/sub/config").is_file());
    assert!(ws.join(".git/worktrees/wt/commondir").is_file());

    let m = marks.display();
    let w = ws.display();
    let attack = format!(
        r#"G='git -c safe.directory=* -c user.name=agent -c user.email=agent@example.invalid'
echo agent-work > work.txt
$G add work.txt && $G commit -qm agent-commit && echo COMMIT=ok
mkdir -p .wip/hooks
printf '[core]\n\trepositoryformatversion = 0\n\tfsmonitor = "touch {m}/fsmonitor-ran; false"\n[filter "evil"]\n\tclean = "touch {m}/filter-ran; cat"\n\tsmudge = cat\n' > .wip/config
printf '#!/bin/sh\ntouch {m}/hook-ran\n' > .wip/hooks/pre-commit; chmod +x .wip/hooks/pre-commit
cp .wip/hooks/pre-commit .wip/hooks/post-commit
ln -s ../.git/objects .wip/objects; ln -s ../.git/refs .wip/refs
echo '* filter=evil' > .git/info/attributes && echo W-attributes
mkdir -p .git/info2 && echo W-newdir
printf '[core]\n\tfsmonitor = "touch {m}/module-ran; false"\n' >> .git/modules/sub/config && echo W-module
printf '[core]\n\tfsmonitor = "touch {m}/worktree-config-ran; false"\n' >> .git/worktrees/wt/config.worktree && echo W-worktree-config
echo '{w}/.wip' > .git/worktrees/wt/commondir && echo W-worktree-commondir
echo x > .git/hooks/pre-commit && echo W-hook
rm -f .git/logs/HEAD; ln -s {m}/reflog-victim .git/logs/HEAD && echo W-reflog-link
echo ../.wip > .git/commondir && echo W-commondir
exit 0"#
    );
    let d = deploy(&[
        ("supervisor", &format!("workspaces.repo.path=\"{w}\"")),
        ("supervisor", "workspaces.repo.allow_execute=true"),
    ])
    .await;
    let mut c = client(&d);
    let evs = run(
        &mut c,
        workspace_turn("git", "repo", &shell_then_message(&attack)),
    )
    .await;
    let out = output(&evs);
    assert!(
        out.contains("COMMIT=ok"),
        "the agent's own git add + commit must work: {out}"
    );
    for refused in ["W-attributes", "W-module", "W-worktree-commondir", "W-hook"] {
        assert!(!out.contains(refused), "{refused}: {out}");
    }
    // Whatever it created in a git directory (the measured commondir, a linked worktree's
    // config.worktree) stayed in its sandbox.
    for never in ["commondir", "info2", "worktrees/wt/config.worktree"] {
        assert!(
            !ws.join(".git").join(never).exists(),
            "{never} reached the host: {out}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(ws.join(".git/worktrees/wt/commondir")).unwrap(),
        "../..\n"
    );

    // The operator's git, as root, on the host. A stat-dirty file makes status consult the
    // clean filter; the commit runs the hooks.
    std::fs::write(ws.join("f.txt"), "one\n").unwrap();
    let mut seen = String::new();
    for (dir, args) in [
        (ws.clone(), vec!["status", "--short"]),
        (ws.clone(), vec!["log", "--oneline", "-n", "5"]),
        (ws.clone(), vec!["diff", "--stat"]),
        (
            ws.clone(),
            vec!["commit", "-q", "--allow-empty", "-m", "operator-after"],
        ),
        (ws.join("sub"), vec!["status", "--short"]),
        (ws.join("wt"), vec!["status", "--short"]),
        (ws.join("wt"), vec!["log", "--oneline", "-n", "1"]),
    ] {
        seen.push_str(&format!("$ git {args:?} in {}\n", dir.display()));
        seen.push_str(&host_git(&dir, &args));
    }
    let ran: Vec<String> = std::fs::read_dir(&marks)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        ran.is_empty(),
        "the agent's commands ran as root on the host: {ran:?}\n{seen}\nagent: {out}"
    );
    // The agent's commit is on the host's branch; the operator's commit went on top of it.
    let log = host_git(&ws, &["log", "--format=%s", "-n", "3"]);
    assert!(log.contains("agent-commit"), "{log}\n{seen}");
    assert!(log.starts_with("operator-after"), "{log}\n{seen}");
    // Both sides' git still work: nothing the agent did broke the repository.
    assert!(!seen.contains("fatal"), "{seen}");
    assert!(text(&evs).contains("agent-still-here"), "{:?}", stop(&evs));
}

#[tokio::test(flavor = "multi_thread")]
async fn allow_execute_false_stops_the_agents_own_shell() {
    if !runs_contained() {
        return;
    }
    let no = fresh("noexec-ws");
    let yes = fresh("exec-ws");
    open_to_everyone(&no);
    open_to_everyone(&yes);
    let d = deploy(&[
        (
            "supervisor",
            &format!("workspaces.noexec.path=\"{}\"", no.display()),
        ),
        (
            "supervisor",
            &format!("workspaces.exec.path=\"{}\"", yes.display()),
        ),
        ("supervisor", "workspaces.exec.allow_execute=true"),
    ])
    .await;
    let mut c = client(&d);
    let cmd = "echo ran > marker";
    if warden_sandbox::landlock_abi().is_none() {
        // Without Landlock nothing could stop the agent's shell: the agent is refused.
        let mut s = c
            .run_turn(workspace_turn("noexec", "noexec", &shell_then_message(cmd)))
            .await;
        if let Ok(stream) = s.as_mut() {
            let evs = collect(stream.get_mut(), std::time::Duration::from_secs(30)).await;
            let st = stop(&evs);
            assert_eq!(st.stop_reason, "fault", "{st:?}");
            assert!(
                st.fault
                    .as_ref()
                    .is_some_and(|f| f.message.contains("Landlock")),
                "{st:?}"
            );
        }
        assert!(!no.join("marker").exists());
        return;
    }
    let evs = run(
        &mut c,
        workspace_turn("noexec", "noexec", &shell_then_message(cmd)),
    )
    .await;
    let out = output(&evs);
    assert!(
        !no.join("marker").exists(),
        "the agent's own sh ran in an allow_execute = false workspace: {out}"
    );
    assert!(
        out.to_lowercase().contains("permission denied"),
        "the shell fails to start: {out}"
    );
    // The agent itself runs on: its turn ends normally with its later message.
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{:?}", stop(&evs));
    assert!(text(&evs).contains("agent-still-here"), "{evs:#?}");
    // A second turn: the agent is alive and still held.
    let mut t = workspace_turn(
        "noexec",
        "noexec",
        &shell_then_message("/bin/true && echo t2 > marker2"),
    );
    t.turn_id = "noexec-2".into();
    t.message_id = "m-noexec-2".into();
    t.task_id = "t-noexec-2".into();
    let evs = run(&mut c, t).await;
    assert!(!no.join("marker2").exists(), "{}", output(&evs));
    assert!(text(&evs).contains("agent-still-here"));

    let evs = run(
        &mut c,
        workspace_turn("exec", "exec", &shell_then_message(cmd)),
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(yes.join("marker")).unwrap_or_default(),
        "ran\n",
        "with allow_execute = true the agent's shell runs: {}",
        output(&evs)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn allow_execute_false_holds_behind_the_egress_relay() {
    if !runs_contained() || warden_sandbox::landlock_abi().is_none() {
        println!("SKIP: not contained here, or no Landlock (the test above covers the refusal)");
        return;
    }
    // network = "proxy": the relay is exec'd after the restriction and starts the agent; both
    // must still run, the agent's shell must not.
    let no = fresh("noexec-proxy-ws");
    open_to_everyone(&no);
    let d = deploy(&[
        (
            "supervisor",
            &format!("workspaces.noexec.path=\"{}\"", no.display()),
        ),
        ("supervisor", "agents.scripted.network=\"proxy\""),
    ])
    .await;
    let mut c = client(&d);
    let evs = run(
        &mut c,
        workspace_turn(
            "noexec-proxy",
            "noexec",
            &shell_then_message("echo ran > marker"),
        ),
    )
    .await;
    assert!(!no.join("marker").exists(), "{}", output(&evs));
    assert_eq!(stop(&evs).stop_reason, "end_turn", "{:?}", stop(&evs));
    assert!(text(&evs).contains("agent-still-here"), "{evs:#?}");
}
