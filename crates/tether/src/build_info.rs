//! What this binary is and was built from, for `--version` and the `tether_build_info`
//! metric: a fleet can be followed through an upgrade, or a migration from upstream. The
//! commit and the compiler come from build.rs.

use tether_observe::VERSION;
use tether_observe::metrics::Registry;

/// The commit the binary was built from, or `unknown`.
pub(crate) const COMMIT: &str = env!("TETHER_COMMIT");
/// The Rust compiler's version (`1.95.0`).
const RUSTC: &str = env!("TETHER_RUSTC");

/// `--version`'s text after the command's name.
pub(crate) const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TETHER_COMMIT"),
    ", rustc ",
    env!("TETHER_RUSTC"),
    ")"
);

/// Registers `tether_build_info{version, commit, rustc} 1`, the Prometheus convention for
/// build information (a join on it labels any other series with the version).
pub(crate) fn register(registry: &Registry) {
    registry
        .gauge_vec(
            "tether_build_info",
            "A constant 1, labelled with tether's version, the commit it was built from and the Rust compiler that built it.",
            &["version", "commit", "rustc"],
        )
        .with(&[VERSION, COMMIT, RUSTC])
        .set(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metric_carries_the_long_versions_parts() {
        let registry = Registry::new();
        register(&registry);
        let text = registry.render();
        let sample = format!(
            "tether_build_info{{commit=\"{COMMIT}\",rustc=\"{RUSTC}\",version=\"{VERSION}\"}} 1"
        );
        assert!(text.contains(&sample), "{text}");
        assert_eq!(
            LONG_VERSION,
            format!("{VERSION} (commit {COMMIT}, rustc {RUSTC})")
        );
    }
}
