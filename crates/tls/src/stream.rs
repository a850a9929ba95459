//! A server's TLS stream over TCP that holds no buffer while the connection idles.
//!
//! tokio-rustls reads through rustls' own receive buffer, which rustls keeps at 4 KiB for
//! the connection's whole life and has no call to free: a fifth of what a connected agent
//! cost the server (BENCHMARKS.md, "Server memory per agent"). On rustls' unbuffered API
//! the ciphertext lives in this type's buffers instead, and each is given back once empty
//! and the socket has nothing more: an idle connection holds rustls' state and the keys.
//!
//! rustls still runs the protocol (handshake, alerts, key updates, close_notify); this type
//! only moves bytes between the socket and rustls, in order:
//! - every `process` runs rustls until it needs more ciphertext, so the receive buffer never
//!   holds a whole record rustls has not seen;
//! - what rustls asks to send goes to the end of one send buffer, written before any later
//!   record, so handing it over counts as transmitted.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use rustls::ServerConfig;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncodeTlsData, EncryptError, UnbufferedStatus,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A read on a quiet connection: a handshake flight or a few small records.
const QUIET_READ: usize = 4096;
/// A read after one that filled its room: several full records at once.
const BUSY_READ: usize = 64 * 1024;
/// Most plaintext encrypted by one write: what the send buffer grows to, besides records'
/// overhead.
const MAX_WRITE: usize = 64 * 1024;
/// A send buffer up to this size (a PING's) stays; a larger one is let go once a batch
/// smaller than half of it is written out (after a handshake flight, or once bulk is over).
const KEEP_OUTGOING: usize = 1024;
/// Ciphertext received that rustls has not taken whole: beyond a handshake message's limit
/// (64 KiB) and a read, a peer is not following TLS.
const MAX_INCOMING: usize = 64 * 1024 + 2 * BUSY_READ;

/// A TLS server connection on a TCP socket, from [`accept`].
pub struct ServerTlsStream {
    tcp: TcpStream,
    conn: UnbufferedServerConnection,
    /// Ciphertext read and not yet processed whole: at most the start of one record once
    /// `process` returns.
    incoming: Vec<u8>,
    /// The last socket read filled its room.
    busy: bool,
    /// Ciphertext to send: `outgoing[written..encoded]`.
    outgoing: Vec<u8>,
    written: usize,
    encoded: usize,
    /// Plaintext decrypted that the last read had no room for: `plaintext[taken..]`.
    plaintext: Vec<u8>,
    taken: usize,
    /// The socket's end was read.
    eof: bool,
    /// The peer's close_notify came: reads see the end of the stream.
    peer_closed: bool,
    /// This end's close_notify is in `outgoing`.
    close_queued: bool,
    /// rustls failed: it is not called again (it would go over what failed once more).
    failed: bool,
}

impl std::fmt::Debug for ServerTlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTlsStream")
            .field("tcp", &self.tcp)
            .finish_non_exhaustive()
    }
}

/// Runs the server's side of the handshake on `tcp`. On failure the socket comes back with
/// the error, after the alert rustls sent, for a caller that lets the peer read it.
pub async fn accept(
    tcp: TcpStream,
    config: Arc<ServerConfig>,
) -> Result<ServerTlsStream, (io::Error, TcpStream)> {
    let conn = match UnbufferedServerConnection::new(config) {
        Ok(conn) => conn,
        Err(e) => return Err((tls_error(e), tcp)),
    };
    let mut stream = ServerTlsStream {
        tcp,
        conn,
        incoming: Vec::new(),
        busy: false,
        outgoing: Vec::new(),
        written: 0,
        encoded: 0,
        plaintext: Vec::new(),
        taken: 0,
        eof: false,
        peer_closed: false,
        close_queued: false,
        failed: false,
    };
    match stream.handshake().await {
        Ok(()) => Ok(stream),
        Err(e) => Err((e, stream.tcp)),
    }
}

/// What the stream asks of rustls besides taking in ciphertext.
enum Action<'a> {
    Nothing,
    Encrypt(&'a [u8]),
    CloseNotify,
}

/// Where `process` stopped.
enum Progress {
    /// rustls needs more ciphertext (or, with [`Action::Nothing`], has nothing else to do).
    NeedsBytes,
    /// The action is done: its record is in `outgoing`.
    Done,
    /// Both ends sent close_notify.
    Closed,
}

impl ServerTlsStream {
    /// The socket, for its options.
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// The connection's TLS state: the peer's certificates, the ALPN protocol chosen.
    pub fn connection(&self) -> &rustls::CommonState {
        &self.conn
    }

    async fn handshake(&mut self) -> io::Result<()> {
        loop {
            let progress = self.process(None, Action::Nothing);
            // The flight rustls produced (or its alert) goes out before anything is awaited.
            let sent = std::future::poll_fn(|cx| self.poll_write_out(Some(cx))).await;
            progress?;
            sent?;
            if !self.conn.is_handshaking() {
                return Ok(());
            }
            if self.eof {
                let eof = "the peer closed the connection during the TLS handshake";
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, eof));
            }
            std::future::poll_fn(|cx| self.poll_fill(cx)).await?;
        }
    }

    /// Runs rustls over the ciphertext received until it needs more, or has done `action`.
    /// Application data goes to `read`, and what has no room there to `plaintext`. On an
    /// error, the alert rustls queued is in `outgoing`, and every later call fails.
    ///
    /// rustls is always given the receive buffer itself, less what it said to discard: it
    /// keeps positions in it between calls.
    fn process(
        &mut self,
        mut read: Option<&mut ReadBuf<'_>>,
        action: Action<'_>,
    ) -> io::Result<Progress> {
        if self.failed {
            let failed = "this TLS connection failed earlier";
            return Err(io::Error::new(io::ErrorKind::InvalidData, failed));
        }
        // What rustls is done with; dropped from the buffer once, when this returns (a
        // drain per record would move the rest of a large read again for each).
        let mut consumed = 0;
        loop {
            let UnbufferedStatus { discard, state } = self
                .conn
                .process_tls_records(&mut self.incoming[consumed..]);
            let outcome = match state {
                Ok(ConnectionState::ReadTraffic(mut records)) => loop {
                    match records.next_record() {
                        Some(Ok(record)) => {
                            deliver(record.payload, read.as_deref_mut(), &mut self.plaintext);
                        }
                        Some(Err(e)) => break Some(Err(tls_error(e))),
                        None => break None,
                    }
                },
                Ok(ConnectionState::EncodeTlsData(mut encoding)) => {
                    encode(&mut self.outgoing, &mut self.encoded, &mut encoding)
                        .err()
                        .map(Err)
                }
                // What rustls encoded is at the end of `outgoing`, sent before anything later.
                Ok(ConnectionState::TransmitTlsData(transmit)) => {
                    transmit.done();
                    None
                }
                Ok(ConnectionState::BlockedHandshake) => Some(Ok(Progress::NeedsBytes)),
                Ok(ConnectionState::WriteTraffic(mut writing)) => Some(match action {
                    Action::Nothing => Ok(Progress::NeedsBytes),
                    Action::Encrypt(data) => append(&mut self.outgoing, &mut self.encoded, |out| {
                        writing.encrypt(data, out).map_err(encrypt_room)
                    })
                    .map(|()| Progress::Done),
                    Action::CloseNotify => append(&mut self.outgoing, &mut self.encoded, |out| {
                        writing.queue_close_notify(out).map_err(encrypt_room)
                    })
                    .map(|()| Progress::Done),
                }),
                Ok(ConnectionState::PeerClosed) => {
                    self.peer_closed = true;
                    None
                }
                Ok(ConnectionState::Closed) => Some(Ok(Progress::Closed)),
                // No early data is accepted (`max_early_data_size` stays 0).
                Ok(_) => Some(Err(io::Error::other("unexpected TLS state"))),
                Err(e) => Some(Err(tls_error(e))),
            };
            consumed += discard;
            let Some(outcome) = outcome else {
                continue;
            };
            self.incoming.drain(..consumed);
            if outcome.is_err() {
                self.failed = true;
                self.queue_alert();
            }
            return outcome;
        }
    }

    /// After an error, moves the alert rustls queued (if any) to `outgoing`: rustls hands
    /// it over before anything else. Once only: a further call would run rustls over what
    /// failed again.
    fn queue_alert(&mut self) {
        let UnbufferedStatus { state, .. } = self.conn.process_tls_records(&mut self.incoming);
        if let Ok(ConnectionState::EncodeTlsData(mut encoding)) = state {
            // Best effort: the caller reports the error that ended the connection.
            let _ = encode(&mut self.outgoing, &mut self.encoded, &mut encoding);
        }
    }

    /// Reads more ciphertext into `incoming`: `Ok(0)` at the socket's end. While the socket
    /// has nothing and no record is begun, no receive buffer is held.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.incoming.len() >= MAX_INCOMING {
            let error = "the TLS peer sent more than 192 KiB without completing a record";
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, error)));
        }
        loop {
            if self.tcp.poll_read_ready(cx)?.is_pending() {
                if self.incoming.is_empty() {
                    self.incoming = Vec::new();
                    self.busy = false;
                }
                return Poll::Pending;
            }
            let room = if self.busy { BUSY_READ } else { QUIET_READ };
            self.incoming.reserve_exact(room);
            match self.tcp.try_read_buf(&mut self.incoming) {
                Ok(0) => {
                    self.eof = true;
                    return Poll::Ready(Ok(0));
                }
                Ok(n) => {
                    self.busy = n >= room;
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Writes `outgoing` to the socket; once all is written, a large buffer is let go.
    /// With `cx` it waits until the socket has taken it all. Without, it writes what the
    /// socket takes now and is `Pending` for the rest, which goes with the next write: the
    /// reading half's way to send what rustls answered (a key update, an alert), registering
    /// no waker, so it never takes the writing half's place in the socket's readiness.
    fn poll_write_out(&mut self, mut cx: Option<&mut Context<'_>>) -> Poll<io::Result<()>> {
        if self.encoded == 0 {
            return Poll::Ready(Ok(()));
        }
        while self.written < self.encoded {
            match self
                .tcp
                .try_write(&self.outgoing[self.written..self.encoded])
            {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => match cx.as_deref_mut() {
                    Some(cx) => ready!(self.tcp.poll_write_ready(cx))?,
                    None => return Poll::Pending,
                },
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        self.sent_all();
        Poll::Ready(Ok(()))
    }

    fn sent_all(&mut self) {
        let batch = self.encoded;
        self.written = 0;
        self.encoded = 0;
        if self.outgoing.len() > KEEP_OUTGOING && batch < self.outgoing.len() / 2 {
            self.outgoing = Vec::new();
        }
    }

    /// Encrypts `data` to the end of `outgoing`.
    fn encrypt(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.close_queued {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        match self.process(None, Action::Encrypt(data))? {
            Progress::Done => Ok(data.len()),
            Progress::Closed => Err(io::ErrorKind::BrokenPipe.into()),
            // Writing needs the handshake done, which `accept` awaited.
            Progress::NeedsBytes => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    /// Ends a write that took `n` bytes: starts sending them, and what the socket does not
    /// take yet goes with the next write or flush.
    fn wrote(&mut self, cx: &mut Context<'_>, n: usize) -> Poll<io::Result<usize>> {
        match self.poll_write_out(Some(cx)) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            _ => Poll::Ready(Ok(n)),
        }
    }

    /// Copies plaintext held back from an earlier read.
    fn take_plaintext(&mut self, buf: &mut ReadBuf<'_>) {
        let n = buf.remaining().min(self.plaintext.len() - self.taken);
        buf.put_slice(&self.plaintext[self.taken..self.taken + n]);
        self.taken += n;
        if self.taken == self.plaintext.len() {
            self.plaintext = Vec::new();
            self.taken = 0;
        }
    }
}

/// Copies a record's plaintext into `read` as far as it has room, and the rest to `held`.
fn deliver(payload: &[u8], read: Option<&mut ReadBuf<'_>>, held: &mut Vec<u8>) {
    let mut rest = payload;
    // Held plaintext is older: new plaintext goes after it.
    if let Some(read) = read.filter(|_| held.is_empty()) {
        let n = read.remaining().min(rest.len());
        read.put_slice(&rest[..n]);
        rest = &rest[n..];
    }
    held.extend_from_slice(rest);
}

/// Small slices of one vectored write, gathered into one record: encrypted one by one, a
/// frame's header (HTTP/2's 9 bytes, the native link's few) would be a record of its own,
/// 22 bytes more on the wire and a seal and an open more. A run of one slice is encrypted
/// from where it lies; only a run of several is copied.
struct Gathered<'a> {
    /// The run's one slice so far, not copied.
    single: &'a [u8],
    /// The run copied, once it has more than one slice: `bytes[..copied]`.
    bytes: [u8; GATHER],
    copied: usize,
}

/// Slices up to this size, and runs of them up to it, are gathered.
const GATHER: usize = 2048;

impl Default for Gathered<'_> {
    fn default() -> Self {
        Self {
            single: &[],
            bytes: [0; GATHER],
            copied: 0,
        }
    }
}

impl<'a> Gathered<'a> {
    fn len(&self) -> usize {
        self.single.len() + self.copied
    }

    /// Adds `slice` to the run if it fits.
    fn add(&mut self, slice: &'a [u8]) -> bool {
        if self.len() + slice.len() > GATHER {
            return false;
        }
        if self.len() == 0 {
            self.single = slice;
            return true;
        }
        for part in [std::mem::take(&mut self.single), slice] {
            self.bytes[self.copied..self.copied + part.len()].copy_from_slice(part);
            self.copied += part.len();
        }
        true
    }

    /// The run, if there is one; empty after.
    fn take(&mut self) -> Option<&[u8]> {
        if !self.single.is_empty() {
            return Some(std::mem::take(&mut self.single));
        }
        let copied = std::mem::take(&mut self.copied);
        (copied > 0).then(|| &self.bytes[..copied])
    }
}

/// Appends to `outgoing[..*encoded]` what `write` puts in the room after it, growing the
/// buffer once to what `write` says it needs (`Err(Some(size))`; rustls checks the room
/// before it writes anything, and `resize` grows the buffer by doubling).
fn append(
    outgoing: &mut Vec<u8>,
    encoded: &mut usize,
    mut write: impl FnMut(&mut [u8]) -> Result<usize, Option<usize>>,
) -> io::Result<()> {
    let n = match write(&mut outgoing[*encoded..]) {
        Ok(n) => n,
        Err(Some(required)) => {
            outgoing.resize(*encoded + required, 0);
            write(&mut outgoing[*encoded..]).map_err(|_| {
                io::Error::other("TLS record does not fit the room rustls asked for")
            })?
        }
        Err(None) => return Err(io::Error::other("TLS record could not be written")),
    };
    *encoded += n;
    Ok(())
}

/// Appends a record rustls encoded (a handshake message, an alert, a key update).
fn encode<Data>(
    outgoing: &mut Vec<u8>,
    encoded: &mut usize,
    encoding: &mut EncodeTlsData<'_, Data>,
) -> io::Result<()> {
    append(outgoing, encoded, |out| {
        encoding.encode(out).map_err(|e| match e {
            EncodeError::InsufficientSize(size) => Some(size.required_size),
            _ => None,
        })
    })
}

/// The room an encryption said it needs, if that is why it failed.
fn encrypt_room(error: EncryptError) -> Option<usize> {
    match error {
        EncryptError::InsufficientSize(size) => Some(size.required_size),
        _ => None,
    }
}

/// A rustls error as tokio-rustls reports it, so that [`crate::HandshakeFailure`] finds it.
fn tls_error(error: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

impl AsyncRead for ServerTlsStream {
    /// Resolves once plaintext is there, or at the end, even for a `buf` with no room (the
    /// plaintext is then held for the next read): a caller can wait without a buffer.
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.taken < this.plaintext.len() {
            this.take_plaintext(buf);
            return Poll::Ready(Ok(()));
        }
        loop {
            let filled = buf.filled().len();
            let progress = this.process(Some(buf), Action::Nothing);
            // A key update's answer or an alert goes out with what the socket takes now.
            let sent = this.poll_write_out(None);
            let progress = progress?;
            if let Poll::Ready(Err(e)) = sent {
                return Poll::Ready(Err(e));
            }
            if buf.filled().len() > filled || !this.plaintext.is_empty() {
                return Poll::Ready(Ok(()));
            }
            if this.peer_closed || matches!(progress, Progress::Closed) {
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                let eof = "the peer closed the connection without a TLS close_notify";
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::UnexpectedEof, eof)));
            }
            ready!(this.poll_fill(cx))?;
        }
    }
}

impl AsyncWrite for ServerTlsStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // What earlier writes encrypted goes first, so the send buffer stays bounded.
        ready!(this.poll_write_out(Some(cx)))?;
        let n = this.encrypt(&data[..data.len().min(MAX_WRITE)])?;
        this.wrote(cx, n)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        slices: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_write_out(Some(cx)))?;
        let mut gathered = Gathered::default();
        let mut total = 0;
        let mut slices = slices.iter().filter(|s| !s.is_empty());
        loop {
            let room = MAX_WRITE - total - gathered.len();
            let next = slices
                .next()
                .map(|slice| &slice[..slice.len().min(room)])
                .filter(|slice| !slice.is_empty());
            if let Some(slice) = next
                && gathered.add(slice)
            {
                continue;
            }
            // A large slice, or the end: the run gathered goes first, as a record of its own.
            for part in gathered.take().into_iter().chain(next) {
                match this.encrypt(part) {
                    Ok(n) => total += n,
                    // Report what was taken; the error comes again on the next write.
                    Err(_) if total > 0 => return this.wrote(cx, total),
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            if next.is_none() {
                return this.wrote(cx, total);
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_out(Some(cx)))?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    /// Sends close_notify after everything written, then ends the socket's sending side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_queued {
            ready!(this.poll_write_out(Some(cx)))?;
            // `Closed`: both ends said so already, and there is nothing left to send.
            this.process(None, Action::CloseNotify)?;
            this.close_queued = true;
        }
        ready!(this.poll_write_out(Some(cx)))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;
    use tokio_rustls::TlsConnector;
    use tokio_rustls::client::TlsStream;

    use super::*;
    use crate::pki::Pki;
    use crate::{HandshakeFailure, TlsOptions, client_config_from_pem, server_config};

    /// Every wait in these tests is bounded by this.
    const BOUND: Duration = Duration::from_secs(10);

    async fn within<T>(wait: impl Future<Output = T>) -> T {
        tokio::time::timeout(BOUND, wait)
            .await
            .expect("done within the bound")
    }

    struct Ends {
        pki: Pki,
        _dir: tempfile::TempDir,
        config: Arc<ServerConfig>,
        listener: TcpListener,
    }

    /// A listener whose server wants an agent certificate and offers `h2`.
    async fn ends() -> Ends {
        let pki = Pki::generate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let files = pki.write_to(dir.path()).unwrap();
        let config = server_config(
            &files.server_cert,
            &files.server_key,
            Some(&files.ca_cert),
            &[b"h2"],
            &TlsOptions::default(),
        )
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Ends {
            pki,
            _dir: dir,
            config,
            listener,
        }
    }

    impl Ends {
        async fn client(&self, with_cert: bool) -> io::Result<TlsStream<TcpStream>> {
            let identity = (
                self.pki.agent_cert_pem.as_str(),
                self.pki.agent_key_pem.as_str(),
            );
            let config = client_config_from_pem(
                &self.pki.ca_cert_pem,
                with_cert.then_some(identity),
                vec![b"h2".to_vec()],
            )
            .unwrap();
            let tcp = TcpStream::connect(self.listener.local_addr().unwrap()).await?;
            let name = ServerName::try_from("localhost").unwrap();
            TlsConnector::from(config).connect(name, tcp).await
        }

        /// Accepts one connection and runs the server's handshake.
        async fn server(&self) -> Result<ServerTlsStream, (io::Error, TcpStream)> {
            let (tcp, _) = self.listener.accept().await.unwrap();
            accept(tcp, self.config.clone()).await
        }

        /// A client and the server's end of the same connection.
        async fn pair(&self) -> (TlsStream<TcpStream>, ServerTlsStream) {
            let (client, server) = tokio::join!(self.client(true), self.server());
            (client.unwrap(), server.map_err(|(e, _)| e).unwrap())
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[tokio::test]
    async fn bytes_cross_both_ways_whole_and_in_order() {
        let ends = ends().await;
        let (mut client, mut server) = ends.pair().await;
        assert_eq!(server.connection().alpn_protocol(), Some(&b"h2"[..]));
        assert!(server.connection().peer_certificates().is_some());
        let sent = pattern(3 << 20);
        let to_server = async {
            // Chunks from 1 byte to beyond a record and a write's limit.
            let mut rest = &sent[..];
            for size in [1, 100, 16_383, 16_385, 70_000, 200_000].iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let n = (*size).min(rest.len());
                client.write_all(&rest[..n]).await.unwrap();
                rest = &rest[n..];
            }
            client.flush().await.unwrap();
            let mut echoed = vec![0; sent.len()];
            client.read_exact(&mut echoed).await.unwrap();
            echoed
        };
        let echo = async {
            // Small reads (records are held back and delivered in order) and large ones;
            // each echoed as a vectored write of a small slice and the rest (gathered into
            // one record, or the rest as records of its own).
            let mut buf = vec![0u8; 40_000];
            let mut echoed = 0;
            for round in 0.. {
                if echoed == sent.len() {
                    break;
                }
                let limit = if round % 2 == 0 { 1000 } else { buf.len() };
                let n = server.read(&mut buf[..limit]).await.unwrap();
                assert_ne!(n, 0, "the stream ended early");
                let mut rest = &buf[..n];
                while !rest.is_empty() {
                    let (header, payload) = rest.split_at(rest.len().min(10));
                    let slices = [io::IoSlice::new(header), io::IoSlice::new(payload)];
                    let written = server.write_vectored(&slices).await.unwrap();
                    assert_ne!(written, 0);
                    rest = &rest[written..];
                }
                echoed += n;
            }
            server.flush().await.unwrap();
        };
        let (echoed, ()) = within(async { tokio::join!(to_server, echo) }).await;
        assert!(echoed == sent, "the echo differs from what was sent");
    }

    #[tokio::test]
    async fn a_key_update_is_answered_and_traffic_goes_on() {
        let ends = ends().await;
        let (mut client, mut server) = ends.pair().await;
        let mut buf = [0u8; 5];
        for round in 0..3u8 {
            client.get_mut().1.refresh_traffic_keys().unwrap();
            client.write_all(&[round; 5]).await.unwrap();
            within(server.read_exact(&mut buf)).await.unwrap();
            assert_eq!(buf, [round; 5]);
            server.write_all(&[round + 10; 5]).await.unwrap();
            server.flush().await.unwrap();
            within(client.read_exact(&mut buf)).await.unwrap();
            assert_eq!(buf, [round + 10; 5]);
        }
    }

    #[tokio::test]
    async fn an_idle_connection_holds_no_buffer() {
        let ends = ends().await;
        let (mut client, mut server) = ends.pair().await;
        client.write_all(&pattern(100_000)).await.unwrap();
        client.flush().await.unwrap();
        let mut got = vec![0; 100_000];
        server.read_exact(&mut got).await.unwrap();
        server.write_all(b"ok").await.unwrap();
        server.flush().await.unwrap();
        // Waiting for more, with no room even: nothing is there, and nothing is held.
        let waited = tokio::time::timeout(Duration::from_millis(50), server.read(&mut [])).await;
        assert!(waited.is_err(), "a read with nothing sent resolved");
        assert_eq!(server.incoming.capacity(), 0, "receive buffer held");
        assert_eq!(server.plaintext.capacity(), 0, "plaintext held");
        assert!(
            server.outgoing.capacity() <= KEEP_OUTGOING,
            "send buffer held"
        );
        // A wait with no room resolves once plaintext is there; the read then has it.
        client.write_all(b"more").await.unwrap();
        client.flush().await.unwrap();
        within(server.read(&mut [])).await.unwrap();
        let mut more = [0u8; 4];
        server.read_exact(&mut more).await.unwrap();
        assert_eq!(&more, b"more");
    }

    #[tokio::test]
    async fn close_notify_ends_the_stream_and_a_bare_end_is_an_error() {
        let ends = ends().await;
        let (mut client, mut server) = ends.pair().await;
        client.write_all(b"last").await.unwrap();
        client.shutdown().await.unwrap();
        let mut all = Vec::new();
        within(server.read_to_end(&mut all)).await.unwrap();
        assert_eq!(all, b"last");
        // This end may still send, then says so too.
        server.write_all(b"bye").await.unwrap();
        server.shutdown().await.unwrap();
        let mut reply = Vec::new();
        client.read_to_end(&mut reply).await.unwrap();
        assert_eq!(reply, b"bye");

        let (client, mut server) = ends.pair().await;
        // The TCP connection ends with no close_notify.
        let (mut tcp, _) = client.into_inner();
        tcp.shutdown().await.unwrap();
        let read = within(server.read(&mut [0; 8])).await;
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn a_refused_client_reads_the_alert() {
        let ends = ends().await;
        let (client, server) = tokio::join!(ends.client(false), ends.server());
        let (error, _tcp) = server.expect_err("a client without a certificate is refused");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(HandshakeFailure::find(&error).is_some(), "{error}");
        // TLS 1.3: the client finished its side; its first read is the server's alert.
        let mut client = client.unwrap();
        let read = within(client.read(&mut [0; 8])).await;
        let text = read.unwrap_err().to_string();
        assert!(text.contains("CertificateRequired"), "{text}");
    }

    #[tokio::test]
    async fn a_forged_record_fails_the_stream_for_good() {
        let ends = ends().await;
        let (mut client, mut server) = ends.pair().await;
        // An application-data record the client's keys did not seal.
        let tcp = client.get_mut().0;
        let mut forged = vec![0x17, 0x03, 0x03, 0x00, 21];
        forged.extend_from_slice(&[0xab; 21]);
        tcp.write_all(&forged).await.unwrap();
        let read = within(server.read(&mut [0; 64])).await;
        let error = read.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
        assert!(error.to_string().contains("ecrypt"), "{error}");
        // Reads and writes fail from then on, without running rustls again.
        assert!(server.read(&mut [0; 64]).await.is_err());
        assert!(server.write_all(b"more").await.is_err());
        // The client hears why.
        let heard = within(client.read(&mut [0; 8])).await;
        let text = heard.unwrap_err().to_string();
        assert!(text.contains("BadRecordMac"), "{text}");
    }

    #[tokio::test]
    async fn bytes_that_are_not_tls_are_an_error() {
        let ends = ends().await;
        let garbage = async {
            let mut tcp = TcpStream::connect(ends.listener.local_addr().unwrap())
                .await
                .unwrap();
            tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            tcp
        };
        let (_tcp, server) = tokio::join!(garbage, ends.server());
        let (error, _) = server.expect_err("not TLS");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        // A peer that only closes is an early end, which the server does not log as a refusal.
        let quiet = async {
            drop(
                TcpStream::connect(ends.listener.local_addr().unwrap())
                    .await
                    .unwrap(),
            );
        };
        let ((), server) = tokio::join!(quiet, ends.server());
        let (error, _) = server.expect_err("no handshake");
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
    }
}
