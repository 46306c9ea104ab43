//! What a tool call's raw input says the tool will touch, read off the shapes the real adapters
//! send (real-adapters.md), so the floor judges what the tool will do and not only its label.
//!
//! Owns: turning raw-input JSON text into the paths it names — pure, no filesystem.
//!
//! Must never: guess a path out of free text (only named fields and the header lines of an
//! `apply_patch` patch count), or treat raw input it cannot read as naming nothing (that is an
//! error; the floor denies it for mutating kinds).
//!
//! Shapes read:
//! - Claude `Write`/`Edit`/`MultiEdit` (`mcp__acp__` prefixed or not): `file_path`;
//!   `NotebookEdit`: `notebook_path`. The raw input carries no tool name (0.16.2 sends
//!   `{"file_path":…,"content":…}`), so the fields are read whatever the title says.
//! - Codex 0.16 patch approval: `changes`, a map from path to `{"add":…}` / `{"delete":…}` /
//!   `{"update":{"unified_diff":…,"move_path":…}}`; a list of `{"path":…}` is read too.
//! - Codex `apply_patch` text, wherever a command or patch string carries it (`command` as a
//!   string or argv array — `["/bin/bash","-lc","apply_patch <<'EOF' …"]` —, `cmd`, `patch`,
//!   `input`): the `*** Add File:`, `*** Update File:`, `*** Delete File:` and `*** Move to:`
//!   lines of a text holding `*** Begin Patch`.
//! - Shell working directory: `cwd` (Codex 0.16 and 2.6 exec approvals), `workdir`
//!   (`exec_command`'s argument).
//! - Places a request asks to reach without saying what it does there: OpenCode's
//!   `external_directory` permission (ACP kind `other`), `{"filepath":…,"parentDir":…}` before
//!   a file tool, `{"command":…,"directories":[…],"patterns":[…]}` before a command.

use std::path::PathBuf;

use serde_json::{Map, Value};

/// The paths a raw input names, as written (absolute, or relative to `cwds[0]` if given, else
/// to the root).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawPaths {
    /// Files the tool will create, change, delete or move to (or from).
    pub changed: Vec<PathBuf>,
    /// Working directories the tool will run in.
    pub cwds: Vec<PathBuf>,
    /// Files or directories the request asks to reach (OpenCode's `external_directory`), with
    /// nothing said of what is done there.
    pub reached: Vec<PathBuf>,
}

impl RawPaths {
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.cwds.is_empty() && self.reached.is_empty()
    }
}

/// Raw input that cannot be read for its paths.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RawInputError {
    #[error("raw input is not valid JSON: {0}")]
    NotJson(String),
    #[error("raw input field {key:?} is not {want}")]
    WrongType { key: String, want: &'static str },
}

const PATH_KEYS: &[&str] = &["file_path", "notebook_path"];
const CWD_KEYS: &[&str] = &["cwd", "workdir"];
const REACHED_KEYS: &[&str] = &["filepath", "parentDir"];
const REACHED_LIST_KEYS: &[&str] = &["directories"];
const PATCH_KEYS: &[&str] = &["command", "cmd", "patch", "input"];
const PATCH_HEADERS: &[&str] = &[
    "*** Add File:",
    "*** Update File:",
    "*** Delete File:",
    "*** Move to:",
];

/// The paths `raw_input_json` names. Empty (or all-whitespace) text names nothing; valid JSON
/// that is not an object names nothing; text that is not JSON, or a known field of the wrong
/// type, is an error.
pub fn extract(raw_input_json: &str) -> Result<RawPaths, RawInputError> {
    if raw_input_json.trim().is_empty() {
        return Ok(RawPaths::default());
    }
    let value: Value =
        serde_json::from_str(raw_input_json).map_err(|e| RawInputError::NotJson(e.to_string()))?;
    extract_value(&value)
}

/// [`extract`] of raw input already parsed (a caller that reads other fields of it too parses
/// it once).
pub fn extract_value(value: &Value) -> Result<RawPaths, RawInputError> {
    let mut out = RawPaths::default();
    let Some(obj) = value.as_object() else {
        return Ok(out);
    };
    for key in PATH_KEYS {
        if let Some(p) = string_field(obj, key)? {
            out.changed.push(PathBuf::from(p));
        }
    }
    for key in CWD_KEYS {
        if let Some(p) = string_field(obj, key)? {
            out.cwds.push(PathBuf::from(p));
        }
    }
    for key in REACHED_KEYS {
        if let Some(p) = string_field(obj, key)? {
            out.reached.push(PathBuf::from(p));
        }
    }
    for key in REACHED_LIST_KEYS {
        match obj.get(*key) {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => out
                .reached
                .extend(items.iter().filter_map(Value::as_str).map(PathBuf::from)),
            Some(_) => {
                return Err(RawInputError::WrongType {
                    key: (*key).to_string(),
                    want: "a list of strings",
                });
            }
        }
    }
    if let Some(changes) = obj.get("changes") {
        codex_changes(changes, &mut out.changed)?;
    }
    for key in PATCH_KEYS {
        match obj.get(*key) {
            Some(Value::String(s)) => patch_headers(s, &mut out.changed),
            Some(Value::Array(items)) => {
                for s in items.iter().filter_map(Value::as_str) {
                    patch_headers(s, &mut out.changed);
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// A field that, when present and not null, must be a string.
fn string_field<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
) -> Result<Option<&'a str>, RawInputError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(RawInputError::WrongType {
            key: key.to_string(),
            want: "a string",
        }),
    }
}

fn codex_changes(changes: &Value, out: &mut Vec<PathBuf>) -> Result<(), RawInputError> {
    let wrong = || RawInputError::WrongType {
        key: "changes".into(),
        want: "a map from path to change (or a list of {\"path\":…})",
    };
    match changes {
        Value::Null => Ok(()),
        Value::Object(map) => {
            for (path, change) in map {
                out.push(PathBuf::from(path));
                move_path(change, out)?;
            }
            Ok(())
        }
        Value::Array(items) => {
            for item in items {
                let obj = item.as_object().ok_or_else(wrong)?;
                let path = string_field(obj, "path")?.ok_or_else(wrong)?;
                out.push(PathBuf::from(path));
                move_path(item, out)?;
            }
            Ok(())
        }
        _ => Err(wrong()),
    }
}

/// A rename's destination: `move_path` on the change itself or on its one variant object
/// (`{"update":{"move_path":…}}`).
fn move_path(change: &Value, out: &mut Vec<PathBuf>) -> Result<(), RawInputError> {
    let Some(obj) = change.as_object() else {
        return Ok(());
    };
    if let Some(p) = string_field(obj, "move_path")? {
        out.push(PathBuf::from(p));
    }
    for inner in obj.values().filter_map(Value::as_object) {
        if let Some(p) = string_field(inner, "move_path")? {
            out.push(PathBuf::from(p));
        }
    }
    Ok(())
}

/// The file header lines of an `apply_patch` patch, if `text` holds one.
fn patch_headers(text: &str, out: &mut Vec<PathBuf>) {
    if !text.contains("*** Begin Patch") {
        return;
    }
    for line in text.lines() {
        let line = line.trim();
        for h in PATCH_HEADERS {
            if let Some(p) = line
                .strip_prefix(h)
                .map(str::trim)
                .filter(|p| !p.is_empty())
            {
                out.push(PathBuf::from(p));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(v: &[&str]) -> Vec<PathBuf> {
        v.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn real_shapes() {
        let patch = "*** Begin Patch\n*** Add File: new.txt\n+hi\n*** Update File: src/lib.rs\n@@\n-a\n+b\n*** Move to: /etc/cron.d/x\n*** Delete File: old.txt\n*** End Patch\n";
        let bash_patch = serde_json::json!({
            "command": ["/bin/bash", "-lc", format!("apply_patch <<'EOF'\n{patch}EOF\n")],
            "cwd": "/work/root/sub",
        })
        .to_string();
        let argv_patch = serde_json::json!({"command": ["apply_patch", patch]}).to_string();
        let cases: Vec<(&str, String, Vec<PathBuf>, Vec<PathBuf>)> = vec![
            ("empty", String::new(), vec![], vec![]),
            ("whitespace", " \n".into(), vec![], vec![]),
            (
                "claude 0.16 Write",
                r#"{"file_path":"scratch/work/c1/hello.txt","content":"hello\n"}"#.into(),
                paths(&["scratch/work/c1/hello.txt"]),
                vec![],
            ),
            (
                "claude Edit",
                r#"{"file_path":"/etc/passwd","old_string":"a","new_string":"b","replace_all":false}"#.into(),
                paths(&["/etc/passwd"]),
                vec![],
            ),
            (
                "claude MultiEdit",
                r#"{"file_path":"/r/a.rs","edits":[{"old_string":"a","new_string":"b"}]}"#.into(),
                paths(&["/r/a.rs"]),
                vec![],
            ),
            (
                "claude NotebookEdit",
                r#"{"notebook_path":"/r/n.ipynb","new_source":"x","cell_id":"c1"}"#.into(),
                paths(&["/r/n.ipynb"]),
                vec![],
            ),
            (
                "claude Bash",
                r#"{"command":"touch /abs/x.txt","timeout":30000,"description":"touch"}"#.into(),
                vec![],
                vec![],
            ),
            (
                "codex 0.16 exec approval",
                r#"{"call_id":"c","turn_id":"t","command":["/bin/bash","-lc","touch /tmp/x.txt"],"cwd":"/tmp/x1","reason":"r","proposed_execpolicy_amendment":["touch","/tmp/x.txt"]}"#.into(),
                vec![],
                paths(&["/tmp/x1"]),
            ),
            (
                "codex 2.6 exec approval",
                r#"{"command":"touch /abs","cwd":"/w"}"#.into(),
                vec![],
                paths(&["/w"]),
            ),
            (
                "exec_command workdir",
                r#"{"cmd":"ls","workdir":"/elsewhere","sandbox_permissions":"require_escalated"}"#.into(),
                vec![],
                paths(&["/elsewhere"]),
            ),
            (
                "codex 0.16 patch approval changes map",
                r#"{"changes":{"/r/p.txt":{"add":{"content":"x"}},"/r/q.txt":{"update":{"unified_diff":"@@","move_path":"/r/.git/hooks/pre-commit"}},"/r/old":{"delete":{"content":""}}}}"#.into(),
                paths(&["/r/old", "/r/p.txt", "/r/q.txt", "/r/.git/hooks/pre-commit"]),
                vec![],
            ),
            (
                // As codex-acp 0.16.0 (Codex 0.137) sent it under warden: `type`-tagged changes.
                "codex-acp 0.16.0 patch approval, type-tagged",
                r#"{"call_id":"call_1","turn_id":"t","started_at_ms":1,"changes":{"/r/b.txt":{"type":"add","content":"bee\n"},"/r/c.txt":{"type":"update","unified_diff":"@@ -1 +1 @@","move_path":"/etc/cron.d/x"},"/r/d.txt":{"type":"delete","content":""}}}"#.into(),
                paths(&["/r/b.txt", "/r/c.txt", "/etc/cron.d/x", "/r/d.txt"]),
                vec![],
            ),
            (
                // codex-acp 0.16.0's exec approval: argv, cwd, and Codex's own proposals.
                "codex-acp 0.16.0 exec approval",
                r#"{"call_id":"c","command":["/bin/bash","-lc","echo hi > /tmp/x"],"cwd":"/r","proposed_execpolicy_amendment":["/bin/bash","-lc","echo hi > /tmp/x"],"available_decisions":["approved",{"approved_execpolicy_amendment":{"proposed_execpolicy_amendment":["/bin/bash"]}},"abort"],"parsed_cmd":[{"type":"unknown","cmd":"echo hi > /tmp/x"}]}"#.into(),
                vec![],
                paths(&["/r"]),
            ),
            (
                // codex-acp 2.6.0's exec approval: the command as one string.
                "codex-acp 2.6.0 exec approval",
                r#"{"command":"echo hi > /r/b.txt","cwd":"/r"}"#.into(),
                vec![],
                paths(&["/r"]),
            ),
            (
                "changes as a list",
                r#"{"changes":[{"path":"/r/a","kind":"add"},{"path":"/r/b","move_path":"/r/c"}]}"#.into(),
                paths(&["/r/a", "/r/b", "/r/c"]),
                vec![],
            ),
            (
                "apply_patch heredoc through bash",
                bash_patch,
                paths(&["new.txt", "src/lib.rs", "/etc/cron.d/x", "old.txt"]),
                paths(&["/work/root/sub"]),
            ),
            (
                "apply_patch argv",
                argv_patch,
                paths(&["new.txt", "src/lib.rs", "/etc/cron.d/x", "old.txt"]),
                vec![],
            ),
            (
                "patch field",
                serde_json::json!({ "patch": patch }).to_string(),
                paths(&["new.txt", "src/lib.rs", "/etc/cron.d/x", "old.txt"]),
                vec![],
            ),
            (
                // Header-like lines in text that is not a patch, or in file content, name nothing.
                "not a patch",
                r#"{"command":"echo '*** Add File: /etc/x'","content":"*** Begin Patch\n*** Add File: /etc/y"}"#.into(),
                vec![],
                vec![],
            ),
            ("a JSON string", r#""just text""#.into(), vec![], vec![]),
            ("null fields", r#"{"file_path":null,"cwd":null}"#.into(), vec![], vec![]),
        ];
        for (name, raw, changed, cwds) in cases {
            let got = extract(&raw).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut want_changed = changed.clone();
            let mut got_changed = got.changed.clone();
            want_changed.sort();
            got_changed.sort();
            assert_eq!(got_changed, want_changed, "{name}");
            assert_eq!(got.cwds, cwds, "{name}");
        }
    }

    #[test]
    fn unreadable_raw_input_is_an_error_not_nothing() {
        for (raw, want) in [
            ("{\"file_path\": \"/etc/passwd\"", "not valid JSON"),
            ("file_path=/etc/passwd", "not valid JSON"),
            (
                r#"{"file_path":["/etc/passwd"]}"#,
                "\"file_path\" is not a string",
            ),
            (
                r#"{"notebook_path":7}"#,
                "\"notebook_path\" is not a string",
            ),
            (r#"{"cwd":{"path":"/"}}"#, "\"cwd\" is not a string"),
            (r#"{"changes":"/etc/passwd"}"#, "\"changes\" is not"),
            (r#"{"changes":[{"kind":"add"}]}"#, "\"changes\" is not"),
            (
                r#"{"changes":{"/r/a":{"update":{"move_path":1}}}}"#,
                "\"move_path\" is not a string",
            ),
        ] {
            match extract(raw) {
                Err(e) => assert!(e.to_string().contains(want), "{raw}: {e}"),
                Ok(p) => panic!("{raw} read as {p:?}"),
            }
        }
    }

    #[test]
    fn opencodes_external_directory_names_the_places_it_reaches() {
        let file = extract(r#"{"filepath":"/srv/other/a.txt","parentDir":"/srv/other"}"#).unwrap();
        assert_eq!(file.reached, paths(&["/srv/other/a.txt", "/srv/other"]));
        assert!(file.changed.is_empty() && file.cwds.is_empty());
        let cmd = extract(
            r#"{"command":"ls /srv/x /srv/y","directories":["/srv/x","/srv/y"],"patterns":["/srv/x/*"]}"#,
        )
        .unwrap();
        assert_eq!(cmd.reached, paths(&["/srv/x", "/srv/y"]));
        assert!(!cmd.is_empty());
        // A shape it cannot read is an error, never "names nothing".
        assert!(extract(r#"{"directories":"/srv/x"}"#).is_err());
        assert!(extract(r#"{"filepath":7}"#).is_err());
    }
}
