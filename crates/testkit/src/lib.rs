//! Test harness for tether's end-to-end tests and benchmarks.
//!
//! Everything runs for real: TLS with a throwaway PKI, servers and agents on loopback ports
//! chosen by the kernel (port 0), Unix sockets in a temporary directory, and targets that
//! echo, sink or source bytes. Nothing here mocks a component that can run for real.
#![forbid(unsafe_code)]

pub mod balancer;
pub mod control_plane;
pub mod cut_relay;
pub mod fleet;
pub mod harness;
pub mod http;
pub mod native;
pub mod process;
pub mod reset;
pub mod targets;

pub use harness::{
    AgentLink, AgentOptions, Peering, Pki, ServerOptions, Stack, TestAgent, TestServer, Transport,
};

/// Sends logs to the test output when `RUST_LOG` is set (e.g. `RUST_LOG=debug`).
pub fn init_logging() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}
