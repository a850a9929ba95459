//! Runs `tether dial`: standard input to the tunnel, the tunnel to standard output.

use std::process::ExitCode;

use anyhow::Context as _;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::cli::dial::{DialArgs, DialMode};

pub(crate) async fn run(args: DialArgs) -> anyhow::Result<ExitCode> {
    let transport = args.transport()?;
    let dial = async {
        match args.mode {
            DialMode::Grpc => {
                let client = tether_client::GrpcClient::connect(&transport).await?;
                let stream = client
                    .dial_with_timeout(&args.address, args.timeout)
                    .await?;
                anyhow::Ok(pipe(stream).await)
            }
            DialMode::HttpConnect => {
                let socket = tokio::time::timeout(
                    args.timeout,
                    tether_client::dial_http_connect(&transport, &args.address),
                )
                .await
                .context("timed out dialing")??;
                anyhow::Ok(pipe(socket).await)
            }
        }
    };
    match dial
        .await
        .map_err(|e| with_tls_hint(with_mode_hint(e, args.mode), &args))
        .with_context(|| format!("dialing {}", args.address))?
    {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: tunnel to {}: {e}", args.address);
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Adds what to try when `error` looks like the other frontend protocol answering: an HTTP
/// CONNECT client reading HTTP/2 from a gRPC frontend, or a gRPC client refused by ALPN on an
/// HTTP CONNECT one.
fn with_mode_hint(error: anyhow::Error, mode: DialMode) -> anyhow::Error {
    let text = format!("{error:#}");
    let (looks_crossed, other, flag) = match mode {
        DialMode::HttpConnect => (text.contains("malformed HTTP response"), "gRPC", "grpc"),
        DialMode::Grpc => (
            text.contains("NoApplicationProtocol") || text.contains("not a gRPC response"),
            "HTTP CONNECT",
            "http-connect",
        ),
    };
    if looks_crossed {
        error.context(format!(
            "the frontend seems to speak {other} (the server's --mode={flag}): try --mode {flag}"
        ))
    } else {
        error
    }
}

/// Adds what to check when `error` holds a TLS failure with the frontend: the flags of
/// `tether dial` and of the server that decide it.
fn with_tls_hint(error: anyhow::Error, args: &DialArgs) -> anyhow::Error {
    let found = error.chain().find_map(|e| {
        let client = e.downcast_ref::<tether_client::ClientError>();
        let dial = e.downcast_ref::<tether_client::DialError>();
        client
            .and_then(tether_client::ClientError::handshake_failure)
            .or_else(|| dial.and_then(tether_client::DialError::handshake_failure))
    });
    let Some(failure) = found else {
        return error;
    };
    match tls_advice(failure, args) {
        Some(advice) => error.context(advice),
        None => error,
    }
}

/// What to check for `failure` on the way to the server's TLS frontend.
fn tls_advice(failure: tether_tls::HandshakeFailure, args: &DialArgs) -> Option<String> {
    use rustls::AlertDescription as Alert;
    use tether_tls::HandshakeFailure as F;
    Some(match failure {
        F::UnknownIssuer => {
            "the server's certificate is not signed by --ca-cert: check --ca-cert, \
                             and the server's --server-cert"
                .into()
        }
        F::V1Certificate => "the server's certificate (its --server-cert) is an X.509 v1 \
                             certificate, which tether refuses (v3 required): see Certificates \
                             in the book's Install guide"
            .into(),
        F::OutsideValidity => "the server's certificate (its --server-cert) has expired or is \
                               not valid yet (check its dates, and both clocks)"
            .into(),
        F::WrongName => format!(
            "the server's certificate does not name {:?}: pass --server-name with a name its \
             subjectAltName holds",
            args.server_name().unwrap_or_default()
        ),
        F::PeerAlert(Alert::CertificateRequired | Alert::HandshakeFailure)
            if args.cert.is_none() =>
        {
            "the server asks for a client certificate: pass --cert and --key, signed by the \
             server's --server-ca-cert"
                .into()
        }
        F::PeerAlert(
            Alert::UnknownCA
            | Alert::BadCertificate
            | Alert::CertificateRequired
            | Alert::UnsupportedCertificate
            | Alert::CertificateExpired
            | Alert::AccessDenied,
        ) => "the server refused this client's certificate: is --cert signed by the server's \
              --server-ca-cert, valid now, and an X.509 v3 certificate for client authentication?"
            .into(),
        F::Incompatible => "the server and this client share no TLS version, cipher suite or \
                            ALPN protocol: is --proxy-server the server's frontend port \
                            (--server-port), and --mode its --mode?"
            .into(),
        F::NotTls => "the server did not answer in TLS: is --proxy-server the server's frontend \
                      port (--server-port)?"
            .into(),
        F::NoCertificate | F::BadCertificate | F::PeerAlert(_) | F::Other => return None,
    })
}

/// Copies stdin into the tunnel and the tunnel to stdout until the far side closes. End of
/// input does not close the tunnel: Konnectivity has no half-close, so closing would cut off
/// the answer to what was just sent (like `nc` without `-N`). An abnormal close is an error,
/// never a silent end.
async fn pipe<S: AsyncRead + AsyncWrite + Unpin>(stream: S) -> std::io::Result<()> {
    let (mut rd, mut wr) = tokio::io::split(stream);
    let upload = async {
        tokio::io::copy(&mut tokio::io::stdin(), &mut wr).await?;
        wr.flush().await
    };
    let download = async {
        let mut stdout = tokio::io::stdout();
        tokio::io::copy(&mut rd, &mut stdout).await?;
        stdout.flush().await
    };
    tokio::pin!(upload, download);
    tokio::select! {
        result = &mut download => result,
        result = &mut upload => {
            result?;
            download.await
        }
    }
}
