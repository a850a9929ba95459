//! Giving freed heap back to the system after load.
//!
//! glibc returns memory to the kernel only from the top of each arena, so once thousands of
//! agents or connections have come and gone the pages they used stay resident although
//! nothing uses them: after 5,000 agents left a server, its allocator held 258 MB for 5.5 MB
//! in use (BENCHMARKS.md). Every [`CHECK_INTERVAL`] the server and the agent look at the
//! allocator's free bytes, and when they grew by [`MIN_GROWTH`] since the last trim and
//! exceed the bytes in use, ask glibc for the free pages back (`malloc_trim(0)`, which also
//! releases pages in the middle of each arena). An idle or steady process never trims.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often the allocator's figures are read.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// Free bytes that must have accumulated since the last trim: above what a steady process
/// frees and reuses between two checks, and below what an agent frees when its share of a
/// large fleet's tunnels closes (12,500 idle tunnels free about 27 MB, BENCHMARKS.md): about
/// 180 agents on a server or 4,000 tunnels on an agent.
pub const MIN_GROWTH: u64 = 8 << 20;

/// When to trim, from the allocator's free and in-use bytes at each check.
#[derive(Debug, Default)]
pub struct TrimPolicy {
    /// The least free bytes seen since the last trim (or since the start).
    low_water: Option<u64>,
}

impl TrimPolicy {
    /// Whether to trim now.
    pub fn should_trim(&mut self, free: u64, in_use: u64) -> bool {
        let low = self.low_water.map_or(free, |low| low.min(free));
        let trim = free >= low.saturating_add(MIN_GROWTH) && free >= in_use;
        // A trim leaves the free bytes counted (the chunks stay on the free lists, their
        // pages given back), so the next one waits for as much again.
        self.low_water = Some(if trim { free } else { low });
        trim
    }
}

/// Checks every [`CHECK_INTERVAL`] and trims when [`TrimPolicy`] says so, until `stop`.
/// Without glibc there is nothing to read or trim, and it returns at once.
pub async fn run(stop: CancellationToken) {
    let mut policy = TrimPolicy {
        low_water: allocator().map(|(free, _)| free),
    };
    let mut checks = tokio::time::interval(CHECK_INTERVAL);
    checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = checks.tick() => {}
        }
        let Some((free, in_use)) = allocator() else {
            return;
        };
        if policy.should_trim(free, in_use) {
            let released = tokio::task::spawn_blocking(trim).await.unwrap_or(false);
            tracing::debug!(free, in_use, released, "gave freed heap back to the system");
        }
    }
}

/// The allocator's free and in-use bytes.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn allocator() -> Option<(u64, u64)> {
    // SAFETY: mallinfo2 takes no arguments, reads the allocator's counters under its own
    // locks and returns a plain struct by value (glibc 2.33 and later).
    #[allow(unsafe_code)]
    let info = unsafe { libc::mallinfo2() };
    Some((info.fordblks as u64, info.uordblks as u64))
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn allocator() -> Option<(u64, u64)> {
    None
}

/// Gives freed heap back to the system now, after a large allocation known to be over (a
/// CPU profile's symbolization).
pub(crate) fn give_back() {
    let released = trim();
    tracing::debug!(released, "gave freed heap back to the system");
}

/// `malloc_trim(0)`: whether glibc gave anything back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() -> bool {
    // SAFETY: malloc_trim takes no pointers; it walks the allocator's own free lists under
    // the arenas' locks and only advises the kernel about pages no allocation uses.
    #[allow(unsafe_code)]
    let released = unsafe { libc::malloc_trim(0) };
    released == 1
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn trims_once_after_a_burst_and_again_only_after_another() {
        let mut policy = TrimPolicy::default();
        // Steady: small free figures never trim.
        for free in [MIB, 3 * MIB, 2 * MIB] {
            assert!(!policy.should_trim(free, 10 * MIB));
        }
        // Agents came and went: 200 MiB free, 5 MiB in use.
        assert!(policy.should_trim(200 * MIB, 5 * MIB));
        // The freed chunks stay counted after the trim: no second trim for them.
        assert!(!policy.should_trim(200 * MIB, 5 * MIB));
        assert!(!policy.should_trim(200 * MIB + MIN_GROWTH / 2, 5 * MIB));
        // Reused by a new burst (free falls), then freed again: trim again.
        assert!(!policy.should_trim(20 * MIB, 185 * MIB));
        assert!(policy.should_trim(210 * MIB, 5 * MIB));
    }

    #[test]
    fn trims_an_agent_whose_share_of_a_large_fleet_closed() {
        // 12,500 idle tunnels on an agent free about 27 MB; it uses 4 MiB afterwards.
        let mut policy = TrimPolicy::default();
        assert!(!policy.should_trim(MIB, 30 * MIB));
        assert!(policy.should_trim(27 * MIB, 4 * MIB));
    }

    #[test]
    fn never_trims_while_most_of_the_heap_is_in_use() {
        let mut policy = TrimPolicy::default();
        assert!(!policy.should_trim(0, 10 * MIB));
        assert!(!policy.should_trim(100 * MIB, 300 * MIB));
    }

    #[test]
    fn freed_chunks_below_a_live_one_are_given_back() {
        // 16 MiB in chunks below glibc's mmap threshold (128 KiB), then one allocation above
        // them, so freeing them cannot shrink the heap from its top. The pin is larger than
        // any chunk free before the test, so it comes from the top too.
        let held: Vec<Vec<u8>> = (0..256).map(|_| vec![1u8; 64 * 1024]).collect();
        let pin = vec![1u8; 100 * 1024];
        let (free_before, in_use) = allocator().expect("glibc");
        assert!(in_use >= 16 * MIB, "in use {in_use}");
        drop(held);
        let (free_after, _) = allocator().expect("glibc");
        assert!(
            free_after >= free_before + 15 * MIB,
            "{free_before} -> {free_after}: the chunks should sit free below the pin"
        );
        assert!(trim(), "malloc_trim gave nothing back");
        drop(pin);
    }
}
