//! The systems under test: how each is started as real processes on loopback, how a
//! workload dials through it, and which processes to sample.
//!
//! Each system's module (`konnectivity`, `relay`, `ssh`, `rathole`) starts it; this one
//! dispatches to them. `fleet` starts several tether servers peered with each other, with
//! no agent (the fleet workload's fake agents join them). What they share sits in leaf modules below all of them: `system` (which
//! systems there are), `env` (what a run gives every system), `dialer`, `running` (a started
//! system) and `loopback` (ports and readiness).

mod dialer;
mod env;
mod fleet;
mod konnectivity;
mod loopback;
mod rathole;
mod relay;
mod running;
mod ssh;
mod system;

use std::time::Duration;

use anyhow::bail;

pub use dialer::Dialer;
pub use env::{Binaries, Env};
pub use fleet::{Counts, FLEET_SYSTEM, Fleet, Member, Setup, server_id};
use konnectivity::AgentLink;
pub use konnectivity::{agent_flags, flag};
pub use loopback::{free_port, http_get, wait_http_ok};
pub use rathole::{INSTALL as RATHOLE_INSTALL, VERSION as RATHOLE_VERSION};
pub use running::{GRPC_STREAMS, Running, metric_sum};
pub use system::{Frontend, Impl, System};

impl Running {
    /// Starts `system` with one agent (or its SSH forward).
    pub async fn start(env: &Env, system: System) -> anyhow::Result<Running> {
        let running = match system {
            System::Direct => Running {
                system,
                dialer: Dialer::Tcp(env.target),
                server: None,
                agents: Vec::new(),
                server_health: None,
                agent_port: None,
                cut_relay: None,
                holder: None,
            },
            System::RelayLimit { tls } => relay::start(env, system, tls).await?,
            System::Konn(i, f) => {
                konnectivity::start(env, i, f, AgentLink::Direct(1), None).await?
            }
            System::SshL | System::SshR => ssh::start(env, system).await?,
            System::Rathole => rathole::start(env, system).await?,
        };
        running.check_end_to_end().await?;
        Ok(running)
    }

    /// Starts a Konnectivity system with `agents` agents, each with its own ID, and waits
    /// until the server counts all of them (scale).
    pub async fn start_scaled(env: &Env, system: System, agents: usize) -> anyhow::Result<Running> {
        let System::Konn(imp, frontend) = system else {
            bail!("{} has no agents to scale", system.name());
        };
        let running =
            konnectivity::start(env, imp, frontend, AgentLink::Direct(agents), None).await?;
        running
            .wait_for_agents(
                |counted| counted >= agents,
                &format!("{agents} agents"),
                Duration::from_secs(30),
            )
            .await?;
        running.check_end_to_end().await?;
        Ok(running)
    }

    /// Starts a Konnectivity system with one agent whose server allows `cap` concurrent
    /// streams per frontend connection (reusable tunnel). Upstream has no such flag and
    /// ignores it; [`Impl::has_caps`] says which servers take it.
    pub async fn start_with_stream_cap(
        env: &Env,
        system: System,
        cap: u32,
    ) -> anyhow::Result<Running> {
        let System::Konn(imp, frontend) = system else {
            bail!("{} has no frontend stream cap", system.name());
        };
        let running =
            konnectivity::start(env, imp, frontend, AgentLink::Direct(1), Some(cap)).await?;
        running.check_end_to_end().await?;
        Ok(running)
    }

    /// Starts a Konnectivity server with no agent (fan-in).
    pub async fn start_lone_server(env: &Env, imp: Impl) -> anyhow::Result<Running> {
        konnectivity::start(env, imp, Frontend::HttpConnectUds, AgentLink::None, None).await
    }

    /// Starts a Konnectivity system whose agent reaches the server through a relay the
    /// workload can cut (resume).
    pub async fn start_with_cut_relay(env: &Env, system: System) -> anyhow::Result<Running> {
        let System::Konn(imp, frontend) = system else {
            bail!("{} has no agent link to cut", system.name());
        };
        let running = konnectivity::start(env, imp, frontend, AgentLink::CutRelay, None).await?;
        running.check_end_to_end().await?;
        Ok(running)
    }
}

pub use konnectivity::client_tls;

/// Client TLS config with the agent's certificate, for fake agents, offering `alpn`.
pub fn konnectivity_agent_tls(
    env: &Env,
    alpn: &[u8],
) -> anyhow::Result<std::sync::Arc<rustls::ClientConfig>> {
    let pki = &env.pki;
    konnectivity::client_tls(&pki.ca_cert, &pki.agent_cert, &pki.agent_key, alpn)
}
