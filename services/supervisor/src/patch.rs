//! A conversation's change to its root as one unified diff in git's format (so `git apply`
//! takes it): the root's content when the conversation's first turn began (the [`Baseline`])
//! against its content now, through `RootDir::content` (the agent's rights, links never
//! followed). Pure apart from those reads; never runs git or anything the agent can configure.
//!
//! Bounds: a file larger than [`FILE_MAX_BYTES`] is named, never diffed; the baseline keeps at
//! most [`BASELINE_MAX_BYTES`] of content (a file past it is named as changed, its text not
//! shown); the patch text is at most [`DIFF_MAX_BYTES`] (past it the patch is cut at a file's
//! boundary, `cut` is set and every changed file is still named).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use similar::TextDiff;
use warden_containment::beneath::{Content, RootDir, Snapshot};

/// A file larger than this is named in the patch, never read into it.
pub const FILE_MAX_BYTES: u64 = 1 << 20;
/// Content the baseline keeps at most (per conversation, in memory).
pub const BASELINE_MAX_BYTES: usize = 32 << 20;
/// The patch text at most; past it the patch is cut and says so.
pub const DIFF_MAX_BYTES: usize = 512 * 1024;
/// Files named in a patch at most.
pub const DIFF_MAX_FILES: usize = 1024;

/// The root as the conversation found it: its snapshot, and the content of each entry
/// (`None` where the budget ran out: such a file is named when it changes, its text not shown).
#[derive(Debug, Default)]
pub struct Baseline {
    snap: Snapshot,
    contents: BTreeMap<PathBuf, Option<Content>>,
}

impl Baseline {
    /// Reads every entry of `snap` (taken of `root` just before) within the budget.
    pub fn take(root: &RootDir, snap: Snapshot) -> Self {
        let mut budget = BASELINE_MAX_BYTES;
        let mut contents = BTreeMap::new();
        for p in snap.paths() {
            let c = if budget == 0 {
                None
            } else {
                let c = root.content(p, FILE_MAX_BYTES);
                if let Content::File { bytes, .. } = &c {
                    if bytes.len() > budget {
                        budget = 0;
                        contents.insert(p.to_path_buf(), None);
                        continue;
                    }
                    budget -= bytes.len();
                }
                Some(c)
            };
            contents.insert(p.to_path_buf(), c);
        }
        Baseline { snap, contents }
    }

    /// The patch from the baseline to the root as `now` shows it (`None`: nothing changed).
    pub fn patch(&self, root: &RootDir, now: &Snapshot) -> Option<Patch> {
        let changed = self.snap.changed(now);
        if changed.is_empty() {
            return None;
        }
        let mut files = Vec::new();
        for p in changed {
            let before = match self.contents.get(&p) {
                Some(Some(c)) => c.clone(),
                Some(None) => Content::Unreadable,
                None => Content::Absent,
            };
            let after = root.content(&p, FILE_MAX_BYTES);
            files.push((p, before, after));
        }
        let patch = render(&files, DIFF_MAX_BYTES);
        (!patch.files.is_empty()).then_some(patch)
    }
}

/// One conversation's change so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Patch {
    /// The unified diff (git's format), at most the cap it was rendered with.
    pub text: String,
    /// Every file the patch is about (relative to the root), sorted; also those cut from `text`.
    pub files: Vec<String>,
    /// True when `text` stops before the end (the cap), or more files changed than are named.
    pub cut: bool,
}

enum Side<'a> {
    Absent,
    Text(&'a str, u32),
    Binary(u32),
    /// Named only: too large, unreadable, a FIFO or device, or its earlier content not kept.
    Opaque(&'static str),
}

fn side(c: &Content) -> Side<'_> {
    match c {
        Content::Absent | Content::Dir => Side::Absent,
        Content::File { bytes, executable } => {
            let mode = if *executable { 0o100755 } else { 0o100644 };
            match std::str::from_utf8(bytes) {
                Ok(t) if !bytes.contains(&0) => Side::Text(t, mode),
                _ => Side::Binary(mode),
            }
        }
        Content::Symlink(t) => match t.to_str() {
            Some(t) => Side::Text(t, 0o120000),
            None => Side::Binary(0o120000),
        },
        Content::TooLarge { .. } => Side::Opaque("larger than the diff's per-file cap"),
        Content::Other => Side::Opaque("not a regular file"),
        Content::Unreadable => Side::Opaque("not readable, or its earlier content not kept"),
    }
}

/// Renders `files` (path, before, after) as one patch of at most `max_bytes`.
pub fn render(files: &[(PathBuf, Content, Content)], max_bytes: usize) -> Patch {
    let mut out = Patch::default();
    let mut notes = String::new();
    let mut body = String::new();
    for (path, before, after) in files {
        let (b, a) = (side(before), side(after));
        if matches!((&b, &a), (Side::Absent, Side::Absent)) {
            continue;
        }
        if matches!((&b, &a), (Side::Text(x, m), Side::Text(y, n)) if x == y && m == n) {
            continue;
        }
        if out.files.len() >= DIFF_MAX_FILES {
            out.cut = true;
            break;
        }
        let name = path.to_string_lossy().into_owned();
        out.files.push(name.clone());
        if is_git_internal(path) {
            // A nested repository's own files (config, hooks) are never part of a change
            // anyone applies: git refuses such paths, and they could configure git.
            let _ = writeln!(
                notes,
                "# {}: changed, not shown (a repository's own files, `.git`)",
                quoted(&name)
            );
            continue;
        }
        if let (Side::Opaque(why), _) | (_, Side::Opaque(why)) = (&b, &a) {
            let _ = writeln!(notes, "# {}: changed, not shown ({why})", quoted(&name));
            continue;
        }
        let one = file_diff(path, &b, &a);
        if body.len() + one.len() > max_bytes {
            out.cut = true;
            let _ = writeln!(
                notes,
                "# {}: changed, not shown (the diff reached its cap of {max_bytes} bytes)",
                quoted(&name)
            );
            continue;
        }
        body.push_str(&one);
    }
    if !notes.is_empty() {
        // git apply skips text before the first `diff --git`, as it skips a commit message.
        out.text = format!("# warden: files the diff below does not show\n{notes}");
    }
    out.text.push_str(&body);
    out.files.sort();
    out
}

/// A path with a `.git` component (any case, as git compares it on case-insensitive hosts).
fn is_git_internal(p: &Path) -> bool {
    p.components().any(|c| {
        c.as_os_str()
            .as_encoded_bytes()
            .eq_ignore_ascii_case(b".git")
    })
}

/// A path as git writes it in a header: C-quoted when it holds a quote, backslash, control
/// character or non-ASCII byte.
fn quoted(p: &str) -> String {
    if !p
        .bytes()
        .any(|b| b == b'"' || b == b'\\' || !(0x20..0x7f).contains(&b))
    {
        return p.to_string();
    }
    let mut s = String::from("\"");
    for b in p.bytes() {
        match b {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\n' => s.push_str("\\n"),
            b'\t' => s.push_str("\\t"),
            0x20..=0x7e => s.push(b as char),
            _ => {
                let _ = write!(s, "\\{b:03o}");
            }
        }
    }
    s.push('"');
    s
}

fn file_diff(path: &Path, b: &Side<'_>, a: &Side<'_>) -> String {
    let p = path.to_string_lossy();
    let (old, new) = (quoted(&format!("a/{p}")), quoted(&format!("b/{p}")));
    let mut s = format!("diff --git {old} {new}\n");
    let mode = |x: &Side<'_>| match x {
        Side::Text(_, m) | Side::Binary(m) => Some(*m),
        _ => None,
    };
    let (from, to) = match (mode(b), mode(a)) {
        (None, Some(m)) => {
            let _ = writeln!(s, "new file mode {m:o}");
            ("/dev/null".to_string(), new.clone())
        }
        (Some(m), None) => {
            let _ = writeln!(s, "deleted file mode {m:o}");
            (old.clone(), "/dev/null".to_string())
        }
        (Some(m), Some(n)) if m != n => {
            let _ = writeln!(s, "old mode {m:o}\nnew mode {n:o}");
            (old.clone(), new.clone())
        }
        _ => (old.clone(), new.clone()),
    };
    // git's blob ids of both sides (zeros for an absent one), so `git apply --3way` finds the
    // pre-image in the person's repository and merges where their files moved on.
    fn text<'s>(x: &Side<'s>) -> Option<Option<&'s str>> {
        match x {
            Side::Text(t, _) => Some(Some(*t)),
            Side::Absent => Some(None),
            _ => None,
        }
    }
    if let (Some(bt), Some(at)) = (text(b), text(a))
        && bt != at
    {
        let unchanged_mode = match (mode(b), mode(a)) {
            (Some(m), Some(n)) if m == n => format!(" {m:o}"),
            _ => String::new(),
        };
        let _ = writeln!(s, "index {}..{}{unchanged_mode}", blob_id(bt), blob_id(at));
    }
    match (b, a) {
        (Side::Binary(_), _) | (_, Side::Binary(_)) => {
            let _ = writeln!(s, "Binary files {from} and {to} differ");
        }
        _ => {
            let bt = if let Side::Text(t, _) = b { *t } else { "" };
            let at = if let Side::Text(t, _) = a { *t } else { "" };
            if bt != at {
                let d = TextDiff::configure()
                    .timeout(std::time::Duration::from_secs(2))
                    .diff_lines(bt, at);
                let _ = write!(
                    s,
                    "{}",
                    d.unified_diff().context_radius(3).header(&from, &to)
                );
            }
        }
    }
    s
}

/// git's id of a blob with `content` (`None`: no blob, all zeros).
fn blob_id(content: Option<&str>) -> String {
    use sha1::Digest;
    let Some(c) = content else {
        return "0".repeat(40);
    };
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", c.len()).as_bytes());
    h.update(c.as_bytes());
    h.finalize()
        .iter()
        .fold(String::with_capacity(40), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .args(["-c", "core.hooksPath=/dev/null"])
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The patch of a root, applied by `git apply` to a copy of the baseline, gives the root;
    /// and it is what `git diff` says.
    #[test]
    fn a_patch_applies_and_equals_git_diff() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir(r.join("src")).unwrap();
        std::fs::write(r.join("src/a.txt"), "one\ntwo\nthree\n").unwrap();
        std::fs::write(r.join("gone.txt"), "bye\n").unwrap();
        std::fs::write(r.join("nonl.txt"), "no newline").unwrap();
        let dir = RootDir::open(r).unwrap();
        let base = Baseline::take(&dir, dir.snapshot(1000).unwrap());
        git(r, &["init", "-q"]);
        git(r, &["add", "-A"]);
        git(
            r,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-qm",
                "base",
            ],
        );
        std::fs::write(r.join("src/a.txt"), "one\n2\nthree\nfour\n").unwrap();
        std::fs::remove_file(r.join("gone.txt")).unwrap();
        std::fs::write(r.join("nonl.txt"), "no newline, changed").unwrap();
        std::fs::write(r.join("new.txt"), "fresh\n").unwrap();
        std::fs::write(r.join("zbin.dat"), b"\0\x01\x02").unwrap();
        let p = base.patch(&dir, &dir.snapshot(1000).unwrap()).unwrap();
        assert_eq!(
            p.files,
            vec!["gone.txt", "new.txt", "nonl.txt", "src/a.txt", "zbin.dat"]
        );
        assert!(!p.cut);
        git(r, &["add", "-N", "."]);
        let theirs = git(r, &["diff", "--no-color", "--no-ext-diff", "HEAD"]);
        let strip = |s: &str| {
            s.lines()
                .filter(|l| !l.starts_with("index "))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(strip(&p.text), strip(&theirs));
        // With git's own blob ids (its text files): `git apply --3way` finds the pre-image.
        let full = git(
            r,
            &[
                "diff",
                "--no-color",
                "--no-ext-diff",
                "--full-index",
                "HEAD",
            ],
        );
        let text_part = |s: &str| s.split("diff --git a/zbin.dat").next().unwrap().to_string();
        assert_eq!(text_part(&p.text), text_part(&full));
        // Applied to the baseline, the text part gives what the root holds.
        git(r, &["reset", "-q", "--hard"]);
        git(r, &["clean", "-qfd"]);
        let without_binary: String = p
            .text
            .split("diff --git a/zbin.dat")
            .next()
            .unwrap()
            .to_string();
        let pf = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(pf.path(), &without_binary).unwrap();
        git(r, &["apply", pf.path().to_str().unwrap()]);
        assert_eq!(
            std::fs::read_to_string(r.join("src/a.txt")).unwrap(),
            "one\n2\nthree\nfour\n"
        );
        assert_eq!(
            std::fs::read_to_string(r.join("nonl.txt")).unwrap(),
            "no newline, changed"
        );
        assert!(!r.join("gone.txt").exists());
    }

    #[test]
    fn a_link_is_shown_as_a_link_and_a_large_file_is_named() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let dir = RootDir::open(r).unwrap();
        let base = Baseline::take(&dir, dir.snapshot(1000).unwrap());
        std::os::unix::fs::symlink("/etc/shadow", r.join("evil")).unwrap();
        std::fs::write(r.join("big"), vec![b'x'; FILE_MAX_BYTES as usize + 1]).unwrap();
        let p = base.patch(&dir, &dir.snapshot(1000).unwrap()).unwrap();
        assert_eq!(p.files, vec!["big", "evil"]);
        assert!(
            p.text.contains("# big: changed, not shown (larger than"),
            "{}",
            p.text
        );
        assert!(p.text.contains("new file mode 120000\n"), "{}", p.text);
        assert!(
            p.text
                .contains("+/etc/shadow\n\\ No newline at end of file"),
            "{}",
            p.text
        );
        assert!(
            !p.text.contains("root:"),
            "the link was followed: {}",
            p.text
        );
    }

    #[test]
    fn a_nested_repositorys_own_files_are_named_never_shown() {
        let files = vec![
            (
                PathBuf::from("sub/.git/config"),
                Content::Absent,
                Content::File {
                    bytes: b"[core]\n\tfsmonitor = touch /tmp/pwned\n".to_vec(),
                    executable: false,
                },
            ),
            (
                PathBuf::from("x/.GIT/hooks/post-merge"),
                Content::Absent,
                Content::File {
                    bytes: b"#!/bin/sh\n".to_vec(),
                    executable: true,
                },
            ),
        ];
        let p = render(&files, 10_000);
        assert_eq!(p.files, vec!["sub/.git/config", "x/.GIT/hooks/post-merge"]);
        assert!(!p.text.contains("diff --git"), "{}", p.text);
        assert!(!p.text.contains("fsmonitor"), "{}", p.text);
    }

    #[test]
    fn past_the_cap_the_patch_is_cut_and_names_every_file() {
        let files: Vec<(PathBuf, Content, Content)> = (0..10)
            .map(|i| {
                (
                    PathBuf::from(format!("f{i}")),
                    Content::Absent,
                    Content::File {
                        bytes: vec![b'a'; 100].into_iter().chain([b'\n']).collect(),
                        executable: false,
                    },
                )
            })
            .collect();
        let p = render(&files, 500);
        assert!(p.cut);
        assert_eq!(p.files.len(), 10);
        assert!(p.text.len() < 1000, "{}", p.text.len());
        assert!(
            p.text
                .contains("# f9: changed, not shown (the diff reached its cap of 500 bytes)")
        );
    }
}
