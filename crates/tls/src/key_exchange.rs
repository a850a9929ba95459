//! Key exchange groups, in tether's order of preference.
//!
//! X25519MLKEM768 (ML-KEM-768 with X25519, draft-ietf-tls-ecdhe-mlkem) comes first, as in Go
//! 1.24+ and rustls' own default: a recording of today's traffic stays secret even against a
//! future quantum computer, and X25519 keeps it as strong as before should ML-KEM fall. It
//! exists in TLS 1.3 only. The classical groups follow, so that peers without ML-KEM (older
//! Go, OpenSSL before 3.5, TLS 1.2, a Go peer restricted with `CurvePreferences`) still connect.
//!
//! The list is set explicitly rather than taken from the provider's default, which a cargo
//! feature elsewhere in the build (rustls' `prefer-post-quantum`) would reorder.

use rustls::crypto::SupportedKxGroup;
use rustls::crypto::aws_lc_rs::kx_group;

/// Every key exchange group tether offers and accepts, most preferred first.
pub(crate) static GROUPS: &[&dyn SupportedKxGroup] = &[
    kx_group::X25519MLKEM768,
    kx_group::X25519,
    kx_group::SECP256R1,
    kx_group::SECP384R1,
];
