//! Noticing when a client has finished HTTP/2 connection setup.
//!
//! h2 resolves its handshake once the client preface arrived, but the client's first
//! SETTINGS frame is only processed later, and h2 does not say when. Watching the bytes read
//! is enough: the preface is 24 bytes and the first frame must be SETTINGS (h2 fails the
//! connection otherwise), so setup is complete once 24 + 9 + its payload length bytes came in.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;

/// Passes I/O through and sets a flag once the preface and first frame were read.
#[derive(Debug)]
pub(super) struct SetupWatch<IO> {
    io: IO,
    read: usize,
    header: [u8; FRAME_HEADER_LEN],
    done: Arc<AtomicBool>,
}

impl<IO> SetupWatch<IO> {
    pub(super) fn new(io: IO) -> (Self, Arc<AtomicBool>) {
        let done = Arc::new(AtomicBool::new(false));
        let watch = Self {
            io,
            read: 0,
            header: [0; FRAME_HEADER_LEN],
            done: done.clone(),
        };
        (watch, done)
    }

    fn observe(&mut self, bytes: &[u8]) {
        if self.done.load(Ordering::Relaxed) {
            return;
        }
        for (i, &b) in bytes.iter().enumerate() {
            let at = self.read + i;
            if (PREFACE_LEN..PREFACE_LEN + FRAME_HEADER_LEN).contains(&at) {
                self.header[at - PREFACE_LEN] = b;
            }
        }
        self.read = self.read.saturating_add(bytes.len());
        if self.read >= PREFACE_LEN + FRAME_HEADER_LEN {
            let payload = usize::from(self.header[0]) << 16
                | usize::from(self.header[1]) << 8
                | usize::from(self.header[2]);
            if self.read >= PREFACE_LEN + FRAME_HEADER_LEN + payload {
                self.done.store(true, Ordering::Relaxed);
            }
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for SetupWatch<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if polled.is_ready() && !self.done.load(Ordering::Relaxed) {
            let fresh = buf.filled()[before..].to_vec();
            self.observe(&fresh);
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for SetupWatch<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
