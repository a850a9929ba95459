//! Which HTTP(S) proxy a connection takes, by Go's rules, so that tether's agent and its
//! Kubernetes clients go through a proxy exactly where upstream's Go binaries do:
//! grpc-go's default proxy mapper for the agent's server connections, and client-go's
//! `http.ProxyFromEnvironment` for the API server.
//!
//! - `environment`: `HTTPS_PROXY`/`NO_PROXY` read as Go reads them, and the route to a
//!   `host:port` (with the agent's `--https-proxy` flag first);
//! - `no_proxy`: `NO_PROXY` matching, loopback never proxied;
//! - `proxy_url`: parsing a proxy URL, its credentials kept out of every log line.
#![forbid(unsafe_code)]

mod environment;
mod no_proxy;
mod proxy_url;

pub use environment::{EnvironmentError, ProxyEnvironment, ProxySetting, Route, route};
pub use proxy_url::{ProxyScheme, ProxyUrl, ProxyUrlError, join_host_port};
