//! One connection attempt to a proxy server: the egress dial, TLS, the transport's
//! handshake, and the stream's metadata each way. What it gives back ([`Connected`]) is
//! transport-neutral: the connection under the stream ([`ServerConn`]), the stream's
//! [`Transport`], and what the server answered.
//!
//! The transport is the one TLS negotiated: the native link when the agent offered its ALPN
//! id (`tether/1`, before `h2`) and the server chose it, as tether servers do; gRPC over
//! HTTP/2 otherwise, with every upstream server. With `--transport=websocket` the agent
//! offers only `http/1.1` and runs the native link in WebSocket messages.

use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::ServerName;
use tether_grpc::client::Channel;
use tether_grpc::{GrpcError, H2Settings, Keepalive, LastPong};
use tether_link::{LinkError, LinkHandle};
use tether_proto::link::{self, Hello};
use tether_proto::metadata::{self, Metadata};
use tether_tunnel::{Transport, TransportError};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use crate::config::Config;

/// Why one connection attempt did not add a session.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// Boxed: a proxy's errors carry its URL.
    #[error(transparent)]
    Dial(Box<crate::egress_proxy::DialError>),
    #[error("TLS handshake with {to}: {}", crate::tls_failure::describe(error))]
    Tls { to: String, error: std::io::Error },
    /// The server's caps close a connection at accept, before any TLS byte.
    #[error(
        "TLS handshake with {0}: the server closed the connection before the TLS handshake \
         (a connection limit? see --max-agent-connections-per-address and \
         --max-agent-connections on the server) ({1})"
    )]
    ClosedBeforeTls(String, std::io::Error),
    #[error("invalid server name {0:?}")]
    ServerName(String),
    #[error("reading token {0}: {1}")]
    Token(String, std::io::Error),
    #[error("{0}")]
    Transport(TransportError),
    /// The server refused this agent after this side's TLS 1.3 handshake had finished (its
    /// verdict on the client certificate), seen on the transport's connection.
    #[error("TLS with {to}: {}", crate::tls_failure::describe(error))]
    Refused { to: String, error: rustls::Error },
    #[error("server response headers: {0}")]
    Headers(String),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// The connection a stream runs on: what ends it, and its keepalive.
#[derive(Debug)]
pub(crate) enum ServerConn {
    Grpc(Channel),
    /// The native link, directly on TLS or (`websocket`) in WebSocket messages.
    Native {
        websocket: bool,
        link: LinkHandle,
        /// Taken by the first [`ServerConn::start_keepalive`], which hands the settings to
        /// the link's keepalive task.
        keepalive: std::sync::Mutex<Option<oneshot::Sender<Keepalive>>>,
    },
}

impl ServerConn {
    /// Resolves with the reason once the connection is gone. A native link's connection is
    /// its transport, which reports its own end: never.
    pub(crate) async fn closed(&self) -> String {
        match self {
            Self::Grpc(channel) => channel.closed().await,
            Self::Native { .. } => std::future::pending().await,
        }
    }

    /// When the server last answered the connection's keepalive.
    pub(crate) fn liveness(&self) -> Arc<LastPong> {
        match self {
            Self::Grpc(channel) => channel.last_pong(),
            Self::Native { link, .. } => link.liveness(),
        }
    }

    pub(crate) fn start_keepalive(&self, keepalive: Keepalive) {
        match self {
            Self::Grpc(channel) => channel.start_keepalive(keepalive),
            Self::Native {
                keepalive: slot, ..
            } => {
                if let Some(start) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    let _ = start.send(keepalive);
                }
            }
        }
    }

    /// The transport's name, for logs and `/debug/agents`.
    pub(crate) fn transport_name(&self) -> &'static str {
        match self {
            Self::Grpc(_) => "grpc",
            Self::Native { websocket, .. } => {
                if *websocket {
                    "websocket"
                } else {
                    "native"
                }
            }
        }
    }
}

/// A freshly opened stream, before it is known to be a new server.
#[derive(Debug)]
pub(crate) struct Connected {
    pub(crate) server: ServerConn,
    pub(crate) transport: Transport,
    pub(crate) answer: Answer,
}

/// What the server answered the stream with.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) server_id: String,
    pub(crate) server_count: usize,
    /// The server's `tether-flow` announcement: present only from tether servers.
    pub(crate) server_flow: Option<String>,
    /// The server answered `tether-reverse`: it accepts reverse dials on this stream.
    pub(crate) reverse: bool,
    /// The server keeps this stream resumable under this name (`tether-resume`).
    pub(crate) resume_token: Option<String>,
    /// The stream continues a suspended one; the server received this many of its packets.
    pub(crate) resumed: Option<u64>,
    /// The server's tether release (`tether-version`); `None` from an upstream server.
    pub(crate) server_version: Option<String>,
}

/// One connection attempt to `config`'s server (at `endpoint` when discovered; TLS still
/// verifies `--proxy-server-host`), asking to resume the suspended streams
/// `resume_from` (token, packets received) when the agent offers resumes. Steps through an
/// HTTP(S) proxy end by `deadline` with their own error (which proxy, which step), before
/// the attempt's overall timeout says less. The connection's driver runs on `tasks`, so
/// stopping the agent waits for it too.
pub(crate) async fn connect(
    config: &Config,
    endpoint: Option<std::net::SocketAddr>,
    resume_from: &[(String, u64)],
    tasks: &TaskTracker,
    deadline: tokio::time::Instant,
) -> Result<Connected, ConnectError> {
    // What the server is called in HTTP (`Host`, `:authority`), and in errors.
    let authority = format!("{}:{}", config.server_host, config.server_port);
    let address = match endpoint {
        Some(endpoint) => format!("{authority} at {endpoint}"),
        None => authority.clone(),
    };
    let (dial_host, dial_port) = match endpoint {
        Some(endpoint) => (endpoint.ip().to_string(), endpoint.port()),
        None => (config.server_host.clone(), config.server_port),
    };
    let stream = config
        .egress
        .dial(&dial_host, dial_port, deadline)
        .await
        .map_err(|e| ConnectError::Dial(Box::new(e)))?;
    let name = ServerName::try_from(config.server_host.clone())
        .map_err(|_| ConnectError::ServerName(config.server_host.clone()))?;
    let tls_config = match &config.tls_reload {
        Some(reloading) => crate::tls_reload::refreshed(reloading).await,
        None => config.tls.clone(),
    };
    let tls = tokio_rustls::TlsConnector::from(tls_config)
        .connect(name, stream)
        .await
        .map_err(|e| {
            let to = match config.egress.proxy() {
                Some(proxy) => format!("{address} through proxy {proxy}"),
                None => address.clone(),
            };
            // The server's answer to a connection over its caps is a close before TLS.
            match e.kind() {
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => {
                    ConnectError::ClosedBeforeTls(to, e)
                }
                _ => ConnectError::Tls { to, error: e },
            }
        })?;
    let native = tls.get_ref().1.alpn_protocol() == Some(link::ALPN);
    let (tls, seen) = tether_tls::Watched::new(tls);
    let refused = |e: TransportError| match seen.get() {
        Some(error) => ConnectError::Refused {
            to: address.clone(),
            error: error.clone(),
        },
        None => ConnectError::Transport(e),
    };
    let offers_resume = !config.resume_window.is_zero();
    let request = request(config, offers_resume, resume_from)?;
    if native || config.websocket_path.is_some() {
        let hello = Hello {
            version: link::VERSION,
            capabilities: Vec::new(),
            metadata: request
                .into_iter()
                .map(|(key, value)| (key, bytes::Bytes::from(value)))
                .collect(),
        };
        let opened = match &config.websocket_path {
            Some(path) => {
                let upgrade = tether_link::Upgrade {
                    host: authority.clone(),
                    path: path.clone(),
                };
                tether_link::connect_websocket(tls, &upgrade, &hello).await
            }
            None => tether_link::connect(tls, &hello).await,
        };
        let (accepted, opened) = opened.map_err(|e: LinkError| refused(e.into()))?;
        let answer = answer(
            &accepted.metadata,
            offers_resume,
            config.control_plane.is_some(),
        )?;
        let (start, started) = oneshot::channel();
        let handle = opened.handle.clone();
        tasks.spawn(async move {
            match started.await {
                Ok(keepalive) => handle.keep_alive(keepalive).await,
                Err(_) => handle.ended().await,
            }
        });
        return Ok(Connected {
            server: ServerConn::Native {
                websocket: config.websocket_path.is_some(),
                link: opened.handle,
                keepalive: std::sync::Mutex::new(Some(start)),
            },
            transport: Transport::native(opened.reader, opened.writer),
            answer,
        });
    }
    let refused = |e: GrpcError| refused(e.into());
    let (channel, driver) = Channel::handshake(tls, &H2Settings::agent_stream(), &authority, true)
        .await
        .map_err(refused)?;
    tasks.spawn(driver.run());

    let (sender, mut receiver) = channel
        .call(tether_proto::path::CONNECT, &request)
        .await
        .map_err(refused)?;
    let headers = receiver.response_headers().await.map_err(refused)?;
    let answer = answer(
        &tether_grpc::metadata_of(headers),
        offers_resume,
        config.control_plane.is_some(),
    )?;
    Ok(Connected {
        server: ServerConn::Grpc(channel),
        transport: Transport::grpc(sender, receiver),
        answer,
    })
}

/// The stream's request metadata: who the agent is, its token, and what it offers.
fn request(
    config: &Config,
    offers_resume: bool,
    resume_from: &[(String, u64)],
) -> Result<Vec<(&'static str, String)>, ConnectError> {
    let mut request = vec![
        (metadata::AGENT_ID, config.agent_id.clone()),
        (metadata::TETHER_VERSION, tether_observe::VERSION.to_owned()),
    ];
    if !config.identifiers.is_empty() {
        request.push((metadata::AGENT_IDENTIFIERS, config.identifiers.clone()));
    }
    let labels = config.labels.to_header();
    if !labels.is_empty() {
        request.push((metadata::TETHER_LABELS, labels));
    }
    if let Some(path) = &config.token_path {
        // A small local file, read on every connect so a rotated token is picked up.
        let token = std::fs::read_to_string(path)
            .map_err(|e| ConnectError::Token(path.display().to_string(), e))?;
        request.push((metadata::AUTHORIZATION, format!("Bearer {}", token.trim())));
    }
    request.push(config.flow.announce());
    if config.control_plane.is_some() {
        request.push((
            metadata::TETHER_REVERSE,
            metadata::TETHER_REVERSE_VERSION.to_owned(),
        ));
    }
    if offers_resume {
        request.push((
            metadata::TETHER_RESUME,
            metadata::TETHER_RESUME_VERSION.to_owned(),
        ));
        if !resume_from.is_empty() {
            request.push((
                metadata::TETHER_RESUME_FROM,
                tether_tunnel::format_resume_from(resume_from),
            ));
        }
    }
    Ok(request)
}

/// Reads the server's answer: exactly one `serverid` and `servercount`; the extensions it
/// accepted, each only if this agent offered it.
fn answer(
    headers: &Metadata,
    offers_resume: bool,
    offers_reverse: bool,
) -> Result<Answer, ConnectError> {
    let one = |key: &'static str| -> Result<&str, ConnectError> {
        let mut values = headers.get_all(key);
        match (values.next(), values.next()) {
            (Some(v), None) => {
                metadata::text(v).ok_or_else(|| ConnectError::Headers(format!("{key} is not text")))
            }
            _ => Err(ConnectError::Headers(format!("expected exactly one {key}"))),
        }
    };
    let server_id = one(metadata::SERVER_ID)?.to_owned();
    let server_count = one(metadata::SERVER_COUNT)?
        .trim()
        .parse::<usize>()
        .map_err(|_| ConnectError::Headers("servercount is not a number".into()))?;
    Ok(Answer {
        server_id,
        server_count,
        server_flow: headers.get(metadata::TETHER_FLOW).map(str::to_owned),
        reverse: offers_reverse
            && headers
                .get_all(metadata::TETHER_REVERSE)
                .next()
                .is_some_and(|v| v == metadata::TETHER_REVERSE_VERSION.as_bytes()),
        resume_token: headers
            .get(metadata::TETHER_RESUME)
            .filter(|token| offers_resume && tether_tunnel::is_resume_token(token))
            .map(str::to_owned),
        resumed: headers
            .get(metadata::TETHER_RESUMED)
            .and_then(|v| v.parse().ok()),
        server_version: headers
            .get(metadata::TETHER_VERSION)
            .filter(|v| metadata::is_version(v))
            .map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Metadata {
        let mut m = Metadata::default();
        for (key, value) in pairs {
            m.push(key, value.to_string());
        }
        m
    }

    #[test]
    fn an_upstream_servers_answer_has_only_its_id_and_count() {
        let got = answer(
            &headers(&[("serverid", "s1"), ("servercount", " 3 ")]),
            true,
            true,
        )
        .unwrap();
        assert_eq!(
            got,
            Answer {
                server_id: "s1".into(),
                server_count: 3,
                server_flow: None,
                reverse: false,
                resume_token: None,
                resumed: None,
                server_version: None,
            }
        );
    }

    #[test]
    fn extensions_count_only_when_offered_and_well_formed() {
        let token = "0123456789abcdef0123456789abcdef";
        let all = headers(&[
            ("serverid", "s1"),
            ("servercount", "1"),
            ("tether-flow", "262144"),
            ("tether-reverse", "1"),
            ("tether-resume", token),
            ("tether-resumed", "42"),
            ("tether-version", "0.1.0"),
        ]);
        let got = answer(&all, true, true).unwrap();
        assert_eq!(got.server_flow.as_deref(), Some("262144"));
        assert!(got.reverse);
        assert_eq!(got.resume_token.as_deref(), Some(token));
        assert_eq!(got.resumed, Some(42));
        assert_eq!(got.server_version.as_deref(), Some("0.1.0"));
        let not_offered = answer(&all, false, false).unwrap();
        assert!(!not_offered.reverse && not_offered.resume_token.is_none());
        let bad = headers(&[
            ("serverid", "s1"),
            ("servercount", "1"),
            ("tether-resume", "not-a-token"),
            ("tether-version", "0.1.0 (commit x)"),
        ]);
        let got = answer(&bad, true, true).unwrap();
        assert!(got.resume_token.is_none() && got.server_version.is_none());
    }

    #[test]
    fn a_missing_or_repeated_id_or_count_is_refused() {
        for (pairs, expected) in [
            (vec![("servercount", "1")], "expected exactly one serverid"),
            (
                vec![("serverid", "a"), ("serverid", "b"), ("servercount", "1")],
                "expected exactly one serverid",
            ),
            (
                vec![("serverid", "a"), ("servercount", "many")],
                "servercount is not a number",
            ),
            (
                vec![("serverid", "a\u{1}"), ("servercount", "1")],
                "serverid is not text",
            ),
        ] {
            let error = answer(&headers(&pairs), true, true).unwrap_err();
            assert!(error.to_string().contains(expected), "{error}");
        }
    }
}
