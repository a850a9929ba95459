//! The Lease calls tether makes, each within the process's shared client-side rate limit
//! (`--kubeconfig-qps`/`--kubeconfig-burst`, as client-go applies it to every request) and a
//! deadline, and their errors reduced to what the controllers decide on (not found,
//! conflict) and what the metrics record (status code and reason).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};

use crate::{KubeApi, Throttled};

/// How long one API call may take, waiting for the rate limit included; a slower one counts
/// as failed and is retried later.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The API server answered with a failure status.
    #[error("{code} {reason}: {message}")]
    Status {
        code: u16,
        reason: String,
        message: String,
    },
    /// No answer: connection, TLS or decoding failure.
    #[error("{0}")]
    Transport(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// Not sent: the rate limit would not allow it within the deadline.
    #[error(transparent)]
    Throttled(#[from] Throttled),
}

impl ApiError {
    /// The status code and reason, for answers from the API server (as upstream records
    /// metrics only for those).
    pub fn status(&self) -> Option<(u16, &str)> {
        match self {
            Self::Status { code, reason, .. } => Some((*code, reason.as_str())),
            Self::Transport(_) | Self::Timeout(_) | Self::Throttled(_) => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.status().is_some_and(|(code, _)| code == 404)
    }

    pub fn is_conflict(&self) -> bool {
        self.status().is_some_and(|(code, _)| code == 409)
    }
}

impl ApiError {
    /// A failed call to `kube`'s API server; one without an answer names the server's URL
    /// and the OS error.
    fn of(kube: &KubeApi, e: kube::Error) -> Self {
        match e {
            kube::Error::Api(status) => Self::Status {
                code: status.code,
                reason: status.reason,
                message: status.message,
            },
            other => Self::Transport(crate::unreachable::describe(kube, "the request", &other)),
        }
    }
}

/// The Leases of one namespace.
#[derive(Clone)]
pub struct Leases {
    kube: KubeApi,
    api: kube::Api<Lease>,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases").finish_non_exhaustive()
    }
}

impl Leases {
    /// The Leases of `namespace`, through `kube`'s client and within its rate limit.
    pub fn new(kube: &KubeApi, namespace: &str) -> Self {
        Self {
            api: kube::Api::namespaced(kube.client().clone(), namespace),
            kube: kube.clone(),
        }
    }

    /// Runs `call` once the rate limit allows, all within [`CALL_TIMEOUT`].
    async fn limited<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiError> {
        let limited = async {
            self.kube.throttle(CALL_TIMEOUT).await?;
            call.await.map_err(|e| ApiError::of(&self.kube, e))
        };
        tokio::time::timeout(CALL_TIMEOUT, limited)
            .await
            .unwrap_or(Err(ApiError::Timeout(CALL_TIMEOUT)))
    }

    pub async fn get(&self, name: &str) -> Result<Lease, ApiError> {
        self.limited(self.api.get(name)).await
    }

    pub async fn create(&self, lease: &Lease) -> Result<Lease, ApiError> {
        self.limited(self.api.create(&PostParams::default(), lease))
            .await
    }

    /// Replaces the Lease; the API server refuses it (409) if `lease`'s resourceVersion is
    /// no longer the current one.
    pub async fn update(&self, lease: &Lease) -> Result<Lease, ApiError> {
        let name = lease.metadata.name.as_deref().unwrap_or_default();
        self.limited(self.api.replace(name, &PostParams::default(), lease))
            .await
    }

    /// Leases matching `selector`. `cached` lets the API server answer from its watch cache
    /// (`resourceVersion=0`), which is what many agents polling want; a garbage collector
    /// about to delete wants the current state.
    pub async fn list(&self, selector: &str, cached: bool) -> Result<Vec<Lease>, ApiError> {
        let mut params = ListParams::default().labels(selector);
        if cached {
            params = params.match_any();
        }
        Ok(self.limited(self.api.list(&params)).await?.items)
    }

    /// Deletes the Lease; with `resource_version`, only if it is still that version (it was
    /// not renewed since it was read).
    pub async fn delete(&self, name: &str, resource_version: Option<&str>) -> Result<(), ApiError> {
        let params = DeleteParams {
            preconditions: resource_version.map(|rv| Preconditions {
                resource_version: Some(rv.to_owned()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        self.limited(self.api.delete(name, &params)).await.map(drop)
    }
}
