//! Removals and walks with the agent's rights, run as root (skipped otherwise): what the agent
//! can reach is removed or found, what it hid or a link it planted is not.

use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

const AGENT: Rights = Rights {
    uid: 61_321,
    gid: 61_321,
};

fn as_root() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    println!("SKIP: an agent's tree needs root to make");
    false
}

fn agent_owns(p: &Path) {
    std::os::unix::fs::lchown(p, Some(AGENT.uid), Some(AGENT.gid)).unwrap();
}

/// A root as an agent leaves it: nested files, a directory it closed to itself, links to a
/// host file and a host directory it cannot delete from, a FIFO.
fn agents_tree(base: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let outside = base.join("host");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), "host").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
    let sandboxes = base.join("sandboxes");
    std::fs::create_dir(&sandboxes).unwrap();
    std::fs::set_permissions(&sandboxes, std::fs::Permissions::from_mode(0o711)).unwrap();
    let root = sandboxes.join("conv-1");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o710)).unwrap();
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::write(root.join("a/b/c/f"), "x").unwrap();
    std::fs::write(root.join("top"), "x").unwrap();
    symlink(outside.join("keep"), root.join("a/to-file")).unwrap();
    symlink(&outside, root.join("to-dir")).unwrap();
    symlink(&outside, root.join("a/b/c/to-dir")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("fifo").as_path(),
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    for e in [
        "",
        "a",
        "a/b",
        "a/b/c",
        "a/b/c/f",
        "top",
        "a/to-file",
        "to-dir",
        "a/b/c/to-dir",
        "fifo",
    ] {
        agent_owns(&root.join(e));
    }
    // Closed to itself, as `chmod 000` leaves it: its owner may open it again.
    std::fs::set_permissions(root.join("a/b"), std::fs::Permissions::from_mode(0o000)).unwrap();
    (root, outside, sandboxes)
}

#[test]
fn a_root_is_removed_as_its_agent_and_no_planted_link_is_followed() {
    if !as_root() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (root, outside, _) = agents_tree(t.path());
    remove_tree(&root, Some(AGENT)).unwrap();
    assert!(!root.exists(), "the root and all in it are gone");
    // What the links named is the host's, which the agent could not delete: it stays.
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).unwrap(),
        "host"
    );
    assert_eq!(std::fs::metadata(&outside).unwrap().mode() & 0o7777, 0o755);
    // Absent: nothing to do.
    remove_tree(&root, Some(AGENT)).unwrap();
}

#[test]
fn what_the_agent_cannot_delete_in_its_root_survives_the_removal() {
    if !as_root() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (root, _, _) = agents_tree(t.path());
    // A directory of the host's in the root (an operator put it there, or a mount): the
    // agent cannot empty it, and neither does warden on its behalf.
    let hosts = root.join("hosts");
    std::fs::create_dir(&hosts).unwrap();
    std::fs::write(hosts.join("precious"), "p").unwrap();
    std::fs::set_permissions(&hosts, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = remove_tree(&root, Some(AGENT)).unwrap_err();
    assert!(err.to_string().contains("Permission denied"), "{err}");
    assert_eq!(
        std::fs::read_to_string(hosts.join("precious")).unwrap(),
        "p"
    );
    // With the supervisor's own (root's) rights the same call would have removed it: the
    // rights are what stopped it.
    remove_tree(&root, None).unwrap();
    assert!(!root.exists());
}

#[test]
fn a_root_the_agent_closed_to_itself_is_still_removed() {
    if !as_root() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (root, _, _) = agents_tree(t.path());
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o000)).unwrap();
    remove_tree(&root, Some(AGENT)).unwrap();
    assert!(!root.exists());
}

#[test]
fn a_link_swapped_in_while_the_root_is_removed_never_reaches_the_agents_other_files() {
    if !as_root() {
        return;
    }
    // Another conversation's root of the same agent uid: the agent's rights could delete
    // everything in it, so only never following a link keeps it. A racer swaps a full
    // directory `d` of the root being removed with a link `l` to it (RENAME_EXCHANGE:
    // atomic), as fast as it can, for the whole removal.
    for round in 0..30 {
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (root, _, sandboxes) = agents_tree(t.path());
        let other = sandboxes.join("conv-2");
        std::fs::create_dir_all(other.join("sub")).unwrap();
        std::fs::write(other.join("precious"), "p").unwrap();
        std::fs::write(other.join("sub/precious"), "p").unwrap();
        for e in ["", "sub", "precious", "sub/precious"] {
            agent_owns(&other.join(e));
        }
        std::fs::create_dir(root.join("d")).unwrap();
        for i in 0..50 {
            std::fs::write(root.join(format!("d/f{i}")), "x").unwrap();
        }
        agent_owns(&root.join("d"));
        symlink(&other, root.join("l")).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        root.join("d").as_path(),
                        rustix::fs::CWD,
                        root.join("l").as_path(),
                        rustix::fs::RenameFlags::EXCHANGE,
                    )
                    .is_err()
                    {
                        break;
                    }
                }
            });
            // A refusal (an entry that changed under the walk) is allowed; a reach into
            // conv-2 is not.
            let _ = remove_tree(&root, Some(AGENT));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        assert_eq!(
            std::fs::read_to_string(other.join("precious"))
                .ok()
                .as_deref(),
            Some("p"),
            "round {round}: the other root's file went"
        );
        assert_eq!(
            std::fs::read_to_string(other.join("sub/precious"))
                .ok()
                .as_deref(),
            Some("p"),
            "round {round}: the other root's nested file went"
        );
        // Once nothing races it, the rest of the root goes.
        remove_tree(&root, Some(AGENT)).unwrap();
        assert!(!root.exists());
        assert!(other.join("precious").exists());
    }
}

#[test]
fn the_git_walk_with_the_agents_rights_finds_what_the_agent_can_reach_and_refuses_what_it_hid() {
    if !as_root() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (root, _, _) = agents_tree(t.path());
    std::fs::set_permissions(root.join("a/b"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let host_dir = |rel: &str, mode: u32| {
        std::fs::create_dir_all(root.join(rel).join(".git")).unwrap();
        std::fs::set_permissions(root.join(rel), std::fs::Permissions::from_mode(mode)).unwrap();
    };
    // The operator's: searchable, not listable (the agent reaches `.git` by its name);
    // closed (the agent reaches nothing in it); and a plain one.
    host_dir("search-only", 0o711);
    host_dir("closed", 0o700);
    host_dir("open", 0o755);
    let agents = RootDir::open_as(&root, Some(AGENT)).unwrap();
    let mut found: Vec<String> = agents
        .find_named(OsStr::new(".git"), 10_000)
        .unwrap()
        .into_iter()
        .map(|(p, _)| p.display().to_string())
        .collect();
    found.sort();
    assert_eq!(found, ["open/.git", "search-only/.git"]);
    // A directory of the agent's own it closed to itself: it can open it again whenever it
    // likes, so a walk that cannot see inside refuses rather than miss a `.git`.
    std::fs::create_dir_all(root.join("mine/.git")).unwrap();
    agent_owns(&root.join("mine"));
    std::fs::set_permissions(root.join("mine"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let err = agents.find_named(OsStr::new(".git"), 10_000).unwrap_err();
    assert!(err.to_string().contains("closed to itself"), "{err}");
}

#[test]
fn walks_with_the_agents_rights_see_what_the_agent_sees() {
    if !as_root() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (root, _, _) = agents_tree(t.path());
    let hidden = root.join("private");
    std::fs::create_dir(&hidden).unwrap();
    std::fs::write(hidden.join("secret"), "s").unwrap();
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Root (this process) sees everything; the agent's rights cannot list `private`.
    let mine = RootDir::open(&root).unwrap();
    assert!(mine.list(Path::new("private")).is_ok());
    let agents = RootDir::open_as(&root, Some(AGENT)).unwrap();
    assert!(agents.list(Path::new("top")).is_err());
    let err = agents.list(Path::new("private")).unwrap_err();
    assert!(err.to_string().contains("Permission denied"), "{err}");
    assert!(
        agents
            .read_text(
                Path::new("private/secret"),
                ReadSpec {
                    line: None,
                    limit: None,
                    max_bytes: 10
                }
            )
            .is_err()
    );
    assert!(agents.list(Path::new("")).is_ok(), "its own root is listed");
}
