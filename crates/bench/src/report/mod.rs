//! The report: a Markdown file with the goals, an overview and one table per figure
//! (median, min–max, ratios to upstream, to direct TCP and to the relay anchors), SVG
//! charts, and the raw samples as CSV.

pub mod lines;
mod meta;
pub mod saved;
pub mod svg;

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use crate::results::{Better, FleetFigure, Metric, Results, TunnelFigure};
use crate::stats::Summary;
use crate::systems::{FLEET_SYSTEM, System};
use crate::workloads::FleetMode;
use crate::workloads::Profile;
use crate::workloads::fanin;
use svg::Chart;

pub use meta::Meta;

enum Kind {
    VsUpstream(f64),
    /// ÷ `relay-limit-tls`, the like-for-like limit of every tether shape.
    VsRelayTls(f64),
    /// ÷ rathole, the Rust reverse tunnel users pick instead.
    VsRathole(f64),
    Absolute(f64),
}

struct Goal {
    text: &'static str,
    metric: Metric,
    kind: Kind,
}

/// The goals of issue 28 for the native link (with issue 13's against upstream, the
/// head-of-line goal of issue 5 and the fairness goals of issue 11), as ratios from the same
/// run or absolute figures. The gRPC link (`tether-h2`) is held to them too, for the record.
fn goals() -> Vec<Goal> {
    use Kind::*;
    use Metric::*;
    let g = |text, metric, kind| Goal { text, metric, kind };
    vec![
        g("bulk upload ≥ 0.9× relay-tls", BulkUp, VsRelayTls(0.9)),
        g("bulk upload ≥ 4× upstream", BulkUp, VsUpstream(4.0)),
        g("bulk upload ≥ rathole", BulkUp, VsRathole(1.0)),
        g("bulk download ≥ 0.9× relay-tls", BulkDown, VsRelayTls(0.9)),
        g("bulk download ≥ 4× upstream", BulkDown, VsUpstream(4.0)),
        g("bulk download ≥ rathole", BulkDown, VsRathole(1.0)),
        g("CPU/GiB upload ≤ 0.2× upstream", CpuUp, VsUpstream(0.2)),
        g("CPU/GiB upload ≤ 1.2× relay-tls", CpuUp, VsRelayTls(1.2)),
        g("CPU/GiB download ≤ 0.2× upstream", CpuDown, VsUpstream(0.2)),
        g(
            "CPU/GiB download ≤ 1.2× relay-tls",
            CpuDown,
            VsRelayTls(1.2),
        ),
        g("ping-pong p50 ≤ 1.1× relay-tls", PingP50, VsRelayTls(1.1)),
        g("ping-pong p50 ≤ rathole", PingP50, VsRathole(1.0)),
        g("ping-pong p99 ≤ 1.3× relay-tls", PingP99, VsRelayTls(1.3)),
        g("ping-pong p99 ≤ rathole", PingP99, VsRathole(1.0)),
        g("churn c=1 ≥ 1× relay-tls", Churn1Rate, VsRelayTls(1.0)),
        g("churn c=1 ≥ 3× upstream", Churn1Rate, VsUpstream(3.0)),
        g("churn c=1 ≥ rathole", Churn1Rate, VsRathole(1.0)),
        g("churn c=64 ≥ 1× relay-tls", Churn64Rate, VsRelayTls(1.0)),
        g("churn c=64 ≥ 3× upstream", Churn64Rate, VsUpstream(3.0)),
        g("churn c=64 ≥ rathole", Churn64Rate, VsRathole(1.0)),
        g(
            "churn c=64 over the small fan-in's agents ≥ 3× upstream",
            FanInChurnRate,
            VsUpstream(3.0),
        ),
        g(
            "server RSS per agent (small) ≤ 16 KiB",
            AgentSmall,
            Absolute(16.0),
        ),
        g(
            "server RSS per agent (large) ≤ 16 KiB",
            AgentLarge,
            Absolute(16.0),
        ),
        g(
            "RSS per idle connection, server + agent ≤ 4 KiB",
            ConnTotal,
            Absolute(4.0),
        ),
        g(
            "RSS per idle connection at scale, server + agents ≤ 4 KiB",
            ScaleTotal,
            Absolute(4.0),
        ),
        g(
            "server RSS after the agents left ≤ 2× before",
            AgentRssAfter,
            Absolute(2.0),
        ),
        g(
            "RSS after the connections closed ≤ 2× before",
            ConnRssAfter,
            Absolute(2.0),
        ),
        g("idle RSS server ≤ 8 MiB", IdleRssServer, Absolute(8.0)),
        g("idle RSS agent ≤ 6 MiB", IdleRssAgent, Absolute(6.0)),
        g("head-of-line ratio ≥ 0.9", HolRatio, Absolute(0.9)),
        g(
            "fairness: ping p99 next to downloads ≤ 2× alone",
            FairP99Ratio,
            Absolute(2.0),
        ),
        g(
            "fairness: downloads with ping-pong ≥ 0.9× without",
            FairBulkRatio,
            Absolute(0.9),
        ),
        // On 2 shared cores any interactive flow costs bulk transfers about half, so the
        // ratio is also read against the relay limit's (BENCHMARKS.md).
        g(
            "fairness: that ratio ≥ 0.9× relay-tls's",
            FairBulkRatio,
            VsRelayTls(0.9),
        ),
    ]
}

fn ratio(a: Option<Summary>, b: Option<Summary>) -> Option<f64> {
    let (a, b) = (a?, b?);
    (b.median != 0.0).then(|| a.median / b.median)
}

fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let a = v.abs();
    if a >= 1000.0 {
        let int = v.round() as i64;
        let digits = int.abs().to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        if int < 0 { format!("-{out}") } else { out }
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A count: whole, with thousands separated.
fn fmt_count(v: f64) -> String {
    if v.abs() >= 1000.0 {
        fmt_num(v)
    } else if v.is_finite() {
        format!("{v:.0}")
    } else {
        "–".into()
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r.is_finite() => {
            if r >= 10.0 {
                format!("{r:.0}×")
            } else if r >= 1.0 {
                format!("{r:.1}×")
            } else {
                format!("{r:.2}×")
            }
        }
        _ => "".into(),
    }
}

/// With `tether-before` systems in the run: each figure of every tether shape next to the
/// earlier build's, as before → after and after ÷ before, so a change is judged in one run.
fn before_and_after(s: &mut String, meta: &Meta, results: &Results, p: &Profile) {
    let pairs: Vec<(System, System)> = meta
        .systems
        .iter()
        .filter_map(|t| Some((*t, t.before_peer()?)))
        .filter(|(_, b)| meta.systems.contains(b))
        .collect();
    if pairs.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## Before and after (`tether-before` → tether, medians; the ratio is after ÷ before)\n"
    );
    let _ = write!(s, "| figure |");
    for (t, _) in &pairs {
        let _ = write!(s, " {} |", t.name());
    }
    let _ = write!(s, "\n|---|");
    for _ in &pairs {
        let _ = write!(s, "---:|");
    }
    s.push('\n');
    for metric in Metric::ALL {
        let cells: Vec<String> = pairs
            .iter()
            .map(|&(after, before)| {
                match (
                    results.summary(before, metric),
                    results.summary(after, metric),
                ) {
                    (Some(b), Some(a)) => format!(
                        "{} → {} ({})",
                        fmt_num(b.median),
                        fmt_num(a.median),
                        fmt_ratio(ratio(Some(a), Some(b)))
                    ),
                    _ => String::new(),
                }
            })
            .collect();
        if cells.iter().all(String::is_empty) {
            continue;
        }
        let _ = write!(s, "| {} ({}) |", metric.title(p), metric.unit());
        for c in cells {
            let _ = write!(s, " {c} |");
        }
        s.push('\n');
    }
    s.push('\n');
}

/// With `tether-peer` systems in the run: each one's main figures beside `tether`'s in the
/// same frontend shape, and the ratio, so that one peer hop's cost reads in one run.
fn peer_hop(s: &mut String, meta: &Meta, results: &Results) {
    let pairs: Vec<(System, System)> = meta
        .systems
        .iter()
        .filter_map(|t| Some((*t, t.direct_dial()?)))
        .filter(|(_, d)| meta.systems.contains(d))
        .collect();
    let figures = [
        (Metric::BulkUp, "bulk upload"),
        (Metric::BulkDown, "bulk download"),
        (Metric::CpuUp, "CPU per GiB, upload"),
        (Metric::CpuDown, "CPU per GiB, download"),
        (Metric::PingP50, "ping-pong p50"),
        (Metric::PingP99, "ping-pong p99"),
        (Metric::Churn1Rate, "churn c=1"),
        (Metric::Churn64Rate, "churn c=64"),
    ];
    let cell = |x: Summary| {
        format!(
            "{} ({}–{})",
            fmt_num(x.median),
            fmt_num(x.min),
            fmt_num(x.max)
        )
    };
    let mut rows = String::new();
    for &(hop, direct) in &pairs {
        let System::Konn(_, frontend) = hop else {
            continue;
        };
        for (metric, name) in figures {
            let (Some(h), Some(d)) = (
                results.summary(hop, metric),
                results.summary(direct, metric),
            ) else {
                continue;
            };
            let _ = writeln!(
                rows,
                "| {} | {name} ({}) | {} | {} | {} |",
                frontend.name(),
                metric.unit(),
                cell(h),
                cell(d),
                fmt_ratio(ratio(Some(h), Some(d)))
            );
        }
    }
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## One peer hop against a direct dial
"
    );
    let _ = writeln!(
        s,
        "`tether-peer`: the client's tether server holds no agent; the agent holds a second tether server, peered with the first on loopback, so every connection runs client → server A → peer link → server B → agent → target. `tether`: the same client, server and agent with no hop. Medians (min–max); the ratio is peer hop ÷ direct (for CPU and latency lower is better). CPU is of every server and agent process; for `tether-peer` every server figure in this report (CPU, RSS) is A's and B's together.\n"
    );
    let _ = writeln!(
        s,
        "| shape | figure | tether-peer | tether | peer hop ÷ direct |\n|---|---|---:|---:|---:|"
    );
    s.push_str(&rows);
    s.push('\n');
}

/// The reusable-tunnel sweep: one row per system, stream cap and held streams, medians
/// over the runs (failures added up over them).
fn tunnel_table(s: &mut String, meta: &Meta, results: &Results, p: &Profile) {
    let rows: Vec<_> = meta
        .systems
        .iter()
        .flat_map(|&sys| {
            results
                .tunnel_points(sys)
                .into_iter()
                .map(move |point| (sys, point))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let c = p.tunnel_concurrency;
    let _ = writeln!(
        s,
        "## Reusable tunnel: one gRPC connection, held streams beside short dials\n"
    );
    let _ = writeln!(
        s,
        "One `GrpcClient` (one HTTP/2 connection) per row: `held` streams opened on it (dial, one echo) and kept idle, and beside them short dials (dial, 64-byte echo, close) from {c} workers for {} s on the same connection; then every held stream must echo again. Dial latency runs until the DIAL_RSP, including any wait for a free HTTP/2 stream. The stream cap is tether's `--max-streams-per-frontend-connection` (upstream has none: grpc-go's default leaves a connection's streams unlimited). Peak Proxy streams is the server's `grpc_connections{{service_method=\"Proxy\"}}` gauge, sampled every 100 ms. Medians of the runs; failures are added up over the runs.\n",
        p.churn_secs
    );
    let _ = writeln!(
        s,
        "| system | stream cap | held | held + dialling | dials/s | dial p50 µs | dial p99 µs | CPU µs/dial | peak Proxy streams | held failed | failed dials | runs |"
    );
    let _ = writeln!(
        s,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (sys, point) in rows {
        let figure = |f| Metric::Tunnel(point, f);
        let median = |f, fmt: fn(f64) -> String| {
            results
                .summary(sys, figure(f))
                .map(|x| fmt(x.median))
                .unwrap_or_default()
        };
        let total = |f| {
            let v = results.values(sys, figure(f));
            if v.is_empty() {
                String::new()
            } else {
                fmt_count(v.iter().sum())
            }
        };
        let streams = point.held as usize + c;
        let over = point.cap.is_some_and(|cap| streams > cap as usize);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} |",
            sys.name(),
            point
                .cap
                .map_or("none".to_owned(), |cap| fmt_count(f64::from(cap))),
            fmt_count(f64::from(point.held)),
            fmt_count(streams as f64),
            if over { " (over the cap)" } else { "" },
            median(TunnelFigure::Rate, fmt_count),
            median(TunnelFigure::DialP50, fmt_num),
            median(TunnelFigure::DialP99, fmt_num),
            median(TunnelFigure::Cpu, fmt_num),
            median(TunnelFigure::PeakStreams, fmt_count),
            total(TunnelFigure::HeldFailed),
            total(TunnelFigure::Errors),
            results.values(sys, figure(TunnelFigure::Rate)).len()
        );
    }
    let _ = writeln!(
        s,
        "\nThe failed dials' and held streams' messages are under Errors, by cap and held count.\n"
    );
}

/// The fleet of peered servers: one row per figure, the full mesh beside K=1, medians with
/// min–max over the runs and k1 ÷ mesh; then the K=1 peer hop's sanity check.
fn fleet_table(s: &mut String, results: &Results, p: &Profile) {
    let summary = |mode, figure| results.summary(FLEET_SYSTEM, Metric::Fleet(mode, figure));
    let measured = FleetMode::ALL
        .iter()
        .any(|&m| summary(m, FleetFigure::Streams).is_some());
    if !measured {
        return;
    }
    let _ = writeln!(s, "## Fleet of 3 servers: full mesh against K=1\n");
    let _ = writeln!(
        s,
        "Three tether servers on 127.0.0.2–.4, peered with each other (server peering, `--peer-addresses` listing all three), and {} fake agents on the native link (in {} `tether-bench fleet-agents` process(es), each holding at most {} streams: a process may hold 20,000 files here), in two modes, each on fresh servers: **mesh**, every agent holds a stream to every server (3 per agent: what agents do without peering); **k1**, every agent holds one stream, to server (agent index mod 3) + 1 (round-robin), and the servers announce their agents to each other. Measured once every server counts its agents and has heard of every other server's: the three servers' RSS together, and its growth per agent over their RSS before any agent came (linked and idle); keepalive PINGs counted on the fake agents' streams over {} s of idling, per agent per second (each server PINGs each stream every 5 s, its `--agent-ping-interval`; each fake agent PINGs each of its streams every 5 s, a tether agent's `--server-ping-interval`); the servers' CPU over the same window. A fake agent's failed connect is tried again (twice at most, as a tether agent would), and counted. Medians (min–max) of the runs; the ratio is k1 ÷ mesh.\n",
        fmt_count(p.fleet as f64),
        crate::workloads::fleet::agent_processes(p.fleet),
        fmt_count(crate::workloads::fleet::STREAMS_PER_PROCESS as f64),
        p.fleet_idle_secs
    );
    let _ = writeln!(
        s,
        "| figure | mesh | k1 | k1 ÷ mesh |\n|---|---:|---:|---:|"
    );
    let cell = |x: Option<crate::stats::Summary>, fmt: fn(f64) -> String| {
        x.map_or(String::new(), |x| {
            if x.min == x.max {
                fmt(x.median)
            } else {
                format!("{} ({}–{})", fmt(x.median), fmt(x.min), fmt(x.max))
            }
        })
    };
    for figure in FleetFigure::ALL {
        if matches!(figure, FleetFigure::HopDialP50 | FleetFigure::DirectDialP50) {
            continue;
        }
        let fmt: fn(f64) -> String = match figure {
            FleetFigure::Streams | FleetFigure::PeerRoutes | FleetFigure::ConnectRetries => {
                fmt_count
            }
            _ => fmt_num,
        };
        let (mesh, k1) = (
            summary(FleetMode::Mesh, figure),
            summary(FleetMode::K1, figure),
        );
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            figure.title(),
            cell(mesh, fmt),
            cell(k1, fmt),
            fmt_ratio(ratio(k1, mesh))
        );
    }
    s.push('\n');
    if let (Some(hop), Some(direct)) = (
        summary(FleetMode::K1, FleetFigure::HopDialP50),
        summary(FleetMode::K1, FleetFigure::DirectDialP50),
    ) {
        let _ = writeln!(
            s,
            "Peer hop, a sanity check (k1): {} dials (after a warm-up) through server 1 to the one agent that only server 3 holds (it advertises an address of its own, which the servers' `destHost` strategy routes), each answered by that agent and no other, and as many through server 3 itself, alternating: dial latency p50 {} µs through server 1, {} µs through server 3 ({}).\n",
            p.fleet_dials,
            cell(Some(hop), fmt_num),
            cell(Some(direct), fmt_num),
            fmt_ratio(ratio(Some(hop), Some(direct)))
        );
    }
}

/// Writes report.md, results.csv and the charts into `out`; returns the Markdown.
pub fn write(out: &Path, results: &Results, meta: &Meta, p: &Profile) -> anyhow::Result<String> {
    fs::create_dir_all(out)?;
    let charts = charts(results, meta, p);
    let mut written = Vec::new();
    for (file, chart) in &charts {
        if let Some(svg) = chart.render() {
            fs::write(out.join(file), svg)?;
            written.push((file.clone(), chart.title.clone()));
        }
    }
    fs::write(out.join("results.csv"), results.csv())?;
    fs::write(out.join(saved::RUN_FILE), saved::run_file(results, meta, p))?;
    let md = markdown(results, meta, p, &written);
    fs::write(out.join("report.md"), &md)?;
    Ok(md)
}

fn markdown(results: &Results, meta: &Meta, p: &Profile, charts: &[(String, String)]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# tether benchmark{}\n",
        if meta.quick {
            " (--quick: proves it runs; the numbers mean nothing)"
        } else {
            ""
        }
    );
    let _ = writeln!(s, "- Date: {}", meta.date);
    let _ = writeln!(s, "- Command: `{}`", meta.command);
    let _ = writeln!(
        s,
        "- Each figure: median of {} run(s), min–max beside it; every run starts the processes anew. Took {}.",
        p.runs,
        crate::progress::clock(meta.elapsed_secs)
    );
    let _ = writeln!(s, "- Machine:\n\n```\n{}\n```\n", meta.machine.trim_end());
    let _ = writeln!(
        s,
        "Ratios: **×upstream** is tether ÷ upstream Konnectivity in the same frontend shape, **×direct** is the system ÷ direct TCP, **×relay** and **×relay-tls** are the system ÷ two plain relays in series (`relay-limit`), and ÷ the same with mutual TLS between them (`relay-limit-tls`, the like-for-like limit of every tether shape, whose agent link is mutual TLS); for latency, CPU and memory lower is better, so a ratio below 1 is better there.\n"
    );
    fanin_links(&mut s, meta, results);

    // Goals matrix.
    let tether: Vec<System> = meta
        .systems
        .iter()
        .copied()
        .filter(System::holds_goals)
        .collect();
    if !tether.is_empty() {
        let _ = writeln!(s, "## Goals\n");
        let _ = write!(s, "| goal |");
        for t in &tether {
            let _ = write!(s, " {} |", t.name());
        }
        let _ = write!(s, "\n|---|");
        for _ in &tether {
            let _ = write!(s, "---|");
        }
        s.push('\n');
        for goal in goals() {
            if !results.has(goal.metric) {
                continue;
            }
            let _ = write!(s, "| {} |", goal.text);
            for &t in &tether {
                let mine = results.summary(t, goal.metric);
                let (value, target, shown) = match goal.kind {
                    Kind::VsUpstream(x) => {
                        let r = ratio(
                            mine,
                            t.upstream_peer()
                                .and_then(|u| results.summary(u, goal.metric)),
                        );
                        (r, x, fmt_ratio(r))
                    }
                    Kind::VsRelayTls(x) => {
                        let anchor = results.summary(System::RelayLimit { tls: true }, goal.metric);
                        let r = ratio(mine, anchor);
                        (r, x, fmt_ratio(r))
                    }
                    Kind::VsRathole(x) => {
                        let r = ratio(mine, results.summary(System::Rathole, goal.metric));
                        (r, x, fmt_ratio(r))
                    }
                    Kind::Absolute(x) => {
                        let v = mine.map(|m| m.median);
                        (v, x, v.map(fmt_num).unwrap_or_default())
                    }
                };
                let cell = match value {
                    None => " |".to_owned(),
                    Some(v) => {
                        let ok = match goal.metric.better() {
                            Better::Higher => v >= target,
                            Better::Lower => v <= target,
                        };
                        format!(" {shown} {} |", if ok { "✅" } else { "❌" })
                    }
                };
                s.push_str(&cell);
            }
            s.push('\n');
        }
        let _ = write!(s, "| zero errors |");
        for &t in &tether {
            let n = results.errors_of(t);
            let _ = write!(s, " {} {} |", n, if n == 0 { "✅" } else { "❌" });
        }
        s.push_str("\n\n");
    }

    // Overview.
    let overview = [
        (Metric::BulkUp, "upload MiB/s"),
        (Metric::BulkDown, "download MiB/s"),
        (Metric::CpuDown, "CPU s/GiB down"),
        (Metric::PingP50, "ping p50 µs"),
        (Metric::PingP99, "ping p99 µs"),
        (Metric::Churn1Rate, "churn c=1 /s"),
        (Metric::Churn64Rate, "churn c=64 /s"),
        (Metric::ChurnCpu, "CPU µs/conn"),
        (Metric::HolRatio, "HOL ratio"),
        (Metric::IdleRssServer, "idle RSS server MiB"),
        (Metric::IdleRssAgent, "idle RSS agent MiB"),
        (Metric::ConnTotal, "KiB/idle conn"),
        (Metric::AgentLarge, "KiB/agent"),
    ];
    let cols: Vec<_> = overview.iter().filter(|(m, _)| results.has(*m)).collect();
    if !cols.is_empty() {
        let _ = writeln!(s, "## Overview (medians)\n");
        let _ = write!(s, "| system |");
        for (_, h) in &cols {
            let _ = write!(s, " {h} |");
        }
        let _ = write!(s, " errors |\n|---|");
        for _ in &cols {
            let _ = write!(s, "---:|");
        }
        s.push_str("---:|\n");
        for &sys in &meta.systems {
            let _ = write!(s, "| {} |", sys.name());
            for (m, _) in &cols {
                let v = results
                    .summary(sys, *m)
                    .map(|x| fmt_num(x.median))
                    .unwrap_or_default();
                let _ = write!(s, " {v} |");
            }
            let _ = writeln!(s, " {} |", results.errors_of(sys));
        }
        s.push('\n');
    }

    before_and_after(&mut s, meta, results, p);
    peer_hop(&mut s, meta, results);
    tunnel_table(&mut s, meta, results, p);
    fleet_table(&mut s, results, p);

    if !charts.is_empty() {
        let _ = writeln!(s, "## Charts\n");
        for (file, title) in charts {
            let _ = writeln!(s, "![{title}]({file})\n");
        }
    }

    let _ = writeln!(s, "## Figures\n");
    for metric in Metric::ALL {
        if !results.has(metric) {
            continue;
        }
        let better = match metric.better() {
            Better::Higher => "higher is better",
            Better::Lower => "lower is better",
        };
        let _ = writeln!(s, "### {} ({}, {better})\n", metric.title(p), metric.unit());
        let _ = writeln!(
            s,
            "| system | median | min–max | runs | ×upstream | ×direct | ×relay | ×relay-tls |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
        let direct = results.summary(System::Direct, metric);
        for &sys in &meta.systems {
            let Some(sum) = results.summary(sys, metric) else {
                continue;
            };
            let vs_up = sys
                .upstream_peer()
                .and_then(|u| ratio(Some(sum), results.summary(u, metric)));
            let vs_direct = if sys == System::Direct {
                None
            } else {
                ratio(Some(sum), direct)
            };
            let [vs_relay, vs_relay_tls] = sys
                .relay_anchors()
                .map(|a| a.and_then(|a| ratio(Some(sum), results.summary(a, metric))));
            let _ = writeln!(
                s,
                "| {} | {} | {}–{} | {} | {} | {} | {} | {} |",
                sys.name(),
                fmt_num(sum.median),
                fmt_num(sum.min),
                fmt_num(sum.max),
                sum.runs,
                fmt_ratio(vs_up),
                fmt_ratio(vs_direct),
                fmt_ratio(vs_relay),
                fmt_ratio(vs_relay_tls)
            );
        }
        s.push('\n');
    }

    if !meta.notes.is_empty() {
        let _ = writeln!(s, "## Notes from the run\n");
        // The same note from several runs once, with the runs listed.
        let mut grouped: Vec<(String, Vec<String>)> = Vec::new();
        for n in &meta.notes {
            let (text, run) = match n.rsplit_once(" (run ") {
                Some((t, r)) => (t.to_owned(), r.trim_end_matches(')').to_owned()),
                None => (n.clone(), String::new()),
            };
            match grouped.iter_mut().find(|(t, _)| *t == text) {
                Some((_, runs)) => runs.push(run),
                None => grouped.push((text, vec![run])),
            }
        }
        for (text, runs) in grouped {
            let runs: Vec<String> = runs.into_iter().filter(|r| !r.is_empty()).collect();
            if runs.is_empty() {
                let _ = writeln!(s, "- {text}");
            } else {
                let _ = writeln!(s, "- {text} (runs {})", runs.join(", "));
            }
        }
        s.push('\n');
    }

    let _ = writeln!(s, "## Errors\n");
    if results.errors.is_empty() {
        let _ = writeln!(s, "None.");
    } else {
        let _ = writeln!(s, "| system | workload | error |\n|---|---|---|");
        for (sys, w, e) in &results.errors {
            let e = e.replace('|', "\\|").replace('\n', " ");
            let _ = writeln!(s, "| {} | {w} | {e} |", sys.name());
        }
    }
    s
}

/// Which link each system's fan-in agents spoke, so that tether's two links read side by side.
fn fanin_links(s: &mut String, meta: &Meta, results: &Results) {
    let links: Vec<String> = meta
        .systems
        .iter()
        .filter(|&&sys| {
            [Metric::AgentSmall, Metric::AgentLarge]
                .iter()
                .any(|&m| results.summary(sys, m).is_some())
        })
        .filter_map(|sys| match sys {
            System::Konn(imp, _) => Some(format!(
                "`{}` on {}",
                imp.name(),
                fanin::Link::of(*imp).name()
            )),
            _ => None,
        })
        .collect();
    if !links.is_empty() {
        let _ = writeln!(
            s,
            "Agent fan-in: the fake agents speak the link of the system's own agents: {}.\n",
            links.join("; ")
        );
    }
}

fn charts(results: &Results, meta: &Meta, p: &Profile) -> Vec<(String, Chart)> {
    let cats: Vec<String> = meta.systems.iter().map(System::name).collect();
    let series = |name: &str, metric: Metric| {
        (
            name.to_owned(),
            meta.systems
                .iter()
                .map(|&sys| results.summary(sys, metric))
                .collect::<Vec<_>>(),
        )
    };
    let chart =
        |title: &str, axis: &str, log: bool, series: Vec<(String, Vec<Option<Summary>>)>| Chart {
            title: title.to_owned(),
            axis: axis.to_owned(),
            log,
            categories: cats.clone(),
            series,
        };
    vec![
        (
            "throughput.svg".into(),
            chart(
                "Bulk throughput of one connection",
                "MiB/s (higher is better; whiskers: min–max of runs)",
                false,
                vec![
                    series("upload", Metric::BulkUp),
                    series("download", Metric::BulkDown),
                ],
            ),
        ),
        (
            "cpu.svg".into(),
            chart(
                "CPU of server + agent per GiB moved",
                "CPU seconds per GiB (lower is better)",
                false,
                vec![
                    series("upload", Metric::CpuUp),
                    series("download", Metric::CpuDown),
                ],
            ),
        ),
        (
            "latency.svg".into(),
            chart(
                "64-byte ping-pong latency",
                "µs, log scale (lower is better)",
                true,
                vec![
                    series("p50", Metric::PingP50),
                    series("p99", Metric::PingP99),
                    series("p99.9", Metric::PingP999),
                ],
            ),
        ),
        (
            "churn.svg".into(),
            chart(
                "Connection churn: dial + 64-byte echo + close",
                "connections per second (higher is better)",
                false,
                vec![
                    series("concurrency 1", Metric::Churn1Rate),
                    series("concurrency 64", Metric::Churn64Rate),
                ],
            ),
        ),
        (
            "fanin-churn.svg".into(),
            chart(
                &format!(
                    "Connection churn at concurrency 64 through a lone server, its dials spread over {} fake agents",
                    p.fanin[0]
                ),
                "connections per second (higher is better)",
                false,
                vec![series("concurrency 64", Metric::FanInChurnRate)],
            ),
        ),
        (
            "dial-latency.svg".into(),
            chart(
                "Dial latency during churn",
                "µs, log scale (lower is better)",
                true,
                vec![
                    series("c=1 p50", Metric::Churn1DialP50),
                    series("c=1 p99", Metric::Churn1DialP99),
                    series("c=64 p50", Metric::Churn64DialP50),
                    series("c=64 p99", Metric::Churn64DialP99),
                ],
            ),
        ),
        (
            "hol.svg".into(),
            chart(
                "Head-of-line isolation (throughput next to a stalled connection ÷ alone)",
                "ratio (1 = isolated; higher is better)",
                false,
                vec![series("ratio", Metric::HolRatio)],
            ),
        ),
        (
            "memory-per-connection.svg".into(),
            chart(
                &format!("RSS per idle tunnelled connection ({} open)", p.idle_conns),
                "KiB per connection (lower is better)",
                false,
                vec![
                    series("server", Metric::ConnServer),
                    series("agent", Metric::ConnAgent),
                    series("server + agent", Metric::ConnTotal),
                    series(
                        &format!(
                            "server + agents, {} open over {} agents",
                            p.scale_conns, p.scale_agents
                        ),
                        Metric::ScaleTotal,
                    ),
                ],
            ),
        ),
        (
            "memory-per-agent.svg".into(),
            chart(
                "Server RSS per connected agent (each system's fake agents on its own agents' link)",
                "KiB per agent (lower is better)",
                false,
                vec![
                    series(&format!("{} agents", p.fanin[0]), Metric::AgentSmall),
                    series(&format!("{} agents", p.fanin[1]), Metric::AgentLarge),
                ],
            ),
        ),
        (
            "idle-rss.svg".into(),
            chart(
                "Idle RSS, and its anonymous part (server with one agent; agent)",
                "MiB (lower is better)",
                false,
                vec![
                    series("server", Metric::IdleRssServer),
                    series("agent", Metric::IdleRssAgent),
                    series("server, anonymous", Metric::IdleAnonServer),
                    series("agent, anonymous", Metric::IdleAnonAgent),
                ],
            ),
        ),
    ]
    .into_iter()
    .filter(|(_, c): &(String, Chart)| c.series.iter().any(|(_, v)| v.iter().any(Option::is_some)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systems::{Frontend, Impl};

    #[test]
    fn figures_show_ratios_to_both_relay_anchors() {
        let tether = System::Konn(Impl::Tether, Frontend::HttpConnectUds);
        let systems = vec![
            System::Direct,
            System::RelayLimit { tls: false },
            System::RelayLimit { tls: true },
            tether,
        ];
        let mut results = Results::default();
        for (&system, value) in systems.iter().zip([3000.0, 2000.0, 1000.0, 500.0]) {
            results.add(system, Metric::BulkUp, 1, value);
        }
        let meta = Meta {
            command: "tether-bench".into(),
            date: String::new(),
            machine: String::new(),
            elapsed_secs: 1.0,
            quick: true,
            systems,
            notes: Vec::new(),
        };
        let md = markdown(&results, &meta, &Profile::quick(), &[]);
        for row in [
            "| system | median | min–max | runs | ×upstream | ×direct | ×relay | ×relay-tls |",
            "| direct | 3,000 | 3,000–3,000 | 1 |  |  |  |  |",
            "| relay-limit | 2,000 | 2,000–2,000 | 1 |  | 0.67× |  |  |",
            "| relay-limit-tls | 1,000 | 1,000–1,000 | 1 |  | 0.33× | 0.50× |  |",
            "| tether http-connect/uds | 500 | 500–500 | 1 |  | 0.17× | 0.25× | 0.50× |",
        ] {
            assert!(md.contains(row), "no row {row:?} in:\n{md}");
        }
    }

    #[test]
    fn a_peer_hop_is_set_against_the_direct_dial_of_its_shape() {
        let hop = System::Konn(Impl::TetherPeer, Frontend::GrpcUds);
        let direct = System::Konn(Impl::Tether, Frontend::GrpcUds);
        let lone = System::Konn(Impl::TetherPeer, Frontend::HttpConnectUds);
        let upstream = System::Konn(Impl::Upstream, Frontend::GrpcUds);
        let mut results = Results::default();
        for (run, (h, d)) in [(900.0, 1000.0), (800.0, 1200.0), (1000.0, 1100.0)]
            .into_iter()
            .enumerate()
        {
            results.add(hop, Metric::BulkUp, run + 1, h);
            results.add(direct, Metric::BulkUp, run + 1, d);
            results.add(lone, Metric::BulkUp, run + 1, h);
            results.add(upstream, Metric::BulkUp, run + 1, d);
        }
        results.add(hop, Metric::PingP50, 1, 60.0);
        results.add(direct, Metric::PingP50, 1, 40.0);
        // Only the hop has it: no row.
        results.add(hop, Metric::PingP99, 1, 90.0);
        let meta = Meta {
            command: "tether-bench".into(),
            date: String::new(),
            machine: String::new(),
            elapsed_secs: 1.0,
            quick: true,
            systems: vec![direct, hop, lone, upstream],
            notes: Vec::new(),
        };
        let md = markdown(&results, &meta, &Profile::quick(), &[]);
        for row in [
            "## One peer hop against a direct dial",
            "| shape | figure | tether-peer | tether | peer hop ÷ direct |",
            "| grpc/uds | bulk upload (MiB/s) | 900 (800–1,000) | 1,100 (1,000–1,200) | 0.82× |",
            "| grpc/uds | ping-pong p50 (µs) | 60.0 (60.0–60.0) | 40.0 (40.0–40.0) | 1.5× |",
            // Not against upstream: its ×upstream cell stays empty.
            "| tether-peer grpc/uds | 900 | 800–1,000 | 3 |  |",
        ] {
            assert!(md.contains(row), "no row {row:?} in:\n{md}");
        }
        assert!(!md.contains("| grpc/uds | ping-pong p99"), "{md}");
        // tether-peer http-connect/uds has no direct dial in the run.
        assert!(!md.contains("| http-connect/uds | bulk upload"), "{md}");
    }

    #[test]
    fn the_fleet_table_sets_k1_against_the_mesh() {
        let mut results = Results::default();
        let fleet = |mode, figure| Metric::Fleet(mode, figure);
        for (run, (mesh, k1)) in [(30_000.0, 10_000.0), (30_000.0, 10_000.0)]
            .into_iter()
            .enumerate()
        {
            results.add(
                FLEET_SYSTEM,
                fleet(FleetMode::Mesh, FleetFigure::Streams),
                run + 1,
                mesh,
            );
            results.add(
                FLEET_SYSTEM,
                fleet(FleetMode::K1, FleetFigure::Streams),
                run + 1,
                k1,
            );
        }
        for (run, (mesh, k1)) in [(1.2, 0.4), (1.0, 0.5), (1.1, 0.3)].into_iter().enumerate() {
            results.add(
                FLEET_SYSTEM,
                fleet(FleetMode::Mesh, FleetFigure::Pings),
                run + 1,
                mesh,
            );
            results.add(
                FLEET_SYSTEM,
                fleet(FleetMode::K1, FleetFigure::Pings),
                run + 1,
                k1,
            );
        }
        results.add(
            FLEET_SYSTEM,
            fleet(FleetMode::K1, FleetFigure::HopDialP50),
            1,
            300.0,
        );
        results.add(
            FLEET_SYSTEM,
            fleet(FleetMode::K1, FleetFigure::DirectDialP50),
            1,
            200.0,
        );
        let meta = Meta {
            command: "tether-bench --workloads fleet".into(),
            date: String::new(),
            machine: String::new(),
            elapsed_secs: 1.0,
            quick: true,
            systems: vec![],
            notes: Vec::new(),
        };
        let md = markdown(&results, &meta, &Profile::quick(), &[]);
        for row in [
            "## Fleet of 3 servers: full mesh against K=1",
            "| figure | mesh | k1 | k1 ÷ mesh |",
            "| agent streams, all servers | 30,000 | 10,000 | 0.33× |",
            "| keepalive PINGs per agent per s, both ways | 1.10 (1.00–1.20) | 0.400 (0.300–0.500) | 0.36× |",
            "dial latency p50 300 µs through server 1, 200 µs through server 3 (1.5×)",
        ] {
            assert!(md.contains(row), "no row {row:?} in:\n{md}");
        }
        // Figures not measured have empty cells, and the per-figure tables leave the fleet out.
        assert!(
            md.contains("| servers' RSS per agent (KiB) |  |  |  |"),
            "{md}"
        );
        assert!(!md.contains("### Fleet"), "{md}");
    }

    #[test]
    fn the_tunnel_table_has_a_row_per_cap_and_held_count() {
        use crate::results::TunnelPoint;
        let tether = System::Konn(Impl::Tether, Frontend::GrpcUds);
        let upstream = System::Konn(Impl::Upstream, Frontend::GrpcUds);
        let mut results = Results::default();
        let mut add = |system, cap, held, figures: [f64; 7], run| {
            for (f, v) in TunnelFigure::ALL.into_iter().zip(figures) {
                results.add(system, Metric::Tunnel(TunnelPoint { cap, held }, f), run, v);
            }
        };
        add(
            tether,
            Some(50),
            0,
            [4_000.0, 90.0, 400.0, 61.0, 0.0, 0.0, 16.0],
            1,
        );
        add(
            tether,
            Some(50),
            40,
            [2_000.0, 900.0, 9_000.0, 70.0, 0.0, 3.0, 50.0],
            1,
        );
        add(
            tether,
            Some(50),
            40,
            [3_000.0, 700.0, 8_000.0, 60.0, 1.0, 2.0, 50.0],
            2,
        );
        add(
            upstream,
            None,
            40,
            [1_500.0, 300.0, 2_000.0, 150.0, 0.0, 0.0, 56.0],
            1,
        );
        let meta = Meta {
            command: "tether-bench --workloads tunnel".into(),
            date: String::new(),
            machine: String::new(),
            elapsed_secs: 1.0,
            quick: true,
            systems: vec![tether, upstream],
            notes: Vec::new(),
        };
        let md = markdown(&results, &meta, &Profile::quick(), &[]);
        for row in [
            "## Reusable tunnel: one gRPC connection, held streams beside short dials",
            "| system | stream cap | held | held + dialling | dials/s | dial p50 µs | dial p99 µs | CPU µs/dial | peak Proxy streams | held failed | failed dials | runs |",
            "| tether grpc/uds | 50 | 0 | 16 | 4,000 | 90.0 | 400 | 61.0 | 16 | 0 | 0 | 1 |",
            "| tether grpc/uds | 50 | 40 | 56 (over the cap) | 2,500 | 800 | 8,500 | 65.0 | 50 | 1 | 5 | 2 |",
            "| upstream grpc/uds | none | 40 | 56 | 1,500 | 300 | 2,000 | 150 | 56 | 0 | 0 | 1 |",
        ] {
            assert!(md.contains(row), "no row {row:?} in:\n{md}");
        }
        // Not among the per-figure tables, whose list is fixed.
        assert!(!md.contains("### Reusable tunnel"), "{md}");
    }
}
