//! Health and admin endpoints, as upstream serves them.

use std::sync::Arc;

use tether_observe::http::{Handler, Request, Response};
use tether_observe::metrics::Registry;

use crate::backend::token::TokenAuthenticator;
use crate::dial::Hub;

/// `/healthz`, `/readyz`, `/ready` and `/metrics` on the health port.
pub(crate) fn health_handler(
    hub: Arc<Hub>,
    registry: Registry,
    shutting_down: Arc<std::sync::atomic::AtomicBool>,
    tokens: Option<Arc<dyn TokenAuthenticator>>,
) -> Handler {
    Arc::new(move |req: &Request| match req.path.as_str() {
        "/healthz" => Response::text(200, "ok"),
        "/readyz" | "/ready" => {
            // An unreachable Kubernetes API only keeps new agents out: connected ones carry
            // traffic as before. It is reported, but fails readiness only when no agent is
            // connected, so a Service in front of a hosted control plane's servers never
            // drops the ones still carrying kube-apiserver's traffic.
            let api = tokens.as_ref().and_then(|t| t.unready_reason());
            if shutting_down.load(std::sync::atomic::Ordering::Acquire) {
                Response::text(500, "shutting down")
            } else if hub.is_ready() {
                match api {
                    None => Response::text(200, "ok"),
                    Some(why) => {
                        Response::text(200, format!("ok (new agents cannot be admitted: {why})"))
                    }
                }
            } else {
                match api {
                    None => Response::text(500, "no connection to any proxy agent"),
                    Some(why) => {
                        Response::text(500, format!("no connection to any proxy agent; {why}"))
                    }
                }
            }
        }
        "/metrics" => Response::metrics(&registry),
        _ => Response::not_found(),
    })
}

/// `/metrics` on the admin port (kept by upstream for backward compatibility), and the live
/// views `/debug/connections` and `/debug/agents`.
pub(crate) fn admin_handler(
    registry: Registry,
    hub: Arc<Hub>,
    membership: crate::introspect::Membership,
) -> Handler {
    Arc::new(move |req: &Request| match req.path.as_str() {
        "/metrics" => Response::metrics(&registry),
        _ => crate::introspect::route(&hub, &membership, req).unwrap_or_else(Response::not_found),
    })
}
