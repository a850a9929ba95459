//! Tenants on one server: frontend clients and agents mapped by certificate names or by the
//! tenant's own frontend socket, each tenant's dials reaching only its own agents, and
//! per-tenant limits.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use tether_client::{DialError, Transport as ClientTransport};
use tether_server::{Mode, RoutingConfig};
use tether_testkit::http::metric_value;
use tether_testkit::targets::{EchoServer, SourceServer};
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer, Transport};

use crate::STEP;
use crate::support::{agent_dials, client_certs, dial, echo_exact, eventually, http_connect_uds};

const ROUTING: &str = "tenants:
  - name: acme
    clients: [\"cert:api.acme\"]
    agents: [\"cert:agent.acme\"]
    limits: {connections: 2}
  - name: globex
    clients: [\"cert:api.globex\"]
    agents: [\"cert:agent.globex\"]
";

struct Tenancy {
    pki: Pki,
    server: TestServer,
    /// Certificate and key files per name: api.acme, api.globex, agent.acme, agent.globex.
    certs: Vec<(PathBuf, PathBuf)>,
}

async fn start() -> Tenancy {
    start_with(ROUTING, Mode::HttpConnect, Transport::Tls).await
}

/// A server with `routing`, where `{dir}` is replaced by the PKI's directory.
async fn start_with(routing: &str, mode: Mode, transport: Transport) -> Tenancy {
    let names = ["api.acme", "api.globex", "agent.acme", "agent.globex"];
    let (pki, certs) = client_certs(&names);
    let routing = routing.replace("{dir}", &pki.dir().display().to_string());
    let server = TestServer::start(
        &pki,
        ServerOptions {
            mode,
            transport,
            routing: RoutingConfig::from_yaml(&routing).unwrap(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    Tenancy { pki, server, certs }
}

impl Tenancy {
    fn client(&self, cert: Option<&(PathBuf, PathBuf)>) -> ClientTransport {
        tls_client(
            &self.server.frontend_tcp.unwrap().to_string(),
            self.client_tls(cert),
        )
    }

    /// A client config that trusts the server and presents `cert` (the PKI's client
    /// certificate, in no tenant, when `None`); it keeps its TLS sessions for resumption.
    fn client_tls(&self, cert: Option<&(PathBuf, PathBuf)>) -> Arc<rustls::ClientConfig> {
        let f = &self.pki.files;
        let cert = cert.map(|(c, k)| (c.as_path(), k.as_path()));
        let cert = cert.or(Some((f.client_cert.as_path(), f.client_key.as_path())));
        tether_tls::client_config(&f.ca_cert, cert, Vec::new(), &Default::default()).unwrap()
    }

    /// Where tenant `name`'s own frontend listens.
    fn own_frontend(&self, name: &str) -> &str {
        let (_, addr) = self
            .server
            .tenant_frontends
            .iter()
            .find(|(tenant, _)| tenant == name)
            .expect("the tenant's frontend is bound");
        addr
    }

    async fn agent(&self, cert: &(PathBuf, PathBuf)) -> TestAgent {
        let agent = TestAgent::start(
            &self.pki,
            self.server.agent_addr,
            AgentOptions {
                client_cert: Some(cert.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        agent.wait_ready().await.unwrap();
        agent
    }

    async fn metric(&self, sample: &str) -> f64 {
        metric_value(&self.server.metrics().await.unwrap(), sample).unwrap_or(0.0)
    }
}

/// A TLS client of the frontend at `addr`, whose certificate names 127.0.0.1.
fn tls_client(addr: &str, tls: Arc<rustls::ClientConfig>) -> ClientTransport {
    ClientTransport::Tls {
        addr: addr.to_owned(),
        server_name: "127.0.0.1".into(),
        tls,
    }
}

async fn round_trip(client: &ClientTransport, target: &str) {
    let stream = tether_client::dial_http_connect(client, target)
        .await
        .unwrap();
    echo_exact(stream, 5, 64).await;
}

#[tokio::test]
async fn overlapping_destinations_reach_only_the_tenants_own_agents() {
    let t = start().await;
    let acme_agent = t.agent(&t.certs[2]).await;
    let globex_agent = t.agent(&t.certs[3]).await;
    // An agent whose certificate is in no tenant is refused, fail closed.
    let stray = TestAgent::start(&t.pki, t.server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    eventually("the stray agent is refused", || async {
        t.metric("tether_server_tenant_unmapped_total{listener=\"shared\",side=\"agent\"}")
            .await
            >= 1.0
    })
    .await;
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();
    let (acme, globex) = (t.client(Some(&t.certs[0])), t.client(Some(&t.certs[1])));
    for _ in 0..10 {
        round_trip(&acme, &target).await;
        round_trip(&globex, &target).await;
        round_trip(&globex, &target).await;
    }
    assert_eq!(agent_dials(&acme_agent).await, 10.0);
    assert_eq!(agent_dials(&globex_agent).await, 20.0);
    assert_eq!(agent_dials(&stray).await, 0.0);
    assert_eq!(
        t.metric("tether_server_tenant_dials_total{tenant=\"globex\"}")
            .await,
        20.0
    );

    // A client in no tenant is refused, with the reason.
    let err = tether_client::dial_http_connect(&t.client(None), &target)
        .await
        .unwrap_err();
    match err {
        DialError::Rejected { status: 403, body } => {
            assert!(body.contains("belongs to no tenant"), "{body}")
        }
        other => panic!("expected a 403, got {other}"),
    }
    // Without its agent, a tenant has no agent: the other tenant's agent is never borrowed.
    globex_agent.stop().await;
    eventually("globex's agent is gone", || async {
        matches!(
            tether_client::dial_http_connect(&globex, &target).await,
            Err(DialError::NoAgent)
        )
    })
    .await;
    assert_eq!(agent_dials(&acme_agent).await, 10.0);
}

#[tokio::test]
async fn a_tenant_over_its_limit_is_refused_while_the_other_is_unaffected() {
    let t = start().await;
    let _acme_agent = t.agent(&t.certs[2]).await;
    let _globex_agent = t.agent(&t.certs[3]).await;
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();
    let (acme, globex) = (t.client(Some(&t.certs[0])), t.client(Some(&t.certs[1])));

    let first = tether_client::dial_http_connect(&acme, &target)
        .await
        .unwrap();
    let second = tether_client::dial_http_connect(&acme, &target)
        .await
        .unwrap();
    let first = echo_exact(first, 1, 64).await;
    let err = tether_client::dial_http_connect(&acme, &target)
        .await
        .unwrap_err();
    match err {
        DialError::Rejected { status: 429, body } => assert_eq!(
            body.trim_end(),
            "tenant acme has 2 connections and pending dials, its limit is 2"
        ),
        other => panic!("expected a 429, got {other}"),
    }
    // globex is not limited by acme's connections.
    let mut held = Vec::new();
    for _ in 0..4 {
        let s = tether_client::dial_http_connect(&globex, &target)
            .await
            .unwrap();
        held.push(echo_exact(s, 2, 64).await);
    }
    assert_eq!(
        t.metric("tether_server_tenant_refusals_total{limit=\"connections\",tenant=\"acme\"}")
            .await,
        1.0
    );
    // The tunnels still work, and a closed one makes room again.
    drop(echo_exact(second, 3, 1 << 16).await);
    eventually("acme has room again", || async {
        match tether_client::dial_http_connect(&acme, &target).await {
            Ok(s) => {
                drop(echo_exact(s, 4, 64).await);
                true
            }
            Err(_) => false,
        }
    })
    .await;
    drop(first);
}

/// Two tenants with their own sockets and no client identities: the socket is the identity.
const OWN_SOCKETS: &str = "tenants:
  - name: acme
    frontend: {unix: \"{dir}/acme.sock\"}
    agents: [\"cert:agent.acme\"]
  - name: globex
    frontend: {unix: \"{dir}/globex.sock\"}
    agents: [\"cert:agent.globex\"]
";

#[tokio::test]
async fn each_tenants_own_socket_reaches_only_its_own_agents() {
    let t = start_with(OWN_SOCKETS, Mode::HttpConnect, Transport::Uds).await;
    let socket = |tenant: &str| {
        let (_, path) = t
            .server
            .tenant_frontends
            .iter()
            .find(|(name, _)| name == tenant)
            .expect("the tenant's socket is bound");
        PathBuf::from(path)
    };
    let (acme_socket, globex_socket) = (socket("acme"), socket("globex"));
    assert_eq!(acme_socket, t.pki.dir().join("acme.sock"));
    let acme_agent = t.agent(&t.certs[2]).await;
    let globex_agent = t.agent(&t.certs[3]).await;
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();
    // The same process (same uid, no certificate) on each socket, as two kube-apiservers.
    for (n, socket) in [&acme_socket, &globex_socket, &globex_socket]
        .iter()
        .cycle()
        .take(9)
        .enumerate()
    {
        let (stream, head) = http_connect_uds(socket, &target).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        drop(echo_exact(stream, n as u64, 1024).await);
    }
    assert_eq!(agent_dials(&acme_agent).await, 3.0);
    assert_eq!(agent_dials(&globex_agent).await, 6.0);
    assert_eq!(
        t.metric("tether_server_tenant_dials_total{tenant=\"acme\"}")
            .await,
        3.0
    );
    // The main socket has no socket identity: its client maps to no tenant.
    let (_, head) = http_connect_uds(t.server.uds.as_ref().unwrap(), &target).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    // Without its agent, acme's socket never borrows globex's.
    acme_agent.stop().await;
    eventually("acme's agent is gone", || async {
        let (_, head) = http_connect_uds(&acme_socket, &target).await;
        head.starts_with("HTTP/1.1 500")
    })
    .await;
    assert_eq!(agent_dials(&globex_agent).await, 6.0);
}

/// Two tenants with their own TCP ports, both under the main frontend's CA: each port admits
/// only its tenant's client certificate names.
const OWN_PORTS: &str = "tenants:
  - name: acme
    clients: [\"cert:api.acme\"]
    agents: [\"cert:agent.acme\"]
    frontend: {tcp: \"127.0.0.1:0\"}
  - name: globex
    clients: [\"cert:api.globex\"]
    agents: [\"cert:agent.globex\"]
    frontend: {tcp: \"127.0.0.1:0\"}
";

#[tokio::test]
async fn a_tenants_tcp_frontend_refuses_other_tenants_and_unmapped_certificates() {
    for mode in [Mode::HttpConnect, Mode::Grpc] {
        a_tenants_tcp_frontend_refuses_strangers(mode).await;
    }
}

async fn a_tenants_tcp_frontend_refuses_strangers(mode: Mode) {
    let t = start_with(OWN_PORTS, mode, Transport::Tls).await;
    let acme_agent = t.agent(&t.certs[2]).await;
    let globex_agent = t.agent(&t.certs[3]).await;
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();
    let on = |tenant: &str, cert: Option<&(PathBuf, PathBuf)>| {
        tls_client(t.own_frontend(tenant), t.client_tls(cert))
    };
    // Each tenant's own client on its own port, byte-exact.
    for n in 0..3 {
        let stream = dial(mode, &on("globex", Some(&t.certs[1])), &target)
            .await
            .unwrap();
        drop(echo_exact(stream, n, 4096).await);
    }
    let stream = dial(mode, &on("acme", Some(&t.certs[0])), &target)
        .await
        .unwrap();
    drop(echo_exact(stream, 3, 4096).await);
    // T3: acme's certificate on globex's port. T5b: globex's on acme's. T5: a certificate
    // of no tenant (the PKI's own client) on globex's.
    for (tenant, cert) in [
        ("globex", Some(&t.certs[0])),
        ("acme", Some(&t.certs[1])),
        ("globex", None),
    ] {
        let client = on(tenant, cert);
        let refused = tokio::time::timeout(STEP, dial(mode, &client, &target))
            .await
            .expect("refused in time");
        // Closed before any request is read: no dial answer, just the transport's end.
        assert!(
            matches!(refused, Err(DialError::Proxy(_))),
            "{mode:?}: {cert:?} on {tenant}'s port was not refused at accept"
        );
    }
    assert_eq!(agent_dials(&globex_agent).await, 3.0, "{mode:?}");
    assert_eq!(agent_dials(&acme_agent).await, 1.0, "{mode:?}");
    assert_eq!(
        t.metric("tether_server_tenant_unmapped_total{listener=\"tenant\",side=\"client\"}")
            .await,
        3.0,
        "{mode:?}"
    );
    // The main frontend still resolves each client by its certificate.
    round_trip_in(mode, &t.client(Some(&t.certs[1])), &target).await;
    assert_eq!(agent_dials(&globex_agent).await, 4.0, "{mode:?}");
}

async fn round_trip_in(mode: Mode, client: &ClientTransport, target: &str) {
    let stream = dial(mode, client, target).await.unwrap();
    drop(echo_exact(stream, 7, 64).await);
}

#[tokio::test]
async fn a_tenants_own_client_ca_admits_its_clients_and_no_certificate_of_the_main_ca() {
    // globex's own CA, with a client of its own; its port serves the main certificate.
    let (globex_pki, globex_certs) = client_certs(&["api.globex"]);
    let routing = format!(
        "tenants:
  - name: acme
    clients: [\"cert:api.acme\"]
    agents: [\"cert:agent.acme\"]
  - name: globex
    agents: [\"cert:agent.globex\"]
    frontend: {{tcp: \"127.0.0.1:0\", client_ca: \"{}\"}}
",
        globex_pki.files.ca_cert.display()
    );
    let t = start_with(&routing, Mode::HttpConnect, Transport::Tls).await;
    let acme_agent = t.agent(&t.certs[2]).await;
    let globex_agent = t.agent(&t.certs[3]).await;
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();
    let globex_port = t.own_frontend("globex");
    let globex_tls = t.client_tls(Some(&globex_certs[0]));
    for n in 0..2 {
        let stream =
            tether_client::dial_http_connect(&tls_client(globex_port, globex_tls.clone()), &target)
                .await
                .unwrap();
        drop(echo_exact(stream, n, 4096).await);
    }
    // acme's client, first on the main frontend: its client config then holds a session
    // ticket, which must not resume on globex's port (resuming skips the CA's check).
    let acme_tls = t.client_tls(Some(&t.certs[0]));
    round_trip(
        &tls_client(
            &t.server.frontend_tcp.unwrap().to_string(),
            acme_tls.clone(),
        ),
        &target,
    )
    .await;
    for tls in [
        acme_tls,
        t.client_tls(Some(&t.certs[1])),
        t.client_tls(None),
    ] {
        let refused = tokio::time::timeout(
            STEP,
            tether_client::dial_http_connect(&tls_client(globex_port, tls), &target),
        )
        .await
        .expect("refused in time");
        assert!(
            matches!(refused, Err(DialError::Proxy(_))),
            "a main-CA certificate was not refused at the handshake"
        );
    }
    assert_eq!(agent_dials(&globex_agent).await, 2.0);
    assert_eq!(agent_dials(&acme_agent).await, 1.0);
}

#[tokio::test]
async fn a_tenants_own_socket_admits_only_the_uids_it_lists() {
    use std::os::unix::fs::MetadataExt as _;
    let uid = tempfile::tempfile().unwrap().metadata().unwrap().uid();
    // This process is acme's apiserver by its uid; globex's apiserver runs as another user.
    let routing = OWN_SOCKETS
        .replace(
            "  - name: acme\n",
            &format!("  - name: acme\n    clients: [\"uid:{uid}\"]\n"),
        )
        .replace(
            "  - name: globex\n",
            &format!("  - name: globex\n    clients: [\"uid:{}\"]\n", uid + 1),
        );
    let t = start_with(&routing, Mode::HttpConnect, Transport::Uds).await;
    let acme_agent = t.agent(&t.certs[2]).await;
    let globex_agent = t.agent(&t.certs[3]).await;
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();
    let socket = |tenant| PathBuf::from(t.own_frontend(tenant));
    let (stream, head) = http_connect_uds(&socket("acme"), &target).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    drop(echo_exact(stream, 1, 4096).await);
    // On globex's socket (its mode lets this process in) the uid is not globex's: closed
    // before the request is read (the write may already fail).
    let mut stranger = tokio::net::UnixStream::connect(socket("globex"))
        .await
        .unwrap();
    let connect = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    let _ = stranger.write_all(connect.as_bytes()).await;
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(STEP, stranger.read_to_end(&mut reply))
        .await
        .expect("closed in time");
    assert!(reply.is_empty(), "{}", String::from_utf8_lossy(&reply));
    assert_eq!(agent_dials(&acme_agent).await, 1.0);
    assert_eq!(agent_dials(&globex_agent).await, 0.0);
    assert_eq!(
        t.metric("tether_server_tenant_unmapped_total{listener=\"tenant\",side=\"client\"}")
            .await,
        1.0
    );
}

/// acme may move 2 MiB/s over all its connections, both directions together; globex has
/// no byte limit.
const BYTE_RATE: &str = "tenants:
  - name: acme
    clients: [\"cert:api.acme\"]
    agents: [\"cert:agent.acme\"]
    limits: {bytes_per_second: 2097152}
  - name: globex
    clients: [\"cert:api.globex\"]
    agents: [\"cert:agent.globex\"]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_byte_rate_slows_only_its_own_transfers_and_loses_nothing() {
    for mode in [Mode::HttpConnect, Mode::Grpc] {
        a_tenants_byte_rate_slows_only_its_own_transfers(mode).await;
    }
}

async fn a_tenants_byte_rate_slows_only_its_own_transfers(mode: Mode) {
    let t = start_with(BYTE_RATE, mode, Transport::Tls).await;
    let _acme_agent = t.agent(&t.certs[2]).await;
    let _globex_agent = t.agent(&t.certs[3]).await;
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();
    let (acme, globex) = (t.client(Some(&t.certs[0])), t.client(Some(&t.certs[1])));
    // 3 MiB echoed is 6 MiB through the tunnel: at least ~2.9 s at 2 MiB/s, less a 0.2 MiB
    // burst. Both transfers run at once; echo_exact checks every byte.
    const LEN: usize = 3 << 20;
    let timed = |client: ClientTransport, seed: u64| {
        let target = target.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let stream = dial(mode, &client, &target).await.unwrap();
            drop(echo_exact(stream, seed, LEN).await);
            started.elapsed()
        })
    };
    let (limited, free) = (timed(acme, 1), timed(globex, 2));
    let (limited, free) = (limited.await.unwrap(), free.await.unwrap());
    assert!(
        limited >= std::time::Duration::from_millis(2500),
        "{mode:?}: acme's 6 MiB took {limited:?}, under its 2 MiB/s limit"
    );
    // Generous: unlimited, the same transfer needs only a fraction of that.
    assert!(
        free < std::time::Duration::from_millis(2500),
        "{mode:?}: globex (no limit) took {free:?}"
    );
    assert!(
        t.metric("tether_server_tenant_byte_rate_waits_total{tenant=\"acme\"}")
            .await
            >= 1.0
    );
    assert_eq!(
        t.metric("tether_server_tenant_byte_rate_waits_total{tenant=\"globex\"}")
            .await,
        0.0
    );
}

/// 4 MiB/s for the server, 3 shares to acme and 1 to globex while both are busy.
const WEIGHTED: &str = "bandwidth: {bytes_per_second: 4194304}
tenants:
  - name: acme
    clients: [\"cert:api.acme\"]
    agents: [\"cert:agent.acme\"]
    weight: 3
  - name: globex
    clients: [\"cert:api.globex\"]
    agents: [\"cert:agent.globex\"]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_tenants_split_the_bandwidth_by_weight_and_a_lone_one_gets_it_all() {
    let t = start_with(WEIGHTED, Mode::HttpConnect, Transport::Tls).await;
    let _acme_agent = t.agent(&t.certs[2]).await;
    let _globex_agent = t.agent(&t.certs[3]).await;
    let source = SourceServer::start().await.unwrap();
    // Downloads, so every byte is counted once. While both run, acme gets 3 MiB/s and globex
    // 1 MiB/s: acme's 6 MiB take ~2 s, in which globex receives ~2 MiB. Alone, globex then
    // has 4 MiB/s: its last 2 MiB take ~0.5 s instead of 2 s at its contended share.
    const ACME_LEN: u64 = 6 << 20;
    const GLOBEX_LEN: u64 = 4 << 20;
    let download = |cert: usize, len: u64, received: Arc<AtomicU64>| {
        let (client, target) = (t.client(Some(&t.certs[cert])), source.addr.to_string());
        tokio::spawn(async move {
            let stream = dial(Mode::HttpConnect, &client, &target).await.unwrap();
            download_counted(stream, len, &received).await;
            tokio::time::Instant::now()
        })
    };
    let globex_received = Arc::new(AtomicU64::new(0));
    let globex = download(1, GLOBEX_LEN, globex_received.clone());
    let acme_done = download(0, ACME_LEN, Arc::default()).await.unwrap();
    let at_acme_done = globex_received.load(Ordering::Relaxed);
    let globex_done = globex.await.unwrap();
    let ratio = at_acme_done as f64 / ACME_LEN as f64;
    assert!(
        (0.22..=0.45).contains(&ratio),
        "globex received {at_acme_done} bytes while acme received {ACME_LEN}: {ratio:.2} of it, not ~1/3"
    );
    let alone = globex_done.saturating_duration_since(acme_done);
    let left = GLOBEX_LEN.saturating_sub(at_acme_done);
    // Generous: at its contended share, 1 MiB/s, the rest would take this long.
    let contended = std::time::Duration::from_secs_f64(left as f64 / f64::from(1 << 20));
    assert!(
        alone < contended.mul_f64(0.8),
        "alone, globex's last {left} bytes took {alone:?}; at its contended share: {contended:?}"
    );
    for tenant in ["acme", "globex"] {
        let waits = t
            .metric(&format!(
                "tether_server_tenant_byte_rate_waits_total{{tenant=\"{tenant}\"}}"
            ))
            .await;
        assert!(waits >= 1.0, "{tenant} never waited for its share");
    }
    // The last plan saw globex alone: all of it to globex, and acme's part were it to join.
    for (tenant, share) in [("globex", 4 << 20), ("acme", 3 << 20)] {
        let sample =
            format!("tether_server_tenant_bandwidth_share_bytes_per_second{{tenant=\"{tenant}\"}}");
        assert_eq!(t.metric(&sample).await, f64::from(share), "{sample}");
    }
}

/// Asks a [`SourceServer`] for `len` bytes through `stream` and reads them to the end,
/// checking each one and counting them in `received` as they arrive.
async fn download_counted<S>(mut stream: S, len: u64, received: &AtomicU64)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_u64(len).await.expect("ask for the bytes");
    let mut buf = vec![0u8; 64 * 1024];
    let mut at = 0;
    loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(30), stream.read(&mut buf))
            .await
            .expect("bytes in time")
            .expect("read through tunnel");
        if n == 0 {
            break;
        }
        assert!(
            buf[..n].iter().all(|&b| b == 0x5a),
            "a wrong byte after {at}"
        );
        at += n as u64;
        received.store(at, Ordering::Relaxed);
    }
    assert_eq!(at, len, "the download ended early");
}
