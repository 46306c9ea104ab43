//! Owned sandboxes against hostile conversation ids, and operator workspaces against homes and
//! agent configuration homes (by spelling and by directory identity).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use warden_sandbox::{OwnedRoots, Profile, RootOwner, SandboxError, WorkspacePolicy};
use warden_store::Store;

fn state() -> (tempfile::TempDir, PathBuf, Store) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("state");
    let real = std::fs::canonicalize(dir.path()).expect("canonical");
    let store = Store::open(&real.join("db")).expect("store");
    (dir, real, store)
}

#[test]
fn hostile_conversation_ids_never_move_the_sandbox() {
    let (_d, state, store) = state();
    let roots = OwnedRoots::open(&state, &store).expect("roots");
    let long = "A".repeat(10_000);
    let hostile = [
        "..",
        "../..",
        "../../../../etc",
        "/",
        "/etc/passwd",
        "a/../../b",
        ".",
        "",
        "\0",
        "x\0y",
        "\n\r\t\x1b[31m",
        "~",
        "$HOME",
        "-rf",
        long.as_str(),
        "ctx-1",
    ];
    let mut dirs = Vec::new();
    for id in hostile {
        let b = roots
            .create(id, "p", true, Profile::WorkspaceWrite, None)
            .expect("create");
        assert!(b.owned);
        assert_eq!(
            b.root.parent(),
            Some(roots.dir()),
            "{id:?} moved the sandbox"
        );
        let name = b
            .root
            .file_name()
            .and_then(|n| n.to_str())
            .expect("utf-8 name");
        assert!(name.len() <= 32 + 7, "{id:?}: {name}");
        assert!(name.starts_with(&warden_sandbox::sanitize_label(id)));
        assert!(
            name.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'),
            "{name}"
        );
        let meta = std::fs::symlink_metadata(&b.root).expect("exists");
        assert!(meta.is_dir() && meta.mode() & 0o777 == 0o710);
        assert_eq!(roots.get(id).expect("get"), Some(b.clone()));
        dirs.push(b.root);
    }
    dirs.sort();
    dirs.dedup();
    assert_eq!(
        dirs.len(),
        hostile.len(),
        "every conversation got its own directory"
    );
    // One conversation, one sandbox.
    assert!(
        roots
            .create("ctx-1", "p", true, Profile::ReadOnly, None)
            .is_err()
    );
}

#[test]
fn a_swapped_or_symlinked_sandbox_is_not_adopted() {
    let (_d, state, store) = state();
    let roots = OwnedRoots::open(&state, &store).expect("roots");
    let b = roots
        .create("victim", "p", false, Profile::ReadOnly, None)
        .expect("create");
    // Replace the directory with a symlink of the same name pointing elsewhere.
    std::fs::remove_dir(&b.root).expect("rm");
    std::os::unix::fs::symlink("/etc", &b.root).expect("plant symlink");
    assert!(roots.get("victim").is_err(), "symlink adopted");
    // Replace it with a fresh directory of the same name: a different inode.
    std::fs::remove_file(&b.root).expect("rm link");
    std::fs::create_dir(&b.root).expect("recreate");
    assert!(
        roots.get("victim").is_err(),
        "a new directory with the right name adopted"
    );
    // Removing refuses to follow it too, and still forgets the entry.
    roots.remove("victim").expect("remove");
    assert!(
        b.root.exists(),
        "an unverified directory must not be deleted"
    );
    assert_eq!(roots.get("victim").expect("get"), None);
}

#[test]
fn a_root_keeps_its_owner_across_a_reopen_and_a_hand_over() {
    let (_d, state, store) = state();
    {
        let roots = OwnedRoots::open(&state, &store).expect("roots");
        roots
            .create("team-ctx", "alice", false, Profile::WorkspaceWrite, None)
            .expect("create");
        roots
            .create("warm-1", "", false, Profile::WorkspaceWrite, None)
            .expect("create warm");
        roots.rename("warm-1", "bob-ctx", "bob").expect("hand over");
    }
    // A new allocator over the same store (a restart) reads the owners back.
    let roots = OwnedRoots::open(&state, &store).expect("reopen");
    let alice = roots.owner("team-ctx").expect("owner").expect("registered");
    assert_eq!(alice, RootOwner::Principal("alice".into()));
    assert!(alice.is("alice") && !alice.is("bob") && !alice.is(""));
    assert_eq!(
        roots.owner("bob-ctx").expect("owner"),
        Some(RootOwner::Principal("bob".into()))
    );
    assert_eq!(roots.owner("warm-1").expect("owner"), None);
    assert_eq!(roots.owner("nobody").expect("owner"), None);
    // A record written before owners were recorded belongs to nobody, not to everybody.
    let legacy = serde_json::json!({
        "dir": state.join("sandboxes").join("old"), "dev": 0, "ino": 0,
        "allow_execute": false, "profile": Profile::WorkspaceWrite
    });
    store
        .tree("sandbox-roots")
        .expect("tree")
        .put(b"old-ctx", serde_json::to_vec(&legacy).expect("json"))
        .expect("put");
    let old = roots.owner("old-ctx").expect("owner").expect("registered");
    assert_eq!(old, RootOwner::Unrecorded);
    assert!(!old.is("") && !old.is("alice"));
}

#[test]
fn state_dirs_in_temp_trees_or_behind_symlinks_are_refused() {
    let (_d, state, store) = state();
    let tmp = tempfile::tempdir_in("/tmp").expect("tmp");
    assert!(
        OwnedRoots::open(tmp.path(), &store).is_err(),
        "/tmp accepted"
    );
    assert!(OwnedRoots::open(Path::new("relative/dir"), &store).is_err());
    let link = state.join("link");
    std::os::unix::fs::symlink(&state, &link).expect("link");
    assert!(
        OwnedRoots::open(&link, &store).is_err(),
        "symlinked state dir accepted"
    );
    // A planted `sandboxes` symlink is refused rather than followed.
    let other = state.join("other");
    std::fs::create_dir(&other).expect("other");
    std::os::unix::fs::symlink("/tmp", other.join("sandboxes")).expect("plant");
    assert!(OwnedRoots::open(&other, &store).is_err());
}

struct Homes {
    _dir: tempfile::TempDir,
    base: PathBuf,
    home: PathBuf,
    codex_home: PathBuf,
    policy: WorkspacePolicy,
}

fn homes() -> Homes {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let base = std::fs::canonicalize(dir.path()).expect("canonical");
    let home = base.join("home/alice");
    let codex_home = base.join("elsewhere/codex-home");
    for d in [
        home.join("project/src"),
        home.join(".claude/projects"),
        home.join(".codex"),
        codex_home.clone(),
        base.join("srv/work"),
    ] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::write(base.join("srv/file"), "x").expect("file");
    let policy = WorkspacePolicy::new(
        vec![home.clone()],
        vec![
            home.join(".claude"),
            home.join(".codex"),
            codex_home.clone(),
        ],
    );
    Homes {
        _dir: dir,
        base,
        home,
        codex_home,
        policy,
    }
}

fn refused(p: &WorkspacePolicy, path: &Path) -> bool {
    matches!(
        p.validate(path, false, Profile::WorkspaceWrite),
        Err(SandboxError::WorkspaceRefused { .. })
    )
}

#[test]
fn workspace_validation_refuses_homes_their_ancestors_and_config_homes() {
    let h = homes();
    let p = &h.policy;
    for bad in [
        PathBuf::from("/"),
        PathBuf::from("/.."),
        h.home.clone(),
        h.home.join("project/.."),
        h.home.parent().expect("parent").to_path_buf(),
        h.base.clone(),
        h.home.join(".claude"),
        h.home.join(".claude/projects"),
        h.home.join(".codex"),
        h.codex_home.clone(),
        h.codex_home.parent().expect("parent").to_path_buf(),
        h.base.join("srv/file"),
        h.base.join("does-not-exist"),
        PathBuf::from("relative/path"),
    ] {
        assert!(refused(p, &bad), "{} accepted", bad.display());
    }
    let ok = p
        .validate(&h.home.join("project"), true, Profile::ReadOnly)
        .expect("project under home is fine");
    assert!(!ok.owned);
    assert_eq!(ok.root, h.home.join("project"));
    assert!(
        p.validate(&h.base.join("srv/work"), false, Profile::WorkspaceWrite)
            .is_ok()
    );
}

#[test]
fn workspace_validation_sees_through_other_spellings() {
    let h = homes();
    let p = &h.policy;
    // A symlink to the home, and to a config home, are resolved before comparing.
    let links = h.base.join("srv");
    std::os::unix::fs::symlink(&h.home, links.join("to-home")).expect("link");
    std::os::unix::fs::symlink(h.home.join(".claude"), links.join("to-claude")).expect("link");
    std::os::unix::fs::symlink(&h.base, links.join("to-base")).expect("link");
    for bad in ["to-home", "to-claude", "to-base", "to-claude/projects"] {
        assert!(refused(p, &links.join(bad)), "{bad} accepted");
    }
    // A symlink to a legitimate project resolves to the project.
    std::os::unix::fs::symlink(h.home.join("project"), links.join("to-project")).expect("link");
    let b = p
        .validate(&links.join("to-project"), false, Profile::ReadOnly)
        .expect("project via link");
    assert_eq!(b.root, h.home.join("project"));

    // A bind mount is the same directory under an unrelated spelling: only (dev, inode) sees it.
    let mnt = h.base.join("srv/work/mnt");
    std::fs::create_dir(&mnt).expect("mnt");
    let ok = std::process::Command::new("mount")
        .args(["--bind"])
        .arg(&h.home)
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!(
            "SKIP-PART: bind mounts unavailable here (needs CAP_SYS_ADMIN); identity case untested"
        );
        return;
    }
    let refused_bind = refused(p, &mnt);
    let conf_bind = h.base.join("srv/work/mnt2");
    std::fs::create_dir(&conf_bind).expect("mnt2");
    let ok2 = std::process::Command::new("mount")
        .arg("--bind")
        .arg(&h.codex_home)
        .arg(&conf_bind)
        .status()
        .is_ok_and(|s| s.success());
    let refused_conf = ok2 && refused(p, &conf_bind);
    let _ = std::process::Command::new("umount").arg(&mnt).status();
    if ok2 {
        let _ = std::process::Command::new("umount")
            .arg(&conf_bind)
            .status();
    }
    assert!(refused_bind, "bind mount of the home accepted");
    assert!(!ok2 || refused_conf, "bind mount of CODEX_HOME accepted");
}

#[test]
fn host_policy_refuses_the_real_root_and_home() {
    let p = WorkspacePolicy::from_host();
    assert!(refused(&p, Path::new("/")));
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from)
        && home.is_dir()
    {
        assert!(refused(&p, &home));
        if let Some(parent) = home.parent() {
            assert!(refused(&p, parent));
        }
    }
}
