//! tether's native agent link: tether's packets framed directly on the TLS stream between a
//! tether agent and a tether server, chosen by ALPN ([`ALPN`]) on the agent port, instead of
//! gRPC over HTTP/2. One TLS connection carries one agent stream. ARCHITECTURE.md
//! ("The native link") holds the format in full; this module is its only codec, without I/O.
//!
//! Every frame is a 4-byte big-endian body length, a 1-byte type and the body:
//! - `HELLO` (agent, first frame) and `ACCEPT` (server, its answer): version, link
//!   capabilities and the stream's metadata (what gRPC carries in headers);
//! - `CLOSE`: a status code and a message; a refusal before `ACCEPT`, the stream's end after;
//! - `PACKET`: any [`Packet`], its protobuf encoding exactly as a gRPC message carries it;
//! - `DATA`: a DATA packet's connect ID (8 bytes) and its payload, raw, so neither side
//!   encodes, copies or parses the bytes it relays;
//! - `PING` / `PONG`: 8 opaque bytes, echoed.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

use crate::metadata::Metadata;
use crate::packet::{ConnectId, Packet, ProtoError};
use crate::{frame, pb};

/// The ALPN protocol id an agent offers, before `h2`, to ask for this link.
pub const ALPN: &[u8] = b"tether/1";
/// The link version this build speaks; `HELLO` offers it and `ACCEPT` confirms the one used.
pub const VERSION: u8 = 1;
/// A frame's header: the body length (u32, big-endian) and the type.
pub const HEADER_LEN: usize = 5;
/// The largest body of a `PACKET` or `DATA` frame: gRPC's message limit, which every peer
/// already honours.
pub const MAX_FRAME_LEN: usize = frame::MAX_MESSAGE_LEN;
/// The largest body of any other frame, the `HELLO` read before admission included.
pub const MAX_CONTROL_LEN: usize = 64 * 1024;
/// A `DATA` body's connect ID.
const CONNECT_ID_LEN: usize = 8;

/// The frame types. A peer never sends a type its peer did not announce (by version or
/// capability): an unknown type ends the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Hello = 0x01,
    Accept = 0x02,
    Close = 0x03,
    Packet = 0x10,
    Data = 0x11,
    Ping = 0x20,
    Pong = 0x21,
}

impl Kind {
    fn of(byte: u8) -> Option<Self> {
        Some(match byte {
            0x01 => Self::Hello,
            0x02 => Self::Accept,
            0x03 => Self::Close,
            0x10 => Self::Packet,
            0x11 => Self::Data,
            0x20 => Self::Ping,
            0x21 => Self::Pong,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Hello => "HELLO",
            Self::Accept => "ACCEPT",
            Self::Close => "CLOSE",
            Self::Packet => "PACKET",
            Self::Data => "DATA",
            Self::Ping => "PING",
            Self::Pong => "PONG",
        }
    }

    /// The largest body this type may have.
    fn max_len(self) -> usize {
        match self {
            Self::Packet | Self::Data => MAX_FRAME_LEN,
            _ => MAX_CONTROL_LEN,
        }
    }
}

/// What `HELLO` and `ACCEPT` carry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hello {
    /// `HELLO`: the highest version the agent speaks; `ACCEPT`: the version the link uses,
    /// at most the agent's.
    pub version: u8,
    /// Link features the sender supports (`HELLO`) or that the link uses (`ACCEPT`, a subset
    /// of the agent's). Version 1 defines none; a receiver ignores names it does not know.
    pub capabilities: Vec<String>,
    /// The stream's metadata: the keys of [`crate::metadata`], as gRPC headers carry them.
    pub metadata: Metadata,
}

/// A stream's end, or a refusal: gRPC's status codes, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Close {
    /// A gRPC status code: 0 is a clean end.
    pub code: u8,
    pub message: String,
}

/// A decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Hello(Hello),
    Accept(Hello),
    Close(Close),
    /// A `PACKET` or a `DATA` frame.
    Packet(Packet),
    Ping(u64),
    Pong(u64),
}

/// Why bytes are not a frame. Only [`LinkError::Packet`] leaves the link usable: its frame
/// was whole and is dropped, as gRPC drops one undecodable message.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{kind} frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        kind: &'static str,
        len: usize,
        max: usize,
    },
    #[error("unknown frame type {0:#04x}")]
    UnknownKind(u8),
    #[error("malformed {kind} frame: {why}")]
    Malformed {
        kind: &'static str,
        why: &'static str,
    },
    #[error("the link ended inside a frame")]
    Truncated,
    #[error(transparent)]
    Packet(#[from] ProtoError),
}

impl LinkError {
    /// Only one packet was malformed; the link can still be read.
    pub fn is_bad_packet(&self) -> bool {
        matches!(self, Self::Packet(_))
    }
}

/// Appends `packet` as a frame: `DATA` for a DATA packet (its payload copied; see
/// [`encode_data_header`] to send the payload from where it lies), `PACKET` otherwise.
pub fn encode_packet(packet: &Packet, buf: &mut BytesMut) {
    if let Packet::Data { connect_id, data } = packet {
        encode_data_header(*connect_id, data.len(), buf);
        buf.extend_from_slice(data);
        return;
    }
    let wire = pb::Packet::from(packet);
    let len = wire.encoded_len();
    put_header(buf, Kind::Packet, len);
    wire.encode(buf).expect("reserved enough capacity");
}

/// Appends the header of a `DATA` frame and its connect ID; the `len` bytes of payload must
/// follow on the link.
pub fn encode_data_header(connect_id: ConnectId, len: usize, buf: &mut BytesMut) {
    put_header(buf, Kind::Data, CONNECT_ID_LEN + len);
    buf.put_i64(connect_id.0);
}

fn put_header(buf: &mut BytesMut, kind: Kind, len: usize) {
    buf.reserve(HEADER_LEN + len);
    buf.put_u32(u32::try_from(len).expect("frames are far below 4 GiB"));
    buf.put_u8(kind as u8);
}

impl Frame {
    /// Appends the frame. Fails only for a `HELLO` or `ACCEPT` over the control limit, or
    /// with more capabilities, pairs or longer names than the format counts.
    pub fn encode(&self, buf: &mut BytesMut) -> Result<(), LinkError> {
        match self {
            Self::Packet(packet) => encode_packet(packet, buf),
            Self::Hello(hello) => encode_hello(Kind::Hello, hello, buf)?,
            Self::Accept(hello) => encode_hello(Kind::Accept, hello, buf)?,
            Self::Close(close) => {
                // A message is cut to fit, at a character boundary.
                let mut end = close.message.len().min(MAX_CONTROL_LEN - 1);
                while !close.message.is_char_boundary(end) {
                    end -= 1;
                }
                put_header(buf, Kind::Close, 1 + end);
                buf.put_u8(close.code);
                buf.extend_from_slice(&close.message.as_bytes()[..end]);
            }
            Self::Ping(opaque) | Self::Pong(opaque) => {
                let kind = if matches!(self, Self::Ping(_)) {
                    Kind::Ping
                } else {
                    Kind::Pong
                };
                put_header(buf, kind, 8);
                buf.put_u64(*opaque);
            }
        }
        Ok(())
    }
}

fn encode_hello(kind: Kind, hello: &Hello, buf: &mut BytesMut) -> Result<(), LinkError> {
    let malformed = |why| LinkError::Malformed {
        kind: kind.name(),
        why,
    };
    let mut body = BytesMut::new();
    body.put_u8(hello.version);
    body.put_u8(
        u8::try_from(hello.capabilities.len()).map_err(|_| malformed("too many capabilities"))?,
    );
    for name in &hello.capabilities {
        body.put_u8(u8::try_from(name.len()).map_err(|_| malformed("capability name too long"))?);
        body.extend_from_slice(name.as_bytes());
    }
    let pairs: Vec<_> = hello.metadata.iter().collect();
    body.put_u16(u16::try_from(pairs.len()).map_err(|_| malformed("too many metadata pairs"))?);
    for (key, value) in pairs {
        body.put_u8(u8::try_from(key.len()).map_err(|_| malformed("metadata key too long"))?);
        body.extend_from_slice(key.as_bytes());
        body.put_u16(u16::try_from(value.len()).map_err(|_| malformed("metadata value too long"))?);
        body.extend_from_slice(value);
    }
    if body.len() > MAX_CONTROL_LEN {
        return Err(LinkError::TooLarge {
            kind: kind.name(),
            len: body.len(),
            max: MAX_CONTROL_LEN,
        });
    }
    put_header(buf, kind, body.len());
    buf.extend_from_slice(&body);
    Ok(())
}

/// The whole length (header and body) of the frame at the front of `buf`, once its header
/// is there: what a reader must hold to decode it.
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    (buf.len() >= HEADER_LEN).then(|| HEADER_LEN + body_len(buf))
}

fn body_len(buf: &[u8]) -> usize {
    u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize
}

/// Takes the next whole frame off the front of `buf`: `Ok(None)` while it is incomplete.
/// The header is checked as soon as it is there (type known, length within the type's
/// limit), so a reader never waits for, or holds, a body it will refuse. A [`DATA`] payload
/// and the bytes fields of a `PACKET` are slices of `buf`'s memory, not copies.
///
/// [`DATA`]: Kind::Data
pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, LinkError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let len = body_len(buf);
    let kind = Kind::of(buf[4]).ok_or(LinkError::UnknownKind(buf[4]))?;
    if len > kind.max_len() {
        return Err(LinkError::TooLarge {
            kind: kind.name(),
            len,
            max: kind.max_len(),
        });
    }
    if buf.len() < HEADER_LEN + len {
        return Ok(None);
    }
    buf.advance(HEADER_LEN);
    let mut body = buf.split_to(len);
    let malformed = |why| LinkError::Malformed {
        kind: kind.name(),
        why,
    };
    Ok(Some(match kind {
        Kind::Data => {
            if body.len() < CONNECT_ID_LEN {
                return Err(malformed("shorter than its connect ID"));
            }
            let connect_id = body.get_i64();
            if connect_id == 0 {
                return Err(ProtoError::ZeroConnectId("DATA").into());
            }
            Frame::Packet(Packet::Data {
                connect_id: ConnectId(connect_id),
                data: body.freeze(),
            })
        }
        Kind::Packet => {
            let wire = pb::Packet::decode(body.freeze()).map_err(ProtoError::Decode)?;
            Frame::Packet(Packet::try_from(wire)?)
        }
        Kind::Ping | Kind::Pong => {
            if body.len() != 8 {
                return Err(malformed("not 8 bytes"));
            }
            let opaque = body.get_u64();
            if kind == Kind::Ping {
                Frame::Ping(opaque)
            } else {
                Frame::Pong(opaque)
            }
        }
        Kind::Close => {
            if body.is_empty() {
                return Err(malformed("no status code"));
            }
            let code = body.get_u8();
            Frame::Close(Close {
                code,
                message: String::from_utf8_lossy(&body).into_owned(),
            })
        }
        Kind::Hello | Kind::Accept => {
            let hello = decode_hello(body.freeze()).map_err(malformed)?;
            if kind == Kind::Hello {
                Frame::Hello(hello)
            } else {
                Frame::Accept(hello)
            }
        }
    }))
}

fn decode_hello(mut body: Bytes) -> Result<Hello, &'static str> {
    let version = take_u8(&mut body)?;
    if version == 0 {
        return Err("version 0");
    }
    let mut capabilities = Vec::new();
    for _ in 0..take_u8(&mut body)? {
        let len = usize::from(take_u8(&mut body)?);
        let name = take(&mut body, len)?;
        let name = crate::metadata::text(&name).ok_or("a capability name is not text")?;
        capabilities.push(name.to_owned());
    }
    let mut metadata = Metadata::default();
    let pairs = take_u16(&mut body)?;
    for _ in 0..pairs {
        let len = usize::from(take_u8(&mut body)?);
        let key = take(&mut body, len)?;
        if key.is_empty() || !key.iter().all(|&b| is_key_byte(b)) {
            return Err("a metadata key is not lower-case letters, digits, '-', '_' or '.'");
        }
        let len = usize::from(take_u16(&mut body)?);
        let value = take(&mut body, len)?;
        let key = std::str::from_utf8(&key).expect("checked ASCII");
        metadata.push(key, value);
    }
    if body.has_remaining() {
        return Err("bytes after the metadata");
    }
    Ok(Hello {
        version,
        capabilities,
        metadata,
    })
}

/// The bytes of an HTTP/2 header name tether's keys use, lower case as gRPC sends them.
fn is_key_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)
}

fn take_u8(body: &mut Bytes) -> Result<u8, &'static str> {
    body.try_get_u8().map_err(|_| "truncated")
}

fn take_u16(body: &mut Bytes) -> Result<u16, &'static str> {
    body.try_get_u16().map_err(|_| "truncated")
}

fn take(body: &mut Bytes, len: usize) -> Result<Bytes, &'static str> {
    if body.remaining() < len {
        return Err("truncated");
    }
    Ok(body.split_to(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DialId;

    fn hello() -> Hello {
        let mut metadata = Metadata::default();
        metadata.push(crate::metadata::AGENT_ID, "node-a");
        metadata.push(crate::metadata::AUTHORIZATION, "Bearer t0k3n");
        metadata.push(crate::metadata::TETHER_LABELS, "zone=a");
        Hello {
            version: VERSION,
            capabilities: vec!["later-feature".into()],
            metadata,
        }
    }

    fn frames() -> Vec<Frame> {
        vec![
            Frame::Hello(hello()),
            Frame::Accept(Hello {
                version: 1,
                ..Hello::default()
            }),
            Frame::Packet(Packet::DialRequest {
                protocol: "tcp".into(),
                address: "127.0.0.1:80".into(),
                random: DialId(9),
            }),
            Frame::Packet(Packet::Data {
                connect_id: ConnectId(-3),
                data: Bytes::from(vec![5u8; 70_000]),
            }),
            Frame::Packet(Packet::Data {
                connect_id: ConnectId(4),
                data: Bytes::new(),
            }),
            Frame::Packet(Packet::Credit {
                connect_id: ConnectId(4),
                bytes: 1 << 20,
            }),
            Frame::Ping(7),
            Frame::Pong(u64::MAX),
            Frame::Close(Close {
                code: 14,
                message: "going away".into(),
            }),
        ]
    }

    #[test]
    fn every_frame_round_trips_across_any_split() {
        let mut wire = BytesMut::new();
        for f in frames() {
            f.encode(&mut wire).unwrap();
        }
        let wire = wire.freeze();
        for step in [1, 3, 5, 13, 4096, wire.len()] {
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            for piece in wire.chunks(step) {
                buf.extend_from_slice(piece);
                while let Some(f) = decode(&mut buf).unwrap() {
                    out.push(f);
                }
            }
            assert!(buf.is_empty());
            assert_eq!(out, frames(), "pieces of {step} bytes");
        }
    }

    #[test]
    fn a_data_payload_is_a_slice_of_the_read_buffer() {
        let mut buf = BytesMut::new();
        encode_packet(
            &Packet::Data {
                connect_id: ConnectId(1),
                data: Bytes::from(vec![1u8; 1000]),
            },
            &mut buf,
        );
        let range = buf.as_ptr_range();
        let Some(Frame::Packet(Packet::Data { data, .. })) = decode(&mut buf).unwrap() else {
            panic!("a DATA frame");
        };
        assert!(range.contains(&data.as_ptr()), "no copy");
    }

    #[test]
    fn headers_are_judged_before_their_bodies_arrive() {
        let mut buf = BytesMut::from(&[0, 0x40, 0, 1, Kind::Data as u8][..]);
        assert!(matches!(
            decode(&mut buf),
            Err(LinkError::TooLarge { kind: "DATA", .. })
        ));
        let mut buf = BytesMut::from(&[0, 1, 0, 1, Kind::Hello as u8][..]);
        assert!(matches!(
            decode(&mut buf),
            Err(LinkError::TooLarge { kind: "HELLO", .. })
        ));
        let mut buf = BytesMut::from(&[0, 0, 0, 1, 0x7f][..]);
        assert!(matches!(
            decode(&mut buf),
            Err(LinkError::UnknownKind(0x7f))
        ));
        let mut buf = BytesMut::from(&[0, 0, 0, 9, Kind::Data as u8, 0][..]);
        assert!(decode(&mut buf).unwrap().is_none());
        assert_eq!(frame_len(&buf), Some(HEADER_LEN + 9));
    }

    #[test]
    fn a_bad_packet_consumes_its_frame_and_the_next_one_decodes() {
        let mut buf = BytesMut::new();
        put_header(&mut buf, Kind::Packet, 3);
        buf.extend_from_slice(&[0xff, 0xff, 0xff]);
        encode_packet(&Packet::Drain, &mut buf);
        let error = decode(&mut buf).unwrap_err();
        assert!(error.is_bad_packet(), "{error}");
        assert_eq!(
            decode(&mut buf).unwrap(),
            Some(Frame::Packet(Packet::Drain))
        );
        // A DATA frame on connection 0 is as bad as a PACKET one.
        encode_data_header(ConnectId(0), 0, &mut buf);
        assert!(decode(&mut buf).unwrap_err().is_bad_packet());
        assert!(buf.is_empty());
    }

    #[test]
    fn malformed_control_frames_are_refused_with_their_reason() {
        for (kind, body, why) in [
            (Kind::Ping, &[1u8, 2][..], "not 8 bytes"),
            (Kind::Close, &[][..], "no status code"),
            (Kind::Data, &[0, 0, 1][..], "shorter than its connect ID"),
            (Kind::Hello, &[0][..], "version 0"),
            (Kind::Hello, &[1, 0][..], "truncated"),
            (
                Kind::Hello,
                &[1, 0, 0, 0, 7][..],
                "bytes after the metadata",
            ),
            (
                Kind::Accept,
                &[1, 0, 0, 1, 1, b'K', 0, 0][..],
                "a metadata key is not lower-case letters, digits, '-', '_' or '.'",
            ),
            (
                Kind::Hello,
                &[1, 1, 1, 0x01, 0, 0][..],
                "a capability name is not text",
            ),
        ] {
            let mut buf = BytesMut::new();
            put_header(&mut buf, kind, body.len());
            buf.extend_from_slice(body);
            let error = decode(&mut buf).unwrap_err();
            assert!(
                matches!(error, LinkError::Malformed { why: w, .. } if w == why),
                "{kind:?}: {error}"
            );
        }
    }

    #[test]
    fn an_oversized_hello_is_refused_by_its_sender() {
        let mut big = hello();
        for i in 0..4 {
            big.metadata
                .push(&format!("k{i}"), Bytes::from(vec![b'x'; 20_000]));
        }
        let error = Frame::Hello(big).encode(&mut BytesMut::new()).unwrap_err();
        assert!(
            matches!(error, LinkError::TooLarge { kind: "HELLO", .. }),
            "{error}"
        );
        let mut long = hello();
        long.metadata.push("k", Bytes::from(vec![b'x'; 70_000]));
        assert!(Frame::Hello(long).encode(&mut BytesMut::new()).is_err());
    }

    #[test]
    fn a_long_close_message_is_cut_at_a_character() {
        let message = "é".repeat(MAX_CONTROL_LEN);
        let mut buf = BytesMut::new();
        Frame::Close(Close { code: 2, message })
            .encode(&mut buf)
            .unwrap();
        let Some(Frame::Close(close)) = decode(&mut buf).unwrap() else {
            panic!("a CLOSE frame");
        };
        assert!(close.message.len() < MAX_CONTROL_LEN && close.message.starts_with('é'));
    }
}
