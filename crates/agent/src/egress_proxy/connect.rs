//! The HTTP/1.1 CONNECT exchange with a proxy: the request grpc-go sends (request line,
//! `Host`, `User-Agent`, `Proxy-Authorization: Basic` from the URL's user info), and a
//! bounded read of the proxy's answer.

use base64::Engine as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// The most the proxy's answer head may take; a proxy's answer is a few hundred bytes.
const MAX_HEAD: usize = 8 * 1024;
/// Headers parsed in the answer (more is refused as not a proxy's answer).
const MAX_HEADERS: usize = 64;
/// The first byte of a TLS alert or handshake record: what a TLS proxy sends to plain HTTP.
const TLS_ALERT: u8 = 0x15;
const TLS_HANDSHAKE: u8 = 0x16;
/// How much of an answer that is not HTTP is quoted in the error.
const QUOTED: usize = 120;

/// What went wrong in the exchange; the caller adds which proxy.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("sending CONNECT: {0}")]
    Write(std::io::Error),
    #[error("reading the answer to CONNECT: {0}")]
    Read(std::io::Error),
    #[error("the proxy closed the connection before answering CONNECT ({0} bytes received)")]
    Closed(usize),
    #[error("the proxy's answer to CONNECT has a head over {MAX_HEAD} bytes")]
    TooLong,
    #[error("the proxy's answer to CONNECT is not HTTP: {0}")]
    NotHttp(String),
    #[error(
        "the proxy answered CONNECT with a TLS record: it expects TLS, so write https:// in the proxy URL"
    )]
    Tls,
    #[error("{0}")]
    Refused(Refusal),
}

/// A non-2xx answer, with what helps the operator.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub reason: String,
    /// `Proxy-Authenticate`, on a 407.
    pub authenticate: Option<String>,
    pub target: String,
    pub sent_credentials: bool,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the proxy answered CONNECT {} with {} {}",
            self.target, self.status, self.reason
        )?;
        if let Some(challenge) = &self.authenticate {
            write!(f, " (Proxy-Authenticate: {challenge})")?;
        }
        match (self.status, self.sent_credentials) {
            // tinyproxy answers a wrong password with 401.
            (401 | 407, true) => {
                f.write_str(": it refused the user and password in the proxy URL's user info")
            }
            (407, false) => f.write_str(
                ": it wants credentials; put them in the proxy URL \
                 (http://USER:PASSWORD@host:port, percent-encoded)",
            ),
            (403, _) => write!(
                f,
                ": its access rules do not allow CONNECT to {}; check its allowed ports and destinations",
                self.target
            ),
            (502..=504, _) => write!(f, ": it could not reach {}", self.target),
            _ => Ok(()),
        }
    }
}

/// Asks the proxy on `io` for a tunnel to `target` (`host:port`) and reads its answer; on
/// success `io` carries the tunnel. `credentials` is `user:password`. The answer is read a
/// byte at a time so that nothing past its head is consumed: whatever the proxy sends after
/// the head is left unread, for the tunnel. It runs once per server connection, not per
/// tunnelled connection.
pub(super) async fn connect<IO>(
    io: &mut IO,
    target: &str,
    credentials: Option<&str>,
) -> Result<(), AnswerError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut request = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nUser-Agent: tether/{}\r\n",
        env!("CARGO_PKG_VERSION")
    );
    if let Some(credentials) = credentials {
        let encoded = base64::engine::general_purpose::STANDARD.encode(credentials);
        request.push_str(&format!("Proxy-Authorization: Basic {encoded}\r\n"));
    }
    request.push_str("\r\n");
    io.write_all(request.as_bytes())
        .await
        .map_err(AnswerError::Write)?;
    io.flush().await.map_err(AnswerError::Write)?;

    let head = read_head(io).await?;
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut answer = httparse::Response::new(&mut headers);
    match answer.parse(&head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) | Err(_) => return Err(AnswerError::NotHttp(quote(&head))),
    }
    let status = answer.code.unwrap_or_default();
    if (200..300).contains(&status) {
        return Ok(());
    }
    let authenticate = answer
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("proxy-authenticate"))
        .map(|h| quote(h.value));
    Err(AnswerError::Refused(Refusal {
        status,
        reason: quote(answer.reason.unwrap_or_default().as_bytes()),
        authenticate,
        target: target.to_owned(),
        sent_credentials: credentials.is_some(),
    }))
}

/// The answer's head up to and including its empty line (`\r\n` or bare `\n` line ends, as
/// Go's reader accepts), at most [`MAX_HEAD`] bytes.
async fn read_head<IO: AsyncRead + Unpin>(io: &mut IO) -> Result<Vec<u8>, AnswerError> {
    let mut head = Vec::with_capacity(256);
    while !(head.ends_with(b"\n\n") || head.ends_with(b"\n\r\n")) {
        if head.len() == MAX_HEAD {
            return Err(AnswerError::TooLong);
        }
        let mut byte = [0];
        match io.read(&mut byte).await.map_err(AnswerError::Read)? {
            0 if head.is_empty() => return Err(AnswerError::Closed(0)),
            0 if !head.starts_with(b"HTTP/") => return Err(AnswerError::NotHttp(quote(&head))),
            0 => return Err(AnswerError::Closed(head.len())),
            _ => head.push(byte[0]),
        }
        if head == [TLS_ALERT] || head == [TLS_HANDSHAKE] {
            return Err(AnswerError::Tls);
        }
        if head.len() == 5 && !head.starts_with(b"HTTP/") {
            return Err(AnswerError::NotHttp(quote(&head)));
        }
    }
    Ok(head)
}

/// Up to [`QUOTED`] bytes of what the proxy sent, printable.
fn quote(bytes: &[u8]) -> String {
    let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(QUOTED)]);
    let mut quoted: String = shown.escape_debug().collect();
    if bytes.len() > QUOTED {
        quoted.push('…');
    }
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    /// Runs [`connect`] against a peer that answers `answer`; returns what the peer received
    /// and the result.
    async fn exchange(
        answer: &'static [u8],
        credentials: Option<&str>,
    ) -> (String, Result<(), AnswerError>) {
        let (mut ours, mut theirs) = duplex(64 * 1024);
        let peer = tokio::spawn(async move {
            let mut request = Vec::new();
            while !request.ends_with(b"\r\n\r\n") {
                let mut byte = [0];
                if theirs.read(&mut byte).await.unwrap() == 0 {
                    break;
                }
                request.push(byte[0]);
            }
            theirs.write_all(answer).await.unwrap();
            // Bytes after the head stay for the tunnel's next reader.
            theirs.write_all(b"SERVER-BYTES").await.unwrap();
            String::from_utf8(request).unwrap()
        });
        let result = connect(&mut ours, "LocalHost:8091", credentials).await;
        let request = peer.await.unwrap();
        if result.is_ok() {
            let mut next = [0; 12];
            ours.read_exact(&mut next).await.unwrap();
            assert_eq!(
                &next, b"SERVER-BYTES",
                "the answer's reader consumed tunnel bytes"
            );
        }
        (request, result)
    }

    #[tokio::test]
    async fn sends_connect_with_host_and_basic_auth() {
        let (request, result) = exchange(
            b"HTTP/1.0 200 Connection established\r\n\r\n",
            Some("Aladdin:open sesame"),
        )
        .await;
        result.unwrap();
        let lines: Vec<&str> = request.split("\r\n").collect();
        assert_eq!(lines[0], "CONNECT LocalHost:8091 HTTP/1.1");
        assert_eq!(lines[1], "Host: LocalHost:8091");
        assert!(lines[2].starts_with("User-Agent: tether/"));
        // RFC 7617's example.
        assert_eq!(
            lines[3],
            "Proxy-Authorization: Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        let (request, result) = exchange(b"HTTP/1.1 200 OK\nVia: x\n\n", None).await;
        result.unwrap();
        assert!(!request.contains("Proxy-Authorization"));
    }

    #[tokio::test]
    async fn refusals_say_what_the_proxy_answered() {
        let answer = b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"corp\"\r\nContent-Length: 0\r\n\r\n";
        let err = exchange(answer, Some("u:wrong"))
            .await
            .1
            .unwrap_err()
            .to_string();
        assert!(err.contains("407 Proxy Authentication Required"), "{err}");
        assert!(
            err.contains("Proxy-Authenticate: Basic realm=\\\"corp\\\""),
            "{err}"
        );
        assert!(
            err.contains("refused the user and password") && !err.contains("wrong"),
            "{err}"
        );
        let err = exchange(answer, None).await.1.unwrap_err().to_string();
        assert!(err.contains("wants credentials"), "{err}");
        let err = exchange(b"HTTP/1.1 403 Forbidden\r\n\r\n", None)
            .await
            .1
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("403 Forbidden") && err.contains("access rules"),
            "{err}"
        );
        let err = exchange(b"HTTP/1.1 502 Bad Gateway\r\n\r\n", None)
            .await
            .1
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("502 Bad Gateway") && err.contains("could not reach LocalHost:8091"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn garbage_and_oversized_answers_are_errors() {
        let err = exchange(b"SSH-2.0-OpenSSH_9.2\r\n\r\n", None)
            .await
            .1
            .unwrap_err();
        assert!(
            matches!(&err, AnswerError::NotHttp(quoted) if quoted.starts_with("SSH-2")),
            "{err}"
        );
        let err = exchange(b"\x15\x03\x01\x00\x02\x02\x46", None)
            .await
            .1
            .unwrap_err();
        assert!(matches!(err, AnswerError::Tls), "{err}");
        let err = exchange(b"HTTP/1.1 abc nope\r\n\r\n", None)
            .await
            .1
            .unwrap_err();
        assert!(matches!(err, AnswerError::NotHttp(_)), "{err}");
        let long: &'static [u8] = Box::leak(
            [
                b"HTTP/1.1 200 OK\r\nX: ".as_slice(),
                &[b'a'; MAX_HEAD],
                b"\r\n\r\n",
            ]
            .concat()
            .into_boxed_slice(),
        );
        let err = exchange(long, None).await.1.unwrap_err();
        assert!(matches!(err, AnswerError::TooLong), "{err}");
    }

    #[tokio::test]
    async fn a_proxy_that_hangs_up_is_reported() {
        let (mut ours, theirs) = duplex(1024);
        drop(theirs);
        let err = connect(&mut ours, "h:1", None).await.unwrap_err();
        assert!(
            matches!(err, AnswerError::Write(_) | AnswerError::Closed(0)),
            "{err}"
        );
        let (mut ours, mut theirs) = duplex(1024);
        tokio::spawn(async move {
            let mut buf = [0; 1024];
            let _ = theirs.read(&mut buf).await;
            theirs.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        });
        let err = connect(&mut ours, "h:1", None).await.unwrap_err();
        assert!(matches!(err, AnswerError::Closed(17)), "{err}");
    }

    #[test]
    fn quotes_are_printable_and_bounded() {
        assert_eq!(quote(b"a\r\n\x00"), "a\\r\\n\\0");
        assert_eq!(quote(&[b'x'; 500]).chars().count(), QUOTED + 1);
    }
}
