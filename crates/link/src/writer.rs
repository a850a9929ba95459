//! A link's sending half: packets in, frames written with vectored writes, each DATA
//! payload from where it lies.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use tether_proto::Packet;
use tether_proto::link::{self, Close, Frame};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::control::Control;
use crate::error::LinkError;

/// A DATA payload shorter than this is copied next to its header: a slice of its own would
/// cost the write more than the copy.
const COPY_BELOW: usize = 2048;
/// The encoding buffer an idle link keeps; a larger one is let go after its flush.
const KEEP_SCRATCH: usize = 16 * 1024;
/// At most this many slices go to one vectored write.
const MAX_SLICES: usize = 64;

/// The packets a native link sends. Dropping it without [`finish`](Self::finish) ends the
/// link without a CLOSE: the peer takes the stream as given up (a resumable one waits).
pub struct LinkWriter {
    io: Box<dyn AsyncWrite + Send + Unpin>,
    /// Frames ready to write, in order; their bytes are not copied again.
    queue: VecDeque<Bytes>,
    /// Headers and small frames, moved to `queue` before each payload and at each flush.
    scratch: BytesMut,
    control: Arc<Control>,
    /// The latest PING sent.
    ping_sent: u64,
}

impl std::fmt::Debug for LinkWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkWriter")
            .field("queued", &self.queue.len())
            .finish_non_exhaustive()
    }
}

impl LinkWriter {
    pub(crate) fn new(
        io: Box<dyn AsyncWrite + Send + Unpin>,
        scratch: BytesMut,
        control: Arc<Control>,
    ) -> Self {
        Self {
            io,
            queue: VecDeque::new(),
            scratch,
            control,
            ping_sent: 0,
        }
    }

    /// Adds `packet` to the next write.
    pub fn buffer(&mut self, packet: &Packet) {
        match packet {
            Packet::Data { connect_id, data } if data.len() >= COPY_BELOW => {
                link::encode_data_header(*connect_id, data.len(), &mut self.scratch);
                self.queue.push_back(self.scratch.split().freeze());
                self.queue.push_back(data.clone());
            }
            _ => link::encode_packet(packet, &mut self.scratch),
        }
    }

    /// Resolves when the link has a PING or a PONG to send: [`flush`](Self::flush) then
    /// sends it. Cancel-safe.
    pub fn wants_flush(&self) -> impl Future<Output = ()> + Send + '_ {
        self.control.writer.notified()
    }

    /// Writes everything buffered, with the PONG or PING the link owes, and flushes the byte
    /// stream. Cancel-safe: what was not written stays queued.
    pub async fn flush(&mut self) -> Result<(), LinkError> {
        if let Some(opaque) = self.control.take_pong() {
            encode_control(&Frame::Pong(opaque), &mut self.scratch);
        }
        let asked = self.control.ping_asked();
        if asked > self.ping_sent {
            encode_control(&Frame::Ping(asked), &mut self.scratch);
            self.ping_sent = asked;
        }
        if !self.scratch.is_empty() {
            self.queue.push_back(self.scratch.split().freeze());
        }
        while !self.queue.is_empty() {
            let written = poll_fn(|cx| {
                let mut slices = [IoSlice::new(&[]); MAX_SLICES];
                let mut count = 0;
                for (slice, bytes) in slices.iter_mut().zip(&self.queue) {
                    *slice = IoSlice::new(bytes);
                    count += 1;
                }
                Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..count])
            })
            .await?;
            if written == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into());
            }
            self.consume(written);
        }
        self.io.flush().await?;
        if self.scratch.capacity() > KEEP_SCRATCH {
            // A burst of small frames is over: an idle link keeps no burst's buffer.
            self.scratch = BytesMut::new();
        }
        Ok(())
    }

    fn consume(&mut self, mut written: usize) {
        while written > 0 {
            let front = self.queue.front_mut().expect("wrote only what was queued");
            let n = written.min(front.len());
            front.advance(n);
            written -= n;
            if front.is_empty() {
                self.queue.pop_front();
            }
        }
    }

    /// Ends the stream cleanly: CLOSE with OK after everything buffered, then the byte
    /// stream's own end (TLS close_notify).
    pub async fn finish(mut self) -> Result<(), LinkError> {
        self.close(Close {
            code: 0,
            message: String::new(),
        })
        .await
    }

    /// Writes CLOSE after everything buffered and ends the byte stream.
    pub(crate) async fn close(&mut self, close: Close) -> Result<(), LinkError> {
        encode_control(&Frame::Close(close), &mut self.scratch);
        self.flush().await?;
        self.io.shutdown().await?;
        Ok(())
    }
}

/// Encodes a frame the link itself sends; these never exceed the control limit.
fn encode_control(frame: &Frame, buf: &mut BytesMut) {
    frame
        .encode(buf)
        .expect("PING, PONG and CLOSE frames always encode");
}

impl Drop for LinkWriter {
    fn drop(&mut self) {
        self.control.ended.cancel();
    }
}
