//! gRPC length-prefixed framing: [`tether_proto::frame::Decoder`].

use bytes::{Bytes, BytesMut};
use tether_proto::Packet;
use tether_proto::frame::{self, Decoder, FrameError};

/// What a decoder made of a byte stream: the packets, then how it stopped.
#[derive(Debug, PartialEq)]
struct Outcome {
    packets: Vec<Packet>,
    /// The error's text, or `None` if the stream ended cleanly.
    end: Option<String>,
}

/// The first byte picks a chunk size; the rest is the stream.
///
/// Invariants: chunking does not change the outcome (packets and how the stream ended);
/// every decoded packet survives encode→decode unchanged.
pub fn check(data: &[u8]) {
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let whole = decode(stream, stream.len().max(1));
    let chunked = decode(stream, usize::from(chunk).max(1));
    assert_eq!(whole, chunked, "chunk size {chunk} changed the outcome");

    let mut encoded = BytesMut::new();
    for packet in &whole.packets {
        frame::encode(packet, &mut encoded);
    }
    let again = decode(&encoded, encoded.len().max(1));
    assert_eq!(
        again.packets, whole.packets,
        "re-encoded packets decode differently"
    );
    assert_eq!(again.end, None, "re-encoded packets leave bytes behind");
}

fn decode(stream: &[u8], chunk: usize) -> Outcome {
    let mut decoder = Decoder::default();
    let mut packets = Vec::new();
    for piece in stream.chunks(chunk) {
        decoder.push(Bytes::copy_from_slice(piece));
        loop {
            match decoder.next_packet() {
                Ok(Some(packet)) => packets.push(packet),
                Ok(None) => break,
                Err(e) => return stopped(packets, &e),
            }
        }
    }
    let end = decoder.finish().err().map(|e| describe(&e));
    Outcome { packets, end }
}

fn stopped(packets: Vec<Packet>, e: &FrameError) -> Outcome {
    Outcome {
        packets,
        end: Some(describe(e)),
    }
}

fn describe(e: &FrameError) -> String {
    let text = e.to_string();
    assert!(!text.is_empty(), "an error without text: {e:?}");
    text
}
