//! WebSocket frame headers (RFC 6455 §5.2), without I/O: the WebSocket agent link carries the
//! native link's bytes ([`crate::link`]) in binary messages, for paths to the server that pass
//! only HTTP/1.1 and its upgrades. Message boundaries carry no meaning: the native frames
//! inside are a byte stream, as on TLS.
//!
//! A header is 2 to 14 bytes: FIN, three reserved bits and the opcode; the MASK bit and a
//! payload length of 7 bits, or 16 or 64 more; then the 4-byte masking key when MASK is set.
//! Agents mask every frame and servers none (§5.1).

use bytes::{BufMut, BytesMut};

/// The subprotocol an agent asks for in its upgrade (`Sec-WebSocket-Protocol`): the native
/// link, version 1, inside binary messages. A later version gets its own name, offered first.
pub const SUBPROTOCOL: &str = "tether.link.v1";
/// The value a server's `Sec-WebSocket-Accept` hashes with the agent's key (§1.3).
pub const ACCEPT_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/// The longest header: 2 bytes, a 64-bit length and a masking key.
pub const MAX_HEADER_LEN: usize = 14;
/// The largest payload of a control frame (close, ping, pong).
pub const MAX_CONTROL_LEN: usize = 125;
/// A normal closure's status code, the payload of the close frame an endpoint ends with.
pub const CLOSE_NORMAL: u16 = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    Continuation = 0x0,
    Text = 0x1,
    Binary = 0x2,
    Close = 0x8,
    Ping = 0x9,
    Pong = 0xA,
}

impl Opcode {
    fn of(bits: u8) -> Option<Self> {
        Some(match bits {
            0x0 => Self::Continuation,
            0x1 => Self::Text,
            0x2 => Self::Binary,
            0x8 => Self::Close,
            0x9 => Self::Ping,
            0xA => Self::Pong,
            _ => return None,
        })
    }

    /// Close, ping and pong: short, never fragmented, allowed between a message's frames.
    pub fn is_control(self) -> bool {
        (self as u8) & 0x8 != 0
    }
}

/// One frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The last frame of its message.
    pub fin: bool,
    pub opcode: Opcode,
    /// The masking key: set on every frame an agent sends, on none a server sends.
    pub mask: Option<[u8; 4]>,
    /// The payload's length.
    pub len: u64,
}

/// A header no endpoint may send: the connection ends (§7.1.7).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WsError {
    #[error("a WebSocket frame with reserved bits set, and no extension was negotiated")]
    Reserved,
    #[error("a WebSocket frame with the unknown opcode {0:#x}")]
    Opcode(u8),
    #[error("a WebSocket control frame of {0} bytes (at most 125) or fragmented")]
    Control(u64),
    #[error("a WebSocket payload length of {0} not in its shortest form or over 2^63")]
    Length(u64),
}

impl Header {
    /// The header at the start of `buf` and its length, or `None` until it is whole.
    pub fn decode(buf: &[u8]) -> Result<Option<(Self, usize)>, WsError> {
        let [first, second, ..] = *buf else {
            return Ok(None);
        };
        if first & 0x70 != 0 {
            return Err(WsError::Reserved);
        }
        let opcode = Opcode::of(first & 0x0F).ok_or(WsError::Opcode(first & 0x0F))?;
        let fin = first & 0x80 != 0;
        let masked = second & 0x80 != 0;
        let (len, mut at) = match second & 0x7F {
            126 => {
                let Some(bytes) = buf.get(2..4) else {
                    return Ok(None);
                };
                let len = u64::from(u16::from_be_bytes([bytes[0], bytes[1]]));
                if len < 126 {
                    return Err(WsError::Length(len));
                }
                (len, 4)
            }
            127 => {
                let Some(bytes) = buf.get(2..10) else {
                    return Ok(None);
                };
                let len = u64::from_be_bytes(bytes.try_into().expect("8 bytes"));
                if len <= u64::from(u16::MAX) || len >> 63 != 0 {
                    return Err(WsError::Length(len));
                }
                (len, 10)
            }
            short => (u64::from(short), 2),
        };
        if opcode.is_control() && (!fin || len > MAX_CONTROL_LEN as u64) {
            return Err(WsError::Control(len));
        }
        let mask = if masked {
            let Some(key) = buf.get(at..at + 4) else {
                return Ok(None);
            };
            at += 4;
            Some(key.try_into().expect("4 bytes"))
        } else {
            None
        };
        Ok(Some((
            Self {
                fin,
                opcode,
                mask,
                len,
            },
            at,
        )))
    }

    /// Appends the header, its length in the shortest form.
    pub fn encode(&self, out: &mut BytesMut) {
        out.put_u8(u8::from(self.fin) << 7 | self.opcode as u8);
        let mask_bit = if self.mask.is_some() { 0x80 } else { 0 };
        match self.len {
            len @ 0..=125 => out.put_u8(mask_bit | len as u8),
            len @ 126..=0xFFFF => {
                out.put_u8(mask_bit | 126);
                out.put_u16(len as u16);
            }
            len => {
                out.put_u8(mask_bit | 127);
                out.put_u64(len);
            }
        }
        if let Some(key) = self.mask {
            out.put_slice(&key);
        }
    }
}

/// Masks or unmasks `bytes` in place (the same XOR both ways); `offset` is how many bytes of
/// the payload came before them.
pub fn apply_mask(bytes: &mut [u8], key: [u8; 4], offset: u64) {
    let mut key = key;
    key.rotate_left((offset % 4) as usize);
    let word = u32::from_ne_bytes(key);
    let mut chunks = bytes.chunks_exact_mut(4);
    for chunk in &mut chunks {
        let masked = u32::from_ne_bytes((&*chunk).try_into().expect("4 bytes")) ^ word;
        chunk.copy_from_slice(&masked.to_ne_bytes());
    }
    for (byte, k) in chunks.into_remainder().iter_mut().zip(key) {
        *byte ^= k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(opcode: Opcode, len: u64, mask: Option<[u8; 4]>) -> Header {
        Header {
            fin: true,
            opcode,
            mask,
            len,
        }
    }

    #[test]
    fn lengths_round_trip_in_their_shortest_form() {
        for (len, size) in [
            (0, 2),
            (125, 2),
            (126, 4),
            (65_535, 4),
            (65_536, 10),
            (1 << 40, 10),
        ] {
            for mask in [None, Some([1, 2, 3, 4])] {
                let h = header(Opcode::Binary, len, mask);
                let mut out = BytesMut::new();
                h.encode(&mut out);
                let expected = size + if mask.is_some() { 4 } else { 0 };
                assert_eq!(out.len(), expected, "{len}");
                assert_eq!(Header::decode(&out), Ok(Some((h, expected))));
                for cut in 0..expected {
                    assert_eq!(Header::decode(&out[..cut]), Ok(None), "{len} cut at {cut}");
                }
            }
        }
    }

    #[test]
    fn rfc_examples_decode() {
        // RFC 6455 §5.7: "Hello", unmasked from a server and masked from a client.
        let (h, at) = Header::decode(&[0x81, 0x05, 0x48]).unwrap().unwrap();
        assert_eq!((h, at), (header(Opcode::Text, 5, None), 2));
        let mut masked = [
            0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
        ];
        let (h, at) = Header::decode(&masked).unwrap().unwrap();
        assert_eq!(h.mask, Some([0x37, 0xfa, 0x21, 0x3d]));
        apply_mask(&mut masked[at..], h.mask.unwrap(), 0);
        assert_eq!(&masked[at..], b"Hello");
    }

    #[test]
    fn a_mask_applied_in_pieces_equals_one_applied_whole() {
        let key = [0xA1, 0xB2, 0xC3, 0xD4];
        let plain: Vec<u8> = (0..=200u8).collect();
        let mut whole = plain.clone();
        apply_mask(&mut whole, key, 0);
        for split in [1, 3, 4, 7, 100] {
            let mut pieces = plain.clone();
            let (a, b) = pieces.split_at_mut(split);
            apply_mask(a, key, 0);
            apply_mask(b, key, split as u64);
            assert_eq!(pieces, whole, "split at {split}");
        }
        apply_mask(&mut whole, key, 0);
        assert_eq!(whole, plain);
    }

    #[test]
    fn headers_no_endpoint_may_send_are_refused() {
        assert_eq!(Header::decode(&[0xC2, 0x00]), Err(WsError::Reserved));
        assert_eq!(Header::decode(&[0x83, 0x00]), Err(WsError::Opcode(3)));
        assert_eq!(Header::decode(&[0x09, 0x00]), Err(WsError::Control(0)));
        assert_eq!(
            Header::decode(&[0x89, 126, 0, 126]),
            Err(WsError::Control(126))
        );
        assert_eq!(Header::decode(&[0x82, 126, 0, 5]), Err(WsError::Length(5)));
        let mut long = vec![0x82, 127];
        long.extend_from_slice(&(1u64 << 63).to_be_bytes());
        assert_eq!(Header::decode(&long), Err(WsError::Length(1 << 63)));
    }
}
