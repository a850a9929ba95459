//! The agent side of the server: agent streams, their connections, and routing among them.

pub(crate) mod admission;
pub(crate) mod binding;
pub(crate) mod call;
pub(crate) mod health;
pub(crate) mod liveness;
pub(crate) mod native;
pub(crate) mod outlier;
pub(crate) mod registry;
pub(crate) mod remote;
pub(crate) mod resume;
pub(crate) mod route;
pub(crate) mod selection;
pub(crate) mod selection_metrics;
pub(crate) mod service;
pub(crate) mod session;
pub(crate) mod token;
