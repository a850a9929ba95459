//! The command line: a benchmark run by default, and the helper commands the run starts as
//! child processes (target, relay, fleet agents) or an operator runs by hand (report,
//! dashboard).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "tether-bench",
    about = "Benchmark tether against direct TCP, two plain relays in series, upstream Konnectivity, OpenSSH forwarding and rathole, on loopback"
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Cmd>,
    /// Prove that every system and workload runs, in seconds (the numbers mean nothing).
    #[arg(long)]
    pub quick: bool,
    /// Runs per figure (default 3; 1 with --quick).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Where the report, charts and CSV go.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Only these systems (comma-separated names or ids, e.g. `direct,tether-grpc-uds`).
    /// Default: every system, but `tether-peer` (one peer hop between two tether servers)
    /// only in grpc/uds, and `tether-before` only with --before-tether-bin.
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Only these workloads: idle-rss, bulk, pingpong, churn, hol, fairness, idle-conns,
    /// scale-conns, fanin, resume, tunnel, fleet.
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Idle connections to hold open (default 10000; 200 with --quick).
    #[arg(long)]
    pub idle_conns: Option<usize>,
    /// Idle connections of the scale workload, over several agents (default 50000; 300
    /// with --quick).
    #[arg(long)]
    pub scale_conns: Option<usize>,
    /// The two fan-in sizes, small and large (default 1000,5000; 20,50 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub fanin: Vec<usize>,
    /// Fake agents of the fleet workload, on 3 peered tether servers: as a full mesh (a
    /// stream to every server, 3 per agent) and with K=1 (one stream each, round-robin)
    /// (default 10000; 60 with --quick; at least 3). The bench process holds every stream.
    #[arg(long, value_name = "AGENTS")]
    pub fleet: Option<usize>,
    /// The tunnel workload's sweep: streams held open on its one gRPC connection, one point
    /// each, while short dials run beside them (default 0,200,900,980; 0,40 with --quick).
    /// More held streams than the stream cap leave the rest waiting for a free stream until
    /// their dial deadline (10 s each).
    #[arg(long, value_delimiter = ',')]
    pub tunnel_held: Vec<usize>,
    /// Workers making short dials beside the held streams (default 64; 16 with --quick).
    #[arg(long)]
    pub tunnel_concurrency: Option<usize>,
    /// tether's --max-streams-per-frontend-connection in the tunnel workload, one instance
    /// each (default: 1000, the old default, and the built-in default, 4000; 50 with --quick). Upstream
    /// has no such flag and runs once.
    #[arg(long, value_delimiter = ',')]
    pub tunnel_stream_caps: Vec<u32>,
    /// The tether binary (default: `tether` next to this program).
    #[arg(long)]
    pub tether_bin: Option<PathBuf>,
    /// An earlier tether binary: adds the `tether-before` systems (every frontend shape), so a
    /// change is measured before and after in one run.
    #[arg(long)]
    pub before_tether_bin: Option<PathBuf>,
    /// Directory with upstream's `proxy-server` and `proxy-agent` (default: interop/bin).
    #[arg(long)]
    pub upstream_bin_dir: Option<PathBuf>,
    /// The rathole binary (default: where scripts/bench.sh installs it,
    /// `target/rathole-<version>/bin/rathole` beside this program's profile directory).
    #[arg(long)]
    pub rathole_bin: Option<PathBuf>,
    /// Keep the scratch directory (logs, configs) instead of deleting it.
    #[arg(long)]
    pub keep_work: bool,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Write the report again from a finished run's directory (its run.txt and results.csv),
    /// with this build's report code, without measuring anything.
    Report {
        /// The run's output directory.
        #[arg(default_value = "results")]
        dir: PathBuf,
    },
    /// Internal: the sink/source/echo target (prints its address, serves until killed).
    Target {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
    },
    /// Internal: one relay of the relay-limit anchors (prints its address, forwards each
    /// connection to --to until killed).
    Relay {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Where each connection goes (host:port), dialled when it arrives.
        #[arg(long)]
        to: String,
        /// Mutual TLS towards --to, as a client.
        #[arg(long, requires_all = ["ca", "cert", "key"], conflicts_with = "tls_accept")]
        tls_connect: bool,
        /// Mutual TLS from incoming connections, as a server.
        #[arg(long, requires_all = ["ca", "cert", "key"])]
        tls_accept: bool,
        /// SIGUSR1 closes every connection through the relay (a middlebox cutting flows).
        #[arg(long)]
        cut_on_sigusr1: bool,
        /// CA bundle that verifies the TLS peer.
        #[arg(long)]
        ca: Option<PathBuf>,
        /// This side's certificate (PEM).
        #[arg(long)]
        cert: Option<PathBuf>,
        /// This side's private key (PEM).
        #[arg(long)]
        key: Option<PathBuf>,
    },
    /// Internal: fake agents of the fleet workload, on the native link: connects them, prints
    /// `progress N` lines, then `connected N`, then answers each `count` line on stdin
    /// (keepalive frames, closed streams, answered dials) until stdin ends.
    FleetAgents {
        /// The fleet's agent addresses, in server order.
        #[arg(long, value_delimiter = ',', required = true)]
        servers: Vec<std::net::SocketAddr>,
        /// mesh (every agent to every server) or k1 (each to one, round-robin).
        #[arg(long)]
        mode: String,
        /// The first agent (by index in the fleet) this process holds.
        #[arg(long)]
        from: usize,
        /// One past its last.
        #[arg(long)]
        to: usize,
        /// Part of every agent's ID.
        #[arg(long)]
        run_id: String,
        /// Connects at once at most.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// CA bundle that verifies the servers.
        #[arg(long)]
        ca: PathBuf,
        /// The agents' certificate (PEM).
        #[arg(long)]
        cert: PathBuf,
        /// Its private key (PEM).
        #[arg(long)]
        key: PathBuf,
    },
    /// Draws a Grafana dashboard's panels as SVG time-series charts: each panel's own queries,
    /// read from the dashboard JSON, over a range of a Prometheus server's data
    /// (scripts/dashboard-snapshot.sh).
    Dashboard {
        /// The Grafana dashboard (JSON).
        #[arg(long)]
        dashboard: PathBuf,
        /// Prometheus's HTTP address (loopback), e.g. 127.0.0.1:9090.
        #[arg(long)]
        prometheus: std::net::SocketAddr,
        /// Start of the range, Unix seconds.
        #[arg(long)]
        start: f64,
        /// End of the range, Unix seconds.
        #[arg(long)]
        end: f64,
        /// Seconds between points.
        #[arg(long, default_value_t = 1.0)]
        step: f64,
        /// Prometheus's scrape interval in seconds (Grafana's `$__rate_interval` uses it).
        #[arg(long, default_value_t = 1.0)]
        scrape_interval: f64,
        /// A line under the title: where the data came from.
        #[arg(long, default_value = "")]
        subtitle: String,
        /// The SVG file to write.
        #[arg(long = "svg")]
        svg: PathBuf,
    },
    /// The chaos soak: peered tether servers and agents under client traffic while a seeded
    /// schedule kills, freezes, drains and cuts agents, kills and freezes servers, changes
    /// and breaks their routing file and rotates certificates; fails on any breach of its
    /// invariants (a hang, bytes lost without an error, a leak, a panic, an unexplained
    /// error). Report: OUT/soak.md, with the global --out.
    Soak {
        /// The schedule's seed (default: from the clock; the report names it for a replay).
        #[arg(long)]
        seed: Option<u64>,
        /// How long the traffic and the faults run, in seconds.
        #[arg(long, default_value_t = 120)]
        duration: u64,
        /// Tether servers, peered with each other.
        #[arg(long, default_value_t = 3)]
        servers: usize,
        /// Tether agents, each holding every server through relays of its own.
        #[arg(long, default_value_t = 10)]
        agents: usize,
        /// Clients dialing, echoing and closing in a loop.
        #[arg(long, default_value_t = 8)]
        churners: usize,
        /// Run the same schedule against upstream's proxy-server and proxy-agent (from
        /// interop/build.sh), for reference: not peered, each agent reaching the servers in
        /// turn through one address; the faults on tether's routing file and certificate
        /// reloads do not apply.
        #[arg(long)]
        upstream: bool,
        /// A mixed fleet: this many of the agents are upstream's proxy-agent, each reaching
        /// the servers in turn through one address.
        #[arg(long, default_value_t = 0, conflicts_with = "upstream")]
        upstream_agents: usize,
        /// A mixed fleet: this many of the servers (the last) are upstream's proxy-server,
        /// not peered; tether's agents reach them on gRPC.
        #[arg(long, default_value_t = 0, conflicts_with_all = ["upstream", "leases"])]
        upstream_servers: usize,
        /// Start etcd and kube-apiserver ($TETHER_K8S_BIN, or interop/k8s/build.sh); the
        /// servers publish Leases and tether's agents count them, and the schedule adds
        /// Lease expiries (a server frozen past its Lease's duration).
        #[arg(long, conflicts_with = "upstream")]
        leases: bool,
    },
}
