//! `bind_workspace`'s path rule: a proposed path is matched against the operator's workspaces
//! (as the supervisor resolved them) and is never handed on itself. `/`, a home directory or any
//! directory above one, and agent configuration homes are refused with the same validator the
//! supervisor and the policy use (`warden_containment::RootCheck`), by spelling and by directory
//! identity as far as the gateway can see the path; anything the operator has not configured is
//! refused whatever it is.

use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};
use warden_containment::{AgentHomes, RealFs, RootCheck, RootRefusal};
use warden_proto::v1::WorkspaceInfo;

/// Longest proposed path accepted.
pub const MAX_PATH: usize = 4096;

/// `path` made absolute-normal by spelling (`.` dropped, `..` applied); None when not absolute.
pub fn lexical(path: &str) -> Option<PathBuf> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
        }
    }
    Some(out)
}

/// The fingerprint of a binding: the workspace's name, canonical path and directory identity.
pub fn fingerprint(w: &WorkspaceInfo) -> String {
    let mut h = Sha256::new();
    h.update(w.name.as_bytes());
    h.update([0]);
    h.update(w.path.as_bytes());
    h.update([0]);
    h.update(w.identity.as_bytes());
    hex::encode(&h.finalize()[..16])
}

fn identity_of(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .ok()
        .map(|m| format!("{}:{}", m.dev(), m.ino()))
}

/// Matches a proposed path to one of `allowed`, or says why not (a sentence for the caller).
pub fn match_proposed(proposed: &str, allowed: &[WorkspaceInfo]) -> Result<WorkspaceInfo, String> {
    if proposed.len() > MAX_PATH || proposed.chars().any(char::is_control) {
        return Err(format!(
            "the proposed path must be at most {MAX_PATH} bytes without control characters"
        ));
    }
    let Some(spelled) = lexical(proposed) else {
        return Err(format!("{proposed:?} is not an absolute path"));
    };
    if spelled == Path::new("/") {
        return Err("the filesystem root is never a workspace".into());
    }
    let check = RootCheck::new(&AgentHomes::from_host(), &RealFs);
    let resolved = match check.check(Path::new(proposed), &RealFs) {
        Ok(r) => Some(r),
        Err(
            r @ (RootRefusal::FilesystemRoot | RootRefusal::Home(_) | RootRefusal::ConfigHome(_)),
        ) => return Err(format!("{proposed:?} is refused: it {r}")),
        // The gateway may not see the directory (its own user, its own mount view); the
        // supervisor's list was resolved and checked by the supervisor, so matching by spelling
        // is still exact for a path written as the operator configured it.
        Err(RootRefusal::NotAbsolute) => return Err(format!("{proposed:?} is not absolute")),
        Err(_) => None,
    };
    let id = resolved.as_deref().and_then(identity_of);
    let found = allowed.iter().find(|w| {
        let p = Path::new(&w.path);
        resolved.as_deref() == Some(p)
            || spelled == p
            || (id.is_some() && !w.identity.is_empty() && id.as_deref() == Some(&w.identity))
    });
    match found {
        Some(w) => Ok(w.clone()),
        None if allowed.is_empty() => Err(
            "no workspace is available to you (the supervisor's [workspaces], the gateway's [[agents.access]]); warden runs unbound in its own sandboxes"
                .into(),
        ),
        None => Err(format!(
            "{proposed:?} is not a workspace the operator allowed; allowed: {}",
            allowed
                .iter()
                .map(|w| w.path.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(name: &str, path: &str) -> WorkspaceInfo {
        WorkspaceInfo {
            name: name.into(),
            path: path.into(),
            allow_execute: false,
            identity: String::new(),
        }
    }

    #[test]
    fn root_homes_and_unlisted_paths_are_refused() {
        let allowed = vec![ws("p", "/srv/never-there-proj")];
        assert!(match_proposed("/", &allowed).unwrap_err().contains("root"));
        assert!(
            match_proposed("/srv/..", &allowed)
                .unwrap_err()
                .contains("root")
        );
        assert!(match_proposed("relative", &allowed).is_err());
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        let e = match_proposed(&home, &allowed).unwrap_err();
        assert!(e.contains("home"), "{e}");
        let other = tempfile::tempdir().unwrap();
        let e = match_proposed(other.path().to_str().unwrap(), &allowed).unwrap_err();
        assert!(e.contains("not a workspace the operator allowed"), "{e}");
        assert!(
            match_proposed("/srv/x", &[])
                .unwrap_err()
                .contains("no workspace")
        );
    }

    #[test]
    fn a_listed_workspace_matches_by_spelling_or_identity() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        let mut w = ws("p", real.to_str().unwrap());
        w.identity = identity_of(&real).unwrap();
        let link = dir.path().join("..").join(format!(
            "wlink-{}",
            real.file_name().unwrap().to_string_lossy()
        ));
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(
            match_proposed(real.to_str().unwrap(), &[w.clone()])
                .unwrap()
                .name,
            "p"
        );
        assert_eq!(
            match_proposed(link.to_str().unwrap(), &[w.clone()])
                .unwrap()
                .name,
            "p"
        );
        std::fs::remove_file(&link).unwrap();
        // Not visible to the gateway: matched by spelling only.
        let gone = ws("g", "/srv/never-there-proj");
        assert_eq!(
            match_proposed("/srv/./never-there-proj", &[gone])
                .unwrap()
                .name,
            "g"
        );
    }
}
