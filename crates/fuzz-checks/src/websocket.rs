//! WebSocket frame headers: [`tether_proto::websocket::Header::decode`], and masking.

use bytes::BytesMut;
use tether_proto::websocket::{self, Header, MAX_CONTROL_LEN, MAX_HEADER_LEN};

/// The bytes are a stream of frames, each header followed by (up to) its payload.
///
/// Invariants: a decoded header is at most [`MAX_HEADER_LEN`] bytes and re-encodes to exactly
/// the bytes it came from (lengths in their shortest form); every shorter prefix of it is
/// incomplete, never an error; a control frame is final and short; bytes that end before a
/// header is whole are fewer than the longest header; every error has text. Masking twice
/// from the same offset gives the payload back.
pub fn check(data: &[u8]) {
    let mut rest = data;
    while !rest.is_empty() {
        match Header::decode(rest) {
            Ok(Some((header, at))) => {
                assert!(at <= MAX_HEADER_LEN && at <= rest.len(), "{at}");
                for cut in 0..at {
                    assert_eq!(Header::decode(&rest[..cut]), Ok(None), "cut at {cut}");
                }
                let mut encoded = BytesMut::new();
                header.encode(&mut encoded);
                assert_eq!(
                    &encoded[..],
                    &rest[..at],
                    "{header:?} re-encodes differently"
                );
                if header.opcode.is_control() {
                    assert!(
                        header.fin && header.len <= MAX_CONTROL_LEN as u64,
                        "{header:?}"
                    );
                }
                let end = (at as u64)
                    .saturating_add(header.len)
                    .min(rest.len() as u64) as usize;
                if let Some(key) = header.mask {
                    let payload = &rest[at..end];
                    let offset = payload.len() as u64 % 7;
                    let mut twice = payload.to_vec();
                    websocket::apply_mask(&mut twice, key, offset);
                    websocket::apply_mask(&mut twice, key, offset);
                    assert_eq!(twice, payload);
                }
                rest = &rest[end..];
            }
            Ok(None) => {
                assert!(
                    rest.len() < MAX_HEADER_LEN,
                    "{} bytes and no header",
                    rest.len()
                );
                return;
            }
            Err(e) => {
                assert!(!e.to_string().is_empty(), "an error without text: {e:?}");
                return;
            }
        }
    }
}
