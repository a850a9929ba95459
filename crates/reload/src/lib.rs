//! A configuration file that changes while the process runs.
//!
//! Kubernetes updates a mounted ConfigMap by writing a new directory and swapping the
//! `..data` symlink, editors write a new file and rename it over the old, and people write
//! in place. Watching inodes or events for all three is fragile (a symlink swap changes no
//! event on the file's own path), so the file is read whole by its path every interval, and
//! on SIGHUP at once, and compared by content. A small file read twice a second costs
//! nothing next to a proxy's traffic.
//!
//! A new content is parsed whole before anything changes: a bad file is refused, counted
//! and logged with the parser's message (which names the line and field), and the previous
//! generation stays in force. A good one becomes the next [`Loaded`] generation, published on
//! a watch channel whose receivers apply it as a whole.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tether_observe::introspect::{ConfigFileView, RefusalView};
use tether_observe::time::Civil;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

mod loaded;
mod metrics;

pub use loaded::Loaded;
pub use metrics::ReloadMetrics;

/// How often the file is read when no SIGHUP comes: changes apply within this.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(500);

/// A content that was refused: the previous generation stayed in force.
#[derive(Clone, Debug)]
pub struct Refusal {
    pub at: SystemTime,
    /// The refused bytes' SHA-256, or empty when the file could not be read.
    pub sha256: String,
    pub message: String,
}

/// What one check of the file found.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Unchanged,
    Applied { generation: u64 },
    Refused { message: String },
}

/// Parses the file's bytes (its path is for messages); the error names what to fix.
pub type Parse<T> = Box<dyn Fn(&Path, &[u8]) -> Result<T, String> + Send + Sync>;

/// A watched configuration file and the generation in force.
pub struct Reloader<T> {
    path: PathBuf,
    parse: Parse<T>,
    current: watch::Sender<Arc<Loaded<T>>>,
    last_refusal: Mutex<Option<Refusal>>,
    /// The refused content the file still holds, so the same bytes are not refused (and
    /// logged) at every check; forgotten once the file reads otherwise, so that the same
    /// mistake made again after a revert is refused again.
    refused_in_place: Mutex<Option<String>>,
    metrics: ReloadMetrics,
}

impl<T> std::fmt::Debug for Reloader<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("path", &self.path)
            .field("generation", &self.current.borrow().generation)
            .finish_non_exhaustive()
    }
}

impl<T: Send + Sync + 'static> Reloader<T> {
    /// Reads and parses the file: generation 1. An error here is a start-up error.
    pub fn load(path: PathBuf, parse: Parse<T>, metrics: ReloadMetrics) -> Result<Self, String> {
        let bytes = read(&path)?;
        let config = parse(&path, &bytes)?;
        let loaded = Loaded {
            generation: 1,
            sha256: sha256_hex(&bytes),
            applied_at: tether_observe::time::wall_clock(),
            config: Arc::new(config),
        };
        metrics.applied(&path, &loaded, false);
        let (current, _) = watch::channel(Arc::new(loaded));
        Ok(Self {
            path,
            parse,
            current,
            last_refusal: Mutex::new(None),
            refused_in_place: Mutex::new(None),
            metrics,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The generation in force.
    pub fn current(&self) -> Arc<Loaded<T>> {
        self.current.borrow().clone()
    }

    /// Follows the generations: the receiver sees each one that is applied.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Loaded<T>>> {
        self.current.subscribe()
    }

    /// The last refused content since start, if any (shown beside the generation in force).
    pub fn last_refusal(&self) -> Option<Refusal> {
        self.last_refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The generation in force and the last refusal, as the admin API shows them; `name`
    /// says what the file is (its flag: `routing-config`, `destination-policy`).
    pub fn view(&self, name: &str) -> ConfigFileView {
        let current = self.current();
        let rfc3339 = |at| Civil::from_system_time(at).rfc3339();
        ConfigFileView {
            name: name.to_owned(),
            path: self.path.display().to_string(),
            generation: current.generation,
            sha256: current.sha256.clone(),
            applied_at: rfc3339(current.applied_at),
            last_refusal: self.last_refusal().map(|refusal| RefusalView {
                at: rfc3339(refusal.at),
                sha256: refusal.sha256,
                message: refusal.message,
            }),
        }
    }

    /// Reads the file now and applies it when its content changed and it parses. Blocking:
    /// it reads a file and runs the parser.
    pub fn check(&self) -> Outcome {
        let bytes = match read(&self.path) {
            Ok(bytes) => bytes,
            Err(message) => return self.refuse(String::new(), message),
        };
        let sha256 = sha256_hex(&bytes);
        let refused_already = {
            let mut in_place = self
                .refused_in_place
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            in_place.take_if(|refused| *refused != sha256);
            in_place.is_some()
        };
        if sha256 == self.current.borrow().sha256 {
            return Outcome::Unchanged;
        }
        if refused_already {
            // Refused already, and logged: the same bytes again are no news.
            return Outcome::Unchanged;
        }
        match (self.parse)(&self.path, &bytes) {
            Ok(config) => {
                let generation = self.current.borrow().generation + 1;
                let loaded = Loaded {
                    generation,
                    sha256,
                    applied_at: tether_observe::time::wall_clock(),
                    config: Arc::new(config),
                };
                self.metrics.applied(&self.path, &loaded, true);
                tracing::info!(
                    file = %self.path.display(),
                    generation,
                    sha256 = %loaded.sha256,
                    "configuration reloaded"
                );
                *self
                    .last_refusal
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = None;
                self.current.send_replace(Arc::new(loaded));
                Outcome::Applied { generation }
            }
            Err(message) => self.refuse(sha256, message),
        }
    }

    fn refuse(&self, sha256: String, message: String) -> Outcome {
        let in_force = self.current.borrow().generation;
        self.metrics.refused(&self.path);
        tracing::error!(
            file = %self.path.display(),
            generation = in_force,
            "configuration reload refused, generation {in_force} stays in force: {message}"
        );
        *self
            .last_refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Refusal {
            at: tether_observe::time::wall_clock(),
            sha256: sha256.clone(),
            message: message.clone(),
        });
        if !sha256.is_empty() {
            *self
                .refused_in_place
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(sha256);
        }
        Outcome::Refused { message }
    }

    /// Checks the file every `interval` and at each SIGHUP, until `stop`.
    pub async fn run(self: Arc<Self>, interval: Duration, stop: CancellationToken) {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(signal) => Some(signal),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; the configuration is still read every {interval:?}");
                None
            }
        };
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticker.tick() => {}
                Some(()) = async { hangup.as_mut()?.recv().await } => {
                    tracing::info!(file = %self.path.display(), "SIGHUP: reading the configuration");
                }
            }
            let this = self.clone();
            if tokio::task::spawn_blocking(move || this.check())
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

/// Logs each SIGHUP until `stop`, for a process that watches no configuration file: SIGHUP's
/// default action would end it, and every connection with it, when an operator only meant to
/// reload. `why` says why there is nothing to read and which flag would give a file.
pub async fn log_hangups(why: &'static str, stop: CancellationToken) {
    let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(signal) => signal,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP");
            return;
        }
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            Some(()) = hangup.recv() => tracing::info!("SIGHUP: nothing to reload: {why}"),
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Lower-case hex SHA-256, as `sha256sum` prints it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
