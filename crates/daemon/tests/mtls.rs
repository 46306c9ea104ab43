//! Mutual TLS between hosts, end to end on loopback: a real listener (the one every daemon
//! uses), real certificates made by `openssl` with SPIFFE URI SANs, real gRPC health calls.
//! A peer is admitted by its certificate's identity, exactly as a Unix listener admits by uid.

use std::path::Path;
use std::time::Duration;

#[path = "pki/mod.rs"]
mod pki;
use pki::{TD, certs, leaf};

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use warden_daemon::config::ListenerConfig;
use warden_daemon::tls::{ClientTls, Refusal, TlsConfig};
use warden_daemon::{Server, listener};

fn tls(dir: &Path, name: &str, ca: &str, admit: &[&str]) -> TlsConfig {
    TlsConfig {
        cert_file: dir.join(format!("{name}.pem")),
        key_file: dir.join(format!("{name}.key")),
        ca_file: dir.join(format!("{ca}.pem")),
        admit: admit.iter().map(|s| s.to_string()).collect(),
    }
}

struct Running {
    addr: String,
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The supervisor's listener: mutual TLS, admitting only the gateway's identity.
async fn supervisor(dir: &Path) -> Running {
    let mut cfg = ListenerConfig::unix("unused.sock");
    cfg.socket = None;
    cfg.tcp = Some("127.0.0.1:0".into());
    cfg.tls = Some(tls(dir, "supervisor", "ca", &[&format!("{TD}/gateway")]));
    let bound = listener::bind("listen", &cfg, dir).await.expect("binds");
    let addr = bound
        .describe()
        .strip_prefix("tcp+mtls:")
        .expect("described as mutual TLS")
        .to_string();
    let mut server = Server::new("mtls-test", Duration::from_secs(1));
    let stop = server.shutdown_token();
    server.serve(bound, tonic::service::Routes::default());
    tokio::spawn(server.run());
    Running { addr, stop }
}

async fn health(client: &ClientTls, addr: &str) -> Result<i32, tonic::Status> {
    let channel = client.channel(addr).expect("a channel");
    let mut h = HealthClient::new(channel);
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        h.check(HealthCheckRequest {
            service: String::new(),
        }),
    )
    .await
    .map_err(|_| tonic::Status::deadline_exceeded("no answer in 10 s"))??;
    Ok(r.into_inner().status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_is_admitted_by_its_certificate_identity_and_nothing_else() {
    let (_keep, d) = certs();
    let sup = supervisor(&d).await;
    let want_sup = [format!("{TD}/supervisor")];
    let want: Vec<&str> = want_sup.iter().map(String::as_str).collect();

    // The gateway, with the gateway's certificate, reaches the supervisor.
    let gateway = ClientTls::new(&tls(&d, "gateway", "ca", &want), &d).unwrap();
    assert_eq!(health(&gateway, &sup.addr).await.expect("admitted"), 1);

    // A policy certificate from the same CA is the wrong role: refused at the handshake.
    let policy = ClientTls::new(&tls(&d, "policy", "ca", &want), &d).unwrap();
    assert!(
        health(&policy, &sup.addr).await.is_err(),
        "a wrong role got in"
    );
    // And the client can tell: a TLS alert from the server, not a lost connection.
    assert!(
        matches!(policy.refused(&sup.addr), Some(Refusal::ByPeer(_))),
        "{:?}",
        policy.refused(&sup.addr)
    );

    // The gateway's name signed by another CA: refused.
    let impostor = ClientTls::new(&tls(&d, "impostor", "ca", &want), &d).unwrap();
    assert!(
        health(&impostor, &sup.addr).await.is_err(),
        "another CA's certificate got in"
    );
    assert!(
        matches!(impostor.refused(&sup.addr), Some(Refusal::ByPeer(_))),
        "{:?}",
        impostor.refused(&sup.addr)
    );

    // A client that expects another server identity does not talk to this one.
    let confused =
        ClientTls::new(&tls(&d, "gateway", "ca", &[&format!("{TD}/policy")]), &d).unwrap();
    let err = health(&confused, &sup.addr).await.unwrap_err();
    assert_ne!(err.code(), tonic::Code::Ok);
    assert!(
        matches!(confused.refused(&sup.addr), Some(Refusal::OfPeer(_))),
        "{:?}",
        confused.refused(&sup.addr)
    );
    // A refusal is forgotten once a connection there is taken.
    assert_eq!(health(&gateway, &sup.addr).await.expect("admitted"), 1);
    assert_eq!(gateway.refused(&sup.addr), None);

    // Plain gRPC over TCP, no certificate at all: nothing is served.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", sup.addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    let answered = match tokio::time::timeout(Duration::from_secs(10), plain.connect()).await {
        Ok(Ok(ch)) => HealthClient::new(ch)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .is_ok(),
        _ => false,
    };
    assert!(!answered, "plain TCP was served");

    // And the admitted client still is, after all that.
    assert_eq!(
        health(&gateway, &sup.addr).await.expect("still admitted"),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_used_without_a_restart_and_a_broken_one_is_not() {
    let (_keep, d) = certs();
    let sup = supervisor(&d).await;
    let want = [format!("{TD}/supervisor")];
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    let gateway = ClientTls::new(&tls(&d, "gateway", "ca", &want), &d).unwrap();
    assert_eq!(health(&gateway, &sup.addr).await.unwrap(), 1);

    // The supervisor's certificate is rotated to one of another CA (as a trust-domain move
    // would): new connections present it, so the gateway, trusting only the old CA, is
    // refused — proof the listener read the new files without a restart.
    leaf(&d, "other-ca", "supervisor2", &format!("{TD}/supervisor"));
    std::fs::copy(d.join("supervisor2.pem"), d.join("supervisor.pem")).unwrap();
    std::fs::copy(d.join("supervisor2.key"), d.join("supervisor.key")).unwrap();
    assert!(
        health(&gateway, &sup.addr).await.is_err(),
        "the old certificate is still served"
    );

    // A half-written key (the new certificate without its key yet) does not load: the last good
    // material is kept and the listener keeps serving.
    leaf(&d, "ca", "supervisor3", &format!("{TD}/supervisor"));
    std::fs::copy(d.join("supervisor3.pem"), d.join("supervisor.pem")).unwrap();
    std::fs::write(
        d.join("supervisor.key"),
        "-----BEGIN PRIVATE KEY-----\ntruncated",
    )
    .unwrap();
    // This client's own certificate is from `ca`, which the listener trusts; it trusts the
    // server through `other-ca`, the CA of the last good certificate.
    let other_ca_client = ClientTls::new(&tls(&d, "gateway", "other-ca", &want), &d).unwrap();
    assert_eq!(
        health(&other_ca_client, &sup.addr)
            .await
            .expect("last good certificate served"),
        1
    );
    // The key arrives: the new certificate (from `ca`) is served.
    std::fs::copy(d.join("supervisor3.key"), d.join("supervisor.key")).unwrap();
    assert_eq!(
        health(&gateway, &sup.addr)
            .await
            .expect("new certificate served"),
        1
    );
}

/// A peer on the network (no certificate needed to open a TCP connection) opens many
/// connections and never starts a handshake: the listener keeps at most
/// `MAX_PENDING_HANDSHAKES` of them, closing the oldest, and an admitted peer still gets in at
/// once, in the middle of the flood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_cannot_keep_an_admitted_peer_out() {
    use tokio::io::AsyncReadExt;
    use warden_daemon::tls::MAX_PENDING_HANDSHAKES;

    let (_keep, d) = certs();
    let sup = supervisor(&d).await;
    let want = [format!("{TD}/supervisor")];
    let gateway = ClientTls::new(&tls(&d, "gateway", "ca", &[want[0].as_str()]), &d).unwrap();

    let flood = MAX_PENDING_HANDSHAKES + 44;
    let mut silent = Vec::with_capacity(flood);
    for _ in 0..flood {
        silent.push(
            tokio::net::TcpStream::connect(&sup.addr)
                .await
                .expect("a TCP connection"),
        );
    }
    // The admitted peer, while every silent connection is still open.
    let t = std::time::Instant::now();
    assert_eq!(health(&gateway, &sup.addr).await.expect("admitted"), 1);
    eprintln!(
        "admitted during a flood of {flood} silent connections in {:?}",
        t.elapsed()
    );

    // The first connections were closed long before the 10 s handshake timeout: the listener
    // did not hold them all.
    let mut closed_early = 0;
    for s in silent.iter_mut().take(flood - MAX_PENDING_HANDSHAKES) {
        let mut b = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_secs(3), s.read(&mut b)).await {
            closed_early += 1;
        }
    }
    assert_eq!(
        closed_early,
        flood - MAX_PENDING_HANDSHAKES,
        "the oldest silent connections were not dropped"
    );
}
