//! Generated wire structs. Field names follow the proto (`connect_id`, `dial_request`, ...).
#![allow(
    clippy::all,
    missing_docs,
    unreachable_pub,
    missing_debug_implementations
)]

include!("gen/konnectivity.rs");
