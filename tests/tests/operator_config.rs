//! Configuration an operator can live with: `warden init` writes a starter set each daemon
//! accepts, `warden up --config DIR` reads it, and an agent defined only in the supervisor's
//! file (a name with `-`) is usable through the gateway and listed on its card.

use std::path::Path;
use std::time::Duration;

use warden_e2e::{Deployment, Options, binary, run_with_deadline};

/// `warden --state-dir STATE init [DIR]`.
async fn warden_init(state: &Path, dir: Option<&Path>) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(binary("warden"));
    cmd.arg("--state-dir").arg(state).arg("init");
    if let Some(d) = dir {
        cmd.arg(d);
    }
    run_with_deadline(&mut cmd, Duration::from_secs(30))
        .await
        .unwrap()
}

#[tokio::test]
async fn warden_init_writes_a_starter_set_every_daemon_accepts_and_never_overwrites_it() {
    let d = Deployment::new(Options::default());
    let out = warden_init(d.dir.path(), None).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = d.layout.config_dir();
    // The command it suggests names this state directory (it used to suggest `warden up`, which
    // would read another one).
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!(
            "start with: warden --state-dir {} up --config {}",
            d.dir.path().display(),
            dir.display()
        )),
        "{said}"
    );
    for daemon in ["policy", "supervisor", "gateway", "approver"] {
        let file = dir.join(format!("{daemon}.toml"));
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.starts_with("# warden-"), "{daemon}: commented: {text}");
        let mut check = tokio::process::Command::new(binary(&format!("warden-{daemon}")));
        check.arg("--config").arg(&file).arg("--check-config");
        let out = run_with_deadline(&mut check, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{daemon}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A second init leaves the operator's edits alone.
    std::fs::write(dir.join("policy.toml"), "# edited\n").unwrap();
    let again = warden_init(d.dir.path(), None).await;
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already exists"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("policy.toml")).unwrap(),
        "# edited\n"
    );
}

#[tokio::test]
async fn an_agent_configured_only_in_the_supervisors_file_is_usable_through_the_gateway() {
    let d0 = Deployment::new(Options::default());
    let conf = d0.dir.path().join("conf");
    let out = warden_init(d0.dir.path(), Some(&conf)).await;
    assert!(out.status.success());
    let agent = binary("warden-scripted-agent");
    let mut sup = std::fs::read_to_string(conf.join("supervisor.toml")).unwrap();
    sup.push_str(&format!(
        "\n[agents.my-agent]\ndescription = \"my own agent, from supervisor.toml\"\n\
         command = {:?}\nsupervised_mode = \"default\"\n",
        agent.to_string_lossy()
    ));
    std::fs::write(conf.join("supervisor.toml"), sup).unwrap();

    let mut d = Deployment::new(Options {
        config_dir: Some(conf.clone()),
        ..Default::default()
    });
    for name in ["policy", "supervisor", "gateway"] {
        d.start(name).await;
    }
    std::fs::write(d.layout.url_file(), format!("http://{}\n", d.http)).unwrap();

    // The card lists the supervisor's agents, with the description from its file.
    let card = warden_cli::client::get_json(&d.http, "/.well-known/agent-card.json", "")
        .await
        .unwrap();
    let skills = card["skills"].as_array().cloned().unwrap_or_default();
    let mine = skills
        .iter()
        .find(|s| s["id"] == "my-agent")
        .unwrap_or_else(|| panic!("my-agent on the card: {card}"));
    assert_eq!(
        mine["description"], "my own agent, from supervisor.toml",
        "{card}"
    );
    assert!(skills.iter().any(|s| s["id"] == "scripted"), "{card}");

    let state = d.dir.path().to_string_lossy().to_string();
    let mut send = tokio::process::Command::new(binary("warden"));
    send.args([
        "--state-dir",
        &state,
        "send",
        "--agent",
        "my-agent",
        "write hello.txt",
    ])
    .stdin(std::process::Stdio::null());
    let out = run_with_deadline(&mut send, Duration::from_secs(60))
        .await
        .unwrap();
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("[policy] ALLOW Write hello.txt"), "{shown}");
    assert!(shown.contains("[COMPLETED]"), "{shown}");

    // A name neither daemon knows is still refused, and says which ones exist.
    let mut send = tokio::process::Command::new(binary("warden"));
    send.args(["--state-dir", &state, "send", "--agent", "nobody", "hi"])
        .stdin(std::process::Stdio::null());
    let out = run_with_deadline(&mut send, Duration::from_secs(60))
        .await
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{shown}");
    assert!(shown.contains("unknown agent \"nobody\""), "{shown}");
    assert!(shown.contains("my-agent"), "{shown}");
}

/// A misspelt agent command fails `--check-config` naming the key (it used to pass, and the
/// agent failed at its first task), so `warden up` refuses it before starting anything; a
/// command that exists passes, and the summary says which built-in adapters are not installed.
#[tokio::test]
async fn check_config_finds_an_agent_command_that_does_not_exist() {
    let check = |set: &str| {
        let mut c = tokio::process::Command::new(binary("warden-supervisor"));
        c.args(["--check-config", "--set", set]);
        c
    };
    let out = run_with_deadline(
        &mut check(r#"agents.mine.command="claud-code-acp""#),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains(r#"agents.mine.command "claud-code-acp": not found on PATH"#),
        "{said}"
    );
    let out = run_with_deadline(
        &mut check(r#"agents.mine.command="/nonexistent/agent""#),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such executable file"));
    let out = run_with_deadline(
        &mut check(r#"agents.mine.command="/usr/bin/python3""#),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("mine"), "{said}");
}
