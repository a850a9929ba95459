//! Lease-based server counting, compatible with upstream's `--enable-lease-controller`
//! (servers) and `--count-server-leases` (agents), so that a fleet mixing tether and
//! upstream binaries agrees on how many servers there are.
//!
//! Each server keeps a `coordination.k8s.io/v1` Lease named
//! `konnectivity-proxy-server-<serverID>` renewed ([`controller`]) and deletes its peers'
//! expired ones ([`gc`]); agents count the valid ones ([`counter`]). The decisions (what to
//! write, what is expired, what the count is) are pure functions in [`validity`],
//! [`record`] and [`count`]; [`api`] is the thin layer of Kubernetes calls with the rate limit
//! and deadlines.

pub mod api;
pub mod controller;
pub mod count;
pub mod counter;
pub mod gc;
pub mod labels;
pub mod metrics;
pub mod record;
pub mod validity;

use std::time::Duration;

/// Upstream's `LeaseDuration` constant.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(30);
/// Upstream's `LeaseRenewalInterval` (and `LeaseGCInterval`) constant.
pub const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(15);

/// The Lease a server with this ID holds, as upstream names it.
pub fn lease_name(server_id: &str) -> String {
    format!("konnectivity-proxy-server-{server_id}")
}

/// Checks that a server ID makes a valid Lease name (a DNS subdomain: at most 253
/// lowercase letters, digits, `-` and `.`, starting and ending alphanumeric), so that a bad
/// `--server-id` is a start-up error rather than a Lease the API server refuses every 15 s.
pub fn check_server_id(server_id: &str) -> Result<(), String> {
    let name = lease_name(server_id);
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let valid = name.len() <= 253
        && name.ends_with(alnum)
        && name
            .split('.')
            .all(|part| !part.is_empty() && part.starts_with(alnum) && part.ends_with(alnum))
        && name.chars().all(|c| alnum(c) || c == '-' || c == '.');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "server ID {server_id:?} does not make a valid Lease name ({name:?} must be at most \
             253 lowercase letters, digits, '-' and '.')"
        ))
    }
}

/// `d` plus a random fraction of up to `factor` of it (`wait.Jitter`), so that servers and
/// agents started together do not call the API server in lockstep.
pub(crate) fn jitter(d: Duration, factor: f64) -> Duration {
    use std::hash::{BuildHasher as _, Hasher as _};
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    d + d.mul_f64(factor * (random % 10_000) as f64 / 10_000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_upstreams() {
        assert_eq!(
            lease_name("4a9c1b2e-0d3f-4a57-9b1c-2e3f4a5b6c7d"),
            "konnectivity-proxy-server-4a9c1b2e-0d3f-4a57-9b1c-2e3f4a5b6c7d"
        );
    }

    #[test]
    fn server_ids_must_make_dns_subdomains() {
        for good in ["srv-1", "4a9c1b2e-0d3f-4a57-9b1c-2e3f4a5b6c7d", "a.b"] {
            check_server_id(good).unwrap();
        }
        for bad in ["Srv1", "srv_1", "srv-", "a..b", "a.", "", &"x".repeat(230)] {
            assert!(check_server_id(bad).is_err(), "{bad:?}");
        }
    }
}
