//! The seam between a stream's driver and what carries its packets. A [`Transport`] moves
//! [`Packet`]s and reports its failures as a [`TransportError`]; the driver
//! ([`Link::run_transport`](crate::Link::run_transport)), the hooks, admission and resume
//! know nothing else of it.
//!
//! Two transports: gRPC over HTTP/2, the only one upstream peers speak, unchanged on the
//! wire; and tether's native link ([`tether_link`]), packets framed on the TLS stream, which
//! a tether agent and a tether server choose by ALPN. It is an enum, not a trait: a stream
//! swaps its transport on resume and takes it through a channel, so one concrete type
//! serves every kind, and reading or flushing a packet allocates no boxed future.
//!
//! What a transport owes the driver:
//! - [`Reader::next`] is cancel-safe (it runs in a `select!`), and a bad packet means exactly
//!   one whole message read and dropped: the resume numbering counts it;
//! - [`Writer::flush`] returns only once the bytes left the writer's bounded buffer, so the
//!   credit released after it stays honest;
//! - [`Writer::finish`] ends the stream cleanly (the peer ends the session), while dropping
//!   it or [`Transport::abort`] is a reset (the peer suspends a resumable session).

use tether_grpc::{GrpcError, PacketReceiver, PacketSender, Status};
use tether_link::{LinkError, LinkReader, LinkWriter};
use tether_proto::Packet;

/// One transport of an agent stream: packets in, packets out. Boxed: it is moved through
/// hand-overs and held in futures until the driver splits it, and each of those would
/// otherwise keep room for its 320 bytes for the stream's life.
#[derive(Debug)]
pub struct Transport(Box<Halves>);

#[derive(Debug)]
struct Halves {
    reader: Reader,
    writer: Writer,
}

impl Transport {
    /// A gRPC `Connect` call's two halves.
    pub fn grpc(sender: PacketSender, receiver: PacketReceiver) -> Self {
        Self(Box::new(Halves {
            reader: Reader::Grpc(receiver),
            writer: Writer::Grpc(sender),
        }))
    }

    /// A native link's two halves.
    pub fn native(reader: LinkReader, writer: LinkWriter) -> Self {
        Self(Box::new(Halves {
            reader: Reader::Native(reader),
            writer: Writer::Native(writer),
        }))
    }

    pub fn into_split(self) -> (Reader, Writer) {
        let Halves { reader, writer } = *self.0;
        (reader, writer)
    }

    /// Gives the stream up: the peer sees it broken (gRPC: RST_STREAM CANCEL; native: the
    /// connection closed without a CLOSE), never a clean end.
    pub fn abort(self) {
        match self.0.writer {
            Writer::Grpc(sender) => sender.abort(),
            Writer::Native(writer) => drop(writer),
        }
    }
}

/// The packets a transport receives.
#[derive(Debug)]
pub enum Reader {
    Grpc(PacketReceiver),
    Native(LinkReader),
}

impl Reader {
    /// The next packet; `None` when the peer ended the stream cleanly. Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<Packet, TransportError>> {
        match self {
            Self::Grpc(receiver) => receiver.next().await.map(|r| r.map_err(Into::into)),
            Self::Native(reader) => reader.next().await.map(|r| r.map_err(Into::into)),
        }
    }
}

/// The packets a transport sends.
#[derive(Debug)]
pub enum Writer {
    Grpc(PacketSender),
    Native(LinkWriter),
}

impl Writer {
    /// Encodes `packet` into the next write.
    pub fn buffer(&mut self, packet: &Packet) {
        match self {
            Self::Grpc(sender) => sender.buffer(packet),
            Self::Native(writer) => writer.buffer(packet),
        }
    }

    /// Resolves when the transport has something of its own to send (the native link's
    /// PING or PONG); [`flush`](Self::flush) sends it. Never on gRPC, whose connection task
    /// answers PINGs itself. Cancel-safe.
    pub fn wants_flush(&self) -> impl Future<Output = ()> + Send + '_ {
        let native = match self {
            Self::Grpc(_) => None,
            Self::Native(writer) => Some(writer.wants_flush()),
        };
        async move {
            match native {
                Some(wanted) => wanted.await,
                None => std::future::pending().await,
            }
        }
    }

    /// Writes everything buffered, waiting for the transport's flow control. Cancel-safe.
    pub async fn flush(&mut self) -> Result<(), TransportError> {
        match self {
            Self::Grpc(sender) => Ok(sender.flush().await?),
            Self::Native(writer) => Ok(writer.flush().await?),
        }
    }

    /// Ends the stream cleanly (gRPC: OK trailers from the server, END_STREAM from the agent;
    /// native: CLOSE with OK).
    pub async fn finish(self) -> Result<(), TransportError> {
        match self {
            Self::Grpc(sender) => Ok(sender.finish(&Status::ok())?),
            Self::Native(writer) => Ok(writer.finish().await?),
        }
    }
}

/// How a transport failed. Wraps the transport's own error, so its text (in logs and end
/// reasons) is the transport's.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(transparent)]
    Grpc(#[from] GrpcError),
    #[error(transparent)]
    Native(#[from] LinkError),
}

impl TransportError {
    /// Only one packet was malformed; the stream can still be read.
    pub fn is_bad_packet(&self) -> bool {
        match self {
            Self::Grpc(e) => e.is_bad_packet(),
            Self::Native(e) => e.is_bad_packet(),
        }
    }

    /// The peer gave the stream up (it stopped, restarted or moved to another transport).
    pub fn is_cancelled(&self) -> bool {
        match self {
            Self::Grpc(e) => e.is_cancelled(),
            Self::Native(e) => e.is_cancelled(),
        }
    }

    /// The `code` label of the stream-error metrics: gRPC's code names, on every transport.
    pub fn code_name(&self) -> &'static str {
        match self {
            Self::Grpc(e) => e.code_name(),
            Self::Native(e) => e.code_name(),
        }
    }
}
