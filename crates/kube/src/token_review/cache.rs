//! Review results by token hash, so that reconnecting agents (and many agents sharing one
//! token) cost no TokenReview each time.
//!
//! The cache keeps SHA-256 digests, never tokens. A result is fresh for its TTL (positive and
//! negative ones have their own), never past the token's `exp`. An admitted token is kept a
//! while longer, still never past its `exp`, to be used only when the API server cannot
//! answer: agents with valid tokens keep reconnecting through an API outage.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use tether_server::TokenIdentity;

use super::verdict::Verdict;

/// A token's SHA-256 digest.
pub(crate) type TokenKey = [u8; 32];

pub(crate) fn key(token: &str) -> TokenKey {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.as_bytes());
    let mut key = [0; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

/// How long results are kept, and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// An admitted token skips reviews this long.
    pub ttl: Duration,
    /// A refused token is refused without a review this long.
    pub negative_ttl: Duration,
    /// After `ttl`, how much longer an admitted token is still accepted while the API server
    /// cannot be reached.
    pub stale_ttl: Duration,
    /// Most tokens remembered; beyond it the entry closest to expiry goes.
    pub max_entries: usize,
}

/// What the cache knows about a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    Fresh(Verdict),
    /// Admitted once and not expired, but due for a review: to be used if that fails.
    Stale(TokenIdentity),
    Miss,
}

#[derive(Debug)]
struct Entry {
    verdict: Verdict,
    fresh_until: Instant,
    usable_until: Instant,
}

#[derive(Debug)]
pub(crate) struct TokenCache {
    limits: CacheLimits,
    entries: Mutex<HashMap<TokenKey, Entry>>,
}

impl TokenCache {
    pub(crate) fn new(limits: CacheLimits) -> Self {
        Self {
            limits,
            entries: Mutex::default(),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<TokenKey, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn len(&self) -> usize {
        self.entries().len()
    }

    pub(crate) fn lookup(&self, key: &TokenKey, now: Instant) -> Lookup {
        let mut entries = self.entries();
        let Some(entry) = entries.get(key) else {
            return Lookup::Miss;
        };
        if now < entry.fresh_until {
            return Lookup::Fresh(entry.verdict.clone());
        }
        if now < entry.usable_until
            && let Verdict::Admit(identity) = &entry.verdict
        {
            return Lookup::Stale(identity.clone());
        }
        entries.remove(key);
        Lookup::Miss
    }

    /// Remembers a review's verdict for a token with `lifetime` left (`None`: no `exp`).
    pub(crate) fn insert(
        &self,
        key: TokenKey,
        verdict: Verdict,
        lifetime: Option<Duration>,
        now: Instant,
    ) {
        let limits = &self.limits;
        let cap = |d: Duration| lifetime.map_or(d, |l| d.min(l));
        let (fresh, usable) = match verdict {
            Verdict::Admit(_) => (
                cap(limits.ttl),
                cap(limits.ttl.saturating_add(limits.stale_ttl)),
            ),
            Verdict::Refuse(_) => (cap(limits.negative_ttl), cap(limits.negative_ttl)),
        };
        if usable.is_zero() || limits.max_entries == 0 {
            return;
        }
        let mut entries = self.entries();
        if entries.len() >= limits.max_entries && !entries.contains_key(&key) {
            entries.retain(|_, e| e.usable_until > now);
            if entries.len() >= limits.max_entries
                && let Some(soonest) = entries
                    .iter()
                    .min_by_key(|(_, e)| e.usable_until)
                    .map(|(k, _)| *k)
            {
                entries.remove(&soonest);
            }
        }
        entries.insert(
            key,
            Entry {
                verdict,
                fresh_until: now + fresh,
                usable_until: now + usable,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn cache(max_entries: usize) -> TokenCache {
        TokenCache::new(CacheLimits {
            ttl: 2 * MIN,
            negative_ttl: MIN / 6,
            stale_ttl: 60 * MIN,
            max_entries,
        })
    }

    fn admit(node: &str) -> Verdict {
        Verdict::Admit(TokenIdentity {
            username: "system:serviceaccount:ns:sa".into(),
            node: Some(node.into()),
        })
    }

    #[test]
    fn keys_are_sha256() {
        assert_eq!(
            key("abc")[..4],
            [0xba, 0x78, 0x16, 0xbf],
            "SHA-256(\"abc\") starts ba7816bf"
        );
        assert_ne!(key("abc"), key("abd"));
    }

    #[test]
    fn admitted_tokens_are_fresh_then_stale_then_gone() {
        let c = cache(10);
        let now = Instant::now();
        c.insert(key("t"), admit("n1"), None, now);
        assert_eq!(c.lookup(&key("t"), now + MIN), Lookup::Fresh(admit("n1")));
        let Verdict::Admit(identity) = admit("n1") else {
            unreachable!()
        };
        assert_eq!(c.lookup(&key("t"), now + 3 * MIN), Lookup::Stale(identity));
        assert_eq!(c.lookup(&key("t"), now + 63 * MIN), Lookup::Miss);
        assert_eq!(c.len(), 0, "an unusable entry is dropped when seen");
    }

    #[test]
    fn nothing_outlives_the_token() {
        let c = cache(10);
        let now = Instant::now();
        c.insert(key("t"), admit("n1"), Some(MIN / 2), now);
        assert!(matches!(
            c.lookup(&key("t"), now + MIN / 4),
            Lookup::Fresh(_)
        ));
        assert_eq!(c.lookup(&key("t"), now + MIN / 2), Lookup::Miss);
        c.insert(key("expired"), admit("n1"), Some(Duration::ZERO), now);
        assert_eq!(c.len(), 0, "an expired token is not cached at all");
    }

    #[test]
    fn refusals_are_cached_briefly_and_never_stale() {
        let c = cache(10);
        let now = Instant::now();
        c.insert(key("bad"), Verdict::Refuse("nope".into()), None, now);
        assert_eq!(
            c.lookup(&key("bad"), now + MIN / 12),
            Lookup::Fresh(Verdict::Refuse("nope".into()))
        );
        assert_eq!(c.lookup(&key("bad"), now + MIN / 6), Lookup::Miss);
    }

    #[test]
    fn size_is_bounded_evicting_the_soonest_to_expire() {
        let c = cache(2);
        let now = Instant::now();
        c.insert(key("long"), admit("a"), None, now);
        c.insert(key("short"), admit("b"), Some(MIN), now);
        c.insert(key("new"), admit("c"), None, now);
        assert_eq!(c.len(), 2);
        assert_eq!(c.lookup(&key("short"), now), Lookup::Miss);
        assert!(matches!(c.lookup(&key("long"), now), Lookup::Fresh(_)));
        assert!(matches!(c.lookup(&key("new"), now), Lookup::Fresh(_)));
    }
}
