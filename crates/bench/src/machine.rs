//! What the report says of the machine and the run: the command line, the CPU and memory,
//! and the load from other processes.

use std::path::Path;

pub fn command_line() -> String {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut()
        && let Some(name) = Path::new(first.as_str()).file_name()
    {
        *first = name.to_string_lossy().into_owned();
    }
    args.join(" ")
}

pub async fn run_cmd(cmd: &str, args: &[&str]) -> String {
    match tokio::process::Command::new(cmd).args(args).output().await {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(_) => String::new(),
    }
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

pub async fn machine_info() -> String {
    let nproc = run_cmd("nproc", &[]).await;
    let lscpu = run_cmd("lscpu", &[]).await;
    let kernel = run_cmd("uname", &["-srm"]).await;
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().map(str::to_owned))
        .unwrap_or_default();
    let lscpu_head: Vec<&str> = lscpu.lines().take(10).collect();
    format!(
        "nproc: {}\nkernel: {}\n{}\n{}",
        nproc.trim(),
        kernel.trim(),
        mem,
        lscpu_head.join("\n")
    )
}
