//! Links to peer servers, offering this server's agents: the connecting side of server
//! peering. One keeper per peer address connects, announces every agent this server holds
//! and then each change, and answers the dials the peer forwards to them; when the link
//! breaks it connects again, backing off. This server's own address among the peers' is
//! found by its answer (its own server ID) and left alone.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tether_conn::{Keepalive, LogText};
use tether_proto::link::{self, Hello};
use tether_proto::metadata::{self, Metadata};
use tether_tunnel::{Event, FlowConfig, Hooks, Link, Role, SessionConfig, Transport, TransportEnd};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{PEER_ALPN, announce, forward};
use crate::dial::Hub;

/// How long connecting to a peer (TCP, TLS, HELLO and ACCEPT) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The first wait after a failed attempt, and the longest.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_CAP: Duration = Duration::from_secs(15);
/// How long the announcer lets changes gather before it sends them, so that a burst of
/// agents joining goes in a few packets.
const ANNOUNCE_GATHER: Duration = Duration::from_millis(50);
/// Packets the announcer leaves unsent on a link at most: a peer that does not read holds
/// back announcements, not memory.
const ANNOUNCE_BACKLOG: usize = 64;

/// What every outbound peer link shares.
#[derive(Debug)]
pub(crate) struct Outbound {
    pub(crate) hub: Arc<Hub>,
    pub(crate) tls: Arc<rustls::ClientConfig>,
    /// `--peer-name`: what every peer's certificate must name.
    pub(crate) name: ServerName<'static>,
    pub(crate) flow: FlowConfig,
    pub(crate) keepalive: Option<Keepalive>,
    /// `--backend-dial-timeout`: the longest a forwarded dial may take here.
    pub(crate) dial_timeout: Duration,
    /// The forwarded dials' tasks, waited for when the server stops.
    pub(crate) tasks: TaskTracker,
}

/// Starts the links to every peer of `peering` (on `tasks`, until `stop`), with the agent
/// links' flow, keepalive and dial timeout.
pub(crate) fn start(
    peering: &super::PeerConfig,
    settings: super::LinkSettings,
    hub: &Arc<Hub>,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) {
    let name = match ServerName::try_from(peering.name.clone()) {
        Ok(name) => name,
        // The binary checks --peer-name before the server is built.
        Err(e) => {
            tracing::error!(name = %peering.name, error = %e, "--peer-name is not a DNS name or IP address: no links to peers");
            return;
        }
    };
    let outbound = Arc::new(Outbound {
        hub: hub.clone(),
        tls: peering.client_tls.clone(),
        name,
        flow: settings.flow,
        keepalive: settings.keepalive,
        dial_timeout: settings.dial_timeout,
        tasks: TaskTracker::new(),
    });
    tasks.spawn(outbound.run(peering.addresses.clone(), stop.clone()));
}

/// A link just opened: the peer's server ID, its flow-control answer, and the link.
struct Opened {
    peer_id: String,
    flow: Option<String>,
    link: tether_link::Link,
}

impl Outbound {
    /// Keeps a link to every address `addresses` holds until `stop`.
    pub(crate) async fn run(
        self: Arc<Self>,
        mut addresses: watch::Receiver<BTreeSet<SocketAddr>>,
        stop: CancellationToken,
    ) {
        let keepers = TaskTracker::new();
        let mut kept: HashMap<SocketAddr, CancellationToken> = HashMap::new();
        loop {
            let now = addresses.borrow_and_update().clone();
            kept.retain(|address, keeper| {
                let keep = now.contains(address);
                if !keep {
                    keeper.cancel();
                }
                keep
            });
            for address in now {
                kept.entry(address).or_insert_with(|| {
                    let keeper = stop.child_token();
                    keepers.spawn(self.clone().keep(address, keeper.clone()));
                    keeper
                });
            }
            tokio::select! {
                () = stop.cancelled() => break,
                changed = addresses.changed() => if changed.is_err() {
                    stop.cancelled().await;
                    break;
                },
            }
        }
        keepers.close();
        keepers.wait().await;
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Holds a link to `address` until `keeper` is cancelled.
    async fn keep(self: Arc<Self>, address: SocketAddr, keeper: CancellationToken) {
        let mut wait = RETRY_FIRST;
        let mut warned = false;
        loop {
            let attempt = tokio::select! {
                () = keeper.cancelled() => return,
                attempt = tokio::time::timeout(CONNECT_TIMEOUT, self.connect(address)) => attempt,
            };
            match attempt {
                Ok(Ok(None)) => {
                    tracing::debug!(peer = %address, "this server's own peer address: no link to itself");
                    return keeper.cancelled().await;
                }
                Ok(Ok(Some(Opened {
                    peer_id,
                    flow,
                    link,
                }))) => {
                    wait = RETRY_FIRST;
                    warned = false;
                    let reason = self
                        .serve(address, &peer_id, flow.as_deref(), link, &keeper)
                        .await;
                    if keeper.is_cancelled() {
                        return;
                    }
                    tracing::info!(peer.server = %LogText(&peer_id), peer = %address, reason = %LogText(&reason), "link to peer server ended; connecting again");
                }
                Ok(Err(e)) if e == super::ALREADY_LINKED => {
                    // This server is linked to that peer through another of its addresses
                    // (or the peer has not yet seen an earlier link end): look again later.
                    tracing::debug!(peer = %address, "already linked to this peer server");
                }
                failed => {
                    let error = match failed {
                        Ok(Err(e)) => e,
                        _ => format!("timed out after {CONNECT_TIMEOUT:?}"),
                    };
                    if warned {
                        tracing::debug!(peer = %address, %error, "cannot link to peer server");
                    } else {
                        warned = true;
                        tracing::warn!(peer = %address, %error, "cannot link to peer server: its agents are not reachable through this server until it answers (check --peer-name, --peer-ca-cert and its --peer-port)");
                    }
                }
            }
            tokio::select! {
                () = keeper.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(RETRY_CAP);
        }
    }

    /// One attempt: TCP, TLS verifying `--peer-name`, HELLO, and the peer's answer; `None`
    /// when the address is this server's own.
    async fn connect(&self, address: SocketAddr) -> Result<Option<Opened>, String> {
        let tcp = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(self.name.clone(), tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        if tls.get_ref().1.alpn_protocol() != Some(PEER_ALPN) {
            return Err("the peer port did not choose ALPN tether-peer/1: is it a tether server's --peer-port?".into());
        }
        let mut metadata = Metadata::default();
        metadata.push(metadata::SERVER_ID, self.hub.server_id.clone());
        metadata.push(metadata::TETHER_VERSION, tether_observe::VERSION);
        let (key, value) = self.flow.announce();
        metadata.push(key, value);
        let hello = Hello {
            version: link::VERSION,
            capabilities: Vec::new(),
            metadata,
        };
        match tether_link::connect(tls, &hello).await {
            Ok((answer, link)) => {
                let peer_id = answer
                    .metadata
                    .get(metadata::SERVER_ID)
                    .unwrap_or_default()
                    .to_owned();
                if peer_id == self.hub.server_id {
                    return Ok(None);
                }
                if peer_id.is_empty() {
                    return Err("the peer's ACCEPT names no server ID".into());
                }
                let flow = answer
                    .metadata
                    .get(metadata::TETHER_FLOW)
                    .map(str::to_owned);
                Ok(Some(Opened {
                    peer_id,
                    flow,
                    link,
                }))
            }
            Err(tether_link::LinkError::Closed { message, .. }) if message == super::ITSELF => {
                Ok(None)
            }
            Err(tether_link::LinkError::Closed { message, .. })
                if message == super::ALREADY_LINKED =>
            {
                Err(message)
            }
            Err(e) => Err(format!("opening the link: {e}")),
        }
    }

    /// Runs one link until it ends or `keeper` is cancelled; returns why it ended.
    async fn serve(
        &self,
        address: SocketAddr,
        peer_id: &str,
        flow: Option<&str>,
        opened: tether_link::Link,
        keeper: &CancellationToken,
    ) -> String {
        let session = Link::new(
            SessionConfig {
                role: Role::Agent,
                flow: self.flow.negotiate(flow),
                dial_timeout: self.dial_timeout,
                // This side answers dials and dials none: no close of its own to wait for.
                close_timeout: crate::backend::service::CLOSE_TIMEOUT,
                limits: super::link_limits(),
                resumable: false,
                peering: true,
            },
            OfferHooks {
                hub: self.hub.clone(),
                tasks: self.tasks.clone(),
            },
        );
        let listed = self.hub.peer_links.add(
            crate::peer_links::Direction::Out,
            peer_id,
            address.to_string(),
            session.clone(),
            None,
        );
        tracing::info!(peer.server = %LogText(peer_id), "linked to peer server: offering this server's agents");
        let transport = Transport::native(opened.reader, opened.writer);
        let ended = async {
            keeper.cancelled().await;
            TransportEnd::Final("peer left the fleet, or the server is stopping".into())
        };
        let run = session.run_transport(transport, ended);
        let announce = announce_until_closed(&self.hub, &session, &listed.agents);
        let end = match self.keepalive {
            Some(keepalive) => {
                tokio::select! {
                    end = async {
                        let (end, ()) = tokio::join!(run, opened.handle.keep_alive(keepalive));
                        end
                    } => end,
                    () = announce => std::future::pending().await,
                }
            }
            None => tokio::select! {
                end = run => end,
                () = announce => std::future::pending().await,
            },
        };
        let reason = end.reason().to_owned();
        session.close(&reason);
        reason
    }
}

/// Announces this server's agents on `session`, all of them first, then every change,
/// until the link closes.
async fn announce_until_closed(hub: &Hub, session: &Arc<Link>, announced_count: &AtomicUsize) {
    let mut changes = hub.agents_changed.subscribe();
    let mut announced = announce::Announced::new();
    loop {
        changes.mark_unchanged();
        let now = announce::local_agents(&hub.running());
        for packet in announce::changes(&announced, &now) {
            // A peer that reads nothing holds back announcements, not memory.
            while session.inspect(|s| s.outbox_len()) > ANNOUNCE_BACKLOG {
                tokio::time::sleep(ANNOUNCE_GATHER).await;
                if session.inspect(|s| !s.is_open()) {
                    return;
                }
            }
            session.update(|s, _| s.announce_agents(packet));
        }
        announced = now;
        announced_count.store(announced.len(), Ordering::Relaxed);
        if session.inspect(|s| !s.is_open()) || changes.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(ANNOUNCE_GATHER).await;
    }
}

/// The hooks of an outbound peer link: each dial the peer forwards is served by
/// [`forward::serve`] on its own task.
#[derive(Debug)]
struct OfferHooks {
    hub: Arc<Hub>,
    tasks: TaskTracker,
}

impl Hooks for OfferHooks {
    fn on_event(&self, link: &Arc<Link>, event: Event) {
        if let Event::DialRequested {
            random,
            protocol,
            address,
            forward,
        } = event
        {
            let incoming = link.incoming_dial(random);
            match forward {
                Some(forward) => {
                    self.tasks.spawn(forward::serve(
                        incoming,
                        protocol,
                        address,
                        forward,
                        self.hub.clone(),
                    ));
                }
                None => incoming.fail(
                    "a peer link carries only dials forwarded to an agent (PEER_DIAL_REQ)".into(),
                ),
            }
        }
    }
}
