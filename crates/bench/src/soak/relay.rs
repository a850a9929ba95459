//! A TCP relay in front of one server, or of several in turn (a round-robin balancer, for
//! an agent that reaches every server through one address), for one agent: the soak cuts
//! an agent's links here. A cut resets every connection through it at once (the agent sees
//! its stream broken, not ended) and resets new ones until it heals.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// A relay listening on loopback; dropping it stops it and every connection through it.
#[derive(Debug)]
pub struct Relay {
    pub addr: SocketAddr,
    cuts: watch::Sender<u64>,
    refuse_until: Arc<Mutex<Option<Instant>>>,
    task: JoinHandle<()>,
}

impl Relay {
    /// A relay to `to`, each new connection to the next of them.
    pub async fn start(to: Vec<SocketAddr>) -> anyhow::Result<Relay> {
        anyhow::ensure!(!to.is_empty(), "a relay to nowhere");
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cuts = watch::Sender::new(0u64);
        let refuse_until = Arc::new(Mutex::new(None));
        let task = tokio::spawn(accept(listener, to, cuts.clone(), refuse_until.clone()));
        Ok(Relay {
            addr,
            cuts,
            refuse_until,
            task,
        })
    }

    /// Resets every connection through the relay now, and every new one for `hold`.
    pub fn cut(&self, hold: Duration) {
        *self.refuse_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + hold);
        self.cuts.send_modify(|n| *n += 1);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(
    listener: TcpListener,
    to: Vec<SocketAddr>,
    cuts: watch::Sender<u64>,
    refuse_until: Arc<Mutex<Option<Instant>>>,
) {
    let mut pairs = JoinSet::new();
    let mut next = 0;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let refusing = refuse_until
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_some_and(|until| Instant::now() < until);
                if refusing {
                    tether_tunnel::reset_on_close(&client);
                    continue;
                }
                pairs.spawn(forward(client, to[next % to.len()], cuts.subscribe()));
                next += 1;
            }
            // Reaps finished pairs, so the set stays as large as the open connections.
            Some(_) = pairs.join_next(), if !pairs.is_empty() => {}
        }
    }
}

/// Copies both ways until either side ends or the relay is cut, which resets both.
async fn forward(mut client: TcpStream, to: SocketAddr, mut cuts: watch::Receiver<u64>) {
    let connected = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(to)).await;
    let Ok(Ok(mut server)) = connected else {
        tether_tunnel::reset_on_close(&client);
        return;
    };
    // Subscribed at accept: a cut seen now, even one made while connecting, is this
    // connection's.
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = cuts.changed() => {
            tether_tunnel::reset_on_close(&client);
            tether_tunnel::reset_on_close(&server);
        }
    }
}
