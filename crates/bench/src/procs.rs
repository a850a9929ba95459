//! Processes: starting them so that they die with us, sampling RSS and CPU time from /proc,
//! and raising the fd limit.

use std::collections::HashMap;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use rustix::process::{Pid, Resource, Rlimit, Signal};
use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// A child process of ours. Dropping it kills it and every process it started (sshd forks
/// one per connection), so no path leaves anything running.
#[derive(Debug)]
pub struct Proc {
    /// What it is, for messages: `server`, `agent`, `sshd`, `target`…
    pub role: String,
    pub pid: u32,
    child: Child,
    /// Where its stdout and stderr went.
    pub log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`, in its own process group.
    pub fn spawn(role: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Self> {
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {role}: {cmd:?}"))?;
        let pid = child.id().context("child has no pid")?;
        Ok(Self {
            role: role.to_owned(),
            pid,
            child,
            log: log.to_owned(),
        })
    }

    /// Like [`Proc::spawn`] but with stdout piped to us.
    fn spawn_piped(role: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Self> {
        cmd.stdin(Stdio::null());
        Self::spawn_stdout_piped(role, cmd, log)
    }

    /// Like [`Proc::spawn`] but with stdin and stdout piped to us: a subcommand of ours
    /// that takes requests on its stdin and answers on its stdout (stderr goes to `log`).
    pub fn spawn_talking(
        role: &str,
        mut cmd: Command,
        log: &Path,
    ) -> anyhow::Result<(Self, ChildStdin, ChildStdout)> {
        cmd.stdin(Stdio::piped());
        let mut proc = Self::spawn_stdout_piped(role, cmd, log)?;
        let stdin = proc.child.stdin.take().context("no stdin pipe")?;
        let stdout = proc.child.stdout.take().context("no stdout pipe")?;
        Ok((proc, stdin, stdout))
    }

    /// Starts `cmd` (its stdin already set) with stdout piped to us, stderr to `log`.
    fn spawn_stdout_piped(role: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Self> {
        let err = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        cmd.stdout(Stdio::piped())
            .stderr(err)
            .kill_on_drop(true)
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {role}: {cmd:?}"))?;
        let pid = child.id().context("child has no pid")?;
        Ok(Self {
            role: role.to_owned(),
            pid,
            child,
            log: log.to_owned(),
        })
    }

    /// Starts one of our own subcommands (`target`, `relay`), which prints the address it
    /// listens on as its first line of stdout; stderr goes to `log`.
    pub async fn spawn_listening(
        role: &str,
        cmd: Command,
        log: &Path,
    ) -> anyhow::Result<(Self, SocketAddr)> {
        let mut proc = Self::spawn_piped(role, cmd, log)?;
        let stdout = proc.child.stdout.take().context("no stdout pipe")?;
        let mut line = String::new();
        let mut stdout = tokio::io::BufReader::new(stdout);
        match tokio::time::timeout(Duration::from_secs(10), stdout.read_line(&mut line)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e).with_context(|| format!("reading {role}'s address")),
            Err(_) => bail!(
                "{role} did not print its address within 10 s; log tail:\n{}",
                log_tail(log)
            ),
        }
        let addr = line.trim().parse().with_context(|| {
            format!(
                "{role} printed {line:?} instead of its address; log tail:\n{}",
                log_tail(log)
            )
        })?;
        Ok((proc, addr))
    }

    /// Fails with the tail of its log if it has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} (pid {}) exited with {status}; log tail:\n{}",
                self.role,
                self.pid,
                log_tail(&self.log)
            );
        }
        Ok(())
    }

    /// RSS of the process and its descendants.
    pub fn rss(&self) -> u64 {
        tree(self.pid)
            .iter()
            .map(|&p| rss_bytes(p).unwrap_or(0))
            .sum()
    }

    /// Anonymous (private) resident memory of the process and its descendants: RSS without
    /// the pages of the binary and libraries, which the page cache shares.
    pub fn rss_anon(&self) -> u64 {
        tree(self.pid)
            .iter()
            .map(|&p| status_kib(p, "RssAnon:").unwrap_or(0) * 1024)
            .sum()
    }

    /// CPU seconds (user + system) used so far by the process and its live descendants.
    pub fn cpu_seconds(&self) -> f64 {
        let ticks: u64 = tree(self.pid)
            .iter()
            .map(|&p| cpu_ticks(p).unwrap_or(0))
            .sum();
        ticks as f64 / clock_ticks() as f64
    }

    /// Sends `signal` to the process (SIGSTOP, SIGCONT, SIGTERM…); one already gone is
    /// left alone.
    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = Pid::from_raw(self.pid as i32) {
            let _ = rustix::process::kill_process(pid, signal);
        }
    }

    /// Waits at most `within` for the process to exit by itself (after a SIGTERM, say):
    /// whether it did (and was reaped).
    pub async fn exited_within(&mut self, within: Duration) -> bool {
        tokio::time::timeout(within, self.child.wait())
            .await
            .is_ok_and(|status| status.is_ok())
    }

    /// Kills it and its descendants and reaps it. With `TETHER_BENCH_STOP_GRACE_MS` set
    /// (for profiling: massif writes its file on exit) it gets SIGTERM and that long first.
    pub async fn stop(mut self) {
        let grace = std::env::var("TETHER_BENCH_STOP_GRACE_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        if grace > 0 {
            if let Some(p) = Pid::from_raw(self.pid as i32) {
                let _ = rustix::process::kill_process(p, Signal::TERM);
            }
            let _ = tokio::time::timeout(Duration::from_millis(grace), self.child.wait()).await;
        }
        kill_tree(self.pid);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // kill_on_drop only reaches the direct child; its descendants go here.
        if let Ok(None) = self.child.try_wait() {
            kill_tree(self.pid);
        }
    }
}

/// Open file descriptors of process `pid`; `None` once it is gone.
pub fn fd_count(pid: u32) -> Option<usize> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(Iterator::count)
}

/// The last lines of a log file, for error messages.
pub fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn kill_tree(pid: u32) {
    let mut all = tree(pid);
    all.reverse();
    for p in all {
        if let Some(p) = Pid::from_raw(p as i32) {
            let _ = rustix::process::kill_process(p, Signal::KILL);
        }
    }
}

/// `pid` followed by all its descendants (breadth first).
pub fn tree(pid: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(ppid) = stat_fields(p).and_then(|f| f.get(1).and_then(|s| s.parse().ok())) {
                children.entry(ppid).or_default().push(p);
            }
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        if let Some(kids) = children.get(&out[i]) {
            out.extend(kids);
        }
        i += 1;
    }
    out
}

/// Fields of /proc/<pid>/stat after the command name: index 0 is the state (field 3).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// utime + stime (fields 14 and 15) in clock ticks, all threads.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let f = stat_fields(pid)?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// VmRSS from /proc/<pid>/status, in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:").map(|kib| kib * 1024)
}

/// A `kB` field of /proc/<pid>/status.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// CPU seconds the whole machine spent busy (all CPUs, /proc/stat), and the number of CPUs.
pub fn machine_busy_seconds() -> Option<f64> {
    let text = fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let busy = v.first()? + v.get(1)? + v.get(2)? + v.get(5)? + v.get(6)? + v.get(7)?;
    Some(busy as f64 / clock_ticks() as f64)
}

/// CPU seconds used by this process, its reaped children and its live descendants.
pub fn own_cpu_seconds() -> f64 {
    let me = std::process::id();
    let f = stat_fields(me).unwrap_or_default();
    let field = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    // utime stime cutime cstime are fields 14-17.
    let mine = field(11) + field(12) + field(13) + field(14);
    let live: u64 = tree(me)
        .into_iter()
        .skip(1)
        .map(|p| cpu_ticks(p).unwrap_or(0))
        .sum();
    (mine + live) as f64 / clock_ticks() as f64
}

fn clock_ticks() -> u64 {
    rustix::param::clock_ticks_per_second()
}

/// Raises RLIMIT_NOFILE to at least `want` (children inherit it). Root may go past the hard
/// limit; others get the hard limit. Returns the soft limit now in force.
pub fn raise_fd_limit(want: u64) -> u64 {
    let current = rustix::process::getrlimit(Resource::Nofile);
    let hard = current.maximum.unwrap_or(u64::MAX);
    let soft = current.current.unwrap_or(u64::MAX);
    if soft >= want {
        return soft;
    }
    if hard < want {
        let raised = Rlimit {
            current: Some(want),
            maximum: Some(want),
        };
        if rustix::process::setrlimit(Resource::Nofile, raised).is_ok() {
            return want;
        }
    }
    let target = hard.min(want);
    let raised = Rlimit {
        current: Some(target),
        maximum: current.maximum,
    };
    if rustix::process::setrlimit(Resource::Nofile, raised).is_ok() {
        target
    } else {
        soft
    }
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}
