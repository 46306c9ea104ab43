//! `warden`: the operator's and the caller's command line.
//!
//! Owns: argument parsing and exit codes; the work lives in the `warden_cli` library.

#![forbid(unsafe_code)]

use warden_cli::{agents, approvals, audit, layout, logs, status, up};

mod commands;
mod send;
mod tasks;

use commands::*;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// The task text of `warden send`: the argument, `-` for standard input, or `--file PATH`.
fn prompt_text(text: Option<String>, file: Option<PathBuf>) -> Result<String, String> {
    let read = match (text.as_deref(), file) {
        (_, Some(path)) => std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read --file {}: {e}", path.display()))?,
        (Some("-"), None) => std::io::read_to_string(std::io::stdin())
            .map_err(|e| format!("cannot read the task from standard input: {e}"))?,
        (Some(t), None) => return Ok(t.to_string()),
        (None, None) => return Err("no task: give it as an argument, `-` or --file".into()),
    };
    if read.trim().is_empty() {
        return Err("the task read is empty".into());
    }
    Ok(read)
}

fn exe_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.to_path_buf()))
        .unwrap_or_else(|| PathBuf::from("."))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // `--deployed` means something only where a command reads a daemon's sockets.
    let deployed = match &cli.command {
        Command::Status { deployed, .. }
        | Command::Doctor { deployed, .. }
        | Command::Approvals { deployed, .. }
        | Command::Audit { deployed, .. }
        | Command::Reload { deployed, .. } => cli.deployed || *deployed,
        _ if cli.deployed => {
            eprintln!(
                "warden: --deployed applies to status, audit, approvals, reload and doctor (the installed host); this command uses a local state directory (--state-dir)"
            );
            return ExitCode::from(2);
        }
        _ => false,
    };
    let layout = if deployed {
        layout::Layout::deployed()
    } else {
        layout::resolve(cli.state_dir.as_deref())
    };
    match cli.command {
        Command::Up {
            approver,
            approver_http,
            http,
            bin_dir,
            log_format,
            start_timeout,
            config,
            metrics,
            verbose,
            detach,
        } => {
            let config_dir = match config {
                Some(dir) if !dir.is_dir() => {
                    eprintln!(
                        "warden up: --config {}: not a directory (`warden init {}` writes one)",
                        dir.display(),
                        dir.display()
                    );
                    return ExitCode::FAILURE;
                }
                Some(dir) => Some(dir),
                None => Some(layout.config_dir()).filter(|d| d.is_dir()),
            };
            let opts = up::UpOptions {
                config_dir,
                layout,
                bin_dir: bin_dir.unwrap_or_else(exe_dir),
                http,
                log_format,
                start_timeout: Duration::from_secs(start_timeout),
                approver,
                approver_http,
                metrics,
                log_level: Some(up::log_levels(verbose).0.to_string()),
                echo_from: up::log_levels(verbose).1,
            };
            let result = if detach {
                up::detach(opts).await
            } else {
                up::run(opts).await
            };
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("warden up: {e}");
                    if let Some(fix) = e.fix() {
                        eprintln!("{fix}");
                    }
                    ExitCode::FAILURE
                }
            }
        }
        Command::MigrateStore { url, bin_dir } => {
            let opts = up::UpOptions {
                config_dir: Some(layout.config_dir()).filter(|d| d.is_dir()),
                layout: layout.clone(),
                bin_dir: bin_dir.unwrap_or_else(exe_dir),
                // The gateway's import binds nothing; its configuration still needs an address.
                http: "127.0.0.1:0".into(),
                log_format: "human".into(),
                start_timeout: Duration::from_secs(10),
                approver: false,
                approver_http: String::new(),
                metrics: None,
                log_level: None,
                echo_from: warden_daemon::logging::Severity::Info,
            };
            let mut moved = 0;
            for name in ["policy", "approver", "gateway"] {
                if !layout.state_of(name).join("store").is_dir() {
                    println!(
                        "{name}: no sled store under {}",
                        layout.state_of(name).display()
                    );
                    continue;
                }
                let mut args = up::daemon_args(name, &opts);
                for set in [
                    "store.backend=\"postgres\"".to_string(),
                    format!("store.url={}", layout::toml_str(std::path::Path::new(&url))),
                ] {
                    args.push("--set".into());
                    args.push(set);
                }
                args.push("--import-sled".into());
                let bin = opts.bin_dir.join(format!("warden-{name}"));
                match std::process::Command::new(&bin).args(&args).output() {
                    Ok(out) if out.status.success() => {
                        print!("{}", String::from_utf8_lossy(&out.stdout));
                        moved += 1;
                    }
                    Ok(out) => {
                        eprint!("{}", String::from_utf8_lossy(&out.stderr));
                        eprintln!("warden migrate-store: {name} failed; nothing was removed");
                        return ExitCode::FAILURE;
                    }
                    Err(e) => {
                        eprintln!("warden migrate-store: cannot run {}: {e}", bin.display());
                        return ExitCode::FAILURE;
                    }
                }
            }
            if moved == 0 {
                eprintln!("warden migrate-store: no sled store to move");
                return ExitCode::FAILURE;
            }
            println!(
                "the sled stores are left as they were; run the daemons with [store] backend = \"postgres\""
            );
            ExitCode::SUCCESS
        }
        Command::Down { timeout } => match up::down(&layout, Duration::from_secs(timeout)).await {
            Ok(said) => {
                println!("{said}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("warden down: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Logs {
            daemon,
            follow,
            lines,
        } => match logs::run(&layout, daemon.as_deref(), follow, lines).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("warden logs: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Reload { out, .. } => {
            let answers = agents::reload_all(&layout).await;
            if answers.is_empty() {
                eprintln!(
                    "warden reload: no daemon is running on {} (`warden status`)",
                    layout.root.display()
                );
                return ExitCode::FAILURE;
            }
            let mut all = true;
            let mut docs = Vec::new();
            for (name, answer) in &answers {
                match answer {
                    Ok(r) => {
                        all &= r.reloaded;
                        docs.push(serde_json::json!({
                            "daemon": format!("warden-{name}"), "reloaded": r.reloaded,
                            "version": r.policy_version, "error": r.error,
                        }));
                        if out.json() {
                            continue;
                        }
                        match (r.reloaded, *name) {
                            (true, "policy") => println!(
                                "warden-policy reloaded: policy version {}",
                                r.policy_version
                            ),
                            (true, _) => println!("warden-{name} reloaded"),
                            (false, "policy") => println!(
                                "warden-policy refused the new rules (version {} stays in force): {}",
                                r.policy_version,
                                warden_terminal_text::Inline(&r.error)
                            ),
                            (false, _) => println!(
                                "warden-{name} changed nothing: {}",
                                warden_terminal_text::Inline(&r.error)
                            ),
                        }
                    }
                    Err(e) => {
                        all = false;
                        docs.push(serde_json::json!({
                            "daemon": format!("warden-{name}"), "reloaded": false,
                            "error": e.to_string(),
                        }));
                        if !out.json() {
                            // On the packaged host an operator may not reach every daemon's
                            // socket (the supervisor's is the gateway's); systemd reaches all.
                            let hint = if layout.deployed {
                                format!(
                                    " (`systemctl reload warden-{name}` sends it the same reload)"
                                )
                            } else {
                                String::new()
                            };
                            eprintln!("warden reload: warden-{name}: {e}{hint}");
                        }
                    }
                }
            }
            if out.json() {
                // The policy's figures at the top, as before every daemon reloaded; each
                // daemon's answer in `daemons`.
                let policy = answers
                    .iter()
                    .find(|(n, _)| *n == "policy")
                    .and_then(|(_, a)| a.as_ref().ok());
                let errors: Vec<String> = docs
                    .iter()
                    .filter_map(|d| {
                        let e = d["error"].as_str().filter(|e| !e.is_empty())?;
                        Some(format!("{}: {e}", d["daemon"].as_str().unwrap_or("")))
                    })
                    .collect();
                warden_cli::output::print_doc(&serde_json::json!({
                    "reloaded": all,
                    "policyVersion": policy.map(|p| p.policy_version),
                    "error": errors.join("; "),
                    "daemons": docs,
                }));
            }
            if all {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Agents { out } => match agents::list(&layout.socket_of("supervisor")).await {
            Ok(list) => {
                if out.json() {
                    warden_cli::output::print_doc(&agents::json(&list));
                } else {
                    for l in agents::lines(&list) {
                        println!("{}", warden_terminal_text::Inline(&l));
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("warden agents: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Init { dir } => {
            let dir = dir.unwrap_or_else(|| layout.config_dir());
            match warden_cli::init::write(&dir, &layout) {
                Ok(files) => {
                    for f in files {
                        println!("wrote {}", f.display());
                    }
                    let dir_arg = dir.to_string_lossy();
                    let dir_arg = shlex::try_quote(&dir_arg).unwrap_or(dir_arg.clone());
                    println!("start with: {} up --config {dir_arg}", layout.command());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("warden init: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Approvals { what, out, .. } => {
            let socket = layout.approver_admin_socket();
            let json = out.json();
            let command = layout.command();
            let one = |a: &warden_proto::v1::Approval| {
                if json {
                    warden_cli::output::print_doc(&warden_cli::output::approval_json(a, &command));
                } else {
                    println!("{}", approvals::line(a));
                }
            };
            let result = match what {
                ApprovalsCommand::List => approvals::list(&socket, false, 0, json, &command).await,
                ApprovalsCommand::History { limit } => {
                    approvals::list(&socket, true, limit, json, &command).await
                }
                ApprovalsCommand::Show { id } => {
                    approvals::show(&socket, &id, json, &command).await
                }
                ApprovalsCommand::Approve { id, reason } => {
                    approvals::answer(&socket, &id, warden_proto::v1::Verdict::Allow, &reason)
                        .await
                        .map(|a| one(&a))
                }
                ApprovalsCommand::Deny { id, reason } => {
                    approvals::answer(&socket, &id, warden_proto::v1::Verdict::Deny, &reason)
                        .await
                        .map(|a| one(&a))
                }
                ApprovalsCommand::Watch if json => approvals::watch_json(&socket, &command).await,
                ApprovalsCommand::Watch => approvals::watch(&socket).await,
            };
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!(
                        "warden approvals: {}",
                        warden_terminal_text::Inline(&e.to_string())
                    );
                    ExitCode::from(e.exit_code())
                }
            }
        }
        Command::Audit { what, out, .. } => {
            let socket = layout.policy_admin_socket();
            let json = out.json();
            let result = match what {
                AuditCommand::Tail {
                    limit,
                    context,
                    follow,
                } => audit::tail(&socket, limit, context.unwrap_or_default(), follow, json).await,
                AuditCommand::Show { decision_id } => {
                    audit::show(&socket, &decision_id).await.map(|r| {
                        if json {
                            warden_cli::output::print_doc(&warden_cli::output::audit_json(&r));
                        } else {
                            println!("{}", audit::detail(&r));
                        }
                    })
                }
            };
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!(
                        "warden audit: {}",
                        warden_terminal_text::Inline(&e.to_string())
                    );
                    ExitCode::FAILURE
                }
            }
        }
        Command::Doctor { out, .. } if layout.deployed => {
            let report = warden_cli::deployed::check();
            if out.json() {
                warden_cli::output::print_doc(&serde_json::json!({
                    "checks": report.checks.iter().map(|c| serde_json::json!({
                        "level": c.level.to_string(), "what": c.what,
                    })).collect::<Vec<_>>(),
                    "failed": report.failed(),
                }));
            } else {
                println!("{report}");
            }
            if report.failed() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Doctor {
            supervisor_socket,
            approver_admin,
            out,
            ..
        } => {
            let supervisor_socket =
                supervisor_socket.unwrap_or_else(|| layout.socket_of("supervisor"));
            let approver_admin = approver_admin.unwrap_or_else(|| layout.approver_admin_socket());
            let report =
                warden_cli::doctor::local(&layout, &exe_dir(), &supervisor_socket, &approver_admin)
                    .await;
            if out.json() {
                warden_cli::output::print_doc(&report.json());
            } else {
                print!("{}", report.text());
            }
            if report.failed() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Send {
            agent,
            context,
            dir,
            workspace,
            model,
            effort,
            mode,
            url,
            token_file,
            file,
            text,
            out,
        } => {
            let text = match prompt_text(text, file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("warden send: {e}");
                    return ExitCode::from(2);
                }
            };
            send::run(
                &layout,
                send::SendArgs {
                    agent,
                    context,
                    copy_from: dir,
                    workspace,
                    model,
                    effort,
                    mode,
                    text,
                    url,
                    token_file,
                    json: out.json(),
                },
            )
            .await
        }
        Command::Tasks {
            url,
            token_file,
            out,
            what,
        } => {
            let json = out.json();
            let name = match &what {
                TasksCommand::List { .. } => "tasks list",
                TasksCommand::Show { .. } => "tasks show",
                TasksCommand::Diff { .. } => "tasks diff",
                TasksCommand::Apply { .. } => "tasks apply",
            };
            let r = async {
                let gw = tasks::Gateway::locate(&layout, url.as_deref(), token_file.as_deref())?;
                match what {
                    TasksCommand::List { context } => {
                        tasks::list(&gw, context.as_deref(), json).await
                    }
                    TasksCommand::Show { id } => tasks::show(&gw, &id, json).await,
                    TasksCommand::Diff { id } => tasks::diff(&gw, &layout, &id, json).await,
                    TasksCommand::Apply { id, dir } => {
                        tasks::apply(&gw, &layout, &id, &dir, json).await
                    }
                }
            }
            .await;
            tasks::finish(name, r, json)
        }
        Command::Contexts {
            url,
            token_file,
            out,
            what,
        } => {
            let json = out.json();
            let r = async {
                let gw = tasks::Gateway::locate(&layout, url.as_deref(), token_file.as_deref())?;
                match &what {
                    ContextsCommand::List => tasks::contexts(&gw, json).await,
                    ContextsCommand::Close { id } => tasks::close_context(&gw, id, json).await,
                }
            }
            .await;
            let name = match what {
                ContextsCommand::List => "contexts list",
                ContextsCommand::Close { .. } => "contexts close",
            };
            tasks::finish(name, r, json)
        }
        Command::Mcp => match warden_cli::mcp::run(&layout).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("warden mcp: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Status { out, .. } => {
            if status::run(&layout, out.json()).await {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Token { what, out } => {
            let minted = match what {
                TokenCommand::New { principal } => warden_cli::token::new(&principal),
                TokenCommand::Hash { principal } => warden_cli::token::read_stdin()
                    .and_then(|t| warden_cli::token::hash(&principal, &t)),
            };
            match minted {
                Ok(m) if out.json() => {
                    warden_cli::output::print_doc(&m.json());
                    ExitCode::SUCCESS
                }
                Ok(m) => {
                    if !m.token.is_empty() {
                        println!("token  {}", m.token);
                        println!(
                            "       (give it to the caller over a private channel; it is not shown again)"
                        );
                        println!();
                    }
                    println!(
                        "# gateway.toml; then `systemctl reload warden-gateway` or `warden reload`"
                    );
                    print!("{}", m.toml());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("warden token: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Completion { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "warden", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Manpage => {
            use clap::CommandFactory;
            let man = clap_mangen::Man::new(Cli::command());
            match man.render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("warden manpage: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
