//! Agent fan-in: many agents on one server. A light fake agent speaks the real Connect
//! protocol (mutual TLS, HTTP/2, `AgentService.Connect` with an `agentid`) and then idles;
//! the server's RSS growth per agent is the figure; with the larger count also the server's
//! CPU per idle agent, and whether its RSS comes back down once every agent has left.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use rustls::pki_types::ServerName;
use tether_grpc::H2Settings;
use tether_grpc::client::Channel;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::TlsConnector;

use super::Profile;
use crate::progress::{Progress, Ticker};
use crate::systems::Running;

#[derive(Clone, Copy, Debug)]
pub struct FanInResult {
    pub kib_per_agent: f64,
    /// What the server's `ready_backend_connections` gauge said, if it has one.
    pub server_counted: Option<f64>,
    /// Server CPU ms per agent per minute while all of them idle (when sampled).
    pub idle_cpu_ms_per_agent_min: Option<f64>,
    /// Server RSS after every agent left ÷ before they came.
    pub rss_after_ratio: f64,
}

/// A connected fake agent; dropping it disconnects: its stream and its connection end (the
/// connection's driver is aborted too, or the TCP connection would outlive the stream).
struct FakeAgent {
    _channel: Channel,
    _sender: tether_grpc::PacketSender,
    reader: tokio::task::JoinHandle<()>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.reader.abort();
        self.driver.abort();
    }
}

/// Small windows: the fake agent never carries data.
fn settings() -> H2Settings {
    H2Settings {
        stream_window: 65_535,
        connection_window: 65_535,
        max_frame_size: 16_384,
        max_send_buffer: 64 * 1024,
        max_concurrent_streams: 16,
        keepalive: None,
        idle_timeout: None,
    }
}

async fn connect(
    port: u16,
    tls: Arc<rustls::ClientConfig>,
    id: String,
) -> anyhow::Result<FakeAgent> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from("127.0.0.1").expect("valid name");
    let tls = TlsConnector::from(tls).connect(name, tcp).await?;
    let addr = format!("127.0.0.1:{port}");
    let (channel, driver) = Channel::handshake(tls, &settings(), &addr, true).await?;
    let driver = tokio::spawn(driver.run());
    let metadata = [
        (tether_proto::metadata::AGENT_ID, id),
        (tether_proto::metadata::TETHER_FLOW, "1048576".to_owned()),
    ];
    let (sender, mut receiver) = channel.call(tether_proto::path::CONNECT, &metadata).await?;
    receiver
        .response_headers()
        .await
        .context("Connect response headers")?;
    // Drain whatever the server sends (nothing, unless it dials) until the stream ends.
    let reader = tokio::spawn(async move { while let Some(Ok(_)) = receiver.next().await {} });
    Ok(FakeAgent {
        _channel: channel,
        _sender: sender,
        reader,
        driver,
    })
}

/// How long the server may take to forget every agent once they all left.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(60);

/// Waits until the server's gauge counts no agent, so the RSS after they left is measured
/// with every agent gone, not still closing.
async fn wait_until_none_counted(r: &Running, timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let counted = r
            .server_metric("konnectivity_network_proxy_server_ready_backend_connections")
            .await
            .unwrap_or(0.0);
        if counted == 0.0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("the server still counts {counted} agents {timeout:?} after they all left");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Connects `agents` fake agents, samples the server, and disconnects them; with
/// `sample_idle_cpu`, also samples the server's CPU for `p.idle_cpu_secs` while they idle.
pub async fn run(
    r: &Running,
    p: &Profile,
    agents: usize,
    sample_idle_cpu: bool,
    tls: Arc<rustls::ClientConfig>,
    progress: &Progress,
) -> anyhow::Result<FanInResult> {
    let port = r.agent_port.context("no agent port")?;
    tokio::time::sleep(p.settle).await;
    let before = r.server_rss().unwrap_or(0);
    let gate = Arc::new(Semaphore::new(p.open_concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..agents {
        let permit = gate.clone().acquire_owned().await?;
        let tls = tls.clone();
        tasks.spawn(async move {
            let id = format!("fake-{i}-{}", uuid::Uuid::new_v4());
            let agent = tokio::time::timeout(Duration::from_secs(20), connect(port, tls, id))
                .await
                .map_err(|_| anyhow::anyhow!("Connect timed out"))?;
            drop(permit);
            agent
        });
    }
    let mut connected = Vec::with_capacity(agents);
    let mut first_error = None;
    let mut errors = 0usize;
    let mut ticker = Ticker::new(Duration::from_secs(3));
    while let Some(joined) = tasks.join_next().await {
        match joined? {
            Ok(a) => connected.push(a),
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(e);
            }
        }
        if ticker.due() {
            progress.note(&format!("{} of {agents} agents connected", connected.len()));
        }
    }
    if let Some(e) = first_error {
        bail!("{errors} of {agents} fake agents failed; first: {e:#}");
    }
    tokio::time::sleep(p.settle).await;
    let after = r.server_rss().unwrap_or(0);
    let counted = r
        .server_metric("konnectivity_network_proxy_server_ready_backend_connections")
        .await;
    if let Some(c) = counted
        && (c as usize) < agents
    {
        bail!("the server counts {c} ready backends, {agents} agents connected");
    }
    for a in &connected {
        if a.reader.is_finished() {
            bail!("the server closed a fake agent's stream");
        }
    }
    let idle_cpu_ms_per_agent_min = match (sample_idle_cpu, r.server_cpu_seconds()) {
        (true, Some(cpu0)) => {
            progress.note(&format!(
                "sampling the server's CPU for {} s with {agents} idle agents",
                p.idle_cpu_secs
            ));
            tokio::time::sleep(Duration::from_secs_f64(p.idle_cpu_secs)).await;
            let cpu = r.server_cpu_seconds().context("server CPU")? - cpu0;
            Some(cpu * 1000.0 / agents as f64 * 60.0 / p.idle_cpu_secs)
        }
        _ => None,
    };
    drop(connected);
    // Every stream ends and the server forgets each agent; then what it keeps is the figure.
    if counted.is_some() {
        wait_until_none_counted(r, LEAVE_TIMEOUT).await?;
    }
    tokio::time::sleep(p.after_load).await;
    let left = r.server_rss().unwrap_or(0);
    Ok(FanInResult {
        kib_per_agent: (after as f64 - before as f64) / 1024.0 / agents as f64,
        server_counted: counted,
        idle_cpu_ms_per_agent_min,
        rss_after_ratio: left as f64 / before.max(1) as f64,
    })
}
