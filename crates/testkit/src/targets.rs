//! Loopback destinations for tunnelled connections.

use std::future::Future;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// A TCP server on 127.0.0.1 running `handle` for every connection. Dropping it stops the
/// accept loop and every connection it is still serving.
#[derive(Debug)]
struct LoopbackServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl LoopbackServer {
    async fn start<F, Fut>(handle: F) -> std::io::Result<Self>
    where
        F: Fn(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self::start_at("127.0.0.1:0".parse().expect("literal"), handle).await
    }

    /// Listens on `addr`, which must be a loopback address (127.0.0.0/8 or ::1).
    async fn start_at<F, Fut>(addr: SocketAddr, handle: F) -> std::io::Result<Self>
    where
        F: Fn(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        assert!(
            addr.ip().is_loopback(),
            "test servers listen on loopback only"
        );
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            // Owned here, so aborting this task aborts the connections too.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            // As tether's own sockets: with Nagle on, an echo's second write
                            // waits for the peer's delayed ACK, 40 ms per round trip.
                            let _ = stream.set_nodelay(true);
                            connections.spawn(handle(stream));
                        }
                        Err(_) => return,
                    },
                    Some(_) = connections.join_next() => {}
                }
            }
        });
        Ok(Self { addr, task })
    }
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Echoes every byte back.
#[derive(Debug)]
pub struct EchoServer {
    pub addr: SocketAddr,
    _server: LoopbackServer,
}

impl EchoServer {
    pub async fn start() -> std::io::Result<Self> {
        Self::start_at("127.0.0.1:0".parse().expect("literal")).await
    }

    /// An echo server on a given loopback address, such as `127.0.2.1:0` or `[::1]:0`.
    pub async fn start_at(addr: SocketAddr) -> std::io::Result<Self> {
        let server = LoopbackServer::start_at(addr, |mut stream| async move {
            let (mut rd, mut wr) = stream.split();
            let _ = tokio::io::copy(&mut rd, &mut wr).await;
            let _ = wr.shutdown().await;
        })
        .await?;
        Ok(Self {
            addr: server.addr,
            _server: server,
        })
    }

    /// An echo server on another loopback address than 127.0.0.1 (such as `[::1]:0`), on
    /// none of the ports in `taken`: an agent refuses to dial its own listeners' ports on any
    /// loopback address, and an ephemeral port number can come up again on another address.
    pub async fn start_apart_from(addr: SocketAddr, taken: &[u16]) -> std::io::Result<Self> {
        for _ in 0..10 {
            let echo = Self::start_at(addr).await?;
            if !taken.contains(&echo.addr.port()) {
                return Ok(echo);
            }
        }
        Err(std::io::Error::other(format!(
            "10 ports on {addr} in a row were among {taken:?}"
        )))
    }
}

/// A small HTTP/1.1 server: `GET /bytes/N` returns N bytes of a pattern, anything else
/// `200 ok`. One request per connection.
#[derive(Debug)]
pub struct HttpTarget {
    pub addr: SocketAddr,
    _server: LoopbackServer,
}

impl HttpTarget {
    pub async fn start() -> std::io::Result<Self> {
        let server = LoopbackServer::start(|mut stream| async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let text = String::from_utf8_lossy(&head);
            let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
            let body = match path
                .strip_prefix("/bytes/")
                .and_then(|n| n.parse::<usize>().ok())
            {
                Some(n) => pattern(0, n),
                None => b"ok".to_vec(),
            };
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.write_all(&body).await;
            let _ = stream.shutdown().await;
        })
        .await?;
        Ok(Self {
            addr: server.addr,
            _server: server,
        })
    }
}

/// Reads an 8-byte big-endian count, then sends that many bytes (`u64::MAX`: until the peer
/// goes away) and closes.
#[derive(Debug)]
pub struct SourceServer {
    pub addr: SocketAddr,
    _server: LoopbackServer,
}

impl SourceServer {
    pub async fn start() -> std::io::Result<Self> {
        let server = LoopbackServer::start(|mut stream| async move {
            let Ok(mut left) = stream.read_u64().await else {
                return;
            };
            let chunk = vec![0x5a_u8; 64 * 1024];
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                if stream.write_all(&chunk[..n]).await.is_err() {
                    return;
                }
                left -= n as u64;
            }
            let _ = stream.shutdown().await;
        })
        .await?;
        Ok(Self {
            addr: server.addr,
            _server: server,
        })
    }
}

/// A deterministic byte pattern, different for each `seed`, for byte-exact checks.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A loopback address nothing listens on (bound, then released).
pub fn refused_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    listener.local_addr().expect("local addr")
}

/// A loopback address whose connects hang: a listener with a backlog of one that is never
/// accepted from and already holds a connection, so Linux drops further SYNs and the
/// dialer waits. Stays on loopback, unlike upstream's blackhole tests.
#[derive(Debug)]
pub struct Blackhole {
    pub addr: SocketAddr,
    _listener: tokio::net::TcpListener,
    _fillers: Vec<tokio::net::TcpStream>,
}

impl Blackhole {
    pub async fn start() -> std::io::Result<Self> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind("127.0.0.1:0".parse().expect("loopback"))?;
        let listener = socket.listen(1)?;
        let addr = listener.local_addr()?;
        // Fill the accept queue (a backlog of 1 admits 2); further SYNs are dropped.
        let mut fillers = Vec::new();
        for _ in 0..4 {
            match tokio::time::timeout(
                std::time::Duration::from_millis(200),
                tokio::net::TcpStream::connect(addr),
            )
            .await
            {
                Ok(Ok(stream)) => fillers.push(stream),
                _ => break,
            }
        }
        Ok(Self {
            addr,
            _listener: listener,
            _fillers: fillers,
        })
    }
}
