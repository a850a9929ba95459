//! Certificates and CA bundles reloaded from their files while the process runs.
//!
//! Certificates are rotated by rewriting their files (cert-manager, kubelet's rotation, a
//! Secret volume update). A [`Reloading`] config remembers the files it was built from and a
//! hash of their contents; [`Reloading::reload_if_changed`] rebuilds the config when any of
//! them changed. New handshakes then use the new config; established connections keep the
//! one they were made with, so nothing is dropped. A file that does not build (half-written,
//! wrong key) leaves the previous config in place: the caller logs and counts it.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use crate::TlsError;

/// What one reload check did.
#[derive(Debug)]
pub enum ReloadOutcome {
    Unchanged,
    Reloaded,
    /// The files changed but do not make a valid config; the old one stays.
    Failed(TlsError),
}

type Build<C> = Box<dyn Fn() -> Result<Arc<C>, TlsError> + Send + Sync>;

/// A rustls config (server or client) rebuilt from its files when they change.
pub struct Reloading<C> {
    files: Vec<PathBuf>,
    build: Build<C>,
    current: RwLock<Arc<C>>,
    /// Hash of the files' contents the last time they were read.
    seen: Mutex<u64>,
}

impl<C> std::fmt::Debug for Reloading<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl<C> Reloading<C> {
    /// Builds the config once (an error here is a start-up error) and remembers `files`.
    pub fn new(
        files: Vec<PathBuf>,
        build: impl Fn() -> Result<Arc<C>, TlsError> + Send + Sync + 'static,
    ) -> Result<Self, TlsError> {
        let seen = fingerprint(&files);
        let current = build()?;
        Ok(Self {
            files,
            build: Box::new(build),
            current: RwLock::new(current),
            seen: Mutex::new(seen),
        })
    }

    /// The config new handshakes should use.
    pub fn current(&self) -> Arc<C> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Rebuilds the config if any file's contents changed since the last check.
    pub fn reload_if_changed(&self) -> ReloadOutcome {
        let now = fingerprint(&self.files);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if *seen == now {
            return ReloadOutcome::Unchanged;
        }
        // Remember the broken contents too: the failure is reported once, not every poll.
        *seen = now;
        match (self.build)() {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = config;
                ReloadOutcome::Reloaded
            }
            Err(e) => ReloadOutcome::Failed(e),
        }
    }

    /// The files watched, for log lines.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }
}

/// A hash of every file's contents (an unreadable file hashes as its error kind), so that
/// a rewrite with the same mtime or a new file behind a symlink swap is still noticed.
fn fingerprint(files: &[PathBuf]) -> u64 {
    let mut hasher = DefaultHasher::new();
    for file in files {
        match std::fs::read(file) {
            Ok(bytes) => bytes.hash(&mut hasher),
            Err(e) => format!("{:?}", e.kind()).hash(&mut hasher),
        }
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reloads_on_change_and_keeps_the_old_config_on_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("value");
        std::fs::write(&file, "1").unwrap();
        let path = file.clone();
        let reloading = Reloading::new(vec![file.clone()], move || {
            let text = std::fs::read_to_string(&path).unwrap();
            text.trim()
                .parse::<u32>()
                .map(Arc::new)
                .map_err(|_| TlsError::Rustls {
                    what: "parsing",
                    error: rustls::Error::General("not a number".into()),
                })
        })
        .unwrap();
        assert_eq!(*reloading.current(), 1);
        assert!(matches!(
            reloading.reload_if_changed(),
            ReloadOutcome::Unchanged
        ));
        std::fs::write(&file, "2").unwrap();
        assert!(matches!(
            reloading.reload_if_changed(),
            ReloadOutcome::Reloaded
        ));
        assert_eq!(*reloading.current(), 2);
        std::fs::write(&file, "garbage").unwrap();
        assert!(matches!(
            reloading.reload_if_changed(),
            ReloadOutcome::Failed(_)
        ));
        assert!(matches!(
            reloading.reload_if_changed(),
            ReloadOutcome::Unchanged
        ));
        assert_eq!(*reloading.current(), 2, "the old config stays");
    }
}
