//! Test helper: asks the daemon at a Unix socket for its gRPC health and prints the outcome
//! (`SERVING`, `NOT_SERVING`, `CONNECT_ERROR ...`, or the gRPC status code such as
//! `PermissionDenied`). Tests run it as another uid to prove a listener's peer allowlist.

use std::process::ExitCode;

use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: grpc-probe SOCKET");
        return ExitCode::from(2);
    };
    let ch = match warden_daemon::client::connect_unix(std::path::Path::new(&path)).await {
        Ok(c) => c,
        Err(e) => {
            println!("CONNECT_ERROR {e}");
            return ExitCode::SUCCESS;
        }
    };
    let req = HealthCheckRequest {
        service: String::new(),
    };
    match HealthClient::new(ch).check(req).await {
        Ok(r) => println!("{}", r.into_inner().status().as_str_name()),
        Err(s) => println!("{:?}", s.code()),
    }
    ExitCode::SUCCESS
}
