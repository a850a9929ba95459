//! The HTTP CONNECT frontend's request head parser: [`tether_tunnel::connect_head`].

use bytes::BytesMut;
use tether_tunnel::connect_head::{self, Head, MAX_HEAD_BYTES, Parsed};

/// The first byte picks the chunk size the bytes arrive in; the rest is what a client sends.
///
/// Invariants: how the bytes are split into reads never changes the outcome; the parser never
/// waits for more once the limit is passed; a complete head leaves exactly the bytes after it
/// in the buffer; a CONNECT target is never empty and never holds whitespace or line breaks.
pub fn check(data: &[u8]) {
    let Some((&chunk, input)) = data.split_first() else {
        return;
    };
    let whole = feed(input, input.len().max(1));
    let chunked = feed(input, usize::from(chunk) + 1);
    assert_eq!(
        whole,
        chunked,
        "reads of {} bytes changed the outcome",
        usize::from(chunk) + 1
    );
    if let (Parsed::Head(head), rest) = &whole {
        assert!(
            input.ends_with(rest),
            "the bytes after the head were changed"
        );
        if let Head::Connect(target) = head {
            assert!(!target.is_empty(), "an empty CONNECT target was accepted");
            assert!(
                !target.bytes().any(|b| b.is_ascii_whitespace()),
                "a CONNECT target holds whitespace: {target:?}"
            );
        }
    }
}

/// Appends `input` in reads of `chunk` bytes, parsing after each, as the frontend does.
/// Returns the outcome and, for a complete head, every byte after it: what the buffer kept
/// plus what was not read yet (a refusal closes the connection, so nothing is kept for it).
fn feed(input: &[u8], chunk: usize) -> (Parsed, Vec<u8>) {
    let mut buf = BytesMut::new();
    let mut read = 0;
    for piece in input.chunks(chunk) {
        buf.extend_from_slice(piece);
        read += piece.len();
        match connect_head::parse(&mut buf) {
            Parsed::Partial => {
                assert!(
                    buf.len() <= MAX_HEAD_BYTES,
                    "waiting for more past the limit"
                );
            }
            Parsed::Head(head) => {
                let mut rest = buf.to_vec();
                rest.extend_from_slice(&input[read..]);
                return (Parsed::Head(head), rest);
            }
            refused @ Parsed::Refuse(_) => return (refused, Vec::new()),
        }
    }
    (Parsed::Partial, Vec::new())
}
