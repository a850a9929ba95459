//! Counting a fake agent's keepalive frames on the wire: a pass-through around the TLS
//! stream of the native link that follows its frames (a 4-byte body length and a type byte,
//! then the body) in both directions and counts the PINGs and PONGs, so that the fleet
//! workload measures the keepalive traffic rather than computing it from the intervals.

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tether_proto::link::{HEADER_LEN, Kind};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Keepalive frames counted on every stream that shares it.
#[derive(Debug, Default)]
pub struct PingCount {
    /// PINGs the servers sent (read by the agents).
    pub from_servers: AtomicU64,
    /// PINGs the agents sent.
    pub from_agents: AtomicU64,
    /// PONGs the servers sent, answering the agents' PINGs.
    pub pongs_from_servers: AtomicU64,
    /// PONGs the agents sent, answering the servers' PINGs.
    pub pongs_from_agents: AtomicU64,
}

/// What a [`PingCount`] held at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pings {
    pub from_servers: u64,
    pub from_agents: u64,
    pub pongs_from_servers: u64,
    pub pongs_from_agents: u64,
}

impl PingCount {
    pub fn now(&self) -> Pings {
        Pings {
            from_servers: self.from_servers.load(Ordering::Relaxed),
            from_agents: self.from_agents.load(Ordering::Relaxed),
            pongs_from_servers: self.pongs_from_servers.load(Ordering::Relaxed),
            pongs_from_agents: self.pongs_from_agents.load(Ordering::Relaxed),
        }
    }
}

impl std::ops::Sub for Pings {
    type Output = Pings;

    fn sub(self, before: Pings) -> Pings {
        Pings {
            from_servers: self.from_servers - before.from_servers,
            from_agents: self.from_agents - before.from_agents,
            pongs_from_servers: self.pongs_from_servers - before.pongs_from_servers,
            pongs_from_agents: self.pongs_from_agents - before.pongs_from_agents,
        }
    }
}

/// Where one direction of a link's byte stream is: in a frame's header, or in its body.
#[derive(Debug, Default)]
struct Scan {
    header: [u8; HEADER_LEN],
    /// Header bytes seen of the frame that starts next.
    have: usize,
    /// Body bytes of the current frame still to come.
    body: u64,
}

impl Scan {
    /// Follows `bytes`, the stream's next bytes, calling `frame` with each frame's type byte
    /// as its header completes.
    fn feed(&mut self, mut bytes: &[u8], mut frame: impl FnMut(u8)) {
        while !bytes.is_empty() {
            if self.body > 0 {
                let n = bytes
                    .len()
                    .min(usize::try_from(self.body).unwrap_or(usize::MAX));
                self.body -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            let n = bytes.len().min(HEADER_LEN - self.have);
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == HEADER_LEN {
                self.have = 0;
                let [a, b, c, d, kind] = self.header;
                self.body = u64::from(u32::from_be_bytes([a, b, c, d]));
                frame(kind);
            }
        }
    }
}

/// A native link's byte stream (`io`, after TLS) whose keepalive frames go into `count`.
/// It must see the stream from its first byte (the agent's HELLO).
#[derive(Debug)]
pub struct Counted<IO> {
    io: IO,
    count: Arc<PingCount>,
    read: Scan,
    written: Scan,
}

impl<IO> Counted<IO> {
    pub fn new(io: IO, count: Arc<PingCount>) -> Self {
        Self {
            io,
            count,
            read: Scan::default(),
            written: Scan::default(),
        }
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    fn saw_read(&mut self, bytes: &[u8]) {
        let count = &self.count;
        self.read.feed(bytes, |kind| {
            if kind == Kind::Ping as u8 {
                count.from_servers.fetch_add(1, Ordering::Relaxed);
            } else if kind == Kind::Pong as u8 {
                count.pongs_from_servers.fetch_add(1, Ordering::Relaxed);
            }
        });
    }

    fn saw_written(&mut self, bytes: &[u8]) {
        let count = &self.count;
        self.written.feed(bytes, |kind| {
            if kind == Kind::Ping as u8 {
                count.from_agents.fetch_add(1, Ordering::Relaxed);
            } else if kind == Kind::Pong as u8 {
                count.pongs_from_agents.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.saw_read(&buf.filled()[before..]);
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Counted<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            this.saw_written(&buf[..n]);
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            let mut left = n;
            for buf in bufs {
                if left == 0 {
                    break;
                }
                let take = left.min(buf.len());
                this.saw_written(&buf[..take]);
                left -= take;
            }
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use tether_proto::link::{Frame, Hello};
    use tether_proto::{ConnectId, Packet};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    fn wire(frames: &[Frame]) -> Vec<u8> {
        let mut buf = BytesMut::new();
        for f in frames {
            f.encode(&mut buf).unwrap();
        }
        buf.to_vec()
    }

    fn frames() -> Vec<Frame> {
        vec![
            Frame::Accept(Hello::default()),
            Frame::Ping(1),
            Frame::Packet(Packet::Data {
                connect_id: ConnectId(3),
                // A body holding PING's type byte and a fake header: skipped, not counted.
                data: bytes::Bytes::from_static(&[0, 0, 0, 8, 0x20, 0x20, 0x21]),
            }),
            Frame::Pong(7),
            Frame::Ping(2),
        ]
    }

    /// Read in pieces of every size, and written in any split, the same frames count the
    /// same: PINGs and PONGs, never a type byte inside a body.
    #[tokio::test]
    async fn counts_pings_and_pongs_across_any_split() {
        let bytes = wire(&frames());
        for piece in 1..=bytes.len() {
            let count = Arc::new(PingCount::default());
            let (near, mut far) = tokio::io::duplex(4096);
            let mut counted = Counted::new(near, count.clone());
            for chunk in bytes.chunks(piece) {
                far.write_all(chunk).await.unwrap();
                let mut got = vec![0u8; chunk.len()];
                counted.read_exact(&mut got).await.unwrap();
                counted.write_all(chunk).await.unwrap();
                far.read_exact(&mut got).await.unwrap();
            }
            assert_eq!(
                count.now(),
                Pings {
                    from_servers: 2,
                    from_agents: 2,
                    pongs_from_servers: 1,
                    pongs_from_agents: 1,
                },
                "pieces of {piece} bytes"
            );
        }
    }

    #[test]
    fn a_header_split_in_two_counts_once() {
        let mut scan = Scan::default();
        let ping = wire(&[Frame::Ping(9)]);
        let mut kinds = Vec::new();
        scan.feed(&ping[..3], |k| kinds.push(k));
        assert!(kinds.is_empty(), "half a header is no frame");
        scan.feed(&ping[3..], |k| kinds.push(k));
        assert_eq!(kinds, [Kind::Ping as u8]);
    }
}
