//! Health and admin endpoints, as upstream's agent serves them.

use std::sync::Arc;

use tether_observe::http::{Handler, Request, Response};
use tether_observe::metrics::Registry;

use crate::clientset::ClientSet;

/// `/healthz`, `/readyz` (`/ready`) and `/metrics` on the health port. Ready means connected
/// to every counted server (upstream: to at least one), so that an agent stuck with fewer
/// streams than servers shows.
pub(crate) fn health_handler(clientset: Arc<ClientSet>, registry: Registry) -> Handler {
    Arc::new(move |req: &Request| match req.path.as_str() {
        "/healthz" => Response::text(200, "ok"),
        "/readyz" | "/ready" => {
            let verbose = req.query.as_deref().is_some_and(|q| {
                q.split('&')
                    .any(|p| p == "verbose" || p.starts_with("verbose="))
            });
            let connected = clientset.connected();
            if connected > 0 && clientset.satisfied() {
                if verbose {
                    Response::text(200, "[+]ping ok\n[+]server-connected ok\ncheck passed\n")
                } else {
                    Response::text(200, "ok")
                }
            } else if connected == 0 {
                Response::text(
                    503,
                    "[+]ping ok\n[-]server-connected failed: no servers connected\nreadyz check failed\n",
                )
            } else {
                Response::text(
                    503,
                    format!(
                        "[+]ping ok\n[-]server-connected failed: not connected to every counted server ({connected} connected, {} counted)\nreadyz check failed\n",
                        clientset.target()
                    ),
                )
            }
        }
        "/metrics" => Response::metrics(&registry),
        _ => Response::not_found(),
    })
}

/// The admin port's `/metrics` redirects to the health port, as upstream does; the live
/// views `/debug/connections` and `/debug/agents` are served here.
pub(crate) fn admin_handler(health_port: u16, clientset: Arc<ClientSet>) -> Handler {
    Arc::new(move |req: &Request| match req.path.as_str() {
        "/metrics" => Response::redirect(
            301,
            format!("http://{}/metrics", req.host_with_port(health_port)),
        ),
        _ => crate::introspect::route(&clientset, req).unwrap_or_else(Response::not_found),
    })
}
