//! OpenSSH port forwarding on loopback, the legacy SSH-tunnel baseline: a private sshd on
//! 127.0.0.1 with a throwaway host key and config, and one `ssh -N -L` or `ssh -N -R`.

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::process::Command;

use super::dialer::Dialer;
use super::env::Env;
use super::loopback::{free_port, wait_port};
use super::running::Running;
use super::system::System;
use crate::procs::{self, Proc};

pub(super) async fn start(env: &Env, system: System) -> anyhow::Result<Running> {
    let dir = env.instance_dir(&system)?;
    let bins = &env.bins;
    for (what, path) in [
        ("sshd", &bins.sshd),
        ("ssh", &bins.ssh),
        ("ssh-keygen", &bins.ssh_keygen),
    ] {
        if !path.exists() {
            bail!(
                "{what} not found at {}: install Debian's openssh-server and openssh-client (scripts/bench.sh does)",
                path.display()
            );
        }
    }
    let host_key = dir.join("ssh_host_ed25519_key");
    let user_key = dir.join("id_ed25519");
    for key in [&host_key, &user_key] {
        let status = Command::new(&bins.ssh_keygen)
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(key)
            .status()
            .await
            .context("running ssh-keygen")?;
        if !status.success() {
            bail!("ssh-keygen failed for {}", key.display());
        }
    }
    fs::copy(user_key.with_extension("pub"), dir.join("authorized_keys"))?;
    let user = current_user();
    if procs::is_root() {
        // sshd refuses to start without its privilege separation directory.
        fs::create_dir_all("/run/sshd").context("creating /run/sshd")?;
    }

    let port = free_port()?;
    let config = dir.join("sshd_config");
    fs::write(&config, sshd_config(&dir, port, &host_key))?;
    let mut cmd = Command::new(&bins.sshd);
    cmd.arg("-D").arg("-e").arg("-f").arg(&config);
    let mut sshd = Proc::spawn("sshd", cmd, &dir.join("sshd.log"))?;
    wait_port(&mut sshd, port).await?;

    let target = env.target;
    let forward_port = free_port()?;
    let mut cmd = Command::new(&bins.ssh);
    cmd.args(["-N", "-T", "-F", "/dev/null", "-i"])
        .arg(&user_key)
        .args(["-p", &port.to_string()])
        .args(["-o", "BatchMode=yes"])
        .args(["-o", "StrictHostKeyChecking=no"])
        .args(["-o", "UserKnownHostsFile=/dev/null"])
        .args(["-o", "ExitOnForwardFailure=yes"])
        .args(["-o", "LogLevel=ERROR"])
        .args(["-o", "ServerAliveInterval=0"]);
    let spec = format!("127.0.0.1:{forward_port}:{}:{}", target.ip(), target.port());
    match system {
        System::SshL => cmd.args(["-L", &spec]),
        _ => cmd.args(["-R", &spec]),
    };
    cmd.arg(format!("{user}@127.0.0.1"));
    let ssh = Proc::spawn("ssh", cmd, &dir.join("ssh.log"))?;
    let mut running = Running {
        system,
        dialer: Dialer::Tcp(SocketAddr::from(([127, 0, 0, 1], forward_port))),
        server: Some(sshd),
        agents: vec![ssh],
        server_health: None,
        agent_port: None,
        cut_relay: None,
        holder: None,
    };
    // The forward listens once the session is up.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        running.check_alive()?;
        if tokio::net::TcpStream::connect(("127.0.0.1", forward_port))
            .await
            .is_ok()
        {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("ssh forward on port {forward_port} did not come up");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(running)
}

fn sshd_config(dir: &Path, port: u16, host_key: &Path) -> String {
    let mut c = format!(
        "Port {port}\n\
         ListenAddress 127.0.0.1\n\
         HostKey {}\n\
         PidFile {}\n\
         AuthorizedKeysFile {}\n\
         PasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n\
         PubkeyAuthentication yes\n\
         UsePAM no\n\
         StrictModes no\n\
         AllowTcpForwarding yes\n\
         GatewayPorts no\n\
         PermitTTY no\n\
         X11Forwarding no\n\
         PrintMotd no\n\
         UseDNS no\n\
         LogLevel ERROR\n\
         MaxStartups 100\n",
        host_key.display(),
        dir.join("sshd.pid").display(),
        dir.join("authorized_keys").display(),
    );
    if procs::is_root() {
        c.push_str("PermitRootLogin prohibit-password\n");
    }
    c
}

fn current_user() -> String {
    if procs::is_root() {
        return "root".into();
    }
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "root".into())
}
