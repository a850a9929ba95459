//! tether's use of the Kubernetes API, kept in one crate so nothing about it is linked into code
//! paths (or started) unless token authentication or Lease counting is switched on.

pub mod api;
pub mod client;
pub mod lease;
pub mod node_addresses;
mod rate_limit;
pub mod token_review;
mod unreachable;

pub use api::{KubeApi, KubeApiOptions};
pub use rate_limit::Throttled;
