//! Observability plumbing shared by the server and the agent.
//!
//! - [`metrics`]: an explicit Prometheus registry whose text output has the exact shape Go's
//!   client_golang produces, because upstream's tests parse it and assert on names.
//! - [`http`]: a minimal HTTP/1.1 server for the health and admin endpoints, with the
//!   limits upstream's Go servers use.
//! - [`introspect`]: the JSON of the admin port's live connection and agent views.
//! - [`duration`]: Go's `time.ParseDuration` syntax and canonical `Duration.String()` form, so
//!   flags accept and print durations exactly as upstream's do.
//! - [`audit`]: the audit log's records and their off-the-data-path writer.
//! - [`time`]: UTC calendar fields for HTTP dates and audit timestamps.
//! - [`VERSION`]: the release, which the admin reports show and tether agents announce.
#![forbid(unsafe_code)]

pub mod audit;
pub mod duration;
pub mod http;
pub mod introspect;
pub mod metrics;
pub mod time;

/// The tether release every crate of the workspace shares (`version.workspace`): shown in the
/// admin reports and announced by agents, so a fleet can be followed through an upgrade.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
