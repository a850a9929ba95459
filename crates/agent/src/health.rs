//! Health and admin endpoints, as upstream's agent serves them.

use std::net::SocketAddr;
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
pub(crate) fn admin_handler(health: Option<SocketAddr>, clientset: Arc<ClientSet>) -> Handler {
    Arc::new(move |req: &Request| match req.path.as_str() {
        "/metrics" => match metrics_location(health, req.local_addr) {
            Some(location) => Response::redirect(301, location),
            None => Response::not_found(),
        },
        _ => crate::introspect::route(&clientset, req).unwrap_or_else(Response::not_found),
    })
}

/// Where the health port's `/metrics` is, for a client that reached the admin port at
/// `local`: the health listener's own address, or on a wildcard listener the address the
/// client already reached. Never the request's Host header, which the client chooses
/// (upstream copies it, so `Host: evil.example` sent the client there). A relative
/// Location cannot name another port.
fn metrics_location(health: Option<SocketAddr>, local: Option<SocketAddr>) -> Option<String> {
    let health = health?;
    let ip = if health.ip().is_unspecified() {
        local?.ip()
    } else {
        health.ip()
    };
    Some(format!(
        "http://{}/metrics",
        SocketAddr::new(ip, health.port())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_location_names_the_health_listener_not_the_host_header() {
        let addr = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
        assert_eq!(
            metrics_location(addr("0.0.0.0:8093"), addr("127.0.0.1:8094")).as_deref(),
            Some("http://127.0.0.1:8093/metrics")
        );
        assert_eq!(
            metrics_location(addr("[::]:8093"), addr("[::1]:8094")).as_deref(),
            Some("http://[::1]:8093/metrics")
        );
        assert_eq!(
            metrics_location(addr("10.0.0.5:8093"), addr("127.0.0.1:8094")).as_deref(),
            Some("http://10.0.0.5:8093/metrics")
        );
        assert_eq!(metrics_location(None, addr("127.0.0.1:8094")), None);
    }
}
