//! [`Watched`]: a TLS stream that remembers the first rustls error it returned.
//!
//! In TLS 1.3 a server's refusal of the client's certificate arrives after the client's
//! handshake has finished, as an alert on the first read, which is HTTP/2's. h2 keeps an io
//! error's kind and text only, so the caller would see `http/2: received fatal alert:
//! CertificateRequired` and could not tell what to check; with the stream watched, it reads
//! the rustls error itself ([`crate::HandshakeFailure::of`]).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A TLS stream that keeps the first rustls error its reads or writes returned.
#[derive(Debug)]
pub struct Watched<IO> {
    io: IO,
    seen: Arc<OnceLock<rustls::Error>>,
}

impl<IO> Watched<IO> {
    /// `io`, and where its first rustls error will be.
    pub fn new(io: IO) -> (Self, Arc<OnceLock<rustls::Error>>) {
        let seen = Arc::new(OnceLock::new());
        (
            Self {
                io,
                seen: seen.clone(),
            },
            seen,
        )
    }

    fn note<T>(&self, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if let Poll::Ready(Err(e)) = &polled
            && let Some(tls) = crate::rustls_error(e)
        {
            let _first = self.seen.set(tls.clone());
        }
        polled
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        self.note(polled)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.note(polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.note(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.note(polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        self.note(polled)
    }
}

#[cfg(test)]
mod tests {
    use rustls::AlertDescription;
    use tokio::io::AsyncReadExt as _;

    use super::*;
    use crate::HandshakeFailure;

    /// A connection whose first read is the server's TLS 1.3 refusal.
    struct Refusing;

    impl AsyncRead for Refusing {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let alert = rustls::Error::AlertReceived(AlertDescription::UnknownCA);
            Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, alert)))
        }
    }

    #[tokio::test]
    async fn an_alert_on_the_connection_is_kept() {
        let (mut watched, seen) = Watched::new(Refusing);
        assert!(watched.read(&mut [0; 8]).await.is_err());
        let kept = seen.get().expect("the rustls error is kept");
        assert_eq!(
            HandshakeFailure::of(kept),
            HandshakeFailure::PeerAlert(AlertDescription::UnknownCA)
        );
    }
}
