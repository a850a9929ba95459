//! The answerer's relay between a dialed TCP destination and the stream: used by the agent
//! for forward dials and by the server for reverse ones.

use bytes::{BufMut, BytesMut};
use tether_session::CloseError;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::{ConnEvent, MAX_CHUNK, Tunnel};

/// The answerer's relay: between the destination it dialed and the peer, until either
/// side ends. Returns the error to report in CLOSE_RSP, `None` for a normal close.
pub async fn relay_tcp(tunnel: &mut Tunnel, stream: TcpStream) -> Option<CloseError> {
    relay_tcp_until(tunnel, stream, std::future::pending()).await
}

/// [`relay_tcp`], or until `cut` resolves first: then the destination is reset and the
/// error `cut` gives is returned, for the peer to see in CLOSE_RSP (the agent cuts a
/// connection that a reloaded destination policy denies).
pub async fn relay_tcp_until(
    tunnel: &mut Tunnel,
    stream: TcpStream,
    cut: impl Future<Output = CloseError>,
) -> Option<CloseError> {
    let (rd, mut wr) = stream.into_split();
    let Tunnel { up, down, .. } = tunnel;
    let to_peer = async {
        let mut buf = BytesMut::new();
        loop {
            buf.reserve(MAX_CHUNK);
            match rd.try_read_buf(&mut (&mut buf).limit(MAX_CHUNK)) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // Going idle: let go of the buffer (its rest would stay allocated).
                    buf = BytesMut::new();
                    if let Err(e) = rd.readable().await {
                        return Err(CloseError::Local(format!("read from destination: {e}")));
                    }
                }
                Ok(0) => return Ok(()),
                Ok(_) => {
                    if up.send(crate::take_read(&mut buf)).await.is_err() {
                        // Closing from the peer's side: the other half delivers what is
                        // left and the close itself.
                        std::future::pending::<()>().await;
                    }
                }
                Err(e) => return Err(CloseError::Local(format!("read from destination: {e}"))),
            }
        }
    };
    let to_destination = async {
        loop {
            match down.recv().await {
                ConnEvent::Data(data) => {
                    if let Err(e) = wr.write_all(&data).await {
                        return Err(CloseError::Local(format!("write to destination: {e}")));
                    }
                    down.consumed();
                }
                ConnEvent::Closed(None) => return Ok(()),
                ConnEvent::Closed(Some(e)) => return Err(e),
            }
        }
    };
    // Whichever side ends first ends the connection: there is no half-close on the wire.
    let outcome = tokio::select! {
        r = to_peer => r,
        r = to_destination => r,
        error = cut => Err(error),
    };
    match outcome {
        Ok(()) => {
            let _ = wr.shutdown().await;
            None
        }
        Err(error) => {
            // Make the destination see the failure too, rather than a clean end.
            if let Ok(stream) = rd.reunite(wr) {
                crate::reset_on_close(&stream);
            }
            Some(error)
        }
    }
}
