//! The audit log: JSON lines, two per tunneled connection (when it opens and when it ends) and
//! one per refused or failed dial.
//!
//! Records are built where a connection opens or its outcome is decided and handed to a writer
//! thread
//! through a queue bounded by bytes ([`writer`]), so a slow or stalled sink never slows
//! traffic: when the queue is full the record is dropped and counted
//! (`tether_audit_records_dropped_total`), with a rate-limited warning. Text a peer supplies
//! is bounded per field and per record ([`bound`]). Records carry no secrets: identities,
//! addresses, sizes and reasons only, never tokens or payload.

mod bound;
mod writer;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use serde::Serialize;

use crate::metrics::{Counter, Registry};
use crate::time::Civil;

pub use bound::{MAX_FIELD_BYTES, MAX_RECORD_BYTES};
pub use writer::{AuditTask, AuditWriter, QUEUE_BYTES, SYNC_INTERVAL};

/// At most one warning about dropped records per this period.
const DROP_WARNING_INTERVAL: Duration = Duration::from_secs(10);

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
    /// A connection was established (the dial succeeded); its `connection` record, with the
    /// same `dial_id`, follows when it ends.
    ConnectionOpened,
    /// An established connection ended.
    Connection,
    /// A dial was refused before anything was dialed (policy, limits, no agent, bad address).
    DialRefused,
    /// A dial was attempted and failed (destination error, timeout, agent lost).
    DialFailed,
    /// A frontend request was refused before it named a dial: an HTTP CONNECT head that is
    /// too large (431), malformed (400), not a CONNECT (405) or not complete in time.
    RequestRefused,
}

/// One audit record. Optional fields are left out when unknown on the writing side.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AuditRecord {
    pub time: String,
    pub event: Option<AuditEvent>,
    /// `server` or `agent`: who wrote the record (the two sides' records share dial ids).
    pub side: &'static str,
    pub server_id: String,
    /// The server's configuration generation (its routing file: 1 as read at start, one more
    /// per applied reload) in force when the connection was dialed; on the server's records
    /// of forward connections.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// On the end record of a connection a configuration reload cut: that generation. On the
    /// server, a routing file that removed the connection's tenant or moved its agent's
    /// identity to another; on the agent, a destination policy that now denies it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut_by_generation: Option<u64>,
    /// The tenant of the client (forward dials) or of the agent (reverse dials and records
    /// of an agent's stream); left out with no tenant table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
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
    /// Server peering, on the records of the server the client is connected to: the peer
    /// server that holds the agent, which the connection was forwarded to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via_server: Option<String>,
    /// Server peering, on the records of the server that holds the agent: the peer server
    /// the client is connected to, which forwarded the connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_server: Option<String>,
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
    /// `ok` for a normal close (and on `connection_opened`), `error` otherwise.
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The fields cut to [`MAX_FIELD_BYTES`] (their text ends with `…(N bytes)`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub truncated: Vec<&'static str>,
}

impl AuditRecord {
    /// Marks a record as the opening of a connection: `connection_opened`, outcome `ok`.
    pub fn opened(self) -> Self {
        Self {
            event: Some(AuditEvent::ConnectionOpened),
            outcome: "ok",
            ..self
        }
    }

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

impl AuditRecord {
    /// Cuts every text field to [`MAX_FIELD_BYTES`] and lists the ones it cut.
    fn bound_fields(&mut self) {
        let fields = [
            ("server_id", Some(&mut self.server_id)),
            ("tenant", self.tenant.as_mut()),
            ("agent_id", self.agent_id.as_mut()),
            ("dial_id", self.dial_id.as_mut()),
            ("client", self.client.as_mut()),
            ("requested", Some(&mut self.requested)),
            ("dialed", self.dialed.as_mut()),
            ("reason", self.reason.as_mut()),
        ];
        for (name, field) in fields {
            if let Some(text) = field
                && bound::bound_text(text, MAX_FIELD_BYTES)
            {
                self.truncated.push(name);
            }
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
    queue: Arc<writer::Queue>,
    dropped: Arc<Counter>,
    written: Arc<Counter>,
    /// Stamped on records that name no tenant (see [`for_tenant`](Self::for_tenant)).
    tenant: Option<Arc<str>>,
    last_drop_warning: Arc<Mutex<Option<Instant>>>,
}

impl AuditLog {
    /// A log writing to `target`, opened (for appending) now so that a bad path is a start-up
    /// error, with its counters.
    pub fn open(target: &AuditTarget, registry: &Registry) -> std::io::Result<(Self, AuditWriter)> {
        let (out, sync): (Box<dyn std::io::Write + Send>, _) = match target {
            AuditTarget::Stdout => (Box::new(std::io::stdout()), None),
            AuditTarget::File(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                let sync = file.try_clone()?;
                (Box::new(file), Some(sync))
            }
        };
        Ok(Self::with_output(out, sync, QUEUE_BYTES, registry))
    }

    fn with_output(
        out: Box<dyn std::io::Write + Send>,
        sync: Option<std::fs::File>,
        queue_bytes: usize,
        registry: &Registry,
    ) -> (Self, AuditWriter) {
        let queue = Arc::new(writer::Queue::new(queue_bytes));
        let dropped = registry.counter(
            "tether_audit_records_dropped_total",
            "Audit records dropped because the writer fell behind (its sink is slow or stalled) or failed.",
        );
        let written = registry.counter("tether_audit_records_total", "Audit records written.");
        let writer = AuditWriter {
            queue: queue.clone(),
            out,
            sync,
            written: Arc::clone(&written),
            dropped: Arc::clone(&dropped),
        };
        let log = Self {
            queue,
            dropped,
            written,
            tenant: None,
            last_drop_warning: Arc::default(),
        };
        (log, writer)
    }

    /// The same log, stamping `tenant` on records that name none (the implicit tenant of a
    /// server without a tenant table has the empty name and is left out).
    pub fn for_tenant(&self, tenant: &str) -> Self {
        Self {
            tenant: (!tenant.is_empty()).then(|| Arc::from(tenant)),
            ..self.clone()
        }
    }

    /// Stamps `record` with the current time (and tenant), bounds its text fields and queues
    /// it; drops and counts it when the writer is behind or gone.
    pub fn record(&self, mut record: AuditRecord) {
        record.time = Civil::from_system_time(crate::time::wall_clock()).rfc3339();
        if record.tenant.is_none() {
            record.tenant = self.tenant.as_deref().map(str::to_owned);
        }
        record.bound_fields();
        let line = match serde_json::to_string(&record) {
            Ok(line) if line.len() <= MAX_RECORD_BYTES => line,
            Ok(line) => {
                tracing::warn!(
                    bytes = line.len(),
                    limit = MAX_RECORD_BYTES,
                    "dropping an audit record larger than the limit"
                );
                self.dropped.inc();
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot encode an audit record");
                self.dropped.inc();
                return;
            }
        };
        if self.queue.push(line).is_err() {
            self.dropped.inc();
            self.warn_dropped();
        }
    }

    /// Says, at most once per [`DROP_WARNING_INTERVAL`], that records are being dropped.
    fn warn_dropped(&self) {
        let now = Instant::now();
        let mut last = self
            .last_drop_warning
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|at| now.duration_since(at) < DROP_WARNING_INTERVAL) {
            return;
        }
        *last = Some(now);
        drop(last);
        tracing::warn!(
            dropped = self.dropped.get(),
            "the audit log's writer is behind (its sink is slow or stalled, or failed): dropping records rather than slowing traffic (tether_audit_records_dropped_total)"
        );
    }

    /// Records written so far (for tests that wait for the writer).
    pub fn written(&self) -> u64 {
        self.written.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(requested: String) -> AuditRecord {
        AuditRecord {
            event: Some(AuditEvent::DialRefused),
            side: "server",
            requested,
            outcome: "error",
            reason: Some("policy: deny".into()),
            ..Default::default()
        }
    }

    fn lines(path: &std::path::Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn writes_json_lines_and_drops_what_passes_the_queues_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let registry = Registry::new();
        let file = std::fs::File::create(&path).unwrap();
        let (log, writer) = AuditLog::with_output(Box::new(file), None, 64 * 1024, &registry);
        // Fill past the queue's bytes before the writer runs: the excess is dropped.
        for i in 0..1000 {
            log.record(refused(format!("127.0.0.1:{i}")));
        }
        let dropped = log.dropped.get();
        assert!(dropped > 0 && dropped < 1000, "{dropped}");
        writer.spawn().finish().await;
        let lines = lines(&path);
        assert_eq!(lines.len() as u64, 1000 - dropped);
        assert_eq!(lines[0]["event"], "dial_refused");
        assert_eq!(lines[0]["requested"], "127.0.0.1:0");
        assert!(lines[0].get("agent_id").is_none());
        assert!(lines[0].get("tenant").is_none());
        assert!(lines[0].get("truncated").is_none());
        assert!(lines[0]["time"].as_str().unwrap().ends_with('Z'));
        assert_eq!(log.written(), 1000 - dropped);
    }

    /// A sink whose writes never return, like a pipe nobody reads.
    struct Stalled(std::sync::mpsc::Receiver<()>);

    impl std::io::Write for Stalled {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.recv();
            Err(std::io::Error::other("sink released"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_stalled_sink_never_blocks_a_record_nor_shutdown() {
        let registry = Registry::new();
        let (release, stall) = std::sync::mpsc::channel();
        let (log, writer) =
            AuditLog::with_output(Box::new(Stalled(stall)), None, 256 * 1024, &registry);
        let task = writer.spawn();
        let started = Instant::now();
        for i in 0..20_000 {
            log.record(refused(format!("{}:{i}", "h".repeat(200))));
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "recording took {:?}",
            started.elapsed()
        );
        assert!(log.dropped.get() > 19_000, "{}", log.dropped.get());
        assert_eq!(log.written(), 0);
        let stopping = Instant::now();
        task.finish().await;
        assert!(stopping.elapsed() < writer::DRAIN_TIMEOUT + Duration::from_secs(1));
        drop(release);
    }

    #[test]
    fn a_record_of_megabytes_of_peer_text_stays_bounded() {
        let mut record = AuditRecord {
            agent_id: Some("\n".repeat(1 << 20)),
            client: Some("CN=x".repeat(1 << 18)),
            dialed: Some("\u{1b}".repeat(1 << 18)),
            reason: Some("\0".repeat(1 << 20)),
            tenant: Some("t".repeat(1 << 13)),
            dial_id: Some("9".repeat(1 << 13)),
            server_id: "\"".repeat(1 << 12),
            ..refused("x".repeat(1 << 20))
        };
        record.bound_fields();
        let line = serde_json::to_string(&record).unwrap();
        assert!(line.len() <= MAX_RECORD_BYTES, "{}", line.len());
        assert_eq!(
            record.truncated,
            [
                "server_id",
                "tenant",
                "agent_id",
                "dial_id",
                "client",
                "requested",
                "dialed",
                "reason"
            ]
        );
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert!(
            value["requested"]
                .as_str()
                .unwrap()
                .ends_with("…(1048576 bytes)")
        );
    }

    #[tokio::test]
    async fn a_tenants_log_stamps_its_name_unless_the_record_has_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let registry = Registry::new();
        let (log, writer) = AuditLog::open(&AuditTarget::File(path.clone()), &registry).unwrap();
        log.for_tenant("acme").record(refused("a:1".into()));
        log.for_tenant("").record(refused("b:1".into()));
        log.for_tenant("acme").record(AuditRecord {
            tenant: Some("initech".into()),
            ..refused("c:1".into())
        });
        writer.spawn().finish().await;
        let lines = lines(&path);
        assert_eq!(lines[0]["tenant"], "acme");
        assert!(lines[1].get("tenant").is_none());
        assert_eq!(lines[2]["tenant"], "initech");
    }

    /// A connection's pair as the server writes it: the same dial id and generation on both,
    /// `connection_opened` without the end's fields, `connection` with them.
    fn connection_pair() -> (AuditRecord, AuditRecord) {
        let common = AuditRecord {
            side: "server",
            server_id: "server-a".into(),
            generation: Some(3),
            tenant: Some("acme".into()),
            agent_id: Some("node-a".into()),
            dial_id: Some("5577006791947779410".into()),
            connection_id: Some(7),
            frontend: Some("grpc"),
            transport: Some("uds"),
            client: Some("unix uid 0".into()),
            client_pid: Some(1234),
            requested: "10.0.0.5:10250".into(),
            dial_latency_ms: Some(1.25),
            ..Default::default()
        };
        let open = common.clone().opened();
        let close = AuditRecord {
            event: Some(AuditEvent::Connection),
            bytes_to_destination: Some(120),
            bytes_from_destination: Some(4096),
            duration_ms: Some(3_600_000.5),
            ..common
        }
        .ended("client", None);
        (open, close)
    }

    fn encoded(record: &AuditRecord) -> serde_json::Value {
        serde_json::to_value(record).unwrap()
    }

    #[test]
    fn an_open_record_names_the_connection_and_leaves_out_how_it_ended() {
        let (open, _) = connection_pair();
        let value = encoded(&open);
        assert_eq!(
            value,
            serde_json::json!({
                "time": "",
                "event": "connection_opened",
                "side": "server",
                "server_id": "server-a",
                "generation": 3,
                "tenant": "acme",
                "agent_id": "node-a",
                "dial_id": "5577006791947779410",
                "connection_id": 7,
                "frontend": "grpc",
                "transport": "uds",
                "client": "unix uid 0",
                "client_pid": 1234,
                "requested": "10.0.0.5:10250",
                "dial_latency_ms": 1.25,
                "outcome": "ok",
            })
        );
    }

    #[test]
    fn a_close_record_keeps_its_fields_and_adds_the_generation() {
        let (open, close) = connection_pair();
        let (open, close) = (encoded(&open), encoded(&close));
        assert_eq!(close["event"], "connection");
        for field in [
            "dial_id",
            "generation",
            "connection_id",
            "agent_id",
            "tenant",
        ] {
            assert_eq!(open[field], close[field], "{field}");
        }
        for (field, value) in [
            ("bytes_to_destination", serde_json::json!(120)),
            ("bytes_from_destination", serde_json::json!(4096)),
            ("duration_ms", serde_json::json!(3_600_000.5)),
            ("closed_by", serde_json::json!("client")),
            ("outcome", serde_json::json!("ok")),
        ] {
            assert_eq!(close[field], value, "{field}");
        }
        assert!(close.get("reason").is_none());
        // Records without a generation (refusals, the agent's) leave it out.
        assert!(encoded(&refused("a:1".into())).get("generation").is_none());
    }

    #[tokio::test]
    async fn a_record_is_in_the_file_while_the_writer_still_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let registry = Registry::new();
        let (log, writer) = AuditLog::open(&AuditTarget::File(path.clone()), &registry).unwrap();
        let task = writer.spawn();
        let (open, _) = connection_pair();
        log.record(open);
        // Written through at once (and synced within SYNC_INTERVAL): no need to stop the
        // writer, nor to wait for more records, to find it in the file.
        let deadline = Instant::now() + Duration::from_secs(1);
        let lines = loop {
            let lines = lines(&path);
            if !lines.is_empty() || Instant::now() > deadline {
                break lines;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(lines.len(), 1, "the open record within a second");
        assert_eq!(lines[0]["event"], "connection_opened");
        assert_eq!(log.written(), 1);
        task.finish().await;
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
