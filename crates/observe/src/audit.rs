//! The audit log: one JSON line per tunneled connection and per refused or failed dial.
//!
//! Records are built where a connection's outcome is decided and handed to a writer task
//! through a bounded channel, so a slow disk never slows traffic: when the channel is full the
//! record is dropped and counted (`tether_audit_records_dropped_total`). Records carry no
//! secrets: identities, addresses, sizes and reasons only, never tokens or payload.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::metrics::{Counter, Registry};
use crate::time::Civil;

/// Records waiting for the writer; beyond this they are dropped and counted.
pub const QUEUE_CAPACITY: usize = 4096;

/// How long the writer keeps draining queued records after shutdown begins.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Where records go (`--audit-log-path`: `-` is standard output, as kube-apiserver's flag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuditTarget {
    Stdout,
    File(PathBuf),
}

impl AuditTarget {
    /// Reads `--audit-log-path`: empty means off.
    pub fn from_flag(value: &str) -> Option<Self> {
        match value {
            "" => None,
            "-" => Some(Self::Stdout),
            path => Some(Self::File(PathBuf::from(path))),
        }
    }
}

impl std::fmt::Display for AuditTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stdout => f.write_str("standard output"),
            Self::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// What a record is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditEvent {
    /// An established connection ended.
    Connection,
    /// A dial was refused before anything was dialed (policy, limits, no agent, bad address).
    DialRefused,
    /// A dial was attempted and failed (destination error, timeout, agent lost).
    DialFailed,
}

/// One audit record. Optional fields are left out when unknown on the writing side.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AuditRecord {
    pub time: String,
    pub event: Option<AuditEvent>,
    /// `server` or `agent`: who wrote the record (the two sides' records share dial ids).
    pub side: &'static str,
    pub server_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The dial's `random` id, the same on the server's and the agent's record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dial_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_id: Option<i64>,
    /// `reverse` for a connection an agent carried from its node toward a control-plane
    /// endpoint (tether's reverse dials); left out for forward connections.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direction: Option<&'static str>,
    /// `grpc` or `http-connect` (server side).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frontend: Option<&'static str>,
    /// `uds`, `tls` or `tcp`: how the client (server side) reached the server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport: Option<&'static str>,
    /// The client's proven identity: certificate names, or `uid:N` on a Unix socket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_pid: Option<i32>,
    /// The `host:port` the client asked for.
    pub requested: String,
    /// The socket address the agent actually connected to (agent side).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dialed: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dial_latency_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_to_destination: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_from_destination: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    /// Who ended the connection: `client`, `destination`, `agent`, `server` or `stream`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closed_by: Option<&'static str>,
    /// `ok` for a normal close, `error` otherwise.
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl AuditRecord {
    /// Sets how a connection ended: `error` is `None` for a normal close.
    pub fn ended(self, closed_by: &'static str, error: Option<String>) -> Self {
        Self {
            closed_by: Some(closed_by),
            outcome: if error.is_none() { "ok" } else { "error" },
            reason: error,
            ..self
        }
    }
}

/// Milliseconds, for the record's duration fields.
pub fn millis(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1e6).round() / 1e3
}

/// The sending half, cheap to clone; `record` never waits.
#[derive(Clone, Debug)]
pub struct AuditLog {
    queue: mpsc::Sender<String>,
    dropped: Arc<Counter>,
    written: Arc<Counter>,
}

/// The writing half: run it on a task its owner waits for.
pub struct AuditWriter {
    queue: mpsc::Receiver<String>,
    out: Box<dyn std::io::Write + Send>,
    written: Arc<Counter>,
}

impl std::fmt::Debug for AuditWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditWriter").finish_non_exhaustive()
    }
}

impl AuditLog {
    /// A log writing to `target`, opened (for appending) now so that a bad path is a start-up
    /// error, with its counters.
    pub fn open(target: &AuditTarget, registry: &Registry) -> std::io::Result<(Self, AuditWriter)> {
        let out: Box<dyn std::io::Write + Send> = match target {
            AuditTarget::Stdout => Box::new(std::io::stdout()),
            AuditTarget::File(path) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        };
        let (queue, receiver) = mpsc::channel(QUEUE_CAPACITY);
        let dropped = registry.counter(
            "tether_audit_records_dropped_total",
            "Audit records dropped because the writer fell behind.",
        );
        let written = registry.counter("tether_audit_records_total", "Audit records written.");
        let writer = AuditWriter {
            queue: receiver,
            out,
            written: Arc::clone(&written),
        };
        Ok((
            Self {
                queue,
                dropped,
                written,
            },
            writer,
        ))
    }

    /// Stamps `record` with the current time and queues it; drops and counts it when the
    /// writer is behind or gone.
    pub fn record(&self, mut record: AuditRecord) {
        record.time = Civil::from_system_time(SystemTime::now()).rfc3339();
        let line = match serde_json::to_string(&record) {
            Ok(line) => line,
            Err(error) => {
                tracing::warn!(%error, "cannot encode an audit record");
                self.dropped.inc();
                return;
            }
        };
        if self.queue.try_send(line).is_err() {
            self.dropped.inc();
        }
    }

    /// Records written so far (for tests that wait for the writer).
    pub fn written(&self) -> u64 {
        self.written.get()
    }
}

/// A running [`AuditWriter`]; [`finish`](Self::finish) stops it after draining.
#[derive(Debug)]
pub struct AuditTask {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl AuditTask {
    /// Stops the writer once what is queued is written (its owner calls this last, after
    /// every connection that might still write a record has ended) and logs a write error.
    pub async fn finish(self) {
        self.stop.cancel();
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "the audit log could not be written"),
            Err(error) => tracing::error!(%error, "the audit writer failed"),
        }
    }
}

impl AuditWriter {
    /// Runs the writer on its own task, owned by the returned handle.
    pub fn spawn(self) -> AuditTask {
        let stop = CancellationToken::new();
        let task = tokio::spawn(self.run(stop.clone()));
        AuditTask { stop, task }
    }

    /// Writes queued records until `stop`, then what is still queued (for at most a short
    /// drain period). A write error ends the writer; later records are dropped and counted.
    pub async fn run(mut self, stop: CancellationToken) -> std::io::Result<()> {
        let mut batch = Vec::new();
        loop {
            tokio::select! {
                received = self.queue.recv_many(&mut batch, 256) => {
                    if received == 0 {
                        break;
                    }
                }
                () = stop.cancelled() => break,
            }
            self.write(&mut batch)?;
        }
        // Shutdown: what is already queued still belongs in the log.
        let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
        while let Ok(Some(line)) = tokio::time::timeout_at(deadline, self.queue.recv()).await {
            batch.push(line);
            if self.queue.is_empty() {
                break;
            }
        }
        self.write(&mut batch)
    }

    fn write(&mut self, batch: &mut Vec<String>) -> std::io::Result<()> {
        // Blocking writes of a few small lines: cheap next to the network work that made them.
        for line in batch.drain(..) {
            self.out.write_all(line.as_bytes())?;
            self.out.write_all(b"\n")?;
            self.written.inc();
        }
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_json_lines_and_drops_when_full() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let registry = Registry::new();
        let (log, writer) = AuditLog::open(&AuditTarget::File(path.clone()), &registry).unwrap();
        // Fill past capacity before the writer runs: the excess is dropped, not queued.
        for i in 0..QUEUE_CAPACITY + 10 {
            log.record(AuditRecord {
                event: Some(AuditEvent::DialRefused),
                side: "server",
                requested: format!("127.0.0.1:{i}"),
                outcome: "error",
                reason: Some("policy: deny".into()),
                ..Default::default()
            });
        }
        assert_eq!(log.dropped.get(), 10);
        let stop = CancellationToken::new();
        stop.cancel();
        writer.run(stop).await.unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), QUEUE_CAPACITY);
        assert_eq!(lines[0]["event"], "dial_refused");
        assert_eq!(lines[0]["requested"], "127.0.0.1:0");
        assert!(lines[0].get("agent_id").is_none());
        assert!(lines[0]["time"].as_str().unwrap().ends_with('Z'));
        assert_eq!(log.written(), QUEUE_CAPACITY as u64);
    }

    #[test]
    fn the_flag_reads_like_kube_apiservers() {
        assert_eq!(AuditTarget::from_flag(""), None);
        assert_eq!(AuditTarget::from_flag("-"), Some(AuditTarget::Stdout));
        assert_eq!(
            AuditTarget::from_flag("/var/log/tether/audit.log"),
            Some(AuditTarget::File("/var/log/tether/audit.log".into()))
        );
    }
}
