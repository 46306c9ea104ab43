//! The last bytes an agent wrote to stderr, kept in a bounded ring, and the secret values of its
//! environment masked out of whatever of it is shown. Must never show a secret value, whole or cut.

use std::collections::VecDeque;

use super::*;

/// The last bytes an agent wrote to stderr, and the secret values it must never show.
#[derive(Default)]
pub struct StderrRing {
    pub(super) buf: VecDeque<u8>,
    pub(super) cap: usize,
    /// Values of the agent's environment variables with secret-looking names, longest first (so
    /// a secret containing another is masked whole).
    pub(super) secrets: Vec<String>,
}

impl StderrRing {
    pub(super) fn push(&mut self, bytes: &[u8]) {
        for b in bytes {
            if self.buf.len() == self.cap {
                self.buf.pop_front();
            }
            self.buf.push_back(*b);
        }
    }
    /// Everything retained, secrets masked.
    pub fn text(&self) -> String {
        let v: Vec<u8> = self.buf.iter().copied().collect();
        mask(&String::from_utf8_lossy(&v), &self.secrets)
    }

    /// The last `max` bytes (at a character boundary), secrets masked. Masking comes first so
    /// the cut can never leave a recognisable part of a secret behind.
    pub fn tail(&self, max: usize) -> String {
        let text = self.text();
        let mut start = text.len().saturating_sub(max);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text[start..].to_string()
    }
}

/// `text` with every occurrence of each secret replaced.
pub(super) fn mask(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for s in secrets {
        out = out.replace(s.as_str(), "[masked]");
    }
    out
}

/// The values to mask for an agent environment: those of secret-looking names, longest first.
pub(super) fn secret_values(env: &warden_sandbox::ChildEnv) -> Vec<String> {
    let mut v: Vec<String> = env
        .iter()
        .filter(|(k, _)| is_secret_name(&k.to_string_lossy()))
        .map(|(_, v)| v.to_string_lossy().into_owned())
        .filter(|v| !v.is_empty())
        .collect();
    v.sort_by_key(|s| std::cmp::Reverse(s.len()));
    v.dedup();
    v
}
