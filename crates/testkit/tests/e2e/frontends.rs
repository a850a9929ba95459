//! Every frontend over every transport, driven by tether's client library.

use std::sync::Arc;

use tether_client::{DialError, GrpcClient, Transport as ClientTransport};
use tether_server::Mode;
use tether_testkit::targets::{EchoServer, refused_addr};
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::STEP;
use crate::support::{dial, echo_exact, http_connect_on};

const BIG: usize = 64 << 20;

fn client_transport(pki: &Pki, server: &TestServer, client_cert: bool) -> ClientTransport {
    match &server.uds {
        Some(path) => ClientTransport::Unix(path.clone()),
        None => ClientTransport::Tls {
            addr: server.frontend_tcp.unwrap().to_string(),
            server_name: "127.0.0.1".into(),
            tls: client_tls(pki, client_cert),
        },
    }
}

/// A client's TLS settings for the test CA, with the client certificate or without.
fn client_tls(pki: &Pki, client_cert: bool) -> Arc<rustls::ClientConfig> {
    let f = &pki.files;
    let cert = client_cert.then_some((f.client_cert.as_path(), f.client_key.as_path()));
    tether_tls::client_config(&f.ca_cert, cert, Vec::new(), &Default::default()).unwrap()
}

/// `ipv6`: every server listener (frontend TCP, agent, health) on `[::1]`.
async fn frontend_round_trip(mode: Mode, transport: Transport, ipv6: bool) {
    let pki = Pki::generate().unwrap();
    let server = TestServer::start(
        &pki,
        ServerOptions {
            mode,
            transport,
            ipv6,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let client = client_transport(&pki, &server, true);
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();

    // No agent yet.
    assert!(matches!(
        dial(mode, &client, &target).await.err(),
        Some(DialError::NoAgent)
    ));

    let agent = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    server.wait_ready().await.unwrap();
    let stream = dial(mode, &client, &target).await.unwrap();
    let stream = echo_exact(stream, 1, 100).await;
    // 64 MiB each way, byte for byte.
    drop(echo_exact(stream, 2, BIG).await);

    // Dual stack: an IPv6 destination, and a name (localhost is in /etc/hosts, so the
    // agent's lookup never leaves the machine).
    let own = [agent.health_addr.port(), agent.admin_addr.port()];
    let echo6 = EchoServer::start_apart_from("[::1]:0".parse().unwrap(), &own)
        .await
        .unwrap();
    let stream = dial(mode, &client, &echo6.addr.to_string()).await.unwrap();
    drop(echo_exact(stream, 3, 4096).await);
    let by_name = format!("localhost:{}", echo.addr.port());
    let stream = dial(mode, &client, &by_name).await.unwrap();
    drop(echo_exact(stream, 4, 4096).await);

    // A refused destination surfaces the agent's dial error text.
    let refused = refused_addr();
    let expected = format!("dial tcp {refused}: connect: connection refused");
    match dial(mode, &client, &refused.to_string()).await.err() {
        Some(DialError::Endpoint { message }) => assert_eq!(message, expected),
        Some(DialError::Rejected { status: 502, body }) => assert_eq!(body, expected),
        other => panic!("expected the dial error, got {other:?}"),
    }

    // TCP frontends require a client certificate.
    if transport == Transport::Tls {
        let anonymous = client_transport(&pki, &server, false);
        let refused = tokio::time::timeout(STEP, dial(mode, &anonymous, &target))
            .await
            .unwrap();
        assert!(
            matches!(refused.err(), Some(DialError::Proxy(_))),
            "a client without a certificate must be refused"
        );
        let other_ca = Pki::generate().unwrap();
        let stranger = client_transport(&other_ca, &server, true);
        let refused = tokio::time::timeout(STEP, dial(mode, &stranger, &target))
            .await
            .unwrap();
        assert!(
            matches!(refused.err(), Some(DialError::Proxy(_))),
            "a certificate from another CA must be refused"
        );
    }
}

#[tokio::test]
async fn grpc_over_uds() {
    frontend_round_trip(Mode::Grpc, Transport::Uds, false).await;
}

#[tokio::test]
async fn grpc_over_uds_with_listeners_on_ipv6() {
    frontend_round_trip(Mode::Grpc, Transport::Uds, true).await;
}

#[tokio::test]
async fn grpc_over_mtls_tcp_on_ipv6() {
    frontend_round_trip(Mode::Grpc, Transport::Tls, true).await;
}

#[tokio::test]
async fn http_connect_over_uds_with_listeners_on_ipv6() {
    frontend_round_trip(Mode::HttpConnect, Transport::Uds, true).await;
}

#[tokio::test]
async fn http_connect_over_mtls_tcp_on_ipv6() {
    frontend_round_trip(Mode::HttpConnect, Transport::Tls, true).await;
}

#[tokio::test]
async fn grpc_over_mtls_tcp() {
    frontend_round_trip(Mode::Grpc, Transport::Tls, false).await;
}

#[tokio::test]
async fn http_connect_over_uds() {
    frontend_round_trip(Mode::HttpConnect, Transport::Uds, false).await;
}

#[tokio::test]
async fn http_connect_over_mtls_tcp() {
    frontend_round_trip(Mode::HttpConnect, Transport::Tls, false).await;
}

/// When a client reads nothing for a while, the server's socket fills and the TLS layer
/// keeps the records that did not fit. Once the relay runs out of data, those records must
/// still reach the client while the connection idles (the echo target keeps it open).
/// kube-apiserver's dialer met this under load. A burst of each size from 8 KiB to 504 KiB,
/// all at once, so that some burst ends with a full socket and a part kept by TLS.
#[tokio::test]
async fn http_connect_over_mtls_delivers_a_burst_after_the_client_paused() {
    let pki = Pki::generate().unwrap();
    let server = TestServer::start(
        &pki,
        ServerOptions {
            mode: Mode::HttpConnect,
            transport: Transport::Tls,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // Upstream's agent grants no credit: the server queues what it sends.
    let legacy = AgentOptions {
        legacy: true,
        ..Default::default()
    };
    let _agent = TestAgent::start(&pki, server.agent_addr, legacy)
        .await
        .unwrap();
    server.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let tls = client_tls(&pki, true);
    let bursts = (0..32u64).map(|i| {
        let (tls, frontend, target) = (tls.clone(), server.frontend_tcp.unwrap(), echo.addr);
        tokio::spawn(async move {
            let len = (8 + 16 * i as usize) * 1024;
            // A small receive window and segment size (loopback's 64 KiB segments would grow
            // the server's send buffer past every burst), so that the server's socket fills.
            let tcp = small_window_connect(frontend).await;
            let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let tls = tokio_rustls::TlsConnector::from(tls)
                .connect(name, tcp)
                .await
                .unwrap();
            let (mut stream, head) = http_connect_on(tls, &target.to_string()).await;
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");

            let data = tether_testkit::targets::pattern(i, len);
            stream.write_all(&data).await.unwrap();
            stream.flush().await.unwrap();
            // Read nothing while the echo comes back and the server's socket fills.
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let mut got = vec![0u8; len];
            tokio::time::timeout(STEP, stream.read_exact(&mut got))
                .await
                .unwrap_or_else(|_| panic!("burst {i} ({len} bytes): the echo's tail never came"))
                .expect("read through tunnel");
            assert!(got == data, "burst {i}: the bytes differ");
        })
    });
    for burst in bursts.collect::<Vec<_>>() {
        tokio::time::timeout(STEP * 2, burst)
            .await
            .unwrap()
            .unwrap();
    }
}

/// A loopback TCP connection with a small receive buffer and segment size.
async fn small_window_connect(to: std::net::SocketAddr) -> tokio::net::TcpStream {
    use socket2::{Domain, Socket, Type};
    // tokio sets the receive buffer but not TCP_MAXSEG.
    let shaped = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    shaped.set_tcp_mss(1460).unwrap();
    shaped.set_nonblocking(true).unwrap();
    let socket = tokio::net::TcpSocket::from_std_stream(shaped.into());
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(to).await.unwrap()
}

#[tokio::test]
async fn two_hundred_concurrent_connections_across_two_agents() {
    let pki = Pki::generate().unwrap();
    let server = TestServer::start(&pki, ServerOptions::default())
        .await
        .unwrap();
    let a = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    let b = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    a.wait_ready().await.unwrap();
    b.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let client = Arc::new(
        GrpcClient::connect(&client_transport(&pki, &server, true))
            .await
            .unwrap(),
    );
    let tasks: Vec<_> = (0..200u64)
        .map(|seed| {
            let client = client.clone();
            let target = echo.addr.to_string();
            tokio::spawn(async move {
                let stream = client.dial(&target).await.unwrap();
                drop(echo_exact(stream, seed, 256 * 1024).await);
            })
        })
        .collect();
    for task in tasks {
        tokio::time::timeout(STEP * 4, task).await.unwrap().unwrap();
    }
    let (da, db) = (
        crate::support::agent_dials(&a).await,
        crate::support::agent_dials(&b).await,
    );
    assert_eq!(da + db, 200.0);
    assert!(
        da > 0.0 && db > 0.0,
        "both agents carry connections ({da} / {db})"
    );
}
