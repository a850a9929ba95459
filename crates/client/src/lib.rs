//! Client library for tether and Konnectivity proxy servers: the Rust counterpart of
//! upstream's `konnectivity-client`, plus kube-apiserver's HTTP CONNECT dialer.
//!
//! - [`GrpcClient`]: the gRPC frontend. One HTTP/2 connection, one `Proxy` call per dial;
//!   each dial yields a [`TunnelStream`] (`AsyncRead + AsyncWrite`).
//! - [`dial_http_connect`]: the HTTP CONNECT frontend. One socket per dial; after the `200`
//!   the [`ProxySocket`] itself is the tunnel.
//! - [`Transport`]: either frontend over a Unix socket or over TLS.
//! - [`egress`]: kube-apiserver's EgressSelectorConfiguration, loaded and validated as
//!   kube-apiserver does, with a dialer per selection over the above.
//! - [`DialError`] tells a dial the proxy answered negatively (no agent, the agent's dial
//!   error, an HTTP error status) from a failure to reach or talk to the proxy
//!   ([`ClientError`]).
//!
//! Layout: `call` runs one `Proxy` call in a task (the dial, then `relay`), `tunnel` is the
//! caller's side of it.
#![forbid(unsafe_code)]

mod call;
mod call_end;
pub mod egress;
mod error;
mod grpc;
mod http_connect;
mod relay;
mod transport;
mod tunnel;

pub use error::{ClientError, DialError};
pub use grpc::{DEFAULT_DIAL_TIMEOUT, GrpcClient};
pub use http_connect::dial_http_connect;
pub use tether_proto::ConnectId;
pub use transport::{ProxySocket, Transport};
pub use tunnel::TunnelStream;

#[cfg(test)]
mod tests {
    /// Callers keep these in shared state and move them between tasks and threads.
    #[test]
    fn public_types_are_send_sync_and_unpin() {
        fn check<T: Send + Sync + Unpin + 'static>() {}
        check::<super::GrpcClient>();
        check::<super::TunnelStream>();
        check::<super::ProxySocket>();
        check::<super::DialError>();
        check::<super::egress::EgressSelector>();
        check::<super::egress::EgressStream>();
    }
}
