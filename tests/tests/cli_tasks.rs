//! `warden tasks` against a running deployment (issue 39): `send -o json`'s end record names the
//! task, its context and the diff kept on disk; `tasks list|show|diff` read the caller's tasks by
//! unique id prefix; `tasks apply -C DIR` applies the change in a git repository, after which
//! `git diff` there is the task's diff; over the person's own uncommitted change to a file it
//! touches it is refused with DIR left as it was; and
//! what a hostile agent planted in its root's `.git` (hooks, config with an fsmonitor command)
//! and in a nested `.git` never reaches DIR or runs.

use std::path::Path;

use serde_json::{Value, json};
use warden_e2e::{Deployment, Options};

async fn warden(d: &Deployment, args: &[&str]) -> (i32, String, String) {
    d.warden(args).await
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
        ])
        .args(args)
        .current_dir(dir)
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
}

/// From the first `diff --git` on, without `index` lines (git's blob ids; warden names none).
fn body(diff: &str) -> String {
    let start = diff.find("diff --git").unwrap_or(diff.len());
    diff[start..]
        .lines()
        .filter(|l| !l.starts_with("index "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn send_then_tasks_diff_and_apply_give_the_person_the_change() {
    let d = Deployment::up(Options::default()).await;
    // As `warden up` writes it: where `send` and `tasks` find the gateway.
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let repo = d.dir.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("README"), "base\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "base"]);
    let pwned = d.dir.path().join("pwned");
    let plant = format!(
        "mkdir -p .git/hooks sub/.git; \
         printf '#!/bin/sh\\ntouch {p}-hook\\n' > .git/hooks/post-applypatch; chmod +x .git/hooks/post-applypatch; \
         cp .git/hooks/post-applypatch .git/hooks/pre-commit; \
         printf '[core]\\n\\tfsmonitor = touch {p}-fsmonitor\\n\\thooksPath = .git/hooks\\n' > .git/config; \
         cp .git/config sub/.git/config; \
         printf '* diff=evil merge=evil\\n' > .gitattributes",
        p = pwned.display()
    );
    let scenario = json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "src/new.txt", "content": "hello\nworld\n"},
        {"type": "tool", "kind": "execute", "command": plant},
        {"type": "message", "text": "done"}]});
    let (code, out, err) = warden(&d, &["send", "-o", "json", &scenario.to_string()]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let end: Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "end")
        .expect("an end record");
    let task_id = end["taskId"].as_str().expect("a task id").to_string();
    assert!(
        end["contextId"].as_str().is_some_and(|c| !c.is_empty()),
        "{end}"
    );
    let files: Vec<&str> = end["filesChanged"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(files.contains(&"src/new.txt"), "{end}");
    assert!(files.contains(&".gitattributes"), "{end}");
    let saved = std::fs::read_to_string(end["diff"].as_str().expect("the diff's path")).unwrap();
    assert!(
        !saved.contains("fsmonitor"),
        "a .git file in the diff: {saved}"
    );
    assert!(!saved.contains("diff --git a/sub/.git"), "{saved}");
    // The nested one was planted (so the agent could write there): named, never shown.
    assert!(
        saved.contains("# sub/.git/config: changed, not shown"),
        "{saved}"
    );

    // By a unique prefix: the same diff as the one saved; list and show know the task.
    let prefix = &task_id[..8];
    let (code, shown, err) = warden(&d, &["tasks", "diff", prefix]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(shown, saved);
    let (code, listed, err) = warden(&d, &["tasks", "list", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert!(
        listed["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["taskId"] == task_id.as_str()),
        "{listed}"
    );
    let (code, one, err) = warden(&d, &["tasks", "show", prefix, "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let one: Value = serde_json::from_str(&one).unwrap();
    assert_eq!(one["taskId"], task_id.as_str());
    assert_eq!(one["contextId"], end["contextId"]);
    assert!(
        one["diff"]["files"]
            .as_array()
            .unwrap()
            .contains(&json!("src/new.txt"))
    );
    let (code, _, err) = warden(&d, &["tasks", "diff", "zzzz-no-such"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no task of yours"), "{err}");

    // Applied in the repository: git's own diff of it is the task's diff.
    let dir = repo.to_string_lossy().to_string();
    let (code, out, err) = warden(&d, &["tasks", "apply", prefix, "-C", &dir]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        std::fs::read_to_string(repo.join("src/new.txt")).unwrap(),
        "hello\nworld\n"
    );
    git(&repo, &["add", "-A"]);
    let theirs = git(&repo, &["diff", "--cached", "--no-color", "--no-ext-diff"]);
    assert_eq!(body(&theirs), body(&saved));
    assert!(
        !repo.join("sub/.git").exists(),
        "a nested .git reached the repository"
    );
    let config = std::fs::read_to_string(repo.join(".git/config")).unwrap();
    assert!(!config.contains("fsmonitor"), "{config}");

    // A commit in the repository runs no planted hook.
    git(&repo, &["commit", "-qm", "applied"]);
    // A person's own uncommitted change to a file the task touched: refused, nothing changed.
    std::fs::write(repo.join("src/new.txt"), "mine\n").unwrap();
    let before = git(&repo, &["status", "--porcelain"]);
    let (code, _, err) = warden(&d, &["tasks", "apply", prefix, "-C", &dir]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("does not apply cleanly"), "{err}");
    assert!(err.contains("nothing was changed"), "{err}");
    assert_eq!(git(&repo, &["status", "--porcelain"]), before);
    assert_eq!(
        std::fs::read_to_string(repo.join("src/new.txt")).unwrap(),
        "mine\n"
    );
    for what in ["hook", "fsmonitor"] {
        let p = format!("{}-{what}", pwned.display());
        assert!(!Path::new(&p).exists(), "a planted {what} ran");
    }
}

/// `send -C DIR`: the agent works on a copy of DIR (its uncommitted changes included); DIR is
/// untouched until `tasks apply`; `--context` continues on the same copy and the diff grows;
/// after the apply, `git diff` in DIR is the task's diff. Bad directories are refused before
/// anything is sent, and a directory of another user by the supervisor.
#[tokio::test(flavor = "multi_thread")]
async fn send_dash_c_works_on_a_copy_and_tasks_apply_brings_the_change_back() {
    // As `warden up` starts it: [copies] local_dirs on.
    let d = Deployment::up(Options::default()).await;
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let repo = d.dir.path().join("mine");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("README"), "base\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "base"]);
    // Uncommitted work (staged, so `git diff` later shows the task's change alone).
    std::fs::write(repo.join("README"), "base\nlocal\n").unwrap();
    git(&repo, &["add", "-A"]);
    let dir = repo.to_string_lossy().to_string();

    let edit = json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "README", "content": "base\nlocal\nagent\n"},
        {"type": "message", "text": "done"}]});
    let (code, out, err) = warden(&d, &["send", "-C", &dir, "-o", "json", &edit.to_string()]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let end: Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "end")
        .expect("an end record");
    let ctx = end["contextId"].as_str().unwrap().to_string();
    let first = std::fs::read_to_string(end["diff"].as_str().unwrap()).unwrap();
    assert_eq!(
        first,
        format!(
            "diff --git a/README b/README\nindex {}..{} 100644\n--- a/README\n+++ b/README\n@@ -1,2 +1,3 @@\n base\n local\n+agent\n",
            warden_e2e::git_blob_id(b"base\nlocal\n"),
            warden_e2e::git_blob_id(b"base\nlocal\nagent\n")
        )
    );
    // DIR itself is untouched.
    assert_eq!(
        std::fs::read_to_string(repo.join("README")).unwrap(),
        "base\nlocal\n"
    );

    // The same context: the same copy, the diff grows.
    let more = json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "docs/added.txt", "content": "more\n"},
        {"type": "message", "text": "done"}]});
    let (code, out, err) = warden(
        &d,
        &[
            "send",
            "-C",
            &dir,
            "--context",
            &ctx,
            "-o",
            "json",
            &more.to_string(),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    let end: Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "end")
        .unwrap();
    assert_eq!(end["contextId"], ctx.as_str());
    assert_eq!(
        end["filesChanged"],
        json!(["README", "docs/added.txt"]),
        "{end}"
    );
    let task = end["taskId"].as_str().unwrap().to_string();
    assert!(!repo.join("docs").exists());
    let (code, listed, err) = warden(&d, &["contexts", "list", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let c = listed["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["contextId"] == ctx.as_str())
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(c["tasks"], 2, "{listed}");
    assert_eq!(c["lastTaskId"], task.as_str(), "{listed}");

    let (code, out, err) = warden(&d, &["tasks", "apply", &task[..8], "-C", &dir]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let (_, shown, _) = warden(&d, &["tasks", "diff", &task[..8]]).await;
    git(&repo, &["add", "-N", "."]);
    let theirs = git(&repo, &["diff", "--no-color", "--no-ext-diff"]);
    assert_eq!(body(&theirs), body(&shown));
    assert_eq!(
        std::fs::read_to_string(repo.join("README")).unwrap(),
        "base\nlocal\nagent\n"
    );

    // Refused before anything is sent: missing, not a directory, a link.
    let file = repo.join("README").to_string_lossy().to_string();
    let link = d.dir.path().join("link");
    std::os::unix::fs::symlink(&repo, &link).unwrap();
    for (bad, why) in [
        ("/nonexistent/warden-e2e", "no such directory"),
        (file.as_str(), "not a directory"),
        (link.to_str().unwrap(), "a symbolic link"),
    ] {
        let (code, _, err) = warden(&d, &["send", "-C", bad, "write x.txt"]).await;
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(
            err.contains(why) && err.contains("nothing was sent"),
            "{err}"
        );
    }
    // Another user's directory: the supervisor refuses to copy it.
    if nix::unistd::Uid::effective().is_root() {
        let theirs = d.dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let (code, out, err) =
            warden(&d, &["send", "-C", theirs.to_str().unwrap(), "write x.txt"]).await;
        assert_ne!(code, 0, "{out}\n{err}");
        assert!(out.contains("owned by uid 65534"), "{out}\n{err}");
    }
}

/// A hostile directory and a hostile agent together: DIR's own `.git/config` names an fsmonitor,
/// a hooks directory, clean/smudge filters and a merge driver, and its `.gitattributes` asks for
/// them on every file; the agent plants `.git/config`, hooks and `.gitattributes` in its copy.
/// Neither the copy (`send -C`) nor `tasks apply` runs any of them: the marker each would leave
/// is never made, and the change still lands.
#[tokio::test(flavor = "multi_thread")]
async fn nothing_a_directory_or_an_agent_configured_runs_on_copy_or_apply() {
    use std::os::unix::fs::PermissionsExt;
    let d = Deployment::up(Options::default()).await;
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let repo = d.dir.path().join("hostile");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("README"), "base\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "base"]);
    // Each command leaves its own marker (a script: `;` starts a comment in git's config).
    let marker = |what: &str| d.dir.path().join(format!("ran-{what}"));
    let script = |what: &str| {
        let p = d.dir.path().join(format!("{what}.sh"));
        std::fs::write(
            &p,
            format!("#!/bin/sh\ntouch {}\ncat\n", marker(what).display()),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.display().to_string()
    };
    let hooks = repo.join(".git/myhooks");
    std::fs::create_dir(&hooks).unwrap();
    for h in [
        "pre-commit",
        "post-checkout",
        "post-applypatch",
        "pre-applypatch",
    ] {
        std::fs::copy(script("hook"), hooks.join(h)).unwrap();
    }
    let mut config = std::fs::read_to_string(repo.join(".git/config")).unwrap();
    config.push_str(&format!(
        "[core]\n\tfsmonitor = {}\n\thooksPath = {}\n[filter \"evil\"]\n\tclean = {}\n\tsmudge = {}\n\trequired = true\n[merge \"evil\"]\n\tdriver = {}\n",
        script("fsmonitor"),
        hooks.display(),
        script("clean"),
        script("smudge"),
        script("merge"),
    ));
    std::fs::write(repo.join(".git/config"), config).unwrap();
    std::fs::write(repo.join(".gitattributes"), "* filter=evil merge=evil\n").unwrap();
    let dir = repo.to_string_lossy().to_string();

    // The agent plants its own in the copy, and changes a file.
    let plant = format!(
        "mkdir -p .git/hooks; \
         printf '#!/bin/sh\\ntouch {p}\\n' > .git/hooks/post-applypatch; chmod +x .git/hooks/post-applypatch; \
         printf '[core]\\n\\tfsmonitor = {p}\\n[filter \"x\"]\\n\\tclean = {p}\\n' > .git/config; \
         printf '* filter=x diff=x merge=x\\n' >> .gitattributes",
        p = marker("planted").display()
    );
    let scenario = json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "README", "content": "base\nagent\n"},
        {"type": "tool", "kind": "execute", "command": plant},
        {"type": "message", "text": "done"}]});
    let (code, out, err) = warden(
        &d,
        &["send", "-C", &dir, "-o", "json", &scenario.to_string()],
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    let end: Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "end")
        .expect("an end record");
    assert_eq!(
        end["filesChanged"],
        json!([".gitattributes", "README"]),
        "{end}"
    );
    let task = end["taskId"].as_str().unwrap().to_string();

    let (code, out, err) = warden(&d, &["tasks", "apply", &task[..8], "-C", &dir]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        std::fs::read_to_string(repo.join("README")).unwrap(),
        "base\nagent\n"
    );
    // What the agent planted in its copy's .git never reached DIR's.
    let config = std::fs::read_to_string(repo.join(".git/config")).unwrap();
    assert!(!config.contains("ran-planted"), "{config}");
    assert!(!repo.join(".git/hooks/post-applypatch").exists());
    for what in ["hook", "fsmonitor", "clean", "smudge", "merge", "planted"] {
        assert!(!marker(what).exists(), "{what} ran on copy or apply");
    }
    // The harness's git (with the repository's config, as the person's would) does run the
    // filter: the test's commands are real ones. (The agent's attributes line, applied, names
    // its own filter for every file: the directory's is put back first.)
    std::fs::write(repo.join(".gitattributes"), "* filter=evil merge=evil\n").unwrap();
    std::process::Command::new("git")
        .args(["-c", "core.fsmonitor=false", "add", "README"])
        .current_dir(&repo)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(
        marker("clean").exists(),
        "the directory's filter is not a real one"
    );
}

/// The person's files moved on since the copy: where their change and the agent's touch
/// different lines of a file, `tasks apply` merges them three ways (the diff names git's blob
/// ids, the pre-image is found in DIR's repository); where they touch the same line it is
/// refused with DIR left as it was.
#[tokio::test(flavor = "multi_thread")]
async fn tasks_apply_merges_three_ways_and_refuses_a_conflict() {
    let d = Deployment::up(Options::default()).await;
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let repo = d.dir.path().join("moving");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    let lines = |change: &[(usize, &str)]| {
        (1..=9)
            .map(|i| {
                change
                    .iter()
                    .find(|(n, _)| *n == i)
                    .map_or(i.to_string(), |(_, s)| s.to_string())
                    + "\n"
            })
            .collect::<String>()
    };
    std::fs::write(repo.join("f.txt"), lines(&[])).unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "base"]);
    let dir = repo.to_string_lossy().to_string();
    let edit = json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "f.txt", "content": lines(&[(7, "seven")])},
        {"type": "message", "text": "done"}]});
    let (code, out, err) = warden(&d, &["send", "-C", &dir, "-o", "json", &edit.to_string()]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let end: Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "end")
        .expect("an end record");
    let task = end["taskId"].as_str().unwrap().to_string();

    // The same line changed meanwhile: refused, nothing changed.
    std::fs::write(repo.join("f.txt"), lines(&[(7, "mine")])).unwrap();
    git(&repo, &["commit", "-qam", "mine"]);
    let (code, _, err) = warden(&d, &["tasks", "apply", &task[..8], "-C", &dir]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("does not apply cleanly"), "{err}");
    assert_eq!(
        std::fs::read_to_string(repo.join("f.txt")).unwrap(),
        lines(&[(7, "mine")])
    );
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");

    // Another line, two away, in the hunk's context: a plain apply cannot, the merge does.
    git(&repo, &["reset", "-q", "--hard", "HEAD~1"]);
    std::fs::write(repo.join("f.txt"), lines(&[(5, "five")])).unwrap();
    git(&repo, &["commit", "-qam", "theirs"]);
    let (code, out, err) = warden(&d, &["tasks", "apply", &task[..8], "-C", &dir]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        std::fs::read_to_string(repo.join("f.txt")).unwrap(),
        lines(&[(5, "five"), (7, "seven")])
    );
    // DIR's own index is the person's: the change is in the working tree, unstaged.
    assert_eq!(git(&repo, &["status", "--porcelain"]), " M f.txt\n");
}
