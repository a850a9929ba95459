//! A real tether agent against a scripted server: what the agent answers to what it is sent.

use std::time::Duration;

use tether_grpc::H2Settings;
use tether_grpc::server::{Connection, serve_connection};
use tether_proto::{DialId, Packet, metadata};
use tether_testkit::harness::{AgentOptions, Pki, TestAgent};
use tether_testkit::targets::EchoServer;
use tokio::net::TcpListener;

/// Before the shared session table, a second DIAL_REQ with the same `random` started a
/// second dial and replaced the first one's cancel token: the agent answered with two
/// connections, and DIAL_CLS could cancel only one of them. Now the repeat is refused.
#[tokio::test]
async fn a_repeated_dial_id_gets_one_connection_and_one_refusal() {
    let pki = Pki::generate().unwrap();
    let echo = EchoServer::start().await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server_addr = listener.local_addr().unwrap();
    let f = &pki.files;
    let tls = tether_tls::server_config(
        &f.server_cert,
        &f.server_key,
        Some(&f.ca_cert),
        &[b"h2"],
        &Default::default(),
    )
    .unwrap();
    let (answers_tx, mut answers) = tokio::sync::mpsc::unbounded_channel();
    let target = echo.addr.to_string();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = tokio_rustls::TlsAcceptor::from(tls)
            .accept(tcp)
            .await
            .unwrap();
        let on_call = move |call: tether_grpc::server::IncomingCall| {
            let answers = answers_tx.clone();
            let target = target.clone();
            async move {
                let response = [
                    (metadata::SERVER_ID, "scripted".to_owned()),
                    (metadata::SERVER_COUNT, "1".to_owned()),
                ];
                let (mut tx, mut rx) = call.accept(&response).unwrap();
                let dial = Packet::DialRequest {
                    protocol: "tcp".into(),
                    address: target,
                    random: DialId(7),
                };
                tx.send(&dial).await.unwrap();
                tx.send(&dial).await.unwrap();
                while let Some(Ok(packet)) = rx.next().await {
                    if let Packet::DialResponse { .. } = packet {
                        let _ = answers.send(packet);
                    }
                }
            }
        };
        let settings = H2Settings::agent_stream();
        let _ = serve_connection(
            tls,
            &settings,
            Connection::unchecked(),
            on_call,
            std::future::pending(),
        )
        .await;
    });
    let options = AgentOptions {
        link: AgentOptions::default().link.reaching_grpc(),
        ..AgentOptions::default()
    };
    let agent = TestAgent::start(&pki, server_addr, options).await.unwrap();

    let mut results = Vec::new();
    for _ in 0..2 {
        let answer = tokio::time::timeout(Duration::from_secs(10), answers.recv())
            .await
            .expect("the agent answers each DIAL_REQ")
            .expect("the scripted server is running");
        let Packet::DialResponse { random, result } = answer else {
            unreachable!("only DIAL_RSPs are forwarded")
        };
        assert_eq!(random, DialId(7));
        results.push(result);
    }
    let connected = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(
        connected, 1,
        "exactly one connection for one dial ID: {results:?}"
    );
    assert!(
        results.iter().any(|r| r
            .as_ref()
            .is_err_and(|e| e.contains("already being dialed"))),
        "the repeat is refused: {results:?}"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(500), answers.recv())
            .await
            .is_err(),
        "no third answer"
    );
    agent.stop().await;
    server.abort();
}
