//! Servers and agents started in-process on loopback ports the kernel picks.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tether_grpc::Keepalive;
use tether_observe::metrics::Registry;
use tether_server::{FlowConfig, FrontendListen, Mode, Strategy};
use tether_tls::TlsOptions;
use tether_tls::pki::PkiFiles;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A throwaway PKI written to a temporary directory that lives as long as this value.
#[derive(Debug)]
pub struct Pki {
    pub files: PkiFiles,
    pub pem: tether_tls::pki::Pki,
    _dir: tempfile::TempDir,
}

impl Pki {
    pub fn generate() -> anyhow::Result<Self> {
        Ok(Self::generate_with_clients(&[])?.0)
    }

    /// A PKI plus extra client certificates from the same CA (distinct agent identities).
    pub fn generate_with_clients(
        extra: &[tether_tls::pki::ClientSpec<'_>],
    ) -> anyhow::Result<(Self, Vec<tether_tls::pki::IssuedClient>)> {
        tether_tls::install_default_provider();
        let dir = tempfile::tempdir()?;
        let (pem, issued) = tether_tls::pki::Pki::generate_with_clients(extra)?;
        let files = pem.write_to(dir.path())?;
        Ok((
            Self {
                files,
                pem,
                _dir: dir,
            },
            issued,
        ))
    }

    /// A PKI plus one client certificate per name (its CN), written beside the others as
    /// `<name>.crt` and `<name>.key`: their paths, in order.
    pub fn generate_with_client_files(
        names: &[&str],
    ) -> anyhow::Result<(Self, Vec<(PathBuf, PathBuf)>)> {
        let specs: Vec<tether_tls::pki::ClientSpec<'_>> = names
            .iter()
            .map(|n| tether_tls::pki::ClientSpec {
                common_name: n,
                sans: &[],
            })
            .collect();
        let (pki, issued) = Self::generate_with_clients(&specs)?;
        let mut files = Vec::new();
        for (name, issued) in names.iter().zip(&issued) {
            let cert = pki.dir().join(format!("{name}.crt"));
            let key = pki.dir().join(format!("{name}.key"));
            std::fs::write(&cert, &issued.cert_pem)?;
            std::fs::write(&key, &issued.key_pem)?;
            files.push((cert, key));
        }
        Ok((pki, files))
    }

    /// A directory for sockets, inside the PKI's temporary directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.files.dir
    }
}

/// Frontend transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Uds,
    Tls,
}

/// Knobs for [`TestServer::start`]; `Default` is upstream's defaults on ephemeral ports.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub mode: Mode,
    pub transport: Transport,
    pub server_id: String,
    pub server_count: u32,
    pub strategies: Vec<Strategy>,
    pub routing: tether_server::RoutingConfig,
    pub dial_timeout: Duration,
    pub graceful_shutdown_timeout: Duration,
    pub flow: FlowConfig,
    pub agent_keepalive: Option<Keepalive>,
    /// Bind the agent listener here instead of an ephemeral port (server restarts).
    pub agent_addr: Option<SocketAddr>,
    pub limits: tether_server::Limits,
    /// `--agent-identity-binding` (the product's default: identifiers must be proven).
    pub agent_identity_binding: tether_server::IdentityBinding,
    pub tls_reload: Option<tether_server::TlsReload>,
    /// Authenticate agents by token; the agent listener then asks for no client certificate.
    pub agent_token_auth: Option<tether_server::AgentTokenAuth>,
    /// `--audit-log-path`.
    pub audit_log: Option<tether_observe::audit::AuditTarget>,
    /// Listen on `[::1]` instead of 127.0.0.1 (frontend TCP, agent, health, admin).
    pub ipv6: bool,
    /// `--control-plane-endpoints`: where agents' reverse dials may go (`None`: off).
    pub control_plane: Option<tether_server::ControlPlaneEndpoints>,
    /// `--resume-window` (zero: off).
    pub resume_window: Duration,
    /// `--dead-agent-timeout` (`None`: off).
    pub dead_agent_timeout: Option<Duration>,
    /// Server peering: the peer port's address, and the peers' (with the PKI's peer
    /// certificate, `--peer-name` tether-peer).
    pub peering: Option<Peering>,
}

/// A test server's peer port and its peers.
#[derive(Clone, Debug)]
pub struct Peering {
    pub listen: SocketAddr,
    pub addresses: tokio::sync::watch::Receiver<std::collections::BTreeSet<SocketAddr>>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            mode: Mode::Grpc,
            transport: Transport::Uds,
            server_id: "server-1".into(),
            server_count: 1,
            strategies: vec![Strategy::Default],
            routing: tether_server::RoutingConfig::default(),
            dial_timeout: Duration::from_secs(30),
            graceful_shutdown_timeout: Duration::ZERO,
            flow: FlowConfig::default(),
            agent_keepalive: Some(Keepalive {
                interval: Duration::from_secs(5),
                timeout: Duration::from_secs(10),
            }),
            agent_addr: None,
            limits: tether_server::Limits::default(),
            agent_identity_binding: Default::default(),
            tls_reload: None,
            agent_token_auth: None,
            audit_log: None,
            ipv6: false,
            control_plane: None,
            resume_window: RESUME_WINDOW,
            dead_agent_timeout: Some(tether_server::DEFAULT_DEAD_AGENT_TIMEOUT),
            peering: None,
        }
    }
}

/// A running in-process server.
#[derive(Debug)]
pub struct TestServer {
    /// Socket path (UDS) or `host:port` (TLS) of the frontend.
    pub frontend: String,
    pub uds: Option<PathBuf>,
    pub frontend_tcp: Option<SocketAddr>,
    /// Tenants' own frontends (`frontend:` in the routing file): tenant name, then a socket
    /// path or `host:port`.
    pub tenant_frontends: Vec<(String, String)>,
    pub agent_addr: SocketAddr,
    /// The peer port, with peering.
    pub peer_addr: Option<SocketAddr>,
    pub health_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

const LOOPBACK_ANY: &str = "127.0.0.1:0";
/// The product's default `--resume-window`, on both ends.
const RESUME_WINDOW: Duration = tether_server::DEFAULT_RESUME_WINDOW;

impl TestServer {
    pub async fn start(pki: &Pki, opts: ServerOptions) -> anyhow::Result<Self> {
        let f = &pki.files;
        let any: SocketAddr = if opts.ipv6 {
            "[::1]:0".parse()?
        } else {
            LOOPBACK_ANY.parse()?
        };
        let alpn: &[&[u8]] = match opts.mode {
            Mode::Grpc => &[b"h2"],
            Mode::HttpConnect => &[b"http/1.1"],
        };
        let frontend = match opts.transport {
            Transport::Uds => FrontendListen::Unix {
                path: pki
                    .dir()
                    .join(format!("{}-{}.sock", opts.server_id, unique())),
                delete_existing: true,
            },
            Transport::Tls => FrontendListen::Tls {
                addr: any,
                tls: tether_tls::server_config(
                    &f.server_cert,
                    &f.server_key,
                    Some(&f.ca_cert),
                    alpn,
                    &TlsOptions::default(),
                )?,
            },
        };
        let config = tether_server::Config {
            mode: opts.mode,
            frontend,
            agent_addr: opts.agent_addr.unwrap_or(any),
            agent_tls: tether_tls::server_config(
                &f.server_cert,
                &f.server_key,
                opts.agent_token_auth
                    .is_none()
                    .then_some(f.ca_cert.as_path()),
                &tether_server::AGENT_ALPN,
                &TlsOptions::default(),
            )?,
            health_addr: any,
            admin_addr: any,
            server_id: opts.server_id,
            server_count: opts.server_count,
            strategies: opts.strategies,
            routing: opts.routing,
            routing_reload: None,
            dial_timeout: opts.dial_timeout,
            graceful_shutdown_timeout: opts.graceful_shutdown_timeout,
            flow: opts.flow,
            agent_keepalive: opts.agent_keepalive,
            frontend_keepalive: None,
            limits: opts.limits,
            agent_identity_binding: opts.agent_identity_binding,
            tls_reload: opts.tls_reload,
            agent_token_auth: opts.agent_token_auth,
            audit_log: opts.audit_log,
            control_plane: opts.control_plane,
            resume_window: opts.resume_window,
            dead_agent_timeout: opts.dead_agent_timeout,
            peering: opts
                .peering
                .map(|peering| {
                    Ok::<_, anyhow::Error>(tether_server::PeerConfig {
                        listen: peering.listen,
                        server_tls: tether_tls::server_config(
                            &f.peer_cert,
                            &f.peer_key,
                            Some(&f.ca_cert),
                            &[tether_server::PEER_ALPN],
                            &TlsOptions::default(),
                        )?,
                        client_tls: tether_tls::client_config(
                            &f.ca_cert,
                            Some((&f.peer_cert, &f.peer_key)),
                            vec![tether_server::PEER_ALPN.to_vec()],
                            &TlsOptions::default(),
                        )?,
                        name: tether_tls::pki::PEER_NAME.to_owned(),
                        addresses: peering.addresses,
                    })
                })
                .transpose()?,
        };
        let server = tether_server::Server::bind(config, Registry::new()).await?;
        let missing = || anyhow::anyhow!("listener without an address");
        let shutdown = CancellationToken::new();
        let mut this = Self {
            frontend: server.frontend_addr(),
            uds: server
                .frontend_tcp_addr()
                .is_none()
                .then(|| PathBuf::from(server.frontend_addr())),
            frontend_tcp: server.frontend_tcp_addr(),
            tenant_frontends: server.tenant_frontend_addrs(),
            agent_addr: server.agent_addr().ok_or_else(missing)?,
            peer_addr: server.peer_addr(),
            health_addr: server.health_addr().ok_or_else(missing)?,
            admin_addr: server.admin_addr().ok_or_else(missing)?,
            shutdown: shutdown.clone(),
            task: None,
        };
        this.task = Some(tokio::spawn(server.run(shutdown)));
        Ok(this)
    }

    /// Starts shutdown and waits until the server has stopped.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
    }

    /// Begins shutdown without waiting (graceful drain tests).
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }

    pub async fn metrics(&self) -> anyhow::Result<String> {
        Ok(crate::http::get(self.health_addr, "/metrics").await?.1)
    }

    /// An HTTP/2 connection to the agent listener as the PKI's agent opens it, for tests
    /// that speak `AgentService.Connect` themselves.
    pub async fn agent_channel(&self, pki: &Pki) -> anyhow::Result<tether_grpc::client::Channel> {
        let f = &pki.files;
        let tls = tether_tls::client_config(
            &f.ca_cert,
            Some((&f.agent_cert, &f.agent_key)),
            vec![b"h2".to_vec()],
            &TlsOptions::default(),
        )?;
        self.agent_channel_with(tls).await
    }

    /// An HTTP/2 connection to the agent listener with `tls` (some agent certificate); its
    /// driver runs on its own task until the connection ends.
    pub async fn agent_channel_with(
        &self,
        tls: std::sync::Arc<rustls::ClientConfig>,
    ) -> anyhow::Result<tether_grpc::client::Channel> {
        let tcp = tokio::net::TcpStream::connect(self.agent_addr).await?;
        let name = rustls::pki_types::ServerName::try_from(self.agent_addr.ip().to_string())?;
        let tls = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await?;
        let (channel, driver) = tether_grpc::client::Channel::handshake(
            tls,
            &tether_grpc::H2Settings::agent_stream(),
            &self.agent_addr.ip().to_string(),
            true,
        )
        .await?;
        tokio::spawn(driver.run());
        Ok(channel)
    }

    /// Waits until `/readyz` says an agent is connected.
    pub async fn wait_ready(&self) -> anyhow::Result<()> {
        crate::http::wait_for_200(self.health_addr, "/readyz", Duration::from_secs(20)).await
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Knobs for [`TestAgent::start`].
#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub agent_id: String,
    pub identifiers: String,
    /// tether's `--agent-labels` (zone, region).
    pub labels: tether_agent::Labels,
    pub flow: FlowConfig,
    /// Speak like an upstream agent: no `tether-flow` announcement, so no credit.
    pub legacy: bool,
    pub dial_timeout: Duration,
    pub sync_interval: Duration,
    /// Re-read the PKI's agent certificate, key and CA files before each connection.
    pub tls_reload: bool,
    /// The destination policy and dial caps.
    pub destinations: tether_agent::DestinationConfig,
    /// `--service-account-token-path`: a file whose token is sent on every connect.
    pub token_path: Option<PathBuf>,
    /// `--audit-log-path`.
    pub audit_log: Option<tether_observe::audit::AuditTarget>,
    /// A client certificate and key other than the PKI's agent certificate (distinct
    /// agent identities, e.g. tenants).
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// `--control-plane-listen` and its settings.
    pub control_plane: Option<tether_agent::ControlPlaneConfig>,
    /// `--resume-window` (zero: off).
    pub resume_window: Duration,
    /// The link the agent offers; a `legacy` agent speaks gRPC whatever this says.
    pub link: AgentLink,
    /// How the agent finds its servers: through the address [`TestAgent::start`] is given
    /// (`Balancer`), or at the addresses discovery finds. With discovery, TLS verifies
    /// `localhost`, a name the test PKI's server certificate holds.
    pub discovery: tether_agent::Discovery,
    /// `--agent-server-connections` (`None`: every server).
    pub server_connections: Option<std::num::NonZeroUsize>,
}

/// Which link an in-process agent offers the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentLink {
    /// tether's native link first, then gRPC (the product's default, `--transport=auto`).
    Native,
    /// gRPC over HTTP/2 only (`--transport=grpc`).
    Grpc,
    /// The native link in WebSocket messages (`--transport=websocket`).
    WebSocket,
}

impl AgentLink {
    /// The suites' link: `grpc` or `websocket` when `TETHER_TEST_AGENT_LINK` says so (CI
    /// runs the end-to-end suites once more on each), the native link otherwise.
    pub fn from_env() -> Self {
        match std::env::var("TETHER_TEST_AGENT_LINK").as_deref() {
            Ok("grpc") => Self::Grpc,
            Ok("websocket") => Self::WebSocket,
            _ => Self::Native,
        }
    }

    /// This link, or the native one where it offers no gRPC (WebSocket): for a test whose
    /// server speaks only gRPC.
    pub fn reaching_grpc(self) -> Self {
        match self {
            Self::WebSocket => Self::Native,
            other => other,
        }
    }

    /// The name `/debug/agents` gives it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Grpc => "grpc",
            Self::WebSocket => "websocket",
        }
    }

    fn alpn(self) -> Vec<Vec<u8>> {
        match self {
            Self::Native => tether_server::AGENT_ALPN.map(<[u8]>::to_vec).into(),
            Self::Grpc => vec![b"h2".to_vec()],
            Self::WebSocket => vec![b"http/1.1".to_vec()],
        }
    }
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            agent_id: format!("agent-{}", unique()),
            identifiers: String::new(),
            labels: tether_agent::Labels::default(),
            flow: FlowConfig::default(),
            legacy: false,
            dial_timeout: Duration::from_secs(5),
            sync_interval: Duration::from_millis(100),
            tls_reload: false,
            destinations: tether_agent::DestinationConfig::default(),
            token_path: None,
            audit_log: None,
            client_cert: None,
            control_plane: None,
            resume_window: RESUME_WINDOW,
            link: AgentLink::from_env(),
            discovery: tether_agent::Discovery::Balancer,
            server_connections: None,
        }
    }
}

/// A running in-process agent.
#[derive(Debug)]
pub struct TestAgent {
    pub health_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// Where the control-plane listener listens, when there is one.
    pub control_plane_addr: Option<String>,
    drain: CancellationToken,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl TestAgent {
    pub async fn start(
        pki: &Pki,
        server_agent_addr: SocketAddr,
        opts: AgentOptions,
    ) -> anyhow::Result<Self> {
        let f = &pki.files;
        let mut flow = opts.flow;
        let mut link = opts.link;
        if opts.legacy {
            // A window below the minimum is never accepted: the server falls back to legacy.
            flow.window = 0;
            link = AgentLink::Grpc;
        }
        let tls_reload = if opts.tls_reload {
            let f = f.clone();
            let files = vec![f.ca_cert.clone(), f.agent_cert.clone(), f.agent_key.clone()];
            Some(std::sync::Arc::new(tether_tls::Reloading::new(
                files,
                move || {
                    tether_tls::client_config(
                        &f.ca_cert,
                        Some((&f.agent_cert, &f.agent_key)),
                        link.alpn(),
                        &TlsOptions::default(),
                    )
                },
            )?))
        } else {
            None
        };
        let (cert, key) = opts
            .client_cert
            .clone()
            .unwrap_or_else(|| (f.agent_cert.clone(), f.agent_key.clone()));
        let server_host = match opts.discovery {
            tether_agent::Discovery::Balancer => server_agent_addr.ip().to_string(),
            _ => "localhost".to_owned(),
        };
        let config = tether_agent::Config {
            server_host,
            server_port: server_agent_addr.port(),
            discovery: opts.discovery,
            server_connections: opts.server_connections,
            websocket_path: (link == AgentLink::WebSocket).then(|| "/".to_owned()),
            egress: tether_agent::egress_proxy::Egress::Direct,
            tls: tether_tls::client_config(
                &f.ca_cert,
                Some((&cert, &key)),
                link.alpn(),
                &TlsOptions::default(),
            )?,
            agent_id: opts.agent_id,
            identifiers: opts.identifiers,
            labels: opts.labels,
            health_addr: LOOPBACK_ANY.parse()?,
            admin_addr: LOOPBACK_ANY.parse()?,
            sync_interval: opts.sync_interval,
            sync_interval_cap: Duration::from_secs(1),
            sync_forever: false,
            keepalive: Some(Keepalive {
                interval: Duration::from_secs(5),
                timeout: Duration::from_secs(10),
            }),
            legacy_keepalive: None,
            dial_timeout: opts.dial_timeout,
            destinations: opts.destinations,
            flow,
            token_path: opts.token_path,
            lease_counting: None,
            tls_reload,
            audit_log: opts.audit_log,
            control_plane: opts.control_plane,
            resume_window: opts.resume_window,
            drain_timeout: None,
        };
        let agent = tether_agent::Agent::bind(config, Registry::new()).await?;
        let missing = || anyhow::anyhow!("listener without an address");
        let drain = CancellationToken::new();
        let stop = CancellationToken::new();
        Ok(Self {
            health_addr: agent.health_addr().ok_or_else(missing)?,
            admin_addr: agent.admin_addr().ok_or_else(missing)?,
            control_plane_addr: agent.control_plane_addr(),
            drain: drain.clone(),
            stop: stop.clone(),
            task: Some(tokio::spawn(agent.run(drain, stop))),
        })
    }

    /// The first SIGTERM: drain.
    pub fn drain(&self) {
        self.drain.cancel();
    }

    /// Stops the agent and waits for it.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
    }

    pub async fn wait_ready(&self) -> anyhow::Result<()> {
        crate::http::wait_for_200(self.health_addr, "/readyz", Duration::from_secs(20)).await
    }

    pub async fn metrics(&self) -> anyhow::Result<String> {
        Ok(crate::http::get(self.health_addr, "/metrics").await?.1)
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// A process-unique number for names.
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The usual arrangement of a test: a server, one agent connected to it, and an echo target.
#[derive(Debug)]
pub struct Stack {
    pub pki: Pki,
    pub server: TestServer,
    pub agent: TestAgent,
    pub echo: crate::targets::EchoServer,
}

impl Stack {
    /// Starts everything and waits until the server has the agent.
    pub async fn start(server: ServerOptions, agent: AgentOptions) -> anyhow::Result<Self> {
        let pki = Pki::generate()?;
        let server = TestServer::start(&pki, server).await?;
        let agent = TestAgent::start(&pki, server.agent_addr, agent).await?;
        server.wait_ready().await?;
        agent.wait_ready().await?;
        let echo = crate::targets::EchoServer::start().await?;
        Ok(Self {
            pki,
            server,
            agent,
            echo,
        })
    }
}

impl ServerOptions {
    /// The defaults with the HTTP CONNECT frontend.
    pub fn http_connect() -> Self {
        Self {
            mode: Mode::HttpConnect,
            ..Self::default()
        }
    }
}
