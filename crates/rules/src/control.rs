//! Agent-control files: the agent's own configuration and hooks, which no tool call may change
//! (floor rule `floor.change.agent-control`). An agent that may edit them can grant itself
//! permissions (`.claude/settings.local.json` `permissions.allow`), install hooks that run
//! commands nobody decided (`PreToolUse`, `.git/hooks/*`), or add MCP servers (`.mcp.json`).
//!
//! Owns: deciding whether an already resolved path names such a file — by whole path
//! components, never by substring (`.claude-notes`, `..claude` and `x.mcp.json` are ordinary).
//!
//! Must never: do I/O (paths arrive resolved), or let an operator entry loosen the built-in list.

use std::ffi::OsStr;
use std::path::{Component, Path};

/// Directory names whose contents (and themselves) configure an agent, wherever they sit.
const CONTROL_DIRS: &[&str] = &[".claude", ".codex", ".gemini"];

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
            .find_map(|c| CONTROL_DIRS.iter().find(|d| OsStr::new(d) == *c))
        {
            return Some(format!("the agent configuration directory {d}"));
        }
        let n = comps.len();
        if comps.last() == Some(&OsStr::new(".mcp.json")) {
            return Some("the MCP server configuration .mcp.json".into());
        }
        // `.git` itself too: replacing it (or a worktree's `.git` file) swaps in other hooks.
        if comps.last() == Some(&OsStr::new(".git")) {
            return Some("the git directory .git itself".into());
        }
        if comps
            .windows(2)
            .any(|w| w[0] == OsStr::new(".git") && w[1] == OsStr::new("hooks"))
        {
            return Some("the git hooks .git/hooks".into());
        }
        if n >= 2 && comps[n - 2] == OsStr::new(".git") && comps[n - 1] == OsStr::new("config") {
            return Some("the git configuration .git/config (core.hooksPath, aliases)".into());
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
            "/work/root/.mcp.json",
            "/work/root/pkg/.mcp.json",
            "/work/root/.git",
            "/work/root/.git/hooks",
            "/work/root/.git/hooks/pre-commit",
            "/work/root/.git/config",
            "/work/root/vendor/.git/config",
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
            "/work/root/.mcp.json.orig",
            "/work/root/.mcp.json/x",
            "/work/root/.git/objects/ab/cdef",
            "/work/root/.git/HEAD",
            "/work/root/.git/config.d",
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
