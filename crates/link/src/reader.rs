//! A link's receiving half: frames off the byte stream, packets out.

use std::sync::Arc;

use bytes::BytesMut;
use tether_conn::{Draw, PartialMessageBudget, WATCHED_READ_POLL};
use tether_proto::Packet;
use tether_proto::link::{self, Frame};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::control::Control;
use crate::error::LinkError;

/// Room a read is given while the link is quiet: an idle link holds no more.
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
    /// The last read filled most of its room: give the next one more.
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
        let room = want.max(if self.busy { BUSY_READ } else { QUIET_READ });
        self.buf.reserve(room);
        // A burst's room is kept for as long as reads find bytes; a link that falls quiet
        // waits with a quiet link's.
        let mut shrink = self.buf.is_empty() && self.buf.capacity() > QUIET_READ;
        loop {
            let watched = self.control.life.is_watched();
            tokio::select! {
                biased;
                () = self.control.ended.cancelled() => return Err(self.control.end_error()),
                read = self.io.read_buf(&mut self.buf) => {
                    let n = read?;
                    if n == 0 {
                        return Err(if self.buf.is_empty() {
                            LinkError::PeerGone
                        } else {
                            LinkError::Frame(link::LinkError::Truncated)
                        });
                    }
                    self.busy = n >= QUIET_READ;
                    return Ok(());
                }
                // Reached only when the read above found nothing at once.
                () = std::future::ready(()), if shrink => {
                    shrink = false;
                    self.buf = BytesMut::new();
                    self.buf.reserve(QUIET_READ);
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
