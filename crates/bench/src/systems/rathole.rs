//! rathole (crates.io `rathole`), a reverse tunnel like a Konnectivity agent: the rathole
//! client next to the target holds a control channel to the rathole server, and every
//! connection to the server's service port takes its own data channel (TCP, then a Noise
//! handshake; the server asks the client for them ahead and keeps a few ready), which the
//! client joins to a fresh connection to the target. Noise
//! with rathole's default pattern (`Noise_NK_25519_ChaChaPoly_BLAKE2s`) and a key pair from
//! `rathole --genkey` is the encryption its docs recommend without certificates; its TLS
//! transport needs OpenSSL (native-tls), which scripts/bench.sh does not build.

use std::fs;
use std::net::SocketAddr;

use anyhow::{Context as _, bail};
use tokio::process::Command;

use super::dialer::Dialer;
use super::env::Env;
use super::loopback::{free_port, wait_port};
use super::running::Running;
use super::system::System;
use crate::procs::Proc;

/// The release scripts/bench.sh installs (into `target/rathole-<VERSION>`); keep the two equal.
pub const VERSION: &str = "0.5.0";

/// How scripts/bench.sh installs it, for the error when it is missing.
pub const INSTALL: &str = "cargo install --root target/rathole-0.5.0 --no-default-features --features server,client,noise rathole@0.5.0";

pub(super) async fn start(env: &Env, system: System) -> anyhow::Result<Running> {
    let dir = env.instance_dir(&system)?;
    let bin = &env.bins.rathole;
    let (private_key, public_key) = genkey(bin).await?;
    let token = uuid::Uuid::new_v4().simple().to_string();
    let control_port = free_port()?;
    let service_port = free_port()?;

    let server_toml = dir.join("server.toml");
    fs::write(
        &server_toml,
        format!(
            "[server]\n\
             bind_addr = \"127.0.0.1:{control_port}\"\n\
             default_token = \"{token}\"\n\
             [server.transport]\n\
             type = \"noise\"\n\
             [server.transport.noise]\n\
             local_private_key = \"{private_key}\"\n\
             [server.services.bench]\n\
             bind_addr = \"127.0.0.1:{service_port}\"\n"
        ),
    )?;
    let client_toml = dir.join("client.toml");
    fs::write(
        &client_toml,
        format!(
            "[client]\n\
             remote_addr = \"127.0.0.1:{control_port}\"\n\
             default_token = \"{token}\"\n\
             [client.transport]\n\
             type = \"noise\"\n\
             [client.transport.noise]\n\
             remote_public_key = \"{public_key}\"\n\
             [client.services.bench]\n\
             local_addr = \"{}\"\n",
            env.target
        ),
    )?;

    let command = |mode: &str, config| {
        let mut c = Command::new(bin);
        // Its default level (info) logs lines per connection; the others run quiet too.
        c.env("RUST_LOG", "error").arg(mode).arg(config);
        c
    };
    let mut server = Proc::spawn(
        "rathole server",
        command("--server", &server_toml),
        &dir.join("server.log"),
    )?;
    // No probe of the control port (the server would log the probe as a failed handshake):
    // the client retries its connection every second until the server listens.
    let mut client = Proc::spawn(
        "rathole client",
        command("--client", &client_toml),
        &dir.join("client.log"),
    )?;
    // The server listens on the service port once the client's control channel is up.
    client.check_alive()?;
    wait_port(&mut server, service_port).await?;
    client.check_alive()?;
    Ok(Running {
        system,
        dialer: Dialer::Tcp(SocketAddr::from(([127, 0, 0, 1], service_port))),
        server: Some(server),
        agents: vec![client],
        server_health: None,
        agent_port: None,
        cut_relay: None,
        holder: None,
    })
}

/// A fresh Noise key pair from `rathole --genkey`: (private, public), base64.
async fn genkey(bin: &std::path::Path) -> anyhow::Result<(String, String)> {
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        Command::new(bin).arg("--genkey").output(),
    )
    .await
    .context("rathole --genkey timed out")?
    .context("running rathole --genkey")?;
    if !out.status.success() {
        bail!(
            "rathole --genkey failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let value_after = |label: &str| {
        let mut lines = text.lines();
        lines.find(|l| l.trim() == label)?;
        lines.next().map(|l| l.trim().to_owned())
    };
    match (value_after("Private Key:"), value_after("Public Key:")) {
        (Some(private), Some(public)) if !private.is_empty() && !public.is_empty() => {
            Ok((private, public))
        }
        _ => bail!("unexpected output of rathole --genkey: {text:?}"),
    }
}
