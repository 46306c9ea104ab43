//! A root spawner runs its children as the agent identity under bubblewrap: not root, no host
//! secrets in /etc, agent-control paths read-only, the rest of the root and home writable.
//! Skips, saying so, when this test does not run as root or bubblewrap does not work.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::{Fixture, run};
use warden_sandbox::{AgentHomes, AgentIdentity, OwnedRoots, Profile};

const AGENT: AgentIdentity = AgentIdentity {
    uid: 61_000,
    gid: 61_000,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_spawner_runs_the_agent_unprivileged_with_a_minimal_etc_and_locked_control_paths() {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP: not root; the spawner cannot switch uids");
        return;
    }
    let fx = Fixture::new("identity");
    if fx.bwrap.is_none() {
        println!("SKIP: bubblewrap missing or not working on this host");
        return;
    }
    // bubblewrap runs as the agent and resolves its bind sources on the host: the agent needs
    // search (not listing) on the way down (the supervisor makes its own directories so).
    let state = fx.state_dir();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o711)).unwrap();
    let roots = OwnedRoots::open(&state, &fx.store).unwrap();
    std::fs::set_permissions(roots.dir(), std::fs::Permissions::from_mode(0o711)).unwrap();
    assert_eq!(warden_sandbox::first_unsearchable(roots.dir(), AGENT), None);
    let boundary = roots
        .create("ident", "p", true, Profile::WorkspaceWrite, Some(AGENT))
        .unwrap();
    assert_eq!(std::fs::metadata(&boundary.root).unwrap().uid(), AGENT.uid);
    let homes = AgentHomes::open(&state, true).unwrap();
    let home = homes.create("ident", None, Some(AGENT)).unwrap();
    assert_eq!(std::fs::metadata(home.path()).unwrap().uid(), AGENT.uid);

    let spawner = fx.spawner(true).with_identity(Some(AGENT));
    assert_eq!(spawner.agent_identity(), Some(AGENT));
    let root = boundary.root.display().to_string();
    // A repository the agent works in (owned by the agent, as its own checkout would be).
    std::fs::create_dir(boundary.root.join(".git")).unwrap();
    std::os::unix::fs::chown(boundary.root.join(".git"), Some(AGENT.uid), Some(AGENT.gid)).unwrap();
    let script = format!(
        "echo uid=$(id -u) gid=$(id -g) groups=$(id -G) user=$USER; \
         cat /etc/shadow >/dev/null 2>&1 && echo SHADOW-READ; \
         test -e /etc/ssh && echo SSH-SEEN; \
         grep -c . /etc/passwd | sed 's/^/passwd-lines=/'; \
         cat /etc/claude-code/managed-settings.json | grep -q allowManagedHooksOnly && echo MANAGED; \
         test -f /etc/codex/requirements.toml && echo REQUIREMENTS; \
         echo '{{}}' > '{root}/.claude/settings.json' 2>/dev/null && echo WROTE-ROOT-CLAUDE; \
         echo '{{}}' > '{root}/.mcp.json' 2>/dev/null && echo WROTE-MCP; \
         mv '{root}/.claude' '{root}/.claude-moved' 2>/dev/null && echo MOVED-CLAUDE; \
         mv \"$HOME/.claude\" \"$HOME/.claude-moved\" 2>/dev/null && echo MOVED-HOME-CLAUDE; \
         mv '{root}/.git' '{root}/.git-moved' 2>/dev/null && echo MOVED-GIT; \
         echo x > '{root}/.git/hooks/pre-commit' 2>/dev/null && echo WROTE-HOOK; \
         echo x > '{root}/.git/HEAD' && echo WROTE-GIT-HEAD; \
         echo ../.wip > '{root}/.git/commondir' && echo WROTE-COMMONDIR-IN-SANDBOX; \
         echo '{{}}' > \"$HOME/.claude/settings.json\" 2>/dev/null && echo WROTE-HOME-SETTINGS; \
         echo x > \"$HOME/.claude/state.json\" && echo WROTE-HOME-STATE; \
         echo x > '{root}/work.txt' && echo WROTE-WORK; \
         ls -l /proc/self/fd/ | grep -q warden-etc && echo ETC-FD-HELD; exit 0"
    );
    let mut spec = fx.spec("ident", boundary.clone(), &script);
    spec.home = Some(home.path().to_path_buf());
    let (code, out, err) = run(&spawner, spec).await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains("uid=61000 gid=61000 groups=61000 user=warden-agent"),
        "{out}"
    );
    for never in [
        "SHADOW-READ",
        "SSH-SEEN",
        "WROTE-ROOT-CLAUDE",
        "WROTE-MCP",
        "MOVED-CLAUDE",
        "MOVED-HOME-CLAUDE",
        "MOVED-GIT",
        "WROTE-HOOK",
        "WROTE-HOME-SETTINGS",
        // bubblewrap closes the generated-/etc descriptors once it has read them.
        "ETC-FD-HELD",
    ] {
        assert!(!out.contains(never), "{never}: {out}\n{err}");
    }
    for must in [
        "passwd-lines=3",
        "MANAGED",
        "REQUIREMENTS",
        "WROTE-HOME-STATE",
        "WROTE-WORK",
        "WROTE-GIT-HEAD",
        "WROTE-COMMONDIR-IN-SANDBOX",
    ] {
        assert!(out.contains(must), "{must}: {out}\n{err}");
    }
    // What the agent writes at the top of a .git stays in its sandbox's tmpfs: the host's
    // repository never sees a commondir (issue 24) nor the agent's HEAD.
    assert!(!boundary.root.join(".git/commondir").exists(), "{out}");
    assert!(!boundary.root.join(".git/HEAD").exists(), "{out}");
    // What the agent made is the agent's on the host too.
    let work = boundary.root.join("work.txt");
    assert_eq!(std::fs::metadata(&work).unwrap().uid(), AGENT.uid);
    // A path the agent cannot reach is refused before anything starts, naming what blocks it.
    let closed = state.join("closed");
    std::fs::create_dir_all(closed.join("inner")).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut spec = fx.spec("ident", boundary.clone(), "exit 0");
    spec.extra_ro_binds = vec![closed.join("inner")];
    let err = spawner.spawn(spec).map(|_| ()).unwrap_err().to_string();
    assert!(
        err.contains("cannot reach") && err.contains(&closed.display().to_string()),
        "{err}"
    );
    home.remove().unwrap();
}
