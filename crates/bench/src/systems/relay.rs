//! The relay-limit anchors: client → relay A → TCP → relay B → target, each relay a
//! `tether-bench relay` process (the smallest correct forwarder). With TLS, the A → B leg
//! is mutual TLS with tether's agent-link settings: A holds the agent's certificate and
//! dials, B holds the server's and verifies A's, as a tether agent and server do.

use tokio::process::Command;

use super::dialer::Dialer;
use super::env::Env;
use super::running::Running;
use super::system::System;
use crate::procs::Proc;

pub(super) async fn start(env: &Env, system: System, tls: bool) -> anyhow::Result<Running> {
    let dir = env.instance_dir(&system)?;
    let pki = &env.pki;
    let exe = std::env::current_exe()?;

    // B first: A needs its address.
    let mut cmd = Command::new(&exe);
    cmd.args(["relay", "--listen", "127.0.0.1:0", "--to"])
        .arg(env.target.to_string());
    if tls {
        cmd.arg("--tls-accept")
            .arg("--ca")
            .arg(&pki.ca_cert)
            .arg("--cert")
            .arg(&pki.server_cert)
            .arg("--key")
            .arg(&pki.server_key);
    }
    let (b, b_addr) = Proc::spawn_listening("relay B", cmd, &dir.join("relay-b.log")).await?;

    let mut cmd = Command::new(&exe);
    cmd.args(["relay", "--listen", "127.0.0.1:0", "--to"])
        .arg(b_addr.to_string());
    if tls {
        cmd.arg("--tls-connect")
            .arg("--ca")
            .arg(&pki.ca_cert)
            .arg("--cert")
            .arg(&pki.agent_cert)
            .arg("--key")
            .arg(&pki.agent_key);
    }
    let (a, a_addr) = Proc::spawn_listening("relay A", cmd, &dir.join("relay-a.log")).await?;

    Ok(Running {
        system,
        dialer: Dialer::Tcp(a_addr),
        // A plays the server's part (the client's side), B the agent's (the target's side).
        server: Some(a),
        agents: vec![b],
        server_health: None,
        agent_port: None,
        cut_relay: None,
        holder: None,
    })
}
