//! A stand-in for a proxy server's gRPC frontend. The dial address picks the behaviour:
//!
//! | address | behaviour |
//! |---|---|
//! | `refuse` | DIAL_RSP with [`REFUSED`] |
//! | `no-agent` | DIAL_RSP with "No agent available" |
//! | `dial-closed` | DIAL_CLS |
//! | `silent` | no answer; reports the DIAL_CLS it gets |
//! | `hello-bye` | connects, sends "hello", then a normal CLOSE_RSP |
//! | `fail-after-data` | connects; after the first DATA, CLOSE_RSP "agent lost" and UNAVAILABLE |
//! | `reset` | connects; after the first DATA, resets the stream |
//! | `vanish` | connects, then ends the call with OK but no CLOSE_RSP |
//! | `unavailable` | connects, then ends the call with UNAVAILABLE but no CLOSE_RSP |
//! | `flood` | connects, sends [`FLOOD_BYTES`] as fast as the client takes them, reporting the first stall, then a normal CLOSE_RSP |
//! | `deaf` | connects, then neither reads nor sends for [`DEAF_FOR`] |
//! | `kill-connection` | connects; after the first DATA, drops the whole HTTP/2 connection |
//! | anything else | connects and echoes DATA; answers CLOSE_REQ with CLOSE_RSP |

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tempfile::TempDir;
use tether_client::Transport;
use tether_grpc::server::IncomingCall;
use tether_grpc::{Code, H2Settings, PacketReceiver, PacketSender, Status};
use tether_proto::{ConnectId, DialId, Packet};
use tokio::sync::{Notify, mpsc};

use crate::support::{AbortOnDrop, Listener};

pub(crate) const REFUSED: &str = "dial tcp 127.0.0.1:18999: connect: connection refused";
pub(crate) const FLOOD_BYTES: usize = 16 << 20;
pub(crate) const DEAF_FOR: Duration = Duration::from_secs(40);
const CONNECT_ID: ConnectId = ConnectId(7);
/// A send blocked this long means the client applies back-pressure.
const STALL: Duration = Duration::from_millis(300);

/// What the stand-in saw, for tests to assert on.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Event {
    Dial {
        address: String,
        random: DialId,
    },
    DialClose(DialId),
    CloseRequest,
    /// `flood` could not send more after this many bytes.
    Stalled(usize),
}

pub(crate) struct FakeGrpcProxy {
    pub(crate) transport: Transport,
    pub(crate) events: mpsc::UnboundedReceiver<Event>,
    /// One message per connection, sent once the task serving it exists.
    pub(crate) accepted: mpsc::UnboundedReceiver<()>,
    _accept: AbortOnDrop,
}

impl FakeGrpcProxy {
    pub(crate) fn start(listener: Listener, transport: Transport) -> Self {
        let (events_tx, events) = mpsc::unbounded_channel();
        let (accepted_tx, accepted) = mpsc::unbounded_channel();
        let accept = tokio::spawn(async move {
            while let Ok(accepted) = listener.accept().await {
                let Some(io) = accepted else { continue };
                let events = events_tx.clone();
                tokio::spawn(async move {
                    let kill = Arc::new(Notify::new());
                    let on_call = |call| handle(call, events.clone(), kill.clone());
                    let settings = H2Settings::frontend();
                    let serve = tether_grpc::server::serve_connection(
                        io,
                        &settings,
                        tether_grpc::server::Connection::unchecked(),
                        on_call,
                        std::future::pending(),
                    );
                    // Dropping `serve` drops the socket: the connection ends without GOAWAY.
                    tokio::select! {
                        _ = serve => {}
                        () = kill.notified() => {}
                    }
                });
                let _ = accepted_tx.send(());
            }
        });
        Self {
            transport,
            events,
            accepted,
            _accept: AbortOnDrop(accept),
        }
    }

    pub(crate) fn unix(dir: &TempDir) -> Self {
        let (listener, transport) = Listener::unix(dir);
        Self::start(listener, transport)
    }

    /// The next event other than a dial.
    pub(crate) async fn next_non_dial_event(&mut self) -> Option<Event> {
        loop {
            match self.events.recv().await? {
                Event::Dial { .. } => {}
                other => return Some(other),
            }
        }
    }
}

async fn handle(call: IncomingCall, events: mpsc::UnboundedSender<Event>, kill: Arc<Notify>) {
    let Ok((mut tx, mut rx)) = call.accept(&[]) else {
        return;
    };
    let Some(Ok(Packet::DialRequest {
        address, random, ..
    })) = rx.next().await
    else {
        return;
    };
    let _ = events.send(Event::Dial {
        address: address.clone(),
        random,
    });
    let dial_failure = |error: &str| Packet::DialResponse {
        random,
        result: Err(error.to_owned()),
    };
    match address.as_str() {
        "refuse" => return answer_and_finish(tx, rx, &dial_failure(REFUSED), &Status::ok()).await,
        "no-agent" => {
            let reply = dial_failure("No agent available");
            return answer_and_finish(tx, rx, &reply, &Status::ok()).await;
        }
        "dial-closed" => {
            return answer_and_finish(tx, rx, &Packet::CloseDial { random }, &Status::ok()).await;
        }
        "silent" => {
            while let Some(packet) = rx.next().await {
                if let Ok(Packet::CloseDial { random }) = packet {
                    let _ = events.send(Event::DialClose(random));
                }
            }
            return;
        }
        _ => {}
    }
    let connected = Packet::DialResponse {
        random,
        result: Ok(CONNECT_ID),
    };
    if tx.send(&connected).await.is_err() {
        return;
    }
    match address.as_str() {
        "hello-bye" => {
            tx.buffer(&data(Bytes::from_static(b"hello")));
            answer_and_finish(tx, rx, &close_response(None), &Status::ok()).await;
        }
        "fail-after-data" => {
            while let Some(Ok(packet)) = rx.next().await {
                if matches!(packet, Packet::Data { .. }) {
                    let status = Status::new(Code::UNAVAILABLE, "agent lost");
                    let reply = close_response(Some("agent lost"));
                    return answer_and_finish(tx, rx, &reply, &status).await;
                }
            }
        }
        "reset" => {
            // A reset discards what h2 has not written yet: wait until the DIAL_RSP got out.
            if let Some(Ok(_)) = rx.next().await {
                tx.abort();
            }
        }
        "vanish" => {
            let _ = tx.finish(&Status::ok());
            while rx.next().await.is_some() {}
        }
        "unavailable" => {
            let _ = tx.finish(&Status::new(Code::UNAVAILABLE, "server shutting down"));
            while rx.next().await.is_some() {}
        }
        "deaf" => tokio::time::sleep(DEAF_FOR).await,
        "kill-connection" => {
            // Data from the client shows that the DIAL_RSP got out.
            if let Some(Ok(_)) = rx.next().await {
                kill.notify_one();
            }
            // Keep the call alive until the connection is gone.
            while rx.next().await.is_some() {}
        }
        "flood" => {
            if flood(&mut tx, &events).await {
                answer_and_finish(tx, rx, &close_response(None), &Status::ok()).await;
            }
        }
        _ => echo(tx, rx, &events).await,
    }
}

/// Echoes DATA until CLOSE_REQ, then closes normally.
async fn echo(mut tx: PacketSender, mut rx: PacketReceiver, events: &mpsc::UnboundedSender<Event>) {
    while let Some(Ok(packet)) = rx.next().await {
        let echo = match packet {
            Packet::Data { data, .. } => self::data(data),
            Packet::CloseRequest { .. } => {
                let _ = events.send(Event::CloseRequest);
                return answer_and_finish(tx, rx, &close_response(None), &Status::ok()).await;
            }
            _ => continue,
        };
        if tx.send(&echo).await.is_err() {
            return;
        }
    }
}

/// Sends [`FLOOD_BYTES`], reporting the first stall; false if the call broke.
async fn flood(tx: &mut PacketSender, events: &mpsc::UnboundedSender<Event>) -> bool {
    let chunk = Bytes::from(vec![0x5a; 64 * 1024]);
    let mut sent = 0;
    let mut stalled = false;
    while sent < FLOOD_BYTES {
        tx.buffer(&data(chunk.clone()));
        sent += chunk.len();
        if !stalled && tokio::time::timeout(STALL, tx.flush()).await.is_err() {
            stalled = true;
            let _ = events.send(Event::Stalled(sent));
        }
        if tx.flush().await.is_err() {
            return false;
        }
    }
    true
}

/// Sends `last`, waits for the client to end its side (as the real server does), then ends
/// the call with `status`.
async fn answer_and_finish(
    mut tx: PacketSender,
    mut rx: PacketReceiver,
    last: &Packet,
    status: &Status,
) {
    if tx.send(last).await.is_ok() {
        while let Some(Ok(_)) = rx.next().await {}
        let _ = tx.finish(status);
    }
}

fn data(data: Bytes) -> Packet {
    Packet::Data {
        connect_id: CONNECT_ID,
        data,
    }
}

fn close_response(error: Option<&str>) -> Packet {
    Packet::CloseResponse {
        connect_id: CONNECT_ID,
        error: error.map(str::to_owned),
    }
}
