//! The one Kubernetes API handle of a process: a client built the way upstream's `--kubeconfig`
//! builds one, and the client-side rate limit of `--kubeconfig-qps`/`--kubeconfig-burst` that
//! every request through it (TokenReviews, Leases) shares, as client-go's does.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::rate_limit::{RateLimiter, Throttled};

/// client-go's defaults, which upstream keeps when the flags are 0.
const DEFAULT_QPS: f32 = 5.0;
const DEFAULT_BURST: u32 = 10;

/// How to reach the API server: upstream's `--kubeconfig`, `--kubeconfig-qps` and
/// `--kubeconfig-burst`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KubeApiOptions {
    /// A kubeconfig file; `None` means the in-cluster ServiceAccount configuration.
    pub kubeconfig: Option<PathBuf>,
    /// Requests per second; 0 means client-go's 5, a negative value means no limit.
    pub qps: f32,
    /// Requests allowed at once above the rate; 0 means client-go's 10.
    pub burst: u32,
}

/// A shared Kubernetes API client with its rate limit. Cheap to clone.
#[derive(Clone)]
pub struct KubeApi {
    client: kube::Client,
    limiter: Arc<RateLimiter>,
    /// The API server's `host:port`, from the client configuration.
    endpoint: Option<String>,
    /// The API server's URL, from the client configuration, for error messages.
    url: Option<String>,
}

impl std::fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApi")
            .field("default_namespace", &self.client.default_namespace())
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl KubeApi {
    /// Builds the client (reading the kubeconfig, not contacting the API server).
    pub async fn connect(options: &KubeApiOptions) -> anyhow::Result<Self> {
        let config = crate::client::load(options.kubeconfig.as_deref()).await?;
        let endpoint = crate::client::endpoint(&config);
        let url = Some(config.cluster_url.to_string());
        let client = crate::client::build(config)?;
        Ok(Self {
            endpoint,
            url,
            ..Self::new(client, options.qps, options.burst)
        })
    }

    /// Wraps a client with the rate limit of `qps` and `burst` (upstream's semantics).
    pub fn new(client: kube::Client, qps: f32, burst: u32) -> Self {
        let limiter = if qps < 0.0 {
            RateLimiter::unlimited()
        } else {
            let qps = if qps == 0.0 { DEFAULT_QPS } else { qps };
            let burst = if burst == 0 { DEFAULT_BURST } else { burst };
            RateLimiter::new(qps, burst)
        };
        Self {
            client,
            limiter: Arc::new(limiter),
            endpoint: None,
            url: None,
        }
    }

    /// The API server's `host:port` as the kubeconfig (or the in-cluster configuration)
    /// names it; `None` for a client built by [`new`](Self::new).
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// The API server's URL as the kubeconfig (or the in-cluster configuration) names it;
    /// `None` for a client built by [`new`](Self::new).
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Waits for the rate limit to allow one request, unless that would take longer than
    /// `max_wait`: then the request is not made, and nothing is used up.
    pub async fn throttle(&self, max_wait: Duration) -> Result<(), Throttled> {
        let now = Instant::now();
        let start = self.limiter.reserve(now, now + max_wait)?;
        tokio::time::sleep_until(start).await;
        Ok(())
    }
}
