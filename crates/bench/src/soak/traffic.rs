//! The soak's clients and their ledger. Dial churn (dial, echo, close) and long-lived
//! streams checked byte for byte run through every server's gRPC frontend while the faults
//! land. Every operation ends with success or an explicit error within its deadline; a hang,
//! a clean end of stream before the bytes owed, or a wrong byte is a breach of the
//! invariants, not an error.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::systems::Dialer;
use crate::target::{BoxStream, ECHO};

/// The deadline of every client operation: a dial, or one echo round.
pub const OP_DEADLINE: Duration = Duration::from_secs(30);
/// Breaches the ledger lists; beyond them it only counts (a server that ends every stream
/// early would otherwise add one line per operation).
const LISTED_BREACHES: usize = 100;
/// A long-lived stream's pause between rounds.
const STREAM_PERIOD: Duration = Duration::from_millis(100);

/// What the clients did, and every breach of an invariant.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Operations that succeeded: churn dials carried to the end, long-lived rounds.
    pub ok: u64,
    /// Explicit errors, by what they said.
    pub errors: BTreeMap<String, u64>,
    /// The longest an operation took to end with an error.
    pub worst_error: Duration,
    /// Breaches: hangs, clean ends of cut-short data, wrong bytes; the first
    /// [`LISTED_BREACHES`] of them.
    pub breaches: Vec<String>,
    /// Breaches beyond those listed.
    pub unlisted_breaches: u64,
}

impl Ledger {
    pub fn operations(&self) -> u64 {
        self.ok + self.errors.values().sum::<u64>()
    }
}

/// The ledger the client tasks share.
pub type Shared = Arc<Mutex<Ledger>>;

fn record(ledger: &Shared, started: Instant, outcome: Result<(), Failure>) {
    let mut ledger = ledger.lock().unwrap_or_else(|e| e.into_inner());
    match outcome {
        Ok(()) => ledger.ok += 1,
        Err(Failure::Error(what)) => {
            *ledger.errors.entry(what).or_default() += 1;
            ledger.worst_error = ledger.worst_error.max(started.elapsed());
        }
        Err(Failure::Breach(what)) if ledger.breaches.len() < LISTED_BREACHES => {
            ledger.breaches.push(what);
        }
        Err(Failure::Breach(_)) => ledger.unlisted_breaches += 1,
    }
}

/// How an operation failed.
#[derive(Debug)]
enum Failure {
    /// An explicit error: what the client is owed when a fault takes its connection.
    Error(String),
    /// A breach of the invariants.
    Breach(String),
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
        Ok(Err(e)) => Err(Failure::Error(format!("{what}: {}", kind(&e)))),
        Err(_) => Err(Failure::Breach(format!(
            "{what}: no end within {OP_DEADLINE:?}"
        ))),
    }
}

/// Reads exactly `want.len()` bytes and checks them: a clean end of stream before them, or
/// other bytes, is a breach.
async fn expect_back(s: &mut BoxStream, want: &[u8], what: &str) -> Result<(), Failure> {
    let mut got = vec![0u8; want.len()];
    let mut filled = 0;
    while filled < got.len() {
        let n = bounded(what, async { Ok(s.read(&mut got[filled..]).await?) }).await?;
        if n == 0 {
            return Err(Failure::Breach(format!(
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

async fn send(s: &mut BoxStream, bytes: &[u8], what: &str) -> Result<(), Failure> {
    bounded(what, async {
        s.write_all(bytes).await?;
        Ok(s.flush().await?)
    })
    .await
}

/// One churn operation: dial, switch to echo, one round trip of `msg`, close.
async fn churn_once(dialer: &Dialer, msg: &[u8]) -> Result<(), Failure> {
    let mut s = bounded("dial", dialer.dial()).await?;
    let mut first = Vec::with_capacity(msg.len() + 1);
    first.push(ECHO);
    first.extend_from_slice(msg);
    send(&mut s, &first, "churn").await?;
    expect_back(&mut s, msg, "churn").await
}

/// Dial churn until `stop`, through the dialers in turn.
pub async fn churn(dialers: Vec<Dialer>, worker: usize, ledger: Shared, stop: CancellationToken) {
    let mut n = 0u64;
    while !stop.is_cancelled() {
        let dialer = &dialers[(worker + n as usize) % dialers.len()];
        let msg = format!("churn {worker} {n}").into_bytes();
        let started = Instant::now();
        record(&ledger, started, churn_once(dialer, &msg).await);
        n += 1;
    }
}

/// A long-lived stream (as `kubectl logs -f` holds one): rounds of numbered messages, each
/// checked byte for byte, until `stop`; a stream that ends with an error is opened again.
pub async fn long_lived(dialer: Dialer, id: usize, ledger: Shared, stop: CancellationToken) {
    let mut round = 0u64;
    while !stop.is_cancelled() {
        let started = Instant::now();
        let opened = async {
            let mut s = bounded("stream dial", dialer.dial()).await?;
            send(&mut s, &[ECHO], "stream").await?;
            Ok::<_, Failure>(s)
        }
        .await;
        let mut s = match opened {
            Ok(s) => s,
            Err(failure) => {
                record(&ledger, started, Err(failure));
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
            record(&ledger, started, outcome);
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

/// Starts `churners` churn workers over `dialers` and one long-lived stream per dialer.
pub fn start(
    dialers: &[Dialer],
    churners: usize,
    ledger: &Shared,
    stop: &CancellationToken,
) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    for worker in 0..churners {
        tasks.spawn(churn(
            dialers.to_vec(),
            worker,
            ledger.clone(),
            stop.clone(),
        ));
    }
    for (id, dialer) in dialers.iter().enumerate() {
        tasks.spawn(long_lived(dialer.clone(), id, ledger.clone(), stop.clone()));
    }
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_s_kind_drops_its_numbers_and_keeps_whole_characters() {
        let e = anyhow::anyhow!("dial 198.18.0.7:8131 failed after 3 tries");
        assert_eq!(kind(&e), "dial #.#.#.#:# failed after # tries");
        let long = anyhow::anyhow!("{}", "é".repeat(200));
        assert_eq!(kind(&long).chars().count(), 160);
    }
}
