//! A WebSocket connection as a byte stream: what is written goes out in binary messages
//! (masked by the agent, as RFC 6455 requires of a client), and what is read is the payload
//! of the peer's binary messages, wherever their boundaries fall. The native link runs on it
//! unchanged. A PING from the peer (a proxy's, say) is answered with the next write; the
//! peer's close ends reading, and shutting the stream down sends this side's close.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use tether_proto::websocket::{self, Header, Opcode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Which end of the connection this is: the agent masks what it sends, the server does not,
/// and each refuses frames masked the other way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Agent,
    Server,
}

/// What a read asks of the connection at a time.
const READ_ROOM: usize = 16 * 1024;
/// The largest message one write makes; a larger write is taken in parts.
const MAX_MESSAGE: usize = 256 * 1024;
/// The most write room a quiet stream keeps; a batch this small marks it quiet.
const QUIET_WRITE: usize = 4 * 1024;
/// Frames queued beyond this are written out before another is taken.
const WRITE_HIGH: usize = 256 * 1024;

/// The data frame being read.
#[derive(Clone, Copy, Debug)]
struct Reading {
    /// Payload bytes not yet read.
    left: u64,
    mask: Option<[u8; 4]>,
    /// Payload bytes already read: where the mask continues.
    done: u64,
}

/// A WebSocket connection after its upgrade, read and written as a byte stream.
#[derive(Debug)]
pub struct WsStream<IO> {
    io: IO,
    role: Role,
    /// Bytes read from `io` and not yet taken. Held only while there are some: a connection
    /// waiting for its peer keeps no read buffer.
    read: BytesMut,
    reading: Option<Reading>,
    /// Frames waiting to be written.
    write: BytesMut,
    /// The payload of the peer's latest PING, owed a PONG.
    pong: Option<Bytes>,
    /// The peer's close came: reading is over.
    peer_closed: bool,
    /// This side's close is queued.
    closing: bool,
}

impl<IO> WsStream<IO> {
    /// `read` holds what came after the upgrade's head.
    pub(crate) fn new(io: IO, role: Role, read: BytesMut) -> Self {
        Self {
            io,
            role,
            read,
            reading: None,
            write: BytesMut::new(),
            pong: None,
            peer_closed: false,
            closing: false,
        }
    }

    /// Queues one frame of the first `len` bytes of `parts`; an agent's is masked with a
    /// fresh key.
    fn queue(&mut self, opcode: Opcode, parts: &[io::IoSlice<'_>], len: usize) {
        let mask = (self.role == Role::Agent).then(mask_key);
        self.write.reserve(websocket::MAX_HEADER_LEN + len);
        Header {
            fin: true,
            opcode,
            mask,
            len: len as u64,
        }
        .encode(&mut self.write);
        let start = self.write.len();
        let mut left = len;
        for part in parts {
            let take = part.len().min(left);
            self.write.extend_from_slice(&part[..take]);
            left -= take;
        }
        if let Some(key) = mask {
            websocket::apply_mask(&mut self.write[start..], key, 0);
        }
    }

    /// Queues a control frame.
    fn queue_control(&mut self, opcode: Opcode, payload: &[u8]) {
        self.queue(opcode, &[io::IoSlice::new(payload)], payload.len());
    }

    fn queue_owed_pong(&mut self) {
        if let Some(payload) = self.pong.take() {
            self.queue_control(Opcode::Pong, &payload);
        }
    }

    /// A frame the peer may not send here, or a message this link does not carry.
    fn refuse(&self, header: &Header) -> Option<&'static str> {
        match (self.role, header.mask.is_some()) {
            (Role::Server, false) => return Some("an unmasked WebSocket frame from the agent"),
            (Role::Agent, true) => return Some("a masked WebSocket frame from the server"),
            _ => {}
        }
        (header.opcode == Opcode::Text)
            .then_some("a text WebSocket message: the link carries binary messages only")
    }
}

/// A masking key from the system's random source (RFC 6455 §5.3 asks for unpredictable ones).
fn mask_key() -> [u8; 4] {
    let mut key = [0; 4];
    if aws_lc_rs::rand::fill(&mut key).is_err() {
        // Not expected; a fixed key is still a valid frame, only a predictable one.
        key = tether_proto::random_u64().to_ne_bytes()[..4]
            .try_into()
            .expect("4 bytes");
    }
    key
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

impl<IO: AsyncRead + AsyncWrite + Unpin> WsStream<IO> {
    /// Reads more of the connection; `Ok(false)` at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        self.read.reserve(READ_ROOM);
        match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read) {
            Poll::Ready(read) => Poll::Ready(read.map(|n| n > 0)),
            Poll::Pending => {
                if self.read.is_empty() {
                    self.read = BytesMut::new();
                }
                Poll::Pending
            }
        }
    }

    /// Writes out every queued frame, and a PONG owed after them (a frame already begun on
    /// the connection must be finished first).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.queue_owed_pong();
        let queued = self.write.len();
        while !self.write.is_empty() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.write))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.write.advance(n);
        }
        // A burst keeps its write room from one batch to the next; a link that falls quiet
        // (a small batch: a PING, a few packets) gives it back.
        if queued < QUIET_WRITE && self.write.capacity() > QUIET_WRITE {
            self.write = BytesMut::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if let Some(reading) = &mut this.reading {
                if reading.left == 0 {
                    this.reading = None;
                    continue;
                }
                if this.read.is_empty() {
                    if !ready!(this.poll_fill(cx))? {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the WebSocket connection ended inside a frame",
                        )));
                    }
                    continue;
                }
                let n = (this.read.len() as u64).min(reading.left) as usize;
                let n = n.min(out.remaining());
                // Unmasked in place and taken by advancing: a split would make the buffer
                // shared, an allocation per read.
                let chunk = &mut this.read[..n];
                if let Some(key) = reading.mask {
                    websocket::apply_mask(chunk, key, reading.done);
                }
                out.put_slice(chunk);
                this.read.advance(n);
                reading.left -= n as u64;
                reading.done += n as u64;
                return Poll::Ready(Ok(()));
            }
            if this.peer_closed {
                return Poll::Ready(Ok(()));
            }
            let header = Header::decode(&this.read).map_err(|e| invalid(e.to_string()))?;
            let Some((header, at)) = header else {
                if !ready!(this.poll_fill(cx))? {
                    if this.read.is_empty() {
                        // The connection closed without a close frame: its end all the same.
                        return Poll::Ready(Ok(()));
                    }
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the WebSocket connection ended inside a frame header",
                    )));
                }
                continue;
            };
            if let Some(why) = this.refuse(&header) {
                return Poll::Ready(Err(invalid(why)));
            }
            if !header.opcode.is_control() {
                this.read.advance(at);
                this.reading = Some(Reading {
                    left: header.len,
                    mask: header.mask,
                    done: 0,
                });
                continue;
            }
            // A control frame is read whole: at most 125 bytes.
            let end = at + header.len as usize;
            if this.read.len() < end {
                if !ready!(this.poll_fill(cx))? {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the WebSocket connection ended inside a control frame",
                    )));
                }
                continue;
            }
            let payload = &mut this.read[at..end];
            if let Some(key) = header.mask {
                websocket::apply_mask(payload, key, 0);
            }
            match header.opcode {
                Opcode::Ping => this.pong = Some(Bytes::copy_from_slice(payload)),
                Opcode::Close => this.peer_closed = true,
                _ => {}
            }
            this.read.advance(end);
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.write.len() >= WRITE_HIGH {
            ready!(this.poll_drain(cx))?;
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let len = total.min(MAX_MESSAGE);
        if len == 0 {
            return Poll::Ready(Ok(0));
        }
        this.queue(Opcode::Binary, bufs, len);
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.closing {
            this.closing = true;
            this.queue_owed_pong();
            this.queue_control(Opcode::Close, &websocket::CLOSE_NORMAL.to_be_bytes());
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    /// Frames as a peer of `role`'s other end would send them.
    fn frames(parts: &[(Opcode, &[u8], bool)], masked: bool) -> Vec<u8> {
        let mut out = BytesMut::new();
        for (i, (opcode, payload, fin)) in parts.iter().enumerate() {
            let mask = masked.then_some([i as u8, 0x5A, 0xA5, 0xFF]);
            Header {
                fin: *fin,
                opcode: *opcode,
                mask,
                len: payload.len() as u64,
            }
            .encode(&mut out);
            let start = out.len();
            out.extend_from_slice(payload);
            if let Some(key) = mask {
                websocket::apply_mask(&mut out[start..], key, 0);
            }
        }
        out.to_vec()
    }

    fn pair(role: Role) -> (WsStream<DuplexStream>, DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        (WsStream::new(ours, role, BytesMut::new()), theirs)
    }

    #[tokio::test]
    async fn payloads_are_one_stream_whatever_the_frames_and_pieces() {
        let bytes = frames(
            &[
                (Opcode::Binary, b"hello ", false),
                (Opcode::Ping, b"p", true),
                (Opcode::Continuation, b"", false),
                (Opcode::Continuation, b"world", true),
                (Opcode::Binary, &[7; 300], true),
                (Opcode::Close, &1000u16.to_be_bytes(), true),
            ],
            true,
        );
        let (mut ws, mut peer) = pair(Role::Server);
        let writer = tokio::spawn(async move {
            for piece in bytes.chunks(3) {
                peer.write_all(piece).await.unwrap();
            }
            peer
        });
        let mut read = Vec::new();
        ws.read_to_end(&mut read).await.unwrap();
        let mut want = b"hello world".to_vec();
        want.extend_from_slice(&[7; 300]);
        assert_eq!(read, want);
        let mut peer = writer.await.unwrap();
        // The PING's PONG goes out with the next write, before this side's close.
        ws.shutdown().await.unwrap();
        drop(ws);
        let mut sent = Vec::new();
        peer.read_to_end(&mut sent).await.unwrap();
        assert_eq!(
            sent,
            frames(
                &[
                    (Opcode::Pong, b"p", true),
                    (Opcode::Close, &1000u16.to_be_bytes(), true)
                ],
                false
            )
        );
    }

    #[tokio::test]
    async fn an_agent_masks_what_it_writes_and_a_server_reads_it() {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let mut agent = WsStream::new(ours, Role::Agent, BytesMut::new());
        let mut server = WsStream::new(theirs, Role::Server, BytesMut::new());
        let payload: Vec<u8> = (0..=255u8).cycle().take(MAX_MESSAGE + 1000).collect();
        let sent = payload.clone();
        let writer = tokio::spawn(async move {
            agent.write_all(&sent).await.unwrap();
            agent.shutdown().await.unwrap();
            agent
        });
        let mut read = Vec::new();
        server.read_to_end(&mut read).await.unwrap();
        assert!(
            read == payload,
            "{} bytes read, {} sent",
            read.len(),
            payload.len()
        );
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn frames_the_link_does_not_carry_are_refused() {
        for (role, bytes, says) in [
            (
                Role::Server,
                frames(&[(Opcode::Binary, b"x", true)], false),
                "unmasked",
            ),
            (
                Role::Agent,
                frames(&[(Opcode::Binary, b"x", true)], true),
                "masked",
            ),
            (
                Role::Server,
                frames(&[(Opcode::Text, b"x", true)], true),
                "text",
            ),
            (Role::Agent, vec![0x82, 126, 0, 1], "shortest form"),
            (Role::Agent, vec![0x82, 0x05, b'a'], "ended inside a frame"),
        ] {
            let (mut ws, mut peer) = pair(role);
            peer.write_all(&bytes).await.unwrap();
            drop(peer);
            let mut read = Vec::new();
            let err = ws.read_to_end(&mut read).await.unwrap_err();
            assert!(err.to_string().contains(says), "{role:?}: {err}");
        }
    }
}
