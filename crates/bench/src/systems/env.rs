//! What every system shares in one run, on its own so that the systems' modules read it
//! without using the module that starts them.

use std::net::SocketAddr;
use std::path::PathBuf;

use tether_tls::pki::PkiFiles;

use super::system::System;

/// Binaries the systems run.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub tether: PathBuf,
    /// The earlier tether build of the `tether-before` systems, when given.
    pub tether_before: Option<PathBuf>,
    /// Whether that build has tether's connection caps (so the bench lifts them as for tether).
    pub before_has_caps: bool,
    pub upstream_server: PathBuf,
    pub upstream_agent: PathBuf,
    pub sshd: PathBuf,
    pub ssh: PathBuf,
    pub ssh_keygen: PathBuf,
    pub rathole: PathBuf,
}

/// What every system shares in one benchmark run.
#[derive(Debug)]
pub struct Env {
    /// Scratch directory (sockets, configs, logs).
    pub dir: PathBuf,
    pub pki: PkiFiles,
    pub bins: Binaries,
    /// The target process's address.
    pub target: SocketAddr,
    /// Instances started so far, to give each its own directory.
    pub started: std::sync::atomic::AtomicUsize,
}

impl Env {
    pub fn instance_dir(&self, system: &System) -> anyhow::Result<PathBuf> {
        let n = self
            .started
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.dir.join(format!("{n:03}-{}", system.id()));
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }
}
