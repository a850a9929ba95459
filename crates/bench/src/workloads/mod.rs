//! The load generator: the same workloads, through the same [`Dialer`](crate::systems::Dialer)
//! interface, for every system.

pub mod bulk;
pub mod churn;
pub mod fairness;
pub mod fanin;
pub mod fleet;
pub mod hol;
pub mod idle;
pub mod pingpong;
pub mod resume;
pub mod tunnel;

use std::time::Duration;

/// How much of everything to do: the full benchmark, or `--quick` (proves that every system
/// and workload runs; its numbers mean nothing).
#[derive(Clone, Debug)]
pub struct Profile {
    pub runs: usize,
    /// Bytes of the warm-up transfer that also sizes the measured one.
    pub bulk_warmup: u64,
    /// Target length of a measured bulk transfer.
    pub bulk_secs: f64,
    pub ping_warmup: usize,
    pub ping_rounds: usize,
    pub ping_max_secs: f64,
    pub churn_secs: f64,
    /// Length of each half of the head-of-line measurement.
    pub hol_secs: f64,
    /// How long the stalled connection fills its buffers before measuring.
    pub hol_fill_secs: f64,
    pub idle_conns: usize,
    /// Idle connections of the scale workload, spread over `scale_agents` agents and as
    /// many targets.
    pub scale_conns: usize,
    pub scale_agents: usize,
    pub fanin: [usize; 2],
    /// How long the server's CPU is sampled with the larger fan-in connected and idle.
    pub idle_cpu_secs: f64,
    /// Wait before sampling RSS, so that start-up or connection bursts settle.
    pub settle: Duration,
    /// Wait after the last agent or connection left before sampling the RSS after load:
    /// longer than a process's allocator upkeep takes to notice (tether checks every 5 s).
    pub after_load: Duration,
    /// Concurrency for opening many connections or agents.
    pub open_concurrency: usize,
    /// Deadline of one dial.
    pub dial_timeout: Duration,
    /// Cuts of the agent's stream in the resume workload.
    pub resume_cuts: usize,
    /// Streams the reusable-tunnel workload holds open on its one gRPC connection, one sweep
    /// point each, while short dials run beside them for `churn_secs`.
    pub tunnel_held: Vec<usize>,
    /// Workers dialling beside the held streams.
    pub tunnel_concurrency: usize,
    /// tether's `--max-streams-per-frontend-connection` values: one instance each (upstream
    /// has no such flag and runs once).
    pub tunnel_caps: Vec<u32>,
    /// Fake agents of the fleet workload (3 peered servers), in each mode.
    pub fleet: usize,
    /// How long the fleet idles while its keepalive frames and CPU are counted.
    pub fleet_idle_secs: f64,
    /// Dials each way of the fleet's K=1 peer-hop check.
    pub fleet_dials: usize,
}

impl Profile {
    pub fn full() -> Self {
        Self {
            runs: 3,
            bulk_warmup: 64 << 20,
            bulk_secs: 3.0,
            ping_warmup: 500,
            ping_rounds: 20_000,
            ping_max_secs: 6.0,
            churn_secs: 3.0,
            hol_secs: 2.0,
            hol_fill_secs: 1.0,
            idle_conns: 10_000,
            scale_conns: 50_000,
            // 12,500 sockets each: below the 20,000 files a process may hold on the machines
            // this runs on, with room for the spread of random agent choice.
            scale_agents: 4,
            fanin: [1_000, 5_000],
            idle_cpu_secs: 20.0,
            settle: Duration::from_millis(2_000),
            after_load: Duration::from_secs(10),
            open_concurrency: 64,
            dial_timeout: Duration::from_secs(10),
            resume_cuts: 20,
            // With 64 dialling: 64, 264 and 964 streams (under the old default cap), and 1,044
            // (over it: 20 free slots for 64 workers).
            tunnel_held: vec![0, 200, 900, 980],
            tunnel_concurrency: 64,
            // The default before the tunnel was measured (1,000, where dials queued), and the
            // default chosen from that measurement.
            tunnel_caps: vec![1_000, tether_grpc::DEFAULT_FRONTEND_STREAMS],
            fleet: 10_000,
            // Four keepalive intervals of 5 s.
            fleet_idle_secs: 20.0,
            fleet_dials: 50,
        }
    }

    pub fn quick() -> Self {
        Self {
            runs: 1,
            bulk_warmup: 4 << 20,
            bulk_secs: 0.2,
            ping_warmup: 20,
            ping_rounds: 200,
            ping_max_secs: 1.0,
            churn_secs: 0.3,
            hol_secs: 0.3,
            hol_fill_secs: 0.2,
            idle_conns: 200,
            scale_conns: 300,
            scale_agents: 2,
            fanin: [20, 50],
            idle_cpu_secs: 0.5,
            settle: Duration::from_millis(200),
            after_load: Duration::from_millis(400),
            open_concurrency: 16,
            dial_timeout: Duration::from_secs(10),
            resume_cuts: 3,
            // A small cap so that the quick run crosses it too: 16 and 56 streams against 50.
            tunnel_held: vec![0, 40],
            tunnel_concurrency: 16,
            tunnel_caps: vec![50],
            fleet: 60,
            // One keepalive interval (5 s) and a little: every stream PINGs once each way.
            fleet_idle_secs: 5.5,
            fleet_dials: 5,
        }
    }
}

/// Workloads run on one started instance of a system, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    IdleRss,
    Bulk,
    PingPong,
    Churn,
    Hol,
    /// A ping-pong next to 8 bulk downloads on one agent.
    Fairness,
    /// Many idle tunnelled connections (own instance).
    IdleConns,
    /// Even more idle tunnelled connections, over several agents (own instance).
    ScaleConns,
    /// Many fake agents on one server (own instance).
    FanIn,
    /// A ping-pong across cuts of the agent's stream (own instance, tether only).
    Resume,
    /// One gRPC connection holding many streams while short dials run beside them (own
    /// instance per stream cap, gRPC over UDS only).
    Tunnel,
    /// Fake agents on 3 peered tether servers, a full mesh against K=1 (own servers per
    /// mode).
    Fleet,
}

impl Workload {
    /// The workloads a run measures on one started instance of a system, in turn.
    pub const PER_INSTANCE: [Workload; 6] = [
        Workload::IdleRss,
        Workload::Bulk,
        Workload::PingPong,
        Workload::Churn,
        Workload::Hol,
        Workload::Fairness,
    ];

    pub const ALL: [Workload; 12] = [
        Workload::IdleRss,
        Workload::Bulk,
        Workload::PingPong,
        Workload::Churn,
        Workload::Hol,
        Workload::Fairness,
        Workload::IdleConns,
        Workload::ScaleConns,
        Workload::FanIn,
        Workload::Resume,
        Workload::Tunnel,
        Workload::Fleet,
    ];

    pub fn name(&self) -> &'static str {
        match self {
            Workload::IdleRss => "idle-rss",
            Workload::Bulk => "bulk",
            Workload::PingPong => "pingpong",
            Workload::Churn => "churn",
            Workload::Hol => "hol",
            Workload::Fairness => "fairness",
            Workload::IdleConns => "idle-conns",
            Workload::ScaleConns => "scale-conns",
            Workload::FanIn => "fanin",
            Workload::Resume => "resume",
            Workload::Tunnel => "tunnel",
            Workload::Fleet => "fleet",
        }
    }

    pub fn parse(s: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == s)
    }

    /// Estimated seconds per system and run, for the progress estimate.
    pub fn weight(&self, p: &Profile) -> f64 {
        let settle = p.settle.as_secs_f64();
        match self {
            Workload::IdleRss => settle + 1.5,
            Workload::Bulk => 2.0 * (p.bulk_secs + 0.5),
            Workload::PingPong => p.ping_max_secs.min(3.0),
            Workload::Churn => 2.0 * p.churn_secs,
            Workload::Hol => 2.0 * p.hol_secs + p.hol_fill_secs,
            Workload::Fairness => 6.0 * p.hol_secs + 1.0,
            Workload::IdleConns => {
                p.idle_conns as f64 / 600.0 + 2.0 * settle + p.after_load.as_secs_f64() + 2.0
            }
            Workload::ScaleConns => {
                p.scale_conns as f64 / 600.0 + 2.0 * settle + p.after_load.as_secs_f64() + 4.0
            }
            Workload::FanIn => {
                (p.fanin[0] + p.fanin[1]) as f64 / 800.0
                    + 8.0 * settle
                    + p.idle_cpu_secs
                    + p.churn_secs
                    + 3.0
            }
            Workload::Resume => 2.0 + p.resume_cuts as f64 * 0.1,
            Workload::Tunnel => p
                .tunnel_held
                .iter()
                .map(|&h| h as f64 / 600.0 + p.settle.as_secs_f64() + p.churn_secs + 1.0)
                .sum(),
            Workload::Fleet => FleetMode::ALL
                .iter()
                .map(|&mode| Self::fleet_weight(p, mode))
                .sum(),
        }
    }

    /// Estimated seconds of one mode of the fleet workload.
    pub fn fleet_weight(p: &Profile, mode: FleetMode) -> f64 {
        let streams = match mode {
            FleetMode::Mesh => FLEET_SERVERS * p.fleet,
            FleetMode::K1 => p.fleet,
        };
        2.0 + streams as f64 / 400.0
            + 2.0 * p.settle.as_secs_f64()
            + p.fleet_idle_secs
            + match mode {
                FleetMode::K1 => p.fleet_dials as f64 * 0.01,
                FleetMode::Mesh => 0.0,
            }
    }
}

/// Servers in the fleet workload's fleet (here, beside [`FleetMode`], so that the weights
/// above need nothing of the workload's module).
pub const FLEET_SERVERS: usize = 3;

/// How the fleet workload's agents hold the servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FleetMode {
    /// Every agent holds a stream to every server.
    Mesh,
    /// Every agent holds one stream, to one server (round-robin); the servers peer.
    K1,
}

impl FleetMode {
    pub const ALL: [FleetMode; 2] = [FleetMode::Mesh, FleetMode::K1];

    pub fn name(&self) -> &'static str {
        match self {
            FleetMode::Mesh => "mesh",
            FleetMode::K1 => "k1",
        }
    }
}
