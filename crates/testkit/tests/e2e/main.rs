//! End-to-end tests: real servers, agents, sockets and TLS on loopback, in one test binary.

mod agent_protocol;
mod audit;
mod bad_input;
mod destination_policy;
mod dial_lifecycle;
mod dns_names;
mod frontends;
mod go_client;
mod http_connect;
mod identity;
mod introspection;
mod isolation;
mod lifecycle;
mod metrics_names;
mod native_link;
mod reverse;
mod routing;
mod security;
mod selection;
mod server_policy;
mod support;
mod tenancy;

use std::time::Duration;

/// Generous bound for any single step: catches hangs without asserting speed.
pub(crate) const STEP: Duration = Duration::from_secs(30);
