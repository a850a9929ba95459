//! Metrics of agent token authentication, under tether's own `tether_server_` prefix.

use std::sync::Arc;

use tether_observe::metrics::{Counter, CounterVec, Gauge, Registry};

/// `outcome` values of `tether_server_token_reviews_total`.
pub(crate) const ADMITTED: &str = "admitted";
pub(crate) const REFUSED: &str = "refused";
pub(crate) const ERROR: &str = "error";
pub(crate) const THROTTLED: &str = "throttled";
pub(crate) const ADDRESS_THROTTLED: &str = "address_throttled";

#[derive(Debug)]
pub(crate) struct TokenMetrics {
    reviews: Arc<CounterVec>,
    pub(crate) from_cache: Arc<Counter>,
    pub(crate) shared: Arc<Counter>,
    pub(crate) stale: Arc<Counter>,
    pub(crate) local: Arc<Counter>,
    pub(crate) cache_entries: Arc<Gauge>,
    pub(crate) api_available: Arc<Gauge>,
}

impl TokenMetrics {
    pub(crate) fn register(registry: &Registry) -> Self {
        let reviews = registry.counter_vec(
            "tether_server_token_reviews_total",
            "TokenReviews of agent tokens, by outcome: admitted, refused, error (no answer from the API server), throttled (not sent: --kubeconfig-qps/--kubeconfig-burst), address_throttled (not sent: the source address's own limit, --token-review-qps-per-address/--token-review-burst-per-address)",
            &["outcome"],
        );
        for outcome in [ADMITTED, REFUSED, ERROR, THROTTLED, ADDRESS_THROTTLED] {
            reviews.with(&[outcome]);
        }
        let answers = registry.counter_vec(
            "tether_server_token_answers_total",
            "Agent token checks answered without a TokenReview of their own, by source: cache, shared (joined a concurrent review of the same token), stale (a cached admission used while the API server could not answer), local (refused without a review: not a JWT for --authentication-audience, or expired)",
            &["source"],
        );
        let api_available = registry.gauge(
            "tether_server_kube_api_available",
            "1 when the last request to the Kubernetes API server was answered, 0 when it failed (new agents cannot then be authenticated)",
        );
        api_available.set(1);
        Self {
            reviews,
            from_cache: answers.with(&["cache"]),
            shared: answers.with(&["shared"]),
            stale: answers.with(&["stale"]),
            local: answers.with(&["local"]),
            cache_entries: registry.gauge(
                "tether_server_token_cache_entries",
                "Agent tokens whose review result is cached",
            ),
            api_available,
        }
    }

    pub(crate) fn review(&self, outcome: &str) {
        self.reviews.with(&[outcome]).inc();
    }
}
