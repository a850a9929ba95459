//! Protobuf `Packet` decoding and validation into [`tether_proto::Packet`].

use prost::Message;
use tether_proto::{Packet, pb};

/// Invariants: a packet that validates survives domain→wire→bytes→wire→domain unchanged,
/// keeps its wire type, and holds no connection ID 0 where validation forbids it; a packet
/// that does not validate says why.
pub fn check(data: &[u8]) {
    let Ok(wire) = pb::Packet::decode(data) else {
        return;
    };
    let wire_type = wire.r#type;
    let packet = match Packet::try_from(wire) {
        Ok(packet) => packet,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "an error without text: {e:?}");
            return;
        }
    };
    let back = pb::Packet::from(&packet);
    assert_eq!(back.r#type, wire_type, "{packet:?} changed its wire type");
    assert_eq!(
        pb::PacketType::try_from(back.r#type).map(|t| t.as_str_name()),
        Ok(packet.type_name()),
        "type_name disagrees with the wire type"
    );
    let bytes = back.encode_to_vec();
    let reparsed = pb::Packet::decode(bytes.as_slice()).expect("tether's own encoding decodes");
    let reparsed = Packet::try_from(reparsed).expect("a valid packet re-validates");
    assert_eq!(reparsed, packet, "round trip changed the packet");
    match packet {
        Packet::DialResponse { result: Ok(id), .. }
        | Packet::ReverseDialResponse { result: Ok(id), .. }
        | Packet::CloseRequest { connect_id: id }
        | Packet::Data { connect_id: id, .. } => assert_ne!(id.0, 0, "connectID 0 accepted"),
        Packet::Credit { connect_id, bytes } => {
            assert_ne!(connect_id.0, 0, "credit for connectID 0 accepted");
            assert!(bytes > 0, "zero credit accepted");
        }
        _ => {}
    }
}
