//! Test certificates made by `openssl` (the Debian package): a CA, and leaves whose URI SAN is
//! a SPIFFE ID — what the mutual-TLS tests of `warden-daemon` and the end-to-end tests use.
//! Included with `#[path]` by both (a module, not a test target of its own).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The trust domain and path prefix of the test identities.
pub const TD: &str = "spiffe://example.org/warden";

pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs (the Debian package `openssl`)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA named `ca` in `dir` (ca.pem, ca.key).
pub fn ca(dir: &Path, ca: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={ca}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// A leaf `name` (name.pem, name.key) signed by `ca`, whose URI SAN is `id`.
pub fn leaf(dir: &Path, ca: &str, name: &str, id: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    let ext = dir.join(format!("{name}.ext"));
    std::fs::write(
        &ext,
        format!(
            "subjectAltName=URI:{id}\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        ),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ],
    );
}

/// A CA `ca`, another CA `other-ca`, and leaves for the supervisor, gateway and policy roles
/// signed by `ca`, plus an `impostor` with the gateway's identity signed by `other-ca`.
pub fn certs() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    ca(&d, "ca");
    ca(&d, "other-ca");
    leaf(&d, "ca", "supervisor", &format!("{TD}/supervisor"));
    leaf(&d, "ca", "gateway", &format!("{TD}/gateway"));
    leaf(&d, "ca", "policy", &format!("{TD}/policy"));
    leaf(&d, "other-ca", "impostor", &format!("{TD}/gateway"));
    (dir, d)
}
