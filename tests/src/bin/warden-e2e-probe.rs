//! `warden-e2e-probe SOCKET`: one gRPC health check on a daemon's Unix socket, as whatever user
//! runs it, for the multi-user test (tests/tests/deb_install.rs runs it under `setpriv` as each
//! daemon's, the operator's and an agent's uid). Prints one word and a detail, and exits with it:
//!
//! - `SERVING` (0): connected and answered;
//! - `UNREACHABLE <error>` (2): the kernel refused the connection (the directory's or the socket
//!   file's mode: EACCES), or nothing listens;
//! - `DENIED <code> <message>` (3): connected, and the daemon refused the call (the peer
//!   allowlist answers PERMISSION_DENIED) or dropped the connection.
//!
//! `warden-e2e-probe SOCKET close CONTEXT`: instead of the health check, `CloseConversation` of
//! CONTEXT on the supervisor's socket (principal "", the gateway's housekeeping close), as the
//! gateway's uid: `CLOSED <closed>` (0), or the same `UNREACHABLE`/`DENIED` as above.
//!
//! Must never: retry or fall back to anything else; a test asserts exactly what it saw.

use std::path::PathBuf;
use std::process::ExitCode;

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let Some(socket) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: warden-e2e-probe SOCKET");
        return ExitCode::from(64);
    };
    // Connect by hand first, so the kernel's answer (EACCES, ENOENT) is reported as it is.
    if let Err(e) = std::os::unix::net::UnixStream::connect(&socket) {
        println!("UNREACHABLE {e}");
        return ExitCode::from(2);
    }
    let channel = match warden_daemon::client::connect_unix(&socket).await {
        Ok(c) => c,
        Err(e) => {
            println!("UNREACHABLE {e}");
            return ExitCode::from(2);
        }
    };
    if std::env::args().nth(2).as_deref() == Some("close") {
        let context_id = std::env::args().nth(3).unwrap_or_default();
        let answer =
            warden_proto::v1::supervisor_service_client::SupervisorServiceClient::new(channel)
                .close_conversation(warden_proto::v1::CloseConversationRequest {
                    context_id,
                    principal: String::new(),
                })
                .await;
        return match answer {
            Ok(r) => {
                println!("CLOSED {}", r.into_inner().closed);
                ExitCode::SUCCESS
            }
            Err(s) => {
                println!("DENIED {:?} {}", s.code(), s.message());
                ExitCode::from(3)
            }
        };
    }
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    match answer {
        Ok(r) => {
            println!("SERVING {:?}", r.into_inner().status);
            ExitCode::SUCCESS
        }
        Err(s) => {
            println!("DENIED {:?} {}", s.code(), s.message());
            ExitCode::from(3)
        }
    }
}
