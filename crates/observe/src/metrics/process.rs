//! The standard `process_*` metrics, read from procfs at render time the way client_golang's
//! process collector (via prometheus/procfs) computes them.

use std::fs;
use std::io;

/// The unit of the tick counts in `/proc/self/stat`: USER_HZ, fixed at 100 by the Linux ABI
/// (procfs hard-codes it too).
const USER_HZ: f64 = 100.0;

/// One `process_*` series; the registry holds one entry per metric so they sort among the
/// others by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Metric {
    CpuSeconds,
    OpenFds,
    MaxFds,
    VirtualMemory,
    VirtualMemoryMax,
    ResidentMemory,
    StartTime,
}

impl Metric {
    /// Name and help of each metric, with client_golang's help strings.
    pub(super) const ALL: [(Metric, &'static str, &'static str); 7] = [
        (
            Metric::CpuSeconds,
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
        ),
        (
            Metric::OpenFds,
            "process_open_fds",
            "Number of open file descriptors.",
        ),
        (
            Metric::MaxFds,
            "process_max_fds",
            "Maximum number of open file descriptors.",
        ),
        (
            Metric::VirtualMemory,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
        ),
        (
            Metric::VirtualMemoryMax,
            "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes.",
        ),
        (
            Metric::ResidentMemory,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
        ),
        (
            Metric::StartTime,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
        ),
    ];

    pub(super) fn kind(self) -> &'static str {
        if self == Metric::CpuSeconds {
            "counter"
        } else {
            "gauge"
        }
    }
}

/// All process values, read once per render. A value that cannot be read (say, no procfs) is
/// `None` and its series is left out rather than failing the whole scrape.
#[derive(Debug, Default)]
pub(super) struct Snapshot {
    cpu_seconds: Option<f64>,
    open_fds: Option<f64>,
    max_fds: Option<f64>,
    virtual_memory: Option<f64>,
    virtual_memory_max: Option<f64>,
    resident_memory: Option<f64>,
    start_time: Option<f64>,
}

impl Snapshot {
    pub(super) fn read() -> Self {
        let stat = fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| Stat::parse(&s));
        let boot_time = fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        let limits = fs::read_to_string("/proc/self/limits").ok();
        let soft_limit = |name| limits.as_deref().and_then(|l| soft_limit(l, name));
        Snapshot {
            cpu_seconds: stat.map(|s| (s.utime + s.stime) as f64 / USER_HZ),
            open_fds: open_fds().ok().map(|n| n as f64),
            max_fds: soft_limit("Max open files"),
            virtual_memory: stat.map(|s| s.vsize as f64),
            virtual_memory_max: soft_limit("Max address space"),
            resident_memory: resident_memory_bytes().ok().map(|b| b as f64),
            start_time: stat
                .zip(boot_time)
                .map(|(s, boot)| boot as f64 + s.start_ticks as f64 / USER_HZ),
        }
    }

    pub(super) fn value(&self, metric: Metric) -> Option<f64> {
        match metric {
            Metric::CpuSeconds => self.cpu_seconds,
            Metric::OpenFds => self.open_fds,
            Metric::MaxFds => self.max_fds,
            Metric::VirtualMemory => self.virtual_memory,
            Metric::VirtualMemoryMax => self.virtual_memory_max,
            Metric::ResidentMemory => self.resident_memory,
            Metric::StartTime => self.start_time,
        }
    }
}

/// The fields of `/proc/self/stat` the collector needs.
#[derive(Debug, Clone, Copy)]
struct Stat {
    utime: u64,
    stime: u64,
    start_ticks: u64,
    vsize: u64,
}

impl Stat {
    fn parse(stat: &str) -> Option<Stat> {
        // The command name (field 2) may contain spaces and parentheses; fields after the
        // last ')' are well-formed, starting with field 3 (state).
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(Stat {
            utime: field(14)?,
            stime: field(15)?,
            start_ticks: field(22)?,
            vsize: field(23)?,
        })
    }
}

/// `btime` from `/proc/stat`: boot time in seconds since the epoch.
fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of one row of `/proc/self/limits`; `unlimited` counts as `u64::MAX`, as
/// procfs reports it.
fn soft_limit(limits: &str, name: &str) -> Option<f64> {
    let soft = limits
        .lines()
        .find_map(|line| line.strip_prefix(name))?
        .split_whitespace()
        .next()?;
    if soft == "unlimited" {
        Some(u64::MAX as f64)
    } else {
        soft.parse::<u64>().ok().map(|v| v as f64)
    }
}

/// Number of open file descriptors of this process (including the one used to count them,
/// as client_golang's figure does).
pub fn open_fds() -> io::Result<usize> {
    fs::read_dir("/proc/self/fd")?.try_fold(0, |n, entry| entry.map(|_| n + 1))
}

/// Resident set size of this process in bytes (`VmRSS`), which equals the page count procfs
/// multiplies by the page size, without needing `sysconf`.
pub fn resident_memory_bytes() -> io::Result<u64> {
    let status = fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no VmRSS in /proc/self/status"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_name() {
        let stat = "4242 (a) (b c) S 1 4242 4242 0 -1 4194560 2000 0 0 0 \
                    150 25 0 0 20 0 8 0 123456 987654321 3000 18446744073709551615 1 1 0 0 0 0 \
                    0 0 0 0 0 0 17 1 0 0 0 0 0";
        let stat = Stat::parse(stat).expect("parses");
        assert_eq!((stat.utime, stat.stime), (150, 25));
        assert_eq!(stat.start_ticks, 123_456);
        assert_eq!(stat.vsize, 987_654_321);
    }

    #[test]
    fn parses_limits_and_btime() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max address space         unlimited            unlimited            bytes     \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(soft_limit(limits, "Max open files"), Some(1024.0));
        assert_eq!(
            soft_limit(limits, "Max address space"),
            Some(u64::MAX as f64)
        );
        assert_eq!(soft_limit(limits, "Max processes"), None);
        assert_eq!(
            boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"),
            Some(1_700_000_000)
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn live_values_are_plausible() {
        assert!(open_fds().unwrap() > 0);
        assert!(resident_memory_bytes().unwrap() > 0);
        let snapshot = Snapshot::read();
        for (metric, name, _) in Metric::ALL {
            let value = snapshot.value(metric);
            assert!(value.is_some_and(|v| v >= 0.0), "{name}: {value:?}");
        }
        let max_fds = snapshot.value(Metric::MaxFds).unwrap();
        assert!(max_fds >= snapshot.value(Metric::OpenFds).unwrap());
        let now = crate::time::wall_clock()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = snapshot.value(Metric::StartTime).unwrap();
        assert!(
            start <= now + 60.0 && start > now - 86_400.0,
            "start {start}, now {now}"
        );
    }
}
