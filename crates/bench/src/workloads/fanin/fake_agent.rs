//! The fan-in's fake agent: one agent stream to the server over mutual TLS, on the link the
//! system's own agents use ([`Link`]): gRPC (`AgentService.Connect`) or tether's native link
//! (ALPN `tether/1`, then HELLO), either with an `agentid` and tether's flow control. It
//! answers the dials the server sends it itself (one loop for both links) and otherwise
//! idles. Thousands live in the bench process, so it keeps little: one task that reads and
//! answers (and on gRPC the connection's driver, with small HTTP/2 windows). By default it
//! sends no keepalive PING of its own (the fan-in measures the server); the fleet's
//! ([`Options`]) PING their servers as a tether agent does, count the keepalive frames both
//! ways, and one of them advertises an address to be dialed by (`destHost`).

use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use rustls::pki_types::ServerName;
use tether_grpc::client::Channel;
use tether_grpc::{H2Settings, Keepalive};
use tether_proto::link::{self, Hello};
use tether_proto::{ConnectId, Packet};
use tether_tunnel::Transport;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::frames::{Counted, PingCount};
use crate::systems::Impl;
use crate::target;

/// The link a fake agent speaks to the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// gRPC over HTTP/2, `AgentService.Connect`: what every Konnectivity server speaks.
    Grpc,
    /// tether's native link: packets framed on the TLS stream, no HTTP/2.
    Native,
    /// The native link inside WebSocket messages, after an HTTP/1.1 upgrade.
    WebSocket,
}

impl Link {
    /// The link `imp`'s own agents use: the native link for tether as it runs by default;
    /// WebSocket for tether-ws; gRPC for tether-h2 (its agents forced to it), for upstream (which speaks nothing else)
    /// and for the earlier build (which may predate the native link).
    pub fn of(imp: Impl) -> Self {
        match imp {
            Impl::Tether | Impl::TetherPeer => Self::Native,
            Impl::TetherWs => Self::WebSocket,
            Impl::TetherH2 | Impl::TetherBefore | Impl::Upstream => Self::Grpc,
        }
    }

    /// The one ALPN id a fake agent offers: the server takes this link or none.
    pub fn alpn(self) -> &'static [u8] {
        match self {
            Self::Grpc => b"h2",
            Self::Native => link::ALPN,
            Self::WebSocket => b"http/1.1",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Grpc => "gRPC",
            Self::Native => "the native link",
            Self::WebSocket => "the WebSocket link",
        }
    }
}

/// A connected fake agent; dropping it disconnects: its tasks are aborted, and with them go
/// its stream and its TCP connection.
pub struct FakeAgent {
    /// Reads the server's packets and answers them; ends when the stream does.
    answering: JoinHandle<()>,
    /// gRPC only: the HTTP/2 connection's handle and its driver, which would outlive the
    /// stream. The native link's stream is its connection, which `answering` holds.
    http2: Option<(Channel, JoinHandle<()>)>,
    /// Dials it answered.
    dials: Arc<AtomicU64>,
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.answering.abort();
        if let Some((_, driver)) = &self.http2 {
            driver.abort();
        }
    }
}

/// What a fake agent does besides answering dials (nothing, by default).
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// PINGs its server like a tether agent (`--server-ping-interval`,
    /// `--server-ping-timeout`); the native link only.
    pub keepalive: Option<Keepalive>,
    /// Counts the keepalive frames of its stream, both ways; the native link only.
    pub pings: Option<Arc<PingCount>>,
    /// `agentidentifiers` (e.g. `ipv4=127.0.1.1`): an address the `destHost` strategy
    /// routes to this agent.
    pub identifiers: Option<String>,
}

impl FakeAgent {
    /// Connects to the server's agent port `port` on 127.0.0.1, on `link`, as agent `id`;
    /// `tls` offers [`Link::alpn`].
    pub async fn connect(
        link: Link,
        port: u16,
        tls: Arc<rustls::ClientConfig>,
        id: String,
    ) -> anyhow::Result<Self> {
        let server = SocketAddr::from(([127, 0, 0, 1], port));
        Self::connect_with(link, server, tls, id, &Options::default()).await
    }

    /// Connects to the agent port at `server` on `link` as agent `id`, doing what `options`
    /// ask; `tls` offers [`Link::alpn`] and verifies the server's certificate as 127.0.0.1's.
    pub async fn connect_with(
        link: Link,
        server: SocketAddr,
        tls: Arc<rustls::ClientConfig>,
        id: String,
        options: &Options,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            link == Link::Native || (options.keepalive.is_none() && options.pings.is_none()),
            "a fake agent PINGs and counts PINGs on the native link only"
        );
        let tcp = TcpStream::connect(server).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from("127.0.0.1").expect("valid name");
        let tls = TlsConnector::from(tls).connect(name, tcp).await?;
        let mut metadata = vec![
            (tether_proto::metadata::AGENT_ID, id),
            (tether_proto::metadata::TETHER_FLOW, "1048576".to_owned()),
        ];
        if let Some(ids) = &options.identifiers {
            metadata.push((tether_proto::metadata::AGENT_IDENTIFIERS, ids.clone()));
        }
        let dials = Arc::new(AtomicU64::new(0));
        let service = EchoService::new(dials.clone());
        let (answering, http2) = match link {
            Link::Grpc => {
                let (transport, http2) = open_grpc(tls, server, &metadata).await?;
                let answering = tokio::spawn(serve(transport, service, std::future::pending()));
                (answering, Some(http2))
            }
            Link::Native | Link::WebSocket => {
                let (transport, handle) = match &options.pings {
                    Some(count) => {
                        open_native(link, Counted::new(tls, count.clone()), &metadata).await?
                    }
                    None => open_native(link, tls, &metadata).await?,
                };
                let answering = match options.keepalive {
                    // The keepalive runs in the answering task: no task more per agent. It
                    // ends when a PING goes unanswered, and the stream with it.
                    Some(keepalive) => {
                        tokio::spawn(serve(transport, service, handle.keep_alive(keepalive)))
                    }
                    None => tokio::spawn(serve(transport, service, std::future::pending())),
                };
                (answering, None)
            }
        };
        Ok(Self {
            answering,
            http2,
            dials,
        })
    }

    /// Dials it answered so far.
    pub fn dials(&self) -> u64 {
        self.dials.load(Ordering::Relaxed)
    }

    /// Whether its stream ended: the server closed it.
    pub fn is_gone(&self) -> bool {
        self.answering.is_finished()
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
        window_on_accept: false,
        partial_message_budget: None,
    }
}

/// Opens `AgentService.Connect` with `metadata` on a new HTTP/2 connection over `tls`.
async fn open_grpc(
    tls: TlsStream<TcpStream>,
    server: SocketAddr,
    metadata: &[(&'static str, String)],
) -> anyhow::Result<(Transport, (Channel, JoinHandle<()>))> {
    let addr = server.to_string();
    let (channel, driver) = Channel::handshake(tls, &settings(), &addr, true).await?;
    let driver = tokio::spawn(driver.run());
    let (sender, mut receiver) = channel.call(tether_proto::path::CONNECT, metadata).await?;
    receiver
        .response_headers()
        .await
        .context("Connect response headers")?;
    Ok((Transport::grpc(sender, receiver), (channel, driver)))
}

/// A TLS stream, maybe inside a keepalive counter: what the native link runs on.
trait TlsIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {
    fn alpn(&self) -> Option<&[u8]>;
}

impl TlsIo for TlsStream<TcpStream> {
    fn alpn(&self) -> Option<&[u8]> {
        self.get_ref().1.alpn_protocol()
    }
}

impl TlsIo for Counted<TlsStream<TcpStream>> {
    fn alpn(&self) -> Option<&[u8]> {
        self.get_ref().alpn()
    }
}

/// Opens the native link (`link`: directly, or in WebSocket messages) over `tls`, on which
/// the server must have chosen it: HELLO (or the upgrade) with `metadata`, then its answer.
/// Returns the stream and the link's handle (its keepalive).
async fn open_native(
    link: Link,
    tls: impl TlsIo,
    metadata: &[(&'static str, String)],
) -> anyhow::Result<(Transport, tether_link::LinkHandle)> {
    anyhow::ensure!(
        tls.alpn() == Some(link.alpn()),
        "the server did not choose {}",
        link.name()
    );
    let hello = Hello {
        version: link::VERSION,
        capabilities: Vec::new(),
        metadata: metadata
            .iter()
            .map(|(key, value)| (*key, bytes::Bytes::from(value.clone())))
            .collect(),
    };
    let opened = match link {
        Link::WebSocket => {
            let upgrade = tether_link::Upgrade {
                host: "127.0.0.1".to_owned(),
                path: "/".to_owned(),
            };
            tether_link::connect_websocket(tls, &upgrade, &hello).await
        }
        Link::Native | Link::Grpc => tether_link::connect(tls, &hello).await,
    };
    let (_accepted, opened) = opened.with_context(|| format!("{} handshake", link.name()))?;
    Ok((
        Transport::native(opened.reader, opened.writer),
        opened.handle,
    ))
}

/// Answers the server's packets on `transport` with `service` until the stream ends, or
/// `keepalive` does (it gave the server up).
async fn serve(
    transport: Transport,
    mut service: EchoService,
    keepalive: impl Future<Output = ()>,
) {
    let (mut reader, mut writer) = transport.into_split();
    let mut keepalive = std::pin::pin!(keepalive);
    loop {
        let packet = tokio::select! {
            () = &mut keepalive => return,
            packet = reader.next() => match packet {
                Some(Ok(packet)) => packet,
                _ => return,
            },
            // The native link's PONG to the server's keepalive PING, or the agent's own PING:
            // the writer sends it, or the server gives the agent up (never on gRPC, whose
            // driver answers PINGs).
            () = writer.wants_flush() => {
                if writer.flush().await.is_err() {
                    return;
                }
                continue;
            }
        };
        let Some(reply) = service.answer(packet) else {
            continue;
        };
        writer.buffer(&reply);
        if writer.flush().await.is_err() {
            return;
        }
    }
}

/// What the fake agent answers, as the target's echo mode would: every dial succeeds at once,
/// the first byte of a connection picks the mode (only echo is served), everything after it
/// comes back as it came, and a close is confirmed.
struct EchoService {
    last_id: i64,
    /// Connections whose mode byte has not come yet.
    fresh: HashSet<i64>,
    /// Dials answered.
    dials: Arc<AtomicU64>,
}

impl EchoService {
    fn new(dials: Arc<AtomicU64>) -> Self {
        Self {
            last_id: 0,
            fresh: HashSet::new(),
            dials,
        }
    }

    /// The answer to `packet`, if it needs one.
    fn answer(&mut self, packet: Packet) -> Option<Packet> {
        match packet {
            Packet::DialRequest { random, .. } => {
                self.dials.fetch_add(1, Ordering::Relaxed);
                self.last_id += 1;
                self.fresh.insert(self.last_id);
                Some(Packet::DialResponse {
                    random,
                    result: Ok(ConnectId(self.last_id)),
                })
            }
            Packet::Data {
                connect_id,
                mut data,
            } => {
                if self.fresh.remove(&connect_id.0) {
                    if data.first() != Some(&target::ECHO) {
                        let error = Some("a fake agent serves only the echo mode".to_owned());
                        return Some(Packet::CloseResponse { connect_id, error });
                    }
                    data = data.slice(1..);
                }
                (!data.is_empty()).then_some(Packet::Data { connect_id, data })
            }
            Packet::CloseRequest { connect_id } => {
                self.fresh.remove(&connect_id.0);
                Some(Packet::CloseResponse {
                    connect_id,
                    error: None,
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tether_proto::DialId;

    use super::*;

    fn data(id: i64, bytes: &'static [u8]) -> Packet {
        Packet::Data {
            connect_id: ConnectId(id),
            data: Bytes::from_static(bytes),
        }
    }

    fn dial(random: i64) -> Packet {
        Packet::DialRequest {
            protocol: "tcp".into(),
            address: "127.0.0.1:1".into(),
            random: DialId(random),
        }
    }

    /// Dials succeed with new IDs, the mode byte is taken off the first DATA, later ones come
    /// back whole, and closes are confirmed.
    #[test]
    fn echoes_after_the_mode_byte_and_confirms_closes() {
        let dials = Arc::new(AtomicU64::new(0));
        let mut service = EchoService::new(dials.clone());
        assert_eq!(
            service.answer(dial(7)),
            Some(Packet::DialResponse {
                random: DialId(7),
                result: Ok(ConnectId(1)),
            })
        );
        assert_eq!(service.answer(data(1, b"E")), None, "only the mode byte");
        assert_eq!(service.answer(data(1, b"Eab")), Some(data(1, b"Eab")));
        assert_eq!(
            service.answer(Packet::CloseRequest {
                connect_id: ConnectId(1)
            }),
            Some(Packet::CloseResponse {
                connect_id: ConnectId(1),
                error: None,
            })
        );
        service.answer(dial(8));
        assert!(
            matches!(
                service.answer(data(2, b"Sxy")),
                Some(Packet::CloseResponse {
                    connect_id: ConnectId(2),
                    error: Some(_),
                })
            ),
            "a mode other than echo is refused"
        );
        assert_eq!(dials.load(Ordering::Relaxed), 2);
    }
}
