//! The reusable tunnel: kube-apiserver's newer gRPC egress keeps one HTTP/2 connection to the
//! proxy server's frontend and opens one `Proxy` stream per dial on it. Admission webhooks
//! make thousands of short dials a second there while hundreds of longer-lived streams
//! (`logs -f`, watches, exec) stay open on the same connection, and the server caps the
//! concurrent streams of a connection (tether: `--max-streams-per-frontend-connection`;
//! upstream: no flag, grpc-go's default of no limit).
//!
//! One sweep point: `held` streams are opened on the system's one [`GrpcClient`] (dial, one
//! echo) and kept idle; beside them `concurrency` workers run short dials (dial, 64-byte echo,
//! close; [`churn`](super::churn)) on the same client for `churn_secs`; then every held stream
//! must echo once more, and all are closed. Near and above the cap the figures say whether
//! dials pass, queue (the HTTP/2 client holds a stream back until one is free: latency
//! jumps) or fail, and with which error.
//!
//! [`GrpcClient`]: tether_client::GrpcClient

use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use anyhow::{Context as _, bail};
use tokio::sync::Semaphore;

use super::Profile;
use super::churn::{self, ChurnResult};
use crate::progress::{Progress, Ticker};
use crate::systems::{Dialer, GRPC_STREAMS, Running};
use crate::target::{self, BoxStream};

/// The gauge's series of the frontend's streams.
const PROXY: &str = r#"service_method="Proxy""#;
/// How often the server's stream gauge is read while the short dials run.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How long the streams of the point before may take to leave the server's gauge.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);
/// Deadline of one echo on a held stream.
const ECHO_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of checking every held stream at the end.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// What one sweep point measured.
#[derive(Clone, Debug)]
pub struct PointResult {
    pub held: usize,
    /// Workers dialling beside the held streams.
    pub concurrency: usize,
    /// Held streams that failed to open, or no longer echoed at the end.
    pub held_failed: usize,
    /// Why held streams failed, one message each.
    pub held_errors: Vec<String>,
    /// The short dials; their errors are the failed dials.
    pub churn: ChurnResult,
    /// The most `Proxy` streams the server's gauge showed while the short dials ran
    /// (sampled every 100 ms), if the server has the gauge.
    pub peak_streams: Option<f64>,
    /// `Proxy` streams the server still counted when the point started, left from the one
    /// before after [`DRAIN_TIMEOUT`] (0 when every one had gone).
    pub leftover: Option<f64>,
}

impl PointResult {
    /// The progress line: `cap` is the server's stream cap (`None`: it has none).
    pub fn line(&self, cap: Option<u32>) -> String {
        let c = &self.churn;
        let streams = self.held + self.concurrency;
        let cap_text = match cap {
            Some(cap) if streams > cap as usize => format!("stream cap {cap} (over it)"),
            Some(cap) => format!("stream cap {cap}"),
            None => "no stream cap".to_owned(),
        };
        let mut line = format!(
            "tunnel, {cap_text}, {} held + {} dialling: {:.0} dials/s, dial p50 {:.0} µs, p99 {:.0} µs",
            self.held, self.concurrency, c.conns_per_s, c.dial_p50_us, c.dial_p99_us
        );
        if let Some(cpu) = c.cpu_us_per_conn {
            line.push_str(&format!(", {cpu:.0} CPU µs/dial"));
        }
        if let Some(peak) = self.peak_streams {
            line.push_str(&format!(", at most {peak:.0} Proxy streams"));
        }
        line.push_str(&format!(
            "; {} of {} held failed, {} failed dials",
            self.held_failed,
            self.held,
            c.errors.len()
        ));
        if let Some(left) = self.leftover.filter(|&n| n > 0.0) {
            line.push_str(&format!(
                " ({left:.0} streams of the point before still open at the start)"
            ));
        }
        line
    }
}

/// Runs one sweep point on `r`, whose dialer must be a gRPC client: its one HTTP/2
/// connection carries every stream.
pub async fn run(
    r: &Running,
    p: &Profile,
    held: usize,
    progress: &Progress,
) -> anyhow::Result<PointResult> {
    if !matches!(r.dialer, Dialer::Grpc(..)) {
        bail!(
            "{}: the tunnel workload needs a gRPC frontend",
            r.system.name()
        );
    }
    let concurrency = p.tunnel_concurrency.max(1);
    let leftover = drained(r).await;
    let (mut streams, mut held_errors) = open_held(r, p, held, progress).await;
    tokio::time::sleep(p.settle).await;
    progress.note(&format!(
        "{} streams held; short dials from {concurrency} workers for {} s",
        streams.len(),
        p.churn_secs
    ));
    let until = Instant::now() + Duration::from_secs_f64(p.churn_secs);
    let (churn, peak_streams) = tokio::join!(churn::run(r, p, concurrency), peak_streams(r, until));
    held_errors.extend(check_held(&mut streams).await);
    drop(streams);
    Ok(PointResult {
        held,
        concurrency,
        held_failed: held_errors.len(),
        held_errors,
        churn,
        peak_streams,
        leftover,
    })
}

/// Waits (at most [`DRAIN_TIMEOUT`]) until the server counts no `Proxy` stream; returns the
/// count it ended at, or `None` without the gauge.
async fn drained(r: &Running) -> Option<f64> {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let n = r.server_metric_where(GRPC_STREAMS, PROXY).await?;
        if n <= 0.0 || Instant::now() >= deadline {
            return Some(n);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens `held` streams, `p.open_concurrency` at a time, each proven by one echo: the open
/// ones, and one message per failure.
async fn open_held(
    r: &Running,
    p: &Profile,
    held: usize,
    progress: &Progress,
) -> (Vec<BoxStream>, Vec<String>) {
    let gate = Arc::new(Semaphore::new(p.open_concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..held {
        let Ok(permit) = gate.clone().acquire_owned().await else {
            break;
        };
        let dialer = r.dialer.clone();
        let timeout = p.dial_timeout;
        tasks.spawn(async move {
            let _permit = permit;
            let mut s = dialer.dial_timeout(timeout).await?;
            tokio::time::timeout(ECHO_TIMEOUT, target::echo_start(&mut s, &[0x48; 64]))
                .await
                .map_err(|_| anyhow::anyhow!("no echo within {ECHO_TIMEOUT:?}"))??;
            anyhow::Ok(s)
        });
    }
    let mut streams = Vec::with_capacity(held);
    let mut errors = Vec::new();
    let mut ticker = Ticker::new(Duration::from_secs(3));
    while let Some(joined) = tasks.join_next().await {
        match joined.context("a held stream's task") {
            Ok(Ok(s)) => streams.push(s),
            Ok(Err(e)) | Err(e) => errors.push(format!("held stream: {e:#}")),
        }
        if ticker.due() {
            progress.note(&format!("{} of {held} held streams open", streams.len()));
        }
    }
    (streams, errors)
}

/// The most `Proxy` streams the server's gauge shows until `until`.
async fn peak_streams(r: &Running, until: Instant) -> Option<f64> {
    let mut peak: Option<f64> = None;
    while Instant::now() < until {
        if let Some(n) = r.server_metric_where(GRPC_STREAMS, PROXY).await {
            peak = Some(peak.map_or(n, |m| m.max(n)));
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    peak
}

/// One more echo on every held stream: one message per stream that failed it.
async fn check_held(streams: &mut [BoxStream]) -> Vec<String> {
    let deadline = Instant::now() + CHECK_TIMEOUT;
    let msg = [0x49u8; 64];
    let mut back = [0u8; 64];
    let mut errors = Vec::new();
    for s in streams.iter_mut() {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(
            left.min(ECHO_TIMEOUT),
            target::echo_round(s, &msg, &mut back),
        )
        .await
        {
            Ok(Ok(())) if back == msg => {}
            Ok(Ok(())) => errors.push("held stream at the end: the echo came back changed".into()),
            Ok(Err(e)) => errors.push(format!("held stream at the end: {e:#}")),
            Err(_) => errors.push("held stream at the end: no echo in time".into()),
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(held: usize, errors: usize) -> PointResult {
        PointResult {
            held,
            concurrency: 64,
            held_failed: 1,
            held_errors: vec!["held stream: dial timed out after 10s".into()],
            churn: ChurnResult {
                conns_per_s: 3_811.6,
                succeeded: 11_435,
                dial_p50_us: 7_104.2,
                dial_p99_us: 22_400.9,
                cpu_us_per_conn: Some(61.4),
                errors: vec!["dial timed out after 10s".into(); errors],
            },
            peak_streams: Some(1_000.0),
            leftover: Some(0.0),
        }
    }

    #[test]
    fn the_line_says_whether_the_point_is_over_the_cap() {
        assert_eq!(
            point(980, 2).line(Some(1_000)),
            "tunnel, stream cap 1000 (over it), 980 held + 64 dialling: 3812 dials/s, \
             dial p50 7104 µs, p99 22401 µs, 61 CPU µs/dial, at most 1000 Proxy streams; \
             1 of 980 held failed, 2 failed dials"
        );
        let mut under = point(900, 0);
        under.leftover = Some(3.0);
        under.peak_streams = None;
        under.churn.cpu_us_per_conn = None;
        assert_eq!(
            under.line(Some(1_000)),
            "tunnel, stream cap 1000, 900 held + 64 dialling: 3812 dials/s, dial p50 7104 µs, \
             p99 22401 µs; 1 of 900 held failed, 0 failed dials (3 streams of the point before \
             still open at the start)"
        );
        assert!(
            point(0, 0)
                .line(None)
                .starts_with("tunnel, no stream cap, 0 held")
        );
    }
}
