//! Failure handling with real processes: agents killed, frozen, drained; servers shut down.

mod failures;
mod introspect;
mod logs;
mod profiling;

use std::path::Path;
use std::time::Duration;

/// Bound for any single step: catches hangs without asserting speed.
pub(crate) const STEP: Duration = Duration::from_secs(30);

pub(crate) fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tether"))
}
