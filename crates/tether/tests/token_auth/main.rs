//! ServiceAccount token authentication of agents against a real kube-apiserver (the loopback
//! control plane): TokenReviews, refusals with their reasons, the node binding, the cache
//! through an API outage, a 1,000-agent storm, upstream's peers on either side, and agents
//! joining tenants by ServiceAccount namespace.

mod binding;
mod flood;
mod mixed;
mod review;
mod storm;
mod tenants;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tether_grpc::client::Channel;
use tether_grpc::{GrpcError, H2Settings, PacketReceiver, PacketSender, Status};
use tether_kube::node_addresses::NodeAddressLookup;
use tether_kube::token_review::{AgentServiceAccount, CacheLimits, TokenReviewAuthenticator};
use tether_kube::{KubeApi, KubeApiOptions};
use tether_observe::metrics::Registry;
use tether_server::AgentTokenAuth;
use tether_testkit::control_plane::{API_AUDIENCE, ControlPlane, ControlPlaneOptions};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Bound for any single step: catches hangs without asserting speed.
pub(crate) const STEP: Duration = Duration::from_secs(60);

/// The kubernetes.io task's names.
pub(crate) const NAMESPACE: &str = "kube-system";
pub(crate) const AGENT_SA: &str = "konnectivity-agent";
pub(crate) const AUDIENCE: &str = "system:konnectivity-server";

pub(crate) fn tether_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tether"))
}

/// A control plane with the task's ServiceAccounts and RBAC: the agents' ServiceAccount
/// (plus decoys), two Nodes with their addresses and a pod on each to bind tokens to, and a
/// server ServiceAccount bound to `system:auth-delegator` and allowed to read Nodes, whose
/// token kubeconfig the proxy server uses.
pub(crate) struct Cluster {
    pub(crate) plane: ControlPlane,
    /// The proxy server's kubeconfig (its own ServiceAccount, only allowed TokenReviews).
    pub(crate) server_kubeconfig: PathBuf,
}

const OBJECTS: &str = "\
apiVersion: v1
kind: ServiceAccount
metadata: {name: konnectivity-agent, namespace: kube-system}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: other-agent, namespace: kube-system}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: konnectivity-agent, namespace: default}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: konnectivity-server, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: konnectivity-server-auth-delegator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:auth-delegator}
subjects:
- {kind: ServiceAccount, name: konnectivity-server, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: konnectivity-server-node-reader}
rules:
- {apiGroups: [\"\"], resources: [nodes], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: konnectivity-server-node-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: konnectivity-server-node-reader}
subjects:
- {kind: ServiceAccount, name: konnectivity-server, namespace: kube-system}
---
apiVersion: v1
kind: Node
metadata: {name: node-1}
status:
  addresses:
  - {type: InternalIP, address: 10.250.0.11}
  - {type: Hostname, address: node-1}
---
apiVersion: v1
kind: Node
metadata: {name: node-2}
status:
  addresses:
  - {type: InternalIP, address: 10.250.0.12}
  - {type: Hostname, address: node-2}
---
apiVersion: v1
kind: Pod
metadata: {name: agent-node-1, namespace: kube-system}
spec:
  nodeName: node-1
  serviceAccountName: konnectivity-agent
  containers: [{name: agent, image: registry.invalid/agent}]
---
apiVersion: v1
kind: Pod
metadata: {name: agent-node-2, namespace: kube-system}
spec:
  nodeName: node-2
  serviceAccountName: konnectivity-agent
  containers: [{name: agent, image: registry.invalid/agent}]
";

impl Cluster {
    pub(crate) async fn start() -> anyhow::Result<Self> {
        tether_tls::install_default_provider();
        let plane = ControlPlane::start(ControlPlaneOptions::default()).await?;
        plane.apply(OBJECTS).await?;
        let server_token = plane
            .create_token(NAMESPACE, "konnectivity-server", API_AUDIENCE, None)
            .await?;
        let server_kubeconfig =
            plane.write_token_kubeconfig("konnectivity-server", &server_token)?;
        Ok(Self {
            plane,
            server_kubeconfig,
        })
    }

    /// An agent token for the task's audience, bound to the pod on `node` when given.
    pub(crate) async fn agent_token(&self, node: Option<&str>) -> anyhow::Result<String> {
        let pod = node.map(|n| format!("agent-{n}"));
        self.plane
            .create_token(NAMESPACE, AGENT_SA, AUDIENCE, pod.as_deref())
            .await
    }

    /// Token authentication for an in-process server, with its own metrics registry and
    /// client-go's default rate limit.
    pub(crate) async fn token_auth(
        &self,
        limits: CacheLimits,
    ) -> anyhow::Result<(AgentTokenAuth, Registry)> {
        self.token_auth_limited(limits, 0.0, 0).await
    }

    /// [`token_auth`](Self::token_auth) with `--kubeconfig-qps` and `--kubeconfig-burst`.
    pub(crate) async fn token_auth_limited(
        &self,
        limits: CacheLimits,
        qps: f32,
        burst: u32,
    ) -> anyhow::Result<(AgentTokenAuth, Registry)> {
        let account = AgentServiceAccount {
            namespace: NAMESPACE.into(),
            name: AGENT_SA.into(),
            audience: AUDIENCE.into(),
        };
        self.token_auth_for(account, limits, qps, burst).await
    }

    /// [`token_auth_limited`](Self::token_auth_limited) admitting `account`.
    pub(crate) async fn token_auth_for(
        &self,
        account: AgentServiceAccount,
        limits: CacheLimits,
        qps: f32,
        burst: u32,
    ) -> anyhow::Result<(AgentTokenAuth, Registry)> {
        token_auth_with(&self.server_kubeconfig, account, limits, qps, burst).await
    }

    /// TokenReviews the API server has handled, from its own metrics.
    pub(crate) async fn token_reviews(&self) -> anyhow::Result<f64> {
        let metrics = self.plane.metrics().await?;
        Ok(metrics
            .lines()
            .filter(|l| {
                l.starts_with("apiserver_request_total{") && l.contains("resource=\"tokenreviews\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }
}

/// Token authentication as `tether server` wires it (TokenReviews, and Node reads for the
/// identity binding), through the API as the user of `kubeconfig`.
pub(crate) async fn token_auth_with(
    kubeconfig: &Path,
    account: AgentServiceAccount,
    limits: CacheLimits,
    qps: f32,
    burst: u32,
) -> anyhow::Result<(AgentTokenAuth, Registry)> {
    let api = KubeApi::connect(&KubeApiOptions {
        kubeconfig: Some(kubeconfig.to_owned()),
        qps,
        burst,
    })
    .await?;
    let registry = Registry::new();
    let authenticator = TokenReviewAuthenticator::new(api.clone(), account, limits, &registry);
    Ok((
        AgentTokenAuth {
            authenticator: Arc::new(authenticator),
            nodes: Some(Arc::new(NodeAddressLookup::new(api))),
        },
        registry,
    ))
}

pub(crate) fn default_limits() -> CacheLimits {
    CacheLimits {
        ttl: Duration::from_secs(120),
        negative_ttl: Duration::from_secs(10),
        stale_ttl: Duration::from_secs(3600),
        max_entries: 10_000,
    }
}

/// A bare agent stream (what an agent's `Connect` sends), kept open while held.
pub(crate) struct AgentStream {
    pub(crate) server_id: String,
    _channel: Channel,
    _sender: PacketSender,
    _receiver: PacketReceiver,
    _driver: tokio::task::JoinHandle<()>,
}

/// Opens `AgentService.Connect` on `addr` with `agentid`, `agentidentifiers` and, when given,
/// `authorization: Bearer TOKEN`; the server's refusal as its gRPC status.
pub(crate) async fn connect_agent(
    addr: std::net::SocketAddr,
    ca: &Path,
    agent_id: &str,
    identifiers: &str,
    token: Option<&str>,
) -> Result<AgentStream, Status> {
    connect_agent_from(None, addr, ca, agent_id, identifiers, token).await
}

/// [`connect_agent`] from the loopback address `source` (another "host" than 127.0.0.1).
pub(crate) async fn connect_agent_from(
    source: Option<std::net::Ipv4Addr>,
    addr: std::net::SocketAddr,
    ca: &Path,
    agent_id: &str,
    identifiers: &str,
    token: Option<&str>,
) -> Result<AgentStream, Status> {
    let failed = |e: &dyn std::fmt::Display| {
        Status::new(tether_grpc::Code::UNKNOWN, format!("transport: {e}"))
    };
    let tls = tether_tls::client_config(ca, None, vec![b"h2".to_vec()], &Default::default())
        .map_err(|e| failed(&e))?;
    let socket = tokio::net::TcpSocket::new_v4().map_err(|e| failed(&e))?;
    if let Some(source) = source {
        socket.bind((source, 0).into()).map_err(|e| failed(&e))?;
    }
    let tcp = socket.connect(addr).await.map_err(|e| failed(&e))?;
    let name =
        rustls::pki_types::ServerName::try_from(addr.ip().to_string()).map_err(|e| failed(&e))?;
    let io = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| failed(&e))?;
    let (channel, driver) =
        Channel::handshake(io, &H2Settings::agent_stream(), &addr.to_string(), true)
            .await
            .map_err(|e| failed(&e))?;
    let driver = tokio::spawn(driver.run());
    let mut metadata = vec![("agentid", agent_id.to_owned())];
    if !identifiers.is_empty() {
        metadata.push(("agentidentifiers", identifiers.to_owned()));
    }
    if let Some(token) = token {
        metadata.push(("authorization", format!("Bearer {token}")));
    }
    let (sender, mut receiver) = channel
        .call(tether_proto::path::CONNECT, &metadata)
        .await
        .map_err(|e| failed(&e))?;
    let headers = match receiver.response_headers().await {
        Ok(headers) => headers,
        Err(GrpcError::Status(status)) => return Err(status),
        Err(e) => return Err(failed(&e)),
    };
    let server_id = headers
        .get("serverid")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Ok(AgentStream {
        server_id,
        _channel: channel,
        _sender: sender,
        _receiver: receiver,
        _driver: driver,
    })
}

/// What the server answers an agent on the native link with `agentid`, `agentidentifiers`
/// and, when given, `authorization: Bearer TOKEN`: `Ok` for an ACCEPT, its refusal (a CLOSE)
/// as a gRPC status.
pub(crate) async fn native_answer(
    addr: std::net::SocketAddr,
    ca: &Path,
    agent_id: &str,
    identifiers: &str,
    token: Option<&str>,
) -> anyhow::Result<Result<(), Status>> {
    use tether_proto::link::Frame;
    let mut client = tether_testkit::native::NativeClient::connect(addr, ca, None).await?;
    let bearer = token.map(|token| format!("Bearer {token}"));
    let mut pairs = vec![("agentid", agent_id)];
    if !identifiers.is_empty() {
        pairs.push(("agentidentifiers", identifiers));
    }
    if let Some(bearer) = &bearer {
        pairs.push(("authorization", bearer));
    }
    client
        .send(&tether_testkit::native::hello(1, &pairs))
        .await?;
    match client.receive().await? {
        Some(Frame::Accept(_)) => Ok(Ok(())),
        Some(Frame::Close(close)) => Ok(Err(Status::new(
            tether_grpc::Code(u32::from(close.code)),
            close.message,
        ))),
        other => anyhow::bail!("neither ACCEPT nor CLOSE: {other:?}"),
    }
}

/// Sends bytes through the server's HTTP CONNECT frontend on `socket` to `target` and checks
/// that they come back from the echo server.
pub(crate) async fn echo_through(
    socket: &Path,
    target: std::net::SocketAddr,
) -> anyhow::Result<()> {
    let mut stream = tokio::net::UnixStream::connect(socket).await?;
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0];
        anyhow::ensure!(
            stream.read(&mut byte).await? == 1,
            "connection closed in the response head"
        );
        head.push(byte[0]);
        anyhow::ensure!(head.len() < 4096, "response head too long");
    }
    let head = String::from_utf8_lossy(&head);
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "CONNECT refused: {head}");
    let payload = b"through the token-authenticated tunnel";
    stream.write_all(payload).await?;
    let mut back = vec![0; payload.len()];
    stream.read_exact(&mut back).await?;
    anyhow::ensure!(back == payload, "echo differs");
    Ok(())
}

/// Polls `check` every 200 ms until it returns true, for at most `STEP`.
pub(crate) async fn eventually<F, Fut>(what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + STEP;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("{what}: not within {STEP:?}")
}
