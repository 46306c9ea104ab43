//! One daemon's durable key-value store: a sled database under the daemon's state directory,
//! behind a small type so that storage stays one module.
//!
//! Owns: opening the database (refusing a path that is a symlink) with a bounded page cache,
//! named trees, get/put/delete, prefix scans and prefix deletion, atomic batches, explicit flushes
//! at durability points, and the size on disk.
//! Must never: be shared between daemons (each daemon has its own directory and system user),
//! or interpret the bytes it stores — callers own their encodings.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

/// Errors from the store; each names the database path or tree involved.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open store at {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: sled::Error,
    },
    #[error("store path {0} is a symlink; refusing to open it")]
    Symlink(PathBuf),
    #[error("cannot create store directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store tree {tree}: {source}")]
    Tree {
        tree: String,
        #[source]
        source: sled::Error,
    },
    #[error("store flush failed: {0}")]
    Flush(#[source] sled::Error),
}

/// A daemon's database. Cheap to clone (sled handles are reference counted).
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    path: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// One named keyspace of a [`Store`].
#[derive(Clone)]
pub struct Tree {
    tree: sled::Tree,
    name: String,
}

/// One stored entry: key and value bytes.
pub type Entry = (Vec<u8>, Vec<u8>);

/// An atomic set of writes to one [`Tree`].
#[derive(Default)]
pub struct Batch {
    inner: sled::Batch,
}

impl Batch {
    pub fn put(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        self.inner.insert(key.as_ref(), value.as_ref());
    }
    pub fn delete(&mut self, key: impl AsRef<[u8]>) {
        self.inner.remove(key.as_ref());
    }
}

/// How a [`Store`] is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// The page cache's capacity. sled's default (1 GiB) lets a daemon's RSS grow with its data
    /// for as long as it runs.
    pub cache_capacity_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            cache_capacity_bytes: 64 * 1024 * 1024,
        }
    }
}

/// How long an open waits for a lock the same process's just-dropped database still holds.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether sled could not take the database's file lock (it says so only in its message).
fn is_lock_held(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

impl Store {
    /// Opens (creating if needed) the database in `dir` with the default options.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(dir, StoreOptions::default())
    }

    /// Opens (creating if needed) the database in `dir`. A `dir` that is a symlink is refused, so
    /// a planted link cannot redirect a daemon's state.
    pub fn open_with(dir: &Path, options: StoreOptions) -> Result<Self, StoreError> {
        if let Ok(meta) = std::fs::symlink_metadata(dir)
            && meta.file_type().is_symlink()
        {
            return Err(StoreError::Symlink(dir.to_path_buf()));
        }
        std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let config = sled::Config::new()
            .path(dir)
            .cache_capacity(options.cache_capacity_bytes);
        // A database dropped a moment ago in this process keeps its file lock until sled's
        // flusher thread lets go of it (up to its flush interval): a reopen waits that long
        // rather than fail. Another process holding the lock is still refused, after the wait.
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        let db = loop {
            match config.open() {
                Ok(db) => break db,
                Err(e) if is_lock_held(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(source) => {
                    return Err(StoreError::Open {
                        path: dir.to_path_buf(),
                        source,
                    });
                }
            }
        };
        Ok(Self {
            db,
            path: dir.to_path_buf(),
        })
    }

    /// The directory the database lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens a named tree (keyspace).
    pub fn tree(&self, name: &str) -> Result<Tree, StoreError> {
        let tree = self.db.open_tree(name).map_err(|source| StoreError::Tree {
            tree: name.to_string(),
            source,
        })?;
        Ok(Tree {
            tree,
            name: name.to_string(),
        })
    }

    /// Flushes every tree to disk; call at durability points (before answering a caller whose
    /// request must survive a crash).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map(|_| ()).map_err(StoreError::Flush)
    }

    /// The database's size on disk in bytes, as sled accounts it.
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.db.size_on_disk().map_err(StoreError::Flush)
    }
}

impl Tree {
    fn err(&self, source: sled::Error) -> StoreError {
        StoreError::Tree {
            tree: self.name.clone(),
            source,
        }
    }

    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, StoreError> {
        self.tree
            .get(key)
            .map(|v| v.map(|v| v.to_vec()))
            .map_err(|e| self.err(e))
    }

    pub fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), StoreError> {
        self.tree
            .insert(key.as_ref(), value.as_ref())
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    pub fn delete(&self, key: impl AsRef<[u8]>) -> Result<(), StoreError> {
        self.tree.remove(key).map(|_| ()).map_err(|e| self.err(e))
    }

    /// All entries whose key starts with `prefix`, in key order.
    pub fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> Result<Vec<Entry>, StoreError> {
        self.tree
            .scan_prefix(prefix)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())))
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(e))
    }

    /// The first `limit` entries whose key starts with `prefix`, in key order (oldest first
    /// for sequence-numbered keys).
    pub fn scan_prefix_first(
        &self,
        prefix: impl AsRef<[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        self.tree
            .scan_prefix(prefix)
            .take(limit)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())))
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(e))
    }

    /// The last `limit` entries in key order, newest (largest key) first.
    pub fn scan_rev(&self, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.tree
            .iter()
            .rev()
            .take(limit)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())))
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(e))
    }

    /// Up to `limit` entries whose key starts with `prefix` and sorts at or after `from`, in key
    /// order (a cursor's read: the entries after the last one seen).
    pub fn scan_prefix_from(
        &self,
        prefix: impl AsRef<[u8]>,
        from: impl AsRef<[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let prefix = prefix.as_ref();
        self.tree
            .range(from.as_ref()..)
            .take_while(|r| r.as_ref().map_or(true, |(k, _)| k.starts_with(prefix)))
            .take(limit)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())))
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(e))
    }

    /// Deletes every entry whose key starts with `prefix` (atomically); returns how many.
    pub fn delete_prefix(&self, prefix: impl AsRef<[u8]>) -> Result<usize, StoreError> {
        let mut batch = sled::Batch::default();
        let mut n = 0;
        for k in self.tree.scan_prefix(prefix).keys() {
            batch.remove(k.map_err(|e| self.err(e))?);
            n += 1;
        }
        self.tree.apply_batch(batch).map_err(|e| self.err(e))?;
        Ok(n)
    }

    /// Deletes every entry whose key starts with one of `prefixes`, in one atomic batch (none
    /// when nothing matches); returns how many. One batch for many prefixes matters with sled:
    /// each batch seals log buffers, each written by a job on sled's IO pool.
    pub fn delete_prefixes<P: AsRef<[u8]>>(&self, prefixes: &[P]) -> Result<usize, StoreError> {
        let mut batch = sled::Batch::default();
        let mut n = 0;
        for p in prefixes {
            for k in self.tree.scan_prefix(p).keys() {
                batch.remove(k.map_err(|e| self.err(e))?);
                n += 1;
            }
        }
        if n > 0 {
            self.tree.apply_batch(batch).map_err(|e| self.err(e))?;
        }
        Ok(n)
    }

    /// Applies all writes of `batch` atomically.
    pub fn apply(&self, batch: Batch) -> Result<(), StoreError> {
        self.tree.apply_batch(batch.inner).map_err(|e| self.err(e))
    }

    /// Flushes this tree to disk.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.tree.flush().map(|_| ()).map_err(|e| self.err(e))
    }

    pub fn len(&self) -> usize {
        self.tree.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_survive_reopen_and_batches_are_atomic() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("db");
        {
            let store = Store::open(&path)?;
            let t = store.tree("tasks")?;
            let mut b = Batch::default();
            b.put("task/1", "a");
            b.put("task/2", "b");
            b.put("other/1", "c");
            t.apply(b)?;
            t.delete("task/2")?;
            t.put("gone/1", "x")?;
            t.put("gone/2", "y")?;
            assert_eq!(t.delete_prefix("gone/")?, 2);
            store.flush()?;
        }
        let store = Store::open_with(
            &path,
            StoreOptions {
                cache_capacity_bytes: 1024 * 1024,
            },
        )?;
        assert!(store.size_on_disk()? > 0);
        let t = store.tree("tasks")?;
        assert!(t.scan_prefix("gone/")?.is_empty());
        assert_eq!(t.get("task/1")?, Some(b"a".to_vec()));
        assert_eq!(t.get("task/2")?, None);
        let scanned = t.scan_prefix("task/")?;
        assert_eq!(scanned, vec![(b"task/1".to_vec(), b"a".to_vec())]);
        assert_eq!(t.scan_rev(1)?[0].0, b"task/1".to_vec());
        Ok(())
    }

    #[test]
    fn a_reopen_right_after_a_drop_waits_for_the_lock_and_a_held_one_is_refused()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("db");
        for i in 0..30u32 {
            let store = Store::open(&path)?;
            store.tree("t")?.put("k", i.to_be_bytes())?;
        }
        let held = Store::open(&path)?;
        let started = std::time::Instant::now();
        match Store::open(&path) {
            Err(StoreError::Open { source, .. }) => assert!(is_lock_held(&source), "{source}"),
            other => panic!("a held database opened twice: {:?}", other.map(|_| ())),
        }
        assert!(started.elapsed() >= LOCK_WAIT);
        drop(held);
        assert!(Store::open(&path)?.tree("t")?.get("k")?.is_some());
        Ok(())
    }

    #[test]
    fn a_symlinked_state_directory_is_refused() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let real = dir.path().join("real");
        std::fs::create_dir(&real)?;
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link)?;
        assert!(matches!(Store::open(&link), Err(StoreError::Symlink(_))));
        Ok(())
    }
}
