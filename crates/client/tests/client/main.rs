//! tether-client against real sockets: small stand-in peers written here, and the real
//! tether server where no agent is needed.

mod fake_grpc;
mod fake_http;
mod grpc;
mod http_connect;
mod real_server;
mod support;
