//! What a decision judged, as the action it will be held to, and its digest (issue 24: a
//! decision is bound to what it judged).
//!
//! Owns: reading a tool call (kind, locations, raw input) into a [`JudgedAction`] — the kind,
//! the locations made absolute against the root, the command's argv and working directory, the
//! hash of the content the raw input carries — and the one digest of it, computed the same way by
//! the policy (it records the digest and answers with it), the approver (it shows it to a person)
//! and the supervisor (it checks an ALLOW names the digest of what it asked, then lets only the
//! matching `terminal/create` or `fs/write_text_file` through on it). Pure: no filesystem, so
//! every party computes the same digest from the same request.
//!
//! Must never: guess a command or content out of free text (only named raw-input fields count),
//! or let two different actions share a digest (the encoding is a length-safe JSON array).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::types::ToolKind;

/// The action a decision judged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JudgedAction {
    /// The ACP kind as the rules read it (`ToolKind::as_str`; unknown kinds are `other`).
    pub kind: String,
    /// The tool call's title as the agent sent it: the rules match on it (and its first word),
    /// and for an adapter whose raw input names no command (Gemini CLI's, Qwen Code's execute
    /// requests) it is the only place the command is said, so it is part of what was judged.
    pub title: String,
    /// The paths the call names (its locations and the raw input's paths), absolute against the
    /// root, sorted, each once. Lexical only: the policy resolves them when it judges, and every
    /// later open is walked again beneath the root.
    pub locations: Vec<String>,
    /// The command as argv (raw input `command` as an array, or `command`/`cmd` as one shell
    /// string); empty when the raw input names none.
    pub argv: Vec<String>,
    /// Where the command runs: the raw input's `cwd`/`workdir` made absolute, else the root when
    /// there is a command (an agent's commands start in its root); "" without a command.
    pub cwd: String,
    /// Hex SHA-256 of the whole content the call writes, when the raw input carries it
    /// (`content`, Claude's Write; or `content_sha256`, the supervisor's own write decisions);
    /// "" otherwise (an Edit's `old_string`/`new_string` is not the file's content).
    pub content_sha256: String,
}

/// The prefix of every digest (so a digest names its scheme).
pub const DIGEST_PREFIX: &str = "sha256:";

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl JudgedAction {
    /// Reads a tool call. `locations` as the agent sent them; `raw_input_json` as the request
    /// carries it (unreadable raw input names no paths, command or content here; the floor
    /// denies a mutating call whose raw input it cannot read).
    pub fn of(
        root: &Path,
        kind: &str,
        title: &str,
        locations: impl IntoIterator<Item = impl AsRef<str>>,
        raw_input_json: &str,
    ) -> Self {
        let abs = |base: &Path, p: &Path| -> String {
            if p.is_absolute() {
                p.to_string_lossy().into_owned()
            } else {
                base.join(p).to_string_lossy().into_owned()
            }
        };
        let mut locs: Vec<String> = locations
            .into_iter()
            .map(|l| abs(root, Path::new(l.as_ref())))
            .collect();
        // Parsed once for the paths and the fields below (text that is not JSON names nothing).
        let parsed: Option<Value> = if raw_input_json.trim().is_empty() {
            None
        } else {
            serde_json::from_str::<Value>(raw_input_json).ok()
        };
        let raw = parsed
            .as_ref()
            .and_then(|v| crate::raw_input::extract_value(v).ok())
            .unwrap_or_default();
        let base: PathBuf = raw
            .cwds
            .first()
            .map(|c| PathBuf::from(abs(root, c)))
            .unwrap_or_else(|| root.to_path_buf());
        locs.extend(raw.changed.iter().map(|p| abs(&base, p)));
        locs.extend(raw.reached.iter().map(|p| abs(&base, p)));
        locs.sort();
        locs.dedup();
        let obj: Map<String, Value> = parsed
            .and_then(|v| match v {
                Value::Object(o) => Some(o),
                _ => None,
            })
            .unwrap_or_default();
        let argv = command_argv(&obj);
        let cwd = match raw.cwds.first() {
            Some(c) => abs(root, c),
            None if !argv.is_empty() => root.to_string_lossy().into_owned(),
            None => String::new(),
        };
        let content_sha256 = match (obj.get("content"), obj.get("content_sha256")) {
            (Some(Value::String(c)), _) => sha256_hex(c.as_bytes()),
            (None, Some(Value::String(h)))
                if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                h.to_ascii_lowercase()
            }
            _ => String::new(),
        };
        JudgedAction {
            kind: ToolKind::parse(kind).as_str().to_string(),
            title: title.to_string(),
            locations: locs,
            argv,
            cwd,
            content_sha256,
        }
    }

    /// `sha256:<hex>` over a JSON array of every field (a fixed order and JSON's own string
    /// escaping, so no two actions encode alike).
    pub fn digest(&self) -> String {
        let enc = serde_json::json!([
            "warden.judged-action.v2",
            self.kind,
            self.title,
            self.locations,
            self.argv,
            self.cwd,
            self.content_sha256,
        ]);
        format!("{DIGEST_PREFIX}{}", sha256_hex(enc.to_string().as_bytes()))
    }
}

/// The command a raw input names: `command` as an argv array (Codex 0.16), or `command`/`cmd` as
/// one shell string (Claude's Bash, Codex 2.6, `exec_command`).
fn command_argv(obj: &Map<String, Value>) -> Vec<String> {
    for key in ["command", "cmd"] {
        match obj.get(key) {
            Some(Value::String(s)) => return vec![s.clone()],
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
                return items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect();
            }
            _ => {}
        }
    }
    Vec::new()
}

/// Whether running `run` (a terminal's command followed by its args) is what `judged` named:
/// the same argv, or — when the judged command is one shell string, as Claude's Bash and Codex
/// 2.6 name it — that string run by plain `sh -c` (a non-interactive POSIX shell reads no
/// start-up file, so it runs exactly the string). Nothing else: not another shell, not a login
/// shell (`bash -lc` reads profiles the agent may have written), not a different quoting.
pub fn command_matches(judged: &[String], run: &[String]) -> bool {
    if judged.is_empty() {
        return false;
    }
    if judged == run {
        return true;
    }
    matches!((judged, run), ([s], [sh, c, r]) if (sh == "sh" || sh == "/bin/sh") && c == "-c" && r == s)
}

/// `argv` as a shell-quoted line, for titles and records people read: each word as is when it
/// holds only characters no shell treats specially, else in single quotes.
pub fn shell_line(argv: &[String]) -> String {
    argv.iter()
        .map(|w| {
            let plain = !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_./=:,+-@%".contains(&b));
            if plain {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn claude_write_carries_its_content_hash_and_path() {
        let a = JudgedAction::of(
            Path::new("/r"),
            "edit",
            "",
            ["/r/a.txt"],
            r#"{"file_path":"/r/a.txt","content":"harmless"}"#,
        );
        assert_eq!(a.kind, "edit");
        assert_eq!(a.locations, s(&["/r/a.txt"]));
        assert_eq!(a.content_sha256, sha256_hex(b"harmless"));
        assert!(a.argv.is_empty() && a.cwd.is_empty());
        // An Edit's strings are not the file's content.
        let e = JudgedAction::of(
            Path::new("/r"),
            "edit",
            "",
            ["/r/a.txt"],
            r#"{"file_path":"/r/a.txt","old_string":"a","new_string":"b"}"#,
        );
        assert_eq!(e.content_sha256, "");
        assert_ne!(a.digest(), e.digest());
    }

    #[test]
    fn commands_are_read_as_argv_with_their_cwd() {
        let root = Path::new("/r");
        let codex = JudgedAction::of(
            root,
            "execute",
            "",
            Vec::<String>::new(),
            r#"{"command":["/bin/bash","-lc","ls"],"cwd":"sub"}"#,
        );
        assert_eq!(codex.argv, s(&["/bin/bash", "-lc", "ls"]));
        assert_eq!(codex.cwd, "/r/sub");
        let claude = JudgedAction::of(
            root,
            "execute",
            "",
            Vec::<String>::new(),
            r#"{"command":"ls -la","timeout":1}"#,
        );
        assert_eq!(claude.argv, s(&["ls -la"]));
        assert_eq!(claude.cwd, "/r", "no cwd named: the root");
        let none = JudgedAction::of(root, "execute", "", Vec::<String>::new(), "");
        assert!(none.argv.is_empty() && none.cwd.is_empty());
        assert_eq!(none.kind, "execute");
        assert_eq!(
            JudgedAction::of(root, "weird", "", Vec::<String>::new(), "").kind,
            "other"
        );
    }

    /// Issue 35: Gemini CLI's execute requests name their command only in the title; two
    /// commands judged alike in every other field still get different digests.
    #[test]
    fn the_title_is_part_of_what_was_judged() {
        let root = Path::new("/r");
        let a = JudgedAction::of(root, "execute", "echo one", Vec::<String>::new(), "");
        let b = JudgedAction::of(root, "execute", "rm -rf ~", Vec::<String>::new(), "");
        assert_eq!(a.title, "echo one");
        assert_ne!(a.digest(), b.digest());
        // OpenCode's `external_directory` request: the places it reaches are its locations.
        let ext = JudgedAction::of(
            root,
            "other",
            "external_directory",
            Vec::<String>::new(),
            r#"{"filepath":"/srv/x/a.txt","parentDir":"/srv/x"}"#,
        );
        assert_eq!(ext.locations, s(&["/srv/x", "/srv/x/a.txt"]));
    }

    #[test]
    fn every_field_changes_the_digest_and_the_encoding_is_unambiguous() {
        let base = JudgedAction {
            kind: "execute".into(),
            title: "ls".into(),
            locations: s(&["/r/a"]),
            argv: s(&["ls"]),
            cwd: "/r".into(),
            content_sha256: String::new(),
        };
        let d = base.digest();
        assert!(d.starts_with(DIGEST_PREFIX) && d.len() == DIGEST_PREFIX.len() + 64);
        let variants = [
            JudgedAction {
                kind: "edit".into(),
                ..base.clone()
            },
            JudgedAction {
                locations: s(&["/r/b"]),
                ..base.clone()
            },
            JudgedAction {
                title: "rm -rf /".into(),
                ..base.clone()
            },
            JudgedAction {
                argv: s(&["ls", ""]),
                ..base.clone()
            },
            JudgedAction {
                argv: s(&["l", "s"]),
                ..base.clone()
            },
            JudgedAction {
                cwd: "/r/".into(),
                ..base.clone()
            },
            JudgedAction {
                content_sha256: sha256_hex(b""),
                ..base.clone()
            },
        ];
        for v in variants {
            assert_ne!(v.digest(), d, "{v:?}");
        }
        assert_eq!(base.clone().digest(), d, "deterministic");
    }

    #[test]
    fn a_terminal_matches_only_the_judged_command() {
        let ls = s(&["ls"]);
        assert!(command_matches(&ls, &s(&["ls"])));
        assert!(command_matches(&ls, &s(&["sh", "-c", "ls"])));
        assert!(command_matches(
            &s(&["ls -la"]),
            &s(&["/bin/sh", "-c", "ls -la"])
        ));
        for run in [
            s(&["sh", "-c", "echo pwned > marker"]),
            s(&["bash", "-lc", "ls"]),
            s(&["sh", "-c", "ls", "extra"]),
            s(&["ls", "-la"]),
            s(&["sh", "-c", "ls;"]),
            Vec::new(),
        ] {
            assert!(!command_matches(&ls, &run), "{run:?}");
        }
        let codex = s(&["/bin/bash", "-lc", "ls"]);
        assert!(command_matches(&codex, &codex));
        assert!(!command_matches(&codex, &s(&["sh", "-c", "ls"])));
        assert!(!command_matches(&[], &[]), "nothing judged matches nothing");
    }

    #[test]
    fn shell_lines_quote_what_a_shell_would_read() {
        assert_eq!(
            shell_line(&s(&["sh", "-c", "echo pwned > marker"])),
            "sh -c 'echo pwned > marker'"
        );
        assert_eq!(shell_line(&s(&["a'b", ""])), r"'a'\''b' ''");
    }
}
