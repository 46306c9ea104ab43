//! The change as a first-class result (issue 39): a task whose turn changed files under its root
//! ends with the conversation's diff of that root, computed by the supervisor from the root's
//! contents, as a `text/x-diff` file artifact. Read here by a plain JSON-RPC caller and by the
//! official Python a2a-sdk (1.x) over JSON-RPC, HTTP+JSON and gRPC; the diff grows across the
//! turns of one context; a turn that changed nothing has none; and the symbolic links a hostile
//! agent plants in its root are shown as links, never followed (the file they point at never
//! appears in the diff).

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use warden_e2e::{Deployment, Options, run_with_deadline};

async fn rpc(d: &Deployment, method: &str, params: Value) -> Value {
    let r = d
        .a2a_rpc(&d.token(), method, params)
        .await
        .unwrap_or_else(|e| panic!("{method}: {e}"));
    r.get("result")
        .cloned()
        .unwrap_or_else(|| panic!("{method}: {r}"))
}

async fn send(d: &Deployment, ctx: &str, id: &str, text: &str) -> Value {
    let r = rpc(
        d,
        "SendMessage",
        json!({"message": {"messageId": id, "contextId": ctx, "role": "ROLE_USER",
                           "parts": [{"text": text}]}}),
    )
    .await;
    let task = r["task"].clone();
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    task
}

/// The task's diff artifacts: (artifact, decoded text).
fn diffs(task: &Value) -> Vec<(Value, String)> {
    task["artifacts"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|a| a["parts"][0]["mediaType"] == "text/x-diff")
        .map(|a| {
            let raw = a["parts"][0]["raw"].as_str().expect("a raw file part");
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(raw)
                .expect("base64");
            (a.clone(), String::from_utf8(bytes).expect("utf-8"))
        })
        .collect()
}

fn the_diff(task: &Value) -> (Value, String) {
    let mut d = diffs(task);
    assert_eq!(d.len(), 1, "one diff artifact: {task}");
    d.remove(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_that_changed_files_ends_with_its_diff_and_links_are_never_followed() {
    let d = Deployment::up(Options::default()).await;
    // A host file the agent could name by a link: never read into a diff.
    let secret_dir = d.dir.path().join("host");
    std::fs::create_dir(&secret_dir).unwrap();
    let secret = secret_dir.join("secret.txt");
    std::fs::write(&secret, "TOPSECRET-HOST-CONTENT\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    }

    let first = json!({"steps": [
        {"type": "tool", "kind": "edit", "path": "hello.txt", "content": "hello\n"},
        {"type": "tool", "kind": "execute", "command": format!(
            "mkdir -p src && printf 'a\\nb\\n' > src/lib.txt && ln -s {} evil && ln -s {} evildir",
            secret.display(), secret_dir.display())},
        {"type": "message", "text": "done"}]});
    let task = send(&d, "ctx-diff", "m1", &first.to_string()).await;
    let id = task["id"].as_str().unwrap();
    let (art, text) = the_diff(&task);
    assert_eq!(art["artifactId"], format!("{id}.diff"), "{art}");
    assert_eq!(art["name"], "changes.diff");
    assert_eq!(art["parts"][0]["filename"], "changes.diff");
    assert_eq!(
        art["metadata"]["warden"]["files"],
        json!(["evil", "evildir", "hello.txt", "src/lib.txt"]),
        "{art}"
    );
    assert!(
        text.contains(&format!(
            "diff --git a/hello.txt b/hello.txt\nnew file mode 100644\n{}--- /dev/null\n+++ b/hello.txt\n@@ -0,0 +1 @@\n+hello\n",
            warden_e2e::new_file_index(b"hello\n")
        )),
        "{text}"
    );
    assert!(
        text.contains("+++ b/src/lib.txt\n@@ -0,0 +1,2 @@\n+a\n+b\n"),
        "{text}"
    );
    // The links are links: their targets as text, never what they point at.
    assert!(
        text.contains(&format!(
            "diff --git a/evil b/evil\nnew file mode 120000\n{}--- /dev/null\n+++ b/evil\n@@ -0,0 +1 @@\n+{}\n\\ No newline at end of file\n",
            warden_e2e::new_file_index(secret.display().to_string().as_bytes()),
            secret.display()
        )),
        "{text}"
    );
    assert!(!text.contains("TOPSECRET"), "a link was followed: {text}");
    assert!(!text.contains("evildir/"), "a link was entered: {text}");
    // The final status says where the diff is.
    let meta = &task["status"]["message"]["metadata"]["warden"];
    assert_eq!(meta["diff"]["artifactId"], format!("{id}.diff"), "{task}");

    // The same context's next turn: the diff grows (the baseline is the first turn's root).
    let task2 = send(
        &d,
        "ctx-diff",
        "m2",
        &json!({"steps": [
            {"type": "tool", "kind": "edit", "path": "hello.txt", "content": "hello again\n"},
            {"type": "message", "text": "done"}]})
        .to_string(),
    )
    .await;
    let (art2, text2) = the_diff(&task2);
    assert_eq!(
        art2["metadata"]["warden"]["files"],
        json!(["evil", "evildir", "hello.txt", "src/lib.txt"])
    );
    assert!(text2.contains("@@ -0,0 +1 @@\n+hello again\n"), "{text2}");
    assert!(text2.contains("+b\n"), "{text2}");

    // A turn that changed nothing has no diff.
    let task3 = send(
        &d,
        "ctx-diff",
        "m3",
        &json!({"steps": [{"type": "message", "text": "just talking"}]}).to_string(),
    )
    .await;
    assert!(diffs(&task3).is_empty(), "{task3}");

    // Read back later, the artifact is the same.
    let got = rpc(&d, "GetTask", json!({"id": id})).await;
    assert_eq!(the_diff(&got).1, text);
}

fn python() -> String {
    std::env::var("WARDEN_PYTHON").unwrap_or_else(|_| "python3".into())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_a2a_sdk_gets_the_diff_artifact_on_every_binding() {
    let ok = std::process::Command::new(python())
        .args(["-c", "import a2a.client, a2a.types, httpx, grpc"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "the A2A Python SDK is not importable: `pip install 'a2a-sdk[grpc]==1.3.0'` (.ci/requirements.txt)"
    );
    let grpc = format!("127.0.0.1:{}", warden_e2e::free_port());
    let d = Deployment::up(Options {
        sets: vec![
            ("gateway".into(), format!("grpc.tcp={grpc}")),
            ("gateway".into(), "grpc.allow_any_peer=true".into()),
        ],
        ..Options::default()
    })
    .await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("a2a/diff_client.py");
    for binding in ["JSONRPC", "HTTP+JSON", "GRPC"] {
        let name = format!("sdk-{}.txt", binding.replace('+', "-").to_lowercase());
        let mut cmd = tokio::process::Command::new(python());
        cmd.arg(&script)
            .arg(format!("http://{}", d.http))
            .arg(d.token())
            .arg(binding)
            .arg(format!("write {name} with from the sdk"));
        let out = run_with_deadline(&mut cmd, Duration::from_secs(120))
            .await
            .expect("the SDK client runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{binding}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        assert_eq!(lines.len(), 3, "{stdout}");
        let expected = format!(
            "diff --git a/{name} b/{name}\nnew file mode 100644\n{}--- /dev/null\n+++ b/{name}\n@@ -0,0 +1 @@\n+from the sdk\n",
            warden_e2e::new_file_index(b"from the sdk\n")
        );
        for l in &lines {
            let diffs = l["diffs"].as_array().expect("diffs");
            assert_eq!(diffs.len(), 1, "{binding} {}: {l}", l["how"]);
            let a = &diffs[0];
            assert_eq!(a["raw"], expected, "{binding} {}: {l}", l["how"]);
            assert_eq!(a["mediaType"], "text/x-diff");
            assert_eq!(a["filename"], "changes.diff");
            assert_eq!(a["files"], json!([name]));
            assert_eq!(
                a["artifactId"],
                format!("{}.diff", l["taskId"].as_str().unwrap())
            );
        }
        // What the SDK read is what a plain JSON-RPC caller reads.
        let task = rpc(&d, "GetTask", json!({"id": lines[0]["taskId"]})).await;
        assert_eq!(the_diff(&task).1, expected);
    }
}
