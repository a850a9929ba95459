//! Heap statistics: what the C allocator holds (glibc's `mallinfo2`) and what the kernel
//! says the process uses (`/proc/self/status`). tether keeps the system allocator, so it
//! has no per-allocation heap profile to offer; these numbers answer "is it the heap, and
//! is it in use or just retained?".

use std::fmt::Write as _;

/// The statistics as `name value` lines, one per figure, in bytes.
pub fn statistics() -> String {
    let mut out = String::new();
    allocator(&mut out);
    for line in std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
    {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        if matches!(key, "VmRSS" | "VmHWM" | "VmData" | "RssAnon" | "VmSize") {
            let kib: u64 = value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .unwrap_or(0);
            let _ = writeln!(out, "process_{} {}", key.to_lowercase(), kib * 1024);
        }
    }
    out
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn allocator(out: &mut String) {
    // SAFETY: mallinfo2 takes no arguments, only reads the allocator's counters under its
    // own locks, and returns a plain struct by value (glibc 2.33 and later).
    #[allow(unsafe_code)]
    let info = unsafe { libc::mallinfo2() };
    let _ = writeln!(out, "# glibc malloc (mallinfo2)");
    for (name, value) in [
        ("malloc_arena_bytes", info.arena),
        ("malloc_mmap_bytes", info.hblkhd),
        ("malloc_in_use_bytes", info.uordblks),
        ("malloc_free_bytes", info.fordblks),
        ("malloc_releasable_bytes", info.keepcost),
        ("malloc_mmap_regions", info.hblks),
        ("malloc_free_chunks", info.ordblks),
    ] {
        let _ = writeln!(out, "{name} {value}");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn allocator(out: &mut String) {
    let _ = writeln!(out, "# allocator statistics need glibc (mallinfo2)");
}

#[cfg(test)]
mod tests {
    #[test]
    fn reports_allocator_and_process_figures() {
        let held: Vec<Vec<u8>> = (0..64).map(|_| vec![1u8; 64 * 1024]).collect();
        let text = super::statistics();
        let value = |name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {text}"))
        };
        assert!(value("process_vmrss") > 0);
        #[cfg(target_env = "gnu")]
        assert!(
            value("malloc_in_use_bytes") + value("malloc_mmap_bytes") >= 4 << 20,
            "the 4 MiB held here are counted: {text}"
        );
        drop(held);
    }
}
