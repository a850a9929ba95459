//! Upstream's Lease metrics, with its names, labels and buckets: the server's garbage
//! collector (`konnectivity_network_proxy_server_lease_*`, `culled_leases_count`) and the
//! agent's counter (`konnectivity_network_proxy_agent_lease_*`). Like upstream, only calls
//! the API server answered are recorded (a connection failure has no status code).

use std::sync::Arc;
use std::time::Duration;

use tether_observe::metrics::{Counter, CounterVec, HistogramVec, Registry};

use super::api::ApiError;

/// client_golang's default buckets, which upstream's server Lease histograms use.
const DEFAULT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// The agent's `latencyBuckets`.
const AGENT_BUCKETS: &[f64] = &[0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 30.0];

/// The server's garbage-collector metrics.
#[derive(Debug)]
pub struct GcMetrics {
    culled: Arc<Counter>,
    list_latency: Arc<HistogramVec>,
    lists: Arc<CounterVec>,
    delete_latency: Arc<HistogramVec>,
    deletes: Arc<CounterVec>,
}

impl GcMetrics {
    pub fn register(registry: &Registry) -> Self {
        let name = |n: &str| format!("konnectivity_network_proxy_server_{n}");
        Self {
            culled: registry.shared_counter(
                &name("culled_leases_count"),
                "Count of expired leases that the lease garbage collection controller has culled.",
            ),
            list_latency: registry.histogram_vec(
                &name("lease_list_latency_seconds"),
                "Latency of lease list calls by the garbage collection controller in seconds.",
                &["http_status_code"],
                DEFAULT_BUCKETS,
            ),
            lists: registry.counter_vec(
                &name("lease_list_total"),
                "Count of lease deletion calls by the garbage collection controller. Labeled by HTTP status code and reason.",
                &["http_status_code", "reason"],
            ),
            delete_latency: registry.histogram_vec(
                &name("lease_delete_latency_seconds"),
                "Latency of lease deletion calls by the garbage collection controller in seconds.",
                &["http_status_code"],
                DEFAULT_BUCKETS,
            ),
            deletes: registry.counter_vec(
                &name("lease_delete_total"),
                "Count of lease delection calls by the garbage collection controller. Labeled by HTTP status code and reason.",
                &["http_status_code", "reason"],
            ),
        }
    }

    pub(crate) fn list<T>(&self, result: &Result<T, ApiError>, took: Duration) {
        record(&self.lists, &self.list_latency, result, took);
    }

    pub(crate) fn delete<T>(&self, result: &Result<T, ApiError>, took: Duration) {
        record(&self.deletes, &self.delete_latency, result, took);
        if result.is_ok() {
            self.culled.inc();
        }
    }
}

/// The agent's Lease-counter metrics.
#[derive(Debug)]
pub struct CounterMetrics {
    lists: Arc<CounterVec>,
    list_latency: Arc<HistogramVec>,
}

impl CounterMetrics {
    pub fn register(registry: &Registry) -> Self {
        let name = |n: &str| format!("konnectivity_network_proxy_agent_{n}");
        Self {
            lists: registry.counter_vec(
                &name("lease_lists_total"),
                "Count of server lease list calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason",
                &["http_response_code", "reason"],
            ),
            list_latency: registry.histogram_vec(
                &name("lease_list_latency_seconds"),
                "Latency of server lease listing in seconds",
                &["http_response_code"],
                AGENT_BUCKETS,
            ),
        }
    }

    pub(crate) fn list<T>(&self, result: &Result<T, ApiError>, took: Duration) {
        record(&self.lists, &self.list_latency, result, took);
    }
}

fn record<T>(
    calls: &CounterVec,
    latency: &HistogramVec,
    result: &Result<T, ApiError>,
    took: Duration,
) {
    let (code, reason) = match result {
        Ok(_) => (200, ""),
        Err(e) => match e.status() {
            Some(status) => status,
            None => return,
        },
    };
    let code = code.to_string();
    calls.with(&[&code, reason]).inc();
    latency.with(&[&code]).observe_duration(took);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_answers_by_code_and_reason_and_skips_transport_errors() {
        let registry = Registry::new();
        // The server registers the counter first; the collector shares it.
        let placeholder = registry.shared_counter(
            "konnectivity_network_proxy_server_culled_leases_count",
            "Count of expired leases that the lease garbage collection controller has culled.",
        );
        let gc = GcMetrics::register(&registry);
        gc.delete(&Ok(()), Duration::from_millis(3));
        let conflict: Result<(), _> = Err(ApiError::Status {
            code: 409,
            reason: "Conflict".into(),
            message: "changed".into(),
        });
        gc.delete(&conflict, Duration::from_millis(3));
        gc.list(
            &Err::<(), _>(ApiError::Transport("refused".into())),
            Duration::ZERO,
        );
        assert_eq!(placeholder.get(), 1);
        let text = registry.render();
        for want in [
            "konnectivity_network_proxy_server_culled_leases_count 1",
            r#"konnectivity_network_proxy_server_lease_delete_total{http_status_code="200",reason=""} 1"#,
            r#"konnectivity_network_proxy_server_lease_delete_total{http_status_code="409",reason="Conflict"} 1"#,
            r#"konnectivity_network_proxy_server_lease_delete_latency_seconds_count{http_status_code="409"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == want), "missing {want}\n{text}");
        }
        assert!(!text.contains("lease_list_total"), "{text}");
    }
}
