//! The agent card as served: built from the configuration, with one skill per agent the
//! supervisor lists (the supervisor's registry is the one source of agent names), rebuilt only
//! when that list changes so its ETag stays stable between changes.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;

use crate::a2a::{
    AgentCapabilities, AgentCard, AgentInterface, AgentProvider, AgentSkill,
    HttpAuthSecurityScheme, MutualTlsSecurityScheme, OpenIdConnectSecurityScheme, PROTOCOL_VERSION,
    SecurityRequirement, SecurityScheme, StringList,
};
use crate::config::GatewayConfig;
use crate::core::Core;
use crate::endpoints::{GRPC_BINDING, JSONRPC_BINDING, JSONRPC_PATH, REST_BINDING, REST_PATH};

/// Builds the agent card from the configuration (URLs from `http.public_url`, never the bind
/// address; one skill per configured agent).
pub fn agent_card(cfg: &GatewayConfig) -> AgentCard {
    let base = cfg.http.public_url.trim_end_matches('/');
    let mut schemes = std::collections::BTreeMap::new();
    // Any one requirement suffices (A2A: the list is alternatives): a static token, or a token
    // of any configured issuer.
    let mut requirements = Vec::new();
    if !cfg.auth.tokens.is_empty() || cfg.auth.token_file.is_some() {
        schemes.insert(
            "bearer".to_string(),
            SecurityScheme {
                http_auth_security_scheme: Some(HttpAuthSecurityScheme {
                    scheme: "Bearer".into(),
                    description: Some("A token configured on the gateway (warden up writes one to its state directory)".into()),
                }),
                ..SecurityScheme::default()
            },
        );
        requirements.push(requirement("bearer"));
    }
    for (i, (issuer, url)) in crate::oidc::Issuers::discovery_urls(&cfg.auth)
        .into_iter()
        .enumerate()
    {
        let name = format!("oidc{}", i + 1);
        schemes.insert(
            name.clone(),
            SecurityScheme {
                open_id_connect_security_scheme: Some(OpenIdConnectSecurityScheme {
                    open_id_connect_url: url,
                    description: Some(format!(
                        "An ID or access token of {issuer}, sent as Authorization: Bearer"
                    )),
                }),
                ..SecurityScheme::default()
            },
        );
        requirements.push(requirement(&name));
    }
    // Client certificates that `[[auth.certs]]` maps to callers.
    if cfg
        .http
        .tls
        .as_ref()
        .is_some_and(|t| t.client_certs != warden_daemon::tls::ClientCerts::Off)
        && !cfg.auth.certs.is_empty()
    {
        schemes.insert(
            "mtls".to_string(),
            SecurityScheme {
                mtls_security_scheme: Some(MutualTlsSecurityScheme {
                    description: Some(
                        "A client certificate of the gateway's client CA whose SPIFFE ID or subject CN is mapped to a caller"
                            .into(),
                    ),
                }),
                ..SecurityScheme::default()
            },
        );
        requirements.push(requirement("mtls"));
    }
    let mut card = AgentCard {
        name: cfg.card.name.clone(),
        description: cfg.card.description.clone(),
        supported_interfaces: vec![
            AgentInterface {
                url: format!("{base}{JSONRPC_PATH}"),
                protocol_binding: JSONRPC_BINDING.into(),
                protocol_version: PROTOCOL_VERSION.into(),
            },
            AgentInterface {
                url: format!("{base}{REST_PATH}"),
                protocol_binding: REST_BINDING.into(),
                protocol_version: PROTOCOL_VERSION.into(),
            },
        ]
        .into_iter()
        .chain(cfg.grpc_url().map(|url| AgentInterface {
            url,
            protocol_binding: GRPC_BINDING.into(),
            protocol_version: PROTOCOL_VERSION.into(),
        }))
        .collect(),
        provider: match (&cfg.card.organization, &cfg.card.organization_url) {
            (Some(o), Some(u)) => Some(AgentProvider {
                organization: o.clone(),
                url: u.clone(),
            }),
            _ => None,
        },
        version: env!("CARGO_PKG_VERSION").to_string(),
        capabilities: AgentCapabilities {
            streaming: true,
            push_notifications: cfg.push.enabled,
            extended_agent_card: true,
        },
        security_schemes: schemes,
        security_requirements: requirements,
        default_input_modes: vec!["text/plain".into(), "application/json".into()],
        default_output_modes: vec!["text/plain".into()],
        skills: cfg
            .agents
            .list
            .iter()
            .map(|a| AgentSkill {
                id: a.name.clone(),
                name: a.name.clone(),
                description: if a.description.is_empty() {
                    format!("the {} coding agent, supervised by warden", a.name)
                } else {
                    a.description.clone()
                },
                tags: if a.tags.is_empty() {
                    vec!["coding-agent".into()]
                } else {
                    a.tags.clone()
                },
                examples: vec![],
            })
            .collect(),
    };
    // The JSON endpoints also serve A2A 0.3 (compat03.rs): one 0.3 interface per JSON binding.
    let v03 = crate::translate03::interfaces_03(&card.supported_interfaces);
    card.supported_interfaces.extend(v03);
    card
}

fn requirement(scheme: &str) -> SecurityRequirement {
    let mut req = std::collections::BTreeMap::new();
    req.insert(scheme.to_string(), StringList { list: vec![] });
    SecurityRequirement { schemes: req }
}

/// One prepared card body with its caching headers.
#[derive(Debug, Clone)]
pub struct CardBody {
    pub body: Bytes,
    pub etag: String,
    pub last_modified: String,
    pub max_age: u64,
}

impl CardBody {
    /// `with_03`: the 0.3 fields beside the 1.0 ones (for a fetch that names no version, as 0.3
    /// clients send it); without, the card exactly as 1.0 defines it (for `A2A-Version: 1.0`,
    /// whose schema admits no other members).
    fn new(card: &AgentCard, max_age: u64, with_03: bool) -> Self {
        use sha2::{Digest, Sha256};
        let body = if with_03 {
            serde_json::to_vec(&crate::translate03::card_json(card))
        } else {
            serde_json::to_vec(card)
        }
        .unwrap_or_default();
        let etag = format!("\"{}\"", &hex::encode(Sha256::digest(&body))[..32]);
        let secs = crate::time::now_micros() / 1_000_000;
        Self {
            body: Bytes::from(body),
            etag,
            last_modified: crate::time::format_http_date(secs),
            max_age,
        }
    }
}

/// The agent list generation, the body with the 0.3 fields, the body without.
type Built = (u64, Arc<CardBody>, Arc<CardBody>);

/// The card response: the configured card with one skill per agent the gateway accepts now
/// (the supervisor's list once it has answered). A configured skill of the same name (the
/// gateway's `agents.list`) still gives its description and tags.
#[derive(Debug)]
pub struct CardResponse {
    base: AgentCard,
    max_age: u64,
    /// The agent list generation the cached bodies (with and without the 0.3 fields) were
    /// built from (None: not built yet).
    built: Mutex<Option<Built>>,
}

impl CardResponse {
    pub fn new(card: &AgentCard, max_age: u64) -> Self {
        Self {
            base: card.clone(),
            max_age,
            built: Mutex::new(None),
        }
    }

    /// The body for the agent list `core` holds now; `with_03` adds the 0.3 fields.
    pub fn current(&self, core: &Core, with_03: bool) -> Arc<CardBody> {
        let list = core.agents();
        let mut built = self.built.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((generation, dual, plain)) = built.as_ref()
            && *generation == list.generation
        {
            return if with_03 { dual.clone() } else { plain.clone() };
        }
        let card = self.with_skills(&list);
        let dual = Arc::new(CardBody::new(&card, self.max_age, true));
        let plain = Arc::new(CardBody::new(&card, self.max_age, false));
        *built = Some((list.generation, dual.clone(), plain.clone()));
        if with_03 { dual } else { plain }
    }

    /// The extended card (`GetExtendedAgentCard`) for an authenticated `caller`: the public
    /// card with one skill per agent that caller may use (`[[agents.access]]`, with the groups
    /// its own request carried), the default one tagged `default`.
    pub fn extended(&self, core: &Core, caller: &crate::auth::Identity) -> AgentCard {
        let list = core.agents_for(caller);
        let mut card = self.with_skills(&list);
        let principal = &caller.principal;
        card.description = format!("{} (the agents available to {principal})", card.description);
        for s in &mut card.skills {
            if s.id == list.default {
                s.tags.push("default".into());
            }
        }
        card
    }

    fn with_skills(&self, list: &crate::core::AgentList) -> AgentCard {
        let mut card = self.base.clone();
        card.skills = list
            .agents
            .iter()
            // An agent whose adapter or program is missing cannot start: not advertised.
            .filter(|a| a.available)
            .map(|a| {
                let configured = self.base.skills.iter().find(|s| s.id == a.name);
                AgentSkill {
                    id: a.name.clone(),
                    name: a.name.clone(),
                    description: match configured {
                        Some(s) if !s.description.is_empty() => s.description.clone(),
                        _ if !a.description.is_empty() => a.description.clone(),
                        _ => format!("the {} coding agent, supervised by warden", a.name),
                    },
                    tags: configured
                        .map(|s| s.tags.clone())
                        .unwrap_or_else(|| vec!["coding-agent".into()]),
                    examples: vec![],
                }
            })
            .collect();
        card
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_openid_connect_scheme_gets_its_0_3_type_and_url() {
        let mut cfg: crate::config::GatewayConfig = warden_daemon::config::load(
            None,
            crate::config::EMBEDDED,
            "WARDEN_GATEWAY_TEST_T03",
            &[r#"auth.oidc=[{issuer="https://idp.example", audiences=["w"]}]"#.to_string()],
        )
        .unwrap()
        .value;
        cfg.auth.token_file = Some("t".into());
        let card = crate::translate03::card_json(&agent_card(&cfg));
        let s = &card["securitySchemes"];
        assert_eq!(s["oidc1"]["type"], "openIdConnect", "{card}");
        assert_eq!(
            s["oidc1"]["openIdConnectUrl"],
            "https://idp.example/.well-known/openid-configuration"
        );
        assert_eq!(s["bearer"]["type"], "http", "{card}");
        assert_eq!(card["security"].as_array().map(Vec::len), Some(2), "{card}");
    }

    #[test]
    fn mapped_client_certificates_put_an_mtls_scheme_on_both_card_versions() {
        let load = |sets: &[&str]| -> crate::config::GatewayConfig {
            warden_daemon::config::load(
                None,
                crate::config::EMBEDDED,
                "WARDEN_GATEWAY_TEST_MTLS",
                &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            )
            .unwrap()
            .value
        };
        let tls = r#"http.tls={cert_file="g.pem", key_file="g.key", client_ca_file="ca.pem", client_certs="request"}"#;
        let cfg = load(&[
            tls,
            r#"auth.certs=[{spiffe_id="spiffe://example.org/ci", principal="ci"}]"#,
        ]);
        let card = agent_card(&cfg);
        assert!(card.security_schemes["mtls"].mtls_security_scheme.is_some());
        let v = serde_json::to_value(&card).unwrap();
        assert!(
            v["securitySchemes"]["mtls"]["mtlsSecurityScheme"]["description"].is_string(),
            "{v}"
        );
        let v03 = crate::translate03::card_json(&card);
        assert_eq!(v03["securitySchemes"]["mtls"]["type"], "mutualTLS", "{v03}");
        assert!(v03["security"].to_string().contains("mtls"), "{v03}");
        let g = crate::grpc_convert::card_to_pb(&card);
        assert!(matches!(
            g.security_schemes["mtls"].scheme,
            Some(warden_proto::a2a::v1::security_scheme::Scheme::MtlsSecurityScheme(_))
        ));
        // TLS without mapped certificates: no mtls scheme.
        let cfg = load(&[r#"http.tls={cert_file="g.pem", key_file="g.key"}"#]);
        assert!(!agent_card(&cfg).security_schemes.contains_key("mtls"));
    }
}
