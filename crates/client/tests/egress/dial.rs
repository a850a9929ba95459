//! Loading a configuration file and dialing through real tether servers with an agent, in
//! the three shapes kube-apiserver supports: gRPC over a Unix socket, HTTP CONNECT over a
//! Unix socket, and HTTP CONNECT over mutual TLS. `Direct` dials the destination itself.

use std::path::Path;
use std::time::Duration;

use tether_client::DialError;
use tether_client::egress::{EgressError, EgressSelector, Selection};
use tether_server::Mode;
use tether_testkit::{AgentOptions, ServerOptions, Stack, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEADLINE: Duration = Duration::from_secs(60);

const HEAD: &str = "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\n";

async fn stack(mode: Mode, transport: Transport) -> Stack {
    let server = ServerOptions {
        mode,
        transport,
        ..ServerOptions::default()
    };
    Stack::start(server, AgentOptions::default())
        .await
        .expect("start server and agent")
}

/// Writes `selections` as a configuration file next to the stack's PKI and loads it.
fn load(stack: &Stack, selections: &str) -> Result<EgressSelector, EgressError> {
    let path = stack.pki.dir().join("egress.yaml");
    std::fs::write(&path, format!("{HEAD}egressSelections:\n{selections}")).unwrap();
    EgressSelector::load(&path)
}

/// Dials the echo target through `selection` a few times, exchanging a pattern each time.
async fn echo_through(selector: &EgressSelector, selection: Selection, stack: &Stack) {
    let dialer = selector
        .dialer(selection)
        .expect("dialer for the selection");
    let address = stack.echo.addr.to_string();
    for round in 0..3u64 {
        let mut stream = dialer.dial(&address).await.expect("dial");
        let data = tether_testkit::targets::pattern(round, 64 * 1024 + 7);
        // Konnectivity has no half-close: write all, read all back, then close.
        stream.write_all(&data).await.unwrap();
        let mut back = vec![0; data.len()];
        stream.read_exact(&mut back).await.unwrap();
        assert!(back == data, "round {round}: echo differs");
        stream.shutdown().await.unwrap();
    }
}

fn uds(stack: &Stack) -> &Path {
    stack
        .server
        .uds
        .as_deref()
        .expect("frontend on a Unix socket")
}

#[tokio::test]
async fn grpc_over_uds() {
    tokio::time::timeout(DEADLINE, async {
        let stack = stack(Mode::Grpc, Transport::Uds).await;
        let selections = format!(
            "- name: cluster\n  connection:\n    proxyProtocol: GRPC\n    transport:\n      uds:\n        udsName: {}\n- name: controlplane\n  connection:\n    proxyProtocol: Direct\n",
            uds(&stack).display()
        );
        let selector = load(&stack, &selections).expect("load");
        echo_through(&selector, Selection::Cluster, &stack).await;
        // Direct reaches the same loopback target without the proxy.
        echo_through(&selector, Selection::ControlPlane, &stack).await;
        assert!(selector.dialer(Selection::Etcd).is_none());
        // An agent's dial error comes back as the endpoint's error.
        let refused = tether_testkit::targets::refused_addr().to_string();
        let dialer = selector.dialer(Selection::Cluster).unwrap();
        let err = dialer.dial(&refused).await.expect_err("refused");
        assert!(matches!(err, DialError::Endpoint { .. }), "{err:?}");
    })
    .await
    .expect("deadline");
}

#[tokio::test]
async fn http_connect_over_uds() {
    tokio::time::timeout(DEADLINE, async {
        let stack = stack(Mode::HttpConnect, Transport::Uds).await;
        let selections = format!(
            "- name: Cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n        udsName: {}\n",
            uds(&stack).display()
        );
        let selector = load(&stack, &selections).expect("load");
        echo_through(&selector, Selection::Cluster, &stack).await;
    })
    .await
    .expect("deadline");
}

#[tokio::test]
async fn http_connect_over_mtls_tcp() {
    tokio::time::timeout(DEADLINE, async {
        let stack = stack(Mode::HttpConnect, Transport::Tls).await;
        let f = &stack.pki.files;
        let addr = stack.server.frontend_tcp.expect("frontend on TCP");
        let selection = |ca: &Path, server_name: &str| {
            format!(
                "- name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      tcp:\n        url: https://{addr}\n        tlsConfig:\n          caBundle: {}\n          clientCert: {}\n          clientKey: {}\n          tlsServerName: {server_name}\n",
                ca.display(),
                f.client_cert.display(),
                f.client_key.display(),
            )
        };
        let selector = load(&stack, &selection(&f.ca_cert, "localhost")).expect("load");
        echo_through(&selector, Selection::Cluster, &stack).await;

        // The server must prove the name: a certificate for `localhost` does not pass as
        // another name.
        let selector = load(&stack, &selection(&f.ca_cert, "proxy.invalid")).expect("load");
        let dialer = selector.dialer(Selection::Cluster).unwrap();
        let err = dialer.dial(&stack.echo.addr.to_string()).await.expect_err("wrong name");
        assert!(matches!(err, DialError::Proxy(_)), "{err:?}");

        // A CA file with no certificate is refused at load time, not at the first dial.
        let empty = stack.pki.dir().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let err = load(&stack, &selection(&empty, "localhost")).expect_err("empty CA");
        assert!(matches!(err, EgressError::Transport(_)), "{err}");
    })
    .await
    .expect("deadline");
}

#[tokio::test]
async fn shapes_kube_apiserver_cannot_dial_are_refused_at_load() {
    tokio::time::timeout(DEADLINE, async {
        let stack = stack(Mode::HttpConnect, Transport::Uds).await;
        for (tcp, why) in [
            ("url: http://127.0.0.1:8131", "https://"),
            ("url: https://127.0.0.1\n        tlsConfig: {clientCert: /dev/null, clientKey: /dev/null, caBundle: /dev/null}", "host:port"),
            ("url: https://127.0.0.1:8131\n        tlsConfig: {clientCert: /dev/null, clientKey: /dev/null}", "caBundle"),
        ] {
            let selections = format!(
                "- name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      tcp:\n        {tcp}\n"
            );
            match load(&stack, &selections) {
                Err(EgressError::Transport(msg)) => assert!(msg.contains(why), "{msg}"),
                other => panic!("{tcp}: {other:?}"),
            }
        }
    })
    .await
    .expect("deadline");
}

/// The gRPC dialer shares one connection and opens a new one once it has ended: here the
/// socket path is a symlink that moves from a stopped server to a new one.
#[tokio::test]
async fn grpc_reconnects_after_the_server_goes_away() {
    tokio::time::timeout(DEADLINE, async {
        let first = stack(Mode::Grpc, Transport::Uds).await;
        let link = first.pki.dir().join("konnectivity.sock");
        std::os::unix::fs::symlink(uds(&first), &link).unwrap();
        let selections = format!(
            "- name: cluster\n  connection:\n    proxyProtocol: GRPC\n    transport:\n      uds:\n        udsName: {}\n",
            link.display()
        );
        let selector = load(&first, &selections).expect("load");
        echo_through(&selector, Selection::Cluster, &first).await;

        let second = stack(Mode::Grpc, Transport::Uds).await;
        let Stack { server, agent, .. } = first;
        agent.stop().await;
        server.stop().await;
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(uds(&second), &link).unwrap();

        // The old connection may still look open until its end is noticed; a dial on it
        // fails as a proxy error, and the next one reconnects.
        let dialer = selector.dialer(Selection::Cluster).unwrap();
        let address = second.echo.addr.to_string();
        let mut reconnected = false;
        for _ in 0..50 {
            match dialer.dial(&address).await {
                Ok(_) => {
                    reconnected = true;
                    break;
                }
                Err(DialError::Proxy(_) | DialError::DialClosed) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(other) => panic!("unexpected {other:?}"),
            }
        }
        assert!(reconnected, "no dial succeeded through the new server");
        echo_through(&selector, Selection::Cluster, &second).await;
    })
    .await
    .expect("deadline");
}
