//! Two [`Link`]s back to back, a server-role one and an agent-role one, over either transport
//! kind on an in-memory duplex: the native link (`tether_link::connect` against `read_hello`
//! and `accept`) or gRPC (an h2 `Channel` against `serve_connection`). Around them: hooks
//! that record what each end saw, an echo server and sockets on 127.0.0.1, a hand-driven
//! native peer that writes raw frames, and bounded waits.
//!
//! Every wait here is bounded by [`LIMIT`]; a test never sleeps to synchronise.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tether_grpc::client::Channel;
use tether_grpc::server::{Connection, serve_connection};
use tether_grpc::{GrpcError, H2Settings, LastPong};
use tether_link::LinkHandle;
use tether_proto::link::{self, Frame, Hello};
use tether_proto::{DialId, Packet};
use tether_tunnel::{
    CloseError, Closed, ConnEvent, Direction, Ended, Event, Flow, FlowConfig, Hooks, IncomingDial,
    Limits, Link, PendingDial, Role, SessionConfig, Transport, TransportEnd, TransportError,
    Tunnel, TunnelDown, TunnelUp, relay_tcp,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};

/// The bound on every single wait of a test: far above what any step takes, even on a
/// loaded machine, so that only a hang reaches it.
pub const LIMIT: Duration = Duration::from_secs(20);
/// Room in each direction of the in-memory byte stream between the two ends.
const DUPLEX_BYTES: usize = 256 * 1024;
/// Both tables' dial and close deadlines: no test waits for one.
const DEADLINE: Duration = Duration::from_secs(30);

/// Declares each named `async fn name(kind: Kind)` of the test file as three tests,
/// `name::native`, `name::websocket` and `name::grpc`, one per transport, on a
/// multi-threaded runtime.
#[allow(unused_macros)] // not every test file runs on every transport
macro_rules! on_both_transports {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn native() {
                super::$name($crate::common::Kind::Native).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn websocket() {
                super::$name($crate::common::Kind::WebSocket).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn grpc() {
                super::$name($crate::common::Kind::Grpc).await;
            }
        }
    )+};
}

/// As [`on_both_transports`], on tokio's paused clock: a current-thread runtime whose time
/// moves only when every task waits, straight to the next deadline. A test then takes no
/// real time for its deadlines and can check the instant each thing happened.
#[allow(unused_macros)]
macro_rules! paused_on_both_transports {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[tokio::test(start_paused = true)]
            async fn native() {
                super::$name($crate::common::Kind::Native).await;
            }

            #[tokio::test(start_paused = true)]
            async fn websocket() {
                super::$name($crate::common::Kind::WebSocket).await;
            }

            #[tokio::test(start_paused = true)]
            async fn grpc() {
                super::$name($crate::common::Kind::Grpc).await;
            }
        }
    )+};
}

/// `fut`'s output, or a panic naming `what` once [`LIMIT`] passed.
pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(LIMIT, fut).await {
        Ok(output) => output,
        Err(_) => panic!("{what}: not done within {LIMIT:?}"),
    }
}

/// Waits for `done` to hold, checking it every few milliseconds, for at most [`LIMIT`]. For
/// state that has no notification of its own (a table's contents, a PONG's time).
pub async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    within(what, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

/// The transport an agent stream runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Native,
    /// The native link inside WebSocket messages, after an HTTP/1.1 upgrade.
    WebSocket,
    Grpc,
}

/// How a link's peer names an end of `role` ("server closed the stream").
pub fn name(role: Role) -> &'static str {
    match role {
        Role::Server => "server",
        Role::Agent => "agent",
    }
}

/// The role at the other end of a stream.
pub fn peer_of(role: Role) -> Role {
    match role {
        Role::Server => Role::Agent,
        Role::Agent => Role::Server,
    }
}

/// Credit flow control with `window` bytes granted each way, as two tether ends negotiate.
pub fn credit(window: u32) -> Flow {
    FlowConfig {
        window,
        ..FlowConfig::default()
    }
    .negotiate(Some(&window.to_string()))
}

/// A table's settings for `role` with `flow`: deadlines far beyond any test's wait, not
/// resumable, not a peer link.
pub fn session_config(role: Role, flow: Flow) -> SessionConfig {
    SessionConfig {
        role,
        flow,
        dial_timeout: DEADLINE,
        close_timeout: DEADLINE,
        limits: Limits::default(),
        resumable: false,
        peering: false,
    }
}

/// Credit flow with the default window.
pub fn default_flow() -> Flow {
    credit(FlowConfig::default().window)
}

/// A dial the agent-role link was asked for, as its hooks received it.
#[derive(Debug)]
pub struct Requested {
    pub dial: IncomingDial,
    pub address: String,
}

/// What one end's hooks saw.
#[derive(Debug, Default)]
pub struct Recorder {
    bad_packets: AtomicUsize,
    /// Connections opened and not yet ended, as a metrics gauge counts them.
    open: AtomicI64,
    ended: Mutex<Vec<Ended>>,
    packets_in: Mutex<HashMap<&'static str, usize>>,
    stream_errors: Mutex<Vec<(Direction, String)>>,
    dials: Mutex<Option<mpsc::UnboundedSender<Requested>>>,
}

impl Recorder {
    pub fn bad_packets(&self) -> usize {
        self.bad_packets.load(Ordering::SeqCst)
    }

    pub fn open(&self) -> i64 {
        self.open.load(Ordering::SeqCst)
    }

    /// Every connection end, in order.
    pub fn ended(&self) -> Vec<Ended> {
        self.ended.lock().unwrap().clone()
    }

    /// How many packets of `type_name` (`"DATA"`, `"CREDIT"`, ...) came from the peer.
    pub fn packets_in(&self, type_name: &str) -> usize {
        self.packets_in
            .lock()
            .unwrap()
            .get(type_name)
            .copied()
            .unwrap_or(0)
    }

    pub fn stream_errors(&self) -> Vec<(Direction, String)> {
        self.stream_errors.lock().unwrap().clone()
    }
}

/// The hooks of a test link: everything goes to its [`Recorder`]; a dial the peer asks for
/// goes to the test, which answers it.
#[derive(Debug)]
struct Recording(Arc<Recorder>);

impl Hooks for Recording {
    fn on_event(&self, link: &Arc<Link>, event: Event) {
        let rec = &self.0;
        match event {
            Event::DialRequested {
                random, address, ..
            } => {
                let dial = link.incoming_dial(random);
                // With nobody to answer, dropping the handle fails the dial.
                if let Some(dials) = &*rec.dials.lock().unwrap() {
                    let _ = dials.send(Requested { dial, address });
                }
            }
            Event::Opened(_) => {
                rec.open.fetch_add(1, Ordering::SeqCst);
            }
            Event::Ended(ended) => {
                // Recorded before the count falls: a test that saw it fall finds the record.
                rec.ended.lock().unwrap().push(ended);
                rec.open.fetch_sub(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }

    fn on_packet(&self, direction: Direction, packet: &Packet) {
        if direction == Direction::In {
            *self
                .0
                .packets_in
                .lock()
                .unwrap()
                .entry(packet.type_name())
                .or_default() += 1;
        }
    }

    fn on_bad_packet(&self, _error: &TransportError) {
        self.0.bad_packets.fetch_add(1, Ordering::SeqCst);
    }

    fn on_stream_error(&self, direction: Direction, error: &TransportError) {
        self.0
            .stream_errors
            .lock()
            .unwrap()
            .push((direction, error.to_string()));
    }
}

/// One end of the stream: its link, what its hooks saw, and its `run_transport` task.
#[derive(Debug)]
pub struct Side {
    pub link: Arc<Link>,
    pub rec: Arc<Recorder>,
    dials: mpsc::UnboundedReceiver<Requested>,
    stop: Option<oneshot::Sender<TransportEnd>>,
    run: Option<JoinHandle<TransportEnd>>,
}

impl Side {
    /// A link of `role`, not yet running a transport.
    pub fn new(role: Role, flow: Flow) -> Self {
        Self::with_config(session_config(role, flow))
    }

    /// A link with `config`, not yet running a transport.
    pub fn with_config(config: SessionConfig) -> Self {
        let (dials_tx, dials) = mpsc::unbounded_channel();
        let rec = Arc::new(Recorder {
            dials: Mutex::new(Some(dials_tx)),
            ..Recorder::default()
        });
        Self {
            link: Link::new(config, Recording(rec.clone())),
            rec,
            dials,
            stop: None,
            run: None,
        }
    }

    /// Runs `transport` on its own task until it ends or [`stop`](Self::stop) is called.
    pub fn run(&mut self, transport: Transport) {
        assert!(self.run.is_none(), "one transport at a time");
        let (stop, stopped) = oneshot::channel();
        let link = self.link.clone();
        self.stop = Some(stop);
        self.run = Some(tokio::spawn(async move {
            link.run_transport(transport, async {
                match stopped.await {
                    Ok(end) => end,
                    // The side was dropped: it never stops on its own.
                    Err(_) => std::future::pending().await,
                }
            })
            .await
        }));
    }

    /// Makes `run_transport`'s `stop` resolve with `end`.
    pub fn stop(&mut self, end: TransportEnd) {
        let stop = self.stop.take().expect("running, and not stopped yet");
        stop.send(end)
            .expect("run_transport still waits for its stop");
    }

    /// Drops `run_transport`'s future while it runs, as an aborted owner task does.
    pub async fn abort_run(&mut self) {
        let run = self.run.take().expect("a transport was run");
        run.abort();
        let aborted = within("the aborted run_transport's task to end", run).await;
        assert!(aborted.is_err_and(|e| e.is_cancelled()), "it was running");
    }

    /// Whether `run_transport` has not returned yet.
    pub fn is_running(&self) -> bool {
        self.run.as_ref().is_some_and(|run| !run.is_finished())
    }

    /// How the transport ended (waits for it).
    pub async fn ended(&mut self) -> TransportEnd {
        let run = self.run.take().expect("a transport was run");
        within("run_transport's end", run)
            .await
            .expect("run_transport does not panic")
    }

    /// The next dial the peer asked this end for.
    pub async fn next_dial(&mut self) -> Requested {
        within("a dial request", self.dials.recv())
            .await
            .expect("the hooks keep their sender")
    }

    /// Whether the table holds no connection and no dial.
    pub fn is_idle(&self) -> bool {
        self.link
            .inspect(|s| s.connection_count() == 0 && s.pending_dial_count() == 0)
    }

    /// Waits until the table is empty and every connection opened has ended (the hooks hear
    /// of an end just after the table changed, outside its lock).
    pub async fn assert_idle(&self, who: &str) {
        let emptied = tokio::time::timeout(LIMIT, async {
            while !self.is_idle() || self.rec.open() != 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        if emptied.await.is_err() {
            let (conns, dials) = self
                .link
                .inspect(|s| (s.connections().collect::<Vec<_>>(), s.pending_dials()));
            let open = self.rec.open();
            panic!(
                "{who} is not idle after {LIMIT:?}: {open} open by its hooks' count, \
                 {conns:#?} {dials:#?}"
            );
        }
        assert_eq!(
            self.link.inspect(|s| s.queued_bytes()),
            0,
            "{who}: bytes left queued"
        );
    }
}

/// What lies under the two transports, to be wound down at the end of a test.
#[derive(Debug)]
pub enum Wire {
    Native {
        server: LinkHandle,
        agent: LinkHandle,
    },
    Grpc {
        channel: Channel,
        driver: JoinHandle<()>,
        serving: JoinHandle<Result<(), GrpcError>>,
    },
}

impl Wire {
    /// Waits for the connection under the transports to be over once both transports are
    /// gone (gRPC: the client's channel is dropped here; its driver and the server's
    /// connection task end).
    pub async fn finished(self) {
        match self {
            Self::Native { server, agent } => {
                within("the server's native link to end", server.ended()).await;
                within("the agent's native link to end", agent.ended()).await;
            }
            Self::Grpc {
                channel,
                driver,
                serving,
            } => {
                drop(channel);
                within("the h2 client's driver to end", driver)
                    .await
                    .expect("the driver does not panic");
                within("the h2 server's connection to end", serving)
                    .await
                    .expect("serve_connection does not panic")
                    .expect("the h2 connection ends without error");
            }
        }
    }
}

/// Both ends' transports over one in-memory byte stream.
#[derive(Debug)]
pub struct Transports {
    pub server: Transport,
    pub agent: Transport,
    pub wire: Wire,
}

/// An in-memory byte stream: (the agent's end, the server's end).
pub fn duplex() -> (DuplexStream, DuplexStream) {
    tokio::io::duplex(DUPLEX_BYTES)
}

/// Opens both ends of one agent stream of `kind`.
pub async fn transports(kind: Kind) -> Transports {
    let (agent_io, server_io) = duplex();
    match kind {
        Kind::Native | Kind::WebSocket => {
            let ((agent, agent_handle), (server, server_handle)) =
                tokio::join!(link_agent(kind, agent_io), link_server(kind, server_io));
            Transports {
                server,
                agent,
                wire: Wire::Native {
                    server: server_handle,
                    agent: agent_handle,
                },
            }
        }
        Kind::Grpc => grpc(agent_io, server_io).await,
    }
}

/// The HELLO and ACCEPT of a test link: this build's version, nothing else.
pub fn hello() -> Hello {
    Hello {
        version: link::VERSION,
        ..Hello::default()
    }
}

/// The agent's side of a native link on `io`, directly or (`Kind::WebSocket`) in WebSocket
/// messages after the upgrade.
async fn link_agent(kind: Kind, io: DuplexStream) -> (Transport, LinkHandle) {
    let hello = hello();
    let opened = if kind == Kind::WebSocket {
        let upgrade = tether_link::Upgrade {
            host: "tether.test".to_owned(),
            path: "/".to_owned(),
        };
        within(
            "the server's 101",
            tether_link::connect_websocket(io, &upgrade, &hello),
        )
        .await
    } else {
        within("the server's ACCEPT", tether_link::connect(io, &hello)).await
    };
    let (answer, link) = opened.expect("the server accepts");
    assert_eq!(answer.version, link::VERSION);
    (Transport::native(link.reader, link.writer), link.handle)
}

/// The server's side of [`link_agent`]: the agent's HELLO or upgrade, then its answer.
async fn link_server(kind: Kind, io: DuplexStream) -> (Transport, LinkHandle) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    let life = Arc::new(LastPong::default());
    let read = if kind == Kind::WebSocket {
        tether_link::read_upgrade(io, deadline, life).await
    } else {
        tether_link::read_hello(io, deadline, life).await
    };
    let (hello, pending) = read.expect("the agent opens the link");
    assert_eq!(hello.version, link::VERSION);
    let link = within("answering the agent", pending.accept(&self::hello(), None))
        .await
        .expect("the answer is written");
    (Transport::native(link.reader, link.writer), link.handle)
}

/// An agent's `Connect` call on an h2 channel, accepted by `serve_connection`.
async fn grpc(agent_io: DuplexStream, server_io: DuplexStream) -> Transports {
    let (calls_tx, mut calls) = mpsc::unbounded_channel();
    let serving = tokio::spawn(async move {
        serve_connection(
            server_io,
            &H2Settings::agent_stream(),
            Connection::unchecked(),
            move |call| {
                let calls = calls_tx.clone();
                async move {
                    let _ = calls.send(call);
                }
            },
            std::future::pending(),
        )
        .await
    });
    let (channel, driver) = within(
        "the h2 handshake",
        Channel::handshake(agent_io, &H2Settings::agent_stream(), "localhost", false),
    )
    .await
    .expect("h2 handshake");
    let driver = tokio::spawn(driver.run());
    let (sender, receiver) = within(
        "opening the Connect call",
        channel.call(tether_proto::path::CONNECT, &[]),
    )
    .await
    .expect("the call opens");
    let call = within("the server's call", calls.recv())
        .await
        .expect("serve_connection hands the call over");
    assert_eq!(call.path(), tether_proto::path::CONNECT);
    let (server_sender, server_receiver) = call.accept(&[]).expect("the call is accepted");
    Transports {
        server: Transport::grpc(server_sender, server_receiver),
        agent: Transport::grpc(sender, receiver),
        wire: Wire::Grpc {
            channel,
            driver,
            serving,
        },
    }
}

/// A server-role link and an agent-role link running one stream between them.
#[derive(Debug)]
pub struct Pair {
    pub kind: Kind,
    pub server: Side,
    pub agent: Side,
    pub wire: Wire,
    next_dial: i64,
}

impl Pair {
    /// Both ends running over `kind` with the default credit window.
    pub async fn new(kind: Kind) -> Self {
        Self::with_flow(kind, default_flow()).await
    }

    /// Both ends running over `kind` with `flow`.
    pub async fn with_flow(kind: Kind, flow: Flow) -> Self {
        Self::with_config(kind, flow, |_| {}).await
    }

    /// Both ends running over `kind` with `flow` and their table's settings changed by `set`.
    pub async fn with_config(kind: Kind, flow: Flow, set: impl Fn(&mut SessionConfig)) -> Self {
        let Transports {
            server: server_transport,
            agent: agent_transport,
            wire,
        } = transports(kind).await;
        let config = |role| {
            let mut config = session_config(role, flow);
            set(&mut config);
            config
        };
        let mut server = Side::with_config(config(Role::Server));
        let mut agent = Side::with_config(config(Role::Agent));
        server.run(server_transport);
        agent.run(agent_transport);
        Self {
            kind,
            server,
            agent,
            wire,
            next_dial: 0,
        }
    }

    /// The side of `role` and its peer.
    pub fn sides(&mut self, role: Role) -> (&mut Side, &mut Side) {
        match role {
            Role::Server => (&mut self.server, &mut self.agent),
            Role::Agent => (&mut self.agent, &mut self.server),
        }
    }

    /// The server dials `address` through the agent (a fresh dial ID each time).
    pub fn dial(&mut self, address: &str) -> PendingDial {
        self.next_dial += 1;
        self.server
            .link
            .dial(DialId(self.next_dial), "tcp".into(), address.into())
            .expect("the stream takes the dial")
    }

    /// A connection the agent answers itself (no destination): the server's tunnel and the
    /// agent's.
    pub async fn open(&mut self) -> (Tunnel, Tunnel) {
        let mut pending = self.dial("in-memory:0");
        let requested = self.agent.next_dial().await;
        assert_eq!(requested.address, "in-memory:0");
        let agent = requested.dial.accept().expect("the dial is still wanted");
        let server = within("the dial's answer", pending.answer())
            .await
            .expect("the agent accepted");
        assert_eq!(server.connect_id(), agent.connect_id());
        (server, agent)
    }

    /// Both tables end up empty, every connection having ended at both ends.
    pub async fn assert_idle(&self) {
        self.server.assert_idle("server").await;
        self.agent.assert_idle("agent").await;
    }

    /// Ends the stream cleanly from the server, checks the agent saw a clean end, closes
    /// both tables and waits for the connection under them to be over.
    pub async fn shutdown(mut self) {
        self.server.stop(TransportEnd::Final("test over".into()));
        assert_eq!(
            self.server.ended().await,
            TransportEnd::Final("test over".into())
        );
        assert_eq!(
            self.agent.ended().await,
            TransportEnd::Final("server closed the stream".into())
        );
        self.server.link.close("test over");
        self.agent.link.close("test over");
        self.wire.finished().await;
    }
}

/// Deterministic bytes that differ from one offset to the next, so a lost, repeated or
/// reordered chunk shows.
pub fn payload(len: usize, seed: u64) -> Bytes {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        // xorshift64
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out.into()
}

/// `got` is `want`, byte for byte; a failure names the first offset that differs rather
/// than printing megabytes.
pub fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if let Some(at) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!("{what}: first difference at byte {at}");
    }
    assert_eq!(got.len(), want.len(), "{what}: length");
}

/// Sends `bytes` to the peer on `up`.
pub async fn send(up: &TunnelUp, bytes: impl Into<Bytes>) -> Result<(), Closed> {
    within("sending on a tunnel", up.send(bytes.into())).await
}

/// Takes `len` bytes from the peer on `down`, returning credit as it goes.
pub async fn recv_exact(down: &mut TunnelDown, len: usize) -> Vec<u8> {
    let mut got = Vec::with_capacity(len);
    while got.len() < len {
        match within("data from the peer", down.recv()).await {
            ConnEvent::Data(data) => {
                got.extend_from_slice(&data);
                down.consumed();
            }
            ConnEvent::Closed(error) => {
                panic!("closed ({error:?}) after {} of {len} bytes", got.len())
            }
        }
    }
    assert_eq!(got.len(), len, "more than was sent");
    got
}

/// The connection's end, expected as the next event on `down`.
pub async fn recv_closed(down: &mut TunnelDown) -> Option<CloseError> {
    match within("the connection's end", down.recv()).await {
        ConnEvent::Closed(error) => error,
        ConnEvent::Data(data) => panic!("{} bytes where the end was expected", data.len()),
    }
}

/// Answers `requested` as the agent does: dials its address on TCP, accepts, relays with
/// `relay_tcp` until either side ends or `cut` resolves, and reports the outcome. The task
/// returns the outcome it reported.
pub fn answer_tcp(
    requested: Requested,
    cut: impl Future<Output = CloseError> + Send + 'static,
) -> JoinHandle<Option<CloseError>> {
    tokio::spawn(async move {
        let stream = TcpStream::connect(&requested.address)
            .await
            .expect("the destination listens");
        let mut tunnel = requested.dial.accept().expect("the dial is still wanted");
        let outcome = relay_tcp(&mut tunnel, stream, cut).await;
        tunnel.finish(outcome.clone());
        outcome
    })
}

/// A TCP echo server on 127.0.0.1: each connection gets back what it sends, then the end
/// of its stream. Its connections end with it.
#[derive(Debug)]
pub struct EchoServer {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl EchoServer {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                connections.spawn(async move {
                    let (mut rd, mut wr) = stream.into_split();
                    if tokio::io::copy(&mut rd, &mut wr).await.is_ok() {
                        let _ = wr.shutdown().await;
                    }
                });
            }
        });
        Self { addr, task }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A connected pair of TCP sockets on 127.0.0.1: (the connecting end, the accepted end).
pub async fn socket_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local address");
    let (connected, accepted) = within("a loopback connection", async {
        tokio::join!(TcpStream::connect(addr), listener.accept())
    })
    .await;
    (connected.expect("connect"), accepted.expect("accept").0)
}

/// Writes all of `bytes` to `stream`.
pub async fn write_all(stream: &mut TcpStream, bytes: &[u8]) {
    within("writing to a socket", stream.write_all(bytes))
        .await
        .expect("the socket takes the bytes");
}

/// Ends writing on `stream` (its FIN).
pub async fn shutdown(stream: &mut TcpStream) {
    within("ending a socket's writing", stream.shutdown())
        .await
        .expect("the socket shuts down");
}

/// Reads `stream` to its end.
pub async fn read_to_end(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut got = Vec::new();
    within("the socket's end", stream.read_to_end(&mut got)).await?;
    Ok(got)
}

/// A real end of `role` on a native link (its transport and handle) against a peer driven
/// by hand, the handshake done.
pub async fn native_against_raw(role: Role) -> (Transport, LinkHandle, RawPeer) {
    let (agent_io, server_io) = duplex();
    match role {
        Role::Agent => {
            let ((transport, handle), raw) = tokio::join!(
                link_agent(Kind::Native, agent_io),
                RawPeer::server(server_io)
            );
            (transport, handle, raw)
        }
        Role::Server => {
            let (raw, (transport, handle)) = tokio::join!(
                RawPeer::agent(agent_io),
                link_server(Kind::Native, server_io)
            );
            (transport, handle, raw)
        }
    }
}

/// A frame as raw bytes: its header (body length, `kind`) and `body`, whatever they say.
pub fn raw_frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(link::HEADER_LEN + body.len());
    frame.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    frame.push(kind);
    frame.extend_from_slice(body);
    frame
}

/// A native link's peer driven by hand: frames written and read as raw bytes with
/// `tether_proto::link`'s codec, with no reader or writer of `tether-link` in between.
#[derive(Debug)]
pub struct RawPeer {
    io: DuplexStream,
    buf: BytesMut,
}

impl RawPeer {
    /// As an agent: sends HELLO and reads the server's ACCEPT.
    pub async fn agent(io: DuplexStream) -> Self {
        let mut peer = Self {
            io,
            buf: BytesMut::new(),
        };
        peer.send(&Frame::Hello(hello())).await;
        let frame = peer.read_frame().await;
        assert!(matches!(frame, Frame::Accept(_)), "{frame:?}");
        peer
    }

    /// As a server: reads the agent's HELLO and answers ACCEPT.
    pub async fn server(io: DuplexStream) -> Self {
        let mut peer = Self {
            io,
            buf: BytesMut::new(),
        };
        let frame = peer.read_frame().await;
        assert!(matches!(frame, Frame::Hello(_)), "{frame:?}");
        peer.send(&Frame::Accept(hello())).await;
        peer
    }

    pub async fn send(&mut self, frame: &Frame) {
        let mut out = BytesMut::new();
        frame.encode(&mut out).expect("the frame encodes");
        self.write(&out).await;
    }

    /// Writes bytes as they are, whatever they say.
    pub async fn write(&mut self, bytes: &[u8]) {
        within("writing to the link", self.io.write_all(bytes))
            .await
            .expect("the other end is open");
    }

    /// The next whole frame from the other end.
    pub async fn read_frame(&mut self) -> Frame {
        within("a frame", async {
            loop {
                if let Some(frame) = link::decode(&mut self.buf).expect("a valid frame") {
                    return frame;
                }
                let n = self.io.read_buf(&mut self.buf).await.expect("read");
                assert!(n > 0, "the link ended before a whole frame");
            }
        })
        .await
    }
}
