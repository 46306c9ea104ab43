//! Adversarial containment tests: first against [`MemFs`], then the same shapes with real
//! symlinks in a temporary directory, so the in-memory view is known to model the kernel.

use super::*;
use std::ffi::OsStr;

fn fs() -> MemFs {
    MemFs::new()
        .dir("/srv/root/src")
        .file("/srv/root/src/main.rs")
        .dir("/srv/root-evil")
        .file("/srv/root-evil/x")
        .dir("/etc")
        .file("/etc/passwd")
        // inside root pointing out
        .symlink("/srv/root/out", "/etc")
        // relative, pointing out via ..
        .symlink("/srv/root/up", "../root-evil")
        // inside root pointing inside
        .symlink("/srv/root/in", "src")
        // symlink to a symlink that points out
        .symlink("/srv/root/chain", "/srv/root/out")
        // dangling symlink outside
        .symlink("/srv/root/dangle", "/nonexistent/secret")
        // dangling symlink inside
        .symlink("/srv/root/dangle-in", "not-yet")
        // loops
        .symlink("/srv/root/loop-a", "loop-b")
        .symlink("/srv/root/loop-b", "loop-a")
        .symlink("/srv/root/self", "self")
        // child whose name starts with two dots
        .dir("/srv/root/..notes")
        // a root reached through a symlink, like /var -> /private/var on macOS
        .symlink("/var", "/private/var")
        .dir("/private/var/folders/t")
}

const ROOT: &str = "/srv/root";

fn inside(path: &str) -> Result<bool, ContainmentError> {
    is_inside(ROOT, path, &fs())
}

#[test]
fn table_against_memfs() {
    // (path, expected inside?)
    let cases: &[(&str, bool)] = &[
        ("src/main.rs", true),
        ("new-file.txt", true),
        ("src/new/deep/file", true),
        ("/srv/root/src/main.rs", true),
        ("/srv/root", true),
        (".", true),
        ("./src/../src/./main.rs", true),
        ("..notes/todo.md", true),
        ("..notes", true),
        ("in/main.rs", true),
        ("dangle-in", true),
        ("../root-evil/x", false),
        ("/srv/root-evil/x", false),
        ("/srv/root-evil", false),
        ("..", false),
        ("../../etc/passwd", false),
        ("/etc/passwd", false),
        ("/", false),
        ("out/passwd", false),
        ("out", false),
        ("up/x", false),
        ("chain/passwd", false),
        ("dangle", false),
        ("src/../../root-evil/x", false),
        // `..` after a symlink climbs from the TARGET: out -> /etc, so out/.. is /
        ("out/../srv/root/src", true),
        ("out/..", false),
        // into missing territory and back: the symlink after the climb is still followed
        ("missing/../out/passwd", false),
        ("missing/deeper/../../src", true),
        // a file used as a directory: nothing exists below, re-attached lexically
        ("src/main.rs/child", true),
    ];
    for (path, want) in cases {
        let got = inside(path);
        assert!(
            matches!(got, Ok(b) if b == *want),
            "{path}: expected inside={want}, got {got:?}"
        );
    }
}

#[test]
fn resolve_reports_the_real_location() -> Result<(), ContainmentError> {
    let f = fs();
    assert_eq!(
        resolve("out/passwd", ROOT, &f)?,
        PathBuf::from("/etc/passwd")
    );
    assert_eq!(
        resolve("up/x", ROOT, &f)?,
        PathBuf::from("/srv/root-evil/x")
    );
    assert_eq!(
        resolve("dangle/more", ROOT, &f)?,
        PathBuf::from("/nonexistent/secret/more")
    );
    assert_eq!(resolve("/../../..", ROOT, &f)?, PathBuf::from("/"));
    assert_eq!(
        resolve("/var/folders/t/x", "/", &f)?,
        PathBuf::from("/private/var/folders/t/x")
    );
    Ok(())
}

#[test]
fn a_root_behind_a_symlink_accepts_both_spellings() -> Result<(), ContainmentError> {
    let f = fs();
    assert!(is_inside("/var/folders/t", "/private/var/folders/t/a", &f)?);
    assert!(is_inside("/private/var/folders/t", "/var/folders/t/a", &f)?);
    assert!(!is_inside(
        "/var/folders/t",
        "/private/var/folders/other",
        &f
    )?);
    Ok(())
}

#[test]
fn loops_are_bounded_errors() {
    for p in ["loop-a", "loop-b/x", "self", "/srv/root/self/.."] {
        assert!(
            matches!(inside(p), Err(ContainmentError::SymlinkLoop(_))),
            "{p}: {:?}",
            inside(p)
        );
    }
}

#[test]
fn long_but_finite_chains_resolve() -> Result<(), ContainmentError> {
    // 40 links (the kernel's limit) is fine; 41 is a loop.
    let mut f = MemFs::new().dir("/r/end");
    for i in 0..41 {
        f = f.symlink(format!("/r/l{i}"), format!("l{}", i + 1));
    }
    f = f.symlink("/r/l41", "end");
    // l2 -> ... -> l41 -> end is 40 follows; l1 is 41.
    assert_eq!(resolve("/r/l2", "/", &f)?, PathBuf::from("/r/end"));
    assert!(matches!(
        resolve("/r/l1", "/", &f),
        Err(ContainmentError::SymlinkLoop(_))
    ));
    Ok(())
}

#[test]
fn empty_nul_and_relative_inputs_are_errors() {
    let f = fs();
    assert!(matches!(inside(""), Err(ContainmentError::EmptyPath)));
    let nul = OsStr::from_bytes(b"src/a\0b");
    assert!(matches!(
        is_inside(ROOT, nul, &f),
        Err(ContainmentError::NulByte)
    ));
    let nul_root = OsStr::from_bytes(b"/srv/root\0");
    assert!(matches!(
        is_inside(nul_root, "x", &f),
        Err(ContainmentError::NulByte)
    ));
    assert!(matches!(
        is_inside("srv/root", "x", &f),
        Err(ContainmentError::RelativeRoot(_))
    ));
    assert!(matches!(
        is_inside("", "x", &f),
        Err(ContainmentError::EmptyPath)
    ));
    assert!(matches!(
        resolve("x", "relative/base", &f),
        Err(ContainmentError::RelativeBase(_))
    ));
    // An absolute path needs no base.
    assert!(resolve("/etc", "relative/base", &f).is_ok());
}

#[test]
fn an_unreadable_entry_fails_closed() {
    struct Broken;
    impl FsView for Broken {
        fn entry_kind(&self, _: &Path) -> io::Result<EntryKind> {
            Err(io::Error::from(io::ErrorKind::PermissionDenied))
        }
        fn read_link(&self, _: &Path) -> io::Result<PathBuf> {
            Err(io::Error::from(io::ErrorKind::PermissionDenied))
        }
    }
    assert!(matches!(
        is_inside("/r", "x", &Broken),
        Err(ContainmentError::Io { .. })
    ));
}

// ---------------------------------------------------------------- the real filesystem

struct Tree {
    _dir: tempfile::TempDir,
    base: PathBuf,
}

fn real_tree() -> io::Result<Tree> {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir()?;
    // Resolve the tempdir once: /tmp itself may be a symlink on some hosts.
    let base = std::fs::canonicalize(dir.path())?;
    let root = base.join("root");
    std::fs::create_dir_all(root.join("src"))?;
    std::fs::write(root.join("src/main.rs"), "fn main() {}")?;
    std::fs::create_dir_all(base.join("root-evil"))?;
    std::fs::write(base.join("root-evil/x"), "x")?;
    std::fs::create_dir_all(base.join("outside"))?;
    std::fs::create_dir_all(root.join("..notes"))?;
    symlink(base.join("outside"), root.join("out"))?;
    symlink("../root-evil", root.join("up"))?;
    symlink("src", root.join("in"))?;
    symlink(root.join("out"), root.join("chain"))?;
    symlink(base.join("nowhere/secret"), root.join("dangle"))?;
    symlink("not-yet", root.join("dangle-in"))?;
    symlink("loop-b", root.join("loop-a"))?;
    symlink("loop-a", root.join("loop-b"))?;
    symlink(&root, base.join("root-link"))?;
    Ok(Tree { _dir: dir, base })
}

#[test]
fn table_against_real_symlinks() -> Result<(), Box<dyn std::error::Error>> {
    let t = real_tree()?;
    let root = t.base.join("root");
    let cases: &[(&str, bool)] = &[
        ("src/main.rs", true),
        ("new.txt", true),
        ("src/a/b/c", true),
        ("..notes/x", true),
        ("in/main.rs", true),
        ("dangle-in", true),
        ("out/../root/src", true),
        ("src/main.rs/child", true),
        ("..", false),
        ("../root-evil/x", false),
        ("out/file", false),
        ("up/x", false),
        ("chain/x", false),
        ("dangle", false),
        ("missing/../out/x", false),
        ("/etc/passwd", false),
    ];
    for (path, want) in cases {
        let got = is_inside(&root, path, &RealFs);
        assert!(
            matches!(got, Ok(b) if b == *want),
            "{path}: expected inside={want}, got {got:?}"
        );
    }
    // The sibling spelled as an absolute path.
    assert!(!is_inside(&root, t.base.join("root-evil/x"), &RealFs)?);
    // A root given through a symlink still contains its real children, and vice versa.
    assert!(is_inside(
        t.base.join("root-link"),
        root.join("src"),
        &RealFs
    )?);
    assert!(is_inside(&root, t.base.join("root-link/src/x"), &RealFs)?);
    // Loops are bounded.
    assert!(matches!(
        is_inside(&root, "loop-a", &RealFs),
        Err(ContainmentError::SymlinkLoop(_))
    ));
    Ok(())
}

#[test]
fn resolve_agrees_with_canonicalize_where_the_path_exists() -> Result<(), Box<dyn std::error::Error>>
{
    let t = real_tree()?;
    let root = t.base.join("root");
    for p in [
        "in/main.rs",
        "out",
        "up/x",
        "chain",
        "out/../root/src",
        "root-link/src",
    ] {
        let full = if p.starts_with("root-link") {
            t.base.join(p)
        } else {
            root.join(p)
        };
        assert_eq!(
            resolve(&full, "/", &RealFs)?,
            std::fs::canonicalize(&full)?,
            "{p}"
        );
    }
    Ok(())
}

#[test]
fn spelling_variants_do_not_change_the_answer() -> Result<(), ContainmentError> {
    let f = fs();
    for (p, want) in [
        ("//srv//root///src/", true),
        ("/srv/root/src/.", true),
        ("/srv/./root/../root/src", true),
        ("src//..//..//root-evil", false),
        ("/srv/root/../root-evil/", false),
    ] {
        assert_eq!(is_inside(ROOT, p, &f)?, want, "{p}");
    }
    // A root given with a trailing slash or dots is the same root.
    assert!(is_inside("/srv/root/", "src", &f)?);
    assert!(is_inside("/srv/./root", "src", &f)?);
    assert!(!is_inside("/srv/root/.", "../root-evil", &f)?);
    // `/` contains everything, and `..` cannot climb above it.
    assert!(is_inside("/", "/etc/passwd", &f)?);
    assert_eq!(resolve("../../..", "/", &f)?, PathBuf::from("/"));
    Ok(())
}

#[test]
fn a_symlinked_component_of_the_root_itself_is_resolved_once() -> Result<(), ContainmentError> {
    // /ws -> /srv/root: the root may be named through the link, paths through either spelling.
    let f = fs().symlink("/ws", "/srv/root");
    assert!(is_inside("/ws", "/srv/root/src/main.rs", &f)?);
    assert!(is_inside("/srv/root", "/ws/src", &f)?);
    assert!(!is_inside("/ws", "/ws/../root-evil", &f)?);
    // `/ws/..` is the parent of the TARGET (/srv), so /ws/../root is the root again.
    assert!(is_inside("/srv/root", "/ws/../root/src", &f)?);
    Ok(())
}
