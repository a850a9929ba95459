//! The relays between real sockets on 127.0.0.1 and tunneled connections, through a
//! back-to-back pair of links (each test over both transports): `relay_client` for a client
//! the server carries, `relay_tcp` for the destination the agent dialed, and `relay` itself
//! for how each end is reported. Every test ends with both relays finished and both tables
//! empty.

#[macro_use]
mod common;

use std::io::ErrorKind;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{
    Kind, Pair, Requested, answer_tcp, assert_same, payload, read_to_end, recv_closed, recv_exact,
    send, shutdown, socket_pair, within, write_all,
};
use tether_tunnel::{
    CloseError, EndedBy, Local, Pace, RelayOptions, Relayed, TransportEnd, relay, relay_client,
    reset_on_close,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

on_both_transports!(
    bytes_arrive_exactly_both_ways_and_the_destination_end_ends_the_relays,
    a_client_half_close_reaches_the_destination,
    a_destination_reset_reaches_the_client_as_an_error,
    the_relay_names_who_ended_it,
    a_cut_at_the_agent_resets_the_destination,
    a_cut_at_the_server_ends_its_relay,
    the_stream_ending_ends_both_relays,
    early_bytes_go_first,
    the_pace_is_charged_every_byte,
);

/// A client's connection carried end to end: the client's socket, whose accepted end the
/// server relays with `relay_client` (or `relay` when it can be cut), and the destination's
/// socket, which the agent dialed and relays with `relay_tcp`.
struct Chain {
    /// The client's own end.
    client: TcpStream,
    /// The destination's accepted end.
    destination: TcpStream,
    server_relay: JoinHandle<Relayed>,
    agent_relay: JoinHandle<Option<CloseError>>,
    /// Cuts the server's relay, when it can be cut.
    server_cut: Option<oneshot::Sender<CloseError>>,
    agent_cut: Option<oneshot::Sender<CloseError>>,
}

/// What the server's relay is given.
#[derive(Default)]
struct ServerRelay {
    early: Bytes,
    pace: Option<Arc<dyn Pace>>,
    /// Relay with a cut (`relay` as a client) instead of `relay_client`.
    cuttable: bool,
}

/// A future that resolves with what is sent on `cut`, or never if nothing is.
async fn cut_by(cut: oneshot::Receiver<CloseError>) -> CloseError {
    match cut.await {
        Ok(error) => error,
        Err(_) => std::future::pending().await,
    }
}

impl Chain {
    async fn open(pair: &mut Pair, server: ServerRelay) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut pending = pair.dial(&listener.local_addr().unwrap().to_string());
        let (agent_cut, cut) = oneshot::channel();
        let agent_relay = answer_tcp(pair.agent.next_dial().await, cut_by(cut));
        let (destination, _) = within("the agent's connection", listener.accept())
            .await
            .unwrap();
        let tunnel = within("the dial's answer", pending.answer())
            .await
            .expect("the agent reached the destination");
        let (client, local) = socket_pair().await;
        let (server_cut, cut) = oneshot::channel();
        let ServerRelay {
            early,
            pace,
            cuttable,
        } = server;
        let server_relay = tokio::spawn(async move {
            let mut tunnel = tunnel;
            let (mut rd, mut wr) = local.into_split();
            let options = RelayOptions {
                early,
                pace: pace.as_deref(),
            };
            let relayed = if cuttable {
                let cut = cut_by(cut);
                relay(&mut tunnel, &mut rd, &mut wr, Local::Client, options, cut).await
            } else {
                relay_client(&mut tunnel, &mut rd, &mut wr, options).await
            };
            // As the HTTP CONNECT frontend does: the client sees an error as a reset.
            if relayed.error.is_some() {
                reset_on_close(&rd.reunite(wr).unwrap());
            }
            relayed
        });
        Self {
            client,
            destination,
            server_relay,
            agent_relay,
            server_cut: cuttable.then_some(server_cut),
            agent_cut: Some(agent_cut),
        }
    }

    /// Cuts the server's relay with `error`.
    fn cut_server(&mut self, error: CloseError) {
        let cut = self
            .server_cut
            .take()
            .expect("a cuttable relay, not cut yet");
        cut.send(error).expect("the relay waits for its cut");
    }

    /// Cuts the agent's relay with `error`.
    fn cut_agent(&mut self, error: CloseError) {
        let cut = self.agent_cut.take().expect("not cut yet");
        cut.send(error).expect("the relay waits for its cut");
    }

    /// How both relays ended.
    async fn relays(self) -> (Relayed, Option<CloseError>) {
        let server = within("the server's relay", self.server_relay)
            .await
            .unwrap();
        let agent = within("the agent's relay", self.agent_relay).await.unwrap();
        (server, agent)
    }
}

/// Checks a normal end's report.
fn assert_normal(relayed: &Relayed, ended_by: EndedBy) {
    assert_eq!(relayed.ended_by, ended_by, "{relayed:?}");
    assert_eq!(relayed.error, None, "{relayed:?}");
}

/// Reading `stream` fails with a reset.
async fn assert_reset(stream: &mut TcpStream, who: &str) {
    let read = within("the reset", stream.read(&mut [0; 64])).await;
    match read {
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{who}: {e}"),
        Ok(n) => panic!("{who}: read {n} bytes, not a reset"),
    }
}

/// Megabytes go from the client to the destination and back at once, each byte exact; then
/// the destination's end (its FIN) ends the agent's relay, which the server's relay hears
/// as the peer's normal close: both sockets see a normal end.
async fn bytes_arrive_exactly_both_ways_and_the_destination_end_ends_the_relays(kind: Kind) {
    const LEN: usize = 3 * 1024 * 1024;
    let mut pair = Pair::new(kind).await;
    let mut chain = Chain::open(&mut pair, ServerRelay::default()).await;
    let (to_destination, to_client) = (payload(LEN, 2), payload(LEN, 3));
    let (mut client_rd, mut client_wr) = chain.client.split();
    let (mut dest_rd, mut dest_wr) = chain.destination.split();
    let (mut at_destination, mut at_client) = (vec![0; LEN], vec![0; LEN]);
    let (sent_up, sent_down, got_up, got_down) = within("megabytes both ways", async {
        tokio::join!(
            client_wr.write_all(&to_destination),
            dest_wr.write_all(&to_client),
            dest_rd.read_exact(&mut at_destination),
            client_rd.read_exact(&mut at_client),
        )
    })
    .await;
    for done in [sent_up, sent_down, got_up.map(drop), got_down.map(drop)] {
        done.unwrap();
    }
    assert_same(&at_destination, &to_destination, "at the destination");
    assert_same(&at_client, &to_client, "at the client");

    shutdown(&mut chain.destination).await;
    assert_eq!(read_to_end(&mut chain.client).await.unwrap(), b"");
    assert_eq!(read_to_end(&mut chain.destination).await.unwrap(), b"");
    let (server, agent) = chain.relays().await;
    assert_normal(&server, EndedBy::Peer);
    assert_eq!(agent, None);
    pair.assert_idle().await;
    pair.shutdown().await;
}

/// The client's end of writing (its FIN) after a request asks the agent to close: the
/// destination reads the whole request, then its end, the client then sees its end, and the
/// server's relay reports the client as having ended it, normally.
async fn a_client_half_close_reaches_the_destination(kind: Kind) {
    let mut pair = Pair::new(kind).await;
    let mut chain = Chain::open(&mut pair, ServerRelay::default()).await;
    let request = payload(200 * 1024, 4);
    write_all(&mut chain.client, &request).await;
    shutdown(&mut chain.client).await;
    let received = read_to_end(&mut chain.destination).await.unwrap();
    assert_same(&received, &request, "at the destination");
    assert_eq!(read_to_end(&mut chain.client).await.unwrap(), b"");
    let (server, agent) = chain.relays().await;
    assert_normal(&server, EndedBy::Socket);
    assert_eq!(agent, None);
    pair.assert_idle().await;
    pair.shutdown().await;
}

/// A destination that resets its connection makes the agent's relay fail reading it; the
/// server's relay hears that error from the peer, and the client sees a reset.
async fn a_destination_reset_reaches_the_client_as_an_error(kind: Kind) {
    let mut pair = Pair::new(kind).await;
    let mut chain = Chain::open(&mut pair, ServerRelay::default()).await;
    reset_on_close(&chain.destination);
    drop(chain.destination);
    assert_reset(&mut chain.client, "the client").await;
    let server_relay = within("the server's relay", chain.server_relay)
        .await
        .unwrap();
    let agent = within("the agent's relay", chain.agent_relay)
        .await
        .unwrap();
    let Some(CloseError::Local(error)) = agent else {
        panic!("the agent's relay: {agent:?}");
    };
    assert!(error.starts_with("read from destination: "), "{error}");
    assert_eq!(server_relay.ended_by, EndedBy::Peer);
    assert_eq!(server_relay.error, Some(CloseError::Peer(error)));
    pair.assert_idle().await;
    pair.shutdown().await;
}

/// Answers `requested` as the agent does, but with `relay` itself, to see how it reports
/// its end.
fn answer_with_relay(requested: Requested) -> JoinHandle<Relayed> {
    tokio::spawn(async move {
        let stream = TcpStream::connect(&requested.address).await.unwrap();
        let mut tunnel = requested.dial.accept().expect("the dial is still wanted");
        let (mut rd, mut wr) = stream.into_split();
        let relayed = relay(
            &mut tunnel,
            &mut rd,
            &mut wr,
            Local::Destination,
            RelayOptions::default(),
            std::future::pending(),
        )
        .await;
        tunnel.finish(relayed.error.clone());
        relayed
    })
}

/// `relay` over a destination names who ended it: the peer's close (the server asks to
/// close) is `EndedBy::Peer` and the destination then reads its end; the destination's own
/// end is `EndedBy::Socket` and the server hears a normal close. Both normal, both after
/// bytes went each way.
async fn the_relay_names_who_ended_it(kind: Kind) {
    let mut pair = Pair::new(kind).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    for ended_by in [EndedBy::Peer, EndedBy::Socket] {
        let mut pending = pair.dial(&address);
        let agent_relay = answer_with_relay(pair.agent.next_dial().await);
        let (mut destination, _) = within("the agent's connection", listener.accept())
            .await
            .unwrap();
        let mut tunnel = within("the dial's answer", pending.answer()).await.unwrap();
        send(&tunnel.up, "hello").await.unwrap();
        let mut hello = [0; 5];
        within("the request", destination.read_exact(&mut hello))
            .await
            .unwrap();
        assert_eq!(&hello, b"hello");
        write_all(&mut destination, b"world").await;
        assert_eq!(recv_exact(&mut tunnel.down, 5).await, b"world");
        match ended_by {
            EndedBy::Peer => {
                tunnel.up.close_request();
                assert_eq!(read_to_end(&mut destination).await.unwrap(), b"");
            }
            EndedBy::Socket => {
                shutdown(&mut destination).await;
                assert_eq!(read_to_end(&mut destination).await.unwrap(), b"");
            }
            EndedBy::Cut => unreachable!(),
        }
        assert_eq!(recv_closed(&mut tunnel.down).await, None);
        drop(tunnel);
        let relayed = within("the agent's relay", agent_relay).await.unwrap();
        assert_normal(&relayed, ended_by);
        pair.assert_idle().await;
    }
    pair.shutdown().await;
}

/// A cut of the agent's `relay_tcp` (a policy that now denies the destination) resets the
/// destination, reports the cut's error to the server, and the client sees a reset.
async fn a_cut_at_the_agent_resets_the_destination(kind: Kind) {
    let mut pair = Pair::new(kind).await;
    let mut chain = Chain::open(&mut pair, ServerRelay::default()).await;
    let cut = CloseError::Local("denied by the policy now in force".into());
    chain.cut_agent(cut.clone());
    assert_reset(&mut chain.destination, "the destination").await;
    assert_reset(&mut chain.client, "the client").await;
    let (server, agent) = chain.relays().await;
    assert_eq!(agent, Some(cut.clone()));
    assert_eq!(server.ended_by, EndedBy::Peer);
    assert_eq!(server.error, Some(CloseError::Peer(cut.to_string())));
    pair.assert_idle().await;
    pair.shutdown().await;
}

/// A cut of the server's relay ends it as `EndedBy::Cut` with the cut's error; dropping its
/// tunnel then asks the agent to close, whose relay ends normally and ends the destination.
async fn a_cut_at_the_server_ends_its_relay(kind: Kind) {
    let mut pair = Pair::new(kind).await;
    let cuttable = ServerRelay {
        cuttable: true,
        ..ServerRelay::default()
    };
    let mut chain = Chain::open(&mut pair, cuttable).await;
    let cut = CloseError::Local("the tenant was removed".into());
    chain.cut_server(cut.clone());
    assert_reset(&mut chain.client, "the client").await;
    assert_eq!(read_to_end(&mut chain.destination).await.unwrap(), b"");
    let (server, agent) = chain.relays().await;
    assert_eq!(server.ended_by, EndedBy::Cut);
    assert_eq!(server.error, Some(cut));
    assert_eq!(agent, None);
    pair.assert_idle().await;
    pair.shutdown().await;
}

/// The stream's end, once the owners close their tables, ends the relays on both sides as
/// the peer's doing, with the loss as their error: the client and the destination both see
/// a reset.
async fn the_stream_ending_ends_both_relays(kind: Kind) {
    let mut pair = Pair::new(kind).await;
    let mut chain = Chain::open(&mut pair, ServerRelay::default()).await;
    pair.server.stop(TransportEnd::Final("stopping".into()));
    pair.server.ended().await;
    pair.agent.ended().await;
    pair.server.link.close("server gone");
    pair.agent.link.close("agent gone");
    assert_reset(&mut chain.client, "the client").await;
    assert_reset(&mut chain.destination, "the destination").await;
    let (server, agent) = chain.relays().await;
    assert_eq!(server.ended_by, EndedBy::Peer);
    assert_eq!(
        server.error,
        Some(CloseError::StreamLost("server gone".into()))
    );
    assert_eq!(agent, Some(CloseError::StreamLost("agent gone".into())));
    pair.assert_idle().await;
    pair.wire.finished().await;
}

/// Bytes the client sent before the tunnel was up go to the destination first, then what
/// it sends on its socket.
async fn early_bytes_go_first(kind: Kind) {
    let mut pair = Pair::new(kind).await;
    let early = ServerRelay {
        early: Bytes::from_static(b"sent before the tunnel; "),
        ..ServerRelay::default()
    };
    let mut chain = Chain::open(&mut pair, early).await;
    write_all(&mut chain.client, b"sent after").await;
    shutdown(&mut chain.client).await;
    assert_eq!(
        read_to_end(&mut chain.destination).await.unwrap(),
        b"sent before the tunnel; sent after"
    );
    let (server, agent) = chain.relays().await;
    assert_normal(&server, EndedBy::Socket);
    assert_eq!(agent, None);
    pair.assert_idle().await;
    pair.shutdown().await;
}

/// A pace that only counts what it is charged.
#[derive(Debug, Default)]
struct CountingPace(AtomicUsize);

impl Pace for CountingPace {
    fn debit(&self, bytes: usize) -> Duration {
        self.0.fetch_add(bytes, Ordering::SeqCst);
        Duration::ZERO
    }
}

/// The relay charges its pace for every byte it moves, in both directions.
async fn the_pace_is_charged_every_byte(kind: Kind) {
    const UP: usize = 300 * 1024;
    const DOWN: usize = 500 * 1024;
    let mut pair = Pair::new(kind).await;
    let pace = Arc::new(CountingPace::default());
    let paced = ServerRelay {
        pace: Some(pace.clone()),
        ..ServerRelay::default()
    };
    let mut chain = Chain::open(&mut pair, paced).await;
    let (request, response) = (payload(UP, 5), payload(DOWN, 6));
    write_all(&mut chain.client, &request).await;
    let mut received = vec![0; UP];
    within("the request", chain.destination.read_exact(&mut received))
        .await
        .unwrap();
    assert_same(&received, &request, "at the destination");
    write_all(&mut chain.destination, &response).await;
    let mut received = vec![0; DOWN];
    within("the response", chain.client.read_exact(&mut received))
        .await
        .unwrap();
    assert_same(&received, &response, "at the client");
    shutdown(&mut chain.client).await;
    assert_eq!(read_to_end(&mut chain.destination).await.unwrap(), b"");
    assert_eq!(read_to_end(&mut chain.client).await.unwrap(), b"");
    let (server, agent) = chain.relays().await;
    assert_normal(&server, EndedBy::Socket);
    assert_eq!(agent, None);
    assert_eq!(pace.0.load(Ordering::SeqCst), UP + DOWN);
    pair.assert_idle().await;
    pair.shutdown().await;
}
