//! `tether dial`: one tunnelled connection on standard input and output, like `nc` through
//! the proxy.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgGroup, Args, ValueEnum};

use super::common::go_duration;

/// Which frontend to speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum DialMode {
    Grpc,
    HttpConnect,
}

#[derive(Args, Debug)]
#[group(skip)]
#[command(group(ArgGroup::new("frontend").required(true).args(["uds", "proxy_server"])))]
pub(crate) struct DialArgs {
    /// Destination `host:port`, dialed by an agent in the cluster network.
    pub(crate) address: String,

    /// The server's frontend Unix socket (its --uds-name).
    #[arg(long, value_name = "PATH")]
    pub(crate) uds: Option<PathBuf>,

    /// The server's frontend over mutual TLS, `host:port` (its --server-port).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) proxy_server: Option<String>,

    /// CA that signed the server's certificate (TLS only).
    #[arg(long, value_name = "FILE", requires = "proxy_server")]
    pub(crate) ca_cert: Option<PathBuf>,

    /// Client certificate and key presented to the server (TLS only).
    #[arg(long, value_name = "FILE", requires = "key")]
    pub(crate) cert: Option<PathBuf>,

    /// Private key of --cert.
    #[arg(long, value_name = "FILE", requires = "cert")]
    pub(crate) key: Option<PathBuf>,

    /// Name the server certificate must carry; defaults to the host of --proxy-server.
    #[arg(long, value_name = "NAME")]
    pub(crate) server_name: Option<String>,

    /// Frontend protocol, as the server's --mode.
    #[arg(long, value_enum, default_value = "grpc")]
    pub(crate) mode: DialMode,

    /// How long the dial may take.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = go_duration)]
    pub(crate) timeout: Duration,
}

impl DialArgs {
    /// The name the server's certificate must carry: --server-name, or the host of
    /// --proxy-server; `None` over a Unix socket.
    pub(crate) fn server_name(&self) -> Option<String> {
        if let Some(name) = &self.server_name {
            return Some(name.clone());
        }
        let addr = self.proxy_server.as_deref()?;
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
        Some(host.trim_matches(['[', ']']).to_owned())
    }

    /// The way to the frontend.
    pub(crate) fn transport(&self) -> anyhow::Result<tether_client::Transport> {
        if let Some(path) = &self.uds {
            return Ok(tether_client::Transport::Unix(path.clone()));
        }
        let addr = self
            .proxy_server
            .clone()
            .context("--uds or --proxy-server is required")?;
        let ca = self
            .ca_cert
            .as_ref()
            .context("--ca-cert is required with --proxy-server")?;
        let client = self.cert.as_deref().zip(self.key.as_deref());
        let tls = tether_tls::client_config(ca, client, Vec::new(), &Default::default())?;
        let server_name = self.server_name().unwrap_or_default();
        Ok(tether_client::Transport::Tls {
            addr,
            server_name,
            tls,
        })
    }
}
