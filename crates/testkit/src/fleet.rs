//! Several in-process servers, each on its own loopback address (127.0.0.2, .3, …) and all
//! on one port, as a Service's pods are: for agents that reach each server directly.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use crate::{Pki, ServerOptions, TestServer};

/// The first member's last address byte; 127.0.0.1 is left to everything else.
const FIRST_HOST: u8 = 2;

/// Servers `server-2`, `server-3`, … on 127.0.0.2, .3, …, announcing their number.
#[derive(Debug)]
pub struct Fleet {
    pub pki: Pki,
    pub port: u16,
    pub servers: Vec<TestServer>,
}

impl Fleet {
    /// Starts `size` servers on a port free on all of their addresses.
    pub async fn start(size: u8) -> anyhow::Result<Self> {
        let pki = Pki::generate()?;
        let hosts = FIRST_HOST..FIRST_HOST + size;
        // A port taken from the first address, tried on the others; another process may
        // hold it on one of them, then the next port is tried.
        for _ in 0..20 {
            let port = tokio::net::TcpListener::bind(address(FIRST_HOST, 0))
                .await?
                .local_addr()?
                .port();
            let mut servers = Vec::new();
            for host in hosts.clone() {
                match TestServer::start(&pki, member(host, port, size)).await {
                    Ok(server) => servers.push(server),
                    Err(_) => break,
                }
            }
            if servers.len() == usize::from(size) {
                return Ok(Self { pki, port, servers });
            }
            for server in servers {
                server.stop().await;
            }
        }
        anyhow::bail!("no port free on all of 127.0.0.{hosts:?} in 20 tries")
    }

    /// Member `host`'s agent address (`host` is the address's last byte, from 2).
    pub fn address(&self, host: u8) -> SocketAddr {
        address(host, self.port)
    }

    /// Every member's agent address.
    pub fn addresses(&self) -> BTreeSet<SocketAddr> {
        self.servers.iter().map(|s| s.agent_addr).collect()
    }

    /// The options member `host` of a fleet of `size` starts with; a test that replaces a
    /// member starts from them.
    pub fn member(&self, host: u8) -> ServerOptions {
        member(host, self.port, self.servers.len() as u8)
    }
}

fn address(host: u8, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::from([127, 0, 0, host]), port)
}

fn member(host: u8, port: u16, size: u8) -> ServerOptions {
    ServerOptions {
        server_id: format!("server-{host}"),
        server_count: u32::from(size),
        agent_addr: Some(address(host, port)),
        ..Default::default()
    }
}
