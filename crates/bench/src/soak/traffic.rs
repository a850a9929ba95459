//! The soak's clients and their ledger. Dial churn (dial, echo, close), long-lived streams
//! checked byte for byte, bulk transfers and stalled readers run through every server's
//! frontend (gRPC or HTTP CONNECT) while the faults land. Every operation ends with success
//! or an explicit error within its deadline; a hang, a clean end of stream before the bytes
//! owed, a wrong byte, or an error that only a bug explains is a breach of the invariants.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use tether_client::{GrpcClient, Transport};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::systems::{Dialer, Frontend, Member};
use crate::target::{BoxStream, ECHO};

/// The deadline of every client operation: a dial, or one echo round.
pub const OP_DEADLINE: Duration = Duration::from_secs(30);
/// Breaches the ledger lists; beyond them it only counts (a server that ends every stream
/// early would otherwise add one line per operation).
const LISTED_BREACHES: usize = 100;
/// Errors that are explicit but still breaches: a peer broke the protocol, which no fault
/// explains and only a bug does.
const BUG_ERRORS: [&str; 1] = ["protocol violation"];
/// A long-lived stream's pause between rounds.
const STREAM_PERIOD: Duration = Duration::from_millis(100);
/// A bulk transfer's bytes, each way.
const BULK_BYTES: u64 = 1 << 20;
/// What a stalled reader sends before it reads, and how long it does not read.
const STALLED_BYTES: u64 = 256 << 10;
const STALL: Duration = Duration::from_secs(3);
/// Bulk, stalled-reader and reverse-dial clients, each.
const BULK_CLIENTS: usize = 2;
const STALLED_CLIENTS: usize = 2;
const REVERSE_CLIENTS: usize = 2;

/// How the clients reach one server's frontend. A gRPC connection that ended (the server
/// was killed) is made again by the next dial.
#[derive(Debug)]
pub struct Entry {
    /// Which server, and its frontend: for breaches, which say where they happened.
    label: String,
    /// An upstream server in a fleet with tether's: its breaches are upstream's.
    upstream_in_mix: bool,
    frontend: Frontend,
    transport: Transport,
    target: String,
    grpc: tokio::sync::Mutex<Option<GrpcClient>>,
}

impl Entry {
    /// The entry to server `n`, `member`, of a fleet that is `all_upstream` or not.
    pub fn new(member: &Member, n: usize, all_upstream: bool, target: &str) -> Entry {
        let which = if member.upstream {
            "upstream"
        } else {
            "tether"
        };
        Entry {
            label: format!("{which} server {}, {}", n + 1, member.frontend.name()),
            upstream_in_mix: member.upstream && !all_upstream,
            frontend: member.frontend,
            transport: member.transport().clone(),
            target: target.to_owned(),
            grpc: tokio::sync::Mutex::default(),
        }
    }

    async fn dial(&self) -> anyhow::Result<BoxStream> {
        let transport = self.transport.clone();
        let dialer = if self.frontend.is_grpc() {
            let mut held = self.grpc.lock().await;
            let client = match held.as_ref() {
                Some(client) if !client.is_closed() => client.clone(),
                _ => {
                    let connect = GrpcClient::connect(&transport);
                    let client = tokio::time::timeout(Duration::from_secs(10), connect)
                        .await
                        .context("gRPC frontend connect timed out")??;
                    held.insert(client).clone()
                }
            };
            Dialer::Grpc(client, self.target.clone())
        } else {
            Dialer::HttpConnect(transport, self.target.clone())
        };
        dialer.dial().await
    }
}

/// What the clients did, and every breach of an invariant.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Operations that succeeded: churn dials carried to the end, long-lived rounds.
    pub ok: u64,
    /// Explicit errors, by what they said.
    pub errors: BTreeMap<String, Errors>,
    /// The longest an operation took to end with an error.
    pub worst_error: Duration,
    /// Breaches: hangs, clean ends of cut-short data, wrong bytes; the first
    /// [`LISTED_BREACHES`] of them.
    pub breaches: Vec<String>,
    /// Breaches beyond those listed.
    pub unlisted_breaches: u64,
    /// In a mixed fleet, breaches through upstream's servers: upstream's, so reported but
    /// not held against the run; the first [`LISTED_BREACHES`] of them, and how many.
    pub upstream_breaches: Vec<String>,
    pub upstream_breach_count: u64,
}

/// Errors of one kind: how many, and when the first and the last ended, after the run's
/// start (to hold beside the faults' times).
#[derive(Clone, Copy, Debug)]
pub struct Errors {
    pub count: u64,
    pub first: Duration,
    pub last: Duration,
}

impl Ledger {
    pub fn operations(&self) -> u64 {
        self.ok + self.errors.values().map(|e| e.count).sum::<u64>()
    }
}

/// The ledger the client tasks share, and when the run started.
#[derive(Clone, Debug)]
pub struct Shared {
    ledger: Arc<Mutex<Ledger>>,
    run_started: Instant,
}

impl Shared {
    pub fn new(run_started: Instant) -> Shared {
        Shared {
            ledger: Arc::default(),
            run_started,
        }
    }

    /// The ledger, taken out.
    pub fn take(&self) -> Ledger {
        std::mem::take(&mut *self.ledger.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

fn record(shared: &Shared, started: Instant, outcome: Result<(), Failure>) {
    let mut ledger = shared.ledger.lock().unwrap_or_else(|e| e.into_inner());
    match outcome {
        Ok(()) => ledger.ok += 1,
        Err(Failure::Error(what)) => {
            let now = shared.run_started.elapsed();
            let errors = ledger.errors.entry(what).or_insert(Errors {
                count: 0,
                first: now,
                last: now,
            });
            errors.count += 1;
            errors.last = now;
            ledger.worst_error = ledger.worst_error.max(started.elapsed());
        }
        Err(Failure::Breach(what) | Failure::CleanEnd(what))
            if ledger.breaches.len() < LISTED_BREACHES =>
        {
            let at = shared.run_started.elapsed().as_secs_f64();
            ledger.breaches.push(format!("at {at:.1} s, {what}"));
        }
        Err(Failure::Breach(_) | Failure::CleanEnd(_)) => ledger.unlisted_breaches += 1,
        Err(Failure::UpstreamBreach(what)) => {
            if ledger.upstream_breaches.len() < LISTED_BREACHES {
                let at = shared.run_started.elapsed().as_secs_f64();
                ledger
                    .upstream_breaches
                    .push(format!("at {at:.1} s, {what}"));
            }
            ledger.upstream_breach_count += 1;
        }
    }
}

/// How an operation failed.
#[derive(Debug)]
enum Failure {
    /// An explicit error: what the client is owed when a fault takes its connection.
    Error(String),
    /// A breach of the invariants.
    Breach(String),
    /// A breach of one kind: a clean end of stream before the bytes owed (what a process's
    /// kernel does to its connections when it is killed, for a peer without TLS to tell).
    CleanEnd(String),
    /// A breach through an upstream server of a mixed fleet.
    UpstreamBreach(String),
}

impl Failure {
    /// A breach says which server's frontend it came through (errors are grouped by kind
    /// across the servers), and is upstream's when that server is an upstream one in a
    /// fleet that is not all upstream's.
    fn through(self, entry: &Entry) -> Failure {
        match self {
            Failure::Breach(what) | Failure::CleanEnd(what) => {
                let what = format!("{what} (through {})", entry.label);
                match entry.upstream_in_mix {
                    true => Failure::UpstreamBreach(what),
                    false => Failure::Breach(what),
                }
            }
            other => other,
        }
    }
}

/// An error's kind for the ledger: its text without numbers (IDs, ports, counts), so that
/// alike errors group.
fn kind(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(c);
        }
    }
    // At most 160 characters (a byte count could cut one in two).
    if let Some((at, _)) = out.char_indices().nth(160) {
        out.truncate(at);
    }
    out
}

/// `fut` within the operation deadline; past it, a hang.
async fn bounded<T>(
    what: &str,
    fut: impl Future<Output = anyhow::Result<T>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(OP_DEADLINE, fut).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            let error = format!("{what}: {}", kind(&e));
            if BUG_ERRORS.iter().any(|bug| error.contains(bug)) {
                Err(Failure::Breach(error))
            } else {
                Err(Failure::Error(error))
            }
        }
        Err(_) => Err(Failure::Breach(format!(
            "{what}: no end within {OP_DEADLINE:?}"
        ))),
    }
}

/// Reads exactly `want.len()` bytes and checks them: a clean end of stream before them, or
/// other bytes, is a breach.
async fn expect_back(
    s: &mut (impl AsyncRead + Unpin),
    want: &[u8],
    what: &str,
) -> Result<(), Failure> {
    let mut got = vec![0u8; want.len()];
    let mut filled = 0;
    while filled < got.len() {
        let n = bounded(what, async { Ok(s.read(&mut got[filled..]).await?) }).await?;
        if n == 0 {
            return Err(Failure::CleanEnd(format!(
                "{what}: clean end of stream after {filled} of {} bytes owed",
                want.len()
            )));
        }
        filled += n;
    }
    if got != want {
        return Err(Failure::Breach(format!("{what}: the echo differs")));
    }
    Ok(())
}

async fn send(s: &mut (impl AsyncWrite + Unpin), bytes: &[u8], what: &str) -> Result<(), Failure> {
    bounded(what, async {
        s.write_all(bytes).await?;
        Ok(s.flush().await?)
    })
    .await
}

/// One churn operation: dial, switch to echo, one round trip of `msg`, close.
async fn churn_once(entry: &Entry, msg: &[u8]) -> Result<(), Failure> {
    let s = bounded("dial", entry.dial()).await?;
    echo_once(s, msg, "churn").await
}

/// Switches `s` to echo and makes one round trip of `msg` on it.
async fn echo_once(
    mut s: impl AsyncRead + AsyncWrite + Unpin,
    msg: &[u8],
    what: &str,
) -> Result<(), Failure> {
    let mut first = Vec::with_capacity(msg.len() + 1);
    first.push(ECHO);
    first.extend_from_slice(msg);
    send(&mut s, &first, what).await?;
    expect_back(&mut s, msg, what).await
}

/// The bytes at `offset..` of the pattern `seed` names: what a bulk transfer or a stalled
/// reader sends, and checks when it comes back, without keeping a copy.
fn pattern(seed: u64, offset: u64, out: &mut [u8]) {
    for (i, byte) in out.iter_mut().enumerate() {
        let at = offset + i as u64;
        let word = (seed ^ (at / 8)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        *byte = (word >> ((at % 8) * 8)) as u8;
    }
}

/// Sends `len` bytes of pattern `seed`, after the echo mode byte.
async fn send_pattern(
    w: &mut (impl AsyncWrite + Unpin),
    seed: u64,
    len: u64,
    what: &str,
) -> Result<(), Failure> {
    send(w, &[ECHO], what).await?;
    let mut chunk = vec![0u8; 64 << 10];
    let mut sent = 0;
    while sent < len {
        let n = chunk.len().min((len - sent) as usize);
        pattern(seed, sent, &mut chunk[..n]);
        send(w, &chunk[..n], what).await?;
        sent += n as u64;
    }
    Ok(())
}

/// Reads `len` bytes and checks them against pattern `seed`: a clean end of stream before
/// them, or another byte, is a breach.
async fn expect_pattern(
    r: &mut (impl AsyncRead + Unpin),
    seed: u64,
    len: u64,
    what: &str,
) -> Result<(), Failure> {
    let (mut got, mut want) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    let mut filled = 0;
    while filled < len {
        let room = got.len().min((len - filled) as usize);
        let n = bounded(what, async { Ok(r.read(&mut got[..room]).await?) }).await?;
        if n == 0 {
            return Err(Failure::CleanEnd(format!(
                "{what}: clean end of stream after {filled} of {len} bytes owed"
            )));
        }
        pattern(seed, filled, &mut want[..n]);
        if got[..n] != want[..n] {
            return Err(Failure::Breach(format!(
                "{what}: a wrong byte within {filled}..{}",
                filled + n as u64
            )));
        }
        filled += n as u64;
    }
    Ok(())
}

/// One transfer of `len` bytes through the echo: sent whole while it comes back, the reading
/// begun only after `stall` (a stalled reader, whose connection must hold back no other).
async fn transfer_once(
    entry: &Entry,
    seed: u64,
    len: u64,
    stall: Duration,
    what: &str,
) -> Result<(), Failure> {
    let s = bounded("dial", entry.dial()).await?;
    let (mut r, mut w) = tokio::io::split(s);
    let reading = async {
        tokio::time::sleep(stall).await;
        expect_pattern(&mut r, seed, len, what).await
    };
    tokio::try_join!(send_pattern(&mut w, seed, len, what), reading)?;
    Ok(())
}

/// Dial churn until `stop`, through the entries in turn.
pub async fn churn(
    entries: Vec<Arc<Entry>>,
    worker: usize,
    ledger: Shared,
    stop: CancellationToken,
) {
    let mut n = 0u64;
    while !stop.is_cancelled() {
        let entry = &entries[(worker + n as usize) % entries.len()];
        let msg = format!("churn {worker} {n}").into_bytes();
        let started = Instant::now();
        let outcome = churn_once(entry, &msg).await;
        record(&ledger, started, outcome.map_err(|f| f.through(entry)));
        n += 1;
    }
}

/// An agent's control-plane listener, and how often the soak has killed the agent.
#[derive(Clone, Debug)]
pub struct ControlPlane {
    pub port: u16,
    pub kills: Arc<AtomicU64>,
}

/// Reverse dials until `stop`: connections to the agents' control-plane listeners in turn,
/// which the agents carry through the tunnel to a server and the server to the echo target,
/// each one round trip of a message and a close. The listener is plain TCP: when the agent is
/// killed -9 during an operation, its kernel closes the connection with a clean end, which
/// nothing but the client's own TLS could tell from the endpoint's (kubelet's connections to
/// kube-apiserver carry TLS end to end); that one is an error, not a breach.
async fn reverse(
    control_planes: Vec<ControlPlane>,
    worker: usize,
    ledger: Shared,
    stop: CancellationToken,
) {
    let mut n = 0u64;
    while !stop.is_cancelled() {
        let agent = &control_planes[(worker + n as usize) % control_planes.len()];
        let msg = format!("reverse {worker} {n}").into_bytes();
        let started = Instant::now();
        let kills = agent.kills.load(Ordering::Relaxed);
        let outcome = async {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], agent.port));
            let s = bounded("reverse dial", async {
                Ok(tokio::net::TcpStream::connect(addr).await?)
            })
            .await?;
            echo_once(s, &msg, "reverse").await
        }
        .await;
        let outcome = outcome.map_err(|failure| match failure {
            // A kill under way when the operation began (odd), or one since.
            Failure::CleanEnd(_)
                if kills % 2 == 1 || agent.kills.load(Ordering::Relaxed) != kills =>
            {
                Failure::Error("reverse: clean end from an agent killed -9 meanwhile".to_owned())
            }
            other => other,
        });
        record(&ledger, started, outcome);
        n += 1;
    }
}

/// Transfers of `len` bytes, read after `stall`, until `stop`, through the entries in turn.
async fn transfers(
    entries: Vec<Arc<Entry>>,
    worker: usize,
    (len, stall, what): (u64, Duration, &'static str),
    ledger: Shared,
    stop: CancellationToken,
) {
    let mut n = 0u64;
    while !stop.is_cancelled() {
        let entry = &entries[(worker + n as usize) % entries.len()];
        let seed = (worker as u64) << 32 | n;
        let started = Instant::now();
        record(
            &ledger,
            started,
            transfer_once(entry, seed, len, stall, what)
                .await
                .map_err(|f| f.through(entry)),
        );
        n += 1;
    }
}

/// A long-lived stream (as `kubectl logs -f` holds one): rounds of numbered messages, each
/// checked byte for byte, until `stop`; a stream that ends with an error is opened again.
pub async fn long_lived(entry: Arc<Entry>, id: usize, ledger: Shared, stop: CancellationToken) {
    let mut round = 0u64;
    while !stop.is_cancelled() {
        let started = Instant::now();
        let opened = async {
            let mut s = bounded("stream dial", entry.dial()).await?;
            send(&mut s, &[ECHO], "stream").await?;
            Ok::<_, Failure>(s)
        }
        .await;
        let mut s = match opened {
            Ok(s) => s,
            Err(failure) => {
                record(&ledger, started, Err(failure.through(&entry)));
                tokio::time::sleep(STREAM_PERIOD).await;
                continue;
            }
        };
        loop {
            if stop.is_cancelled() {
                return;
            }
            let msg =
                format!("stream {id} round {round:>12} ........................").into_bytes();
            let started = Instant::now();
            let outcome = async {
                send(&mut s, &msg, "stream").await?;
                expect_back(&mut s, &msg, "stream").await
            }
            .await;
            let broken = outcome.is_err();
            record(&ledger, started, outcome.map_err(|f| f.through(&entry)));
            round += 1;
            if broken {
                break;
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(STREAM_PERIOD) => {}
            }
        }
    }
}

/// Starts `churners` churn workers over `entries`, one long-lived stream per entry, the
/// bulk and stalled-reader clients, and reverse dials through the agents' `control_planes`.
pub fn start(
    entries: &[Arc<Entry>],
    control_planes: &[ControlPlane],
    churners: usize,
    ledger: &Shared,
    stop: &CancellationToken,
) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    for worker in 0..churners {
        tasks.spawn(churn(
            entries.to_vec(),
            worker,
            ledger.clone(),
            stop.clone(),
        ));
    }
    for (id, entry) in entries.iter().enumerate() {
        tasks.spawn(long_lived(entry.clone(), id, ledger.clone(), stop.clone()));
    }
    let kinds = [
        (BULK_CLIENTS, (BULK_BYTES, Duration::ZERO, "bulk")),
        (STALLED_CLIENTS, (STALLED_BYTES, STALL, "stalled reader")),
    ];
    let mut worker = 0;
    for (clients, kind) in kinds {
        for _ in 0..clients {
            tasks.spawn(transfers(
                entries.to_vec(),
                worker,
                kind,
                ledger.clone(),
                stop.clone(),
            ));
            worker += 1;
        }
    }
    // Upstream's agents have no control-plane listener.
    let reverse_clients = if control_planes.is_empty() {
        0
    } else {
        REVERSE_CLIENTS
    };
    for worker in 0..reverse_clients {
        tasks.spawn(reverse(
            control_planes.to_vec(),
            worker,
            ledger.clone(),
            stop.clone(),
        ));
    }
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_read_in_any_pieces_is_the_same_bytes() {
        let mut whole = vec![0u8; 1000];
        pattern(42, 0, &mut whole);
        let mut pieces = vec![0u8; 1000];
        for (from, to) in [(0, 3), (3, 11), (11, 500), (500, 1000)] {
            pattern(42, from as u64, &mut pieces[from..to]);
        }
        assert_eq!(whole, pieces);
        let mut other = vec![0u8; 1000];
        pattern(43, 0, &mut other);
        assert_ne!(whole, other);
        assert!(whole.iter().any(|b| *b != whole[0]));
    }

    #[test]
    fn an_error_s_kind_drops_its_numbers_and_keeps_whole_characters() {
        let e = anyhow::anyhow!("dial 198.18.0.7:8131 failed after 3 tries");
        assert_eq!(kind(&e), "dial #.#.#.#:# failed after # tries");
        let long = anyhow::anyhow!("{}", "é".repeat(200));
        assert_eq!(kind(&long).chars().count(), 160);
    }

    #[tokio::test]
    async fn an_explicit_error_is_an_error_unless_only_a_bug_explains_it() {
        let ended = bounded::<()>("dial", async {
            anyhow::bail!("agent disconnected: not resumed within --resume-window 5s")
        })
        .await;
        assert!(
            matches!(ended, Err(Failure::Error(e)) if e.starts_with("dial: agent disconnected"))
        );
        let violated = bounded::<()>("dial", async {
            anyhow::bail!("agent disconnected: protocol violation: peer acknowledged 3 packets")
        })
        .await;
        assert!(matches!(violated, Err(Failure::Breach(e)) if e.contains("protocol violation")));
    }
}
