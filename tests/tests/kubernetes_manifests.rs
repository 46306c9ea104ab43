//! `deploy/kubernetes/`, checked offline the way an operator's cluster would check it: every
//! resource `kustomization.yaml` applies is validated against the Kubernetes API schemas
//! (`kubernetes-validate --strict`, the Python package, no cluster), the configuration files the
//! ConfigMaps carry pass the daemons' own `--check-config`, and the cell's seccomp profile allows
//! what bubblewrap needs and nothing the systemd unit refuses.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Kubernetes version the manifests are written for (user namespaces on by default).
const KUBERNETES: &str = "1.33.0";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `kubernetes-validate` is in .ci/requirements.txt; without it (outside CI) this says so.
fn validator() -> Option<&'static str> {
    if have("kubernetes-validate") {
        return Some("kubernetes-validate");
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "kubernetes-validate is missing (pip install -r .ci/requirements.txt)"
    );
    eprintln!("skipped: kubernetes-validate is not installed");
    None
}

fn validate(files: &[PathBuf]) -> std::process::Output {
    Command::new("kubernetes-validate")
        .args(["--strict", "--kubernetes-version", KUBERNETES])
        .args(files)
        .output()
        .expect("kubernetes-validate runs")
}

/// The files `kustomization.yaml` lists (it is plain YAML: resources only, so what it lists is
/// exactly what `kubectl apply -k` applies).
fn resources() -> Vec<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, yaml; print('\\n'.join(yaml.safe_load(open(sys.argv[1]))['resources']))",
        ])
        .arg(dir().join("kustomization.yaml"))
        .output()
        .expect("python3 with PyYAML (a dependency of kubernetes-validate)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| dir().join(l.trim()))
        .collect()
}

#[test]
fn every_resource_applied_validates_against_the_api_schemas_and_a_broken_one_does_not() {
    let Some(_) = validator() else { return };
    let listed = resources();
    // Everything at the top of deploy/kubernetes is applied; examples/ are not.
    let mut on_disk: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| p.file_name().is_some_and(|n| n != "kustomization.yaml"))
        .collect();
    on_disk.sort();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(sorted, on_disk, "kustomization.yaml lists every manifest");

    let out = validate(&listed);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for kind in [
        "deployment/warden-gateway",
        "horizontalpodautoscaler/warden-gateway",
        "statefulset/warden-cell",
        "poddisruptionbudget/warden-cell",
        "networkpolicy/warden-cell",
    ] {
        assert!(
            text.contains(&format!("passed for resource {kind}")),
            "{kind}: {text}"
        );
    }

    // The validator is not a formality: a misspelt field in the cell's pod is refused.
    let tmp = tempfile::tempdir().unwrap();
    let broken = tmp.path().join("cell.yaml");
    let cell = std::fs::read_to_string(dir().join("cell.yaml")).unwrap();
    std::fs::write(&broken, cell.replace("hostUsers: false", "hostUser: false")).unwrap();
    let out = validate(&[broken]);
    assert!(
        !out.status.success(),
        "a misspelt field passed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The files of `name`'s ConfigMap in `file`, as (key, text).
fn config_map(file: &str) -> Vec<(String, String)> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, yaml, json\n\
             docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d['kind'] == 'ConfigMap']\n\
             print(json.dumps([[k, v] for d in docs for k, v in d['data'].items()]))",
        ])
        .arg(dir().join(file))
        .output()
        .expect("python3 with PyYAML");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_configuration_the_manifests_carry_passes_each_daemons_check() {
    if validator().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = Vec::new();
    for (file, key) in [
        ("gateway.yaml", "gateway.toml"),
        ("cell.yaml", "supervisor.toml"),
    ] {
        let (_, text) = config_map(file)
            .into_iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("{file} carries {key}"));
        let path = tmp.path().join(key);
        std::fs::write(&path, &text).unwrap();
        let daemon = format!("warden-{}", key.trim_end_matches(".toml"));
        // Both run in cells mode: the gateway places on the registry's cells, each cell pod
        // registers under its own name (the env the StatefulSet sets from the pod's name).
        let section = if key == "gateway.toml" {
            "[cells]"
        } else {
            "[cell]"
        };
        assert!(text.contains(section), "{file} configures {section}");
        let out = Command::new(warden_e2e::binary(&daemon))
            .arg("--config")
            .arg(&path)
            .arg("--check-config")
            .env("WARDEN_SUPERVISOR__CELL__ID", "warden-cell-1")
            .env(
                "WARDEN_SUPERVISOR__CELL__ADDRESS",
                "warden-cell-1.warden-cell.warden.svc.cluster.local:7443",
            )
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{daemon} refuses the {file} configuration: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        checked.push(daemon);
    }
    assert_eq!(checked, ["warden-gateway", "warden-supervisor"]);
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
