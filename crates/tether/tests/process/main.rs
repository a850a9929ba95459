//! Failure handling with real processes: agents killed, frozen, drained; servers shut down.

mod audit;
mod certificates;
mod dead_agents;
mod destinations;
mod discovery;
mod drain;
mod failures;
mod fleet_behind_nat;
mod handshake_failures;
mod hangup;
mod introspect;
mod logs;
mod peering;
mod policy_reload;
mod profiling;
mod readiness;
mod reload;
mod reload_frontends;
mod resources;
mod version;

use std::path::Path;
use std::time::Duration;

use tether_client::Transport;
use tether_testkit::Pki;
use tether_testkit::http::metric_value;
use tether_testkit::process::{Process, ServerProcess};

/// Bound for any single step: catches hangs without asserting speed.
pub(crate) const STEP: Duration = Duration::from_secs(30);

/// A sample of `process`'s metrics, `None` while its page or the sample is not there.
pub(crate) async fn metric(process: &Process, sample: &str) -> Option<f64> {
    metric_value(&process.metrics().await.ok()?, sample)
}

/// Polls until `check` holds; returns how long it took. Fails after `STEP`.
pub(crate) async fn until<F, Fut>(what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = tokio::time::Instant::now();
    while !check().await {
        assert!(started.elapsed() < STEP, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

pub(crate) fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tether"))
}

/// A client's way to `server`'s HTTP CONNECT frontend over mutual TLS.
pub(crate) fn tls_transport(pki: &Pki, server: &ServerProcess) -> Transport {
    let f = &pki.files;
    Transport::Tls {
        addr: server.frontend_tcp.expect("TLS frontend").to_string(),
        server_name: "127.0.0.1".into(),
        tls: tether_tls::client_config(
            &f.ca_cert,
            Some((&f.client_cert, &f.client_key)),
            Vec::new(),
            &Default::default(),
        )
        .unwrap(),
    }
}
