//! The native link's frames: [`tether_proto::link::decode`].

use bytes::BytesMut;
use tether_proto::link::{self, Frame, LinkError};

/// What the decoder made of a byte stream: the frames and the bad packets it skipped, in
/// order, then how it stopped.
#[derive(Debug, PartialEq)]
struct Outcome {
    frames: Vec<Result<Frame, String>>,
    /// The fatal error's text, `Some("truncated")` for bytes left over, `None` for a clean end.
    end: Option<String>,
}

/// The first byte picks a piece size; the rest is the stream.
///
/// Invariants: how the bytes arrive does not change the outcome; a reader holds at most one
/// frame's header and body beyond what it decoded; every decoded frame survives
/// encode→decode unchanged.
pub fn check(data: &[u8]) {
    let Some((&piece, stream)) = data.split_first() else {
        return;
    };
    let whole = decode(stream, stream.len().max(1));
    let pieces = decode(stream, usize::from(piece).max(1));
    assert_eq!(whole, pieces, "pieces of {piece} bytes changed the outcome");

    let mut encoded = BytesMut::new();
    let decoded: Vec<Frame> = whole.frames.iter().filter_map(|f| f.clone().ok()).collect();
    for frame in &decoded {
        frame.encode(&mut encoded).expect("a decoded frame encodes");
    }
    let again = decode(&encoded, encoded.len().max(1));
    let again: Vec<Frame> = again.frames.into_iter().map(Result::unwrap).collect();
    assert_eq!(again, decoded, "re-encoded frames decode differently");
}

fn decode(stream: &[u8], piece: usize) -> Outcome {
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for bytes in stream.chunks(piece) {
        buf.extend_from_slice(bytes);
        loop {
            match link::decode(&mut buf) {
                Ok(Some(frame)) => frames.push(Ok(frame)),
                Ok(None) => {
                    if let Some(len) = link::frame_len(&buf) {
                        assert!(len <= link::HEADER_LEN + link::MAX_FRAME_LEN, "{len}");
                    }
                    break;
                }
                Err(e) if e.is_bad_packet() => frames.push(Err(describe(&e))),
                Err(e) => {
                    return Outcome {
                        frames,
                        end: Some(describe(&e)),
                    };
                }
            }
        }
    }
    let end = (!buf.is_empty()).then(|| describe(&LinkError::Truncated));
    Outcome { frames, end }
}

fn describe(e: &LinkError) -> String {
    let text = e.to_string();
    assert!(!text.is_empty(), "an error without text: {e:?}");
    text
}
