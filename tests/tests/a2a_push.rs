//! A2A push notifications through the real daemons: a local webhook receiver (loopback, allowed
//! explicitly with `push.allowed_networks`) gets every status change of a long task, in order,
//! with the config's token and credentials, after a refused first delivery is retried; the
//! configs are created, read, listed and deleted over JSON-RPC and HTTP+JSON and survive a gateway
//! restart; the delivery counters show in the gateway's admin status (what `warden status`
//! prints). And with the default allowlist every webhook into the host — loopback, private,
//! link-local, cloud metadata, IPv4-mapped IPv6, and a host name that resolves to loopback — is
//! refused before anything is sent, on every binding.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warden_e2e::{Deployment, Options};

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Hook {
    head: String,
    body: Value,
}

/// A minimal HTTP/1.1 webhook receiver: answers the first `fail_first` requests 503, then 200.
struct Receiver {
    addr: String,
    got: Arc<Mutex<Vec<Hook>>>,
    refused: Arc<Mutex<usize>>,
}

impl Receiver {
    async fn start(fail_first: usize) -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let got = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(Mutex::new(0usize));
        let (g, r) = (got.clone(), refused.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = l.accept().await else {
                    return;
                };
                let (g, r) = (g.clone(), r.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 8192];
                    let (head, len) = loop {
                        let Ok(n) = sock.read(&mut tmp).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&tmp[..n]);
                        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..p]).to_string();
                            buf.drain(..p + 4);
                            let len = head
                                .lines()
                                .find_map(|l| {
                                    let (k, v) = l.split_once(':')?;
                                    k.eq_ignore_ascii_case("content-length")
                                        .then(|| v.trim().parse::<usize>().ok())?
                                })
                                .unwrap_or(0);
                            break (head, len);
                        }
                    };
                    while buf.len() < len {
                        let Ok(n) = sock.read(&mut tmp).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&tmp[..n]);
                    }
                    let fail = {
                        let mut r = r.lock().unwrap();
                        if *r < fail_first {
                            *r += 1;
                            true
                        } else {
                            false
                        }
                    };
                    let status = if fail {
                        "503 Service Unavailable"
                    } else {
                        g.lock().unwrap().push(Hook {
                            head,
                            body: serde_json::from_slice(&buf[..len]).unwrap_or(Value::Null),
                        });
                        "200 OK"
                    };
                    let _ = sock
                        .write_all(
                            format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                                .as_bytes(),
                        )
                        .await;
                });
            }
        });
        Self { addr, got, refused }
    }

    fn hooks(&self) -> Vec<Hook> {
        self.got.lock().unwrap().clone()
    }
}

async fn rpc(d: &Deployment, method: &str, params: Value) -> Value {
    let resp = warden_cli::client::request(
        &d.http,
        http::Method::POST,
        "/a2a/jsonrpc",
        &d.token(),
        Some(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})),
    )
    .await
    .expect("gateway reachable");
    warden_cli::client::read_answer(resp).await.unwrap().0
}

async fn rest(
    d: &Deployment,
    method: http::Method,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let resp = warden_cli::client::request(&d.http, method, path, &d.token(), body)
        .await
        .expect("gateway reachable");
    let status = resp.status().as_u16();
    (
        status,
        warden_cli::client::read_answer(resp).await.unwrap().0,
    )
}

async fn wait_state(d: &Deployment, id: &str, want: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let t = rpc(d, "GetTask", json!({"id": id})).await["result"].clone();
        if t["status"]["state"] == want {
            return t;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task never {want}: {t}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn message(id: &str, text: &str) -> Value {
    json!({"messageId": id, "role": "ROLE_USER", "parts": [{"text": text}]})
}

async fn admin_details(d: &Deployment) -> std::collections::HashMap<String, String> {
    use warden_proto::v1::StatusRequest;
    use warden_proto::v1::admin_service_client::AdminServiceClient;
    AdminServiceClient::new(d.channel("gateway"))
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .details
}

#[tokio::test]
async fn a_webhook_gets_every_state_change_of_a_long_task_in_order_and_configs_persist() {
    let hook = Receiver::start(1).await;
    let mut d = Deployment::up(Options {
        sets: vec![
            (
                "gateway".into(),
                r#"push.allowed_networks=["127.0.0.1/32"]"#.into(),
            ),
            ("gateway".into(), "push.retry_base_ms=100".into()),
        ],
        ..Options::default()
    })
    .await;
    // The card says so.
    let card = warden_cli::client::get_json(&d.http, "/.well-known/agent-card.json", "")
        .await
        .unwrap();
    assert_eq!(card["capabilities"]["pushNotifications"], true, "{card}");

    // A long task: works, asks a question, works again after the answer, completes.
    let scenario = json!({"steps": [
        {"type": "message", "text": "starting. "},
        {"type": "sleep", "ms": 700},
        {"type": "question", "message": "Which colour?"},
        {"type": "message", "text": "painting. "},
        {"type": "sleep", "ms": 700},
        {"type": "message", "text": "done."},
        {"type": "stop", "reason": "end_turn"}
    ]})
    .to_string();
    let url = format!("http://{}/hook/one?from=warden", hook.addr);
    let sent = rpc(
        &d,
        "SendMessage",
        json!({"message": message("push-long", &scenario),
               "configuration": {"returnImmediately": true, "taskPushNotificationConfig": {
                   "id": "first", "url": url, "token": "tok-1",
                   "authentication": {"scheme": "Bearer", "credentials": "hook-secret"}}}}),
    )
    .await;
    let task = sent["result"]["task"].clone();
    let tid = task["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{sent}"))
        .to_string();
    // The config is readable at once, with its task filled in.
    let got = rpc(
        &d,
        "GetTaskPushNotificationConfig",
        json!({"taskId": tid, "id": "first"}),
    )
    .await;
    assert_eq!(got["result"]["url"], url.as_str(), "{got}");
    assert_eq!(got["result"]["taskId"], tid.as_str(), "{got}");
    // A second config over HTTP+JSON, then deleted again: it must get nothing after that.
    let (st, second) = rest(
        &d,
        http::Method::POST,
        &format!("/a2a/rest/tasks/{tid}/pushNotificationConfigs"),
        Some(&json!({"url": format!("http://{}/hook/two", hook.addr), "token": "tok-2"})),
    )
    .await;
    assert_eq!(st, 200, "{second}");
    let second_id = second["id"].as_str().unwrap().to_string();
    let listed = rpc(
        &d,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": tid}),
    )
    .await;
    assert_eq!(
        listed["result"]["configs"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );
    let (st, _) = rest(
        &d,
        http::Method::DELETE,
        &format!("/a2a/rest/tasks/{tid}/pushNotificationConfigs/{second_id}"),
        None,
    )
    .await;
    assert_eq!(st, 200);
    let (st, gone) = rest(
        &d,
        http::Method::GET,
        &format!("/a2a/rest/tasks/{tid}/pushNotificationConfigs/{second_id}"),
        None,
    )
    .await;
    assert_eq!(st, 404, "{gone}");
    // Deleting it again is not an error (idempotent), on JSON-RPC too.
    let (st, again) = rest(
        &d,
        http::Method::DELETE,
        &format!("/a2a/rest/tasks/{tid}/pushNotificationConfigs/{second_id}"),
        None,
    )
    .await;
    assert_eq!(st, 200, "{again}");
    let again = rpc(
        &d,
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": tid, "id": second_id}),
    )
    .await;
    assert!(again.get("error").is_none(), "{again}");

    wait_state(&d, &tid, "TASK_STATE_INPUT_REQUIRED").await;
    let answered = rpc(
        &d,
        "SendMessage",
        json!({"message": {"messageId": "push-answer", "role": "ROLE_USER", "taskId": tid,
                           "parts": [{"text": "teal"}]}}),
    )
    .await;
    assert_eq!(
        answered["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{answered}"
    );

    // Every change arrives, in order, once: the first POST was answered 503 and retried.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let states = loop {
        let hooks = hook.hooks();
        let states: Vec<String> = hooks
            .iter()
            .map(|h| {
                h.body["statusUpdate"]["status"]["state"]
                    .as_str()
                    .unwrap_or("?")
                    .to_string()
            })
            .collect();
        if states.last().map(String::as_str) == Some("TASK_STATE_COMPLETED") {
            break states;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "webhook got only {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        states,
        [
            "TASK_STATE_WORKING",
            "TASK_STATE_INPUT_REQUIRED",
            "TASK_STATE_WORKING",
            "TASK_STATE_COMPLETED"
        ]
    );
    assert_eq!(*hook.refused.lock().unwrap(), 1);
    let hooks = hook.hooks();
    let mut last_ts = String::new();
    for h in &hooks {
        let head = h.head.to_ascii_lowercase();
        assert!(
            head.starts_with("post /hook/one?from=warden http/1.1"),
            "{}",
            h.head
        );
        assert!(
            head.contains("x-a2a-notification-token: tok-1"),
            "{}",
            h.head
        );
        assert!(
            head.contains("authorization: bearer hook-secret"),
            "{}",
            h.head
        );
        assert!(
            head.contains("content-type: application/a2a+json"),
            "{}",
            h.head
        );
        assert!(
            !head.contains("tok-2"),
            "a deleted config got a notification: {}",
            h.head
        );
        assert_eq!(h.body["statusUpdate"]["taskId"], tid.as_str());
        let ts = h.body["statusUpdate"]["status"]["timestamp"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(ts >= last_ts, "out of order: {ts} after {last_ts}");
        last_ts = ts;
    }
    // The operator sees the deliveries and the retry (the receiver records a POST before it
    // answers, and the gateway counts it once it has the answer: wait for the count).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let details = loop {
        let details = admin_details(&d).await;
        if details.get("push_delivered").map(String::as_str) == Some("4")
            || tokio::time::Instant::now() > deadline
        {
            break details;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        details.get("push_delivered").map(String::as_str),
        Some("4"),
        "{details:?}"
    );
    assert_eq!(
        details.get("push_retries").map(String::as_str),
        Some("1"),
        "{details:?}"
    );
    assert_eq!(
        details.get("push_failed").map(String::as_str),
        Some("0"),
        "{details:?}"
    );

    // A config that cannot be delivered is counted as failed and shown with its reason.
    let refusing = Receiver::start(usize::MAX).await;
    let fail = rpc(
        &d,
        "SendMessage",
        json!({"message": message("tck-complete-task-push", "hi"),
               "configuration": {"taskPushNotificationConfig": {
                   "url": format!("http://{}/down", refusing.addr)}}}),
    )
    .await;
    assert_eq!(
        fail["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{fail}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let details = admin_details(&d).await;
        if details.get("push_failed").map(String::as_str) == Some("2") {
            let last = details
                .get("push_last_failure")
                .cloned()
                .unwrap_or_default();
            assert!(last.contains("503"), "{last}");
            // What the operator reads in `warden status`.
            let out = tokio::process::Command::new(warden_e2e::binary("warden"))
                .arg("--state-dir")
                .arg(d.dir.path())
                .arg("status")
                .output()
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains(
                    "push notifications: 4 delivered, 9 retried, 2 failed; last failure:"
                ) && text.contains("503"),
                "{text}"
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{details:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Stored: a restarted gateway still has the config.
    let gw = d.take("gateway").unwrap();
    gw.terminate().await;
    d.start("gateway").await;
    let got = rpc(
        &d,
        "GetTaskPushNotificationConfig",
        json!({"taskId": tid, "id": "first"}),
    )
    .await;
    assert_eq!(got["result"]["token"], "tok-1", "{got}");
}

#[tokio::test]
async fn webhooks_into_the_host_are_refused_on_every_binding() {
    let hook = Receiver::start(0).await;
    let port = hook.addr.rsplit(':').next().unwrap().to_string();
    let d = Deployment::up(Options::default()).await;
    let done = rpc(
        &d,
        "SendMessage",
        json!({"message": message("tck-complete-task-ssrf", "x")}),
    )
    .await;
    let tid = done["result"]["task"]["id"].as_str().unwrap().to_string();
    let before = rpc(&d, "ListTasks", json!({})).await["result"]["totalSize"].clone();
    for url in [
        format!("http://127.0.0.1:{port}/"),
        format!("http://localhost:{port}/"),
        format!("http://[::1]:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://0.0.0.0:{port}/"),
        "http://10.0.0.1/".to_string(),
        "http://192.168.1.1/".to_string(),
        "http://172.16.0.1/".to_string(),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://[fe80::1]/".to_string(),
        "http://[fd00::1]/".to_string(),
        "http://100.64.0.1/".to_string(),
        "http://user:pw@example.com/".to_string(),
        "ftp://example.com/".to_string(),
    ] {
        // With the message that would create the task: refused, no task made.
        let r = rpc(
            &d,
            "SendMessage",
            json!({"message": message("ssrf", "hi"),
                   "configuration": {"taskPushNotificationConfig": {"url": url}}}),
        )
        .await;
        assert_eq!(r["error"]["code"], -32602, "{url}: {r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains("refused"),
            "{url}: {r}"
        );
        // On an existing task, over JSON-RPC and HTTP+JSON.
        let r = rpc(
            &d,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": tid, "url": url}),
        )
        .await;
        assert_eq!(r["error"]["code"], -32602, "{url}: {r}");
        let (st, body) = rest(
            &d,
            http::Method::POST,
            &format!("/a2a/rest/tasks/{tid}/pushNotificationConfigs"),
            Some(&json!({"url": url})),
        )
        .await;
        assert_eq!(st, 400, "{url}: {body}");
    }
    let after = rpc(&d, "ListTasks", json!({})).await["result"]["totalSize"].clone();
    assert_eq!(before, after, "a refused webhook must not create a task");
    let listed = rpc(
        &d,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": tid}),
    )
    .await;
    assert_eq!(listed["result"]["configs"], json!([]), "{listed}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        hook.hooks().is_empty(),
        "the receiver on loopback was reached"
    );
    // Someone else's (or no) task: not found, whatever the URL.
    let r = rpc(
        &d,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": "no-such-task", "url": "http://example.com/"}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32001, "{r}");
}

/// A CA and a server certificate for 127.0.0.1 made with the openssl command line; returns the
/// CA file (for `push.ca_file`) and the server's certificate chain and key.
fn make_certs(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl runs (the https webhook test makes its certificates with it)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::write(
        dir.join("leaf.ext"),
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-subj",
        "/CN=warden test CA",
        "-days",
        "2",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "leaf.key",
        "-out",
        "leaf.csr",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "leaf.ext",
        "-out",
        "leaf.pem",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("leaf.pem"),
        dir.join("leaf.key"),
    )
}

/// An https receiver: records each POST's head, answers 200.
async fn tls_receiver(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> (String, Arc<Mutex<Vec<String>>>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let (acceptor, g) = (acceptor.clone(), g.clone());
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut tmp = [0u8; 8192];
                loop {
                    let Ok(n) = s.read(&mut tmp).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&tmp[..n]);
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..p]).to_string();
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse().ok())?
                            })
                            .unwrap_or(0);
                        while buf.len() < p + 4 + len {
                            let Ok(n) = s.read(&mut tmp).await else {
                                return;
                            };
                            if n == 0 {
                                return;
                            }
                            buf.extend_from_slice(&tmp[..n]);
                        }
                        let body = String::from_utf8_lossy(&buf[p + 4..p + 4 + len]).to_string();
                        g.lock().unwrap().push(format!("{head}\n\n{body}"));
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                            .await;
                        let _ = s.shutdown().await;
                        return;
                    }
                }
            });
        }
    });
    (addr, got)
}

#[tokio::test]
async fn an_https_webhook_is_delivered_over_tls_and_an_untrusted_certificate_is_not() {
    let certs = tempfile::tempdir().unwrap();
    let (ca, leaf, key) = make_certs(certs.path());
    let (addr, got) = tls_receiver(&leaf, &key).await;
    let d = Deployment::up(Options {
        sets: vec![
            (
                "gateway".into(),
                r#"push.allowed_networks=["127.0.0.1/32"]"#.into(),
            ),
            ("gateway".into(), "push.retry_base_ms=100".into()),
            ("gateway".into(), "push.max_attempts=2".into()),
            (
                "gateway".into(),
                format!("push.ca_file={:?}", ca.display().to_string()),
            ),
        ],
        ..Options::default()
    })
    .await;
    let r = rpc(
        &d,
        "SendMessage",
        json!({"message": message("tck-complete-task-tls", "hi"),
               "configuration": {"taskPushNotificationConfig": {
                   "url": format!("https://{addr}/tls-hook"), "token": "tls-tok"}}}),
    )
    .await;
    assert_eq!(
        r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{r}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let hooks = got.lock().unwrap().clone();
        if hooks.iter().any(|h| h.contains("TASK_STATE_COMPLETED")) {
            assert!(hooks.iter().all(|h| {
                h.to_ascii_lowercase()
                    .starts_with("post /tls-hook http/1.1")
            }));
            assert!(hooks.iter().all(|h| h.contains("tls-tok")), "{hooks:?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{hooks:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The same receiver for a gateway without the CA: the certificate is not trusted, nothing
    // is delivered, and the failure says why.
    let before = got.lock().unwrap().len();
    let d2 = Deployment::up(Options {
        sets: vec![
            (
                "gateway".into(),
                r#"push.allowed_networks=["127.0.0.1/32"]"#.into(),
            ),
            ("gateway".into(), "push.retry_base_ms=100".into()),
            ("gateway".into(), "push.max_attempts=2".into()),
        ],
        ..Options::default()
    })
    .await;
    let r = rpc(
        &d2,
        "SendMessage",
        json!({"message": message("tck-complete-task-tls2", "hi"),
               "configuration": {"taskPushNotificationConfig": {"url": format!("https://{addr}/tls-hook")}}}),
    )
    .await;
    assert_eq!(
        r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{r}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let details = admin_details(&d2).await;
        if details.get("push_failed").map(String::as_str) == Some("2") {
            let last = details
                .get("push_last_failure")
                .cloned()
                .unwrap_or_default();
            assert!(last.contains("TLS"), "{last}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{details:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        got.lock().unwrap().len(),
        before,
        "an untrusted receiver got a notification"
    );
}
