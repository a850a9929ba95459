//! Health and admin endpoints, as upstream serves them.

use std::sync::Arc;

use tether_observe::http::{Handler, Request, Response};
use tether_observe::metrics::Registry;

use crate::dial::Hub;

/// `/healthz`, `/readyz`, `/ready` and `/metrics` on the health port.
pub(crate) fn health_handler(
    hub: Arc<Hub>,
    registry: Registry,
    shutting_down: Arc<std::sync::atomic::AtomicBool>,
) -> Handler {
    Arc::new(move |req: &Request| match req.path.as_str() {
        "/healthz" => Response::text(200, "ok"),
        "/readyz" | "/ready" => {
            if shutting_down.load(std::sync::atomic::Ordering::Acquire) {
                Response::text(500, "shutting down")
            } else if hub.registry().is_ready() {
                Response::text(200, "ok")
            } else {
                Response::text(500, "no connection to any proxy agent")
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
