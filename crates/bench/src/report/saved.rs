//! A finished run kept beside its report: `run.txt` (what the report says about the run) next
//! to `results.csv` (every sample). `tether-bench report DIR` writes the report again from
//! them, so a change to the report (a new goal, a new table) needs no new half-hour run.
//!
//! `run.txt` has one `key value` line per fact; `machine`, `note` and `error` repeat, and
//! newlines inside a value are written as `\n`.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{Context as _, bail};

use super::meta::Meta;
use crate::results::{Metric, Results};
use crate::systems::System;
use crate::workloads::Profile;

pub const RUN_FILE: &str = "run.txt";

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// The contents of `run.txt`.
pub fn run_file(results: &Results, meta: &Meta, p: &Profile) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "command {}", escape(&meta.command));
    let _ = writeln!(s, "date {}", escape(&meta.date));
    let _ = writeln!(s, "elapsed_secs {}", meta.elapsed_secs);
    let _ = writeln!(s, "quick {}", meta.quick);
    let ids: Vec<String> = meta.systems.iter().map(System::id).collect();
    let _ = writeln!(s, "systems {}", ids.join(","));
    let _ = writeln!(s, "runs {}", p.runs);
    let _ = writeln!(s, "idle_conns {}", p.idle_conns);
    let _ = writeln!(s, "fanin {},{}", p.fanin[0], p.fanin[1]);
    let _ = writeln!(s, "scale {},{}", p.scale_conns, p.scale_agents);
    let _ = writeln!(s, "tunnel_concurrency {}", p.tunnel_concurrency);
    let _ = writeln!(s, "fleet {}", p.fleet);
    let _ = writeln!(s, "fleet_idle_secs {}", p.fleet_idle_secs);
    let _ = writeln!(s, "fleet_dials {}", p.fleet_dials);
    for line in meta.machine.lines() {
        let _ = writeln!(s, "machine {}", escape(line));
    }
    for note in &meta.notes {
        let _ = writeln!(s, "note {}", escape(note));
    }
    for (system, workload, message) in &results.errors {
        let _ = writeln!(
            s,
            "error {}\t{}\t{}",
            system.id(),
            escape(workload),
            escape(message)
        );
    }
    s
}

fn system(s: &str) -> anyhow::Result<System> {
    System::parse(s).with_context(|| format!("unknown system {s:?}"))
}

/// `A,B` as two counts.
fn pair(value: &str) -> anyhow::Result<(usize, usize)> {
    let (a, b) = value
        .split_once(',')
        .context("two comma-separated counts")?;
    Ok((a.parse()?, b.parse()?))
}

/// Reads a run saved in `dir`.
pub fn load(dir: &Path) -> anyhow::Result<(Results, Meta, Profile)> {
    let run_path = dir.join(RUN_FILE);
    let run =
        fs::read_to_string(&run_path).with_context(|| format!("reading {}", run_path.display()))?;
    let mut meta = Meta {
        command: String::new(),
        date: String::new(),
        machine: String::new(),
        elapsed_secs: 0.0,
        quick: false,
        systems: Vec::new(),
        notes: Vec::new(),
    };
    let mut results = Results::default();
    let (mut runs, mut idle_conns, mut fanin, mut scale) = (None, None, None, None);
    let mut tunnel_concurrency = None;
    let (mut fleet, mut fleet_idle_secs, mut fleet_dials) = (None, None, None);
    for (n, line) in run.lines().enumerate() {
        let at = || format!("{}:{}", run_path.display(), n + 1);
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        match key {
            "command" => meta.command = unescape(value),
            "date" => meta.date = unescape(value),
            "elapsed_secs" => meta.elapsed_secs = value.parse().with_context(at)?,
            "quick" => meta.quick = value.parse().with_context(at)?,
            "systems" => {
                meta.systems = value
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(system)
                    .collect::<anyhow::Result<_>>()
                    .with_context(at)?
            }
            "runs" => runs = Some(value.parse().with_context(at)?),
            "idle_conns" => idle_conns = Some(value.parse().with_context(at)?),
            "fanin" => fanin = Some(pair(value).with_context(at)?.into()),
            "scale" => scale = Some(pair(value).with_context(at)?),
            "tunnel_concurrency" => tunnel_concurrency = Some(value.parse().with_context(at)?),
            "fleet" => fleet = Some(value.parse().with_context(at)?),
            "fleet_idle_secs" => fleet_idle_secs = Some(value.parse().with_context(at)?),
            "fleet_dials" => fleet_dials = Some(value.parse().with_context(at)?),
            "machine" => {
                meta.machine.push_str(&unescape(value));
                meta.machine.push('\n');
            }
            "note" => meta.notes.push(unescape(value)),
            "error" => {
                let mut parts = value.splitn(3, '\t');
                let (Some(s), Some(w), Some(m)) = (parts.next(), parts.next(), parts.next()) else {
                    bail!("{}: an error needs system, workload and message", at());
                };
                results.error(system(s).with_context(at)?, &unescape(w), unescape(m));
            }
            _ => bail!("{}: unknown key {key:?}", at()),
        }
    }
    let mut p = if meta.quick {
        Profile::quick()
    } else {
        Profile::full()
    };
    p.runs = runs.with_context(|| format!("{}: no runs", run_path.display()))?;
    p.idle_conns = idle_conns.unwrap_or(p.idle_conns);
    p.fanin = fanin.unwrap_or(p.fanin);
    (p.scale_conns, p.scale_agents) = scale.unwrap_or((p.scale_conns, p.scale_agents));
    p.tunnel_concurrency = tunnel_concurrency.unwrap_or(p.tunnel_concurrency);
    p.fleet = fleet.unwrap_or(p.fleet);
    p.fleet_idle_secs = fleet_idle_secs.unwrap_or(p.fleet_idle_secs);
    p.fleet_dials = fleet_dials.unwrap_or(p.fleet_dials);

    let csv_path = dir.join("results.csv");
    let csv =
        fs::read_to_string(&csv_path).with_context(|| format!("reading {}", csv_path.display()))?;
    for (n, line) in csv.lines().enumerate().skip(1) {
        let at = || format!("{}:{}", csv_path.display(), n + 1);
        let fields: Vec<&str> = line.split(',').collect();
        let [s, metric, run, value] = fields[..] else {
            bail!("{}: expected system,metric,run,value", at());
        };
        let metric = Metric::from_key(metric).with_context(at)?;
        results.add(
            system(s).with_context(at)?,
            metric,
            run.parse().with_context(at)?,
            value.parse().with_context(at)?,
        );
    }
    Ok((results, meta, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_run_reads_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let systems = vec![System::Direct, System::RelayLimit { tls: true }];
        let meta = Meta {
            command: "tether-bench --runs 2".into(),
            date: "2026-12-01 17:00 UTC".into(),
            machine: "nproc: 2\nline with a \\ backslash\n".into(),
            elapsed_secs: 12.5,
            quick: false,
            systems: systems.clone(),
            notes: vec!["two\nlines".into()],
        };
        let mut results = Results::default();
        results.add(System::Direct, Metric::BulkUp, 1, 3000.5);
        results.add(System::RelayLimit { tls: true }, Metric::PingP50, 2, 88.0);
        let point = crate::results::TunnelPoint {
            cap: Some(1_000),
            held: 980,
        };
        let tunnel = Metric::Tunnel(point, crate::results::TunnelFigure::DialP99);
        results.add(System::RelayLimit { tls: true }, tunnel, 1, 22_400.5);
        let fleet = Metric::Fleet(
            crate::workloads::FleetMode::K1,
            crate::results::FleetFigure::KibPerAgent,
        );
        results.add(System::Direct, fleet, 2, 31.25);
        results.error(System::Direct, "bulk", "broke\nhere".into());
        let mut p = Profile::full();
        p.runs = 2;
        p.idle_conns = 123;
        p.scale_conns = 4_567;
        p.tunnel_concurrency = 48;
        p.fleet = 5_000;
        p.fleet_idle_secs = 12.5;
        fs::write(dir.path().join(RUN_FILE), run_file(&results, &meta, &p)).unwrap();
        fs::write(dir.path().join("results.csv"), results.csv()).unwrap();

        let (r, m, q) = load(dir.path()).unwrap();
        assert_eq!(m.command, meta.command);
        assert_eq!(m.date, meta.date);
        assert_eq!(m.machine, meta.machine);
        assert_eq!(m.elapsed_secs, meta.elapsed_secs);
        assert_eq!(m.systems, systems);
        assert_eq!(m.notes, meta.notes);
        assert_eq!((q.runs, q.idle_conns, q.fanin), (2, 123, p.fanin));
        assert_eq!((q.scale_conns, q.scale_agents), (4_567, p.scale_agents));
        assert_eq!(q.tunnel_concurrency, 48);
        assert_eq!(
            (q.fleet, q.fleet_idle_secs, q.fleet_dials),
            (5_000, 12.5, p.fleet_dials)
        );
        assert_eq!(r.csv(), results.csv());
        assert_eq!(r.errors, results.errors);
    }

    #[test]
    fn a_damaged_run_file_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join(RUN_FILE),
            "runs 3\nsystems direct,nonsense\n",
        )
        .unwrap();
        let e = format!("{:#}", load(dir.path()).err().unwrap());
        assert!(e.contains("run.txt:2") && e.contains("nonsense"), "{e}");
    }
}
