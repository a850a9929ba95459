//! tether's use of the Kubernetes API, kept in one crate so nothing about it is linked into code
//! paths (or started) unless token authentication or Lease counting is switched on.

pub mod client;
pub mod lease;
