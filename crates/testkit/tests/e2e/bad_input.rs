//! Malformed input gets a clear answer and costs nobody else anything.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use tether_grpc::{GrpcError, H2Settings};
use tether_proto::{ConnectId, Packet, pb};
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, Stack, TestAgent, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use crate::STEP;
use crate::support::{echo_exact, http_connect_uds, read_head};

/// Opens a raw `ProxyService.Proxy` call, for sending bytes no well-behaved client would.
async fn proxy_call(
    h2: &h2::client::SendRequest<Bytes>,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut h2 = h2.clone().ready().await.unwrap();
    let request = http::Request::post("http://localhost/ProxyService/Proxy")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    h2.send_request(request, false).unwrap()
}

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
    let (response, mut send) = proxy_call(&h2).await;
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
    let channel = server.agent_channel(&pki).await.unwrap();
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

/// L5: stray packets before the DIAL_REQ do not buy the client time. With a 1 s first-packet
/// deadline and junk every 200 ms, the server still ends the stream (it used to re-arm the
/// deadline on every packet, so junk held a stream forever).
#[tokio::test]
async fn junk_before_the_dial_request_does_not_extend_its_deadline() {
    let pki = Pki::generate().unwrap();
    let server = TestServer::start(
        &pki,
        ServerOptions {
            limits: tether_server::Limits {
                first_packet_timeout: std::time::Duration::from_secs(1),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let io = UnixStream::connect(server.uds.as_ref().unwrap())
        .await
        .unwrap();
    let (h2, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let (response, mut send) = proxy_call(&h2).await;
    let junk = pb::Packet {
        r#type: 57,
        payload: None,
    }
    .encode_to_vec();
    // At most 100 packets (20 s), and it stops as soon as the server has ended the stream.
    let sender = tokio::spawn(async move {
        for sent in 1..=100u32 {
            if send.send_data(grpc_frame(&junk), false).is_err() {
                return sent;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        100
    });
    let started = tokio::time::Instant::now();
    let mut body = tokio::time::timeout(STEP, response)
        .await
        .unwrap()
        .unwrap()
        .into_body();
    let ended = tokio::time::timeout(STEP, async {
        while let Some(chunk) = body.data().await {
            if chunk.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream outlived {STEP:?} of junk");
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(15),
        "ended only after {took:?}, long after the 1 s deadline"
    );
    sender.abort();
}

/// M3: HTTP/2 windows bound what a client can make the server buffer. Each of 24 streams
/// announces a largest (4 MiB) message and tries to send all of it: flow-control capacity
/// comes back only as whole messages are decoded, so together they get no more than the
/// frontend's 64 MiB connection window (it used to be released on receipt: all 96 MiB).
#[tokio::test]
async fn partial_messages_are_bounded_by_the_connection_window() {
    const STREAMS: usize = 24;
    let message = tether_proto::frame::MAX_MESSAGE_LEN;
    let pki = Pki::generate().unwrap();
    let server = TestServer::start(&pki, ServerOptions::default())
        .await
        .unwrap();
    let io = UnixStream::connect(server.uds.as_ref().unwrap())
        .await
        .unwrap();
    // h2 grants send capacity from its own buffer too: keep that small, so what this side
    // counts as sent is (up to 16 KiB a stream) what the server's windows let onto the wire.
    const CLIENT_BUFFER: usize = 16 * 1024;
    let (h2, conn) = h2::client::Builder::new()
        .max_send_buffer_size(CLIENT_BUFFER)
        .handshake::<_, Bytes>(io)
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let chunk = Bytes::from(vec![0u8; CLIENT_BUFFER]);
    let mut senders = Vec::new();
    let mut responses = Vec::new();
    for _ in 0..STREAMS {
        let (response, mut send) = proxy_call(&h2).await;
        let mut prefix = BytesMut::new();
        prefix.put_u8(0);
        prefix.put_u32(message as u32);
        send.send_data(prefix.freeze(), false).unwrap();
        senders.push(send);
        responses.push(response);
    }
    // Every stream pushes its message body but the last byte, so no message ever completes,
    // while the peer grants capacity; a stream that gets none for 2 s is blocked by the windows.
    let mut sent = 0usize;
    'streams: for send in &mut senders {
        let mut left = message - 1;
        while left > 0 {
            send.reserve_capacity(left.min(chunk.len()));
            let granted = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                std::future::poll_fn(|cx| send.poll_capacity(cx)),
            )
            .await;
            let Ok(Some(Ok(granted))) = granted else {
                // Blocked: the connection window is shared, so every later stream is too.
                break 'streams;
            };
            let n = granted.min(left);
            send.send_data(chunk.slice(..n), false).unwrap();
            left -= n;
            sent += n;
        }
    }
    let connection_window = H2Settings::frontend().connection_window as usize;
    assert!(
        sent <= connection_window + STREAMS * (CLIENT_BUFFER + 5),
        "{sent} bytes of partial messages accepted, more than the {connection_window}-byte connection window"
    );
    assert!(
        sent >= connection_window / 2,
        "only {sent} bytes accepted at all"
    );
    drop((senders, responses));
    driver.abort();
}

/// Reads a call's response to its end: the `grpc-status` of its trailers (or of a
/// trailers-only response), or why there was none (a reset).
async fn call_status(response: h2::client::ResponseFuture) -> Result<String, String> {
    let response = tokio::time::timeout(STEP, response)
        .await
        .map_err(|_| "no response".to_owned())?
        .map_err(|e| format!("response: {e}"))?;
    if let Some(status) = response.headers().get("grpc-status") {
        return Ok(status.to_str().unwrap_or_default().to_owned());
    }
    let mut body = response.into_body();
    let trailers = tokio::time::timeout(STEP, async {
        while let Some(chunk) = body.data().await {
            chunk.map_err(|e| format!("body: {e}"))?;
        }
        body.trailers().await.map_err(|e| format!("trailers: {e}"))
    })
    .await
    .map_err(|_| "no end of stream".to_owned())??;
    trailers
        .and_then(|t| t.get("grpc-status").cloned())
        .map(|v| v.to_str().unwrap_or_default().to_owned())
        .ok_or_else(|| "no grpc-status".to_owned())
}

/// A length prefix announcing 4 GiB - 1.
fn huge_prefix() -> Bytes {
    Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff])
}

/// L3: a message whose length prefix exceeds the 4 MiB limit ends the call with
/// RESOURCE_EXHAUSTED in its trailers, as grpc-go ends it, on the frontend and on the agent
/// listener (it was a bare RST_STREAM CANCEL); the server keeps serving.
#[tokio::test]
async fn a_message_over_the_size_limit_ends_the_call_with_resource_exhausted() {
    let Stack {
        pki,
        server,
        agent: _agent,
        echo: _echo,
    } = Stack::start(ServerOptions::default(), AgentOptions::default())
        .await
        .unwrap();

    let io = UnixStream::connect(server.uds.as_ref().unwrap())
        .await
        .unwrap();
    let (h2, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let (response, mut send) = proxy_call(&h2).await;
    send.send_data(huge_prefix(), false).unwrap();
    assert_eq!(call_status(response).await.as_deref(), Ok("8"), "frontend");

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
    let io = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .unwrap();
    let (h2, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let mut h2 = h2.ready().await.unwrap();
    let request = http::Request::post(format!("https://127.0.0.1{}", tether_proto::path::CONNECT))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("agentid", "huge")
        .body(())
        .unwrap();
    let (response, mut send) = h2.send_request(request, false).unwrap();
    send.send_data(huge_prefix(), false).unwrap();
    assert_eq!(
        call_status(response).await.as_deref(),
        Ok("8"),
        "agent listener"
    );

    // The real agent's stream is unaffected.
    server.wait_ready().await.unwrap();
}
