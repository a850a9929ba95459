//! gRPC message framing: a 1-byte compression flag, a 4-byte big-endian length, the message.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

use crate::{Packet, ProtoError, pb};

/// Size of the gRPC message prefix.
pub const PREFIX_LEN: usize = 5;

/// Largest message accepted, the grpc-go default receive limit every upstream peer uses.
pub const MAX_MESSAGE_LEN: usize = 4 * 1024 * 1024;

/// How much the decoder reserves ahead for a message whose start has arrived: more than a
/// DATA packet of the largest chunk tether or upstream sends (64 KiB + framing), so such a
/// message is assembled in one allocation instead of regrowing (and copying) with every
/// HTTP/2 frame; and no more, so a bare length prefix, which may claim 4 MiB, cannot make
/// the decoder hold memory for bytes that never arrive.
const EAGER_RESERVE: usize = 128 * 1024;

/// Appends `packet`, framed, to `buf`.
pub fn encode(packet: &Packet, buf: &mut BytesMut) {
    let wire = pb::Packet::from(packet);
    let len = wire.encoded_len();
    buf.reserve(PREFIX_LEN + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).expect("packets are far below 4 GiB"));
    wire.encode(buf).expect("reserved enough capacity");
}

/// Errors while splitting a byte stream into messages.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("compressed gRPC messages are not supported (no grpc-encoding was negotiated)")]
    Compressed,
    #[error("gRPC message of {0} bytes exceeds the {MAX_MESSAGE_LEN}-byte limit")]
    TooLarge(usize),
    #[error("stream ended inside a gRPC message")]
    Truncated,
    #[error(transparent)]
    Packet(#[from] ProtoError),
}

/// Incremental decoder: feed it the chunks a transport delivers, take packets out.
///
/// A chunk that holds whole messages (tether's peers send each DATA packet in one HTTP/2
/// frame, see `tether_grpc::MAX_FRAME_SIZE`) is decoded in place: each message, and the
/// payload inside it, is a slice of the chunk. Only a message that spans chunks is copied,
/// into `partial`, to be assembled. At most one of the two holds bytes.
#[derive(Debug, Default)]
pub struct Decoder {
    chunk: Bytes,
    partial: BytesMut,
}

impl Decoder {
    /// Adds received bytes.
    pub fn push(&mut self, chunk: Bytes) {
        if self.partial.is_empty() && self.chunk.is_empty() {
            self.chunk = chunk;
            return;
        }
        self.assemble_from_chunk();
        self.partial.extend_from_slice(&chunk);
    }

    /// Next complete packet, `Ok(None)` if more bytes are needed.
    pub fn next_packet(&mut self) -> Result<Option<Packet>, FrameError> {
        if !self.chunk.is_empty() {
            if let Some(len) = whole_message(&self.chunk)? {
                let mut message = self.chunk.split_to(PREFIX_LEN + len);
                message.advance(PREFIX_LEN);
                return decode(message).map(Some);
            }
            // The chunk ends inside a message: assemble it from here on.
            self.assemble_from_chunk();
        }
        let Some(len) = whole_message(&self.partial)? else {
            if self.partial.len() >= PREFIX_LEN {
                let len = announced_len(&self.partial);
                let want = (PREFIX_LEN + len).min(EAGER_RESERVE);
                if self.partial.capacity() < want {
                    self.partial.reserve(want - self.partial.len());
                }
            }
            return Ok(None);
        };
        self.partial.advance(PREFIX_LEN);
        decode(self.partial.split_to(len).freeze()).map(Some)
    }

    /// Moves what is left of the held chunk to the front of the assembly buffer.
    fn assemble_from_chunk(&mut self) {
        if !self.chunk.is_empty() {
            let held = std::mem::take(&mut self.chunk);
            self.partial.extend_from_slice(&held);
        }
    }

    /// Bytes received and not yet taken out as packets (the start of a partial message).
    pub fn buffered(&self) -> usize {
        self.chunk.len() + self.partial.len()
    }

    /// Call at end of stream: leftover bytes mean the peer cut a message short.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buffered() == 0 {
            Ok(())
        } else {
            Err(FrameError::Truncated)
        }
    }
}

/// The length of the message at the front of `buf` if all of it is there, after checking
/// its prefix; `None` while the prefix or the message is incomplete.
fn whole_message(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    if buf.len() < PREFIX_LEN {
        return Ok(None);
    }
    if buf[0] != 0 {
        return Err(FrameError::Compressed);
    }
    let len = announced_len(buf);
    if len > MAX_MESSAGE_LEN {
        return Err(FrameError::TooLarge(len));
    }
    Ok((buf.len() >= PREFIX_LEN + len).then_some(len))
}

/// The length a prefix announces; `buf` holds at least the prefix.
fn announced_len(buf: &[u8]) -> usize {
    u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize
}

fn decode(message: Bytes) -> Result<Packet, FrameError> {
    let wire = pb::Packet::decode(message).map_err(ProtoError::Decode)?;
    Ok(Packet::try_from(wire)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConnectId, DialId};

    #[test]
    fn a_partial_message_reserves_its_size_up_to_a_bound() {
        let data = Packet::Data {
            connect_id: ConnectId(1),
            data: Bytes::from(vec![7u8; 64 * 1024]),
        };
        let mut framed = BytesMut::new();
        encode(&data, &mut framed);
        let framed = framed.freeze();
        let mut d = Decoder::default();
        // Two chunks, as HTTP/2 frames of 64 KiB deliver it: one reservation holds it all.
        d.push(framed.slice(..100));
        assert!(d.next_packet().unwrap().is_none());
        assert!(d.partial.capacity() >= framed.len());
        d.push(framed.slice(100..));
        assert_eq!(d.next_packet().unwrap(), Some(data));

        // A prefix that claims the largest message reserves only the bound.
        let mut d = Decoder::default();
        let mut prefix = vec![0u8];
        prefix.extend_from_slice(&(MAX_MESSAGE_LEN as u32).to_be_bytes());
        d.push(Bytes::from(prefix));
        assert!(d.next_packet().unwrap().is_none());
        assert!(
            d.partial.capacity() <= 2 * EAGER_RESERVE,
            "{}",
            d.partial.capacity()
        );
    }

    #[test]
    fn a_chunk_of_whole_messages_is_decoded_in_place() {
        let data = Packet::Data {
            connect_id: ConnectId(3),
            data: Bytes::from(vec![9u8; 64 * 1024]),
        };
        let mut framed = BytesMut::new();
        encode(&data, &mut framed);
        encode(&data, &mut framed);
        let framed = framed.freeze();
        let range = framed.as_ptr_range();
        let mut d = Decoder::default();
        d.push(framed.clone());
        for _ in 0..2 {
            let Some(Packet::Data { data: payload, .. }) = d.next_packet().unwrap() else {
                panic!("a DATA packet");
            };
            assert_eq!(payload.len(), 64 * 1024);
            assert!(
                range.contains(&payload.as_ptr()),
                "the payload is a slice of the chunk, not a copy"
            );
        }
        assert!(d.next_packet().unwrap().is_none());
        d.finish().unwrap();
    }

    fn sample() -> Vec<Packet> {
        vec![
            Packet::DialRequest {
                protocol: "tcp".into(),
                address: "127.0.0.1:80".into(),
                random: DialId(42),
            },
            Packet::Data {
                connect_id: ConnectId(7),
                data: Bytes::from_static(b"hello"),
            },
            Packet::Drain,
            Packet::Credit {
                connect_id: ConnectId(7),
                bytes: 65536,
            },
        ]
    }

    #[test]
    fn round_trip_across_arbitrary_chunk_boundaries() {
        let mut encoded = BytesMut::new();
        for p in sample() {
            encode(&p, &mut encoded);
        }
        let encoded = encoded.freeze();
        for chunk_size in [1, 2, 5, 7, 64, encoded.len()] {
            let mut decoder = Decoder::default();
            let mut out = Vec::new();
            for chunk in encoded.chunks(chunk_size) {
                decoder.push(Bytes::copy_from_slice(chunk));
                while let Some(p) = decoder.next_packet().unwrap() {
                    out.push(p);
                }
            }
            decoder.finish().unwrap();
            assert_eq!(out, sample(), "chunk size {chunk_size}");
        }
    }

    #[test]
    fn rejects_oversized_compressed_and_truncated_messages() {
        let mut d = Decoder::default();
        d.push(Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff]));
        assert!(matches!(d.next_packet(), Err(FrameError::TooLarge(_))));

        let mut d = Decoder::default();
        d.push(Bytes::from_static(&[1, 0, 0, 0, 0]));
        assert!(matches!(d.next_packet(), Err(FrameError::Compressed)));

        let mut d = Decoder::default();
        d.push(Bytes::from_static(&[0, 0, 0, 0, 9, 1]));
        assert!(d.next_packet().unwrap().is_none());
        assert!(matches!(d.finish(), Err(FrameError::Truncated)));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        // Deterministic pseudo-random bytes behind a valid prefix.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for len in 0..512usize {
            let mut body = Vec::with_capacity(len);
            for _ in 0..len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                body.push(seed as u8);
            }
            let mut framed = BytesMut::new();
            framed.put_u8(0);
            framed.put_u32(len as u32);
            framed.extend_from_slice(&body);
            let mut d = Decoder::default();
            d.push(framed.freeze());
            let _ = d.next_packet();
        }
    }
}
