//! The files the soak's servers and agents read, and their changes: the routing file and the
//! certificates. Each version is written as the kubelet writes a mounted ConfigMap or
//! Secret: every file into a new directory, then one symlink (`..data`) swapped, with the
//! names the processes open (`routing.yaml`, `server.crt`…) linking through it. So no
//! process reads half a change: a certificate with the previous key, a truncated file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use tether_tls::pki::{Leaf, Pki, PkiFiles};

/// The routing file at the start, and after every heal.
pub const ROUTING_FIRST: &str = "\
# The soak's routing file, as it starts.
ejection:
  consecutive_failures: 5
  base_seconds: 10
  max_seconds: 300
";

/// A changed routing file: every client now sticks to one agent, and ejection is quicker.
pub const ROUTING_CHANGED: &str = "\
# The soak's routing file, changed.
affinity: client
ejection:
  consecutive_failures: 3
  base_seconds: 5
  max_seconds: 60
";

/// A routing file every server must refuse (an unknown key), keeping the one in force.
pub const ROUTING_BROKEN: &str = "\
# The soak's routing file, broken.
ejection:
  consecutive_failurez: 5
";

/// The names in a version's directory that the processes open through `..data`.
const NAMES: [&str; 10] = [
    "routing.yaml",
    "ca.crt",
    "server.crt",
    "server.key",
    "agent.crt",
    "agent.key",
    "client.crt",
    "client.key",
    "peer.crt",
    "peer.key",
];

/// The soak's files and what they hold now.
#[derive(Debug)]
pub struct Files {
    dir: PathBuf,
    /// The credentials in force; the CA stays, leaves are issued again on rotation.
    pki: Pki,
    routing: &'static str,
    version: u32,
    /// What the processes are given: paths through `..data`.
    pub paths: PkiFiles,
    pub routing_path: PathBuf,
}

impl Files {
    /// A fresh CA and its credentials, and [`ROUTING_FIRST`], as version 1 in `dir`.
    pub fn create(dir: &Path) -> anyhow::Result<Files> {
        std::fs::create_dir_all(dir)?;
        let mut files = Files {
            dir: dir.to_owned(),
            pki: Pki::generate()?,
            routing: ROUTING_FIRST,
            version: 0,
            paths: PkiFiles::in_dir(dir),
            routing_path: dir.join("routing.yaml"),
        };
        files.publish()?;
        for name in NAMES {
            std::os::unix::fs::symlink(Path::new("..data").join(name), dir.join(name))
                .with_context(|| format!("linking {name}"))?;
        }
        Ok(files)
    }

    /// Puts `text` in place as the routing file.
    pub fn set_routing(&mut self, text: &'static str) -> anyhow::Result<()> {
        self.routing = text;
        self.publish()
    }

    /// The SHA-256 of the routing file in place, as the servers label the one in force.
    pub fn routing_sha256(&self) -> String {
        tether_reload::sha256_hex(self.routing.as_bytes())
    }

    /// New server and agent certificates and keys from the same CA, in place at once.
    pub fn rotate(&mut self) -> anyhow::Result<()> {
        let now = tether_observe::time::wall_clock();
        let (from, to) = (
            now - Duration::from_secs(3600),
            now + Duration::from_secs(24 * 3600),
        );
        let server = self.pki.reissue(Leaf::Server, from, to)?;
        let agent = self.pki.reissue(Leaf::Agent, from, to)?;
        self.pki.server_cert_pem = server.cert_pem;
        self.pki.server_key_pem = server.key_pem;
        self.pki.agent_cert_pem = agent.cert_pem;
        self.pki.agent_key_pem = agent.key_pem;
        self.publish()
    }

    /// Writes the next version's directory, swaps `..data` to it in one rename, and removes
    /// the version before.
    fn publish(&mut self) -> anyhow::Result<()> {
        self.version += 1;
        let name = format!("..v{}", self.version);
        let version = self.dir.join(&name);
        self.pki.write_to(&version)?;
        std::fs::write(version.join("routing.yaml"), self.routing)?;
        let staged = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&staged);
        std::os::unix::fs::symlink(&name, &staged)?;
        std::fs::rename(&staged, self.dir.join("..data")).context("swapping ..data")?;
        if self.version > 1 {
            let before = self.dir.join(format!("..v{}", self.version - 1));
            std::fs::remove_dir_all(before)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_swaps_every_file_at_once_through_the_same_paths() {
        let dir = std::env::temp_dir().join(format!("tether-soak-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut files = Files::create(&dir).unwrap();
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(&files.routing_path), ROUTING_FIRST);
        let (cert, key) = (
            read(&files.paths.server_cert),
            read(&files.paths.server_key),
        );
        let ca = read(&files.paths.ca_cert);

        files.set_routing(ROUTING_CHANGED).unwrap();
        assert_eq!(read(&files.routing_path), ROUTING_CHANGED);
        assert_eq!(read(&files.paths.server_cert), cert);
        files.rotate().unwrap();
        assert_ne!(read(&files.paths.server_cert), cert);
        assert_ne!(read(&files.paths.server_key), key);
        assert_eq!(read(&files.paths.ca_cert), ca, "the CA stays");
        assert_eq!(read(&files.routing_path), ROUTING_CHANGED);
        assert_eq!(
            files.routing_sha256(),
            tether_reload::sha256_hex(ROUTING_CHANGED.as_bytes())
        );
        // Only the version in force is kept.
        let versions = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("..v")
            })
            .count();
        assert_eq!(versions, 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
