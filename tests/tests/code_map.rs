//! The code map's rules, checked on the workspace's own source (in the spirit of rust-analyzer's
//! tidy tests). Each failure names the row or section of ARCHITECTURE.md it enforces.
//!
//! What is read: every package under `crates/` and `services/` (its `Cargo.toml` and the `.rs`
//! files under `src/`), with comments and `#[cfg(test)]` modules left out of the import graph.
//! Nothing is built or run: the rules are about what the source says.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

struct Package {
    /// `crates/rules`, `services/gateway`, ...
    dir: String,
    manifest: toml::Table,
}

impl Package {
    fn is_service(&self) -> bool {
        self.dir.starts_with("services/")
    }
    fn name(&self) -> &str {
        self.manifest["package"]["name"].as_str().unwrap_or("")
    }
    /// Names of the normal (not dev-, not build-) dependencies.
    fn dependencies(&self) -> BTreeSet<String> {
        self.manifest
            .get("dependencies")
            .and_then(|d| d.as_table())
            .map(|d| d.keys().cloned().collect())
            .unwrap_or_default()
    }
}

fn packages() -> Vec<Package> {
    let root = workspace();
    let mut out = Vec::new();
    for group in ["crates", "services"] {
        let mut dirs: Vec<_> = std::fs::read_dir(root.join(group))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.join("Cargo.toml").is_file())
            .collect();
        dirs.sort();
        for d in dirs {
            let text = std::fs::read_to_string(d.join("Cargo.toml")).unwrap();
            out.push(Package {
                dir: d
                    .strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
                manifest: text.parse().unwrap(),
            });
        }
    }
    assert!(
        out.len() >= 15,
        "the workspace was not found: {}",
        out.len()
    );
    out
}

fn rs_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() {
            out.extend(rs_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The source without `//` comments (doc comments included) and, when `drop_tests`, without
/// the `#[cfg(test)]` module that closes a file by house convention.
fn code(text: &str, drop_tests: bool) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if drop_tests && t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        // A trailing comment; a `//` inside a string literal (a URL) cuts a line short, which
        // only ever hides code from these checks, never invents it.
        let line = match line.find(" //") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn rel(p: &Path) -> String {
    p.strip_prefix(workspace())
        .unwrap_or(p)
        .to_string_lossy()
        .into_owned()
}

/// Crate roots that need `unsafe`, each with why. Every other crate root forbids it.
const NEEDS_UNSAFE: &[(&str, &str)] = &[
    (
        "crates/cli/src/lib.rs",
        "pre_exec: the parent-death signal for `warden up`'s daemons, and the uid switch of `doctor --deployed`'s probes",
    ),
    (
        "crates/daemon/src/lib.rs",
        "peer credentials (SO_PEERCRED) and sockaddr_un for the listeners' allowlist",
    ),
    (
        "crates/sandbox/src/lib.rs",
        "pre_exec and capset in the contained spawn; the host feature probes (unshare, landlock)",
    ),
    (
        "crates/scripted-agent/src/main.rs",
        "a scenario step that ignores SIGTERM (the kill ladder's test peer)",
    ),
    (
        "services/policy/src/bin/bench.rs",
        "sysconf(_SC_CLK_TCK) for the CPU figures it prints",
    ),
];

#[test]
fn every_crate_root_that_needs_no_unsafe_forbids_it() {
    let root = workspace();
    let mut missing = Vec::new();
    let mut stale = Vec::new();
    for p in packages() {
        let src = root.join(&p.dir).join("src");
        let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"]
            .iter()
            .map(|f| src.join(f))
            .filter(|f| f.is_file())
            .collect();
        roots.extend(rs_files(&src.join("bin")));
        for r in roots {
            let name = rel(&r);
            let text = std::fs::read_to_string(&r).unwrap();
            let listed = NEEDS_UNSAFE.iter().any(|(f, _)| *f == name);
            if listed {
                // A root listed as needing unsafe still has some: otherwise it should forbid.
                let files = if name.ends_with("lib.rs") || name.ends_with("main.rs") {
                    rs_files(&src)
                        .into_iter()
                        .filter(|f| !f.starts_with(src.join("bin")))
                        .collect()
                } else {
                    vec![r.clone()]
                };
                let uses = files
                    .iter()
                    .any(|f| code(&std::fs::read_to_string(f).unwrap(), false).contains("unsafe"));
                if !uses {
                    stale.push(name);
                }
            } else if !text.contains("#![forbid(unsafe_code)]") {
                missing.push(name);
            }
        }
    }
    assert!(
        missing.is_empty() && stale.is_empty(),
        "ARCHITECTURE.md, \"Rules the code map keeps\": a crate root that needs no unsafe code \
         says #![forbid(unsafe_code)]. Missing it: {missing:?}. Listed in NEEDS_UNSAFE but \
         using none (forbid it instead): {stale:?}"
    );
}

#[test]
fn no_service_depends_on_another_service_and_no_library_on_a_service() {
    let all = packages();
    let services: BTreeSet<String> = all
        .iter()
        .filter(|p| p.is_service())
        .map(|p| p.name().to_string())
        .collect();
    let mut wrong = Vec::new();
    for p in &all {
        for d in p.dependencies() {
            if services.contains(&d) {
                wrong.push(format!("{} -> {d}", p.dir));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md, \"Rules the code map keeps\": `services/<name>` are one binary each \
         and share code only through `crates/`; these depend on a service: {wrong:?}"
    );
}

/// The code map's rows, from ARCHITECTURE.md: (path, owns, must never).
fn code_map_rows() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap();
    let start = text
        .find("## Code map")
        .expect("ARCHITECTURE.md has a code map");
    text[start..]
        .lines()
        .skip_while(|l| !l.starts_with("| path |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim().trim_matches('|').split(" | ").collect();
            let cell = |i: usize| cells.get(i).map_or("", |c| c.trim()).to_string();
            (cell(0).trim_matches('`').to_string(), cell(1), cell(2))
        })
        .collect()
}

/// Words in a row: what it owns and what it must never do.
fn row_words(owns: &str, never: &str) -> usize {
    owns.split_whitespace().count() + never.split_whitespace().count()
}

#[test]
fn every_code_map_row_is_one_short_line() {
    let rows = code_map_rows();
    assert!(rows.len() >= 20, "the code map was not read: {rows:?}");
    let long: Vec<String> = rows
        .iter()
        .filter(|(_, owns, never)| row_words(owns, never) > 40)
        .map(|(path, owns, never)| format!("{path}: {} words", row_words(owns, never)))
        .collect();
    assert!(
        long.is_empty(),
        "ARCHITECTURE.md, \"Code map\": one line a path, at most 40 words (owns / must never); \
         the detail goes in the README beside the path. Too long: {long:?}"
    );
}

/// The paths a row names in backticks (`spawn/`, `judged.rs`, `crates/pgstate/migrations/`):
/// anything ending in `/` or a source or document extension, not a host path (`/run/…`) nor a
/// placeholder (`<state>/…`).
fn paths_named(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| !t.starts_with('/') && !t.contains(['<', ' ', '*', '{']))
        .filter(|t| {
            t.ends_with('/')
                || [".rs", ".md", ".proto", ".toml"]
                    .iter()
                    .any(|e| t.ends_with(e))
        })
        .map(str::to_string)
        .collect()
}

/// Whether `named` exists from the row of `row_path`: from the workspace, the row's own
/// directory, its `src/`, or as the end of a path below the row's directory.
fn named_exists(row_path: &str, named: &str) -> bool {
    let root = workspace();
    let dir = root.join(row_path);
    let named = named.trim_end_matches('/');
    // A row for one file (the gateway's core modules) names its siblings and the files of the
    // directory above it by their bare names.
    let file_row = row_path.ends_with(".rs");
    let beside = dir.parent().map(|d| d.join(named)).filter(|_| file_row);
    let above = dir
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join(named))
        .filter(|_| file_row);
    if [
        Some(root.join(named)),
        Some(dir.join(named)),
        Some(dir.join("src").join(named)),
        beside,
        above,
    ]
    .iter()
    .flatten()
    .any(|p| p.exists())
    {
        return true;
    }
    fn below(d: &Path, named: &str) -> bool {
        let Ok(rd) = std::fs::read_dir(d) else {
            return false;
        };
        rd.filter_map(|e| e.ok()).any(|e| {
            let p = e.path();
            p.to_string_lossy().ends_with(&format!("/{named}"))
                || (p.is_dir() && !p.ends_with("target") && below(&p, named))
        })
    }
    below(&dir, named)
}

#[test]
fn every_path_in_the_code_map_exists_and_every_package_has_a_row() {
    let rows = code_map_rows();
    let mut missing = Vec::new();
    for (path, owns, never) in &rows {
        if !workspace().join(path).exists() {
            missing.push(path.clone());
        }
        for named in paths_named(owns).into_iter().chain(paths_named(never)) {
            if !named_exists(path, &named) {
                missing.push(format!("{path}: {named}"));
            }
        }
    }
    let unmapped: Vec<String> = packages()
        .into_iter()
        .map(|p| p.dir)
        .filter(|d| {
            !rows
                .iter()
                .any(|(path, _, _)| path.trim_end_matches('/') == d)
        })
        .collect();
    assert!(
        missing.is_empty() && unmapped.is_empty(),
        "ARCHITECTURE.md, \"Code map\": every path it names exists, and every package has a \
         row. Named but not there: {missing:?}. Packages without a row: {unmapped:?}"
    );
}

#[test]
fn the_code_map_checks_see_a_long_row_and_a_missing_path() {
    // The two rules above are only as good as their readers: 41 words is too long, a file
    // that is not there is found, one that is there is not.
    let owns = "word ".repeat(30);
    let never = "word ".repeat(11);
    assert_eq!(row_words(&owns, &never), 41);
    assert_eq!(
        paths_named("a `spawn/` and `judged.rs`, not `<state>/x/` nor `/run/warden/`"),
        vec!["spawn/".to_string(), "judged.rs".to_string()]
    );
    assert!(named_exists("crates/sandbox", "spawn/"));
    assert!(named_exists("crates/rules", "judged.rs"));
    assert!(!named_exists("crates/rules", "no_such_file.rs"));
}

#[test]
fn the_gateway_never_depends_on_the_sandbox_or_the_agent_side() {
    let gw = packages()
        .into_iter()
        .find(|p| p.dir == "services/gateway")
        .unwrap();
    let deps = gw.dependencies();
    let wrong: Vec<&str> = [
        "warden-sandbox",
        "warden-acp",
        "warden-fs-servant",
        "warden-rules",
    ]
    .into_iter()
    .filter(|d| deps.contains(*d))
    .collect();
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md, row `services/gateway` (must never spawn a process or decide a \
         permission): it depends on {wrong:?}"
    );
}

/// Files (outside tests) whose code contains `needle`, for the packages not in `allowed`.
fn uses_outside(needle: &str, allowed: &[&str]) -> Vec<String> {
    let root = workspace();
    let mut out = Vec::new();
    for p in packages() {
        if allowed.contains(&p.dir.as_str()) {
            continue;
        }
        for f in rs_files(&root.join(&p.dir).join("src")) {
            if code(&std::fs::read_to_string(&f).unwrap(), true).contains(needle) {
                out.push(rel(&f));
            }
        }
    }
    out
}

#[test]
fn only_containment_opens_beneath_a_root() {
    let mut wrong = Vec::new();
    for needle in [
        "openat2",
        "RESOLVE_BENEATH",
        "RESOLVE_NO_SYMLINKS",
        "ResolveFlags",
    ] {
        for f in uses_outside(needle, &["crates/containment"]) {
            wrong.push(format!("{f}: {needle}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md, row `crates/containment` (`beneath::RootDir` is the only primitive by \
         which warden opens an agent's files; never implemented a second time): {wrong:?}"
    );
}

#[test]
fn only_the_rules_decide_and_only_decision_services_run_them() {
    // The engine and the floor are run by the services that answer `PolicyService.Decide`
    // (warden-policy, and warden-approver when it has no upstream); nothing else may judge.
    let mut wrong = Vec::new();
    for needle in [
        "warden_rules::Engine",
        "Engine::new",
        "evaluate_floor",
        "decide_with_approver",
    ] {
        for f in uses_outside(
            needle,
            &["crates/rules", "services/policy", "services/approver"],
        ) {
            wrong.push(format!("{f}: {needle}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md, row `crates/rules` (the decision as a pure library) and the rows of \
         the supervisor and the gateway (never decide a permission): {wrong:?}"
    );
}

/// The module path a file defines: `src/lib.rs` → "", `src/a.rs` and `src/a/mod.rs` → "a",
/// `src/a/b.rs` → "a::b".
fn module_of(src: &Path, f: &Path) -> String {
    let r = f.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = r
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts.join("::")
}

/// Every `crate::a::b…` / `super::…` path in `code` (with `use crate::{a, b::c}` groups opened),
/// as absolute module paths.
fn paths_used(code: &str, this: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    for (start, anchor) in [("crate::", None), ("super::", Some(()))] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            if at > 0 && (ident(bytes[at - 1]) || bytes[at - 1] == b':') {
                continue;
            }
            let base: Vec<&str> = if anchor.is_some() {
                let mut m: Vec<&str> = this.split("::").filter(|s| !s.is_empty()).collect();
                m.pop();
                m
            } else {
                Vec::new()
            };
            let rest = &code[from..];
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a::X, b}`: the top-level names of the group (nested groups are rare
                // and their first name is still read).
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                        .collect();
                    let mut p = base.clone();
                    p.extend(name.split("::").filter(|s| !s.is_empty()));
                    out.push(p.join("::"));
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let mut p = base.clone();
                p.extend(name.split("::").filter(|s| !s.is_empty()));
                out.push(p.join("::"));
            }
        }
    }
    out
}

/// The strongly connected components with more than one file of `edges` (Tarjan).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    impl<'a> T<'a> {
        fn visit(&mut self, v: &'a str) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on.insert(v);
            if let Some(ws) = self.edges.get(v) {
                for w in ws {
                    let w = w.as_str();
                    if !self.index.contains_key(w) {
                        self.visit(w);
                        let l = self.low[w].min(self.low[v]);
                        self.low.insert(v, l);
                    } else if self.on.contains(w) {
                        let l = self.index[w].min(self.low[v]);
                        self.low.insert(v, l);
                    }
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

/// One package's imports between its files: file → the files it imports (the crate root, which
/// declares the modules, is not a node; nor are `src/bin` programs).
fn import_edges(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let src = workspace().join(dir).join("src");
    let files: Vec<PathBuf> = rs_files(&src)
        .into_iter()
        .filter(|f| !f.starts_with(src.join("bin")))
        .collect();
    let by_module: BTreeMap<String, String> =
        files.iter().map(|f| (module_of(&src, f), rel(f))).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let this = module_of(&src, f);
        if this.is_empty() {
            continue;
        }
        let from = rel(f);
        let text = code(&std::fs::read_to_string(f).unwrap(), true);
        let mut to_set = BTreeSet::new();
        for used in paths_used(&text, &this) {
            // The longest module prefix that is a file of this crate.
            let parts: Vec<&str> = used.split("::").collect();
            let target = (1..=parts.len())
                .rev()
                .find_map(|n| by_module.get(&parts[..n].join("::")));
            if let Some(t) = target
                && *t != from
            {
                to_set.insert(t.clone());
            }
        }
        edges.insert(from, to_set);
    }
    edges
}

/// Each package's import circles between its files.
fn import_circles() -> Vec<Vec<String>> {
    packages()
        .iter()
        .flat_map(|p| circles(&import_edges(Path::new(&p.dir))))
        .collect()
}

/// Circles that exist today and are being taken apart. This list may only shrink: a new circle,
/// or a known one that grows, fails. (The gateway's 8-file circle went with its floors.)
const KNOWN_CIRCLES: &[&[&str]] = &[];

#[test]
fn no_crate_has_an_import_circle_between_its_files() {
    let found = import_circles();
    let new: Vec<&Vec<String>> = found
        .iter()
        .filter(|c| {
            !KNOWN_CIRCLES
                .iter()
                .any(|k| c.iter().all(|f| k.contains(&f.as_str())))
        })
        .collect();
    assert!(
        new.is_empty(),
        "ARCHITECTURE.md, \"Rules the code map keeps\": files import one way, no circles (a \
         shared type or function moves down to a file both import). New circles: {new:#?}"
    );
}

#[test]
fn the_import_reader_sees_a_circle_when_there_is_one() {
    // The rule above is only as good as its reader: a circle through a `use crate::{..}`
    // group and one through `super::` are both found, and a one-way import is not a circle.
    let mut edges = BTreeMap::new();
    let files = [
        ("a", "use crate::{b::Thing, c};\n"),
        ("b", "fn f() { crate::a::g() }\n"),
        ("c", "use std::fmt;\n"),
        ("m::x", "use super::y::Y;\n"),
        ("m::y", "use crate::m::x::X;\n"),
    ];
    let by_module: BTreeMap<&str, &str> = files.iter().map(|(m, _)| (*m, *m)).collect();
    for (m, text) in files {
        let mut to = BTreeSet::new();
        for used in paths_used(text, m) {
            let parts: Vec<&str> = used.split("::").collect();
            if let Some(t) = (1..=parts.len())
                .rev()
                .find_map(|n| by_module.get(parts[..n].join("::").as_str()))
                && *t != m
            {
                to.insert(t.to_string());
            }
        }
        edges.insert(m.to_string(), to);
    }
    let found = circles(&edges);
    assert_eq!(
        found,
        vec![
            vec!["a".to_string(), "b".to_string()],
            vec!["m::x".to_string(), "m::y".to_string()]
        ],
        "{edges:#?}"
    );
}

#[test]
fn the_known_circles_are_still_there_or_are_removed_from_the_list() {
    // When a known circle is taken apart, its entry goes, so the list cannot hide a new one.
    let found = import_circles();
    for k in KNOWN_CIRCLES {
        assert!(
            found
                .iter()
                .any(|c| c.len() == k.len() && k.iter().all(|f| c.contains(&f.to_string()))),
            "the known circle {k:?} changed or is gone: update KNOWN_CIRCLES (found {found:#?})"
        );
    }
}

/// The gateway's floors, bottom up, as ARCHITECTURE.md draws them. Every file of the gateway is
/// in exactly one; a file imports only from lower floors or its own — except the bindings, which
/// never import each other (a file of a binding may import the files of the same binding, as
/// `mcp/` does).
const GATEWAY_FLOORS: &[(&str, &[&str])] = &[
    (
        "pure",
        &[
            "a2a.rs",
            "config.rs",
            "config/auth.rs",
            "config/mcp.rs",
            "config/push.rs",
            "endpoints.rs",
            "error.rs",
            "grpc_convert.rs",
            "mapping.rs",
            "mapping/hints.rs",
            "placement.rs",
            "time.rs",
            "translate03.rs",
        ],
    ),
    (
        "state and delivery",
        &[
            "auth.rs",
            "cells.rs",
            "metrics.rs",
            "oidc.rs",
            "peer.rs",
            "push.rs",
            "push_limits.rs",
            "shares.rs",
            "store.rs",
            "store_pg.rs",
            "store_pg/connection.rs",
            "store_sled.rs",
            "store_contract.rs",
        ],
    ),
    (
        "core",
        &[
            "card.rs",
            "events.rs",
            "core/mod.rs",
            "core/access.rs",
            "core/admit.rs",
            "core/answers.rs",
            "core/cancel.rs",
            "core/drive.rs",
            "core/follow.rs",
            "core/live.rs",
            "core/push_configs.rs",
            "core/read.rs",
            "core/route.rs",
            "core/shared.rs",
            "core/sweep.rs",
            "core/writer.rs",
        ],
    ),
    ("admission", &["admission.rs"]),
    (
        "bindings",
        &[
            "a2a_grpc.rs",
            "compat03.rs",
            "jsonrpc.rs",
            "rest.rs",
            "mcp/mod.rs",
            "mcp/envelope.rs",
            "mcp/server.rs",
            "mcp/server/bind.rs",
            "mcp/server/jobs.rs",
            "mcp/server/runs.rs",
            "mcp/sessions.rs",
            "mcp/tools.rs",
            "mcp/turn.rs",
            "mcp/workspace.rs",
        ],
    ),
    ("wiring", &["daemon.rs", "http.rs", "serve.rs"]),
];

/// The binding a file belongs to (`mcp/…` is one binding of several files).
fn binding_of(file: &str) -> &str {
    file.split_once('/').map_or(file, |(dir, _)| dir)
}

/// Whether `from` may import `to` under [`GATEWAY_FLOORS`]; `None` when a file has no floor.
fn floor_allows(from: &str, to: &str) -> Option<bool> {
    let floor = |f: &str| GATEWAY_FLOORS.iter().position(|(_, fs)| fs.contains(&f));
    let (a, b) = (floor(from)?, floor(to)?);
    let bindings = GATEWAY_FLOORS.iter().position(|(n, _)| *n == "bindings");
    Some(b < a || (b == a && (Some(a) != bindings || binding_of(from) == binding_of(to))))
}

fn gateway_floor_breaks(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let prefix = "services/gateway/src/";
    let mut out = Vec::new();
    for (from, tos) in edges {
        let f = from.strip_prefix(prefix).unwrap_or(from);
        for to in tos {
            let t = to.strip_prefix(prefix).unwrap_or(to);
            match floor_allows(f, t) {
                Some(true) => {}
                Some(false) => out.push(format!("{f} imports {t}")),
                None => out.push(format!("{f} or {t} has no floor in GATEWAY_FLOORS")),
            }
        }
        if floor_allows(f, f).is_none() {
            out.push(format!("{f} has no floor in GATEWAY_FLOORS"));
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn the_gateway_imports_only_down_its_floors_and_bindings_never_import_each_other() {
    let breaks = gateway_floor_breaks(&import_edges(Path::new("services/gateway")));
    assert!(
        breaks.is_empty(),
        "ARCHITECTURE.md, services/gateway, \"The gateway in floors\": a module imports only from \
         its own floor or below, and a binding never from another binding (what two bindings \
         share moves down a floor, not sideways). Broken: {breaks:#?}"
    );
}

#[test]
fn the_floor_rule_refuses_an_import_up_or_sideways() {
    // The rule above is only as good as its table: an import up a floor, one binding using
    // another, and a file with no floor are each refused; down and within `mcp/` are not.
    assert_eq!(floor_allows("core/admit.rs", "store.rs"), Some(true));
    assert_eq!(floor_allows("mcp/server.rs", "mcp/turn.rs"), Some(true));
    assert_eq!(floor_allows("translate03.rs", "a2a.rs"), Some(true));
    assert_eq!(floor_allows("store.rs", "core/shared.rs"), Some(false));
    assert_eq!(floor_allows("compat03.rs", "rest.rs"), Some(false));
    assert_eq!(floor_allows("mcp/server.rs", "jsonrpc.rs"), Some(false));
    assert_eq!(floor_allows("core/admit.rs", "admission.rs"), Some(false));
    assert_eq!(floor_allows("new_thing.rs", "a2a.rs"), None);
    let mut edges = BTreeMap::new();
    edges.insert(
        "services/gateway/src/config.rs".to_string(),
        BTreeSet::from(["services/gateway/src/push.rs".to_string()]),
    );
    assert_eq!(
        gateway_floor_breaks(&edges),
        vec!["config.rs imports push.rs".to_string()]
    );
}

/// The floors inside the A2A core (`services/gateway/src/core/`), bottom up: the task's state and
/// its writes, the task in memory,
/// the handle every step works through, what every step asks (where, who may, is it yours), the
/// steps of a task's life, the answers (which reuse admit's outcome and follow's store reading),
/// and the face. A module imports only from lower floors: two steps never import each other.
const CORE_FLOORS: &[(&str, &[&str])] = &[
    ("the task's state and its writes", &["core/writer.rs"]),
    ("the task in memory", &["core/live.rs"]),
    ("the handle", &["core/shared.rs"]),
    (
        "what every step asks",
        &["core/access.rs", "core/read.rs", "core/route.rs"],
    ),
    (
        "the steps",
        &[
            "core/admit.rs",
            "core/cancel.rs",
            "core/drive.rs",
            "core/follow.rs",
            "core/push_configs.rs",
            "core/sweep.rs",
        ],
    ),
    ("answers", &["core/answers.rs"]),
    ("the face", &["core/mod.rs"]),
];

/// The breaks of [`CORE_FLOORS`] among `edges` (gateway files): an import between two core files
/// that does not go strictly down, or a core file with no core floor.
fn core_floor_breaks(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let prefix = "services/gateway/src/";
    let floor = |f: &str| CORE_FLOORS.iter().position(|(_, fs)| fs.contains(&f));
    let mut out = Vec::new();
    for (from, tos) in edges {
        let f = from.strip_prefix(prefix).unwrap_or(from);
        if !f.starts_with("core/") {
            continue;
        }
        let Some(a) = floor(f) else {
            out.push(format!("{f} has no floor in CORE_FLOORS"));
            continue;
        };
        for to in tos {
            let t = to.strip_prefix(prefix).unwrap_or(to);
            if !t.starts_with("core/") {
                continue;
            }
            match floor(t) {
                Some(b) if b < a => {}
                Some(_) => out.push(format!("{f} imports {t}")),
                None => out.push(format!("{t} has no floor in CORE_FLOORS")),
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn the_core_imports_only_down_its_own_floors() {
    let breaks = core_floor_breaks(&import_edges(Path::new("services/gateway")));
    assert!(
        breaks.is_empty(),
        "ARCHITECTURE.md, the rows of services/gateway/src/core/: the core is one module per step \
         of a task's life over one handle; a step imports only what is below the steps (the live \
         task, the handle, access, reads, routing), never another step. Broken: {breaks:#?}"
    );
}

#[test]
fn the_core_floor_rule_refuses_a_step_importing_a_step() {
    let edge = |from: &str, to: &str| {
        BTreeMap::from([(
            format!("services/gateway/src/{from}"),
            BTreeSet::from([format!("services/gateway/src/{to}")]),
        )])
    };
    assert!(core_floor_breaks(&edge("core/admit.rs", "core/live.rs")).is_empty());
    assert!(core_floor_breaks(&edge("core/answers.rs", "core/admit.rs")).is_empty());
    assert_eq!(
        core_floor_breaks(&edge("core/admit.rs", "core/drive.rs")),
        vec!["core/admit.rs imports core/drive.rs".to_string()]
    );
    assert_eq!(
        core_floor_breaks(&edge("core/live.rs", "core/shared.rs")),
        vec!["core/live.rs imports core/shared.rs".to_string()]
    );
    assert_eq!(
        core_floor_breaks(&edge("core/new_step.rs", "core/live.rs")),
        vec!["core/new_step.rs has no floor in CORE_FLOORS".to_string()]
    );
}

#[test]
fn every_module_of_the_core_has_a_short_row_in_the_code_map() {
    // A newcomer finds a step of a task's life (where a lease is renewed, say) in one look at
    // the code map: each file of the core has its own row, one line of at most 40 words.
    let map = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap();
    let dir = workspace().join("services/gateway/src/core");
    let mut wrong = Vec::new();
    for f in rs_files(&dir) {
        let path = rel(&f);
        let row = map
            .lines()
            .find(|l| l.starts_with(&format!("| `{path}` |")));
        match row {
            None => wrong.push(format!("{path}: no row")),
            Some(r) => {
                let words = r.split_whitespace().filter(|w| *w != "|").count() - 1;
                if words > 40 {
                    wrong.push(format!("{path}: {words} words"));
                }
            }
        }
    }
    assert!(
        map.lines().any(
            |l| l.starts_with("| `services/gateway/src/core/follow.rs` |")
                && l.contains("leases_forever")
        ),
        "the code map says where a task's lease is renewed"
    );
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md: every file of services/gateway/src/core/ has a row of at most 40 \
         words (owns / must never): {wrong:?}"
    );
}
