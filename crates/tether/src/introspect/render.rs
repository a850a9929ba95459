//! Tables like `ss` prints them: a header row, columns padded to their widest cell.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tether_observe::duration::format_go_duration;
use tether_observe::introspect::{AgentsReport, ConnectionView, ConnectionsReport, StreamView};
use tether_observe::time::Civil;

/// A table of left-aligned cells; the last column is not padded.
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(header: &[&str]) -> Self {
        Self {
            rows: vec![header.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    fn render(&self) -> String {
        let columns = self.rows[0].len();
        let widths: Vec<usize> = (0..columns)
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| r[i].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i + 1 == columns {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `tether connections`.
pub(crate) fn connections(report: &ConnectionsReport) -> String {
    let mut table = Table::new(&[
        "STATE",
        "CONN",
        "DIAL",
        "FRONTEND",
        "CLIENT",
        "DESTINATION",
        "AGENT",
        "SERVER",
        "HOP",
        "AGE",
        "RX",
        "TX",
        "CREDIT",
        "QUEUED",
    ]);
    for c in &report.connections {
        table.push(vec![
            c.state.clone(),
            c.connect_id.map_or("-".into(), |id| id.to_string()),
            c.dial_id.to_string(),
            or_dash(c.frontend.as_deref()),
            or_dash(c.client.as_deref()),
            c.destination.clone(),
            c.agent_id.clone(),
            c.server_id.clone(),
            match (&c.via_server, &c.from_server) {
                (Some(via), _) => format!("via {via}"),
                (None, Some(from)) => format!("from {from}"),
                (None, None) => "-".into(),
            },
            age(c.age_seconds),
            bytes(c.bytes_received),
            bytes(c.bytes_sent),
            bytes(c.credit),
            format!("{}/{}", bytes(c.queued_bytes), bytes(c.queue_limit)),
        ]);
    }
    format!(
        "{} ({} of them pending) on this {}\n{}",
        count(report.connections.len(), "connection"),
        report
            .connections
            .iter()
            .filter(|c| c.state == "pending")
            .count(),
        report.role,
        table.render()
    )
}

/// `tether agents`: the answering end and its release, then one row per stream with the
/// other end's release (`upstream` for an upstream peer, which announces none).
pub(crate) fn agents(report: &AgentsReport) -> String {
    let server = report.role == "server";
    let heading = if server {
        format!(
            "server {} ({}, server count {}), {}\n",
            report.server_id,
            release(&report.version),
            report.server_count,
            count(report.streams.len(), "agent stream")
        )
    } else {
        format!(
            "agent {} ({}), connected to {} of {} servers\n",
            report.agent_id,
            release(&report.version),
            report.streams.len(),
            report.server_count
        )
    };
    let mut table = Table::new(&[
        "AGENT",
        "SERVER",
        "STREAM",
        if server {
            "AGENT-VERSION"
        } else {
            "SERVER-VERSION"
        },
        "AGE",
        "LAST-PING",
        "PENDING",
        "CONNS",
        "QUEUED",
        "LINK",
        "FLOW",
        "STATE",
        "IDENTIFIERS",
    ]);
    for s in &report.streams {
        table.push(vec![
            s.agent_id.clone(),
            match (&s.via_server, &s.server_address) {
                (Some(via), _) => format!("{via} (peer)"),
                (None, Some(address)) => format!("{}@{address}", s.server_id),
                (None, None) => s.server_id.clone(),
            },
            s.stream_id.to_string(),
            if server {
                &s.agent_version
            } else {
                &s.server_version
            }
            .clone()
            .unwrap_or_else(|| "upstream".into()),
            age(s.age_seconds),
            s.last_ping_seconds
                .map_or("-".into(), |ago| format!("{} ago", age(ago))),
            s.pending_dials.to_string(),
            s.connections.to_string(),
            bytes(s.queued_bytes),
            or_dash(Some(s.transport.as_str()).filter(|t| !t.is_empty())),
            if s.credit_flow { "credit" } else { "legacy" }.into(),
            state(s).into(),
            or_dash(Some(s.identifiers.as_str()).filter(|i| !i.is_empty())),
        ]);
    }
    let mut out = heading + &table.render();
    for p in &report.peers {
        let what = match p.direction.as_str() {
            "in" => "offers its agents to this server",
            _ => "takes this server's agents",
        };
        out.push_str(&format!(
            "peer {} at {} {what}: {}, {} pending, {} open, up {}\n",
            p.peer_server_id,
            p.address,
            count(p.agents as usize, "agent"),
            p.pending_dials,
            p.connections,
            age(p.age_seconds)
        ));
    }
    for s in &report.streams {
        if let Some(why) = &s.retiring {
            out.push_str(&format!(
                "{} stream {} retiring: {why}\n",
                s.agent_id, s.stream_id
            ));
        }
    }
    for file in &report.config_files {
        out.push_str(&format!(
            "{} {}: generation {}, sha256 {}, applied {}\n",
            file.name, file.path, file.generation, file.sha256, file.applied_at
        ));
        if let Some(refusal) = &file.last_refusal {
            out.push_str(&format!(
                "  last refused {}: {}\n",
                refusal.at, refusal.message
            ));
        }
    }
    out
}

/// A stream's STATE cell: a reload's retirement outranks the agent's own DRAIN.
fn state(stream: &StreamView) -> &'static str {
    if stream.retiring.is_some() {
        "retiring"
    } else if stream.draining {
        "draining"
    } else {
        "active"
    }
}

/// One line of `tether top`: a connection and its throughput between two snapshots.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct TopRow {
    #[serde(flatten)]
    pub(crate) connection: ConnectionView,
    pub(crate) received_per_second: f64,
    pub(crate) sent_per_second: f64,
    /// Bytes waited in its queue at both snapshots and none moved in between: the reader on
    /// one side is not reading (a paused `kubectl logs -f`, a stuck webhook client).
    pub(crate) stalled: bool,
}

/// The connections present in `after`, with their rates since `before` (a connection new
/// since then counts from zero), busiest first.
pub(crate) fn top_rows(
    before: &ConnectionsReport,
    after: &ConnectionsReport,
    seconds: f64,
) -> Vec<TopRow> {
    let key = |c: &ConnectionView| (c.server_id.clone(), c.agent_id.clone(), c.dial_id);
    let earlier: HashMap<_, &ConnectionView> =
        before.connections.iter().map(|c| (key(c), c)).collect();
    let seconds = seconds.max(1e-3);
    let mut rows: Vec<TopRow> = after
        .connections
        .iter()
        .filter(|c| c.connect_id.is_some())
        .map(|c| {
            let earlier = earlier.get(&key(c));
            let (rx, tx) = earlier.map_or((0, 0), |b| (b.bytes_received, b.bytes_sent));
            let stalled = earlier.is_some_and(|b| {
                b.queued_bytes > 0
                    && c.queued_bytes > 0
                    && (rx, tx) == (c.bytes_received, c.bytes_sent)
            });
            TopRow {
                connection: c.clone(),
                received_per_second: c.bytes_received.saturating_sub(rx) as f64 / seconds,
                sent_per_second: c.bytes_sent.saturating_sub(tx) as f64 / seconds,
                stalled,
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.received_per_second + b.sent_per_second)
            .total_cmp(&(a.received_per_second + a.sent_per_second))
            .then(a.connection.dial_id.cmp(&b.connection.dial_id))
    });
    rows
}

/// `tether top`.
pub(crate) fn top(rows: &[TopRow], limit: usize) -> String {
    let mut table = Table::new(&[
        "RX/s",
        "TX/s",
        "CONN",
        "DIAL",
        "CLIENT",
        "DESTINATION",
        "AGENT",
        "AGE",
        "RX",
        "TX",
        "QUEUED",
        "",
    ]);
    for r in rows.iter().take(limit) {
        let c = &r.connection;
        table.push(vec![
            bytes(r.received_per_second as u64),
            bytes(r.sent_per_second as u64),
            c.connect_id.map_or("-".into(), |id| id.to_string()),
            c.dial_id.to_string(),
            or_dash(c.client.as_deref()),
            c.destination.clone(),
            c.agent_id.clone(),
            age(c.age_seconds),
            bytes(c.bytes_received),
            bytes(c.bytes_sent),
            bytes(c.queued_bytes),
            if r.stalled { "stalled" } else { "" }.into(),
        ]);
    }
    let stalled = match rows.iter().filter(|r| r.stalled).count() {
        0 => String::new(),
        n => format!(", {n} stalled (bytes queued, none moved)"),
    };
    format!(
        "{}{stalled}, busiest first (showing {})\n{}",
        count(rows.len(), "connection"),
        rows.len().min(limit),
        table.render()
    )
}

/// `tether 0.1.0`, or what an older tether that reports no version gets.
fn release(version: &str) -> String {
    if version.is_empty() {
        "version not reported".into()
    } else {
        format!("tether {version}")
    }
}

/// The first line of each `tether top` frame: where from, when, and over how long the rates
/// were measured.
pub(crate) fn top_header(
    address: &str,
    at: SystemTime,
    seconds: f64,
    interval: Duration,
) -> String {
    format!(
        "{address} at {}, rates over {seconds:.1}s (--interval {})\n",
        Civil::from_system_time(at).rfc3339(),
        format_go_duration(interval)
    )
}

/// A `--watch` frame when the admin endpoint did not answer: the next refresh tries again.
pub(crate) fn disconnected(
    address: &str,
    at: SystemTime,
    interval: Duration,
    error: &anyhow::Error,
) -> String {
    format!(
        "{address} at {}: disconnected, retrying every {} (Ctrl-C stops)\nerror: {error:#}\n",
        Civil::from_system_time(at).rfc3339(),
        format_go_duration(interval)
    )
}

/// `1 connection`, `2 connections`.
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn or_dash(s: Option<&str>) -> String {
    s.unwrap_or("-").to_owned()
}

/// `512B`, `1.5KiB`, `3.0MiB`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1}{}", UNITS[unit])
}

/// `850ms`, `12s`, `3m04s`, `2h05m`.
fn age(seconds: f64) -> String {
    if seconds < 1.0 {
        return format!("{}ms", (seconds * 1000.0) as u64);
    }
    let s = seconds as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use tether_observe::introspect::{ConfigFileView, RefusalView, StreamView};

    use super::*;

    fn view(dial: i64, state: &str, rx: u64, tx: u64) -> ConnectionView {
        ConnectionView {
            connect_id: (state != "pending").then_some(dial),
            dial_id: dial,
            state: state.into(),
            frontend: Some("http-connect".into()),
            client: Some("certificate CN=kube-apiserver".into()),
            destination: "10.0.0.1:10250".into(),
            agent_id: "node-1".into(),
            server_id: "server-a".into(),
            via_server: None,
            from_server: None,
            age_seconds: 65.2,
            bytes_received: rx,
            bytes_sent: tx,
            credit: 262_144,
            queued_bytes: 0,
            queue_limit: 1 << 20,
        }
    }

    #[test]
    fn connections_table_aligns_columns() {
        let report = ConnectionsReport {
            role: "server".into(),
            connections: vec![view(7, "open", 1536, 12), view(42, "pending", 0, 0)],
        };
        let text = connections(&report);
        let expected = "\
2 connections (1 of them pending) on this server
STATE    CONN  DIAL  FRONTEND      CLIENT                         DESTINATION     AGENT   SERVER    HOP  AGE    RX      TX   CREDIT    QUEUED
open     7     7     http-connect  certificate CN=kube-apiserver  10.0.0.1:10250  node-1  server-a  -    1m05s  1.5KiB  12B  256.0KiB  0B/1.0MiB
pending  -     42    http-connect  certificate CN=kube-apiserver  10.0.0.1:10250  node-1  server-a  -    1m05s  0B      0B   256.0KiB  0B/1.0MiB
";
        assert_eq!(text, expected);
    }

    #[test]
    fn peering_shows_the_hop_of_each_connection_and_every_peer_link() {
        let forwarded = ConnectionView {
            via_server: Some("server-b".into()),
            ..view(7, "open", 10, 10)
        };
        let carried = ConnectionView {
            from_server: Some("server-a".into()),
            ..view(8, "open", 10, 10)
        };
        let text = connections(&ConnectionsReport {
            role: "server".into(),
            connections: vec![forwarded, carried],
        });
        let hops: Vec<&str> = text
            .lines()
            .skip(2)
            .map(|line| {
                let cells: Vec<&str> = line.split("  ").filter(|c| !c.is_empty()).collect();
                cells[8].trim()
            })
            .collect();
        assert_eq!(hops, ["via server-b", "from server-a"], "{text}");
        let report = AgentsReport {
            role: "server".into(),
            version: "0.1.0".into(),
            server_id: "server-a".into(),
            server_count: 3,
            streams: vec![StreamView {
                agent_id: "node-9".into(),
                server_id: "server-a".into(),
                via_server: Some("server-b".into()),
                transport: "peer".into(),
                ..Default::default()
            }],
            peers: vec![tether_observe::introspect::PeerView {
                peer_server_id: "server-b".into(),
                direction: "in".into(),
                address: "10.0.0.8:8093".into(),
                age_seconds: 61.0,
                agents: 120,
                pending_dials: 0,
                connections: 3,
            }],
            ..Default::default()
        };
        let text = agents(&report);
        let row: Vec<&str> = text.lines().nth(2).unwrap().split_whitespace().collect();
        assert_eq!(&row[..3], ["node-9", "server-b", "(peer)"], "{text}");
        assert!(
            text.contains(
                "peer server-b at 10.0.0.8:8093 offers its agents to this server: 120 agents, 0 pending, 3 open, up 1m01s\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn agents_table_shows_identifiers_health_and_membership() {
        let report = AgentsReport {
            role: "server".into(),
            version: "0.1.0".into(),
            server_id: "server-a".into(),
            server_count: 3,
            agent_id: String::new(),
            streams: vec![StreamView {
                agent_id: "node-1".into(),
                server_id: "server-a".into(),
                server_address: None,
                via_server: None,
                stream_id: 1,
                identifiers: "host=node-1&ipv4=10.0.0.1".into(),
                agent_version: Some("0.1.0".into()),
                server_version: Some("0.1.0".into()),
                transport: "native".into(),
                draining: false,
                retiring: None,
                credit_flow: true,
                age_seconds: 7300.0,
                last_ping_seconds: Some(4.0),
                pending_dials: 1,
                connections: 2,
                queued_bytes: 0,
            }],
            peers: Vec::new(),
            config_files: Vec::new(),
        };
        let text = agents(&report);
        assert!(
            text.starts_with("server server-a (tether 0.1.0, server count 3), 1 agent stream\n")
        );
        assert!(text.lines().nth(1).unwrap().contains(" AGENT-VERSION "));
        let row = text.lines().nth(2).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "node-1",
                "server-a",
                "1",
                "0.1.0",
                "2h01m",
                "4s",
                "ago",
                "1",
                "2",
                "0B",
                "native",
                "credit",
                "active",
                "host=node-1&ipv4=10.0.0.1"
            ]
        );
    }

    #[test]
    fn agents_shows_the_routing_files_generation_on_a_server() {
        let report = AgentsReport {
            role: "server".into(),
            version: "0.1.0".into(),
            server_id: "server-a".into(),
            server_count: 1,
            config_files: vec![ConfigFileView {
                name: "routing-config".into(),
                path: "/etc/tether/routing.yaml".into(),
                generation: 4,
                sha256: "0123456789abcdef".into(),
                applied_at: "2025-12-03T15:50:57.000Z".into(),
                last_refusal: None,
            }],
            streams: vec![StreamView {
                agent_id: "node-1".into(),
                stream_id: 3,
                retiring: Some("tenant b was removed from the routing file (generation 4)".into()),
                draining: true,
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = agents(&report);
        let row: Vec<&str> = text.lines().nth(2).unwrap().split_whitespace().collect();
        // A reload's retirement outranks the agent's own DRAIN.
        assert!(
            row.contains(&"retiring") && !row.contains(&"draining"),
            "{text}"
        );
        assert!(text.contains(
            "node-1 stream 3 retiring: tenant b was removed from the routing file (generation 4)\n"
        ));
        assert!(agents(&report).ends_with(
            "routing-config /etc/tether/routing.yaml: generation 4, sha256 0123456789abcdef, \
             applied 2025-12-03T15:50:57.000Z\n"
        ));
    }

    #[test]
    fn agents_table_names_upstream_peers_and_the_agents_own_release() {
        let stream = StreamView {
            agent_id: "node-1".into(),
            server_id: "server-a".into(),
            agent_version: None,
            server_version: None,
            ..Default::default()
        };
        let server = AgentsReport {
            role: "server".into(),
            version: "0.1.0".into(),
            server_id: "server-a".into(),
            server_count: 1,
            streams: vec![stream.clone()],
            ..Default::default()
        };
        let cells = |text: &str| -> Vec<String> {
            let row = text.lines().nth(2).unwrap();
            row.split_whitespace().map(str::to_owned).collect()
        };
        assert_eq!(cells(&agents(&server))[3], "upstream");
        let agent = AgentsReport {
            role: "agent".into(),
            version: "0.1.0".into(),
            agent_id: "node-1".into(),
            server_count: 2,
            streams: vec![stream],
            ..Default::default()
        };
        let text = agents(&agent);
        assert!(text.starts_with("agent node-1 (tether 0.1.0), connected to 1 of 2 servers\n"));
        assert!(text.lines().nth(1).unwrap().contains(" SERVER-VERSION "));
        assert_eq!(cells(&text)[3], "upstream", "an upstream server");
        let discovered = AgentsReport {
            streams: vec![StreamView {
                server_address: Some("10.0.0.7:8132".into()),
                ..agent.streams[0].clone()
            }],
            ..agent.clone()
        };
        assert_eq!(cells(&agents(&discovered))[1], "server-a@10.0.0.7:8132");
        let old = AgentsReport {
            version: String::new(),
            ..agent
        };
        assert!(agents(&old).contains("(version not reported)"));
    }

    #[test]
    fn agents_shows_the_policy_generation_and_its_last_refusal() {
        let mut report = AgentsReport {
            role: "agent".into(),
            version: "0.1.0".into(),
            agent_id: "node-1".into(),
            server_count: 1,
            config_files: vec![ConfigFileView {
                name: "destination-policy".into(),
                path: "/etc/tether/policy".into(),
                generation: 3,
                sha256: "ab12".into(),
                applied_at: "2026-01-02T03:04:05.000Z".into(),
                last_refusal: None,
            }],
            ..Default::default()
        };
        let text = agents(&report);
        assert!(
            text.ends_with(
                "destination-policy /etc/tether/policy: generation 3, sha256 ab12, \
                 applied 2026-01-02T03:04:05.000Z\n"
            ),
            "{text}"
        );
        report.config_files[0].last_refusal = Some(RefusalView {
            at: "2026-01-02T03:05:00.000Z".into(),
            sha256: "cd34".into(),
            message: "destination policy /etc/tether/policy: line 2: bad".into(),
        });
        assert!(agents(&report).ends_with(
            "\n  last refused 2026-01-02T03:05:00.000Z: \
             destination policy /etc/tether/policy: line 2: bad\n"
        ));
    }

    #[test]
    fn top_header_and_disconnected_frames_say_where_when_and_how_often() {
        let at = std::time::UNIX_EPOCH + Duration::from_secs(1_764_777_057);
        assert_eq!(
            top_header("127.0.0.1:8095", at, 2.004, Duration::from_secs(2)),
            "127.0.0.1:8095 at 2025-12-03T15:50:57.000Z, rates over 2.0s (--interval 2s)\n"
        );
        let error = anyhow::anyhow!("Connection refused").context("connecting to 127.0.0.1:8095");
        assert_eq!(
            disconnected("127.0.0.1:8095", at, Duration::from_millis(500), &error),
            "127.0.0.1:8095 at 2025-12-03T15:50:57.000Z: disconnected, retrying every 500ms \
             (Ctrl-C stops)\nerror: connecting to 127.0.0.1:8095: Connection refused\n"
        );
    }

    #[test]
    fn top_sorts_by_throughput_and_counts_new_connections_from_zero() {
        let before = ConnectionsReport {
            role: "server".into(),
            connections: vec![view(1, "open", 1000, 0), view(2, "open", 0, 0)],
        };
        let after = ConnectionsReport {
            role: "server".into(),
            connections: vec![
                view(1, "open", 3000, 0),
                view(2, "open", 0, 10_000),
                view(3, "open", 500, 0),
                view(4, "pending", 0, 0),
            ],
        };
        let rows = top_rows(&before, &after, 2.0);
        let order: Vec<i64> = rows.iter().map(|r| r.connection.dial_id).collect();
        assert_eq!(order, [2, 1, 3], "pending dials have no throughput");
        assert_eq!(rows[0].sent_per_second, 5000.0);
        assert_eq!(rows[1].received_per_second, 1000.0);
        assert_eq!(rows[2].received_per_second, 250.0);
        let text = top(&rows, 2);
        assert!(text.starts_with("3 connections, busiest first (showing 2)\n"));
        assert_eq!(text.lines().count(), 4);
        let busiest: Vec<&str> = text.lines().nth(2).unwrap().split_whitespace().collect();
        assert_eq!(busiest[..3], ["0B", "4.9KiB", "2"]);
    }

    #[test]
    fn top_marks_connections_whose_queue_did_not_move() {
        let queued = |dial, rx, queued| ConnectionView {
            queued_bytes: queued,
            ..view(dial, "open", rx, 0)
        };
        let before = ConnectionsReport {
            role: "server".into(),
            connections: vec![
                queued(1, 5000, 786_432),
                queued(2, 5000, 4096),
                queued(3, 0, 0),
            ],
        };
        let after = ConnectionsReport {
            role: "server".into(),
            connections: vec![
                queued(1, 5000, 786_432),
                queued(2, 9000, 4096),
                queued(3, 0, 0),
                queued(4, 0, 1024),
            ],
        };
        let rows = top_rows(&before, &after, 2.0);
        let stalled: Vec<i64> = rows
            .iter()
            .filter(|r| r.stalled)
            .map(|r| r.connection.dial_id)
            .collect();
        assert_eq!(
            stalled,
            [1],
            "moving, idle without a queue, and new since the last snapshot are not stalled"
        );
        let text = top(&rows, 10);
        assert!(
            text.starts_with("4 connections, 1 stalled (bytes queued, none moved), busiest first"),
            "{text}"
        );
        let line = text.lines().find(|l| l.contains("768.0KiB")).unwrap();
        assert!(line.ends_with("768.0KiB  stalled"), "{line:?}");
    }

    #[test]
    fn units() {
        assert_eq!(bytes(0), "0B");
        assert_eq!(bytes(1023), "1023B");
        assert_eq!(bytes(3 << 20), "3.0MiB");
        assert_eq!(age(0.25), "250ms");
        assert_eq!(age(59.9), "59s");
        assert_eq!(age(3600.0), "1h00m");
    }
}
