//! The `openat2` primitive against a real filesystem, played as the agent inside the root would
//! play it: `..`, absolute paths, symlinks planted as the last component, in the middle, to
//! `/proc/self/root`, names that only look like parents, FIFOs, huge sparse files, hard links, and
//! a component flipped between a directory and a symlink while writes and reads go on.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use warden_containment::beneath::{BeneathError, Owner, ReadSpec, RootDir};

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), "host secret\n").unwrap();
    Fixture {
        _tmp: tmp,
        root,
        outside,
    }
}

const ALL: ReadSpec = ReadSpec {
    line: None,
    limit: None,
    max_bytes: 1 << 20,
};

fn outside_is_untouched(f: &Fixture) {
    let names: Vec<_> = std::fs::read_dir(&f.outside)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("secret")],
        "written outside the root"
    );
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret")).unwrap(),
        "host secret\n"
    );
}

#[test]
fn writes_and_reads_inside_the_root_work_and_create_parents() {
    let f = fixture();
    let r = RootDir::open(&f.root).unwrap();
    r.write_text(&f.root.join("a.txt"), b"one\n", None).unwrap();
    r.write_text(Path::new("deep/er/b.txt"), b"two\n", None)
        .unwrap();
    r.write_text(&f.root.join("..notes"), b"dots\n", None)
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(f.root.join("deep/er/b.txt")).unwrap(),
        "two\n"
    );
    assert_eq!(r.read_text(&f.root.join("a.txt"), ALL).unwrap(), "one\n");
    // A name that only looks like a parent is an ordinary file inside.
    assert_eq!(r.read_text(&f.root.join("..notes"), ALL).unwrap(), "dots\n");
    // Overwrite truncates.
    r.write_text(&f.root.join("a.txt"), b"x", None).unwrap();
    assert_eq!(std::fs::read_to_string(f.root.join("a.txt")).unwrap(), "x");
    // `..` that stays inside is fine; a symlink that stays inside is followed for reads.
    assert_eq!(r.read_text(Path::new("deep/../a.txt"), ALL).unwrap(), "x");
    symlink("a.txt", f.root.join("alias")).unwrap();
    assert_eq!(r.read_text(Path::new("alias"), ALL).unwrap(), "x");
}

#[test]
fn every_way_out_is_refused_and_nothing_lands_outside() {
    let f = fixture();
    let r = RootDir::open(&f.root).unwrap();
    symlink(&f.outside, f.root.join("mid")).unwrap();
    symlink(f.outside.join("secret"), f.root.join("last")).unwrap();
    symlink("../outside/secret", f.root.join("rel-last")).unwrap();
    symlink("/proc/self/root", f.root.join("proc-root")).unwrap();
    symlink(f.outside.join("new-file"), f.root.join("dangling")).unwrap();
    let cases: Vec<PathBuf> = vec![
        f.outside.join("abs.txt"),
        f.root.join("../outside/dotdot.txt"),
        PathBuf::from("../outside/rel.txt"),
        f.root.join("mid/through-middle.txt"),
        f.root.join("last"),
        f.root.join("rel-last"),
        f.root.join("dangling"),
        f.root
            .join(format!("proc-root{}", f.outside.join("p.txt").display())),
        PathBuf::from("/etc/passwd"),
    ];
    for p in &cases {
        let w = r.write_text(p, b"pwned", None);
        assert!(w.is_err(), "write to {} was served", p.display());
        let rd = r.read_text(p, ALL);
        assert!(
            !rd.as_deref()
                .is_ok_and(|t| t.contains("host secret") || t.contains("root:")),
            "read of {} came back: {rd:?}",
            p.display()
        );
    }
    // The last component of a write is never followed, even when it points inside.
    std::fs::write(f.root.join("target.txt"), "keep").unwrap();
    symlink("target.txt", f.root.join("inner-link")).unwrap();
    let e = r
        .write_text(Path::new("inner-link"), b"via link", None)
        .unwrap_err();
    assert!(matches!(e, BeneathError::Symlink(_)), "{e:?}");
    assert_eq!(
        std::fs::read_to_string(f.root.join("target.txt")).unwrap(),
        "keep"
    );
    outside_is_untouched(&f);
}

#[test]
fn directories_fifos_and_hard_links_are_refused_without_blocking() {
    let f = fixture();
    let r = RootDir::open(&f.root).unwrap();
    std::fs::create_dir(f.root.join("dir")).unwrap();
    assert!(matches!(
        r.read_text(Path::new("dir"), ALL),
        Err(BeneathError::NotRegular(_))
    ));
    assert!(r.write_text(Path::new("dir"), b"x", None).is_err());
    assert!(matches!(
        r.write_text(Path::new("dir/.."), b"x", None),
        Err(BeneathError::NoFileName(_))
    ));
    nix::unistd::mkfifo(
        &f.root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    // Neither open blocks (no writer, no reader on the other end).
    assert!(matches!(
        r.read_text(Path::new("fifo"), ALL),
        Err(BeneathError::NotRegular(_))
    ));
    assert!(matches!(
        r.write_text(Path::new("fifo"), b"x", None),
        Err(BeneathError::NotRegular(_))
    ));
    std::fs::write(f.root.join("linked"), "shared").unwrap();
    std::fs::hard_link(f.root.join("linked"), f.root.join("twin")).unwrap();
    assert!(matches!(
        r.write_text(Path::new("twin"), b"x", None),
        Err(BeneathError::HardLinked(_))
    ));
    assert_eq!(
        std::fs::read_to_string(f.root.join("linked")).unwrap(),
        "shared"
    );
}

#[test]
fn reads_are_bounded_and_select_lines_without_loading_the_file() {
    let f = fixture();
    let r = RootDir::open(&f.root).unwrap();
    // 2 GiB sparse: refused by size, and a line selection stops after one bound's read.
    let big = std::fs::File::create(f.root.join("sparse")).unwrap();
    big.set_len(2 << 30).unwrap();
    let spec = ReadSpec {
        line: None,
        limit: None,
        max_bytes: 64 * 1024,
    };
    let e = r.read_text(Path::new("sparse"), spec).unwrap_err();
    assert!(
        e.to_string().contains("65536"),
        "the refusal names the limit: {e}"
    );
    let e = r
        .read_text(
            Path::new("sparse"),
            ReadSpec {
                line: Some(2),
                limit: Some(1),
                ..spec
            },
        )
        .unwrap_err();
    assert!(matches!(e, BeneathError::TooLarge { .. }), "{e:?}");

    let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    std::fs::write(f.root.join("lines"), &text).unwrap();
    let sel = |line, limit| {
        r.read_text(
            Path::new("lines"),
            ReadSpec {
                line,
                limit,
                max_bytes: 1024,
            },
        )
        .unwrap()
    };
    assert_eq!(sel(Some(3), Some(2)), "line 3\nline 4\n");
    assert_eq!(sel(None, Some(1)), "line 1\n");
    assert_eq!(sel(Some(10), None), "line 10\n");
    assert_eq!(sel(Some(11), None), "");
    assert_eq!(sel(Some(9), Some(100)), "line 9\nline 10\n");
    // Selected output over the bound is refused, not cut.
    let e = r
        .read_text(
            Path::new("lines"),
            ReadSpec {
                line: Some(1),
                limit: None,
                max_bytes: 20,
            },
        )
        .unwrap_err();
    assert!(matches!(e, BeneathError::TooLarge { .. }));
    std::fs::write(f.root.join("bin"), [0xff, 0xfe, 0x00]).unwrap();
    assert!(matches!(
        r.read_text(Path::new("bin"), ALL),
        Err(BeneathError::NotText(_))
    ));
}

#[test]
fn created_files_and_directories_get_the_owner_when_root() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let f = fixture();
    let r = RootDir::open(&f.root).unwrap();
    let o = Owner {
        uid: 64_123,
        gid: 64_124,
    };
    r.write_text(Path::new("made/here.txt"), b"x", Some(o))
        .unwrap();
    for p in ["made", "made/here.txt"] {
        let m = std::fs::metadata(f.root.join(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (o.uid, o.gid), "{p}");
    }
    // An existing file keeps its owner.
    std::fs::write(f.root.join("mine"), "x").unwrap();
    r.write_text(Path::new("mine"), b"y", Some(o)).unwrap();
    assert_eq!(std::fs::metadata(f.root.join("mine")).unwrap().uid(), 0);
}

/// The finding of the containment issue as a test: a component flipped between a directory and a
/// symlink to a host directory while writes and reads go through it. Not one byte may land
/// outside or come back from outside.
#[test]
fn a_component_flipped_to_a_symlink_never_leads_outside() {
    let f = fixture();
    let r = RootDir::open(&f.root).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flips = Arc::new(AtomicU64::new(0));
    let flipper = {
        let (root, outside, stop, flips) = (
            f.root.clone(),
            f.outside.clone(),
            stop.clone(),
            flips.clone(),
        );
        std::thread::spawn(move || {
            // Two ways to flip: rm/mkdir/ln as the shell loop did, and an atomic
            // exchange of a real directory with a symlink to the host (far more flips per second).
            let l = root.join("l");
            let other = root.join("other");
            let _ = std::fs::create_dir(&l);
            let _ = std::fs::write(l.join("secret"), "inside\n");
            let _ = symlink(&outside, &other);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                if n.is_multiple_of(64) {
                    let _ = std::fs::remove_file(&other);
                    let _ = std::fs::remove_dir_all(&other);
                    let _ = std::fs::remove_file(&l);
                    let _ = std::fs::remove_dir_all(&l);
                    let _ = std::fs::create_dir(&l);
                    let _ = std::fs::write(l.join("secret"), "inside\n");
                    let _ = symlink(&outside, &other);
                } else {
                    let _ = rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        &l,
                        rustix::fs::CWD,
                        &other,
                        rustix::fs::RenameFlags::EXCHANGE,
                    );
                }
                flips.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let (mut written, mut read) = (0, 0);
    // At least 2,000 writes and reads, and on until the flipper has flipped 500 times (bounded).
    let mut i = 0;
    while (i < 2000 || flips.load(Ordering::Relaxed) < 20_000) && i < 200_000 {
        i += 1;
        if r.write_text(&f.root.join(format!("l/p{}", i % 8)), b"pwned", None)
            .is_ok()
        {
            written += 1;
        }
        if let Ok(t) = r.read_text(&f.root.join("l/secret"), ALL) {
            assert_ne!(t, "host secret\n", "a read came back from outside");
            read += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    let flips = flips.load(Ordering::Relaxed);
    assert!(flips > 100, "the flipper barely ran ({flips} flips)");
    for name in ["l", "other"] {
        let _ = std::fs::remove_file(f.root.join(name));
        let _ = std::fs::remove_dir_all(f.root.join(name));
    }
    outside_is_untouched(&f);
    eprintln!("{i} attempts, {flips} flips; {written} writes and {read} reads served inside");
}

#[test]
fn a_snapshot_sees_what_changed_and_never_follows_a_link_out() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "s").unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("src/deep")).unwrap();
    std::fs::create_dir_all(root.join(".git/objects")).unwrap();
    std::fs::write(root.join("src/a.rs"), "a").unwrap();
    std::fs::write(root.join("keep.txt"), "k").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
    let r = warden_containment::beneath::RootDir::open(&root).unwrap();
    let before = r.snapshot(1000).unwrap();
    assert_eq!(before.len(), 5, "{before:?}"); // src, src/deep, src/a.rs, keep.txt, out (.git skipped)
    std::fs::write(root.join("src/a.rs"), "changed").unwrap();
    std::fs::write(root.join("src/deep/new.rs"), "n").unwrap();
    std::fs::remove_file(root.join("keep.txt")).unwrap();
    std::fs::write(root.join(".git/objects/x"), "x").unwrap();
    std::fs::write(outside.path().join("secret"), "changed outside").unwrap();
    let after = r.snapshot(1000).unwrap();
    let changed: Vec<String> = before
        .changed(&after)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(changed, vec!["keep.txt", "src/a.rs", "src/deep/new.rs"]);
    // Over the bound there is no picture at all (never a partial one).
    assert!(r.snapshot(3).is_none());
}

/// A root walked with `no_symlinks` (the fs servant's: it is handed the location the policy
/// judged, already resolved) refuses a link anywhere in the path, one that stays inside the root
/// included: the issue's `d -> .claude` flip lands nothing in `.claude`, however the race falls.
#[test]
fn without_symlinks_a_link_inside_the_root_is_refused_anywhere_in_the_path() {
    let f = fixture();
    let r = RootDir::open(&f.root).unwrap().no_symlinks();
    std::fs::create_dir(f.root.join(".claude")).unwrap();
    std::fs::write(f.root.join(".claude/settings.json"), "{}").unwrap();
    symlink(".claude", f.root.join("d")).unwrap();
    let e = r
        .write_text(&f.root.join("d/settings.local.json"), b"{\"x\":1}", None)
        .unwrap_err();
    assert!(matches!(e, BeneathError::Symlink(_)), "{e:?}");
    assert!(!f.root.join(".claude/settings.local.json").exists());
    let e = r
        .read_text(&f.root.join("d/settings.json"), ALL)
        .unwrap_err();
    assert!(matches!(e, BeneathError::Symlink(_)), "{e:?}");
    // A missing parent under a link is not created through it either.
    let e = r
        .write_text(&f.root.join("d/new/x.json"), b"x", None)
        .unwrap_err();
    assert!(matches!(e, BeneathError::Symlink(_)), "{e:?}");
    assert!(!f.root.join(".claude/new").exists());
    // The same names without the link are served.
    std::fs::remove_file(f.root.join("d")).unwrap();
    std::fs::create_dir(f.root.join("d")).unwrap();
    r.write_text(&f.root.join("d/settings.local.json"), b"ok", None)
        .unwrap();
    assert_eq!(
        r.read_text(&f.root.join("d/settings.local.json"), ALL)
            .unwrap(),
        "ok"
    );
    // The default walk still follows a link that stays inside (reads of a symlinked file).
    symlink("d/settings.local.json", f.root.join("alias")).unwrap();
    let plain = RootDir::open(&f.root).unwrap();
    assert_eq!(plain.read_text(&f.root.join("alias"), ALL).unwrap(), "ok");
    assert!(r.read_text(&f.root.join("alias"), ALL).is_err());
}
