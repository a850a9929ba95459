//! A fleet of tether servers peered with each other, and fake agents (the fan-in's, on the
//! native link) holding streams to them in one of two ways ([`FleetMode`]): every agent to
//! every server (a full mesh, what agents do without server peering), or each agent to one
//! server, round-robin by its index (K=1, which peering allows: the servers announce their
//! agents to each other and forward dials). Once every agent is connected and every server
//! has heard of every other's agents, the fleet idles: the figures are the streams, the
//! servers' RSS and CPU, and the keepalive frames, counted on the fake agents' streams.
//! Each fake agent PINGs its servers as a tether agent does by default (every 5 s, given
//! up after 10 s), and each server PINGs each stream (`--agent-ping-interval`, 5 s).
//!
//! In K=1 a dial through server 1 to an agent only server 3 holds (it advertises an address
//! of its own, routed by the servers' `destHost` strategy) checks the peer hop, its dial
//! latency beside the same dial through server 3.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

use anyhow::{Context as _, bail};
use tether_grpc::Keepalive;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::Semaphore;

use super::fanin::{FakeAgent, Link, Options, PingCount, Pings};
use super::{FleetMode, Profile};
use crate::procs::Proc;
use crate::progress::{Progress, Ticker};
use crate::stats::{quantile, sorted};
use crate::systems::{Env, Fleet, Setup};

pub use super::FLEET_SERVERS as SERVERS;

/// A tether agent's keepalive towards tether servers by default (`--server-ping-interval`,
/// `--server-ping-timeout`).
const AGENT_KEEPALIVE: Keepalive = Keepalive {
    interval: Duration::from_secs(5),
    timeout: Duration::from_secs(10),
};

/// The agent that advertises [`PROBE_ADDRESS`]: index 2, which K=1 puts on server 3 alone.
const PROBE: usize = 2;
/// The address the probe agent advertises (`ipv4=`); a fake agent echoes whatever it is
/// dialed for, so nothing listens there.
const PROBE_ADDRESS: &str = "127.0.1.1";

/// Times a fake agent's stream tries to connect again after a failure, 1 s apart (a tether
/// agent retries too); the retries are counted.
const CONNECT_RETRIES: u32 = 2;

/// How long the servers may take to count every agent and hear of every peer's.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);

impl FleetMode {
    /// The servers (0-based) agent `agent` holds a stream to.
    pub fn servers_of(self, agent: usize) -> std::ops::Range<usize> {
        match self {
            FleetMode::Mesh => 0..SERVERS,
            FleetMode::K1 => {
                let one = agent % SERVERS;
                one..one + 1
            }
        }
    }
}

/// The K=1 sanity check: dials through server 1 to the probe agent, which only server 3
/// holds, and the same dials through server 3.
#[derive(Clone, Debug)]
pub struct DialCheck {
    /// Dials each way (each answered by the probe agent, checked).
    pub dials: usize,
    /// Dial latency (until the agent's answer), p50, in µs: through server 1, over the peer
    /// link.
    pub hop_p50_us: f64,
    /// Through server 3, which holds the agent.
    pub direct_p50_us: f64,
}

#[derive(Clone, Debug)]
pub struct FleetResult {
    pub agents: usize,
    /// Agent streams the servers count together.
    pub streams: f64,
    /// Agents the servers heard of from their peers, added up over the servers.
    pub remote_routes: f64,
    /// The servers' RSS together, before any agent came and with every agent connected.
    pub rss_before: u64,
    pub rss_after: u64,
    /// From the first agent's connect until the servers counted every agent and route, and
    /// the servers' CPU seconds in that time.
    pub connect_secs: f64,
    pub connect_cpu_secs: f64,
    /// Connects that failed and were tried again.
    pub retries: u64,
    /// The idle window, and the keepalive frames and servers' CPU in it.
    pub idle_secs: f64,
    pub pings: Pings,
    pub cpu_secs: f64,
    pub dial: Option<DialCheck>,
}

impl FleetResult {
    fn per_agent(&self, x: f64) -> f64 {
        x / self.agents as f64
    }

    pub fn streams_per_agent(&self) -> f64 {
        self.per_agent(self.streams)
    }

    pub fn rss_mib(&self) -> f64 {
        self.rss_after as f64 / (1 << 20) as f64
    }

    pub fn kib_per_agent(&self) -> f64 {
        self.per_agent((self.rss_after as f64 - self.rss_before as f64) / 1024.0)
    }

    /// PINGs the servers sent per agent per second.
    pub fn server_pings(&self) -> f64 {
        self.per_agent(self.pings.from_servers as f64) / self.idle_secs
    }

    /// PINGs the agents sent per agent per second.
    pub fn agent_pings(&self) -> f64 {
        self.per_agent(self.pings.from_agents as f64) / self.idle_secs
    }

    /// The servers' CPU per agent per minute of idling, in ms.
    pub fn cpu_ms_per_agent_min(&self) -> f64 {
        self.per_agent(self.cpu_secs * 1000.0) * 60.0 / self.idle_secs
    }

    /// The servers' CPU while idling, in % of one core.
    pub fn cpu_pct(&self) -> f64 {
        100.0 * self.cpu_secs / self.idle_secs
    }

    /// One line for the progress log.
    pub fn line(&self, mode: FleetMode) -> String {
        let dial = self.dial.as_ref().map_or(String::new(), |d| {
            format!(
                "; dial through server 1 to an agent on server 3 p50 {:.0} µs, through server 3 {:.0} µs ({} each)",
                d.hop_p50_us, d.direct_p50_us, d.dials
            )
        });
        format!(
            "{}: {} agents, {:.0} streams ({:.2} per agent), {:.0} peer routes, connected in {:.1} s (servers' CPU {:.1} s, {} connects retried); servers {:.1} MiB, +{:.1} KiB per agent; PINGs per agent per s: servers {:.3}, agents {:.3} (PONGs {} and {}); servers' CPU {:.2}% of a core, {:.3} ms per agent per minute{dial}",
            mode.name(),
            self.agents,
            self.streams,
            self.streams_per_agent(),
            self.remote_routes,
            self.connect_secs,
            self.connect_cpu_secs,
            self.retries,
            self.rss_mib(),
            self.kib_per_agent(),
            self.server_pings(),
            self.agent_pings(),
            self.pings.pongs_from_agents,
            self.pings.pongs_from_servers,
            self.cpu_pct(),
            self.cpu_ms_per_agent_min(),
        )
    }
}

/// Streams one agents process holds at most: each is a socket, and a process may hold
/// 20,000 files on the machines this runs on (a mesh of 10,000 agents has 30,000 streams).
pub const STREAMS_PER_PROCESS: usize = 12_000;

/// The agents processes of a fleet of `agents`: enough for the full mesh's streams, the
/// same number in both modes.
pub fn agent_processes(agents: usize) -> usize {
    (SERVERS * agents).div_ceil(STREAMS_PER_PROCESS).max(1)
}

/// The agents (by index) of agents process `n` of `of`: contiguous ranges, as even as can be.
fn share(agents: usize, n: usize, of: usize) -> std::ops::Range<usize> {
    agents * n / of..agents * (n + 1) / of
}

/// Starts a fleet of [`SERVERS`], connects `agents` fake agents in `mode` (in
/// [`agent_processes`] processes of `tether-bench fleet-agents`), measures it idle (and in
/// K=1 the peer hop), and stops everything.
pub async fn run(
    env: &Env,
    p: &Profile,
    mode: FleetMode,
    agents: usize,
    progress: &Progress,
) -> anyhow::Result<FleetResult> {
    anyhow::ensure!(agents >= SERVERS, "a fleet needs at least {SERVERS} agents");
    let mut fleet = Fleet::start(env, &Setup::grpc(env, SERVERS)).await?;
    let mut procs = Vec::new();
    let measured = measure(&mut fleet, &mut procs, env, p, mode, agents, progress).await;
    for a in procs {
        a.proc.stop().await;
    }
    fleet.stop().await;
    measured
}

async fn measure(
    fleet: &mut Fleet,
    procs: &mut Vec<AgentsProc>,
    env: &Env,
    p: &Profile,
    mode: FleetMode,
    agents: usize,
    progress: &Progress,
) -> anyhow::Result<FleetResult> {
    tokio::time::sleep(p.settle).await;
    let rss_before = fleet.rss();
    let streams: usize = (0..agents).map(|a| mode.servers_of(a).len()).sum();
    let mut local = [0usize; SERVERS];
    for a in 0..agents {
        for s in mode.servers_of(a) {
            local[s] += 1;
        }
    }

    let (started, cpu_before) = (Instant::now(), fleet.cpu_seconds());
    let of = agent_processes(agents);
    let servers: Vec<String> = fleet.members.iter().map(|m| m.agents.to_string()).collect();
    let run_id = uuid::Uuid::new_v4().to_string();
    let dir = fleet.dir.clone();
    let opened = Arc::new(AtomicUsize::new(0));
    let mut connecting = tokio::task::JoinSet::new();
    for n in 0..of {
        let range = share(agents, n, of);
        let pki = &env.pki;
        let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
        cmd.arg("fleet-agents")
            .arg(format!("--servers={}", servers.join(",")))
            .arg(format!("--mode={}", mode.name()))
            .arg(format!("--from={}", range.start))
            .arg(format!("--to={}", range.end))
            .arg(format!("--run-id={run_id}"))
            .arg(format!("--concurrency={}", p.open_concurrency.div_ceil(of)))
            .arg("--ca")
            .arg(&pki.ca_cert)
            .arg("--cert")
            .arg(&pki.agent_cert)
            .arg("--key")
            .arg(&pki.agent_key);
        let role = format!("fleet agents {}", n + 1);
        let log = dir.join(format!("agents-{}.log", n + 1));
        let (proc, stdin, stdout) = Proc::spawn_talking(&role, cmd, &log)?;
        let mut a = AgentsProc {
            proc,
            stdin,
            lines: BufReader::new(stdout).lines(),
        };
        let opened = opened.clone();
        connecting.spawn(async move {
            let mut mine = 0;
            loop {
                let line = a.line().await?;
                let (what, n) = line.split_once(' ').unwrap_or((&line, ""));
                let n: usize = n
                    .parse()
                    .with_context(|| format!("{}: {line:?}", a.proc.role))?;
                opened.fetch_add(n - mine, Ordering::Relaxed);
                mine = n;
                match what {
                    "progress" => {}
                    "connected" => return anyhow::Ok(a),
                    _ => bail!("{}: {line:?}", a.proc.role),
                }
            }
        });
    }
    let mut ticker = Ticker::new(Duration::from_secs(5));
    loop {
        let joined = tokio::select! {
            joined = connecting.join_next() => joined,
            () = tokio::time::sleep(Duration::from_secs(1)) => {
                if ticker.due() {
                    progress.note(&format!(
                        "{} of {streams} streams open",
                        opened.load(Ordering::Relaxed)
                    ));
                }
                continue;
            }
        };
        match joined {
            Some(a) => procs.push(a??),
            None => break,
        }
    }
    // Every server holds its agents and has heard of every other agent from its peers.
    let counts = fleet
        .wait_until(
            SETTLE_TIMEOUT,
            "every agent and every peer's announcement",
            |n, c| {
                let held = local[n] as f64;
                let remote = (local.iter().sum::<usize>() - local[n]) as f64;
                c.streams == held && c.agents == held && c.remote == remote
            },
        )
        .await?;
    let connect_secs = started.elapsed().as_secs_f64();
    let connect_cpu_secs = fleet.cpu_seconds() - cpu_before;
    tokio::time::sleep(p.settle).await;
    let rss_after = fleet.rss();
    still_connected(procs, "once all had connected").await?;

    progress.note(&format!(
        "{}: {streams} streams open in {connect_secs:.1} s; idling for {} s",
        mode.name(),
        p.fleet_idle_secs
    ));
    let (cpu0, idle0) = (fleet.cpu_seconds(), Instant::now());
    let counted = AgentCounts::of(procs).await?;
    let pings0 = counted.pings;
    tokio::time::sleep(Duration::from_secs_f64(p.fleet_idle_secs)).await;
    let pings1 = AgentCounts::of(procs).await?.pings;
    let (cpu1, idle_secs) = (fleet.cpu_seconds(), idle0.elapsed().as_secs_f64());
    still_connected(procs, "while the fleet idled").await?;
    fleet.check_alive()?;

    let dial = match mode {
        FleetMode::K1 => Some(dial_check(fleet, procs, p).await?),
        FleetMode::Mesh => None,
    };
    Ok(FleetResult {
        agents,
        streams: counts.iter().map(|c| c.streams).sum(),
        remote_routes: counts.iter().map(|c| c.remote).sum(),
        rss_before,
        rss_after,
        connect_secs,
        connect_cpu_secs,
        retries: counted.retries,
        idle_secs,
        pings: pings1 - pings0,
        cpu_secs: cpu1 - cpu0,
        dial,
    })
}

/// One `tether-bench fleet-agents` process and its pipes.
struct AgentsProc {
    proc: Proc,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl AgentsProc {
    /// Its next line on stdout; an error with its log's tail if it ended.
    async fn line(&mut self) -> anyhow::Result<String> {
        let line = tokio::time::timeout(Duration::from_secs(300), self.lines.next_line())
            .await
            .with_context(|| format!("{} said nothing for 300 s", self.proc.role))??;
        match line {
            Some(line) => Ok(line),
            None => bail!(
                "{} ended; log tail:\n{}",
                self.proc.role,
                crate::procs::log_tail(&self.proc.log)
            ),
        }
    }

    async fn counts(&mut self) -> anyhow::Result<AgentCounts> {
        self.stdin.write_all(b"count\n").await?;
        self.stdin.flush().await?;
        let line = self.line().await?;
        AgentCounts::parse(&line).with_context(|| format!("{}: {line:?}", self.proc.role))
    }
}

/// What the fake agents of one process, or of all, counted so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct AgentCounts {
    pings: Pings,
    /// Streams the servers closed.
    gone: u64,
    /// Dials answered, by every agent and by the probe agent.
    dials: u64,
    probe_dials: u64,
    /// Connects that failed and were tried again.
    retries: u64,
}

impl AgentCounts {
    /// Every process's counts added up.
    async fn of(procs: &mut [AgentsProc]) -> anyhow::Result<AgentCounts> {
        let mut sum = [0u64; 8];
        for a in procs {
            for (total, n) in sum.iter_mut().zip(a.counts().await?.fields()) {
                *total += n;
            }
        }
        Ok(Self::from_fields(sum))
    }

    /// The counts in the order a `count` line carries them.
    fn fields(&self) -> [u64; 8] {
        let p = &self.pings;
        [
            p.from_servers,
            p.from_agents,
            p.pongs_from_servers,
            p.pongs_from_agents,
            self.gone,
            self.dials,
            self.probe_dials,
            self.retries,
        ]
    }

    fn from_fields(fields: [u64; 8]) -> Self {
        let [
            from_servers,
            from_agents,
            pongs_from_servers,
            pongs_from_agents,
            gone,
            dials,
            probe_dials,
            retries,
        ] = fields;
        AgentCounts {
            pings: Pings {
                from_servers,
                from_agents,
                pongs_from_servers,
                pongs_from_agents,
            },
            gone,
            dials,
            probe_dials,
            retries,
        }
    }

    fn line(&self) -> String {
        let fields: Vec<String> = self.fields().iter().map(u64::to_string).collect();
        format!("count {}", fields.join(" "))
    }

    fn parse(line: &str) -> anyhow::Result<AgentCounts> {
        let rest = line.strip_prefix("count ").context("not a count")?;
        let v = rest
            .split(' ')
            .map(str::parse)
            .collect::<Result<Vec<u64>, _>>()?;
        let fields: [u64; 8] = v[..].try_into().context("8 counts expected")?;
        Ok(Self::from_fields(fields))
    }
}

/// Fails if a server closed any fake agent's stream.
async fn still_connected(procs: &mut [AgentsProc], when: &str) -> anyhow::Result<()> {
    let gone = AgentCounts::of(procs).await?.gone;
    if gone > 0 {
        bail!("{gone} fake agent streams were closed {when}");
    }
    Ok(())
}

/// Dials the probe agent, which only the last server holds, through the first server (a
/// peer hop) and through the last, `p.fleet_dials` times each after one warm-up each,
/// alternating; every dial must reach the probe agent and no other.
async fn dial_check(
    fleet: &Fleet,
    procs: &mut [AgentsProc],
    p: &Profile,
) -> anyhow::Result<DialCheck> {
    let last = SERVERS - 1;
    anyhow::ensure!(
        FleetMode::K1.servers_of(PROBE).eq([last]),
        "the probe agent is not on server {} alone",
        last + 1
    );
    let before = AgentCounts::of(procs).await?;
    let target = format!("{PROBE_ADDRESS}:7");
    let hop = fleet.dialer(0, &target).await?;
    let direct = fleet.dialer(last, &target).await?;
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..=p.fleet_dials {
        for (dialer, times) in [&hop, &direct].into_iter().zip(&mut times) {
            let t = Instant::now();
            let mut s = dialer
                .dial_timeout(p.dial_timeout)
                .await
                .context("a dial to the probe agent")?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            crate::target::echo_start(&mut s, b"fleet?").await?;
            if round > 0 {
                times.push(us);
            }
        }
    }
    let after = AgentCounts::of(procs).await?;
    let made = 2 * (p.fleet_dials as u64 + 1);
    let (all, at_probe) = (
        after.dials - before.dials,
        after.probe_dials - before.probe_dials,
    );
    anyhow::ensure!(
        all == made && at_probe == made,
        "{made} dials to the probe's address: the probe agent answered {at_probe}, every agent {all}"
    );
    let [hop_us, direct_us] = times;
    let p50 = |mut v: Vec<f64>| quantile(sorted(&mut v), 0.5);
    Ok(DialCheck {
        dials: p.fleet_dials,
        hop_p50_us: p50(hop_us),
        direct_p50_us: p50(direct_us),
    })
}

/// What `tether-bench fleet-agents` is asked to hold.
#[derive(Clone, Debug)]
pub struct AgentsSpec {
    /// The servers' agent addresses, in order.
    pub servers: Vec<SocketAddr>,
    pub mode: FleetMode,
    /// The agents (by index in the fleet) this process holds.
    pub agents: std::ops::Range<usize>,
    /// Part of every agent ID, the same in every process of the run.
    pub run_id: String,
    /// Connects at once at most.
    pub concurrency: usize,
    pub tls: Arc<rustls::ClientConfig>,
}

/// `tether-bench fleet-agents`: connects the agents of `spec` (a failed connect is tried
/// again, [`CONNECT_RETRIES`] times at most), each stream of each PINGing its server and
/// counting keepalive frames, and prints `progress N` every 2 s (streams open), then
/// `connected N`. Then, for each `count` line on stdin, prints its
/// [`AgentCounts`] line; ends when stdin does.
pub async fn serve_agents(spec: AgentsSpec) -> anyhow::Result<()> {
    let count = Arc::new(PingCount::default());
    let streams: usize = spec
        .agents
        .clone()
        .map(|a| spec.mode.servers_of(a).len())
        .sum();
    let gate = Arc::new(Semaphore::new(spec.concurrency.max(1)));
    let opened = Arc::new(AtomicUsize::new(0));
    let reporting = {
        let opened = opened.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                println!("progress {}", opened.load(Ordering::Relaxed));
            }
        })
    };
    let retries = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for agent in spec.agents.clone() {
        let id = format!("fleet-{agent}-{}", spec.run_id);
        let options = Options {
            keepalive: Some(AGENT_KEEPALIVE),
            pings: Some(count.clone()),
            identifiers: (agent == PROBE).then(|| format!("ipv4={PROBE_ADDRESS}")),
        };
        for server in spec.mode.servers_of(agent) {
            let permit = gate.clone().acquire_owned().await?;
            let (tls, id, options) = (spec.tls.clone(), id.clone(), options.clone());
            let address = *spec.servers.get(server).context("too few servers")?;
            let (opened, retries) = (opened.clone(), retries.clone());
            tasks.spawn(async move {
                let mut tried = 0;
                let fake = loop {
                    let attempt = tokio::time::timeout(
                        Duration::from_secs(30),
                        FakeAgent::connect_with(
                            Link::Native,
                            address,
                            tls.clone(),
                            id.clone(),
                            &options,
                        ),
                    )
                    .await
                    .map_err(|_| anyhow::anyhow!("connect timed out"))
                    .and_then(|x| x);
                    match attempt {
                        Err(_) if tried < CONNECT_RETRIES => {
                            tried += 1;
                            retries.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        attempt => {
                            break attempt.with_context(|| {
                                format!(
                                    "agent {agent} to server {}, attempt {}",
                                    server + 1,
                                    tried + 1
                                )
                            });
                        }
                    }
                };
                drop(permit);
                if fake.is_ok() {
                    opened.fetch_add(1, Ordering::Relaxed);
                }
                fake.map(|fake| (agent, fake))
            });
        }
    }
    let mut held = Vec::with_capacity(streams);
    let (mut errors, mut first_error) = (0usize, None);
    while let Some(joined) = tasks.join_next().await {
        match joined? {
            Ok(h) => held.push(h),
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    reporting.abort();
    if let Some(e) = first_error {
        bail!("{errors} of {streams} fake agent streams failed; first: {e:#}");
    }
    println!("connected {}", held.len());
    let mut requests = BufReader::new(tokio::io::stdin()).lines();
    while let Some(request) = requests.next_line().await? {
        match request.trim() {
            "count" => {
                let dials = |probe: bool| {
                    held.iter()
                        .filter(|(a, _)| !probe || *a == PROBE)
                        .map(|(_, f)| f.dials())
                        .sum()
                };
                let counts = AgentCounts {
                    pings: count.now(),
                    gone: held.iter().filter(|(_, f)| f.is_gone()).count() as u64,
                    dials: dials(false),
                    probe_dials: dials(true),
                    retries: retries.load(Ordering::Relaxed),
                };
                println!("{}", counts.line());
            }
            other => bail!("unknown request {other:?}"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k1_spreads_agents_round_robin_and_the_probe_lands_on_the_last_server() {
        let mut per_server = [0; SERVERS];
        for a in 0..300 {
            let servers: Vec<usize> = FleetMode::K1.servers_of(a).collect();
            assert_eq!(servers.len(), 1);
            per_server[servers[0]] += 1;
        }
        assert_eq!(per_server, [100, 100, 100]);
        assert_eq!(
            FleetMode::K1.servers_of(PROBE).collect::<Vec<_>>(),
            [SERVERS - 1]
        );
        assert_eq!(FleetMode::Mesh.servers_of(7).collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn agents_processes_hold_at_most_their_share_of_streams() {
        assert_eq!(agent_processes(60), 1);
        assert_eq!(agent_processes(4_000), 1);
        assert_eq!(agent_processes(10_000), 3);
        for agents in [3, 60, 4_001, 10_000, 33_333] {
            let of = agent_processes(agents);
            let mut next = 0;
            for n in 0..of {
                let range = share(agents, n, of);
                assert_eq!(range.start, next, "contiguous");
                assert!(
                    SERVERS * range.len() <= STREAMS_PER_PROCESS,
                    "{agents}: {range:?}"
                );
                next = range.end;
            }
            assert_eq!(next, agents, "every agent");
        }
    }

    #[test]
    fn counts_read_back_from_their_line() {
        let c = AgentCounts {
            pings: Pings {
                from_servers: 1,
                from_agents: 2,
                pongs_from_servers: 3,
                pongs_from_agents: 4,
            },
            gone: 5,
            dials: 6,
            probe_dials: 7,
            retries: 8,
        };
        assert_eq!(c.line(), "count 1 2 3 4 5 6 7 8");
        assert_eq!(AgentCounts::parse(&c.line()).unwrap(), c);
        assert!(AgentCounts::parse("count 1 2").is_err());
        assert!(AgentCounts::parse("progress 9").is_err());
    }
}
