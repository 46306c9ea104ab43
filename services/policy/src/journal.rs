//! The audit journal: the durability point of `audit.sync = true`.
//!
//! Each durable audit record is also appended to a small file of its own, and the answer waits
//! for an `fdatasync` of that file (group-committed by [`crate::audit::AuditLog`]) instead of a
//! flush of the whole sled store. A sled 0.34 flush seals its log buffer and hands the write to
//! its I/O pool, waking all seven of its idle threads for one write: measured at about 170 µs of
//! the daemon's CPU per flush, more than everything else a decision costs together. An
//! `fdatasync` of this file costs 40–60 µs of CPU, and is stronger: sled's flush uses
//! `sync_file_range`, which neither flushes the disk's write cache nor the file's metadata.
//!
//! Each file is kept zero-filled and allocated to a fixed size ([`JournalFile::reset`]), so an
//! entry overwrites allocated blocks and its `fdatasync` has no metadata to commit: measured on
//! the build machine, 92 µs (p50) instead of 135 µs for an `fdatasync` after an append.
//!
//! Two files, `audit-journal-0` and `-1`, alternate: when the active one grows past a limit the
//! log switches to the other, flushes sled (which now holds every record of the old file on
//! disk) and empties the old one. On open, both files are replayed into sled (idempotent: a
//! record is written under its own sequence number), sled is flushed and both are emptied.
//!
//! Entry: `len u32 LE | check [u8; 8] | seq u64 BE | record bytes`, where `len` counts the last
//! two fields and `check` is the first 8 bytes of their SHA-256. Replay stops at the first entry
//! that does not check out: a write torn by a crash. Such an entry was never answered (the
//! answer waits for the `fdatasync` after it), and nothing after it can have been synced.
//!
//! Must never: follow a symlink to its files, or be readable by anyone but the daemon's user.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Entries larger than this are not something this daemon wrote (raw inputs are limited, and
/// records carry only their digest): treat as corruption.
const MAX_ENTRY: usize = 16 << 20;
const HEADER: usize = 4 + 8;

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("audit journal {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One journal file: its handle and the length of its valid entries (where the next one goes).
pub struct JournalFile {
    pub file: std::sync::Arc<File>,
    pub path: PathBuf,
    pub len: u64,
    /// How far writes (including failed ones) have reached since the last reset: what a reset
    /// must zero.
    dirty: u64,
}

impl JournalFile {
    /// Opens (creating, mode 0600, never through a symlink) the journal file at `path`.
    pub fn open(path: &Path) -> Result<Self, JournalError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|source| JournalError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Self {
            file: std::sync::Arc::new(file),
            path: path.to_path_buf(),
            len: 0,
            dirty: 0,
        })
    }

    /// A second handle on the same file and state, for work done outside the log's lock while
    /// nothing else writes to this file.
    pub fn share(&self) -> Self {
        Self {
            file: std::sync::Arc::clone(&self.file),
            path: self.path.clone(),
            len: self.len,
            dirty: self.dirty,
        }
    }

    fn err(&self, source: std::io::Error) -> JournalError {
        JournalError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Every intact entry from the start of the file, in order: `(seq, record bytes)`.
    pub fn entries(&self) -> Result<Vec<(u64, Vec<u8>)>, JournalError> {
        let mut all = Vec::new();
        (&*self.file)
            .read_to_end(&mut all)
            .map_err(|e| self.err(e))?;
        Ok(parse(&all))
    }

    /// Writes one entry after the last valid one. On error nothing counts as written: the next
    /// entry overwrites whatever part of this one reached the file.
    pub fn write(&mut self, seq: u64, record: &[u8]) -> Result<(), JournalError> {
        let entry = encode(seq, record);
        self.dirty = self.dirty.max(self.len + entry.len() as u64);
        self.file
            .write_all_at(&entry, self.len)
            .map_err(|e| self.err(e))?;
        self.len += entry.len() as u64;
        Ok(())
    }

    /// Empties the file (only once its records are on disk in sled): zeroes what was written,
    /// makes it exactly `size` bytes of allocated zeros and syncs that, so later entries
    /// overwrite in place. Blocking; `whole` zeroes the entire existing file (at open, when
    /// nothing is known about its contents).
    pub fn reset(&mut self, size: u64, whole: bool) -> Result<(), JournalError> {
        let existing = if whole {
            self.file.metadata().map_err(|e| self.err(e))?.len()
        } else {
            self.dirty
        };
        let upto = existing.max(size);
        const CHUNK: usize = 1 << 20;
        let zeros = vec![0u8; CHUNK.min(upto as usize)];
        let mut at = 0u64;
        while at < upto {
            let n = (upto - at).min(CHUNK as u64) as usize;
            self.file
                .write_all_at(&zeros[..n], at)
                .map_err(|e| self.err(e))?;
            at += n as u64;
        }
        self.file.set_len(size).map_err(|e| self.err(e))?;
        self.file.sync_all().map_err(|e| self.err(e))?;
        self.len = 0;
        self.dirty = 0;
        Ok(())
    }
}

fn check(body: &[u8]) -> [u8; 8] {
    let d = Sha256::digest(body);
    let mut c = [0u8; 8];
    c.copy_from_slice(&d[..8]);
    c
}

fn encode(seq: u64, record: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(HEADER + 8 + record.len());
    body.extend_from_slice(&[0u8; HEADER]);
    body.extend_from_slice(&seq.to_be_bytes());
    body.extend_from_slice(record);
    let len = (body.len() - HEADER) as u32;
    let c = check(&body[HEADER..]);
    body[..4].copy_from_slice(&len.to_le_bytes());
    body[4..HEADER].copy_from_slice(&c);
    body
}

/// The intact entries at the start of `buf`; stops at the first torn or corrupt one.
fn parse(mut buf: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    while buf.len() >= HEADER {
        let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if !(8..=MAX_ENTRY).contains(&len) || buf.len() < HEADER + len {
            break;
        }
        let body = &buf[HEADER..HEADER + len];
        if check(body)[..] != buf[4..HEADER] {
            break;
        }
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&body[..8]);
        out.push((u64::from_be_bytes(seq), body[8..].to_vec()));
        buf = &buf[HEADER + len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_a_torn_or_flipped_tail_is_cut_off()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("j");
        let mut j = JournalFile::open(&path)?;
        j.write(7, b"first")?;
        j.write(8, b"")?;
        j.write(9, b"third")?;
        let full = std::fs::read(&path)?;
        assert_eq!(
            parse(&full),
            vec![
                (7, b"first".to_vec()),
                (8, Vec::new()),
                (9, b"third".to_vec())
            ]
        );
        // A crash in the middle of the last write.
        assert_eq!(parse(&full[..full.len() - 2]).len(), 2);
        // A flipped bit in the middle entry: it and everything after it are dropped.
        let mut flipped = full.clone();
        let second = full.len() - (HEADER + 8 + 5) - 2;
        flipped[second] ^= 1;
        assert_eq!(parse(&flipped), vec![(7, b"first".to_vec())]);
        // An absurd length is corruption, not an allocation.
        let mut huge = full.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse(&huge).is_empty());
        // Reopened, the entries are read back; a reset leaves allocated zeros and no entries,
        // and the next entries go at the start again.
        let mut again = JournalFile::open(&path)?;
        assert_eq!(again.entries()?.len(), 3);
        again.reset(4096, true)?;
        assert_eq!(std::fs::metadata(&path)?.len(), 4096);
        assert!(JournalFile::open(&path)?.entries()?.is_empty());
        again.write(10, b"after")?;
        assert_eq!(
            JournalFile::open(&path)?.entries()?,
            vec![(10, b"after".to_vec())]
        );
        Ok(())
    }

    #[test]
    fn the_journal_is_private_and_never_opened_through_a_symlink()
    -> Result<(), Box<dyn std::error::Error>> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("j");
        JournalFile::open(&path)?;
        assert_eq!(
            std::fs::metadata(&path)?.permissions().mode() & 0o777,
            0o600
        );
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "")?;
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link)?;
        assert!(JournalFile::open(&link).is_err());
        Ok(())
    }
}
