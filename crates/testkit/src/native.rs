//! A hand-driven client of the native agent link, for tests that speak it frame by frame to a
//! real server: what the server answers to what it is sent.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::BytesMut;
use tether_proto::link::{self, Frame, Hello};
use tether_proto::metadata::Metadata;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// How long [`NativeClient::receive`] waits for the server.
const WAIT: Duration = Duration::from_secs(10);

/// A TLS connection to an agent port on which the server chose the native link.
#[derive(Debug)]
pub struct NativeClient {
    stream: TlsStream<TcpStream>,
    buf: BytesMut,
}

impl NativeClient {
    /// Connects to `addr` trusting `ca`, with `identity` (certificate, key) as its client
    /// certificate when given, offering only the native link's ALPN id.
    pub async fn connect(
        addr: SocketAddr,
        ca: &Path,
        identity: Option<(&Path, &Path)>,
    ) -> anyhow::Result<Self> {
        let tls = tether_tls::client_config(
            ca,
            identity,
            vec![link::ALPN.to_vec()],
            &Default::default(),
        )?;
        let tcp = TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from(addr.ip().to_string())?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await?;
        anyhow::ensure!(
            stream.get_ref().1.alpn_protocol() == Some(link::ALPN),
            "the server did not choose the native link"
        );
        Ok(Self {
            stream,
            buf: BytesMut::new(),
        })
    }

    /// Writes `frame`.
    pub async fn send(&mut self, frame: &Frame) -> anyhow::Result<()> {
        let mut out = BytesMut::new();
        frame.encode(&mut out)?;
        self.send_raw(&out).await
    }

    /// Writes `bytes` as they are: malformed frames.
    pub async fn send_raw(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await?;
        Ok(())
    }

    /// The next frame from the server; `None` once it ended the connection. Fails when
    /// nothing comes within 10 s or the server sends what is not a frame.
    pub async fn receive(&mut self) -> anyhow::Result<Option<Frame>> {
        tokio::time::timeout(WAIT, async {
            loop {
                if let Some(frame) = link::decode(&mut self.buf)? {
                    return Ok(Some(frame));
                }
                self.buf.reserve(4096);
                match self.stream.read_buf(&mut self.buf).await {
                    Ok(0) | Err(_) => return Ok(None),
                    Ok(_) => {}
                }
            }
        })
        .await
        .map_err(|_| anyhow::anyhow!("the server neither answered nor closed within {WAIT:?}"))?
    }
}

/// A HELLO at `version` with `pairs` as its metadata and one capability no version defines.
pub fn hello(version: u8, pairs: &[(&str, &str)]) -> Frame {
    let mut metadata = Metadata::default();
    for (key, value) in pairs {
        metadata.push(key, value.to_string());
    }
    Frame::Hello(Hello {
        version,
        capabilities: vec!["a-later-feature".into()],
        metadata,
    })
}
