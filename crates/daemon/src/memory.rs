//! Handing freed heap back to the system. glibc keeps what a burst freed in its arenas (each
//! tokio worker thread has its own), so a daemon's RSS stays at the burst's peak after the burst
//! ended; a daemon calls [`return_free_memory`] after it dropped a large share of its state.
//!
//! Must never: free or move anything the program still holds (only the allocator's own free
//! lists are touched).

/// Returns the free pages of every malloc arena to the system (glibc's `malloc_trim(0)`); a no-op
/// elsewhere. It walks the heap, so call it off the async runtime's threads after a large
/// release, not per request.
pub fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only trims the allocator's own free lists; it may be called from any
    // thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// This process's resident set size in bytes (`VmRSS` of `/proc/self/status`), if readable.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    Some(crate::metrics::ProcessFigures::parse("", &status, 0).resident_bytes).filter(|b| *b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_is_handed_back() {
        let before = resident_bytes().expect("VmRSS is readable");
        // Many mid-sized blocks (below glibc's mmap threshold): freed, they stay in the arena.
        let blocks: Vec<Vec<u8>> = (0..4096).map(|i| vec![i as u8; 32 * 1024]).collect();
        let peak = resident_bytes().unwrap();
        drop(blocks);
        return_free_memory();
        let after = resident_bytes().unwrap();
        assert!(peak > before + 64 * 1024 * 1024, "{before} -> {peak}");
        assert!(
            after < peak - 64 * 1024 * 1024,
            "before {before}, peak {peak}, after {after}"
        );
    }
}
