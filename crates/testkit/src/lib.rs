//! Test harness for tether's end-to-end tests and benchmarks.
//!
//! Everything runs for real: TLS with a throwaway PKI, servers and agents on loopback ports
//! chosen by the kernel (port 0), Unix sockets in a temporary directory, and targets that
//! echo, sink or source bytes. Nothing here mocks a component that can run for real.
#![forbid(unsafe_code)]

pub mod harness;
pub mod http;
pub mod targets;

pub use harness::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer, Transport};
