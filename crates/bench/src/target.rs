//! The destination every workload talks to, run as its own process (`tether-bench target`)
//! so that its sockets and CPU are nobody else's.
//!
//! One TCP port, so that an SSH forward reaches every mode. The first byte picks the mode:
//! - `S` sink: an 8-byte big-endian length L follows; the target reads L bytes and answers
//!   with the 8-byte count. (Konnectivity has no half-close, so the end is in-band.)
//! - `R` source: an 8-byte length L follows; the target writes L bytes.
//! - `E` echo: everything after the byte is echoed back until EOF.

use std::time::Duration;
use tokio::time::Instant;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const SINK: u8 = b'S';
pub const SOURCE: u8 = b'R';
pub const ECHO: u8 = b'E';

/// Buffer of the target and the load generator for bulk transfers.
pub const BULK_BUF: usize = 256 * 1024;

/// Serves until killed; prints `127.0.0.1:<port>` on stdout once listening.
pub async fn serve(listen: &str) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    println!("{}", listener.local_addr()?);
    loop {
        let (socket, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                eprintln!("target: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        tokio::spawn(async move {
            if let Err(e) = handle(socket).await {
                // Resets are normal (stalled connections are closed abruptly).
                if std::env::var_os("TETHER_BENCH_TARGET_DEBUG").is_some() {
                    eprintln!("target: {e:#}");
                }
            }
        });
    }
}

async fn handle(mut socket: TcpStream) -> anyhow::Result<()> {
    let mut mode = [0u8; 1];
    socket.read_exact(&mut mode).await?;
    match mode[0] {
        SINK => {
            let len = socket.read_u64().await?;
            let mut buf = vec![0u8; BULK_BUF];
            let mut got = 0u64;
            while got < len {
                let want = ((len - got) as usize).min(buf.len());
                let n = socket.read(&mut buf[..want]).await?;
                if n == 0 {
                    bail!("sink: EOF after {got} of {len} bytes");
                }
                got += n as u64;
            }
            socket.write_u64(got).await?;
            socket.flush().await?;
            // Wait for the client to close so the count surely leaves.
            let _ = socket.read(&mut buf).await;
        }
        SOURCE => {
            let len = socket.read_u64().await?;
            let buf = vec![0x5au8; BULK_BUF];
            let mut sent = 0u64;
            while sent < len {
                let n = ((len - sent) as usize).min(buf.len());
                socket.write_all(&buf[..n]).await?;
                sent += n as u64;
            }
            socket.flush().await?;
            let mut rest = [0u8; 64];
            let _ = socket.read(&mut rest).await;
        }
        ECHO => {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = socket.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                socket.write_all(&buf[..n]).await?;
            }
        }
        other => bail!("unknown mode byte {other:#x}"),
    }
    Ok(())
}

/// Any tunnelled connection, as the workloads see it.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}
pub type BoxStream = Box<dyn Stream>;

/// Uploads `len` bytes to the sink and waits for its count; returns the elapsed time from
/// the first byte to the count. Gives up at `deadline`.
pub async fn upload(s: &mut BoxStream, len: u64, deadline: Instant) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let work = async {
        let mut head = [0u8; 9];
        head[0] = SINK;
        head[1..].copy_from_slice(&len.to_be_bytes());
        s.write_all(&head).await?;
        let buf = vec![0xa5u8; BULK_BUF];
        let mut sent = 0u64;
        while sent < len {
            let n = ((len - sent) as usize).min(buf.len());
            s.write_all(&buf[..n]).await?;
            sent += n as u64;
        }
        s.flush().await?;
        let got = s.read_u64().await.context("reading the sink's count")?;
        if got != len {
            bail!("sink counted {got} of {len} bytes");
        }
        anyhow::Ok(())
    };
    match tokio::time::timeout_at(deadline, work).await {
        Ok(r) => r.map(|()| start.elapsed()),
        Err(_) => bail!("upload of {len} bytes not done in time"),
    }
}

/// Asks the source for `len` bytes and reads them. Stops at `deadline`; returns the bytes
/// read and the elapsed time (complete when bytes == len).
pub async fn download(
    s: &mut BoxStream,
    len: u64,
    deadline: Instant,
) -> anyhow::Result<(u64, Duration)> {
    let start = Instant::now();
    let mut head = [0u8; 9];
    head[0] = SOURCE;
    head[1..].copy_from_slice(&len.to_be_bytes());
    s.write_all(&head).await?;
    s.flush().await?;
    let mut buf = vec![0u8; BULK_BUF];
    let mut got = 0u64;
    while got < len {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) => bail!("source: EOF after {got} of {len} bytes"),
            Ok(Ok(n)) => got += n as u64,
            Ok(Err(e)) => return Err(e).context(format!("source: after {got} of {len} bytes")),
            Err(_) => break,
        }
    }
    Ok((got, start.elapsed()))
}

/// Starts a source of `len` bytes without reading it (the stalled reader of the
/// head-of-line workload).
pub async fn request_source(s: &mut BoxStream, len: u64) -> anyhow::Result<()> {
    let mut head = [0u8; 9];
    head[0] = SOURCE;
    head[1..].copy_from_slice(&len.to_be_bytes());
    s.write_all(&head).await?;
    s.flush().await?;
    Ok(())
}

/// Switches a fresh connection to echo and bounces `first` through it.
pub async fn echo_start(s: &mut BoxStream, first: &[u8]) -> anyhow::Result<()> {
    let mut msg = Vec::with_capacity(first.len() + 1);
    msg.push(ECHO);
    msg.extend_from_slice(first);
    s.write_all(&msg).await?;
    s.flush().await?;
    let mut back = vec![0u8; first.len()];
    s.read_exact(&mut back).await?;
    if back != first {
        bail!("echo returned different bytes");
    }
    Ok(())
}

/// One round trip on a connection already in echo mode.
pub async fn echo_round(s: &mut BoxStream, msg: &[u8], back: &mut [u8]) -> anyhow::Result<()> {
    s.write_all(msg).await?;
    s.flush().await?;
    s.read_exact(back).await?;
    Ok(())
}
