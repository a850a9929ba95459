//! Opening a link: the agent's HELLO, the server's ACCEPT or CLOSE.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tether_conn::{Code, LastPong, PartialMessageBudget};
use tether_proto::link::{self, Close, Frame, Hello};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::control::{Control, LinkHandle};
use crate::error::LinkError;
use crate::reader::LinkReader;
use crate::websocket::{Role, WsStream, head};
use crate::writer::LinkWriter;

/// How long a refused agent may take to be told why.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an accepted agent may take to take its ACCEPT: a peer that reads nothing must
/// not hold the stream's owner.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(10);
/// What a handshake reads at a time: a HELLO or ACCEPT is a few hundred bytes.
const HANDSHAKE_READ: usize = 4 * 1024;

/// An open link: its two halves, and its owner's handle.
#[derive(Debug)]
pub struct Link {
    pub reader: LinkReader,
    pub writer: LinkWriter,
    pub handle: LinkHandle,
}

impl Link {
    /// A link on `io`, whose first bytes (`buffered`) were already read.
    pub(crate) fn new<IO>(
        io: IO,
        buffered: BytesMut,
        control: Arc<Control>,
        budget: Option<Arc<PartialMessageBudget>>,
    ) -> Self
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(io);
        Self {
            reader: LinkReader::new(Box::new(read), buffered, control.clone(), budget),
            writer: LinkWriter::new(Box::new(write), BytesMut::new(), control.clone()),
            handle: LinkHandle(control),
        }
    }
}

/// The agent's side: sends `hello` on `io` and waits for the server's answer, its ACCEPT
/// (what it answered, and the link) or its CLOSE ([`LinkError::Closed`], the refusal). The
/// caller bounds the wait.
pub async fn connect<IO>(io: IO, hello: &Hello) -> Result<(Hello, Link), LinkError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut io = io;
    let mut out = BytesMut::new();
    Frame::Hello(hello.clone()).encode(&mut out)?;
    io.write_all(&out).await?;
    io.flush().await?;
    let mut buf = BytesMut::new();
    let answer = loop {
        match link::decode(&mut buf)? {
            Some(Frame::Accept(answer)) => break answer,
            Some(Frame::Close(close)) => {
                return Err(LinkError::Closed {
                    code: Code(u32::from(close.code)),
                    message: close.message,
                });
            }
            Some(Frame::Hello(_)) => return Err(LinkError::Unexpected("HELLO")),
            Some(Frame::Ping(_) | Frame::Pong(_)) => return Err(LinkError::Unexpected("PING")),
            Some(Frame::Packet(_)) => return Err(LinkError::Unexpected("PACKET")),
            None => read_more(&mut io, &mut buf).await?,
        }
    };
    if answer.version == 0 || answer.version > link::VERSION {
        return Err(LinkError::Version(answer.version));
    }
    let control = Control::new(Arc::new(LastPong::default()));
    Ok((answer, Link::new(io, buf, control, None)))
}

pub(crate) async fn read_more<R: AsyncRead + Unpin>(
    read: &mut R,
    buf: &mut BytesMut,
) -> Result<(), LinkError> {
    buf.reserve(HANDSHAKE_READ);
    match read.read_buf(buf).await? {
        0 if buf.is_empty() => Err(LinkError::PeerGone),
        0 => Err(LinkError::Frame(link::LinkError::Truncated)),
        _ => Ok(()),
    }
}

/// The server's side, first step: reads the agent's HELLO by `deadline`. `life` is stamped
/// with what the connection reads (the server wraps `io` to stamp it).
pub async fn read_hello<IO>(
    io: IO,
    deadline: Instant,
    life: Arc<LastPong>,
) -> Result<(Hello, PendingLink<IO>), LinkError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut io = io;
    let mut buf = BytesMut::new();
    let hello = tokio::time::timeout_at(deadline, async {
        loop {
            match link::decode(&mut buf)? {
                Some(Frame::Hello(hello)) => return Ok(hello),
                Some(_) => return Err(LinkError::Unexpected("frame other than HELLO")),
                None => read_more(&mut io, &mut buf).await?,
            }
        }
    })
    .await
    .map_err(|_| LinkError::HandshakeTimeout)??;
    Ok((hello, PendingLink::new(io, buf, Framing::Native, life)))
}

/// How a pending link is answered, and how its frames travel once accepted.
#[derive(Debug)]
pub(crate) enum Framing {
    /// Directly on the connection: ACCEPT or CLOSE frames.
    Native,
    /// In WebSocket messages: the upgrade is answered with `101` (carrying this
    /// `Sec-WebSocket-Accept`) or an HTTP error status.
    WebSocket { accept: String },
}

/// Writes a refusal (`out`) and ends the connection, within [`REFUSAL_TIMEOUT`].
pub(crate) async fn send_and_close<IO: AsyncWrite + Unpin>(mut io: IO, out: &[u8]) {
    let _ = tokio::time::timeout(REFUSAL_TIMEOUT, async {
        io.write_all(out).await?;
        io.shutdown().await
    })
    .await;
}

/// A HELLO read and not yet answered. Dropped unanswered, the connection closes.
pub struct PendingLink<IO> {
    io: IO,
    /// What was read after the HELLO (or the upgrade's head).
    buf: BytesMut,
    framing: Framing,
    unanswered: Unanswered,
}

impl<IO> std::fmt::Debug for PendingLink<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingLink")
            .field("buffered", &self.buf.len())
            .finish_non_exhaustive()
    }
}

/// Ends the link when the pending one is dropped without an answer.
#[derive(Debug)]
struct Unanswered(Option<Arc<Control>>);

impl Unanswered {
    fn control(&self) -> &Arc<Control> {
        self.0.as_ref().expect("taken only when answered")
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(control) = &self.0 {
            control.ended.cancel();
        }
    }
}

impl<IO> PendingLink<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    pub(crate) fn new(io: IO, buf: BytesMut, framing: Framing, life: Arc<LastPong>) -> Self {
        Self {
            io,
            buf,
            framing,
            unanswered: Unanswered(Some(Control::new(life))),
        }
    }

    /// The link's name for logs and the debug views: `native` or `websocket`.
    pub fn transport_name(&self) -> &'static str {
        match self.framing {
            Framing::Native => "native",
            Framing::WebSocket { .. } => "websocket",
        }
    }

    /// The link's handle, for its keepalive and its end, before it is answered.
    pub fn handle(&self) -> LinkHandle {
        LinkHandle(self.unanswered.control().clone())
    }

    /// Accepts the stream with `answer`, written at once. An incomplete frame may draw on
    /// `budget` beyond its free share.
    pub async fn accept(
        self,
        answer: &Hello,
        budget: Option<Arc<PartialMessageBudget>>,
    ) -> Result<Link, LinkError> {
        let Self {
            mut io,
            buf,
            framing,
            mut unanswered,
        } = self;
        let mut out = BytesMut::new();
        match &framing {
            Framing::Native => Frame::Accept(answer.clone()).encode(&mut out)?,
            Framing::WebSocket { accept } => head::switching(accept, answer, &mut out)?,
        }
        let written = tokio::time::timeout(ACCEPT_TIMEOUT, async {
            io.write_all(&out).await?;
            io.flush().await
        });
        written.await.map_err(|_| LinkError::HandshakeTimeout)??;
        let control = unanswered.0.take().expect("answered once");
        Ok(match framing {
            Framing::Native => Link::new(io, buf, control, budget),
            Framing::WebSocket { .. } => {
                let io = WsStream::new(io, Role::Server, buf);
                Link::new(io, BytesMut::new(), control, budget)
            }
        })
    }

    /// Refuses the stream with `code` and `message` (a CLOSE frame, or an HTTP error status
    /// for a WebSocket upgrade), then ends the connection, within a short bound.
    pub async fn refuse(self, code: Code, message: &str) {
        let mut out = BytesMut::new();
        let encoded = match self.framing {
            Framing::Native => Frame::Close(Close {
                code: u8::try_from(code.0).unwrap_or(2),
                message: message.to_owned(),
            })
            .encode(&mut out),
            Framing::WebSocket { .. } => {
                head::refusal(code, message, &mut out);
                Ok(())
            }
        };
        if encoded.is_ok() {
            send_and_close(self.io, &out).await;
        }
    }
}
