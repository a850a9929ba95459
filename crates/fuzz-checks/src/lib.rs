//! The checks behind tether's fuzz targets, one module per input parser.
//!
//! Each `check` takes arbitrary bytes, feeds them to one parser and panics if an invariant
//! breaks. The cargo-fuzz targets in `fuzz/` are one-line wrappers around these functions,
//! and `tests/regressions.rs` replays the saved inputs under `fuzz/regressions/<target>/`
//! through the same functions on the stable toolchain, so a fixed crash stays fixed.
#![forbid(unsafe_code)]

pub mod authority;
pub mod connect_head;
pub mod frame;
pub mod identifiers;
pub mod link;
pub mod packet;
pub mod policy;
pub mod session;
pub mod websocket;

/// A check: panics if `data` breaks an invariant.
pub type Check = fn(&[u8]);

/// Every target by the name of its fuzz binary and regression directory.
pub const TARGETS: [(&str, Check); 9] = [
    ("frame_decoder", frame::check),
    ("packet", packet::check),
    ("authority", authority::check),
    ("identifiers", identifiers::check),
    ("policy_file", policy::check),
    ("session_table", session::check),
    ("connect_head", connect_head::check),
    ("link_frames", link::check),
    ("websocket_frames", websocket::check),
];
