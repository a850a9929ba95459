//! A loopback TCP relay that a test can cut, standing in for a middlebox between an agent and
//! its server: a load balancer whose idle timeout fires, a NAT that forgets a flow, a blip.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Buffers of the kind a real proxy uses, so the relay is not the bottleneck.
const BUFFER: usize = 256 * 1024;

/// What the connections forwarded between two cuts share.
#[derive(Debug, Default)]
struct Generation {
    /// Cancelled by the cut that ends this generation.
    cut: CancellationToken,
    /// Their forwarding tasks; each one's sockets are closed when it finishes.
    forwards: TaskTracker,
}

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
    /// The connections forwarded since the last cut.
    generation: Mutex<Generation>,
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
            generation: Mutex::new(Generation::default()),
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
                shared.forward(inbound);
            }
        });
        Ok(Self { addr, state, task })
    }

    /// Resets every connection through the relay, both ways, and returns once all of them
    /// are closed: nothing either end writes after the cut reaches the other.
    pub async fn cut(&self) {
        let Generation { cut, forwards } = self.state.next_generation();
        cut.cancel();
        forwards.close();
        // Each forward resets its sockets as soon as it is polled; 10 s is far beyond that.
        let closed = tokio::time::timeout(Duration::from_secs(10), forwards.wait()).await;
        assert!(
            closed.is_ok(),
            "the relay's connections did not close within 10 s of the cut"
        );
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

impl State {
    /// Starts a new generation and hands back the one it ends.
    fn next_generation(&self) -> Generation {
        let mut current = self
            .generation
            .lock()
            .expect("the relay's lock is never poisoned");
        std::mem::take(&mut *current)
    }

    /// Forwards a connection accepted now, in the current generation.
    fn forward(&self, inbound: TcpStream) {
        let current = self
            .generation
            .lock()
            .expect("the relay's lock is never poisoned");
        let cut = current.cut.clone();
        current.forwards.spawn(forward(inbound, self.target, cut));
    }
}

impl Drop for CuttingRelay {
    fn drop(&mut self) {
        self.task.abort();
        self.state.next_generation().cut.cancel();
    }
}

/// Copies both ways until either end closes, or resets both on `cut`.
async fn forward(mut inbound: TcpStream, target: SocketAddr, cut: CancellationToken) {
    let connect = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(target));
    let outbound = tokio::select! {
        biased;
        () = cut.cancelled() => Err(()),
        connected = connect => connected.map_err(drop).and_then(|c| c.map_err(drop)),
    };
    let Ok(mut outbound) = outbound else {
        reset(&inbound);
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        biased;
        () = cut.cancelled() => {
            reset(&inbound);
            reset(&outbound);
        }
        _ = tokio::io::copy_bidirectional_with_sizes(&mut inbound, &mut outbound, BUFFER, BUFFER) => {}
    }
}

/// SO_LINGER 0: closing sends RST, as a middlebox that drops a flow makes both ends see.
#[allow(deprecated)]
fn reset(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}
