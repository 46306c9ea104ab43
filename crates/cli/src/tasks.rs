//! `warden tasks list|show|diff|apply`: the caller's own tasks, read from the running gateway
//! over A2A JSON-RPC (`ListTasks`, `GetTask`) with the caller's token, ids taken by unique
//! prefix. `diff` prints a task's diff artifact (the conversation's change to its root, computed
//! by the supervisor); `apply` hands it to `git apply --3way` in a directory.
//!
//! Must never: run a hook or a command the agent or the directory's `.git/config` could name
//! (git runs with a scratch repository of warden's own, `git_apply.rs`; the diff never holds a
//! `.git` path); change a directory when the diff does not apply cleanly (checked first,
//! nothing written).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use base64::Engine;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use warden_cli::client::{self, ClientError};
use warden_cli::git_apply;
use warden_cli::layout::Layout;
use warden_cli::output;

/// The media type of a task's diff artifact (the gateway's `mapping::DIFF_MEDIA_TYPE`).
pub const DIFF_MEDIA_TYPE: &str = "text/x-diff";
/// Tasks read at most when a prefix is resolved or the list shown (pages of 100).
const LIST_MAX: usize = 1000;

#[derive(Debug, thiserror::Error)]
pub enum TasksError {
    #[error(transparent)]
    Locate(#[from] client::LocateError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the gateway refused {method}: {message}")]
    Refused { method: String, message: String },
    #[error("no task of yours has an id starting with {0:?} (`warden tasks list` shows them)")]
    NoSuchTask(String),
    #[error("{prefix:?} names more than one task: {}; give more of the id", .ids.join(", "))]
    Ambiguous { prefix: String, ids: Vec<String> },
    #[error(
        "no context of yours has an id starting with {0:?} (`warden contexts list` shows them)"
    )]
    NoSuchContext(String),
    #[error("{prefix:?} names more than one context: {}; give more of the id", .ids.join(", "))]
    AmbiguousContext { prefix: String, ids: Vec<String> },
    #[error("task {0} changed no file: it has no diff")]
    NoDiff(String),
    #[error("the diff of task {0} is not base64 text (the gateway sent something else)")]
    BadDiff(String),
    #[error("the diff of task {id} was cut at its size cap; applying part of a change is refused (files: {})", .files.join(", "))]
    Cut { id: String, files: Vec<String> },
    #[error("{0} is not a directory")]
    NotADir(String),
    #[error(transparent)]
    Git(#[from] git_apply::GitApplyError),
    #[error(
        "the change of task {id} does not apply cleanly in {dir}, so nothing was changed:\n{why}\nCommit or stash your own changes to those files, or read the change with `warden tasks diff {id}`"
    )]
    DoesNotApply {
        id: String,
        dir: String,
        why: String,
    },
    #[error("git apply failed in {dir}: {why}")]
    ApplyFailed { dir: String, why: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Where the gateway is, and the caller's token.
pub struct Gateway {
    pub addr: String,
    pub token: String,
}

impl Gateway {
    /// The gateway `warden up` wrote (or `url`), with the token `warden up` generated (or the
    /// one in `token_file`).
    pub fn locate(
        layout: &Layout,
        url: Option<&str>,
        token_file: Option<&Path>,
    ) -> Result<Self, TasksError> {
        let (addr, token) = client::locate(layout, url, token_file)?;
        Ok(Gateway { addr, token })
    }

    /// One A2A JSON-RPC call: its `result`, or the gateway's error as [`TasksError::Refused`].
    async fn rpc(&self, method: &str, params: Value) -> Result<Value, TasksError> {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let resp = client::request(
            &self.addr,
            Method::POST,
            "/a2a/jsonrpc",
            &self.token,
            Some(&body),
        )
        .await?;
        let status = resp.status();
        let (v, text) = client::read_answer(resp).await?;
        if let Some(r) = v.get("result") {
            return Ok(r.clone());
        }
        let message = v["error"]["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| {
                if status == StatusCode::OK {
                    text
                } else {
                    format!("HTTP {status}: {text}")
                }
            });
        Err(TasksError::Refused {
            method: method.into(),
            message,
        })
    }

    /// The caller's tasks, newest first (at most [`LIST_MAX`]), without artifacts.
    pub async fn list(&self, context: Option<&str>) -> Result<Vec<Value>, TasksError> {
        let mut out = Vec::new();
        let mut page = String::new();
        loop {
            let mut params = json!({"pageSize": 100, "historyLength": 1});
            if !page.is_empty() {
                params["pageToken"] = json!(page);
            }
            if let Some(c) = context {
                params["contextId"] = json!(c);
            }
            let r = self.rpc("ListTasks", params).await?;
            out.extend(r["tasks"].as_array().cloned().unwrap_or_default());
            page = r["nextPageToken"].as_str().unwrap_or("").to_string();
            if page.is_empty() || out.len() >= LIST_MAX {
                return Ok(out);
            }
        }
    }

    /// The task `prefix` names: its whole id, or the one id of the caller's that starts with it.
    pub async fn task(&self, prefix: &str) -> Result<Value, TasksError> {
        if let Ok(t) = self.rpc("GetTask", json!({"id": prefix})).await {
            return Ok(t);
        }
        let ids: Vec<String> = self
            .list(None)
            .await?
            .iter()
            .filter_map(|t| t["id"].as_str())
            .filter(|id| id.starts_with(prefix))
            .map(str::to_string)
            .collect();
        match ids.as_slice() {
            [] => Err(TasksError::NoSuchTask(prefix.into())),
            [one] => self.rpc("GetTask", json!({"id": one})).await,
            _ => Err(TasksError::Ambiguous {
                prefix: prefix.into(),
                ids,
            }),
        }
    }
}

impl Gateway {
    /// The context `prefix` names among the caller's tasks' contexts: its whole id, or the one
    /// that starts with it.
    pub async fn context(&self, prefix: &str) -> Result<String, TasksError> {
        let mut ids: Vec<String> = self
            .list(None)
            .await?
            .iter()
            .filter_map(|t| t["contextId"].as_str())
            .filter(|c| c.starts_with(prefix))
            .map(str::to_string)
            .collect();
        ids.sort();
        ids.dedup();
        if ids.iter().any(|c| c == prefix) {
            return Ok(prefix.to_string());
        }
        match ids.as_slice() {
            [] => Err(TasksError::NoSuchContext(prefix.into())),
            [one] => Ok(one.clone()),
            _ => Err(TasksError::AmbiguousContext {
                prefix: prefix.into(),
                ids,
            }),
        }
    }
}

/// `warden contexts close ID`: the conversation ended at the gateway and its supervisor, its
/// root (a `send -C` copy) removed; the next message in the context starts afresh.
pub async fn close_context(gw: &Gateway, prefix: &str, json_out: bool) -> Result<(), TasksError> {
    let ctx = gw.context(prefix).await?;
    let r = gw
        .rpc("warden.CloseContext", json!({"contextId": ctx}))
        .await?;
    if json_out {
        println!(
            "{}",
            json!({"contextId": ctx, "closed": r["closed"].as_bool().unwrap_or(false)})
        );
    } else {
        println!(
            "closed context {} (its conversation ended, its copy removed)",
            warden_terminal_text::inline(&ctx)
        );
    }
    Ok(())
}

/// A task's diff: its text, the files it is about, whether it was cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskDiff {
    pub text: String,
    pub files: Vec<String>,
    pub cut: bool,
}

/// The diff artifact of `task` (the last one, when there are several), decoded.
pub fn diff_of(task: &Value) -> Result<Option<TaskDiff>, TasksError> {
    let id = task["id"].as_str().unwrap_or("");
    match task["artifacts"]
        .as_array()
        .into_iter()
        .flatten()
        .rfind(|a| is_diff(a))
    {
        Some(art) => decode(id, art).map(Some),
        None => Ok(None),
    }
}

/// Whether an artifact is a task's diff.
pub fn is_diff(art: &Value) -> bool {
    art["parts"][0]["mediaType"] == DIFF_MEDIA_TYPE
}

/// A diff artifact of task `id`, decoded.
pub fn decode(id: &str, art: &Value) -> Result<TaskDiff, TasksError> {
    let id = id.to_string();
    let raw = art["parts"][0]["raw"]
        .as_str()
        .ok_or_else(|| TasksError::BadDiff(id.clone()))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(raw)
        .map_err(|_| TasksError::BadDiff(id.clone()))?;
    let text = String::from_utf8(bytes).map_err(|_| TasksError::BadDiff(id.clone()))?;
    let meta = &art["metadata"]["warden"];
    Ok(TaskDiff {
        text,
        files: meta["files"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        cut: meta["cut"].as_bool().unwrap_or(false),
    })
}

/// Where `send` and `tasks diff` keep a task's diff for the person (and for `git apply`).
pub fn diff_path(layout: &Layout, task_id: &str) -> PathBuf {
    // A task id is the gateway's (a UUID); anything else is made safe for a file name.
    let safe: String = task_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    layout
        .root
        .join("cli")
        .join("diffs")
        .join(format!("{safe}.diff"))
}

/// Writes `text` as the task's diff file (private to the user) and returns its path.
pub fn save_diff(layout: &Layout, task_id: &str, text: &str) -> Result<PathBuf, TasksError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let path = diff_path(layout, task_id);
    let err = |source| TasksError::Write {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
    }
    let tmp = path.with_extension("diff.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)?;
    Ok(path)
}

pub fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

fn state(t: &Value) -> String {
    t["status"]["state"]
        .as_str()
        .unwrap_or("")
        .trim_start_matches("TASK_STATE_")
        .to_ascii_lowercase()
}

/// The first text the caller sent (the task's first history message), on one line.
fn asked(t: &Value) -> String {
    let text = t["history"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["role"] == "ROLE_USER")
        .and_then(|m| m["parts"][0]["text"].as_str())
        .unwrap_or("");
    let one: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let shown = warden_terminal_text::inline(&one).into_owned();
    if shown.chars().count() > 60 {
        format!("{}…", shown.chars().take(59).collect::<String>())
    } else {
        shown
    }
}

/// `warden tasks list`.
pub async fn list(gw: &Gateway, context: Option<&str>, json_out: bool) -> Result<(), TasksError> {
    let tasks = gw.list(context).await?;
    if json_out {
        let rows: Vec<Value> = tasks
            .iter()
            .map(|t| {
                json!({"taskId": t["id"], "contextId": t["contextId"], "state": t["status"]["state"],
                       "timestamp": t["status"]["timestamp"]})
            })
            .collect();
        println!("{}", json!({"tasks": rows}));
        return Ok(());
    }
    if tasks.is_empty() {
        println!("no tasks");
        return Ok(());
    }
    println!("{:<10} {:<10} {:<15} ASKED", "TASK", "CONTEXT", "STATE");
    for t in &tasks {
        println!(
            "{:<10} {:<10} {:<15} {}",
            short(t["id"].as_str().unwrap_or("")),
            short(t["contextId"].as_str().unwrap_or("")),
            state(t),
            asked(t)
        );
    }
    Ok(())
}

/// `warden contexts list`: the contexts (conversations) of the caller's tasks, newest first,
/// with how many tasks each holds and the newest one's state.
pub async fn contexts(gw: &Gateway, json_out: bool) -> Result<(), TasksError> {
    let tasks = gw.list(None).await?;
    // Tasks come newest first: a context's first task seen is its newest.
    let mut order: Vec<String> = Vec::new();
    let mut rows: std::collections::HashMap<String, (usize, Value)> = Default::default();
    for t in &tasks {
        let ctx = t["contextId"].as_str().unwrap_or("").to_string();
        match rows.get_mut(&ctx) {
            Some(r) => r.0 += 1,
            None => {
                order.push(ctx.clone());
                rows.insert(ctx, (1, t.clone()));
            }
        }
    }
    if json_out {
        let out: Vec<Value> = order
            .iter()
            .filter_map(|c| rows.get(c).map(|r| (c, r)))
            .map(|(c, (n, t))| {
                json!({"contextId": c, "tasks": n, "lastTaskId": t["id"],
                       "lastState": t["status"]["state"], "timestamp": t["status"]["timestamp"]})
            })
            .collect();
        println!("{}", json!({"contexts": out}));
        return Ok(());
    }
    if order.is_empty() {
        println!("no contexts");
        return Ok(());
    }
    println!(
        "{:<38} {:>5} {:<10} {:<15}",
        "CONTEXT", "TASKS", "LAST", "STATE"
    );
    for c in &order {
        if let Some((n, t)) = rows.get(c) {
            println!(
                "{:<38} {:>5} {:<10} {:<15}",
                warden_terminal_text::inline(c),
                n,
                short(t["id"].as_str().unwrap_or("")),
                state(t)
            );
        }
    }
    Ok(())
}

/// `warden tasks show ID`.
pub async fn show(gw: &Gateway, prefix: &str, json_out: bool) -> Result<(), TasksError> {
    let t = gw.task(prefix).await?;
    let diff = diff_of(&t)?;
    let status_text = t["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_string();
    if json_out {
        println!(
            "{}",
            json!({"taskId": t["id"], "contextId": t["contextId"], "state": t["status"]["state"],
                   "timestamp": t["status"]["timestamp"], "status": status_text,
                   "diff": diff.as_ref().map(|d| json!({"files": d.files, "cut": d.cut}))})
        );
        return Ok(());
    }
    println!("task     {}", t["id"].as_str().unwrap_or(""));
    println!("context  {}", t["contextId"].as_str().unwrap_or(""));
    println!("state    {}", state(&t));
    println!("asked    {}", asked(&t));
    if !status_text.is_empty() {
        println!(
            "status   {}",
            warden_terminal_text::block(&status_text).replace('\n', "\n         ")
        );
    }
    match diff {
        Some(d) => println!(
            "changed  {}{}  (`warden tasks diff {}`)",
            d.files.join(", "),
            if d.cut {
                " (the diff was cut at its cap)"
            } else {
                ""
            },
            short(t["id"].as_str().unwrap_or(""))
        ),
        None => println!("changed  nothing"),
    }
    Ok(())
}

/// `warden tasks diff ID`: the diff, exactly as the supervisor made it, on stdout.
pub async fn diff(
    gw: &Gateway,
    layout: &Layout,
    prefix: &str,
    json_out: bool,
) -> Result<(), TasksError> {
    let t = gw.task(prefix).await?;
    let id = t["id"].as_str().unwrap_or("").to_string();
    let d = diff_of(&t)?.ok_or_else(|| TasksError::NoDiff(id.clone()))?;
    let path = save_diff(layout, &id, &d.text)?;
    if json_out {
        println!(
            "{}",
            json!({"taskId": id, "files": d.files, "cut": d.cut, "path": path.display().to_string(), "diff": d.text})
        );
    } else {
        use std::io::Write;
        let _ = std::io::stdout().write_all(d.text.as_bytes());
    }
    Ok(())
}

/// `warden tasks apply ID [-C DIR]`: the task's diff applied in DIR's files as they are (`git
/// apply`), or, where they changed since, merged (`git apply --3way`, in a repository), after a
/// check that it applies cleanly.
pub async fn apply(
    gw: &Gateway,
    layout: &Layout,
    prefix: &str,
    dir: &Path,
    json_out: bool,
) -> Result<(), TasksError> {
    let meta =
        std::fs::metadata(dir).map_err(|_| TasksError::NotADir(dir.display().to_string()))?;
    if !meta.is_dir() {
        return Err(TasksError::NotADir(dir.display().to_string()));
    }
    let t = gw.task(prefix).await?;
    let id = t["id"].as_str().unwrap_or("").to_string();
    let d = diff_of(&t)?.ok_or_else(|| TasksError::NoDiff(id.clone()))?;
    if d.cut {
        return Err(TasksError::Cut { id, files: d.files });
    }
    let path = save_diff(layout, &id, &d.text)?;
    let patch = path.display().to_string();
    // git with a repository of warden's own: nothing DIR's .git/config names ever runs.
    let scratch = git_apply::Scratch::new(&layout.root.join("cli"), dir)?;
    // Onto the files as they are (the copy was made of them, uncommitted changes and all);
    // where they moved on since, a three-way merge with DIR's repository's blobs; else nothing
    // changes.
    let plain = scratch.apply(&path, false, true)?;
    let three_way = if plain.status.success() {
        false
    } else {
        let merged = if scratch.has_objects {
            scratch.index_paths(&d.files)?;
            Some(scratch.apply(&path, true, true)?)
        } else {
            None
        };
        match merged {
            // --3way --check names a conflict it would leave on stderr ("with conflicts").
            Some(m)
                if m.status.success()
                    && !String::from_utf8_lossy(&m.stderr).contains("with conflicts") =>
            {
                true
            }
            m => {
                let why = m.as_ref().unwrap_or(&plain);
                return Err(TasksError::DoesNotApply {
                    id,
                    dir: dir.display().to_string(),
                    why: String::from_utf8_lossy(&why.stderr).trim().to_string(),
                });
            }
        }
    };
    let out = scratch.apply(&path, three_way, false)?;
    if !out.status.success() {
        return Err(TasksError::ApplyFailed {
            dir: dir.display().to_string(),
            why: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    if json_out {
        println!(
            "{}",
            json!({"taskId": id, "applied": true, "dir": dir.display().to_string(), "files": d.files, "path": patch})
        );
    } else {
        println!(
            "applied task {} in {}: {}",
            short(&id),
            dir.display(),
            d.files.join(", ")
        );
    }
    Ok(())
}

/// The exit of a `tasks` command: 0 done, 3 no such task or no diff, 1 otherwise.
pub fn finish(what: &str, r: Result<(), TasksError>, json_out: bool) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = match e {
                TasksError::NoSuchTask(_)
                | TasksError::NoSuchContext(_)
                | TasksError::NoDiff(_) => 3,
                _ => 1,
            };
            if json_out {
                output::print_line(&json!({"error": e.to_string(), "exitCode": code}));
            }
            eprintln!("warden {what}: {e}");
            ExitCode::from(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diff_artifact_is_decoded_with_its_files() {
        let text = "diff --git a/a b/a\n";
        let raw = base64::engine::general_purpose::STANDARD.encode(text);
        let task = json!({"id": "t1", "artifacts": [
            {"artifactId": "t1-answer", "parts": [{"text": "hi"}]},
            {"artifactId": "t1.diff", "parts": [{"raw": raw, "mediaType": "text/x-diff", "filename": "changes.diff"}],
             "metadata": {"warden": {"files": ["a"], "cut": false}}}]});
        assert_eq!(
            diff_of(&task).unwrap(),
            Some(TaskDiff {
                text: text.into(),
                files: vec!["a".into()],
                cut: false
            })
        );
        assert_eq!(
            diff_of(&json!({"id": "t2", "artifacts": []})).unwrap(),
            None
        );
        let bad = json!({"id": "t3", "artifacts": [{"parts": [{"raw": "%%", "mediaType": "text/x-diff"}]}]});
        assert!(matches!(diff_of(&bad), Err(TasksError::BadDiff(_))));
    }

    #[test]
    fn a_diff_file_name_never_leaves_its_directory() {
        let l = Layout::new("/s");
        assert_eq!(
            diff_path(&l, "../../etc/x"),
            PathBuf::from("/s/cli/diffs/______etc_x.diff")
        );
    }
}
