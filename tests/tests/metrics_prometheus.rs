//! Metrics as an operator gets them: the alert rules in `deploy/prometheus/` pass `promtool`
//! (syntax, and unit tests that each alert fires on its series and not on a healthy
//! deployment's); a real Prometheus server (the distribution's `prometheus`) scrapes the daemons
//! `warden up --metrics` started, and after one task its HTTP API answers with the decision
//! counters, the Decide latency histogram and the other daemons' series; every metric the Grafana
//! dashboard and the alert rules name is one the daemons export.
//!
//! Without `prometheus`/`promtool` (Debian package `prometheus`) the tests say they skipped; under
//! CI (`CI=true`) they fail instead.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use warden_e2e::{Deployment, Options, binary, free_port, run_with_deadline};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The tool on PATH; None (the test skips) when it is missing outside CI.
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{name} is not installed (Debian package `prometheus`; .ci/run installs it)");
        }
        eprintln!("SKIPPED: {name} is not installed (apt-get install prometheus)");
    }
    found
}

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let dir = deploy_dir().join("prometheus");
    for args in [
        vec!["check", "rules", "warden-alerts.yml"],
        vec!["test", "rules", "warden-alerts.test.yml"],
        vec!["check", "config", "prometheus.yml"],
    ] {
        let out = std::process::Command::new(&promtool)
            .args(&args)
            .current_dir(&dir)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "promtool {args:?}:\n{said}");
        assert!(said.contains("SUCCESS"), "promtool {args:?}:\n{said}");
    }
}

/// A base port with the three after it free too (`--metrics` uses PORT..PORT+3), all four
/// taken from `free_port`'s sequence so no later `free_port` of this test hands one out again.
fn four_free_ports() -> u16 {
    loop {
        let base = free_port();
        if base < 65_000 && (1..4).all(|i| free_port() == base + i) {
            return base;
        }
    }
}

async fn http_get(addr: &str, path_and_query: &str) -> (u16, String) {
    let resp = warden_cli::client::request(addr, http::Method::GET, path_and_query, "", None)
        .await
        .unwrap_or_else(|e| panic!("GET http://{addr}{path_and_query}: {e}"));
    let status = resp.status().as_u16();
    let (_, text) = warden_cli::client::read_answer(resp).await.unwrap();
    (status, text)
}

/// Prometheus's instant query API: the result vector.
async fn query(prom: &str, q: &str) -> Vec<Value> {
    let qs: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("query", q)
        .finish();
    let (status, text) = http_get(prom, &format!("/api/v1/query?{qs}")).await;
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    assert_eq!(status, 200, "{q}: {text}");
    assert_eq!(v["status"], "success", "{q}: {text}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// The one sample of a vector result as a number.
fn value(sample: &Value) -> f64 {
    sample["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Waits (30 s at most) until `q` has a sample whose value satisfies `ok`; returns the samples.
async fn eventually(prom: &str, q: &str, ok: impl Fn(f64) -> bool) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let r = query(prom, q).await;
        if r.iter().any(|s| ok(value(s))) {
            return r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "Prometheus never answered {q} as expected; last answer {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Metric names as scraped (`# TYPE` lines of the OpenMetrics text), with the sample names
/// each type has (`_total` for counters; `_info` for info; `_bucket`, `_sum`, `_count` for
/// histograms).
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                out.insert(format!("{name}_total"));
            }
            "info" => {
                out.insert(format!("{name}_info"));
            }
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{s}"));
                }
            }
            _ => {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// The `warden_*` metric names an expression uses.
fn names_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("warden_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

#[tokio::test]
async fn a_real_prometheus_scrapes_warden_up_and_answers_for_a_decision_and_its_latency() {
    let Some(prometheus) = tool("prometheus") else {
        return;
    };
    let d = Deployment::new(Options::default());
    let state = d.dir.path().to_string_lossy().to_string();
    let base = four_free_ports();
    let metrics = format!("127.0.0.1:{base}");

    // warden up, as a user runs it, with the approver (four daemons) and metrics on.
    let up_log = d.dir.path().join("up.log");
    let mut up = tokio::process::Command::new(binary("warden"));
    up.args([
        "--state-dir",
        &state,
        "up",
        "--http",
        &d.http,
        "--approver",
        "--approver-http",
        "",
        "--metrics",
        &metrics,
    ])
    .stdin(Stdio::null())
    .stdout(std::fs::File::create(&up_log).unwrap())
    .stderr(std::fs::File::create(d.dir.path().join("up.err")).unwrap())
    .process_group(0)
    .kill_on_drop(true);
    let mut up = up.spawn().unwrap();
    let start = Instant::now();
    let shown = loop {
        let shown = std::fs::read_to_string(&up_log).unwrap_or_default();
        if shown.contains("Try:") {
            break shown;
        }
        if let Ok(Some(s)) = up.try_wait() {
            let err = std::fs::read_to_string(d.dir.path().join("up.err")).unwrap_or_default();
            panic!("warden up exited ({s}):\n{shown}\n{err}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not up:\n{shown}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // warden up says where each daemon's metrics are.
    for (name, port) in [
        ("gateway", base),
        ("supervisor", base + 1),
        ("policy", base + 2),
        ("approver", base + 3),
    ] {
        let want = format!("http://127.0.0.1:{port}/metrics");
        assert!(
            shown
                .lines()
                .any(|l| l.contains("metrics") && l.contains(name) && l.contains(&want)),
            "warden up does not show {want} for {name}:\n{shown}"
        );
    }

    // A real Prometheus, scraping every second, with warden's alert rules loaded.
    let (mut prom, prom_addr) = start_prometheus(&prometheus, d.dir.path(), base, 4).await;
    let rules = deploy_dir().join("prometheus/warden-alerts.yml");

    // Every daemon is a target Prometheus reaches.
    let up_jobs = eventually(&prom_addr, "count(up{job=~\"warden-.*\"} == 1)", |v| {
        v == 4.0
    })
    .await;
    assert_eq!(up_jobs.len(), 1);

    // One task: a read the policy allows (the approver passes it through), and a write outside
    // the root the policy's floor denies.
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let scenario = r#"{"steps":[
        {"type":"tool","kind":"read","path":"notes.txt","ask":true},
        {"type":"tool","kind":"edit","path":"/etc/warden-e2e-metrics","content":"x","ask":true},
        {"type":"message","text":"done"}]}"#;
    let mut send = tokio::process::Command::new(binary("warden"));
    send.args(["--state-dir", &state, "send", scenario])
        .stdin(Stdio::null());
    let out = run_with_deadline(&mut send, Duration::from_secs(90))
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("[policy] ALLOW"), "{said}");
    assert!(said.contains("[policy] DENY"), "{said}");
    assert!(!Path::new("/etc/warden-e2e-metrics").exists());

    // The decision counter, by verdict, as Prometheus scraped it from warden-policy.
    let allow = eventually(
        &prom_addr,
        "sum(warden_policy_decisions_total{job=\"warden-policy\",verdict=\"allow\"})",
        |v| v >= 1.0,
    )
    .await;
    assert_eq!(allow.len(), 1);
    let denies = eventually(
        &prom_addr,
        "warden_policy_decisions_total{job=\"warden-policy\",verdict=\"deny\"}",
        |v| v >= 1.0,
    )
    .await;
    // The deny carries the rule that decided it.
    assert!(
        denies
            .iter()
            .all(|s| s["metric"]["rule"].as_str().is_some_and(|r| !r.is_empty())),
        "{denies:?}"
    );
    // The Decide latency histogram: at least the two decisions counted, and a p99 from its
    // buckets that is a real duration (above zero, below the supervisor's deadline).
    eventually(
        &prom_addr,
        "warden_policy_decide_duration_seconds_count{job=\"warden-policy\"}",
        |v| v >= 2.0,
    )
    .await;
    let p99 = eventually(
        &prom_addr,
        "histogram_quantile(0.99, sum by (le) (warden_policy_decide_duration_seconds_bucket{job=\"warden-policy\"}))",
        |v| v > 0.0 && v < 30.0,
    )
    .await;
    eprintln!("Decide p99 from Prometheus: {:?}", p99[0]["value"]);
    eventually(
        &prom_addr,
        "warden_policy_audit_commit_duration_seconds_count",
        |v| v >= 2.0,
    )
    .await;
    // The other daemons saw the same task.
    eventually(
        &prom_addr,
        "sum(warden_approver_decisions_total{job=\"warden-approver\"})",
        |v| v >= 2.0,
    )
    .await;
    eventually(
        &prom_addr,
        "sum(warden_supervisor_turns_total{job=\"warden-supervisor\",stop_reason=\"end_turn\"})",
        |v| v >= 1.0,
    )
    .await;
    eventually(
        &prom_addr,
        "warden_gateway_tasks_entered_total{job=\"warden-gateway\",state=\"TASK_STATE_COMPLETED\"}",
        |v| v >= 1.0,
    )
    .await;
    // The built-in scripted agent keeps a warm agent: the supervisor's gauges are read live.
    eventually(&prom_addr, "warden_supervisor_live_agents", |v| v >= 1.0).await;
    eventually(&prom_addr, "warden_approver_approvals_pending", |v| {
        v == 0.0
    })
    .await;

    // A write waits for a person (the demo policy escalates it): the approver shows it pending
    // and ageing, the gateway the caller's open stream, the supervisor the turn holding its slot.
    let mut waiting = tokio::process::Command::new(binary("warden"));
    waiting
        .args(["--state-dir", &state, "send", "write hello.txt"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut waiting = waiting.spawn().unwrap();
    eventually(&prom_addr, "warden_approver_approvals_pending", |v| {
        v == 1.0
    })
    .await;
    eventually(
        &prom_addr,
        "warden_approver_oldest_pending_age_seconds",
        |v| v >= 1.0,
    )
    .await;
    eventually(&prom_addr, "warden_gateway_streams_open", |v| v == 1.0).await;
    eventually(&prom_addr, "warden_supervisor_turns_running", |v| v == 1.0).await;
    // Ctrl-C: warden send cancels its task, which revokes the pending request.
    let pid = nix::unistd::Pid::from_raw(waiting.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(30), waiting.wait()).await;
    eventually(&prom_addr, "warden_approver_approvals_pending", |v| {
        v == 0.0
    })
    .await;
    eventually(
        &prom_addr,
        "warden_approver_oldest_pending_age_seconds",
        |v| v == 0.0,
    )
    .await;
    eventually(&prom_addr, "warden_gateway_streams_open", |v| v == 0.0).await;
    eventually(
        &prom_addr,
        "warden_gateway_tasks_entered_total{state=\"TASK_STATE_CANCELED\"}",
        |v| v >= 1.0,
    )
    .await;

    // Warden's alert rules are loaded in the real server and evaluate without error.
    let (_, rules_text) = http_get(&prom_addr, "/api/v1/rules").await;
    let rules_json: Value = serde_json::from_str(&rules_text).unwrap();
    let loaded: Vec<&Value> = rules_json["data"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(loaded.len(), 8, "{rules_text}");
    // An `up == 0` alert for every daemon, each with its runbook.
    for daemon in ["gateway", "supervisor", "policy", "approver"] {
        let want = format!("up{{job=\"warden-{daemon}\"}} == 0");
        let rule = loaded
            .iter()
            .find(|r| r["query"].as_str() == Some(want.as_str()))
            .unwrap_or_else(|| panic!("no {want} alert: {rules_text}"));
        assert!(
            rule["annotations"]["runbook_url"]
                .as_str()
                .is_some_and(|u| u.contains("deploy.md#")),
            "{rule}"
        );
    }
    let start = Instant::now();
    loop {
        let (_, t) = http_get(&prom_addr, "/api/v1/rules").await;
        let v: Value = serde_json::from_str(&t).unwrap();
        let rules: Vec<Value> = v["data"]["groups"][0]["rules"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if rules.iter().all(|r| r["health"] == "ok") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{t}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Every daemon says what it is and exports its process's figures.
    for q in [
        "count(warden_build_info{job=~\"warden-.*\"})",
        "count(process_resident_memory_bytes{job=~\"warden-.*\"} > 0)",
        "count(process_cpu_seconds_total{job=~\"warden-.*\"})",
        "count(process_open_fds{job=~\"warden-.*\"} > 0)",
        "count(process_start_time_seconds{job=~\"warden-.*\"} > 1e9)",
    ] {
        eventually(&prom_addr, q, |v| v == 4.0).await;
    }
    // The gateway's requests and the supervisor's turns are timed.
    eventually(
        &prom_addr,
        "sum(warden_gateway_http_request_duration_seconds_count{job=\"warden-gateway\"})",
        |v| v >= 1.0,
    )
    .await;
    eventually(
        &prom_addr,
        "warden_supervisor_turn_duration_seconds_count{job=\"warden-supervisor\"}",
        |v| v >= 1.0,
    )
    .await;
    // Histograms whose timeouts are a person's time (the approver's decide, up to an hour)
    // and a turn's have buckets past an hour: an answer after 300 s is not only `+Inf`.
    for metric in [
        "warden_approver_decide_duration_seconds_bucket",
        "warden_supervisor_turn_duration_seconds_bucket",
        "warden_gateway_http_request_duration_seconds_bucket",
    ] {
        let buckets = query(&prom_addr, metric).await;
        let top = buckets
            .iter()
            .filter_map(|b| b["metric"]["le"].as_str()?.parse::<f64>().ok())
            .filter(|le| le.is_finite())
            .fold(0.0, f64::max);
        assert!(top >= 3600.0, "{metric}: largest finite bucket {top} s");
    }

    // Every metric the dashboard and the alert rules name is exported by some daemon.
    let mut exported = BTreeSet::new();
    for port in base..base + 4 {
        let (status, text) = http_get(&format!("127.0.0.1:{port}"), "/metrics").await;
        assert_eq!(status, 200, "{text}");
        exported.extend(exported_names(&text));
    }
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy_dir().join("grafana/warden-dashboard.json")).unwrap(),
    )
    .unwrap();
    // The dashboard can be narrowed to a job and an instance, and every query follows them.
    let vars: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(
        vars.contains(&"job") && vars.contains(&"instance"),
        "{vars:?}"
    );
    let mut used = BTreeSet::new();
    let mut silent = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or("");
            used.extend(names_in(expr));
            // Each panel's query is valid PromQL to the real server (Grafana's range variable
            // stood in for), and answers with data now that the daemons were scraped.
            assert!(
                expr.contains("instance=~\"$instance\"") && expr.contains("job=~\"$job\""),
                "a panel query that ignores the job/instance variables: {expr}"
            );
            let expr_now = expr
                .replace("$__rate_interval", "1m")
                .replace("$job", "warden-.*")
                .replace("$instance", ".*");
            let answer = query(&prom_addr, &expr_now).await;
            if answer.is_empty() {
                silent.push(expr.to_string());
            }
        }
    }
    assert!(
        silent.is_empty(),
        "panel queries that answer nothing: {silent:#?}"
    );
    assert!(used.len() > 15, "{used:?}");
    used.extend(names_in(&std::fs::read_to_string(&rules).unwrap()));
    let missing: Vec<&String> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "named by the dashboard or the alert rules but exported by no daemon: {missing:?}\nexported: {exported:?}"
    );

    let _ = prom.kill().await;
    let pid = nix::unistd::Pid::from_raw(up.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(30), up.wait()).await;
}

/// Starts the distribution's Prometheus in `dir/prometheus`, scraping every second the first
/// `daemons` of gateway, supervisor, policy, approver on `base`.. (`warden up --metrics`'s
/// ports) with warden's alert rules loaded; returns it and its address once it is ready.
async fn start_prometheus(
    prometheus: &Path,
    dir: &Path,
    base: u16,
    daemons: u16,
) -> (tokio::process::Child, String) {
    let prom_dir = dir.join("prometheus");
    std::fs::create_dir_all(prom_dir.join("data")).unwrap();
    let rules = deploy_dir().join("prometheus/warden-alerts.yml");
    let jobs: String = [
        "warden-gateway",
        "warden-supervisor",
        "warden-policy",
        "warden-approver",
    ]
    .iter()
    .zip(base..)
    .take(daemons as usize)
    .map(|(job, port)| {
        format!(
            "  - job_name: {job}\n    static_configs: [{{ targets: [\"127.0.0.1:{port}\"] }}]\n"
        )
    })
    .collect();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n{jobs}",
        rules.display()
    );
    std::fs::write(prom_dir.join("prometheus.yml"), config).unwrap();
    let prom_addr = format!("127.0.0.1:{}", free_port());
    let prom_log = prom_dir.join("prometheus.log");
    let mut prom = tokio::process::Command::new(prometheus)
        .arg(format!(
            "--config.file={}",
            prom_dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            prom_dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={prom_addr}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&prom_log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if let Ok(r) =
            warden_cli::client::request(&prom_addr, http::Method::GET, "/-/ready", "", None).await
            && r.status() == 200
        {
            break;
        }
        if let Ok(Some(s)) = prom.try_wait() {
            panic!(
                "prometheus exited ({s}):\n{}",
                std::fs::read_to_string(&prom_log).unwrap_or_default()
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "prometheus not ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (prom, prom_addr)
}

#[tokio::test]
async fn a_policy_that_stops_answering_fires_the_unreachable_alert_in_a_real_prometheus() {
    let Some(prometheus) = tool("prometheus") else {
        return;
    };
    let base = four_free_ports();
    let mut d = Deployment::up(Options {
        metrics: Some(std::net::SocketAddr::from(([127, 0, 0, 1], base))),
        ..Default::default()
    })
    .await;
    let (mut prom, prom_addr) = start_prometheus(&prometheus, d.dir.path(), base, 3).await;
    eventually(&prom_addr, "count(up{job=~\"warden-.*\"} == 1)", |v| {
        v == 3.0
    })
    .await;
    // Quiet while the policy answers.
    let (_, alerts) = http_get(&prom_addr, "/api/v1/alerts").await;
    assert!(!alerts.contains("WardenPolicyUnreachable"), "{alerts}");

    d.take("policy").unwrap().terminate().await;
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();
    let state = d.dir.path().to_string_lossy().to_string();
    let mut send = tokio::process::Command::new(binary("warden"));
    send.args(["--state-dir", &state, "send", "write hello.txt"])
        .stdin(Stdio::null());
    let out = run_with_deadline(&mut send, Duration::from_secs(90))
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("DENY"), "{said}");
    assert!(!d.dir.path().join("hello.txt").exists());

    // The supervisor counted the permission it denied for want of a policy, Prometheus sees the
    // policy down, and warden's rule fires.
    eventually(
        &prom_addr,
        "warden_supervisor_policy_failures_total{why=\"unavailable\"}",
        |v| v >= 1.0,
    )
    .await;
    eventually(&prom_addr, "up{job=\"warden-policy\"}", |v| v == 0.0).await;
    let start = Instant::now();
    loop {
        let (_, alerts) = http_get(&prom_addr, "/api/v1/alerts").await;
        let v: Value = serde_json::from_str(&alerts).unwrap();
        let firing = v["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|a| {
                a["labels"]["alertname"] == "WardenPolicyUnreachable" && a["state"] == "firing"
            });
        if firing {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "WardenPolicyUnreachable never fired: {alerts}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = prom.kill().await;
}
