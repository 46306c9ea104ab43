//! `warden token new|hash`: a caller's bearer token and the `[[auth.tokens]]` entry the gateway
//! keeps for it (`principal` and the hex SHA-256 of the token, the format
//! `warden-gateway`'s `auth.tokens[].sha256` reads: the digest of the token text exactly as the
//! gateway hashes a presented token, whitespace around it trimmed).
//!
//! Must never: take a token from the command line (it would land in shell history and in `ps`:
//! `hash` reads it from standard input), or write a token anywhere but standard output.

use std::io::Read;

use sha2::{Digest, Sha256};

/// Why a token could not be made or hashed.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read random bytes: {0}")]
    Random(#[source] std::io::Error),
    #[error("cannot read the token from standard input: {0}")]
    Stdin(#[source] std::io::Error),
    #[error(
        "the token read is {0} characters; the gateway refuses tokens shorter than 16 (`warden token new` makes one)"
    )]
    TooShort(usize),
    #[error("the token holds whitespace or a control character inside it; no caller could send it")]
    Whitespace,
    #[error("principal {0:?}: use letters, digits, '.', '_', '-' or '@' (1 to 128 characters)")]
    Principal(String),
}

/// The smallest token the gateway accepts from its token file (`auth.rs`), held for configured
/// tokens too.
pub const MIN_TOKEN_LEN: usize = 16;

/// A token and its configuration entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minted {
    pub principal: String,
    /// Empty for `hash` (the token came from the caller and is not printed again).
    pub token: String,
    pub sha256: String,
}

impl Minted {
    /// The `[[auth.tokens]]` entry for gateway.toml.
    pub fn toml(&self) -> String {
        format!(
            "[[auth.tokens]]\nprincipal = \"{}\"\nsha256 = \"{}\"\n",
            self.principal, self.sha256
        )
    }

    pub fn json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "principal": self.principal,
            "sha256": self.sha256,
            "toml": self.toml(),
        });
        if !self.token.is_empty() {
            v["token"] = serde_json::Value::String(self.token.clone());
        }
        v
    }
}

/// Hex SHA-256 of the token as the gateway hashes a presented one (trimmed).
pub fn digest_hex(token: &str) -> String {
    Sha256::digest(token.trim().as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A principal's name goes into TOML between quotes and into the audit: a plain word only.
fn check_principal(p: &str) -> Result<(), TokenError> {
    let ok = !p.is_empty()
        && p.len() <= 128
        && p.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
    if ok {
        Ok(())
    } else {
        Err(TokenError::Principal(p.to_string()))
    }
}

/// `warden token new`: 32 random bytes as 64 hex characters, and their entry.
pub fn new(principal: &str) -> Result<Minted, TokenError> {
    check_principal(principal)?;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(TokenError::Random)?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(Minted {
        principal: principal.to_string(),
        sha256: digest_hex(&token),
        token,
    })
}

/// `warden token hash`: the entry of a token an operator already has (`text`, as read).
pub fn hash(principal: &str, text: &str) -> Result<Minted, TokenError> {
    check_principal(principal)?;
    let token = text.trim();
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(TokenError::Whitespace);
    }
    if token.chars().count() < MIN_TOKEN_LEN {
        return Err(TokenError::TooShort(token.chars().count()));
    }
    Ok(Minted {
        principal: principal.to_string(),
        token: String::new(),
        sha256: digest_hex(token),
    })
}

/// Reads the token for `hash` from standard input (its first line).
pub fn read_stdin() -> Result<String, TokenError> {
    let mut text = String::new();
    std::io::stdin()
        .take(64 * 1024)
        .read_to_string(&mut text)
        .map_err(TokenError::Stdin)?;
    Ok(text.lines().next().unwrap_or("").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest is the gateway's: SHA-256 of the exact token text, as `printf '%s' T |
    /// sha256sum` gives it (the recipe gateway.toml used to print), a trailing newline ignored.
    #[test]
    fn the_digest_is_sha256_of_the_trimmed_token() {
        // printf '%s' 0123456789abcdef | sha256sum
        let want = "9f9f5111f7b27a781f1f1ddde5ebc2dd2b796bfc7365c9c28b548e564176929f";
        assert_eq!(digest_hex("0123456789abcdef"), want);
        let m = match hash("ci", "0123456789abcdef\n") {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(m.sha256, want);
        assert_eq!(
            m.toml(),
            format!("[[auth.tokens]]\nprincipal = \"ci\"\nsha256 = \"{want}\"\n")
        );
    }

    #[test]
    fn new_tokens_differ_and_match_their_digest() {
        let (a, b) = match (new("alice"), new("alice")) {
            (Ok(a), Ok(b)) => (a, b),
            _ => panic!("cannot mint"),
        };
        assert_ne!(a.token, b.token);
        assert_eq!(a.token.len(), 64);
        assert_eq!(a.sha256, digest_hex(&a.token));
    }

    #[test]
    fn short_spaced_tokens_and_odd_principals_are_refused() {
        assert!(matches!(hash("ci", "short"), Err(TokenError::TooShort(5))));
        assert!(matches!(
            hash("ci", "0123456789 abcdef"),
            Err(TokenError::Whitespace)
        ));
        assert!(matches!(
            hash("a\"b", "0123456789abcdef"),
            Err(TokenError::Principal(_))
        ));
        assert!(matches!(new(""), Err(TokenError::Principal(_))));
    }
}
