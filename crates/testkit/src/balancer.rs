//! A round-robin TCP load balancer on loopback, standing in for the one that sits in front
//! of several proxy servers in an HA control plane.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Forwards each accepted connection to the next backend in turn; aborted on drop.
#[derive(Debug)]
pub struct LoadBalancer {
    pub addr: SocketAddr,
    backends: Arc<Mutex<Vec<SocketAddr>>>,
    task: JoinHandle<()>,
}

impl LoadBalancer {
    pub async fn start(backends: Vec<SocketAddr>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let backends = Arc::new(Mutex::new(backends));
        let next = AtomicUsize::new(0);
        let list = backends.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = {
                    let list = list.lock().expect("backend list");
                    if list.is_empty() {
                        continue;
                    }
                    list[next.fetch_add(1, Ordering::Relaxed) % list.len()]
                };
                tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            backends,
            task,
        })
    }

    /// Replaces the backend list (a server joined or left).
    pub fn set_backends(&self, backends: Vec<SocketAddr>) {
        *self.backends.lock().expect("backend list") = backends;
    }
}

impl Drop for LoadBalancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
