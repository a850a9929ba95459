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
        .map_err(|e| with_mode_hint(e, args.mode))
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
