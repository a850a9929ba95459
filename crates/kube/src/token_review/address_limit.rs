//! The TokenReviews one source address may cause (`--token-review-qps-per-address`,
//! `--token-review-burst-per-address`), so that one address sending forged tokens cannot use
//! up the shared limit (`--kubeconfig-qps`) every agent needs.
//!
//! Two bounds per address:
//! - at most `burst` reviews in flight at once, so a flood reaches the API server at that
//!   width until its first refusals come back;
//! - a rate bucket that only **refused** tokens (and reviews without an answer) use up. A
//!   token that admits an agent costs its address nothing, so agents behind one NAT
//!   address that reconnect together after a server restart are paced by the shared limit
//!   alone, as upstream's server paces them (it reviews every connection).
//!
//! The table holds at most a fixed number of addresses; an address with nothing in flight
//! and a full bucket holds nothing worth keeping and is dropped when room is needed.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::rate_limit::Rate;

/// How many TokenReviews one source address may cause. An address is an IPv4 address or an
/// IPv6 /64 (what one host is usually given).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AddressLimit {
    /// Refused tokens per second; a negative value means no limit per address.
    pub qps: f32,
    /// Refused tokens at once above the rate, and reviews in flight at once.
    pub burst: u32,
}

impl Default for AddressLimit {
    /// Two refused tokens a second with a burst of five: a node's agent needs one review per
    /// token rotation, and an address that floods leaves the shared limit (client-go's 5 per
    /// second) to everyone else.
    fn default() -> Self {
        Self { qps: 2.0, burst: 5 }
    }
}

/// The per-address bounds of [`AddressLimit`], for at most `max_keys` addresses at once.
#[derive(Debug)]
pub(crate) struct AddressLimiter {
    rate: Rate,
    in_flight: usize,
    max_keys: usize,
    entries: Mutex<HashMap<Option<IpAddr>, Entry>>,
}

#[derive(Debug)]
struct Entry {
    /// The rate bucket's theoretical arrival time; `None` when full.
    tat: Option<Instant>,
    slots: Arc<Semaphore>,
}

/// A review under way for an address: its slot is given back when this drops.
#[derive(Debug)]
pub(crate) struct InFlight {
    _slot: OwnedSemaphorePermit,
}

impl AddressLimiter {
    pub(crate) fn new(limit: AddressLimit, max_keys: usize) -> Self {
        Self {
            rate: Rate::new(limit.qps, limit.burst),
            in_flight: limit.burst.max(1) as usize,
            max_keys: max_keys.max(1),
            entries: Mutex::default(),
        }
    }

    /// Waits, until `deadline` at most, for `address` to have a review slot free and its
    /// bucket room for a refusal; `None` if that does not happen in time.
    pub(crate) async fn admit(
        &self,
        address: Option<IpAddr>,
        deadline: Instant,
    ) -> Option<InFlight> {
        let key = address.map(key);
        let (start, slots) = self.look(key);
        if start > deadline {
            return None;
        }
        tokio::time::sleep_until(start).await;
        let slot = tokio::time::timeout_at(deadline, slots.acquire_owned())
            .await
            .ok()?
            .ok()?;
        // Refusals that came back while this one waited for its slot count too.
        let (start, _) = self.look(key);
        if start > deadline {
            return None;
        }
        tokio::time::sleep_until(start).await;
        Some(InFlight { _slot: slot })
    }

    /// Uses up one refusal's share of `address`'s bucket.
    pub(crate) fn charge(&self, address: Option<IpAddr>) {
        let now = Instant::now();
        let mut entries = self.lock();
        let entry = self.entry(&mut entries, address.map(key), now);
        self.rate.charge(&mut entry.tat, now);
    }

    /// When a review from `key` could start, and its slots.
    fn look(&self, key: Option<IpAddr>) -> (Instant, Arc<Semaphore>) {
        let now = Instant::now();
        let mut entries = self.lock();
        let entry = self.entry(&mut entries, key, now);
        (self.rate.earliest(entry.tat, now), entry.slots.clone())
    }

    /// `key`'s entry, made room for if the table is full.
    fn entry<'a>(
        &self,
        entries: &'a mut HashMap<Option<IpAddr>, Entry>,
        key: Option<IpAddr>,
        now: Instant,
    ) -> &'a mut Entry {
        if entries.len() >= self.max_keys && !entries.contains_key(&key) {
            let idle = |e: &Entry| {
                self.rate.refilled(e.tat, now) && e.slots.available_permits() == self.in_flight
            };
            entries.retain(|_, e| !idle(e));
            if entries.len() >= self.max_keys
                && let Some(soonest) = entries.iter().min_by_key(|(_, e)| e.tat).map(|(k, _)| *k)
            {
                // Every address is busy: the one closest to refilled goes (its reviews in
                // flight keep their slots; it may have a few more for a while).
                entries.remove(&soonest);
            }
        }
        entries.entry(key).or_insert_with(|| Entry {
            tat: None,
            slots: Arc::new(Semaphore::new(self.in_flight)),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Option<IpAddr>, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// The address a limit applies to: an IPv4 address (also when mapped into IPv6) or the /64
/// of an IPv6 address, which one host can otherwise draw any number of addresses from.
fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const A: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1)));
    const B: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2)));

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(50)
    }

    #[tokio::test]
    async fn admitted_tokens_cost_nothing_and_refused_ones_use_the_bucket() {
        let limiter = AddressLimiter::new(AddressLimit { qps: 1.0, burst: 2 }, 100);
        // Reviews that end without a charge (admitted tokens) never run out.
        for _ in 0..20 {
            let review = limiter.admit(A, soon()).await;
            assert!(review.is_some());
        }
        // Two refusals use up the burst: the next review from A waits a second for room.
        limiter.charge(A);
        limiter.charge(A);
        assert!(limiter.admit(A, soon()).await.is_none());
        // Another address is not affected.
        assert!(limiter.admit(B, soon()).await.is_some());
    }

    #[tokio::test]
    async fn reviews_in_flight_are_bounded_per_address() {
        let limiter = AddressLimiter::new(AddressLimit { qps: 1.0, burst: 2 }, 100);
        let first = limiter.admit(A, soon()).await.expect("a slot");
        let _second = limiter.admit(A, soon()).await.expect("a slot");
        assert!(limiter.admit(A, soon()).await.is_none(), "two in flight");
        assert!(limiter.admit(B, soon()).await.is_some(), "per address");
        drop(first);
        assert!(limiter.admit(A, soon()).await.is_some(), "a slot came back");
    }

    #[tokio::test]
    async fn the_table_is_bounded_and_keeps_busy_addresses() {
        let limiter = AddressLimiter::new(AddressLimit { qps: 1.0, burst: 1 }, 2);
        limiter.charge(A);
        let _held = limiter
            .admit(B, Instant::now() + Duration::from_secs(2))
            .await;
        assert_eq!(limiter.len(), 2);
        let c = Some(IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 3)));
        assert!(limiter.admit(c, soon()).await.is_some());
        assert!(limiter.len() <= 2, "{}", limiter.len());
    }

    #[test]
    fn addresses_are_limited_per_host() {
        let key = |s: &str| key(s.parse().unwrap());
        assert_eq!(key("10.0.0.1"), key("::ffff:10.0.0.1"));
        assert_ne!(key("10.0.0.1"), key("10.0.0.2"));
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_eq!(key("2001:db8:1:2::1").to_string(), "2001:db8:1:2::");
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
    }
}
