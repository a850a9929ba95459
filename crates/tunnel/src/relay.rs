//! The one relay between a local socket and a tunneled connection, for every place that has
//! one: the agent's forward dials and the server's reverse ones (the socket is the dialed
//! destination), the server's HTTP CONNECT frontend and the agent's control-plane listener
//! (the socket is a local client).
//!
//! Both directions move `Bytes` chunks of at most [`MAX_CHUNK`]: a socket read becomes one
//! DATA packet, and the peer's data is written as it came. An idle socket holds no read
//! buffer ([`ChunkRead`]), and the writer is flushed before the relay waits for the peer, so
//! a TLS stream keeps no record back while the connection idles.

use std::io;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tether_session::CloseError;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::conn::{ConnEvent, Tunnel};
use crate::socket::{MAX_CHUNK, reset_on_close, take_read};

/// Reads a chunk of at most `max` bytes into `buf`; 0 means end of stream.
pub trait ChunkRead {
    fn read_chunk(
        &mut self,
        buf: &mut BytesMut,
        max: usize,
    ) -> impl Future<Output = io::Result<usize>> + Send;
}

/// Waits for readiness with an empty buffer released: after a chunk is split off, the rest
/// of the 64 KiB reserve would otherwise stay allocated for as long as the socket idles.
macro_rules! chunk_read_by_readiness {
    ($half:ty) => {
        impl ChunkRead for $half {
            async fn read_chunk(&mut self, buf: &mut BytesMut, max: usize) -> io::Result<usize> {
                loop {
                    buf.reserve(max);
                    match self.try_read_buf(&mut (&mut *buf).limit(max)) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            if buf.is_empty() {
                                *buf = BytesMut::new();
                            }
                            self.readable().await?;
                        }
                        result => return result,
                    }
                }
            }
        }
    };
}

chunk_read_by_readiness!(tokio::net::tcp::OwnedReadHalf);
chunk_read_by_readiness!(tokio::net::unix::OwnedReadHalf);

impl<R: AsyncRead + Send> ChunkRead for tokio::io::ReadHalf<R> {
    /// TLS has no readiness of its own (records may already be buffered): read directly.
    async fn read_chunk(&mut self, buf: &mut BytesMut, max: usize) -> io::Result<usize> {
        buf.reserve(max);
        self.read_buf(&mut (&mut *buf).limit(max)).await
    }
}

/// A tenant's byte-rate bucket as a relay sees it: charges `bytes` just moved and says how
/// long to wait before moving more (zero: go on).
pub trait Pace: Send + Sync + std::fmt::Debug {
    fn debit(&self, bytes: usize) -> Duration;
}

/// What the local socket is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// The destination this end dialed for the peer. Its end ends the connection (there is
    /// no half-close on the wire), and a failed read is an error the peer hears.
    Destination,
    /// A client this end carries to the peer. Its end (or a failed read) asks the peer to
    /// close, and the peer's data is delivered until its answer; the table's close deadline
    /// bounds the wait.
    Client,
}

impl Local {
    fn name(self) -> &'static str {
        match self {
            Self::Destination => "destination",
            Self::Client => "client",
        }
    }
}

/// What a relay is given besides its socket.
#[derive(Debug, Default)]
pub struct RelayOptions<'a> {
    /// Bytes the client sent before the tunnel was up (behind its CONNECT head), sent first.
    pub early: Bytes,
    /// Paces both directions after each chunk; the peer's credit goes back only after.
    pub pace: Option<&'a dyn Pace>,
}

/// Which side ended a relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndedBy {
    /// The local socket (its end, or a failed read or write).
    Socket,
    /// The peer closed the connection, or the stream under it ended.
    Peer,
    /// The `cut` future resolved.
    Cut,
}

/// How a relay ended.
#[derive(Debug)]
pub struct Relayed {
    pub ended_by: EndedBy,
    /// `None` for a normal close. The caller makes the socket's close abortive then (it owns
    /// the whole socket); an answerer reports it in CLOSE_RSP.
    pub error: Option<CloseError>,
}

/// Relays between a local socket's halves and `tunnel` until the connection ends or `cut`
/// resolves. On a normal end, `wr` is shut down.
pub async fn relay<R: ChunkRead, W: AsyncWrite + Unpin>(
    tunnel: &mut Tunnel,
    rd: &mut R,
    wr: &mut W,
    local: Local,
    options: RelayOptions<'_>,
    cut: impl Future<Output = CloseError>,
) -> Relayed {
    let Tunnel { up, down, .. } = tunnel;
    let pace = options.pace;
    let paced = async |bytes: usize| {
        if let Some(wait) = pace.map(|p| p.debit(bytes)).filter(|w| !w.is_zero()) {
            tokio::time::sleep(wait).await;
        }
    };
    // Socket → peer: `Err` only for a destination's failed read.
    let to_peer = async {
        let mut chunk = options.early;
        let mut buf = BytesMut::new();
        loop {
            if !chunk.is_empty() {
                let len = chunk.len();
                if up.send(chunk).await.is_err() {
                    // Closing from the peer's side: the other half delivers what is left
                    // and the close itself.
                    std::future::pending::<()>().await;
                }
                paced(len).await;
            }
            match rd.read_chunk(&mut buf, MAX_CHUNK).await {
                Ok(0) => return Ok(()),
                Ok(_) => chunk = take_read(&mut buf),
                Err(e) if local == Local::Destination => {
                    return Err(CloseError::Local(format!("read from destination: {e}")));
                }
                Err(_) => return Ok(()),
            }
        }
    };
    // Peer → socket.
    let to_socket = async {
        loop {
            let event = down
                .recv_flushed(wr)
                .await
                .map_err(|e| (EndedBy::Socket, write_error(local, &e)))?;
            match event {
                ConnEvent::Data(data) => {
                    wr.write_all(&data)
                        .await
                        .map_err(|e| (EndedBy::Socket, write_error(local, &e)))?;
                    paced(data.len()).await;
                    down.consumed();
                }
                ConnEvent::Closed(None) => return Ok(()),
                ConnEvent::Closed(Some(error)) => return Err((EndedBy::Peer, error)),
            }
        }
    };
    let outcome = {
        let mut to_socket = std::pin::pin!(to_socket);
        tokio::select! {
        sent = to_peer => match (local, sent) {
            (Local::Destination, Ok(())) => Ok(EndedBy::Socket),
            (Local::Destination, Err(error)) => Err((EndedBy::Socket, error)),
            // The client is done: ask the peer to close; its answer ends the relay.
            (Local::Client, _) => {
                up.close_request();
                (&mut to_socket).await.map(|()| EndedBy::Socket)
            }
        },
            received = &mut to_socket => received.map(|()| EndedBy::Peer),
            error = cut => Err((EndedBy::Cut, error)),
        }
    };
    match outcome {
        Ok(ended_by) => {
            let _ = wr.shutdown().await;
            Relayed {
                ended_by,
                error: None,
            }
        }
        Err((ended_by, error)) => Relayed {
            ended_by,
            error: Some(error),
        },
    }
}

fn write_error(local: Local, error: &io::Error) -> CloseError {
    CloseError::Local(format!("write to {}: {error}", local.name()))
}

/// The relay for a local client this end carries to the peer, over its socket's halves.
pub async fn relay_client<R: ChunkRead, W: AsyncWrite + Unpin>(
    tunnel: &mut Tunnel,
    rd: &mut R,
    wr: &mut W,
    options: RelayOptions<'_>,
) -> Relayed {
    relay(
        tunnel,
        rd,
        wr,
        Local::Client,
        options,
        std::future::pending(),
    )
    .await
}

/// The answerer's relay over the TCP destination it dialed, until either side ends or `cut`
/// resolves (the agent cuts a connection that a reloaded destination policy denies). Returns
/// the error to report in CLOSE_RSP, `None` for a normal close; after an error the
/// destination is reset, so it sees a failure rather than a clean end.
///
/// Not an async fn, and `cut` boxed before the relay takes it: each async fn it passed
/// through kept room for it for the connection's life (the agent's policy watch is ~400
/// bytes, which it held three times).
pub fn relay_tcp<'a>(
    tunnel: &'a mut Tunnel,
    stream: TcpStream,
    cut: impl Future<Output = CloseError> + 'a,
) -> impl Future<Output = Option<CloseError>> + 'a {
    let cut = Box::pin(cut);
    async move {
        let (mut rd, mut wr) = stream.into_split();
        let relayed = relay(
            tunnel,
            &mut rd,
            &mut wr,
            Local::Destination,
            RelayOptions::default(),
            cut,
        )
        .await;
        if relayed.error.is_some()
            && let Ok(stream) = rd.reunite(wr)
        {
            reset_on_close(&stream);
        }
        relayed.error
    }
}
