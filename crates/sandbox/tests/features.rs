//! `host_features()` agrees with what the spawner can actually use, and prints for doctor.

use warden_sandbox::{CgroupBase, host_features};

#[test]
fn report_matches_what_works_and_names_every_feature() {
    let f = host_features();
    let text = f.to_string();
    println!("{text}");
    for needle in [
        "cgroup v2",
        "v2 controllers",
        "bubblewrap",
        "user namespaces",
        "network namespaces",
        "landlock",
        "agent identity",
    ] {
        assert!(text.contains(needle), "doctor output lacks {needle}");
    }
    // The writable probe agrees with the spawner's own detection.
    let name = format!("warden-test-{}-features", std::process::id());
    let base = CgroupBase::detect(&name).expect("detect");
    assert_eq!(base.is_some(), f.cgroup_writable, "{text}");
    if let Some(b) = base {
        assert!(b.remove_if_empty());
    }
    // bwrap "works" only if found, and the version is reported when found.
    assert!(!f.bwrap_works || f.bwrap_path.is_some());
    assert_eq!(f.bwrap_path.is_some(), f.bwrap_version.is_some());
    if f.bwrap_path.is_none() {
        assert!(text.contains("MISSING"));
    }
    // Missing limit controllers are spelled out.
    for c in f.missing_limit_controllers() {
        assert!(text.contains(&format!("{c}.max")), "{text}");
    }
    // A root user's agents are switched; anyone else's are not, and the report says so.
    match &f.agent_identity {
        Ok(warden_sandbox::IdentityPlan::Switch(i)) => {
            assert!(nix::unistd::geteuid().is_root());
            assert_ne!(i.uid, 0);
        }
        Ok(warden_sandbox::IdentityPlan::SupervisorUid { .. }) => {
            assert!(text.contains("NOT SEPARATED"), "{text}")
        }
        Err(_) => assert!(text.contains("UNAVAILABLE"), "{text}"),
    }
    // Network namespaces are what bwrap --unshare-net needs.
    assert!(!f.bwrap_works || f.network_namespaces);
}
