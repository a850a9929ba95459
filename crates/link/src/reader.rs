//! A link's receiving half: frames off the byte stream, packets out.
//!
//! An idle link holds no read buffer: once a read finds nothing and no part of a frame is
//! buffered, the buffer is given back and the reader waits for bytes with none (as the
//! relays do for idle sockets). A busy link keeps its buffer from one read to the next.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use tether_conn::{Draw, PartialMessageBudget, WATCHED_READ_POLL};
use tether_proto::Packet;
use tether_proto::link::{self, Frame};
use tokio::io::{AsyncRead, ReadBuf};

use crate::control::Control;
use crate::error::LinkError;

/// Room a read is given while the link is quiet, and the first read after it idled.
const QUIET_READ: usize = 4 * 1024;
/// Room a read is given while the link is busy: several full DATA frames per read.
const BUSY_READ: usize = 160 * 1024;
/// How much is reserved ahead for a frame whose start has arrived (more than a DATA frame of
/// the largest chunk); a header that claims more cannot make the reader hold it unearned.
const EAGER_RESERVE: usize = 128 * 1024;

/// The packets a native link receives. Dropping it ends the link.
pub struct LinkReader {
    io: Box<dyn AsyncRead + Send + Unpin>,
    buf: BytesMut,
    control: Arc<Control>,
    /// What an incomplete frame beyond its free share holds of the listener's budget.
    draw: Option<Draw>,
    /// The last read filled a quiet link's room: give the next one more.
    busy: bool,
    /// The peer ended the stream, or the link failed: nothing more is read.
    done: bool,
}

impl std::fmt::Debug for LinkReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkReader")
            .field("buffered", &self.buf.len())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl LinkReader {
    pub(crate) fn new(
        io: Box<dyn AsyncRead + Send + Unpin>,
        buf: BytesMut,
        control: Arc<Control>,
        budget: Option<Arc<PartialMessageBudget>>,
    ) -> Self {
        Self {
            io,
            buf,
            control,
            draw: budget.map(Draw::new),
            busy: false,
            done: false,
        }
    }

    /// The next packet; `None` once the peer ended the stream cleanly (CLOSE with OK). PINGs
    /// are answered and PONGs recorded on the way. An error for which
    /// [`LinkError::is_bad_packet`] holds concerns one packet: reading may go on. Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<Packet, LinkError>> {
        loop {
            if self.done {
                return None;
            }
            match link::decode(&mut self.buf) {
                Ok(Some(Frame::Packet(packet))) => return Some(Ok(packet)),
                Ok(Some(Frame::Ping(opaque))) => self.control.owe_pong(opaque),
                Ok(Some(Frame::Pong(opaque))) => self.control.answered(opaque),
                Ok(Some(Frame::Close(close))) => {
                    self.done = true;
                    if close.code == 0 {
                        return None;
                    }
                    return Some(Err(LinkError::Closed {
                        code: tether_conn::Code(u32::from(close.code)),
                        message: close.message,
                    }));
                }
                Ok(Some(Frame::Hello(_))) => {
                    return Some(Err(self.fail(LinkError::Unexpected("HELLO"))));
                }
                Ok(Some(Frame::Accept(_))) => {
                    return Some(Err(self.fail(LinkError::Unexpected("ACCEPT"))));
                }
                Ok(None) => {
                    if let Err(e) = self.wait_for_bytes().await {
                        return Some(Err(self.fail(e)));
                    }
                }
                Err(e) if e.is_bad_packet() => return Some(Err(e.into())),
                Err(e) => return Some(Err(self.fail(e.into()))),
            }
        }
    }

    /// Reads more of the stream into the buffer; errors at its end, or when the link was
    /// given up. While the link is watched, a read that finds nothing is retried every
    /// [`WATCHED_READ_POLL`] so the silence is recorded (see `LastPong::quiet`).
    async fn wait_for_bytes(&mut self) -> Result<(), LinkError> {
        // Only an incomplete frame is left in the buffer: hold it within the budget (nothing
        // once whole frames were taken out, which gives back what the last one drew).
        if let Some(draw) = &mut self.draw {
            draw.hold(self.buf.len())
                .map_err(|exhausted| LinkError::Closed {
                    code: tether_conn::Code::RESOURCE_EXHAUSTED,
                    message: format!(
                        "the server's budget for large incomplete messages ({} bytes, shared \
                         by every stream of the listener) cannot hold the {} bytes of this \
                         frame",
                        exhausted.limit, exhausted.held
                    ),
                })?;
        }
        let want =
            link::frame_len(&self.buf).map_or(0, |len| (len - self.buf.len()).min(EAGER_RESERVE));
        loop {
            let watched = self.control.life.is_watched();
            tokio::select! {
                biased;
                () = self.control.ended.cancelled() => return Err(self.control.end_error()),
                read = poll_fn(|cx| {
                    poll_read_more(&mut self.io, &mut self.buf, &mut self.busy, want, cx)
                }) => {
                    let n = read?;
                    if n == 0 {
                        return Err(if self.buf.is_empty() {
                            LinkError::PeerGone
                        } else {
                            LinkError::Frame(link::LinkError::Truncated)
                        });
                    }
                    return Ok(());
                }
                () = tokio::time::sleep(WATCHED_READ_POLL), if watched => {}
            }
        }
    }

    /// Ends reading after a failure: what was buffered goes, with what it drew.
    fn fail(&mut self, error: LinkError) -> LinkError {
        self.done = true;
        self.buf = BytesMut::new();
        self.draw = None;
        error
    }
}

/// Reads more of `io` into `buf`, with room for `want` bytes (the rest of a frame begun) or
/// more as `busy` says, which the read updates. A read that finds nothing while `buf` holds no
/// part of a frame gives the buffer back; the next waits for bytes with no room first, which
/// a TLS stream (tokio-rustls) or a duplex resolves only once bytes (or the end) are there.
/// A plain socket resolves it at once, and its read then waits as before.
fn poll_read_more(
    io: &mut (dyn AsyncRead + Send + Unpin),
    buf: &mut BytesMut,
    busy: &mut bool,
    want: usize,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if buf.capacity() == 0 {
        let waited = Pin::new(&mut *io).poll_read(cx, &mut ReadBuf::new(&mut []));
        if waited.is_pending() {
            // Also lets go of the allocation an exactly filled read left this view of.
            *buf = BytesMut::new();
        }
        ready!(waited)?;
    }
    buf.reserve(want.max(if *busy { BUSY_READ } else { QUIET_READ }));
    match tokio_util::io::poll_read_buf(Pin::new(io), cx, buf) {
        Poll::Pending => {
            if buf.is_empty() {
                *buf = BytesMut::new();
                *busy = false;
            }
            Poll::Pending
        }
        Poll::Ready(read) => {
            // A read that filled a quiet link's room: give the next one more.
            *busy = matches!(read, Ok(n) if n >= QUIET_READ);
            Poll::Ready(read)
        }
    }
}

impl Drop for LinkReader {
    fn drop(&mut self) {
        self.control.ended.cancel();
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tether_conn::{FREE_PARTIAL_BYTES, LastPong};
    use tether_proto::ConnectId;
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// A link that waits for its peer holds no read buffer, and reads on as before once bytes
    /// come: a small frame, then frames larger than a quiet link's room.
    #[tokio::test]
    async fn an_idle_link_holds_no_read_buffer() {
        let (near, mut far) = tokio::io::duplex(1 << 20);
        let control = Control::new(Arc::new(LastPong::default()));
        let mut reader = LinkReader::new(Box::new(near), BytesMut::new(), control, None);
        let data = |len: usize| Packet::Data {
            connect_id: ConnectId(1),
            data: Bytes::from(vec![3u8; len]),
        };
        let mut frames = BytesMut::new();
        link::encode_packet(&data(100), &mut frames);
        far.write_all(&frames.split()).await.unwrap();
        assert_eq!(reader.next().await.unwrap().unwrap(), data(100));
        let idle = tokio::time::timeout(std::time::Duration::from_millis(50), reader.next());
        assert!(idle.await.is_err(), "nothing more was sent");
        assert_eq!(reader.buf.capacity(), 0, "the idle link gave its buffer");

        for _ in 0..3 {
            link::encode_packet(&data(60_000), &mut frames);
        }
        far.write_all(&frames).await.unwrap();
        for _ in 0..3 {
            assert_eq!(reader.next().await.unwrap().unwrap(), data(60_000));
        }
    }

    /// A large frame draws on the budget while it is incomplete, and gives it all back once
    /// it was taken out; one the budget cannot hold ends the link with RESOURCE_EXHAUSTED.
    #[tokio::test]
    async fn an_incomplete_frame_draws_on_the_budget_until_it_is_whole() {
        let budget = PartialMessageBudget::new(1 << 20, || {});
        let (near, mut far) = tokio::io::duplex(8 << 20);
        let control = Control::new(Arc::new(LastPong::default()));
        let mut reader = LinkReader::new(
            Box::new(near),
            BytesMut::new(),
            control,
            Some(budget.clone()),
        );
        let mut frame = BytesMut::new();
        let payload = Bytes::from(vec![7u8; FREE_PARTIAL_BYTES + 500_000]);
        link::encode_packet(
            &Packet::Data {
                connect_id: ConnectId(1),
                data: payload.clone(),
            },
            &mut frame,
        );
        let cut = frame.len() - 10;
        far.write_all(&frame[..cut]).await.unwrap();
        let pending = tokio::time::timeout(std::time::Duration::from_millis(200), reader.next());
        assert!(pending.await.is_err(), "the frame is not whole yet");
        assert!(budget.held() > 0, "the incomplete frame draws");
        far.write_all(&frame[cut..]).await.unwrap();
        let Some(Ok(Packet::Data { data, .. })) = reader.next().await else {
            panic!("the DATA packet");
        };
        assert_eq!(data, payload);
        let idle = tokio::time::timeout(std::time::Duration::from_millis(100), reader.next());
        assert!(idle.await.is_err());
        assert_eq!(budget.held(), 0, "a whole frame gives back what it drew");

        // Twice what the budget holds beyond the free share: refused.
        let mut big = BytesMut::new();
        link::encode_data_header(ConnectId(1), 3 << 20, &mut big);
        far.write_all(&big).await.unwrap();
        far.write_all(&vec![0u8; 2 << 20]).await.unwrap();
        let refused = reader.next().await.expect("an end").expect_err("a refusal");
        assert_eq!(refused.code_name(), "ResourceExhausted", "{refused}");
        assert_eq!(budget.held(), 0, "a refused link holds nothing");
    }
}
