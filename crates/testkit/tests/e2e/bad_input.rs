//! Malformed input gets a clear answer and costs nobody else anything.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use tether_grpc::client::Channel;
use tether_grpc::{GrpcError, H2Settings};
use tether_proto::{ConnectId, Packet, pb};
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, Stack, TestAgent, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use crate::STEP;
use crate::support::{echo_exact, http_connect_uds, read_head};

async fn still_serves(server: &TestServer, echo: &EchoServer) {
    let (stream, head) =
        http_connect_uds(server.uds.as_ref().unwrap(), &echo.addr.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    echo_exact(stream, 9, 4096).await;
}

#[tokio::test]
async fn http_connect_garbage_oversized_headers_and_wrong_methods() {
    let Stack {
        pki: _pki,
        server,
        agent: _agent,
        echo,
    } = Stack::start(ServerOptions::http_connect(), AgentOptions::default())
        .await
        .unwrap();
    let uds = server.uds.clone().unwrap();

    // Binary garbage: 400.
    let mut s = UnixStream::connect(&uds).await.unwrap();
    s.write_all(&[
        0x16, 0x03, 0x01, 0x00, 0xff, 0x00, b'\r', b'\n', b'\r', b'\n',
    ])
    .await
    .unwrap();
    assert!(read_head(&mut s).await.starts_with("HTTP/1.1 400"));

    // Headers beyond Go's 1 MiB limit: 431, and the server does not buffer without end.
    let mut s = UnixStream::connect(&uds).await.unwrap();
    let mut request = b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: x\r\n".to_vec();
    let filler = format!("X-Filler: {}\r\n", "a".repeat(8000));
    while request.len() < (1 << 20) + 65536 {
        request.extend_from_slice(filler.as_bytes());
    }
    let (mut rd, mut wr) = s.split();
    let (_, head) = tokio::join!(wr.write_all(&request), read_head(&mut rd));
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");
    drop(s);

    // Any other method: Go's 405 text.
    let mut s = UnixStream::connect(&uds).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).await.unwrap();
    assert!(
        response.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
        "{response}"
    );
    assert!(
        response.ends_with("\r\n\r\nthis proxy only supports CONNECT passthrough\n"),
        "{response}"
    );

    // A client that connects and says nothing does not hold up anyone else.
    let _silent = UnixStream::connect(&uds).await.unwrap();
    still_serves(&server, &echo).await;
}

/// Frames raw protobuf bytes as one gRPC message.
fn grpc_frame(message: &[u8]) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_u8(0);
    buf.put_u32(message.len() as u32);
    buf.put_slice(message);
    buf.freeze()
}

#[tokio::test]
async fn grpc_frontend_ignores_unknown_and_undecodable_packets() {
    let pki = Pki::generate().unwrap();
    let server = TestServer::start(&pki, ServerOptions::default())
        .await
        .unwrap();
    let _agent = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    server.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();

    let io = UnixStream::connect(server.uds.as_ref().unwrap())
        .await
        .unwrap();
    let (h2, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let mut h2 = h2.ready().await.unwrap();
    let request = http::Request::post("http://localhost/ProxyService/Proxy")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut send) = h2.send_request(request, false).unwrap();
    // An unknown packet type, then bytes that are not protobuf at all, then a real dial.
    let unknown = pb::Packet {
        r#type: 57,
        payload: None,
    }
    .encode_to_vec();
    send.send_data(grpc_frame(&unknown), false).unwrap();
    send.send_data(grpc_frame(&[0xff, 0xff, 0xff, 0xff, 0x0f]), false)
        .unwrap();
    let dial = pb::Packet::from(&Packet::DialRequest {
        protocol: "tcp".into(),
        address: echo.addr.to_string(),
        random: tether_proto::DialId(5),
    });
    send.send_data(grpc_frame(&dial.encode_to_vec()), false)
        .unwrap();
    let mut body = tokio::time::timeout(STEP, response)
        .await
        .unwrap()
        .unwrap()
        .into_body();
    let chunk = tokio::time::timeout(STEP, body.data())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let reply = pb::Packet::decode(&chunk[5..]).unwrap();
    match Packet::try_from(reply).unwrap() {
        Packet::DialResponse { random, result } => {
            assert_eq!(random.0, 5);
            assert!(result.is_ok(), "{result:?}");
        }
        other => panic!("expected DIAL_RSP, got {other:?}"),
    }
}

async fn agent_channel(pki: &Pki, server: &TestServer) -> Channel {
    let f = &pki.files;
    let tls = tether_tls::client_config(
        &f.ca_cert,
        Some((&f.agent_cert, &f.agent_key)),
        vec![b"h2".to_vec()],
        &Default::default(),
    )
    .unwrap();
    let tcp = TcpStream::connect(server.agent_addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::clone(&tls))
        .connect(name, tcp)
        .await
        .unwrap();
    let (channel, driver) = Channel::handshake(tls, &H2Settings::agent_stream(), "127.0.0.1", true)
        .await
        .unwrap();
    tokio::spawn(driver.run());
    channel
}

#[tokio::test]
async fn agent_listener_refuses_bad_agents_and_answers_unknown_connections() {
    let Stack {
        pki,
        server,
        agent: _agent,
        echo,
    } = Stack::start(ServerOptions::http_connect(), AgentOptions::default())
        .await
        .unwrap();

    // No agent ID: refused before any header, with upstream's message.
    let channel = agent_channel(&pki, &server).await;
    let (_tx, mut rx) = channel
        .call(tether_proto::path::CONNECT, &[])
        .await
        .unwrap();
    match rx.response_headers().await {
        Err(GrpcError::Status(status)) => {
            assert!(status.message.contains("expected one agent ID"), "{status}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }

    // A real agent stream sending DATA for a connection that does not exist gets CLOSE_REQ.
    let (mut tx, mut rx) = channel
        .call(
            tether_proto::path::CONNECT,
            &[("agentid", "rogue".to_owned())],
        )
        .await
        .unwrap();
    rx.response_headers().await.unwrap();
    tx.send(&Packet::Data {
        connect_id: ConnectId(4242),
        data: Bytes::from_static(b"x"),
    })
    .await
    .unwrap();
    let reply = tokio::time::timeout(STEP, rx.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        reply,
        Packet::CloseRequest {
            connect_id: ConnectId(4242)
        }
    );

    // The rogue stream would otherwise be picked for dials it never answers.
    drop((tx, rx, channel));
    crate::support::eventually("rogue agent gone", || async {
        let text = server.metrics().await.unwrap();
        tether_testkit::http::metric_value(
            &text,
            "konnectivity_network_proxy_server_ready_backend_connections",
        ) == Some(1.0)
    })
    .await;

    // Not TLS at all on the agent port.
    let mut raw = TcpStream::connect(server.agent_addr).await.unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(STEP, raw.read_to_end(&mut sink))
        .await
        .unwrap();

    still_serves(&server, &echo).await;
}
