//! The two halves of an open gRPC call.

use std::future::poll_fn;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use tether_proto::frame::{self, Decoder, FrameError};

use crate::error::GrpcError;
use crate::status::{Code, Status};
use crate::stream_count::StreamGuard;
use tether_conn::{Draw, PartialMessageBudget};
use tether_proto::Packet;

/// The status a server-side call ends with when its receive side failed (a message over the
/// size limit, say): the sending half writes it as trailers when it is dropped without an
/// end of its own, so the client reads why, as grpc-go reports it, instead of a bare reset.
#[derive(Debug, Default)]
pub(crate) struct CallEnd(Mutex<Option<Status>>);

impl CallEnd {
    fn set(&self, status: Status) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(status);
    }

    fn take(&self) -> Option<Status> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Sending half. Packets are encoded into one buffer and written when [`flush`] is called,
/// so a burst of small packets leaves as one HTTP/2 DATA write.
///
/// [`flush`]: PacketSender::flush
#[derive(Debug)]
pub struct PacketSender {
    send: h2::SendStream<Bytes>,
    buf: BytesMut,
    /// Servers end a call with trailers, clients with an empty end-of-stream frame.
    is_server: bool,
    /// Server side: the status the receiving half asks the call to end with.
    ending: Option<Arc<CallEnd>>,
    /// Finished or aborted on purpose: dropping sends nothing more.
    ended: bool,
}

impl PacketSender {
    pub(crate) fn new(send: h2::SendStream<Bytes>, ending: Option<Arc<CallEnd>>) -> Self {
        Self {
            send,
            buf: BytesMut::new(),
            is_server: ending.is_some(),
            ending,
            ended: false,
        }
    }

    /// Encodes `packet` into the write buffer without writing it.
    pub fn buffer(&mut self, packet: &Packet) {
        frame::encode(packet, &mut self.buf);
    }

    /// Bytes encoded but not yet written.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Encodes and writes one packet.
    pub async fn send(&mut self, packet: &Packet) -> Result<(), GrpcError> {
        self.buffer(packet);
        self.flush().await
    }

    /// Writes everything buffered. Waits for HTTP/2 flow-control capacity, so this is where
    /// a slow peer applies back-pressure. Cancel-safe: unwritten bytes stay buffered.
    pub async fn flush(&mut self) -> Result<(), GrpcError> {
        while !self.buf.is_empty() {
            self.send.reserve_capacity(self.buf.len());
            let granted = poll_fn(|cx| self.send.poll_capacity(cx))
                .await
                .ok_or_else(|| GrpcError::NotGrpc("stream closed while sending".into()))??;
            if granted == 0 {
                continue;
            }
            let chunk = self.buf.split_to(granted.min(self.buf.len())).freeze();
            self.send.send_data(chunk, false)?;
        }
        Ok(())
    }

    /// Ends the call: trailers with `status` on the server side, end-of-stream on the client.
    /// A server call whose receiving half failed ends with that failure's status instead.
    pub fn finish(mut self, status: &Status) -> Result<(), GrpcError> {
        self.ended = true;
        if self.is_server {
            let failed = self.ending.as_ref().and_then(|ending| ending.take());
            let mut trailers = HeaderMap::new();
            failed.as_ref().unwrap_or(status).write_to(&mut trailers);
            self.send.send_trailers(trailers)?;
        } else {
            self.send.send_data(Bytes::new(), true)?;
        }
        Ok(())
    }

    /// Aborts the call with an HTTP/2 RST_STREAM.
    pub fn abort(mut self) {
        self.ended = true;
        self.send.send_reset(h2::Reason::CANCEL);
    }
}

impl Drop for PacketSender {
    /// A server call dropped while its receiving half holds a status ends with it in
    /// trailers (h2 then resets the client's half with NO_ERROR); otherwise h2 resets the
    /// stream with CANCEL, as it always did.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        if let Some(status) = self.ending.as_ref().and_then(|ending| ending.take()) {
            let mut trailers = HeaderMap::new();
            status.write_to(&mut trailers);
            let _ = self.send.send_trailers(trailers);
        }
    }
}

#[derive(Debug)]
enum RecvState {
    AwaitingResponse(h2::client::ResponseFuture),
    Streaming(h2::RecvStream),
    Done,
}

/// Receiving half.
#[derive(Debug)]
pub struct PacketReceiver {
    state: RecvState,
    decoder: Decoder,
    /// Bytes received whose HTTP/2 flow-control capacity is not yet released: those of a
    /// message not yet complete. Released as messages are decoded, so a peer can make this
    /// side buffer at most its windows (stream and connection), never a message-size worth
    /// per stream on a length prefix's word.
    unreleased: usize,
    headers: HeaderMap,
    /// Server side: where a failure of this half leaves the status the call ends with.
    ending: Option<Arc<CallEnd>>,
    /// What the incomplete message beyond its free share holds of the listener's budget.
    draw: Option<Draw>,
    /// Server side: keeps the connection counted as busy while the call is read.
    _stream: Option<StreamGuard>,
}

impl PacketReceiver {
    pub(crate) fn server(
        recv: h2::RecvStream,
        stream: StreamGuard,
        ending: Arc<CallEnd>,
        budget: Option<Arc<PartialMessageBudget>>,
    ) -> Self {
        Self {
            state: RecvState::Streaming(recv),
            decoder: Decoder::default(),
            unreleased: 0,
            headers: HeaderMap::new(),
            ending: Some(ending),
            draw: budget.map(Draw::new),
            _stream: Some(stream),
        }
    }

    pub(crate) fn client(response: h2::client::ResponseFuture) -> Self {
        Self {
            state: RecvState::AwaitingResponse(response),
            decoder: Decoder::default(),
            unreleased: 0,
            headers: HeaderMap::new(),
            ending: None,
            draw: None,
            _stream: None,
        }
    }

    /// Client side: waits for the response headers (gRPC metadata) and returns them. A
    /// trailers-only response (the server refused the call) becomes `GrpcError::Status`.
    pub async fn response_headers(&mut self) -> Result<&HeaderMap, GrpcError> {
        if let RecvState::AwaitingResponse(fut) = &mut self.state {
            let response = fut.await?;
            let (parts, body) = response.into_parts();
            if let Some(status) = Status::read_from(&parts.headers) {
                self.state = RecvState::Done;
                return Err(GrpcError::Status(status));
            }
            let grpc = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/grpc"));
            if parts.status != http::StatusCode::OK || !grpc {
                self.state = RecvState::Done;
                return Err(GrpcError::NotGrpc(format!("HTTP status {}", parts.status)));
            }
            self.headers = parts.headers;
            self.state = RecvState::Streaming(body);
        }
        Ok(&self.headers)
    }

    /// Next packet; `None` when the peer ended the call cleanly (status OK).
    ///
    /// An error for which [`GrpcError::is_bad_packet`] holds concerns one packet only: the
    /// stream is intact and the caller may keep reading. Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<Packet, GrpcError>> {
        if let Err(e) = self.response_headers().await {
            return Some(Err(e));
        }
        loop {
            let before = self.decoder.buffered();
            let decoded = self.decoder.next_packet();
            self.release(before - self.decoder.buffered());
            match decoded {
                Ok(Some(packet)) => return Some(Ok(packet)),
                Ok(None) => {}
                Err(FrameError::Packet(e)) => return Some(Err(FrameError::Packet(e).into())),
                Err(e) => return Some(Err(self.fail(ending_status(&e), e.into()))),
            }
            // Only an incomplete message is left unreleased: hold it within the budget.
            if let Some(draw) = &mut self.draw
                && let Err(exhausted) = draw.hold(self.unreleased)
            {
                let status = Status::new(
                    Code::RESOURCE_EXHAUSTED,
                    format!(
                        "the server's budget for large incomplete messages ({} bytes, shared \
                         by every stream of the listener) cannot hold the {} bytes of this one",
                        exhausted.limit, exhausted.held
                    ),
                );
                return Some(Err(self.fail(status.clone(), GrpcError::Status(status))));
            }
            let RecvState::Streaming(recv) = &mut self.state else {
                return None;
            };
            match recv.data().await {
                Some(Ok(chunk)) => {
                    self.unreleased += chunk.len();
                    self.decoder.push(chunk);
                }
                Some(Err(e)) => {
                    self.state = RecvState::Done;
                    return Some(Err(e.into()));
                }
                None => return self.finish().await.err().map(Err),
            }
        }
    }

    /// Ends reading after a failure of this side: the call is to end with `status`, and the
    /// received bytes are dropped at once (with the budget they drew).
    fn fail(&mut self, status: Status, error: GrpcError) -> GrpcError {
        if let Some(ending) = &self.ending {
            ending.set(status);
        }
        self.state = RecvState::Done;
        self.decoder = Decoder::default();
        self.unreleased = 0;
        self.draw = None;
        error
    }

    /// Gives the peer back the window of `consumed` decoded bytes. The stream window is at
    /// least one whole message ([`crate::settings::MIN_STREAM_WINDOW`]), so a partial message can
    /// always complete without releasing early.
    fn release(&mut self, consumed: usize) {
        if consumed == 0 {
            return;
        }
        let consumed = consumed.min(self.unreleased);
        self.unreleased -= consumed;
        if let RecvState::Streaming(recv) = &mut self.state {
            let _ = recv.flow_control().release_capacity(consumed);
        }
    }

    async fn finish(&mut self) -> Result<(), GrpcError> {
        let RecvState::Streaming(recv) = std::mem::replace(&mut self.state, RecvState::Done) else {
            return Ok(());
        };
        self.decoder.finish()?;
        // Servers see no trailers from clients; clients read the call's status from them.
        let mut recv = recv;
        match recv.trailers().await? {
            Some(trailers) => match Status::read_from(&trailers) {
                Some(status) if status.code != Code::OK => Err(GrpcError::Status(status)),
                _ => Ok(()),
            },
            None => Ok(()),
        }
    }
}

/// The status grpc-go ends a call with for a message it cannot take.
fn ending_status(error: &FrameError) -> Status {
    match error {
        FrameError::TooLarge(len) => Status::new(
            Code::RESOURCE_EXHAUSTED,
            format!(
                "grpc: received message larger than max ({len} vs. {})",
                frame::MAX_MESSAGE_LEN
            ),
        ),
        FrameError::Compressed => Status::new(
            Code::UNIMPLEMENTED,
            "grpc: Decompressor is not installed for the compressed message (no grpc-encoding \
             was negotiated)",
        ),
        other => Status::new(Code::INTERNAL, other.to_string()),
    }
}
