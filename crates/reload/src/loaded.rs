//! One generation of the configuration, on its own so that the metrics that report it and
//! the reloader that makes it both use it without using each other.

use std::sync::Arc;
use std::time::SystemTime;

/// One generation of the configuration: what was parsed, and from which bytes.
#[derive(Debug)]
pub struct Loaded<T> {
    /// 1 for the file read at start, then one more per applied change.
    pub generation: u64,
    /// The hex SHA-256 of the file's bytes, as `sha256sum` prints it.
    pub sha256: String,
    /// When it was applied.
    pub applied_at: SystemTime,
    pub config: Arc<T>,
}
