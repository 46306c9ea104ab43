//! Agent-control files: the agent's own configuration and hooks, which no tool call may change
//! (floor rule `floor.change.agent-control`). An agent that may edit them can grant itself
//! permissions (`.claude/settings.local.json` `permissions.allow`), install hooks that run
//! commands nobody decided (`PreToolUse`, `.git/hooks/*`), or add MCP servers (`.mcp.json`).
//!
//! Owns: deciding whether an already resolved path names such a file — by whole path
//! components, never by substring (`.claude-notes`, `..claude` and `x.mcp.json` are ordinary),
//! and without regard to case (`.Claude`, `.GIT/hooks`: on a case-insensitive filesystem they
//! are the same files, and nothing legitimate needs the other spelling).
//!
//! git, by allowlist: inside any `.git` (at any depth, and inside its `modules/*` and
//! `worktrees/*` git directories) only what a commit needs is ordinary — `objects`, `refs`,
//! `logs`, `index`, `HEAD`, `packed-refs`, `COMMIT_EDITMSG`, the `*_HEAD` files and their
//! `.lock` files. Everything else there (`config`, `hooks`, `info`, `commondir`, `gitdir`,
//! `config.worktree`, a name git may read tomorrow) is a control file: git reads configuration
//! and hooks from more places than any list of names can follow (issue 24).
//!
//! Must never: do I/O (paths arrive resolved), or let an operator entry loosen the built-in list.

use std::ffi::OsStr;
use std::path::{Component, Path};

/// Directory names whose contents (and themselves) configure an agent, wherever they sit.
const CONTROL_DIRS: &[&str] = &[".claude", ".codex", ".gemini", ".qwen", ".opencode"];

/// What a commit writes inside a git directory (the first component below it).
const GIT_COMMIT_DIRS: &[&str] = &["objects", "refs", "logs"];
const GIT_COMMIT_FILES: &[&str] = &["index", "HEAD", "packed-refs", "COMMIT_EDITMSG"];
/// Directories of further git directories (`modules/<name>/`, `worktrees/<name>/`).
const GIT_NESTED: &[&str] = &["modules", "worktrees"];

fn is(c: &OsStr, name: &str) -> bool {
    c.as_encoded_bytes().eq_ignore_ascii_case(name.as_bytes())
}

/// Whether `name` (directly in a git directory) is a file a commit writes, or its lock file.
fn commit_file(name: &OsStr) -> bool {
    let Some(n) = name.to_str() else {
        return false;
    };
    let n = n.strip_suffix(".lock").unwrap_or(n);
    GIT_COMMIT_FILES.contains(&n) || (n.len() > "_HEAD".len() && n.ends_with("_HEAD"))
}

/// What, below a git directory, `rest` (the components after it) names, if it is not what a
/// commit needs.
fn git_control(rest: &[&OsStr]) -> Option<String> {
    let mut rest = rest;
    loop {
        let first = rest.first()?;
        if rest.len() == 1 && commit_file(first) {
            return None;
        }
        if GIT_COMMIT_DIRS.iter().any(|d| *first == OsStr::new(d)) {
            return None;
        }
        if GIT_NESTED.iter().any(|d| *first == OsStr::new(d)) {
            match rest.len() {
                // `modules` itself, or one submodule's directory: replacing either swaps in
                // another git directory.
                1 | 2 => {
                    return Some(format!(
                        "the git directory {}",
                        rest.iter()
                            .map(|c| c.to_string_lossy())
                            .collect::<Vec<_>>()
                            .join("/")
                    ));
                }
                _ => {
                    rest = &rest[2..];
                    continue;
                }
            }
        }
        return Some(format!(
            "the git control entry {} (only objects, refs, logs, index, HEAD and the files a commit writes may change)",
            first.to_string_lossy()
        ));
    }
}

/// The built-in names and the operator's extra patterns (`[floor] agent_control_paths`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControlPaths {
    /// Root-relative glob patterns, split into components; validated by the config.
    extra: Vec<(String, Vec<String>)>,
}

impl ControlPaths {
    /// `patterns` are root-relative globs (`*` and `?` within one component, `**` for any number
    /// of components); each names a file or directory, and a directory's contents with it.
    pub fn new(patterns: &[String]) -> Self {
        Self {
            extra: patterns
                .iter()
                .map(|p| {
                    let comps = p
                        .split('/')
                        .filter(|c| !c.is_empty() && *c != ".")
                        .map(str::to_string)
                        .collect();
                    (p.clone(), comps)
                })
                .collect(),
        }
    }

    /// What `path` is, if it is an agent-control file. `path` is absolute and resolved; `root`
    /// is the resolved root. Inside the root the names are matched below the root (a root that
    /// itself sits under a directory named `.codex` does not make every file a control file);
    /// outside it, along the whole path (`~/.claude/settings.json`).
    pub fn matched(&self, root: &Path, path: &Path) -> Option<String> {
        let inside = path.strip_prefix(root).ok();
        let comps: Vec<&OsStr> = inside
            .unwrap_or(path)
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n),
                _ => None,
            })
            .collect();
        if let Some(d) = comps
            .iter()
            .find_map(|c| CONTROL_DIRS.iter().find(|d| is(c, d)))
        {
            return Some(format!("the agent configuration directory {d}"));
        }
        if comps.last().is_some_and(|c| is(c, ".mcp.json")) {
            return Some("the MCP server configuration .mcp.json".into());
        }
        // OpenCode's project configuration (permissions, MCP servers, plugins it runs).
        if let Some(c) = comps
            .last()
            .filter(|c| is(c, "opencode.json") || is(c, "opencode.jsonc"))
        {
            return Some(format!(
                "the OpenCode configuration {}",
                c.to_string_lossy()
            ));
        }
        // `.git` itself too: replacing it (or a worktree's `.git` file) swaps in other hooks.
        if comps.last().is_some_and(|c| is(c, ".git")) {
            return Some("the git directory .git itself".into());
        }
        // Below every `.git` on the path (a nested repository's inside another's objects is
        // still judged by the outer one first).
        for (i, c) in comps.iter().enumerate() {
            if is(c, ".git")
                && let Some(what) = git_control(&comps[i + 1..])
            {
                return Some(what);
            }
        }
        if inside.is_some() {
            // Patterns are UTF-8 text; a non-UTF-8 name stands in as "", which only a bare `*`
            // matches — a denial more, never one less.
            let rel: Vec<&str> = comps.iter().map(|c| c.to_str().unwrap_or("")).collect();
            for (pattern, pcomps) in &self.extra {
                if (1..=rel.len()).any(|k| glob(pcomps, &rel[..k])) {
                    return Some(format!(
                        "the operator's agent-control path {pattern:?} (under {})",
                        root.display()
                    ));
                }
            }
        }
        None
    }
}

/// Whether the pattern components match the path components exactly (`**` = zero or more).
fn glob(pat: &[String], path: &[&str]) -> bool {
    match pat.split_first() {
        None => path.is_empty(),
        Some((p, rest)) if p == "**" => (0..=path.len()).any(|k| glob(rest, &path[k..])),
        Some((p, rest)) => match path.split_first() {
            Some((c, prest)) => component(p.as_bytes(), c.as_bytes()) && glob(rest, prest),
            None => false,
        },
    }
}

/// `*` and `?` within one component; a leading `.` is matched only literally, so `*` does not
/// silently cover hidden files the operator did not name.
fn component(p: &[u8], c: &[u8]) -> bool {
    if c.first() == Some(&b'.') && p.first() != Some(&b'.') {
        return false;
    }
    fn go(p: &[u8], c: &[u8]) -> bool {
        match (p.split_first(), c.split_first()) {
            (None, None) => true,
            (Some((b'*', pr)), _) => go(pr, c) || (!c.is_empty() && go(p, &c[1..])),
            (Some((b'?', pr)), Some((_, cr))) => go(pr, cr),
            (Some((a, pr)), Some((b, cr))) if a == b => go(pr, cr),
            _ => false,
        }
    }
    go(p, c)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = "/work/root";

    fn m(c: &ControlPaths, p: &str) -> bool {
        c.matched(Path::new(ROOT), Path::new(p)).is_some()
    }

    #[test]
    fn built_in_names_by_whole_component() {
        let c = ControlPaths::default();
        for yes in [
            "/work/root/.claude",
            "/work/root/.claude/settings.local.json",
            "/work/root/sub/dir/.claude/settings.json",
            "/work/root/.codex/config.toml",
            "/work/root/.gemini/settings.json",
            "/work/root/.qwen/settings.json",
            "/work/root/.opencode/plugin/x.ts",
            "/work/root/opencode.json",
            "/work/root/sub/OpenCode.jsonc",
            "/work/root/.QWEN/.env",
            "/work/root/.mcp.json",
            "/work/root/pkg/.mcp.json",
            "/work/root/.git",
            "/work/root/.git/hooks",
            "/work/root/.git/hooks/pre-commit",
            "/work/root/.git/config",
            "/work/root/vendor/.git/config",
            "/work/root/.Claude/settings.json",
            "/work/root/.CODEX/config.toml",
            "/work/root/.Mcp.json",
            "/work/root/.GIT/hooks/pre-commit",
            "/work/root/.Git",
            "/work/root/.git/commondir",
            "/work/root/.git/gitdir",
            "/work/root/.git/info/attributes",
            "/work/root/.git/config.worktree",
            "/work/root/.git/description",
            "/work/root/.git/modules",
            "/work/root/.git/modules/x",
            "/work/root/.git/modules/x/config",
            "/work/root/.git/modules/x/hooks/post-checkout",
            "/work/root/.git/modules/x/modules/y/commondir",
            "/work/root/.git/worktrees/w/commondir",
            "/work/root/.git/worktrees/w/gitdir",
            "/work/root/.git/worktrees/w/config.worktree",
            "/work/root/a/b/c/.git/info/exclude",
            "/work/root/.git/Config",
            "/root/.claude/settings.json",
            "/home/u/.codex/rules/default.rules",
        ] {
            assert!(m(&c, yes), "{yes} not a control file");
        }
        for no in [
            "/work/root/.claude-notes",
            "/work/root/..claude",
            "/work/root/.claude.bak/x",
            "/work/root/claude/settings.json",
            "/work/root/x.mcp.json",
            "/work/root/my-opencode.json",
            "/work/root/opencode.json.orig",
            "/work/root/.mcp.json.orig",
            "/work/root/.mcp.json/x",
            "/work/root/.git/objects/ab/cdef",
            "/work/root/.git/HEAD",
            "/work/root/.git/HEAD.lock",
            "/work/root/.git/index",
            "/work/root/.git/index.lock",
            "/work/root/.git/ORIG_HEAD",
            "/work/root/.git/MERGE_HEAD",
            "/work/root/.git/COMMIT_EDITMSG",
            "/work/root/.git/packed-refs",
            "/work/root/.git/refs/heads/main.lock",
            "/work/root/.git/logs/refs/heads/main",
            "/work/root/.git/modules/x/objects/pack/p.pack",
            "/work/root/.git/modules/x/index",
            "/work/root/.git/worktrees/w/HEAD",
            "/work/root/sub/.git/refs/tags/v1",
            "/work/root/.gitignore",
            "/work/root/hooks/pre-commit",
            "/work/root/src/lib.rs",
            "/work/root",
        ] {
            assert!(!m(&c, no), "{no} taken for a control file");
        }
        // A root that itself lies under such a name: only names below the root count.
        let r = Path::new("/srv/.codex-workspaces/.codex/ws");
        assert!(c.matched(r, &r.join("src/lib.rs")).is_none());
        assert!(c.matched(r, &r.join(".codex/x")).is_some());
    }

    #[test]
    fn operator_patterns_are_root_relative_globs_covering_what_is_beneath() {
        let c = ControlPaths::new(&[
            "deploy/secrets".into(),
            "*.env".into(),
            "**/Makefile".into(),
            "tools/?ook.sh".into(),
        ]);
        for yes in [
            "/work/root/deploy/secrets",
            "/work/root/deploy/secrets/key.pem",
            "/work/root/prod.env",
            "/work/root/Makefile",
            "/work/root/a/b/Makefile",
            "/work/root/tools/hook.sh",
        ] {
            assert!(m(&c, yes), "{yes} not matched");
        }
        for no in [
            "/work/root/deploy/secrets-old",
            "/work/root/deploy",
            "/work/root/sub/prod.env",
            "/work/root/.env",
            "/work/root/Makefile.am",
            "/work/root/tools/hooks.sh",
            "/elsewhere/deploy/secrets",
        ] {
            assert!(!m(&c, no), "{no} matched");
        }
    }
}
