//! Certificates and CA bundles reloaded from their files while the process runs.
//!
//! Certificates are rotated by rewriting their files (cert-manager, kubelet's rotation, a
//! Secret volume update). A [`Reloading`] config remembers the files it was built from and a
//! hash of their contents; [`Reloading::reload_if_changed`] rebuilds the config when any of
//! them changed. New handshakes then use the new config; established connections keep the
//! one they were made with, so nothing is dropped. A file that does not build (half-written,
//! wrong key, a certificate that expired or is not valid yet) leaves the previous config in
//! place: the caller logs and counts it. A certificate that is not valid yet is tried again
//! once its `notBefore` has come, without any change to the files.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

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
    seen: Mutex<Seen>,
}

/// What the files held the last time they were read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    /// Hash of their contents.
    fingerprint: u64,
    /// When the same contents are worth building again: a certificate that was not valid
    /// yet becomes valid then. `None`: only changed contents are.
    retry_at: Option<SystemTime>,
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
        let seen = Seen {
            fingerprint: fingerprint(&files),
            retry_at: None,
        };
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

    /// Rebuilds the config if any file's contents changed since the last check, or if
    /// they held a certificate that was not valid yet and now may be.
    pub fn reload_if_changed(&self) -> ReloadOutcome {
        let now = fingerprint(&self.files);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let due = seen
            .retry_at
            .is_some_and(|at| tether_observe::time::wall_clock() >= at);
        if seen.fingerprint == now && !due {
            return ReloadOutcome::Unchanged;
        }
        // Remember the broken contents too: the failure is reported once, not every poll
        // (once more when a not yet valid certificate's time comes).
        *seen = Seen {
            fingerprint: now,
            retry_at: None,
        };
        match (self.build)() {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = config;
                ReloadOutcome::Reloaded
            }
            Err(e) => {
                seen.retry_at = e.valid_from();
                ReloadOutcome::Failed(e)
            }
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
    use std::time::Duration;

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

    #[test]
    fn a_certificate_not_valid_yet_is_tried_again_when_its_time_comes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("value");
        std::fs::write(&file, "1").unwrap();
        // Certificates state whole seconds: at least one second ahead once truncated.
        let valid_from = crate::CertTime::from_system(
            tether_observe::time::wall_clock() + Duration::from_secs(2),
        );
        let path = file.clone();
        let reloading = Reloading::new(vec![file.clone()], move || {
            let text = std::fs::read_to_string(&path).unwrap();
            if text == "2" && tether_observe::time::wall_clock() < valid_from.to_system() {
                return Err(TlsError::OutsideValidity {
                    cert: crate::PemOrigin::File(path.clone()),
                    index: 0,
                    outside: crate::OutsideValidity::NotYetValid {
                        not_before: valid_from,
                    },
                    now: crate::CertTime::from_system(tether_observe::time::wall_clock()),
                });
            }
            Ok(Arc::new(text))
        })
        .unwrap();
        std::fs::write(&file, "2").unwrap();
        let ReloadOutcome::Failed(e) = reloading.reload_if_changed() else {
            panic!("a certificate not valid yet was loaded");
        };
        assert!(e.to_string().contains("not valid before"), "{e}");
        assert!(matches!(
            reloading.reload_if_changed(),
            ReloadOutcome::Unchanged
        ));
        assert_eq!(*reloading.current(), "1");
        while tether_observe::time::wall_clock() < valid_from.to_system() {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(matches!(
            reloading.reload_if_changed(),
            ReloadOutcome::Reloaded
        ));
        assert_eq!(*reloading.current(), "2");
    }
}
