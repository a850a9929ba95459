//! An agent connection's protocol told by its first bytes, for a peer that negotiated none
//! in TLS: a proxy that speaks TLS to the server without ALPN (nginx does), in front of
//! agents on the WebSocket link. A WebSocket upgrade starts with `GET `; anything else is
//! taken for gRPC over HTTP/2, as before.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tokio::time::Instant;

use crate::net::Io;

/// What a WebSocket upgrade's first bytes are.
const UPGRADE_START: &[u8] = b"GET ";

/// Reads the first bytes of `io` by `deadline`: whether they start a WebSocket upgrade, and
/// the stream with them put back.
pub(crate) async fn sniff(
    mut io: Box<dyn Io>,
    deadline: Instant,
) -> io::Result<(bool, Box<dyn Io>)> {
    let mut first = BytesMut::with_capacity(UPGRADE_START.len());
    let read = async {
        while first.len() < UPGRADE_START.len() {
            if io.read_buf(&mut first).await? == 0 {
                break;
            }
        }
        Ok::<_, io::Error>(())
    };
    tokio::time::timeout_at(deadline, read)
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "no first bytes by the setup deadline",
            )
        })??;
    let websocket = first.starts_with(UPGRADE_START);
    Ok((websocket, Box::new(Replayed { first, io })))
}

/// A stream whose first bytes were read, and are read again first.
struct Replayed {
    first: BytesMut,
    io: Box<dyn Io>,
}

impl AsyncRead for Replayed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.first.is_empty() {
            return Pin::new(&mut this.io).poll_read(cx, out);
        }
        let n = this.first.len().min(out.remaining());
        out.put_slice(&this.first[..n]);
        this.first.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Replayed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl Io for Replayed {
    fn abort_on_close(&self) {
        self.io.abort_on_close();
    }

    fn into_unix(self: Box<Self>) -> Result<UnixStream, Box<dyn Io>> {
        Err(self)
    }
}
