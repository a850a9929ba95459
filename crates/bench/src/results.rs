//! What is measured (figures, their units and which way is better) and the samples
//! collected, one value per figure, system and run.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::stats::Summary;
use crate::systems::System;
use crate::workloads::FleetMode;
use crate::workloads::Profile;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Metric {
    BulkUp,
    BulkDown,
    CpuUp,
    CpuDown,
    PingP50,
    PingP99,
    PingP999,
    Churn1Rate,
    Churn1DialP50,
    Churn1DialP99,
    Churn64Rate,
    Churn64DialP50,
    Churn64DialP99,
    ChurnCpu,
    HolRatio,
    FairP99Ratio,
    FairBulkRatio,
    IdleRssServer,
    IdleRssAgent,
    IdleAnonServer,
    IdleAnonAgent,
    ConnServer,
    ConnAgent,
    ConnTotal,
    ScaleServer,
    ScaleAgents,
    ScaleTotal,
    ScaleRssAfter,
    AgentSmall,
    AgentLarge,
    AgentIdleCpu,
    AgentRssAfter,
    FanInChurnRate,
    FanInChurnDialP50,
    FanInChurnDialP99,
    FanInChurnCpu,
    FanInDialSpread,
    ConnRssAfter,
    ResumePauseP50,
    ResumePauseMax,
    /// A figure of one point of the reusable-tunnel sweep (its own table in the report; not
    /// in [`Metric::ALL`], since the points are the run's flags).
    Tunnel(TunnelPoint, TunnelFigure),
    /// A figure of the fleet of peered servers in one of its modes (its own table in the
    /// report; not in [`Metric::ALL`]).
    Fleet(FleetMode, FleetFigure),
}

/// What the fleet workload measures in each mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FleetFigure {
    /// Agent streams the servers count together.
    Streams,
    StreamsPerAgent,
    /// Agents the servers heard of from their peers, added up over the servers.
    PeerRoutes,
    /// The servers' RSS together with every agent connected.
    ServersRss,
    /// The servers' RSS growth per agent.
    KibPerAgent,
    /// Keepalive PINGs per agent per second: the servers', the agents', both.
    ServerPings,
    AgentPings,
    Pings,
    /// The servers' CPU while the fleet idles: per agent per minute, and in % of a core.
    CpuPerAgent,
    CpuPct,
    /// Seconds from the first connect until the servers counted every agent and route, the
    /// servers' CPU seconds in that time, and the connects that failed and were retried.
    ConnectSecs,
    ConnectCpu,
    ConnectRetries,
    /// K=1: dial latency p50 to an agent server 3 holds, through server 1 (a peer hop)
    /// and through server 3.
    HopDialP50,
    DirectDialP50,
}

impl FleetFigure {
    pub const ALL: [FleetFigure; 15] = [
        FleetFigure::Streams,
        FleetFigure::StreamsPerAgent,
        FleetFigure::PeerRoutes,
        FleetFigure::ServersRss,
        FleetFigure::KibPerAgent,
        FleetFigure::ServerPings,
        FleetFigure::AgentPings,
        FleetFigure::Pings,
        FleetFigure::CpuPerAgent,
        FleetFigure::CpuPct,
        FleetFigure::ConnectSecs,
        FleetFigure::ConnectCpu,
        FleetFigure::ConnectRetries,
        FleetFigure::HopDialP50,
        FleetFigure::DirectDialP50,
    ];

    fn key(&self) -> &'static str {
        match self {
            FleetFigure::Streams => "streams",
            FleetFigure::StreamsPerAgent => "streams_per_agent",
            FleetFigure::PeerRoutes => "peer_routes",
            FleetFigure::ServersRss => "servers_rss_mib",
            FleetFigure::KibPerAgent => "servers_kib_per_agent",
            FleetFigure::ServerPings => "server_pings_per_agent_s",
            FleetFigure::AgentPings => "agent_pings_per_agent_s",
            FleetFigure::Pings => "pings_per_agent_s",
            FleetFigure::CpuPerAgent => "servers_cpu_ms_per_agent_min",
            FleetFigure::CpuPct => "servers_cpu_pct",
            FleetFigure::ConnectSecs => "connect_s",
            FleetFigure::ConnectCpu => "connect_servers_cpu_s",
            FleetFigure::ConnectRetries => "connect_retries",
            FleetFigure::HopDialP50 => "hop_dial_p50_us",
            FleetFigure::DirectDialP50 => "direct_dial_p50_us",
        }
    }

    /// The row of the fleet's table, with its unit.
    pub fn title(&self) -> &'static str {
        match self {
            FleetFigure::Streams => "agent streams, all servers",
            FleetFigure::StreamsPerAgent => "streams per agent",
            FleetFigure::PeerRoutes => "agents heard of from peers, all servers",
            FleetFigure::ServersRss => "servers' RSS together (MiB)",
            FleetFigure::KibPerAgent => "servers' RSS per agent (KiB)",
            FleetFigure::ServerPings => "keepalive PINGs per agent per s, servers → agent",
            FleetFigure::AgentPings => "keepalive PINGs per agent per s, agent → servers",
            FleetFigure::Pings => "keepalive PINGs per agent per s, both ways",
            FleetFigure::CpuPerAgent => "servers' idle CPU per agent (ms per minute)",
            FleetFigure::CpuPct => "servers' idle CPU together (% of a core)",
            FleetFigure::ConnectSecs => "every agent connected and announced (s)",
            FleetFigure::ConnectCpu => "servers' CPU meanwhile (CPU s)",
            FleetFigure::ConnectRetries => "connects that failed and were retried",
            FleetFigure::HopDialP50 => {
                "dial p50 through server 1 to an agent only server 3 holds (µs)"
            }
            FleetFigure::DirectDialP50 => "the same dial through server 3 (µs)",
        }
    }
}

/// One point of the reusable-tunnel sweep: the server's stream cap per frontend connection
/// and the streams held open while the short dials run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TunnelPoint {
    /// tether's `--max-streams-per-frontend-connection`; `None`: the server has no such flag
    /// (upstream: grpc-go's default, no limit).
    pub cap: Option<u32>,
    pub held: u32,
}

/// What is measured at a [`TunnelPoint`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TunnelFigure {
    /// Short dials (dial, 64-byte echo, close) completed per second.
    Rate,
    DialP50,
    DialP99,
    /// Server + agent CPU per completed short dial.
    Cpu,
    /// Held streams that failed to open, or no longer echoed at the end.
    HeldFailed,
    /// Failed short dials.
    Errors,
    /// The most `Proxy` streams the server's gauge showed during the short dials.
    PeakStreams,
}

impl TunnelFigure {
    pub const ALL: [TunnelFigure; 7] = [
        TunnelFigure::Rate,
        TunnelFigure::DialP50,
        TunnelFigure::DialP99,
        TunnelFigure::Cpu,
        TunnelFigure::HeldFailed,
        TunnelFigure::Errors,
        TunnelFigure::PeakStreams,
    ];

    fn key(&self) -> &'static str {
        match self {
            TunnelFigure::Rate => "dials_s",
            TunnelFigure::DialP50 => "dial_p50_us",
            TunnelFigure::DialP99 => "dial_p99_us",
            TunnelFigure::Cpu => "cpu_us_per_dial",
            TunnelFigure::HeldFailed => "held_failed",
            TunnelFigure::Errors => "dial_errors",
            TunnelFigure::PeakStreams => "peak_proxy_streams",
        }
    }
}

impl TunnelPoint {
    /// `tunnel_cap1000_held900` or `tunnel_capnone_held900`.
    fn key(&self) -> String {
        match self.cap {
            Some(cap) => format!("tunnel_cap{cap}_held{}", self.held),
            None => format!("tunnel_capnone_held{}", self.held),
        }
    }

    /// The point and figure of a key made by [`Metric::key`].
    fn parse(key: &str) -> Option<(TunnelPoint, TunnelFigure)> {
        let rest = key.strip_prefix("tunnel_cap")?;
        let (cap, rest) = rest.split_once("_held")?;
        let cap = match cap {
            "none" => None,
            n => Some(n.parse().ok()?),
        };
        let (held, figure) = rest.split_once('_')?;
        let figure = TunnelFigure::ALL.into_iter().find(|f| f.key() == figure)?;
        Some((
            TunnelPoint {
                cap,
                held: held.parse().ok()?,
            },
            figure,
        ))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

impl Metric {
    pub const ALL: [Metric; 40] = [
        Metric::BulkUp,
        Metric::BulkDown,
        Metric::CpuUp,
        Metric::CpuDown,
        Metric::PingP50,
        Metric::PingP99,
        Metric::PingP999,
        Metric::Churn1Rate,
        Metric::Churn1DialP50,
        Metric::Churn1DialP99,
        Metric::Churn64Rate,
        Metric::Churn64DialP50,
        Metric::Churn64DialP99,
        Metric::ChurnCpu,
        Metric::HolRatio,
        Metric::FairP99Ratio,
        Metric::FairBulkRatio,
        Metric::IdleRssServer,
        Metric::IdleRssAgent,
        Metric::IdleAnonServer,
        Metric::IdleAnonAgent,
        Metric::ConnServer,
        Metric::ConnAgent,
        Metric::ConnTotal,
        Metric::ScaleServer,
        Metric::ScaleAgents,
        Metric::ScaleTotal,
        Metric::ScaleRssAfter,
        Metric::AgentSmall,
        Metric::AgentLarge,
        Metric::AgentIdleCpu,
        Metric::AgentRssAfter,
        Metric::FanInChurnRate,
        Metric::FanInChurnDialP50,
        Metric::FanInChurnDialP99,
        Metric::FanInChurnCpu,
        Metric::FanInDialSpread,
        Metric::ConnRssAfter,
        Metric::ResumePauseP50,
        Metric::ResumePauseMax,
    ];

    /// Stable key for CSV.
    pub fn key(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Metric::BulkUp => "bulk_upload_mib_s",
            Metric::BulkDown => "bulk_download_mib_s",
            Metric::CpuUp => "cpu_upload_s_per_gib",
            Metric::CpuDown => "cpu_download_s_per_gib",
            Metric::PingP50 => "pingpong_p50_us",
            Metric::PingP99 => "pingpong_p99_us",
            Metric::PingP999 => "pingpong_p999_us",
            Metric::Churn1Rate => "churn_c1_conn_s",
            Metric::Churn1DialP50 => "churn_c1_dial_p50_us",
            Metric::Churn1DialP99 => "churn_c1_dial_p99_us",
            Metric::Churn64Rate => "churn_c64_conn_s",
            Metric::Churn64DialP50 => "churn_c64_dial_p50_us",
            Metric::Churn64DialP99 => "churn_c64_dial_p99_us",
            Metric::ChurnCpu => "churn_c64_cpu_us_per_conn",
            Metric::HolRatio => "hol_ratio",
            Metric::FairP99Ratio => "fairness_ping_p99_ratio",
            Metric::FairBulkRatio => "fairness_bulk_ratio",
            Metric::IdleRssServer => "idle_rss_server_mib",
            Metric::IdleRssAgent => "idle_rss_agent_mib",
            Metric::IdleAnonServer => "idle_anon_server_mib",
            Metric::IdleAnonAgent => "idle_anon_agent_mib",
            Metric::ConnServer => "idle_conn_server_kib",
            Metric::ConnAgent => "idle_conn_agent_kib",
            Metric::ConnTotal => "idle_conn_total_kib",
            Metric::ScaleServer => "scale_conn_server_kib",
            Metric::ScaleAgents => "scale_conn_agents_kib",
            Metric::ScaleTotal => "scale_conn_total_kib",
            Metric::ScaleRssAfter => "scale_conn_rss_after_ratio",
            Metric::AgentSmall => "fanin_small_kib_per_agent",
            Metric::AgentLarge => "fanin_large_kib_per_agent",
            Metric::AgentIdleCpu => "fanin_large_idle_cpu_ms_per_agent_min",
            Metric::AgentRssAfter => "fanin_large_rss_after_ratio",
            Metric::FanInChurnRate => "fanin_small_churn_c64_conn_s",
            Metric::FanInChurnDialP50 => "fanin_small_churn_c64_dial_p50_us",
            Metric::FanInChurnDialP99 => "fanin_small_churn_c64_dial_p99_us",
            Metric::FanInChurnCpu => "fanin_small_churn_c64_server_cpu_us_per_conn",
            Metric::FanInDialSpread => "fanin_small_churn_max_over_mean_dials",
            Metric::ConnRssAfter => "idle_conn_rss_after_ratio",
            Metric::ResumePauseP50 => "resume_pause_p50_ms",
            Metric::ResumePauseMax => "resume_pause_max_ms",
            Metric::Tunnel(point, figure) => {
                return Cow::Owned(format!("{}_{}", point.key(), figure.key()));
            }
            Metric::Fleet(mode, figure) => {
                return Cow::Owned(format!("fleet_{}_{}", mode.name(), figure.key()));
            }
        })
    }

    /// The metric of a CSV key.
    pub fn from_key(key: &str) -> Option<Metric> {
        if let Some((point, figure)) = TunnelPoint::parse(key) {
            return Some(Metric::Tunnel(point, figure));
        }
        if let Some(rest) = key.strip_prefix("fleet_") {
            let (mode, figure) = rest.split_once('_')?;
            let mode = FleetMode::ALL.into_iter().find(|m| m.name() == mode)?;
            let figure = FleetFigure::ALL.into_iter().find(|f| f.key() == figure)?;
            return Some(Metric::Fleet(mode, figure));
        }
        Metric::ALL.into_iter().find(|m| m.key() == key)
    }

    /// Heading in the report, with the profile's counts.
    pub fn title(&self, p: &Profile) -> String {
        let conns = p.idle_conns;
        let [small, large] = p.fanin;
        let (scale, agents) = (p.scale_conns, p.scale_agents);
        match self {
            Metric::BulkUp => "Bulk throughput, upload (client → target), one connection".into(),
            Metric::BulkDown => {
                "Bulk throughput, download (target → client), one connection".into()
            }
            Metric::CpuUp => "CPU of server + agent per GiB, upload".into(),
            Metric::CpuDown => "CPU of server + agent per GiB, download".into(),
            Metric::PingP50 => "64-byte ping-pong latency, p50".into(),
            Metric::PingP99 => "64-byte ping-pong latency, p99".into(),
            Metric::PingP999 => "64-byte ping-pong latency, p99.9".into(),
            Metric::Churn1Rate => {
                "Connection churn (dial + 64-byte echo + close), concurrency 1".into()
            }
            Metric::Churn1DialP50 => "Dial latency p50 during churn, concurrency 1".into(),
            Metric::Churn1DialP99 => "Dial latency p99 during churn, concurrency 1".into(),
            Metric::Churn64Rate => {
                "Connection churn (dial + 64-byte echo + close), concurrency 64".into()
            }
            Metric::Churn64DialP50 => "Dial latency p50 during churn, concurrency 64".into(),
            Metric::Churn64DialP99 => "Dial latency p99 during churn, concurrency 64".into(),
            Metric::ChurnCpu => {
                "CPU of server + agent per connection, churn at concurrency 64".into()
            }
            Metric::HolRatio => {
                "Head-of-line isolation: throughput next to a stalled connection ÷ alone".into()
            }
            Metric::FairP99Ratio => {
                "Fairness: 64-byte ping-pong p99 next to 8 bulk downloads ÷ alone".into()
            }
            Metric::FairBulkRatio => {
                "Fairness: 8 bulk downloads' aggregate with the ping-pong ÷ without".into()
            }
            Metric::IdleRssServer => "Idle RSS of the server (with one agent)".into(),
            Metric::IdleRssAgent => "Idle RSS of the agent".into(),
            Metric::IdleAnonServer => {
                "Idle anonymous (private) memory of the server: RSS less the binary's pages".into()
            }
            Metric::IdleAnonAgent => {
                "Idle anonymous (private) memory of the agent: RSS less the binary's pages".into()
            }
            Metric::ConnServer => {
                format!("Server RSS per idle tunnelled connection ({conns} open)")
            }
            Metric::ConnAgent => format!("Agent RSS per idle tunnelled connection ({conns} open)"),
            Metric::ConnTotal => {
                format!("Server + agent RSS per idle tunnelled connection ({conns} open)")
            }
            Metric::ScaleServer => {
                format!("Server RSS per idle tunnelled connection ({scale} open over {agents} agents)")
            }
            Metric::ScaleAgents => format!(
                "RSS of the {agents} agents together per idle tunnelled connection ({scale} open)"
            ),
            Metric::ScaleTotal => format!(
                "Server + agents RSS per idle tunnelled connection ({scale} open over {agents} agents)"
            ),
            Metric::ScaleRssAfter => format!(
                "Server + agents RSS after {scale} connections opened and closed ÷ before"
            ),
            Metric::AgentSmall => format!("Server RSS per connected agent ({small} agents)"),
            Metric::AgentLarge => format!("Server RSS per connected agent ({large} agents)"),
            Metric::AgentIdleCpu => {
                format!("Server CPU per idle connected agent ({large} agents connected)")
            }
            Metric::AgentRssAfter => {
                format!("Server RSS after {large} agents connected and left ÷ before they came")
            }
            Metric::FanInChurnRate => {
                format!("Connection churn at concurrency 64, dials spread over {small} agents")
            }
            Metric::FanInChurnDialP50 => {
                format!("Dial latency p50 during churn at concurrency 64 over {small} agents")
            }
            Metric::FanInChurnDialP99 => {
                format!("Dial latency p99 during churn at concurrency 64 over {small} agents")
            }
            Metric::FanInChurnCpu => {
                format!("Server CPU per connection, churn at concurrency 64 over {small} agents")
            }
            Metric::FanInDialSpread => {
                format!("Dial spread over {small} agents: the busiest agent's dials ÷ the mean")
            }
            Metric::ConnRssAfter => {
                format!("Server + agent RSS after {conns} connections opened and closed ÷ before")
            }
            Metric::ResumePauseP50 => {
                "Pause a resume costs: the 64-byte round trip across a cut of the agent's stream, p50"
                    .into()
            }
            Metric::ResumePauseMax => {
                "Pause a resume costs: the 64-byte round trip across a cut of the agent's stream, max"
                    .into()
            }
            Metric::Tunnel(point, figure) => {
                let what = match figure {
                    TunnelFigure::Rate => "short dials per second",
                    TunnelFigure::DialP50 => "dial latency p50",
                    TunnelFigure::DialP99 => "dial latency p99",
                    TunnelFigure::Cpu => "CPU of server + agent per short dial",
                    TunnelFigure::HeldFailed => "held streams that failed",
                    TunnelFigure::Errors => "failed short dials",
                    TunnelFigure::PeakStreams => "most Proxy streams the server counted",
                };
                format!(
                    "Reusable tunnel, {} held + {} dialling on one gRPC connection, stream cap {}: {what}",
                    point.held,
                    p.tunnel_concurrency,
                    point.cap.map_or("none".to_owned(), |c| c.to_string())
                )
            }
            Metric::Fleet(mode, figure) => format!(
                "Fleet of 3 servers, {} agents, {}: {}",
                p.fleet,
                mode.name(),
                figure.title()
            ),
        }
    }

    pub fn unit(&self) -> &'static str {
        match self {
            Metric::BulkUp | Metric::BulkDown => "MiB/s",
            Metric::CpuUp | Metric::CpuDown => "CPU s/GiB",
            Metric::PingP50
            | Metric::PingP99
            | Metric::PingP999
            | Metric::Churn1DialP50
            | Metric::Churn1DialP99
            | Metric::Churn64DialP50
            | Metric::Churn64DialP99
            | Metric::FanInChurnDialP50
            | Metric::FanInChurnDialP99 => "µs",
            Metric::ChurnCpu | Metric::FanInChurnCpu => "CPU µs/conn",
            Metric::Churn1Rate | Metric::Churn64Rate | Metric::FanInChurnRate => "conn/s",
            Metric::FanInDialSpread => "ratio",
            Metric::HolRatio
            | Metric::FairP99Ratio
            | Metric::FairBulkRatio
            | Metric::AgentRssAfter
            | Metric::ConnRssAfter
            | Metric::ScaleRssAfter => "ratio",
            Metric::AgentIdleCpu => "CPU ms per agent per minute",
            Metric::ResumePauseP50 | Metric::ResumePauseMax => "ms",
            Metric::Tunnel(_, figure) => match figure {
                TunnelFigure::Rate => "dials/s",
                TunnelFigure::DialP50 | TunnelFigure::DialP99 => "µs",
                TunnelFigure::Cpu => "CPU µs/dial",
                TunnelFigure::HeldFailed | TunnelFigure::Errors => "count",
                TunnelFigure::PeakStreams => "streams",
            },
            Metric::Fleet(_, figure) => match figure {
                FleetFigure::Streams | FleetFigure::StreamsPerAgent | FleetFigure::PeerRoutes => {
                    "count"
                }
                FleetFigure::ServersRss => "MiB",
                FleetFigure::KibPerAgent => "KiB",
                FleetFigure::ServerPings | FleetFigure::AgentPings | FleetFigure::Pings => {
                    "PINGs per agent per s"
                }
                FleetFigure::CpuPerAgent => "CPU ms per agent per minute",
                FleetFigure::CpuPct => "% of a core",
                FleetFigure::ConnectSecs => "s",
                FleetFigure::ConnectCpu => "CPU s",
                FleetFigure::ConnectRetries => "count",
                FleetFigure::HopDialP50 | FleetFigure::DirectDialP50 => "µs",
            },
            Metric::IdleRssServer
            | Metric::IdleRssAgent
            | Metric::IdleAnonServer
            | Metric::IdleAnonAgent => "MiB",
            Metric::ConnServer
            | Metric::ConnAgent
            | Metric::ConnTotal
            | Metric::ScaleServer
            | Metric::ScaleAgents
            | Metric::ScaleTotal
            | Metric::AgentSmall
            | Metric::AgentLarge => "KiB",
        }
    }

    pub fn better(&self) -> Better {
        match self {
            Metric::BulkUp
            | Metric::BulkDown
            | Metric::Churn1Rate
            | Metric::Churn64Rate
            | Metric::FanInChurnRate
            | Metric::HolRatio
            | Metric::FairBulkRatio
            | Metric::Tunnel(_, TunnelFigure::Rate) => Better::Higher,
            _ => Better::Lower,
        }
    }
}

/// Every sample of a benchmark, and every error seen.
#[derive(Debug, Default)]
pub struct Results {
    samples: BTreeMap<(System, Metric), Vec<(usize, f64)>>,
    /// (system, workload, message)
    pub errors: Vec<(System, String, String)>,
}

impl Results {
    pub fn add(&mut self, system: System, metric: Metric, run: usize, value: f64) {
        self.samples
            .entry((system, metric))
            .or_default()
            .push((run, value));
    }

    pub fn error(&mut self, system: System, workload: &str, message: String) {
        self.errors.push((system, workload.to_owned(), message));
    }

    pub fn values(&self, system: System, metric: Metric) -> Vec<f64> {
        self.samples
            .get(&(system, metric))
            .map(|v| v.iter().map(|&(_, x)| x).collect())
            .unwrap_or_default()
    }

    pub fn summary(&self, system: System, metric: Metric) -> Option<Summary> {
        Summary::of(&self.values(system, metric))
    }

    pub fn has(&self, metric: Metric) -> bool {
        self.samples.keys().any(|&(_, m)| m == metric)
    }

    /// The reusable-tunnel points measured on `system`, in order (cap, then held).
    pub fn tunnel_points(&self, system: System) -> Vec<TunnelPoint> {
        let mut points: Vec<TunnelPoint> = self
            .samples
            .keys()
            .filter_map(|&(s, m)| match m {
                Metric::Tunnel(point, _) if s == system => Some(point),
                _ => None,
            })
            .collect();
        points.sort();
        points.dedup();
        points
    }

    pub fn errors_of(&self, system: System) -> usize {
        self.errors.iter().filter(|(s, _, _)| *s == system).count()
    }

    /// `system,metric,run,value` lines.
    pub fn csv(&self) -> String {
        let mut out = String::from("system,metric,run,value\n");
        for ((system, metric), v) in &self.samples {
            for (run, value) in v {
                out.push_str(&format!(
                    "{},{},{},{}\n",
                    system.name(),
                    metric.key(),
                    run,
                    value
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_reads_back_as_its_metric() {
        for m in Metric::ALL {
            assert_eq!(Metric::from_key(&m.key()), Some(m), "{}", m.key());
        }
        for cap in [Some(1_000), None] {
            for figure in TunnelFigure::ALL {
                let m = Metric::Tunnel(TunnelPoint { cap, held: 900 }, figure);
                assert_eq!(Metric::from_key(&m.key()), Some(m), "{}", m.key());
            }
        }
        let m = Metric::Tunnel(
            TunnelPoint {
                cap: Some(1_000),
                held: 980,
            },
            TunnelFigure::DialP99,
        );
        assert_eq!(m.key(), "tunnel_cap1000_held980_dial_p99_us");
        assert_eq!(
            Metric::Tunnel(
                TunnelPoint { cap: None, held: 0 },
                TunnelFigure::PeakStreams
            )
            .key(),
            "tunnel_capnone_held0_peak_proxy_streams"
        );
        for mode in FleetMode::ALL {
            for figure in FleetFigure::ALL {
                let m = Metric::Fleet(mode, figure);
                assert_eq!(Metric::from_key(&m.key()), Some(m), "{}", m.key());
            }
        }
        assert_eq!(
            Metric::Fleet(FleetMode::K1, FleetFigure::KibPerAgent).key(),
            "fleet_k1_servers_kib_per_agent"
        );
        for bad in [
            "fleet_mesh_nope",
            "fleet_k2_streams",
            "tunnel_cap_held9_dials_s",
            "tunnel_capx_held9_dials_s",
            "tunnel_cap1_held9_nope",
        ] {
            assert_eq!(Metric::from_key(bad), None, "{bad}");
        }
    }
}
