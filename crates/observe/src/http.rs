//! A minimal HTTP/1.1 server for the health and admin endpoints.
//!
//! One request per connection (`Connection: close`), request bodies ignored, 1 MiB of request
//! head as upstream's Go servers allow, and [`HttpLimits`]: a cap on open connections and a
//! short deadline for the request head, so that idle connections cannot use up the process's
//! file descriptors (which the agent and frontend listeners need too). That is all probes and
//! scrapers need, without pulling in a general-purpose HTTP stack.

use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout, timeout_at};

use crate::metrics::{self, Counter, Registry};

/// Whether two TCP listeners would take the same connections: the same (non-zero) port on
/// the same address, or on any address when either is the unspecified one. The server and
/// the agent refuse such pairs among their own listeners before binding, naming both flags.
pub fn tcp_overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Answers one request. Handlers are synchronous: health checks and metric rendering only
/// read in-memory state.
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// A response that takes time to produce (a CPU profile over N seconds), computed on the
/// request's own task.
pub type Deferred = std::pin::Pin<Box<dyn Future<Output = Response> + Send>>;

/// Routes answered asynchronously, asked before the [`Handler`]: `None` passes the request on.
#[derive(Clone)]
pub struct DeferredHandler(Arc<DeferredRoutes>);

type DeferredRoutes = dyn Fn(&Request) -> Option<Deferred> + Send + Sync;

impl DeferredHandler {
    pub fn new(routes: impl Fn(&Request) -> Option<Deferred> + Send + Sync + 'static) -> Self {
        Self(Arc::new(routes))
    }

    fn answer(&self, request: &Request) -> Option<Deferred> {
        (self.0)(request)
    }
}

impl std::fmt::Debug for DeferredHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeferredHandler")
    }
}

/// Go's `http.Server.MaxHeaderBytes` as upstream sets it.
const MAX_HEADER_BYTES: usize = 1 << 20;
/// Bounds how long a client that stops reading can hold a connection task.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long in-flight connections get after shutdown before they are aborted.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// How long to wait for the client to close after the response (Go's rstAvoidanceDelay).
const LINGER: Duration = Duration::from_millis(500);
/// Up to this much of an incomplete head, the request line is checked after every read.
const EARLY_CHECK_BYTES: usize = 8 * 1024;

const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

/// What one health or admin listener allows.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// Open connections; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// How long a client may take to send its request head (Go's `ReadHeaderTimeout`;
    /// upstream's 60 s let idle connections pile up). Probes and scrapers send it at once.
    pub read_header_timeout: Duration,
    /// Counts the connections closed at accept for `max_connections`.
    pub refused: Option<Arc<Counter>>,
}

/// The default of `--max-health-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 128;

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            read_header_timeout: Duration::from_secs(10),
            refused: None,
        }
    }
}

/// The parts of a request the endpoints look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The raw (not percent-decoded) path, such as `/readyz`.
    pub path: String,
    /// The raw query without `?`, such as `verbose`; `None` when there was no `?`.
    pub query: Option<String>,
    /// The `Host` header, or the authority of an absolute-form target (as Go's `r.Host`).
    pub host: Option<String>,
    /// The local address the connection was accepted on (what the client reached, which
    /// unlike `host` it cannot choose).
    pub local_addr: Option<SocketAddr>,
}

/// What to send back. `Content-Length` and `Connection: close` are added when writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Sent as `Content-Type` unless empty.
    pub content_type: &'static str,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// A `text/plain; charset=utf-8` response, the type Go sniffs for handlers that write
    /// `ok`.
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Response {
            status,
            content_type: TEXT_PLAIN,
            headers: Vec::new(),
            body: body.into().into_bytes(),
        }
    }

    /// A redirect with the small HTML body Go's `http.Redirect` writes.
    pub fn redirect(status: u16, location: impl Into<String>) -> Self {
        let location = location.into();
        let body = format!(
            "<a href=\"{}\">{}</a>.\n\n",
            html_escape(&location),
            reason_phrase(status)
        );
        Response {
            status,
            content_type: "text/html; charset=utf-8",
            headers: vec![("Location".to_owned(), location)],
            body: body.into_bytes(),
        }
    }

    /// A JSON body (the admin port's `/debug/` views).
    pub fn json(status: u16, body: Vec<u8>) -> Self {
        Response {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body,
        }
    }

    /// `value` as pretty JSON with status 200 (500 if it cannot be encoded).
    pub fn json_of<T: serde::Serialize>(value: &T) -> Self {
        match serde_json::to_vec_pretty(value) {
            Ok(body) => Self::json(200, body),
            Err(e) => Self::text(500, format!("encoding the report: {e}\n")),
        }
    }

    /// Binary data (a pprof profile).
    pub fn bytes(status: u16, content_type: &'static str, body: Vec<u8>) -> Self {
        Response {
            status,
            content_type,
            headers: Vec::new(),
            body,
        }
    }

    /// Go's `http.NotFound`.
    pub fn not_found() -> Self {
        let mut response = Response::text(404, "404 page not found\n");
        response
            .headers
            .push(("X-Content-Type-Options".to_owned(), "nosniff".to_owned()));
        response
    }

    /// The registry's current values, with the Prometheus text format's content type.
    pub fn metrics(registry: &Registry) -> Self {
        Response {
            status: 200,
            content_type: metrics::CONTENT_TYPE,
            headers: Vec::new(),
            body: registry.render().into_bytes(),
        }
    }

    /// The bare response Go's server writes itself for requests it cannot parse.
    fn server_error(status: u16) -> Self {
        Response::text(status, format!("{status} {}", reason_phrase(status)))
    }

    fn encode(&self, head_only: bool) -> Vec<u8> {
        let mut head = String::with_capacity(160);
        let reason = reason_phrase(self.status);
        if reason.is_empty() {
            let _ = write!(head, "HTTP/1.1 {0} status code {0}\r\n", self.status);
        } else {
            let _ = write!(head, "HTTP/1.1 {} {reason}\r\n", self.status);
        }
        if !self.content_type.is_empty() {
            push_header(&mut head, "Content-Type", self.content_type);
        }
        for (name, value) in &self.headers {
            push_header(&mut head, name, value);
        }
        push_header(&mut head, "Content-Length", &self.body.len().to_string());
        head.push_str("Connection: close\r\n\r\n");
        let mut bytes = head.into_bytes();
        if !head_only {
            bytes.extend_from_slice(&self.body);
        }
        bytes
    }
}

/// Writes `name: value`, dropping CR and LF so that a value derived from the request (a
/// redirect to the client's Host) can never split the header.
fn push_header(head: &mut String, name: &str, value: &str) {
    let clean = |s: &str| {
        s.chars()
            .filter(|&c| c != '\r' && c != '\n')
            .collect::<String>()
    };
    head.push_str(&clean(name));
    head.push_str(": ");
    head.push_str(&clean(value));
    head.push_str("\r\n");
}

/// Go's `htmlEscape`, used in redirect bodies.
fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The reason phrase Go's `http.StatusText` gives, or `""` for codes it does not know (the
/// status line then reads `status code N`, as Go writes it).
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        413 => "Request Entity Too Large",
        414 => "Request URI Too Long",
        415 => "Unsupported Media Type",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// Accepts connections until `shutdown` resolves, answering each with `handler` on its own
/// task, within `limits`. Returns once every connection has finished, or 1 s after shutdown,
/// when the stragglers are aborted.
pub async fn serve(
    listener: TcpListener,
    handler: Handler,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) {
    serve_with(listener, handler, None, limits, shutdown).await;
}

/// As [`serve`], with `deferred` asked first for each request.
pub async fn serve_with(
    listener: TcpListener,
    handler: Handler,
    deferred: Option<DeferredHandler>,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut connections = JoinSet::new();
    let mut backoff: Option<Duration> = None;
    loop {
        let listener = &listener;
        let accept = async move {
            if let Some(delay) = backoff {
                tokio::time::sleep(delay).await;
            }
            listener.accept().await
        };
        tokio::select! {
            () = &mut shutdown => break,
            // Reap finished connections so the set does not grow without bound.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = accept => match accepted {
                Ok((stream, _)) => {
                    backoff = None;
                    while connections.try_join_next().is_some() {}
                    if connections.len() >= limits.max_connections {
                        // Closed at once: the descriptor is back before the next accept.
                        drop(stream);
                        if let Some(refused) = &limits.refused {
                            refused.inc();
                        }
                        continue;
                    }
                    connections.spawn(handle_connection(
                        stream,
                        Arc::clone(&handler),
                        deferred.clone(),
                        limits.read_header_timeout,
                    ));
                }
                Err(error) => {
                    // Like Go's server: back off on errors such as EMFILE instead of spinning.
                    let delay = backoff.map_or(Duration::from_millis(5), |d| {
                        (d * 2).min(Duration::from_secs(1))
                    });
                    tracing::warn!(%error, ?delay, "accepting an HTTP connection failed");
                    backoff = Some(delay);
                }
            },
        }
    }
    drop(listener);
    let drained = timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::debug!(
            remaining = connections.len(),
            "aborting HTTP connections after shutdown"
        );
    }
    connections.shutdown().await;
}

async fn handle_connection(
    mut stream: TcpStream,
    handler: Handler,
    deferred: Option<DeferredHandler>,
    read_header_timeout: Duration,
) {
    let (response, head_only) = match read_request(&mut stream, read_header_timeout).await {
        Ok(request) => {
            let response = match deferred.as_ref().and_then(|d| d.answer(&request)) {
                Some(later) => later.await,
                None => handler(&request),
            };
            (response, request.method == "HEAD")
        }
        Err(HeadError::Malformed) => (Response::server_error(400), false),
        Err(HeadError::TooLarge) => (Response::server_error(431), false),
        Err(HeadError::Gone) => return,
    };
    let bytes = response.encode(head_only);
    if !matches!(
        timeout(WRITE_TIMEOUT, stream.write_all(&bytes)).await,
        Ok(Ok(()))
    ) {
        return;
    }
    // Closing with unread request bytes makes the kernel send RST, which can destroy the
    // response before the client reads it; so half-close and let the client close first.
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 1024];
    let _ = timeout(LINGER, async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    /// Answer 400.
    Malformed,
    /// Answer 431.
    TooLarge,
    /// Closed, failed or timed out: close without answering, as Go does.
    Gone,
}

async fn read_request(
    stream: &mut TcpStream,
    read_header_timeout: Duration,
) -> Result<Request, HeadError> {
    let deadline = Instant::now() + read_header_timeout;
    let mut buf = Vec::with_capacity(1024);
    loop {
        let scanned = buf.len();
        buf.reserve(4096);
        match timeout_at(deadline, stream.read_buf(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Err(HeadError::Gone),
            Ok(Ok(_)) => {}
        }
        if let Some(end) = head_end(&buf, scanned.saturating_sub(2)) {
            if end > MAX_HEADER_BYTES {
                return Err(HeadError::TooLarge);
            }
            let mut request = parse_head(&buf[..end])?;
            request.local_addr = stream.local_addr().ok();
            return Ok(request);
        }
        if buf.len() >= MAX_HEADER_BYTES {
            return Err(HeadError::TooLarge);
        }
        // Reject a bad request line (say, a TLS handshake) now rather than after 60 s. Only
        // while the buffer is small, so a trickled huge line cannot make every read rescan it.
        if buf.len() <= EARLY_CHECK_BYTES {
            let mut no_headers = [];
            match httparse::Request::new(&mut no_headers).parse(&buf) {
                Ok(_) | Err(httparse::Error::TooManyHeaders) => {}
                Err(_) => return Err(HeadError::Malformed),
            }
        }
    }
}

/// The length of the request head (through the empty line) if `buf` holds all of it.
/// httparse accepts bare LF line endings, so this does too.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    (from..buf.len())
        .filter(|&i| buf[i] == b'\n')
        .find_map(|i| match &buf[i + 1..] {
            [b'\n', ..] => Some(i + 2),
            [b'\r', b'\n', ..] => Some(i + 3),
            _ => None,
        })
}

fn parse_head(head: &[u8]) -> Result<Request, HeadError> {
    let lines = head.iter().filter(|&&b| b == b'\n').count();
    let mut headers = vec![httparse::EMPTY_HEADER; lines];
    let mut parsed = httparse::Request::new(&mut headers);
    if !matches!(parsed.parse(head), Ok(httparse::Status::Complete(_))) {
        return Err(HeadError::Malformed);
    }
    let (Some(method), Some(target), Some(version)) = (parsed.method, parsed.path, parsed.version)
    else {
        return Err(HeadError::Malformed);
    };
    let mut hosts = parsed
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"));
    let host_header = match (hosts.next(), hosts.next()) {
        (Some(host), None) => {
            let value = std::str::from_utf8(host.value).map_err(|_| HeadError::Malformed)?;
            Some(value.to_owned())
        }
        // Go rejects several Host headers, and HTTP/1.1 requests without one.
        (Some(_), Some(_)) => return Err(HeadError::Malformed),
        (None, _) if version == 1 => return Err(HeadError::Malformed),
        (None, _) => None,
    };
    let (authority, path_and_query) = split_target(target).ok_or(HeadError::Malformed)?;
    let (path, query) = match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query.to_owned())),
        None => (path_and_query, None),
    };
    Ok(Request {
        method: method.to_owned(),
        path: if path.is_empty() { "/" } else { path }.to_owned(),
        query,
        host: authority.map(str::to_owned).or(host_header),
        local_addr: None,
    })
}

/// Splits a request target into the authority of an absolute-form target (if non-empty) and
/// the path with query. `None` for forms a health server has no use for.
fn split_target(target: &str) -> Option<(Option<&str>, &str)> {
    if target.starts_with('/') || target == "*" {
        return Some((None, target));
    }
    let (scheme, rest) = target.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    Some((Some(authority).filter(|a| !a.is_empty()), path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_overlap_as_listeners_would() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(tcp_overlaps(addr("127.0.0.1:8131"), addr("127.0.0.1:8131")));
        assert!(tcp_overlaps(addr("0.0.0.0:8131"), addr("127.0.0.1:8131")));
        assert!(tcp_overlaps(addr("[::]:8131"), addr("127.0.0.1:8131")));
        assert!(!tcp_overlaps(
            addr("127.0.0.1:8131"),
            addr("127.0.0.2:8131")
        ));
        assert!(!tcp_overlaps(
            addr("127.0.0.1:8131"),
            addr("127.0.0.1:8132")
        ));
        assert!(
            !tcp_overlaps(addr("127.0.0.1:0"), addr("127.0.0.1:0")),
            "ephemeral"
        );
    }
    use std::net::SocketAddr;
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;

    #[test]
    fn parses_heads() {
        let req = parse_head(b"GET /readyz?verbose HTTP/1.1\r\nhOsT: a:1\r\n\r\n").unwrap();
        assert_eq!(
            req,
            Request {
                method: "GET".to_owned(),
                path: "/readyz".to_owned(),
                query: Some("verbose".to_owned()),
                host: Some("a:1".to_owned()),
                local_addr: None,
            }
        );
        let req = parse_head(b"GET http://b:2?x HTTP/1.1\nHost: a\n\n").unwrap();
        assert_eq!((req.path.as_str(), req.query.as_deref()), ("/", Some("x")));
        assert_eq!(req.host.as_deref(), Some("b:2"));
        let req = parse_head(b"HEAD /healthz HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(req.host, None);
        for bad in [
            &b"GET /healthz HTTP/1.1\r\n\r\n"[..],
            b"GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"GET x HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET ftp://a/x HTTP/1.1\r\nHost: a\r\n\r\n",
            b"\r\n\r\n",
        ] {
            let shown = String::from_utf8_lossy(bad);
            assert_eq!(parse_head(bad), Err(HeadError::Malformed), "{shown}");
        }
    }

    #[test]
    fn encodes_like_go() {
        let encoded = Response::text(200, "ok").encode(false);
        assert_eq!(
            String::from_utf8(encoded).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n\
             Content-Length: 2\r\nConnection: close\r\n\r\nok"
        );
        let encoded = Response::text(599, "").encode(true);
        assert!(encoded.starts_with(b"HTTP/1.1 599 status code 599\r\n"));
        let mut evil = Response::redirect(301, "//x\r\nSet-Cookie: a=b/<p>");
        evil.content_type = "";
        let encoded = String::from_utf8(evil.encode(false)).unwrap();
        assert!(
            encoded.starts_with(
                "HTTP/1.1 301 Moved Permanently\r\nLocation: //xSet-Cookie: a=b/<p>\r\n"
            )
        );
        assert!(encoded.ends_with("Moved Permanently</a>.\n\n"));
        assert!(encoded.contains("&lt;p&gt;"));
    }

    struct Server {
        addr: SocketAddr,
        stop: oneshot::Sender<()>,
        task: JoinHandle<()>,
    }

    async fn start() -> Server {
        start_limited(HttpLimits::default()).await
    }

    async fn start_limited(limits: HttpLimits) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let registry = Registry::new();
        registry.counter("hits", "Hits.").inc();
        let handler: Handler = Arc::new(move |req: &Request| match req.path.as_str() {
            "/healthz" => Response::text(200, "ok"),
            "/metrics" => Response::metrics(&registry),
            "/admin/metrics" => Response::redirect(
                301,
                format!("http://{}/metrics", req.local_addr.expect("TCP")),
            ),
            _ => Response::not_found(),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, handler, limits, async move {
            let _ = stopped.await;
        }));
        Server { addr, stop, task }
    }

    /// Sends `request` and returns everything the server wrote until it closed.
    async fn exchange(addr: SocketAddr, request: Vec<u8>) -> String {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut read, mut write) = stream.into_split();
        // Write concurrently: the server may answer before it has read everything.
        let writer = tokio::spawn(async move {
            let _ = write.write_all(&request).await;
            write
        });
        let mut response = Vec::new();
        let _ = read.read_to_end(&mut response).await;
        drop(writer.await);
        String::from_utf8_lossy(&response).into_owned()
    }

    fn get(path: &str) -> Vec<u8> {
        format!("GET {path} HTTP/1.1\r\nHost: localhost:8094\r\nUser-Agent: test\r\n\r\n")
            .into_bytes()
    }

    #[tokio::test]
    async fn serves_over_loopback() {
        let server = start().await;
        let ok = exchange(server.addr, get("/healthz")).await;
        assert_eq!(
            ok,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n\
             Content-Length: 2\r\nConnection: close\r\n\r\nok"
        );

        let metrics = exchange(server.addr, get("/metrics?x=1")).await;
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        assert!(metrics.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        assert!(metrics.ends_with("\r\n\r\n# HELP hits Hits.\n# TYPE hits counter\nhits 1\n"));

        let missing = exchange(server.addr, get("/nope")).await;
        assert!(
            missing.starts_with("HTTP/1.1 404 Not Found\r\n"),
            "{missing}"
        );
        assert!(missing.ends_with("\r\n\r\n404 page not found\n"));

        let moved = exchange(server.addr, get("/admin/metrics")).await;
        assert!(
            moved.starts_with("HTTP/1.1 301 Moved Permanently\r\n"),
            "{moved}"
        );
        assert!(
            moved.contains(&format!("\r\nLocation: http://{}/metrics\r\n", server.addr)),
            "the connection's own address, not the Host header: {moved}"
        );

        let head = b"HEAD /healthz HTTP/1.1\r\nHost: h\r\n\r\n".to_vec();
        let head = exchange(server.addr, head).await;
        assert!(
            head.ends_with("Content-Length: 2\r\nConnection: close\r\n\r\n"),
            "{head}"
        );

        // A body is ignored, and the response still arrives intact.
        let mut post =
            b"POST /healthz HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n".to_vec();
        post.resize(post.len() + 100_000, b'x');
        assert!(exchange(server.addr, post).await.ends_with("\r\n\r\nok"));

        server.stop.send(()).unwrap();
        server.task.await.unwrap();
    }

    #[tokio::test]
    async fn rejects_garbage_and_oversized_heads() {
        let server = start().await;
        let garbage = exchange(server.addr, b"GARBAGE\r\n\r\n".to_vec()).await;
        assert!(
            garbage.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{garbage}"
        );
        assert!(garbage.ends_with("\r\n\r\n400 Bad Request"));

        // A TLS ClientHello is rejected at once, without waiting for an end of head.
        let hello = vec![
            0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
        ];
        let hello = timeout(Duration::from_secs(5), exchange(server.addr, hello)).await;
        assert!(hello.unwrap().starts_with("HTTP/1.1 400 Bad Request\r\n"));

        let mut big = b"GET / HTTP/1.1\r\nHost: h\r\nX-Big: ".to_vec();
        big.resize(MAX_HEADER_BYTES + 10_000, b'a');
        let too_large = exchange(server.addr, big).await;
        assert!(
            too_large.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{too_large}"
        );
        assert!(too_large.ends_with("\r\n\r\n431 Request Header Fields Too Large"));

        server.stop.send(()).unwrap();
        server.task.await.unwrap();
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_are_closed_and_idle_ones_time_out() {
        let refused = Arc::new(Counter::default());
        let server = start_limited(HttpLimits {
            max_connections: 3,
            read_header_timeout: Duration::from_millis(600),
            refused: Some(refused.clone()),
        })
        .await;
        let mut idle = Vec::new();
        for _ in 0..3 {
            idle.push(TcpStream::connect(server.addr).await.unwrap());
        }
        // Accepted in order: once the fourth is closed, the three are being held.
        let mut extra = TcpStream::connect(server.addr).await.unwrap();
        let mut rest = Vec::new();
        let read = timeout(Duration::from_secs(5), extra.read_to_end(&mut rest)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
        assert_eq!(refused.get(), 1);
        // The idle ones are closed after the head deadline, and room is made again.
        for mut conn in idle {
            let read = timeout(Duration::from_secs(5), conn.read_to_end(&mut rest)).await;
            assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
        }
        let ok = timeout(
            Duration::from_secs(5),
            exchange(server.addr, get("/healthz")),
        )
        .await;
        assert!(ok.unwrap().ends_with("\r\n\r\nok"));
        server.stop.send(()).unwrap();
        server.task.await.unwrap();
    }

    #[tokio::test]
    async fn shutdown_aborts_idle_connections_promptly() {
        let server = start().await;
        // A client that connects and never finishes its request head.
        let mut idle = TcpStream::connect(server.addr).await.unwrap();
        idle.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        // Make sure the server has accepted it before shutting down.
        tokio::time::sleep(Duration::from_millis(50)).await;

        let started = Instant::now();
        server.stop.send(()).unwrap();
        timeout(Duration::from_secs(3), server.task)
            .await
            .expect("serve returns within the grace period")
            .unwrap();
        assert!(started.elapsed() < Duration::from_millis(1_900));

        let mut rest = Vec::new();
        let read = timeout(Duration::from_secs(1), idle.read_to_end(&mut rest)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "connection closed: {read:?}"
        );
        assert!(
            TcpStream::connect(server.addr).await.is_err(),
            "listener closed"
        );
    }
}
