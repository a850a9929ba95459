//! `--tls-reload-interval`: the listeners' certificate files, watched for rotation.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tether_server::{Mode, TlsReload};
use tether_tls::{Reloading, TlsOptions};

use super::ServerArgs;

impl ServerArgs {
    /// The reloading configs of the agent listener and (for TCP) the frontend, or `None`
    /// when reloading is off. Built from the same files and options as the initial configs.
    pub(super) fn tls_reload(
        &self,
        mode: Mode,
        tls: &TlsOptions,
        interval: Duration,
    ) -> anyhow::Result<Option<TlsReload>> {
        if interval.is_zero() {
            return Ok(None);
        }
        let agent = reloading(
            &self.cluster_cert,
            &self.cluster_key,
            &self.cluster_ca_cert,
            &tether_server::AGENT_ALPN,
            tls,
        )?;
        let frontend = if self.uds_name.is_empty() {
            let alpn: &'static [&'static [u8]] = match mode {
                Mode::Grpc => &[b"h2"],
                Mode::HttpConnect => &[b"http/1.1"],
            };
            Some(reloading(
                &self.server_cert,
                &self.server_key,
                &self.server_ca_cert,
                alpn,
                tls,
            )?)
        } else {
            None
        };
        Ok(Some(TlsReload {
            interval,
            agent,
            frontend,
        }))
    }
}

fn reloading(
    cert: &str,
    key: &str,
    ca: &str,
    alpn: &'static [&'static [u8]],
    tls: &TlsOptions,
) -> anyhow::Result<Arc<Reloading<rustls::ServerConfig>>> {
    let (cert, key) = (PathBuf::from(cert), PathBuf::from(key));
    let ca = (!ca.is_empty()).then(|| PathBuf::from(ca));
    let mut files = vec![cert.clone(), key.clone()];
    files.extend(ca.clone());
    let tls = tls.clone();
    let build = move || tether_tls::server_config(&cert, &key, ca.as_deref(), alpn, &tls);
    Ok(Arc::new(Reloading::new(files, build)?))
}
