//! Health and admin endpoints, as upstream's agent serves them.

use std::net::SocketAddr;
use std::sync::Arc;

use tether_observe::http::{Handler, Request, Response};
use tether_observe::metrics::Registry;

use crate::clientset::ClientSet;

/// When `/readyz` answers 200.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Readiness {
    /// Connected to at least one server, as upstream's agent (`pkg/agent/readiness.go`): one
    /// control-plane node down for maintenance makes no agent, DaemonSet rollout or alert
    /// NotReady. Whether every counted server is reached shows in
    /// `konnectivity_network_proxy_agent_open_server_connections` against `..._known_server_count`
    /// (alert TetherServersNotConverged).
    #[default]
    AnyServer,
    /// Connected to every counted server (`--readiness-requires-all-servers`), so that an
    /// agent stuck with fewer streams than servers is NotReady.
    EveryServer,
}

/// `/healthz`, `/readyz` (`/ready`) and `/metrics` on the health port.
pub(crate) fn health_handler(
    clientset: Arc<ClientSet>,
    registry: Registry,
    readiness: Readiness,
) -> Handler {
    Arc::new(move |req: &Request| match req.path.as_str() {
        "/healthz" => Response::text(200, "ok"),
        "/readyz" | "/ready" => {
            let verbose = req.query.as_deref().is_some_and(|q| {
                q.split('&')
                    .any(|p| p == "verbose" || p.starts_with("verbose="))
            });
            let connected = clientset.connected();
            // Counting the servers takes the sessions' lock: only when it decides.
            let every = (readiness == Readiness::EveryServer && connected > 0)
                .then(|| (clientset.satisfied(), clientset.target()));
            readyz(connected, every, verbose)
        }
        "/metrics" => Response::metrics(&registry),
        _ => Response::not_found(),
    })
}

/// The `/readyz` answer for `connected` servers; `every` is (whether every counted server is
/// connected, how many are counted) when readiness asks for every server.
fn readyz(connected: usize, every: Option<(bool, usize)>, verbose: bool) -> Response {
    match every {
        _ if connected == 0 => Response::text(
            503,
            "[+]ping ok\n[-]server-connected failed: no servers connected\nreadyz check failed\n",
        ),
        Some((false, counted)) => Response::text(
            503,
            format!(
                "[+]ping ok\n[-]server-connected failed: not connected to every counted server ({connected} connected, {counted} counted; --readiness-requires-all-servers)\nreadyz check failed\n"
            ),
        ),
        _ if verbose => Response::text(200, "[+]ping ok\n[+]server-connected ok\ncheck passed\n"),
        _ => Response::text(200, "ok"),
    }
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

    fn answer(response: &Response) -> (u16, String) {
        (
            response.status,
            String::from_utf8_lossy(&response.body).into_owned(),
        )
    }

    #[test]
    fn ready_with_one_server_of_several_unless_every_server_is_asked_for() {
        // Upstream's semantics: one connected server is enough, however many are counted.
        assert_eq!(answer(&readyz(1, None, false)), (200, "ok".to_owned()));
        assert_eq!(
            answer(&readyz(1, None, true)),
            (
                200,
                "[+]ping ok\n[+]server-connected ok\ncheck passed\n".to_owned()
            )
        );
        let (status, body) = answer(&readyz(0, None, false));
        assert_eq!(status, 503);
        assert!(body.contains("no servers connected"), "{body}");

        // --readiness-requires-all-servers: one of three is not enough ...
        let (status, body) = answer(&readyz(1, Some((false, 3)), false));
        assert_eq!(status, 503);
        assert!(
            body.contains("(1 connected, 3 counted; --readiness-requires-all-servers)"),
            "{body}"
        );
        // ... all of them are, and none is never.
        assert_eq!(
            answer(&readyz(3, Some((true, 3)), false)),
            (200, "ok".to_owned())
        );
        assert_eq!(readyz(0, Some((true, 0)), false).status, 503);
    }

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
