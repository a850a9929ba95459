//! How a workload reaches the target through a system, on its own so that the systems'
//! modules build one without using the module that starts them.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::bail;
use tether_client::{GrpcClient, Transport};
use tokio::net::TcpStream;

use crate::target::BoxStream;

/// How a workload opens a connection to the target through a system.
#[derive(Clone, Debug)]
pub enum Dialer {
    /// Plain TCP to an address: the target itself, or an SSH forward.
    Tcp(SocketAddr),
    HttpConnect(Transport, String),
    Grpc(GrpcClient, String),
}

impl Dialer {
    pub async fn dial(&self) -> anyhow::Result<BoxStream> {
        Ok(match self {
            Dialer::Tcp(addr) => {
                let s = TcpStream::connect(addr).await?;
                s.set_nodelay(true)?;
                Box::new(s)
            }
            Dialer::HttpConnect(transport, addr) => {
                Box::new(tether_client::dial_http_connect(transport, addr).await?)
            }
            Dialer::Grpc(client, addr) => Box::new(client.dial(addr).await?),
        })
    }

    /// The same way through the system, to another target. A TCP dialer's address is the
    /// system's entry (an SSH forward, a relay), which fixes the target itself.
    pub fn aimed_at(&self, target: SocketAddr) -> anyhow::Result<Dialer> {
        Ok(match self {
            Dialer::Tcp(_) => bail!("a plain TCP entry cannot be aimed at another target"),
            Dialer::HttpConnect(transport, _) => {
                Dialer::HttpConnect(transport.clone(), target.to_string())
            }
            Dialer::Grpc(client, _) => Dialer::Grpc(client.clone(), target.to_string()),
        })
    }

    /// Dial with a deadline.
    pub async fn dial_timeout(&self, timeout: Duration) -> anyhow::Result<BoxStream> {
        match tokio::time::timeout(timeout, self.dial()).await {
            Ok(r) => r,
            Err(_) => bail!("dial timed out after {timeout:?}"),
        }
    }
}
