//! Agent token authentication by TokenReview, compatible with upstream's and cheaper:
//! results are cached by token hash, concurrent checks of one token share one review,
//! reviews obey the client's rate limit, and an API server outage shows on `/readyz` and in
//! `tether_server_kube_api_available` while agents with cached valid tokens keep working.

mod cache;
mod jwt;
mod metrics;
mod verdict;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use tether_observe::metrics::Registry;
use tether_server::{AuthFuture, TokenAuthenticator, TokenIdentity, TokenRefusal};
use tokio::sync::OnceCell;
use tokio_util::task::AbortOnDropHandle;

pub use cache::CacheLimits;
use cache::{Lookup, TokenCache, TokenKey};
use metrics::TokenMetrics;
use verdict::Verdict;
pub use verdict::{ANY, AgentServiceAccount};

use crate::KubeApi;

/// Longest a review may take, waiting for the rate limit included.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// While the API server is failing, how often it is asked again (so that `/readyz` recovers
/// without waiting for an agent).
const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// What the probe reviews: not a JWT, so never valid, yet answered like any token.
const PROBE_TOKEN: &str = "tether-api-probe";

/// Checks agent tokens with TokenReviews. Cheap to clone.
#[derive(Clone, Debug)]
pub struct TokenReviewAuthenticator {
    inner: Arc<Inner>,
    /// The API probe belongs to the authenticator: it is aborted when the last clone drops.
    _probe: Arc<AbortOnDropHandle<()>>,
}

#[derive(Debug)]
struct Inner {
    api: KubeApi,
    account: AgentServiceAccount,
    cache: TokenCache,
    /// Reviews under way, so that concurrent checks of one token wait for the same one.
    in_flight: Mutex<HashMap<TokenKey, Arc<OnceCell<Answer>>>>,
    /// Why the last request to the API server failed; `None` once one succeeds.
    api_problem: Mutex<Option<String>>,
    metrics: TokenMetrics,
}

/// One review's result, shared by everyone who waited for it.
#[derive(Clone, Debug)]
enum Answer {
    Judged(Verdict),
    /// No answer (unreachable, timed out, throttled, or the API refused the request).
    Failed(String),
}

impl TokenReviewAuthenticator {
    /// Starts checking tokens against `account`; spawns the API probe, which asks once at
    /// once and then again every few seconds while the API server fails (and is aborted with
    /// the authenticator).
    pub fn new(
        api: KubeApi,
        account: AgentServiceAccount,
        limits: CacheLimits,
        registry: &Registry,
    ) -> Self {
        let inner = Arc::new(Inner {
            api,
            account,
            cache: TokenCache::new(limits),
            in_flight: Mutex::default(),
            api_problem: Mutex::default(),
            metrics: TokenMetrics::register(registry),
        });
        let probe = AbortOnDropHandle::new(tokio::spawn(probe(inner.clone())));
        Self {
            inner,
            _probe: Arc::new(probe),
        }
    }
}

impl TokenAuthenticator for TokenReviewAuthenticator {
    fn authenticate<'a>(&'a self, token: &'a str) -> AuthFuture<'a> {
        Box::pin(self.inner.authenticate(token))
    }

    fn unready_reason(&self) -> Option<String> {
        self.inner.problem().map(|problem| {
            format!(
                "kubernetes API server unavailable, new agents cannot be authenticated \
                 (connected agents and cached tokens keep working): {problem}"
            )
        })
    }
}

impl Inner {
    fn problem(&self) -> Option<String> {
        self.api_problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn authenticate(&self, token: &str) -> Result<TokenIdentity, TokenRefusal> {
        let key = cache::key(token);
        let stale = match self.cache.lookup(&key, Instant::now()) {
            Lookup::Fresh(verdict) => {
                self.metrics.from_cache.inc();
                return verdict.into();
            }
            Lookup::Stale(identity) => Some(identity),
            Lookup::Miss => None,
        };
        let cell = self
            .in_flight()
            .entry(key)
            .or_insert_with(|| Arc::new(OnceCell::new()))
            .clone();
        let _done = InFlightGuard {
            inner: self,
            key,
            cell: &cell,
        };
        let mut reviewed = false;
        let answer = cell
            .get_or_init(|| {
                reviewed = true;
                self.review(token, key)
            })
            .await
            .clone();
        if !reviewed {
            self.metrics.shared.inc();
        }
        match (answer, stale) {
            (Answer::Judged(verdict), _) => verdict.into(),
            (Answer::Failed(_), Some(identity)) => {
                self.metrics.stale.inc();
                Ok(identity)
            }
            (Answer::Failed(why), None) => Err(TokenRefusal::Unavailable(why)),
        }
    }

    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<TokenKey, Arc<OnceCell<Answer>>>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends one TokenReview and caches its verdict.
    async fn review(&self, token: &str, key: TokenKey) -> Answer {
        let answer = self.ask(token).await;
        if let Answer::Judged(verdict) = &answer {
            let lifetime = jwt::remaining_lifetime(token, SystemTime::now());
            self.cache
                .insert(key, verdict.clone(), lifetime, Instant::now());
            self.metrics.cache_entries.set(self.cache.len() as i64);
        }
        answer
    }

    /// One TokenReview, within the rate limit and [`REVIEW_TIMEOUT`].
    async fn ask(&self, token: &str) -> Answer {
        let started = tokio::time::Instant::now();
        if self.api.throttle(REVIEW_TIMEOUT).await.is_err() {
            self.metrics.review(metrics::THROTTLED);
            return Answer::Failed(format!(
                "too many TokenReviews: none could be sent within {REVIEW_TIMEOUT:?} \
                 (--kubeconfig-qps/--kubeconfig-burst)"
            ));
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: Some(vec![self.account.audience.clone()]),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.api.client().clone());
        let remaining = REVIEW_TIMEOUT.saturating_sub(started.elapsed());
        let failure = match tokio::time::timeout(
            remaining,
            api.create(&PostParams::default(), &review),
        )
        .await
        {
            Ok(Ok(reviewed)) => {
                self.set_problem(None);
                let verdict = self.account.judge(reviewed.status.as_ref());
                self.metrics.review(match verdict {
                    Verdict::Admit(_) => metrics::ADMITTED,
                    Verdict::Refuse(_) => metrics::REFUSED,
                });
                return Answer::Judged(verdict);
            }
            Ok(Err(e)) => describe(&e),
            Err(_) => format!("the TokenReview got no answer within {REVIEW_TIMEOUT:?}"),
        };
        self.metrics.review(metrics::ERROR);
        self.set_problem(Some(failure.clone()));
        Answer::Failed(failure)
    }

    /// Records whether the API server answers, logging only the changes.
    fn set_problem(&self, problem: Option<String>) {
        let mut current = self.api_problem.lock().unwrap_or_else(|e| e.into_inner());
        match (&*current, &problem) {
            (None, Some(why)) => tracing::warn!(
                "kubernetes API server unavailable, new agents cannot be authenticated: {why}"
            ),
            (Some(_), None) => tracing::info!("kubernetes API server available again"),
            _ => {}
        }
        self.metrics.api_available.set(i64::from(problem.is_none()));
        *current = problem;
    }
}

impl From<Verdict> for Result<TokenIdentity, TokenRefusal> {
    fn from(verdict: Verdict) -> Self {
        match verdict {
            Verdict::Admit(identity) => Ok(identity),
            Verdict::Refuse(why) => Err(TokenRefusal::Invalid(why)),
        }
    }
}

/// Forgets a finished (or abandoned) review, so the next check reads the cache or reviews
/// again rather than reusing this answer.
struct InFlightGuard<'a> {
    inner: &'a Inner,
    key: TokenKey,
    cell: &'a Arc<OnceCell<Answer>>,
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.inner.in_flight();
        if in_flight
            .get(&self.key)
            .is_some_and(|cell| Arc::ptr_eq(cell, self.cell))
        {
            in_flight.remove(&self.key);
        }
    }
}

/// Why a request to the API server failed, with the likely fix where there is one.
fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) if status.code == 401 || status.code == 403 => format!(
            "the API server refused the TokenReview (HTTP {}: {}); the server's user needs \
             the system:auth-delegator ClusterRole",
            status.code, status.message
        ),
        kube::Error::Api(status) => format!(
            "the API server failed the TokenReview (HTTP {}: {})",
            status.code, status.message
        ),
        other => format!("the TokenReview failed: {other}"),
    }
}

/// Asks the API server at start-up, then every [`PROBE_INTERVAL`] while it fails.
async fn probe(inner: Arc<Inner>) {
    let mut first = true;
    loop {
        if !first {
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
        if first || inner.problem().is_some() {
            let _ = inner.ask(PROBE_TOKEN).await;
        }
        first = false;
    }
}
