//! A session's boundary (seed 000): its root and the one bit saying where the root came from,
//! whether execution is allowed in a root warden did not make, and the profile it is held to.
//! One definition for the rules (which judge against it) and the sandbox (which enforces it),
//! and the one conversion from the wire's profile number.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{RealFs, is_inside};

/// What the agent may do to its root. The zero value, and every default, is read-only: a
/// boundary that lost its profile changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Profile {
    /// advise / review: no edit, delete, move, execute or fetch; the root is bound read-only.
    #[default]
    ReadOnly,
    /// implement: files inside the root may change; the root is bound read-write.
    WorkspaceWrite,
}

impl Profile {
    /// The profile for its wire number (`warden.v1.Profile`: 0 = read-only, 1 =
    /// workspace-write); `None` for a number the contract does not define.
    pub fn from_wire(n: i32) -> Option<Profile> {
        match n {
            0 => Some(Profile::ReadOnly),
            1 => Some(Profile::WorkspaceWrite),
            _ => None,
        }
    }

    /// The wire number (the inverse of [`Profile::from_wire`]).
    pub fn wire(self) -> i32 {
        match self {
            Profile::ReadOnly => 0,
            Profile::WorkspaceWrite => 1,
        }
    }

    /// The name used in records and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::ReadOnly => "read-only",
            Profile::WorkspaceWrite => "workspace-write",
        }
    }
}

/// Seed 000's boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boundary {
    /// Absolute root, symlinks resolved once when the conversation opened.
    pub root: PathBuf,
    /// True only when warden created the directory itself.
    pub owned: bool,
    /// The operator allows execute/fetch/other in a root warden did not create.
    pub allow_execute: bool,
    pub profile: Profile,
}

impl Boundary {
    /// Whether `path` (relative paths are taken from the root) resolves inside the root now.
    /// Anything that cannot be resolved counts as outside. A question, never a licence to open
    /// the path (see [`crate::beneath`]).
    pub fn contains(&self, path: impl AsRef<Path>) -> bool {
        is_inside(&self.root, path, &RealFs).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_read_only_everywhere() {
        assert_eq!(Profile::default(), Profile::ReadOnly);
        assert_eq!(Profile::from_wire(0), Some(Profile::ReadOnly));
        assert_eq!(Profile::from_wire(1), Some(Profile::WorkspaceWrite));
        assert_eq!(Profile::from_wire(2), None);
        assert_eq!(Profile::from_wire(-1), None);
        for p in [Profile::ReadOnly, Profile::WorkspaceWrite] {
            assert_eq!(Profile::from_wire(p.wire()), Some(p));
        }
    }
}
