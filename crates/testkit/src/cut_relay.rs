//! A loopback TCP relay that a test can cut, standing in for a middlebox between an agent and
//! its server: a load balancer whose idle timeout fires, a NAT that forgets a flow, a blip.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Buffers of the kind a real proxy uses, so the relay is not the bottleneck.
const BUFFER: usize = 256 * 1024;

/// Forwards each accepted connection to `target` until [`cut`](Self::cut); aborted on drop.
#[derive(Debug)]
pub struct CuttingRelay {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

#[derive(Debug)]
struct State {
    target: SocketAddr,
    /// Bumped by every cut: connections of an older generation reset at once.
    generation: watch::Sender<u64>,
    /// New connections are reset at accept (an outage).
    refusing: AtomicBool,
    /// Connections forwarded so far.
    forwarded: AtomicU64,
}

impl CuttingRelay {
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            target,
            generation: watch::channel(0).0,
            refusing: AtomicBool::new(false),
            forwarded: AtomicU64::new(0),
        });
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if shared.refusing.load(Ordering::Acquire) {
                    reset(&inbound);
                    continue;
                }
                shared.forwarded.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(forward(inbound, shared.clone()));
            }
        });
        Ok(Self { addr, state, task })
    }

    /// Resets every connection through the relay now, both ways.
    pub fn cut(&self) {
        self.state.generation.send_modify(|g| *g += 1);
    }

    /// While on, connections are reset as soon as they are accepted.
    pub fn set_refusing(&self, refusing: bool) {
        self.state.refusing.store(refusing, Ordering::Release);
    }

    /// Connections forwarded so far (each agent reconnect is one).
    pub fn forwarded(&self) -> u64 {
        self.state.forwarded.load(Ordering::Relaxed)
    }
}

impl Drop for CuttingRelay {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

async fn forward(mut inbound: TcpStream, state: Arc<State>) {
    let mut cuts = state.generation.subscribe();
    let Ok(Ok(mut outbound)) =
        tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(state.target)).await
    else {
        reset(&inbound);
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional_with_sizes(&mut inbound, &mut outbound, BUFFER, BUFFER) => {}
        _ = cuts.changed() => {
            reset(&inbound);
            reset(&outbound);
        }
    }
}

/// SO_LINGER 0: closing sends RST, as a middlebox that drops a flow makes both ends see.
#[allow(deprecated)]
fn reset(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}
