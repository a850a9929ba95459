//! The programs a run starts, where they are found, and a clear error naming how to build
//! one that is missing.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use crate::cli::Args;
use crate::systems::{self, Binaries, Impl, System};

pub fn binaries(args: &Args) -> anyhow::Result<Binaries> {
    let exe = std::env::current_exe()?;
    let tether = args
        .tether_bin
        .clone()
        .unwrap_or_else(|| exe.with_file_name("tether"));
    let up = args
        .upstream_bin_dir
        .clone()
        .unwrap_or_else(|| repo_root().join("interop/bin"));
    let which = |name: &str, fallback: &str| {
        std::env::var_os("PATH")
            .and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(name))
                    .find(|p| p.exists())
            })
            .unwrap_or_else(|| PathBuf::from(fallback))
    };
    // A build from before the connection caps existed refuses their flags.
    let before_has_caps = match &args.before_tether_bin {
        Some(bin) => std::process::Command::new(bin)
            .args(["server", "--help"])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout).contains("--max-streams-per-frontend-connection")
            })
            .with_context(|| format!("running {} server --help", bin.display()))?,
        None => false,
    };
    Ok(Binaries {
        tether,
        tether_before: args.before_tether_bin.clone(),
        before_has_caps,
        upstream_server: up.join("proxy-server"),
        upstream_agent: up.join("proxy-agent"),
        sshd: PathBuf::from("/usr/sbin/sshd"),
        ssh: which("ssh", "/usr/bin/ssh"),
        ssh_keygen: which("ssh-keygen", "/usr/bin/ssh-keygen"),
        rathole: args.rathole_bin.clone().unwrap_or_else(|| {
            // target/<profile>/tether-bench → target/rathole-<version>/bin/rathole
            exe.parent()
                .and_then(Path::parent)
                .unwrap_or(Path::new("."))
                .join(format!("rathole-{}/bin/rathole", systems::RATHOLE_VERSION))
        }),
    })
}

pub fn check_binaries(b: &Binaries, systems: &[System]) -> anyhow::Result<()> {
    let mut need = Vec::new();
    for s in systems {
        match s {
            System::Konn(Impl::Tether | Impl::TetherH2 | Impl::TetherWs | Impl::TetherPeer, _) => {
                need.push((&b.tether, "cargo build --release -p tether"))
            }
            System::Konn(Impl::TetherBefore, _) => match &b.tether_before {
                Some(path) => need.push((path, "build the earlier commit's tether")),
                None => anyhow::bail!("the tether-before systems need --before-tether-bin"),
            },
            System::Konn(Impl::Upstream, _) => {
                need.push((&b.upstream_server, "interop/build.sh"));
                need.push((&b.upstream_agent, "interop/build.sh"));
            }
            System::SshL | System::SshR => {
                need.push((&b.sshd, "apt-get install -y openssh-server openssh-client"));
                need.push((&b.ssh, "apt-get install -y openssh-client"));
            }
            System::Rathole => need.push((&b.rathole, systems::RATHOLE_INSTALL)),
            System::Direct | System::RelayLimit { .. } => {}
        }
    }
    for (path, how) in need {
        if !path.exists() {
            bail!(
                "{} not found (build or install it: {how}; scripts/bench.sh does all of it)",
                path.display()
            );
        }
    }
    Ok(())
}

/// The repository's root, where `interop/bin` holds the upstream binaries.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}
