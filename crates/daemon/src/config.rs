//! Configuration loading: file → environment → flags, then typed and validated.
//!
//! Every daemon's configuration is a struct with `#[serde(deny_unknown_fields)]`, so a misspelt key
//! is an error that names it rather than a setting silently ignored.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Where a configuration came from, for error messages.
#[derive(Debug, Clone)]
pub enum Origin {
    File(PathBuf),
    Embedded,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::File(p) => write!(f, "{}", p.display()),
            Origin::Embedded => f.write_str("the embedded default configuration"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: {message}")]
    Syntax { origin: Origin, message: String },
    #[error("{origin}: key `{key}`: {message}")]
    Key {
        origin: Origin,
        key: String,
        message: String,
    },
    #[error("override `{0}` is not KEY=VALUE")]
    Override(String),
}

impl ConfigError {
    /// A validation error for `key`.
    pub fn invalid(origin: &Origin, key: &str, message: impl Into<String>) -> Self {
        ConfigError::Key {
            origin: origin.clone(),
            key: key.to_string(),
            message: message.into(),
        }
    }
}

/// A configuration value of type `T` and where it came from.
#[derive(Debug, Clone)]
pub struct LoadedConfig<T> {
    pub value: T,
    pub origin: Origin,
}

/// Loads `T` from `file` (or `embedded` when there is none), applies environment overrides named
/// `{env_prefix}__SECTION__KEY` (e.g. `WARDEN_POLICY__DAEMON__LOG_FORMAT=json`), then `--set`
/// overrides, and deserializes with the key path in any error.
pub fn load<T: DeserializeOwned>(
    file: Option<&Path>,
    embedded: &str,
    env_prefix: &str,
    sets: &[String],
) -> Result<LoadedConfig<T>, ConfigError> {
    let (text, origin) = match file {
        Some(p) => (
            std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.to_path_buf(),
                source,
            })?,
            Origin::File(p.to_path_buf()),
        ),
        None => (embedded.to_string(), Origin::Embedded),
    };
    let mut table: toml::Table =
        text.parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax {
                origin: origin.clone(),
                // Kept as the toml crate writes it: the line, the caret under the column, the
                // reason (on one line the caret points nowhere).
                message: e.to_string().trim_end().to_string(),
            })?;
    let prefix = format!("{env_prefix}__");
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with(&prefix))
        .collect();
    env.sort();
    for (k, v) in env {
        let key = k[prefix.len()..].to_ascii_lowercase().replace("__", ".");
        set_key(&mut table, &key, &v);
    }
    for s in sets {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| ConfigError::Override(s.clone()))?;
        set_key(&mut table, k.trim(), v.trim());
    }
    let value = serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let key = e.path().to_string();
        ConfigError::Key {
            origin: origin.clone(),
            key,
            message: e.into_inner().to_string(),
        }
    })?;
    Ok(LoadedConfig { value, origin })
}

/// Sets a dotted key, parsing the value as TOML where it parses (numbers, booleans, arrays) and
/// as a string otherwise.
fn set_key(table: &mut toml::Table, key: &str, raw: &str) {
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let mut parts: Vec<&str> = key.split('.').collect();
    let Some(last) = parts.pop() else { return };
    let mut cur = table;
    for p in parts {
        let entry = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        let Some(t) = entry.as_table_mut() else {
            return;
        };
        cur = t;
    }
    cur.insert(last.to_string(), value);
}

/// Settings every daemon has under `[daemon]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonSection {
    /// The daemon's state directory (its sled store and records live here).
    pub state_dir: PathBuf,
    /// `human` or `json`.
    #[serde(default = "default_log_format")]
    pub log_format: String,
    /// A tracing filter, e.g. `info` or `warden=debug,info`.
    #[serde(default = "default_log_level")]
    pub log_level: String,
    /// How long in-flight calls may run after SIGTERM before they are aborted.
    #[serde(default = "default_grace")]
    pub shutdown_grace_ms: u64,
    /// Where the daemon serves its Prometheus metrics over plain HTTP (`GET /metrics`), e.g.
    /// `127.0.0.1:9464`; unset (the default) = no metrics listener. Prometheus cannot scrape a
    /// Unix socket, so this is TCP; it has no authentication: keep it on loopback or a network
    /// only the monitoring host reaches.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// A file holding a token every metrics request must carry (`Authorization: Bearer
    /// <token>`; Prometheus's `authorization.credentials_file`); unset = no token asked.
    #[serde(default)]
    pub metrics_token_file: Option<std::path::PathBuf>,
    /// The OpenTelemetry collector this daemon exports its traces to over OTLP/gRPC, e.g.
    /// `http://127.0.0.1:4317`; unset = the `OTEL_EXPORTER_OTLP_ENDPOINT` environment variable
    /// decides (the OpenTelemetry specification's name, what a systemd drop-in or a Kubernetes
    /// manifest sets), and with neither, no traces are exported.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
}

fn default_log_format() -> String {
    "human".into()
}
fn default_log_level() -> String {
    "info".into()
}
fn default_grace() -> u64 {
    5000
}

impl DaemonSection {
    pub fn validate(&self, origin: &Origin) -> Result<(), ConfigError> {
        if !matches!(self.log_format.as_str(), "human" | "json") {
            return Err(ConfigError::invalid(
                origin,
                "daemon.log_format",
                format!("must be \"human\" or \"json\", not {:?}", self.log_format),
            ));
        }
        if let Some(addr) = &self.metrics_listen
            && addr.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(ConfigError::invalid(
                origin,
                "daemon.metrics_listen",
                format!("must be an IP address and port such as \"127.0.0.1:9464\", not {addr:?}"),
            ));
        }
        if self.state_dir.as_os_str().is_empty() {
            return Err(ConfigError::invalid(
                origin,
                "daemon.state_dir",
                "must not be empty",
            ));
        }
        Ok(())
    }
}

/// One gRPC listener: a Unix socket (the default) or, explicitly, TCP.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// Unix socket path. A relative path is resolved against the state directory.
    pub socket: Option<PathBuf>,
    /// TCP address (`127.0.0.1:7001`). No peer credentials exist on TCP, so it requires
    /// `allow_any_peer = true`.
    pub tcp: Option<String>,
    /// Socket file mode, octal text such as "0660".
    #[serde(default = "default_mode")]
    pub mode: String,
    /// Group that owns the socket file (so its members can connect).
    pub group: Option<String>,
    /// Peer uids allowed to call. Empty together with `allow_gids` = only this daemon's own uid.
    #[serde(default)]
    pub allow_uids: Vec<u32>,
    /// Peer gids (primary group of the peer process) allowed to call.
    #[serde(default)]
    pub allow_gids: Vec<u32>,
    /// Accept any peer (required for plain TCP; never the default).
    #[serde(default)]
    pub allow_any_peer: bool,
    /// Mutual TLS on a `tcp` listener: peers are admitted by the SPIFFE ID of their
    /// certificate (`tls.admit`) instead of a uid, and `allow_any_peer` is not needed.
    #[serde(default)]
    pub tls: Option<crate::tls::TlsConfig>,
}

fn default_mode() -> String {
    "0660".into()
}

impl ListenerConfig {
    /// Checks the `listen` and `admin` listeners of a daemon with two APIs, and that they are
    /// not one socket (each has its own allowlist; `why` says whose API is whose).
    pub fn validate_listen_and_admin(
        listen: &ListenerConfig,
        admin: &ListenerConfig,
        origin: &Origin,
        why: &str,
    ) -> Result<(), ConfigError> {
        listen.validate(origin, "listen")?;
        admin.validate(origin, "admin")?;
        if listen.socket.is_some() && listen.socket == admin.socket {
            return Err(ConfigError::invalid(
                origin,
                "admin.socket",
                format!("must differ from listen.socket: {why}"),
            ));
        }
        Ok(())
    }

    /// A Unix listener at `path` allowing only the current uid.
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        ListenerConfig {
            socket: Some(path.into()),
            tcp: None,
            mode: default_mode(),
            group: None,
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            allow_any_peer: false,
            tls: None,
        }
    }

    /// The socket mode as a number.
    pub fn mode_bits(&self) -> Option<u32> {
        u32::from_str_radix(self.mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
    }

    /// Checks the listener; `key` is its place in the file (e.g. `listen` or `admin`).
    pub fn validate(&self, origin: &Origin, key: &str) -> Result<(), ConfigError> {
        match (&self.socket, &self.tcp) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::invalid(
                    origin,
                    key,
                    "set either `socket` or `tcp`, not both",
                ));
            }
            (None, None) => {
                return Err(ConfigError::invalid(
                    origin,
                    &format!("{key}.socket"),
                    "a listener needs `socket` (or `tcp`)",
                ));
            }
            (None, Some(addr)) => {
                if addr.parse::<std::net::SocketAddr>().is_err() {
                    return Err(ConfigError::invalid(
                        origin,
                        &format!("{key}.tcp"),
                        format!("{addr:?} is not an address like 127.0.0.1:7001"),
                    ));
                }
                match &self.tls {
                    Some(tls) => {
                        if self.allow_any_peer {
                            return Err(ConfigError::invalid(
                                origin,
                                &format!("{key}.allow_any_peer"),
                                "a mutual-TLS listener admits by certificate identity (tls.admit); remove allow_any_peer",
                            ));
                        }
                        if let Err((k, why)) = tls.check() {
                            return Err(ConfigError::invalid(origin, &format!("{key}.{k}"), why));
                        }
                    }
                    None if !self.allow_any_peer => {
                        return Err(ConfigError::invalid(
                            origin,
                            &format!("{key}.allow_any_peer"),
                            "a TCP listener has no peer credentials; set tls (mutual TLS, peers admitted by certificate identity) or allow_any_peer = true to accept that",
                        ));
                    }
                    None => {}
                }
            }
            (Some(_), None) => {
                if self.tls.is_some() {
                    return Err(ConfigError::invalid(
                        origin,
                        &format!("{key}.tls"),
                        "TLS is for `tcp` listeners; a Unix socket admits by peer uid",
                    ));
                }
            }
        }
        if self.mode_bits().is_none() {
            return Err(ConfigError::invalid(
                origin,
                &format!("{key}.mode"),
                format!("{:?} is not an octal file mode like \"0660\"", self.mode),
            ));
        }
        if let Some(g) = &self.group
            && nix::unistd::Group::from_name(g).ok().flatten().is_none()
        {
            return Err(ConfigError::invalid(
                origin,
                &format!("{key}.group"),
                format!("no such group {g:?}"),
            ));
        }
        Ok(())
    }

    /// The socket path, relative paths resolved against `state_dir`.
    pub fn socket_path(&self, state_dir: &Path) -> Option<PathBuf> {
        self.socket.as_ref().map(|p| {
            if p.is_absolute() {
                p.clone()
            } else {
                state_dir.join(p)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Cfg {
        daemon: DaemonSection,
        listen: ListenerConfig,
    }

    const BASE: &str = "[daemon]\nstate_dir = \"/var/lib/x\"\n[listen]\nsocket = \"x.sock\"\n";

    #[test]
    fn a_syntax_error_keeps_its_caret_diagram() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, "[daemon\nstate_dir = \"x\"\n").unwrap();
        let Err(e) = load::<Cfg>(Some(&file), BASE, "WARDEN_TEST_SYNTAX", &[]) else {
            panic!("a syntax error is refused");
        };
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("{}: TOML parse error at line 1", file.display())),
            "{text}"
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines.len() >= 4,
            "on one line the caret points nowhere: {text}"
        );
        assert!(lines.iter().any(|l| l.ends_with("[daemon")), "{text}");
        assert!(lines.iter().any(|l| l.trim_end().ends_with('^')), "{text}");
    }

    #[test]
    fn an_unknown_key_is_named_with_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(&f, format!("{BASE}modee = \"0600\"\n")).unwrap();
        let err = load::<Cfg>(Some(&f), "", "WARDEN_TEST_A", &[]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("c.toml"), "{text}");
        assert!(text.contains("modee"), "{text}");
    }

    #[test]
    fn a_wrong_type_names_the_dotted_key() {
        let err = load::<Cfg>(
            None,
            "[daemon]\nstate_dir = 5\n[listen]\nsocket = \"x\"\n",
            "WARDEN_TEST_B",
            &[],
        )
        .unwrap_err();
        assert!(err.to_string().contains("daemon.state_dir"), "{err}");
    }

    #[test]
    fn flags_override_the_file_and_values_are_typed() {
        let c = load::<Cfg>(
            None,
            BASE,
            "WARDEN_TEST_C",
            &[
                "daemon.log_format=json".into(),
                "listen.allow_uids=[1, 2]".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.value.daemon.log_format, "json");
        assert_eq!(c.value.listen.allow_uids, vec![1, 2]);
    }

    #[test]
    fn environment_overrides_apply() {
        // SAFETY: this test's variable name is unique to it.
        unsafe { std::env::set_var("WARDEN_TEST_D__DAEMON__LOG_LEVEL", "debug") };
        let c = load::<Cfg>(None, BASE, "WARDEN_TEST_D", &[]).unwrap();
        assert_eq!(c.value.daemon.log_level, "debug");
    }

    #[test]
    fn syntax_errors_name_the_file() {
        let err = load::<Cfg>(None, "[daemon\n", "WARDEN_TEST_E", &[]).unwrap_err();
        assert!(err.to_string().contains("embedded default"), "{err}");
    }

    #[test]
    fn listener_validation_names_keys() {
        let o = Origin::Embedded;
        let mut l = ListenerConfig::unix("a.sock");
        l.mode = "999".into();
        assert!(
            l.validate(&o, "admin")
                .unwrap_err()
                .to_string()
                .contains("admin.mode")
        );
        let mut l = ListenerConfig::unix("a.sock");
        l.socket = None;
        l.tcp = Some("127.0.0.1:1".into());
        let e = l.validate(&o, "listen").unwrap_err().to_string();
        assert!(e.contains("listen.allow_any_peer"), "{e}");
        let mut l = ListenerConfig::unix("a.sock");
        l.group = Some("no-such-group-xyz".into());
        assert!(
            l.validate(&o, "listen")
                .unwrap_err()
                .to_string()
                .contains("listen.group")
        );
    }
}
