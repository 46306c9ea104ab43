//! `deploy/kubernetes/`, checked offline the way an operator's cluster would check it: every
//! overlay (`overlays/production`, `overlays/demo`) is rendered with `kubectl kustomize` and what
//! it renders is validated against the Kubernetes API schemas (`kubernetes-validate --strict`, the
//! Python package, no cluster); the rendered workloads match the code (the gateway's replicas on
//! PostgreSQL, a probe on every container asking the daemon's own health, each daemon's metrics
//! port where its configuration listens); the configuration files the ConfigMaps carry pass the
//! daemons' own `--check-config` against a real PostgreSQL; and the cell's seccomp profile allows
//! what bubblewrap needs and nothing the systemd unit refuses.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The Kubernetes version the manifests are written for (user namespaces on by default).
const KUBERNETES: &str = "1.33.0";

const OVERLAYS: [&str; 2] = ["production", "demo"];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

fn have(tool: &str, args: &[&str]) -> bool {
    Command::new(tool)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `kubernetes-validate` (in .ci/requirements.txt) and `kubectl` (its kustomize renders the
/// overlays; part of this kind of machine's image); without them (outside CI) this says so.
fn tools() -> bool {
    let missing: Vec<&str> = [
        ("kubernetes-validate", &["--version"][..]),
        ("kubectl", &["version", "--client"][..]),
    ]
    .into_iter()
    .filter(|(t, a)| !have(t, a))
    .map(|(t, _)| t)
    .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "missing {missing:?} (pip install -r .ci/requirements.txt; kubectl)"
    );
    eprintln!("skipped: {missing:?} not installed");
    false
}

/// `kubectl kustomize` of `overlay`, written to a file in `tmp`.
fn render(overlay: &str, tmp: &Path) -> PathBuf {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir().join("overlays").join(overlay))
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl kustomize overlays/{overlay}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = tmp.join(format!("{overlay}.yaml"));
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

fn validate(files: &[PathBuf]) -> std::process::Output {
    Command::new("kubernetes-validate")
        .args(["--strict", "--kubernetes-version", KUBERNETES])
        .args(files)
        .output()
        .expect("kubernetes-validate runs")
}

/// The documents of a YAML file, as JSON values (PyYAML, a dependency of kubernetes-validate).
fn documents(file: &Path) -> Vec<Value> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, yaml, json; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))",
        ])
        .arg(file)
        .output()
        .expect("python3 with PyYAML (a dependency of kubernetes-validate)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind}/{name} is rendered"))
}

/// `key = value` of `[section]` in a TOML text.
fn toml_value(text: &str, section: &str, key: &str) -> Option<toml::Value> {
    let v: toml::Value = toml::from_str(text).unwrap();
    v.get(section)?.get(key).cloned()
}

#[test]
fn every_overlay_renders_and_validates_against_the_api_schemas_and_a_broken_one_does_not() {
    if !tools() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for overlay in OVERLAYS {
        let file = render(overlay, tmp.path());
        let out = validate(std::slice::from_ref(&file));
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{overlay}: {text}");
        let mut kinds = vec![
            "namespace/warden",
            "deployment/warden-gateway",
            "horizontalpodautoscaler/warden-gateway",
            "poddisruptionbudget/warden-gateway",
            "statefulset/warden-cell",
            "poddisruptionbudget/warden-cell",
            "networkpolicy/warden-default-deny",
            "networkpolicy/warden-dns",
            "networkpolicy/warden-gateway",
            "networkpolicy/warden-cell",
        ];
        if overlay == "demo" {
            kinds.extend([
                "deployment/warden-postgres",
                "service/warden-postgres",
                "networkpolicy/warden-postgres",
            ]);
        }
        for kind in kinds {
            assert!(
                text.contains(&format!("passed for resource {kind} ")),
                "{overlay}: {kind}: {text}"
            );
        }
        // Nothing rendered is left unchecked but the Prometheus Operator's PodMonitors (a CRD
        // whose schema is not Kubernetes'), in production only.
        let unchecked: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("Couldn't find schema"))
            .collect();
        let expected = if overlay == "production" { 2 } else { 0 };
        assert!(
            unchecked.len() == expected && unchecked.iter().all(|l| l.contains("PodMonitor")),
            "{overlay}: {unchecked:?}"
        );
    }

    // The validator is not a formality: a misspelt field in the cell's pod is refused.
    let broken = tmp.path().join("cell.yaml");
    let cell = std::fs::read_to_string(dir().join("base/cell.yaml")).unwrap();
    std::fs::write(&broken, cell.replace("hostUsers: false", "hostUser: false")).unwrap();
    let out = validate(&[broken]);
    assert!(
        !out.status.success(),
        "a misspelt field passed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// What the README and the gateway's README say of the code, in the rendered manifests: the
/// gateway's replicas share a PostgreSQL task store (sled would give each its own), the HPA and
/// the PodDisruptionBudget keep two of them; every container has readiness and liveness probes,
/// and each warden daemon's probe asks its own health (`--health`); each daemon's metrics port is
/// where its configuration listens, and the pods carry the scrape annotations.
#[test]
fn the_rendered_workloads_match_the_code() {
    if !tools() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for overlay in OVERLAYS {
        let docs = documents(&render(overlay, tmp.path()));
        let gw = find(&docs, "Deployment", "warden-gateway");
        assert!(gw["spec"]["replicas"].as_u64() >= Some(2), "{overlay}");
        let hpa = find(&docs, "HorizontalPodAutoscaler", "warden-gateway");
        let (min, max) = (
            hpa["spec"]["minReplicas"].as_u64().unwrap(),
            hpa["spec"]["maxReplicas"].as_u64().unwrap(),
        );
        assert!(min >= 2 && max > min, "{overlay}: HPA {min}..{max}");
        let pdb = find(&docs, "PodDisruptionBudget", "warden-gateway");
        assert_eq!(pdb["spec"]["minAvailable"], 1, "{overlay}");

        let configs: Vec<(String, String)> = docs
            .iter()
            .filter(|d| d["kind"] == "ConfigMap")
            .flat_map(|d| d["data"].as_object().cloned().unwrap_or_default())
            .map(|(k, v)| (k, v.as_str().unwrap_or("").to_string()))
            .collect();
        let config = |key: &str| {
            configs
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("{overlay}: a ConfigMap carries {key}"))
        };
        let gateway_toml = config("gateway.toml");
        assert_eq!(
            toml_value(&gateway_toml, "store", "backend")
                .and_then(|v| v.as_str().map(str::to_owned)),
            Some("postgres".into()),
            "{overlay}: replicas share the PostgreSQL task store"
        );

        for (kind, name) in [
            ("Deployment", "warden-gateway"),
            ("StatefulSet", "warden-cell"),
        ] {
            let w = find(&docs, kind, name);
            let pod = &w["spec"]["template"];
            assert_eq!(
                pod["metadata"]["annotations"]["prometheus.io/scrape"], "true",
                "{overlay}: {name}"
            );
            for c in pod["spec"]["containers"].as_array().unwrap() {
                let cname = c["name"].as_str().unwrap();
                let binary = c["command"][0].as_str().unwrap();
                let config_file = c["command"][2].as_str().unwrap();
                for probe in ["readinessProbe", "livenessProbe"] {
                    assert!(
                        c[probe].is_object(),
                        "{overlay}: {name}/{cname} has a {probe}"
                    );
                }
                let live = &c["livenessProbe"]["exec"]["command"];
                assert_eq!(
                    live,
                    &serde_json::json!([binary, "--config", config_file, "--health"]),
                    "{overlay}: {name}/{cname}'s liveness asks its own daemon's health"
                );
                // Its metrics port is where its configuration listens.
                let key = Path::new(config_file)
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .to_string();
                let listen = toml_value(&config(&key), "daemon", "metrics_listen")
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| panic!("{overlay}: {key} sets daemon.metrics_listen"));
                let port: u64 = listen.rsplit(':').next().unwrap().parse().unwrap();
                let ports = c["ports"].as_array().unwrap();
                assert!(
                    ports.iter().any(|p| p["containerPort"] == port
                        && p["name"].as_str().is_some_and(|n| n.starts_with("metrics"))),
                    "{overlay}: {name}/{cname} names its metrics port {port}: {ports:?}"
                );
            }
        }
        // Every other container (the demo's PostgreSQL) has its probes too.
        for d in docs.iter().filter(|d| d["kind"] == "Deployment") {
            for c in d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
            {
                for probe in ["readinessProbe", "livenessProbe"] {
                    assert!(
                        c[probe].is_object(),
                        "{overlay}: {} has a {probe}",
                        c["name"]
                    );
                }
            }
        }
    }
}

#[test]
fn the_configuration_the_manifests_carry_passes_each_daemons_check() {
    if !tools() {
        return;
    }
    // The gateway's task store, the policy's audit log and the approver's queue are in
    // PostgreSQL: `--check-config` asks the database whether it is migrated.
    let Some(pgc) = warden_pgstate::cluster::TestCluster::start_or_skip()
        .unwrap_or_else(|e| panic!("PostgreSQL: {e}"))
    else {
        return;
    };
    pgc.create_db("warden").unwrap();
    let url = pgc.url("warden");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pg =
            warden_pgstate::Pg::new(&warden_pgstate::StoreSection::postgres(url.clone())).unwrap();
        warden_pgstate::migrate::migrate(&pg).await.unwrap();
    });
    let tmp = tempfile::tempdir().unwrap();
    let docs = documents(&render("production", tmp.path()));
    let mut checked = Vec::new();
    for (key, section) in [
        ("gateway.toml", Some("[cells]")),
        ("supervisor.toml", Some("[cell]")),
        ("policy.toml", None),
        ("approver.toml", None),
    ] {
        let text = docs
            .iter()
            .filter(|d| d["kind"] == "ConfigMap")
            .find_map(|d| d["data"][key].as_str())
            .unwrap_or_else(|| panic!("a ConfigMap carries {key}"));
        let path = tmp.path().join(key);
        std::fs::write(&path, text).unwrap();
        let daemon = format!("warden-{}", key.trim_end_matches(".toml"));
        // Both run in cells mode: the gateway places on the registry's cells, each cell pod
        // registers under its own name (the env the StatefulSet sets from the pod's name).
        if let Some(section) = section {
            assert!(text.contains(section), "{key} configures {section}");
        }
        let out = Command::new(warden_e2e::binary(&daemon))
            .arg("--config")
            .arg(&path)
            .arg("--check-config")
            .env("WARDEN_SUPERVISOR__CELL__ID", "warden-cell-1")
            .env(
                "WARDEN_SUPERVISOR__CELL__ADDRESS",
                "warden-cell-1.warden-cell.warden.svc.cluster.local:7443",
            )
            .env("WARDEN_GATEWAY__STORE__URL", &url)
            .env("WARDEN_GATEWAY__CELLS__STORE__URL", &url)
            .env("WARDEN_SUPERVISOR__CELL__STORE__URL", &url)
            .env("WARDEN_POLICY__STORE__URL", &url)
            .env("WARDEN_APPROVER__STORE__URL", &url)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{daemon} refuses the {key} configuration: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        checked.push(daemon);
    }
    assert_eq!(
        checked,
        [
            "warden-gateway",
            "warden-supervisor",
            "warden-policy",
            "warden-approver"
        ]
    );
}

#[test]
fn the_cells_seccomp_profile_allows_the_sandbox_and_refuses_what_the_unit_refuses() {
    let text = std::fs::read_to_string(dir().join("seccomp/warden-cell.json")).unwrap();
    let p: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO", "deny by default");
    assert_eq!(
        p["defaultErrnoRet"], 1,
        "EPERM, as SystemCallErrorNumber=EPERM"
    );
    let allowed: Vec<&str> = p["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "SCMP_ACT_ALLOW")
        .flat_map(|r| r["names"].as_array().unwrap())
        .map(|n| n.as_str().unwrap())
        .collect();
    // bubblewrap's sandbox, the agents' uids, the kill ladder, self-confinement.
    for need in [
        "unshare",
        "clone",
        "clone3",
        "mount",
        "umount2",
        "pivot_root",
        "setns",
        "setresuid",
        "setresgid",
        "setgroups",
        "chown",
        "kill",
        "pidfd_open",
        "pidfd_send_signal",
        "seccomp",
        "landlock_create_ruleset",
        "landlock_restrict_self",
        "execve",
        "execveat",
    ] {
        assert!(allowed.contains(&need), "{need} is not allowed");
    }
    // Outside @system-service and @mount: debugging, kernel modules, BPF, raw I/O, clocks.
    for refused in [
        "ptrace",
        "bpf",
        "perf_event_open",
        "init_module",
        "finit_module",
        "kexec_load",
        "reboot",
        "swapon",
        "iopl",
        "ioperm",
        "settimeofday",
        "open_by_handle_at",
    ] {
        assert!(!allowed.contains(&refused), "{refused} is allowed");
    }
}

/// The probes' `--health` (every warden container's liveness, above): each daemon's own flag,
/// given the configuration the daemon runs on, asks that running daemon's gRPC health and says
/// SERVING (exit 0); once the daemon is stopped it says it is not serving (exit 1), which is what
/// makes the kubelet restart the container.
#[tokio::test]
async fn each_daemons_health_flag_is_what_its_probe_sees() {
    let mut d = warden_e2e::Deployment::up(warden_e2e::Options {
        approver: true,
        ..warden_e2e::Options::default()
    })
    .await;
    let health = |d: &warden_e2e::Deployment, name: &str| {
        Command::new(warden_e2e::binary(&format!("warden-{name}")))
            .args(warden_cli::up::daemon_args(name, &d.plan()))
            .arg("--health")
            .output()
            .unwrap()
    };
    for name in ["gateway", "supervisor", "policy", "approver"] {
        let out = health(&d, name);
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "warden-{name} --health: {said}");
        assert!(
            said.contains(&format!("warden-{name}: SERVING at ")),
            "{said}"
        );
    }
    let policy = d.take("policy").expect("the policy runs");
    policy.terminate().await;
    let out = health(&d, "policy");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("warden-policy: not serving at "), "{said}");
}
