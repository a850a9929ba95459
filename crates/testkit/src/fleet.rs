//! Several in-process servers, each on its own loopback address (127.0.0.2, .3, …) and all
//! on one port, as a Service's pods are: for agents that reach each server directly, and,
//! peered, for servers that forward dials to each other.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use tokio::sync::watch;

use crate::{Peering, Pki, ServerOptions, TestServer};

/// The first member's last address byte; 127.0.0.1 is left to everything else.
const FIRST_HOST: u8 = 2;

/// Servers `server-2`, `server-3`, … on 127.0.0.2, .3, …, announcing their number.
#[derive(Debug)]
pub struct Fleet {
    pub pki: Pki,
    pub port: u16,
    pub servers: Vec<TestServer>,
    /// Peered: the peer port (on every member's address), and the peers' list the members
    /// follow (a test changes it as a Lease listing would).
    pub peers: Option<(u16, watch::Sender<BTreeSet<SocketAddr>>)>,
}

impl Fleet {
    /// Starts `size` servers on a port free on all of their addresses.
    pub async fn start(size: u8) -> anyhow::Result<Self> {
        Self::start_with(Pki::generate()?, size, false, |_, _| {}).await
    }

    /// Starts `size` servers peered with each other: each links to every member's peer
    /// port, its own included (which it finds to be itself).
    pub async fn start_peered(size: u8) -> anyhow::Result<Self> {
        Self::start_with(Pki::generate()?, size, true, |_, _| {}).await
    }

    /// As [`start`](Self::start) or (`peered`) [`start_peered`](Self::start_peered), on
    /// `pki`, with each member's options changed by `customize` (given its host byte).
    pub async fn start_with(
        pki: Pki,
        size: u8,
        peered: bool,
        customize: impl Fn(u8, &mut ServerOptions),
    ) -> anyhow::Result<Self> {
        let hosts = FIRST_HOST..FIRST_HOST + size;
        // Ports taken from the first address, tried on the others; another process may
        // hold one on one of them, then the next ports are tried.
        for _ in 0..20 {
            let free = || async {
                Ok::<_, anyhow::Error>(
                    tokio::net::TcpListener::bind(address(FIRST_HOST, 0))
                        .await?
                        .local_addr()?
                        .port(),
                )
            };
            let port = free().await?;
            let peers = match peered {
                true => {
                    let peer_port = free().await?;
                    let list = hosts.clone().map(|h| address(h, peer_port)).collect();
                    Some((peer_port, watch::Sender::new(list)))
                }
                false => None,
            };
            let mut servers = Vec::new();
            for host in hosts.clone() {
                let mut options = member(host, port, size);
                if let Some((peer_port, list)) = &peers {
                    options.peering = Some(Peering {
                        listen: address(host, *peer_port),
                        addresses: list.subscribe(),
                    });
                }
                customize(host, &mut options);
                match TestServer::start(&pki, options).await {
                    Ok(server) => servers.push(server),
                    Err(_) => break,
                }
            }
            if servers.len() == usize::from(size) {
                return Ok(Self {
                    pki,
                    port,
                    servers,
                    peers,
                });
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
        let mut options = member(host, self.port, self.servers.len() as u8);
        if let Some((peer_port, list)) = &self.peers {
            options.peering = Some(Peering {
                listen: address(host, *peer_port),
                addresses: list.subscribe(),
            });
        }
        options
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
