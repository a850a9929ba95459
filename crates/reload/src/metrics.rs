//! What reloads did, for dashboards and alerts.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use tether_observe::metrics::{CounterVec, GaugeVec, Registry};

use crate::loaded::Loaded;

/// `{prefix}_config_reloads_total{file, result}`, `{prefix}_config_generation{file}`,
/// `{prefix}_config_last_reload_success_timestamp_seconds{file}` and
/// `{prefix}_config_info{file, sha256}` (1 for the content in force).
#[derive(Debug, Clone)]
pub struct ReloadMetrics {
    reloads: Arc<CounterVec>,
    generation: Arc<GaugeVec>,
    last_success: Arc<GaugeVec>,
    info: Arc<GaugeVec>,
    /// The `info` series in force, removed when another content replaces it.
    in_force: Arc<Mutex<Option<(String, String)>>>,
}

impl ReloadMetrics {
    /// Registers the families under `prefix` (`tether_server`, `tether_agent`).
    pub fn register(registry: &Registry, prefix: &str) -> Self {
        Self {
            reloads: registry.counter_vec(
                &format!("{prefix}_config_reloads_total"),
                "Reloads of a configuration file by result: applied (a new generation is in force) or refused (unreadable or invalid; the previous generation stays)",
                &["file", "result"],
            ),
            generation: registry.gauge_vec(
                &format!("{prefix}_config_generation"),
                "The configuration file's generation in force: 1 from start, one more per applied reload",
                &["file"],
            ),
            last_success: registry.gauge_vec(
                &format!("{prefix}_config_last_reload_success_timestamp_seconds"),
                "When the configuration in force was applied (Unix time)",
                &["file"],
            ),
            info: registry.gauge_vec(
                &format!("{prefix}_config_info"),
                "1 for the configuration content in force, labelled with its SHA-256 (compare with sha256sum of the file)",
                &["file", "sha256"],
            ),
            in_force: Arc::default(),
        }
    }

    pub(crate) fn applied<T>(&self, path: &Path, loaded: &Loaded<T>, reload: bool) {
        let file = path.display().to_string();
        if reload {
            self.reloads.with(&[&file, "applied"]).inc();
        } else {
            // Zero series from start, so that rate() sees the first reload.
            self.reloads.with(&[&file, "applied"]);
            self.reloads.with(&[&file, "refused"]);
        }
        let generation = i64::try_from(loaded.generation).unwrap_or(i64::MAX);
        self.generation.with(&[&file]).set(generation);
        let at = i64::try_from(unix_seconds(loaded.applied_at)).unwrap_or(i64::MAX);
        self.last_success.with(&[&file]).set(at);
        let mut in_force = self.in_force.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((old_file, old_sha)) = in_force.take() {
            self.info.remove(&[&old_file, &old_sha]);
        }
        self.info.with(&[&file, &loaded.sha256]).set(1);
        *in_force = Some((file, loaded.sha256.clone()));
    }

    pub(crate) fn refused(&self, path: &Path) {
        self.reloads
            .with(&[&path.display().to_string(), "refused"])
            .inc();
    }
}

/// Seconds since the Unix epoch, for metrics and views.
fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
