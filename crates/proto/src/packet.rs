//! Domain packets: the wire `Packet` after validation.

use bytes::Bytes;

use crate::pb::{self, packet::Payload};

/// The client-chosen dial ID (`random` on the wire). Pairs a dial request with its response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DialId(pub i64);

/// The ID of an established connection, unique per agent stream. Never 0. Allocated by the
/// end that answered the dial: the agent (positive, as upstream's agents do) or, for a
/// tether reverse dial, the server (negative), so both share one table without colliding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectId(pub i64);

impl ConnectId {
    /// A connection the agent dialed toward the control plane (a reverse dial).
    pub fn is_reverse(self) -> bool {
        self.0 < 0
    }
}

impl std::fmt::Display for DialId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for ConnectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A validated packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet {
    DialRequest {
        protocol: String,
        address: String,
        random: DialId,
    },
    /// `Ok` carries the new connection's ID, `Err` the dial error text.
    DialResponse {
        random: DialId,
        result: Result<ConnectId, String>,
    },
    CloseRequest {
        connect_id: ConnectId,
    },
    /// `error` is `None` for a normal close.
    CloseResponse {
        connect_id: ConnectId,
        error: Option<String>,
    },
    Data {
        connect_id: ConnectId,
        data: Bytes,
    },
    CloseDial {
        random: DialId,
    },
    Drain,
    /// tether extension: permission to send `bytes` more payload on `connect_id`.
    Credit {
        connect_id: ConnectId,
        bytes: u32,
    },
    /// tether extension: the agent asks the server to dial a control-plane endpoint (an
    /// empty `address`: the server's default one).
    ReverseDialRequest {
        protocol: String,
        address: String,
        random: DialId,
    },
    /// tether extension: the server's answer to a reverse dial; `Ok` carries a negative ID.
    ReverseDialResponse {
        random: DialId,
        result: Result<ConnectId, String>,
    },
    /// tether extension: forget a reverse dial (from the agent: it gave up; from the server:
    /// it closed the dial).
    ReverseCloseDial {
        random: DialId,
    },
    /// tether extension (resumable streams): the peer received `received` of this end's
    /// numbered packets in total, so it may forget them. Not numbered itself.
    ResumeAck {
        received: u64,
    },
    /// tether extension (server peering): the agents the sending server now holds, or no
    /// longer holds. Boxed: large, and rare next to DATA.
    PeerAgents(Box<PeerAgents>),
    /// tether extension (server peering): dial `address` through the agent `forward` names,
    /// on behalf of the client it describes.
    PeerDialRequest {
        protocol: String,
        address: String,
        random: DialId,
        forward: Box<Forward>,
    },
}

/// What a peer-forwarded dial carries beyond a dial request: the agent to dial through, and
/// who asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forward {
    pub agent_id: String,
    pub origin: pb::Origin,
}

/// A PEER_AGENTS packet's lists: agents that joined or changed, and agents that left.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerAgents {
    pub up: Vec<pb::PeerAgent>,
    pub down: Vec<String>,
}

/// The most agents one PEER_AGENTS packet may name, joined and left together.
pub const MAX_PEER_AGENTS: usize = 1024;

impl Packet {
    /// Every packet type's upstream enum name, indexed by [`type_index`](Self::type_index).
    pub const TYPE_NAMES: [&'static str; 14] = [
        "DIAL_REQ",
        "DIAL_RSP",
        "CLOSE_REQ",
        "CLOSE_RSP",
        "DATA",
        "DIAL_CLS",
        "DRAIN",
        "CREDIT",
        "REVERSE_DIAL_REQ",
        "REVERSE_DIAL_RSP",
        "REVERSE_DIAL_CLS",
        "RESUME_ACK",
        "PEER_AGENTS",
        "PEER_DIAL_REQ",
    ];

    /// A dense index of the packet's type, so per-type metric handles can live in an array.
    pub fn type_index(&self) -> usize {
        match self {
            Self::DialRequest { .. } => 0,
            Self::DialResponse { .. } => 1,
            Self::CloseRequest { .. } => 2,
            Self::CloseResponse { .. } => 3,
            Self::Data { .. } => 4,
            Self::CloseDial { .. } => 5,
            Self::Drain => 6,
            Self::Credit { .. } => 7,
            Self::ReverseDialRequest { .. } => 8,
            Self::ReverseDialResponse { .. } => 9,
            Self::ReverseCloseDial { .. } => 10,
            Self::ResumeAck { .. } => 11,
            Self::PeerAgents(_) => 12,
            Self::PeerDialRequest { .. } => 13,
        }
    }

    /// The upstream enum name, used as the `packet_type` metric label.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::DialRequest { .. } => "DIAL_REQ",
            Self::DialResponse { .. } => "DIAL_RSP",
            Self::CloseRequest { .. } => "CLOSE_REQ",
            Self::CloseResponse { .. } => "CLOSE_RSP",
            Self::Data { .. } => "DATA",
            Self::CloseDial { .. } => "DIAL_CLS",
            Self::Drain => "DRAIN",
            Self::Credit { .. } => "CREDIT",
            Self::ReverseDialRequest { .. } => "REVERSE_DIAL_REQ",
            Self::ReverseDialResponse { .. } => "REVERSE_DIAL_RSP",
            Self::ReverseCloseDial { .. } => "REVERSE_DIAL_CLS",
            Self::ResumeAck { .. } => "RESUME_ACK",
            Self::PeerAgents(_) => "PEER_AGENTS",
            Self::PeerDialRequest { .. } => "PEER_DIAL_REQ",
        }
    }
}

/// Why a wire packet was rejected. The stream it came on stays usable: framing was intact.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// A plain field, not a `source()`: the message already holds its text.
    #[error("undecodable protobuf: {0}")]
    Decode(prost::DecodeError),
    #[error("unknown packet type {0}")]
    UnknownType(i32),
    #[error("{0} packet without its payload")]
    MissingPayload(&'static str),
    #[error("{0} packet carries a payload of another type")]
    MismatchedPayload(&'static str),
    #[error("{0} packet with connectID 0")]
    ZeroConnectId(&'static str),
    #[error("credit of {0} bytes is out of range")]
    BadCredit(i64),
    #[error("acknowledgement of {0} packets is out of range")]
    BadAck(i64),
    #[error("PEER_AGENTS names {0} agents, more than {MAX_PEER_AGENTS}")]
    TooManyPeerAgents(usize),
    #[error("PEER_DIAL_REQ without its dial request or origin")]
    IncompletePeerDial,
}

impl TryFrom<pb::Packet> for Packet {
    type Error = ProtoError;

    fn try_from(wire: pb::Packet) -> Result<Self, ProtoError> {
        let kind = pb::PacketType::try_from(wire.r#type)
            .map_err(|_| ProtoError::UnknownType(wire.r#type))?;
        let name = kind.as_str_name();
        let nonzero = |id: i64| {
            if id == 0 {
                Err(ProtoError::ZeroConnectId(name))
            } else {
                Ok(ConnectId(id))
            }
        };
        let payload = match (kind, wire.payload) {
            // DRAIN's payload is an empty message; tolerate its absence.
            (pb::PacketType::Drain, _) => return Ok(Self::Drain),
            (_, None) => return Err(ProtoError::MissingPayload(name)),
            (_, Some(p)) => p,
        };
        Ok(match (kind, payload) {
            (pb::PacketType::DialReq, Payload::DialRequest(d)) => Self::DialRequest {
                protocol: d.protocol,
                address: d.address,
                random: DialId(d.random),
            },
            (pb::PacketType::ReverseDialReq, Payload::DialRequest(d)) => Self::ReverseDialRequest {
                protocol: d.protocol,
                address: d.address,
                random: DialId(d.random),
            },
            (pb::PacketType::DialRsp, Payload::DialResponse(d)) => Self::DialResponse {
                random: DialId(d.random),
                result: if d.error.is_empty() {
                    Ok(nonzero(d.connect_id)?)
                } else {
                    Err(d.error)
                },
            },
            (pb::PacketType::ReverseDialRsp, Payload::DialResponse(d)) => {
                Self::ReverseDialResponse {
                    random: DialId(d.random),
                    result: if d.error.is_empty() {
                        Ok(nonzero(d.connect_id)?)
                    } else {
                        Err(d.error)
                    },
                }
            }
            (pb::PacketType::CloseReq, Payload::CloseRequest(c)) => Self::CloseRequest {
                connect_id: nonzero(c.connect_id)?,
            },
            (pb::PacketType::CloseRsp, Payload::CloseResponse(c)) => Self::CloseResponse {
                // Upstream answers "backend uninitialized" with connectID 0; keep it visible.
                connect_id: ConnectId(c.connect_id),
                error: (!c.error.is_empty()).then_some(c.error),
            },
            (pb::PacketType::Data, Payload::Data(d)) => Self::Data {
                connect_id: nonzero(d.connect_id)?,
                data: d.data,
            },
            (pb::PacketType::DialCls, Payload::CloseDial(c)) => Self::CloseDial {
                random: DialId(c.random),
            },
            (pb::PacketType::ReverseDialCls, Payload::CloseDial(c)) => Self::ReverseCloseDial {
                random: DialId(c.random),
            },
            (pb::PacketType::Credit, Payload::Credit(c)) => Self::Credit {
                connect_id: nonzero(c.connect_id)?,
                bytes: u32::try_from(c.bytes)
                    .ok()
                    .filter(|b| *b > 0)
                    .ok_or(ProtoError::BadCredit(c.bytes))?,
            },
            (pb::PacketType::ResumeAck, Payload::ResumeAck(a)) => Self::ResumeAck {
                received: u64::try_from(a.received).map_err(|_| ProtoError::BadAck(a.received))?,
            },
            (pb::PacketType::PeerAgents, Payload::PeerAgents(agents)) => {
                let named = agents.up.len() + agents.down.len();
                if named > MAX_PEER_AGENTS {
                    return Err(ProtoError::TooManyPeerAgents(named));
                }
                Self::PeerAgents(Box::new(PeerAgents {
                    up: agents.up,
                    down: agents.down,
                }))
            }
            (pb::PacketType::PeerDialReq, Payload::PeerDialRequest(p)) => {
                let (Some(dial), Some(origin)) = (p.dial, p.origin) else {
                    return Err(ProtoError::IncompletePeerDial);
                };
                Self::PeerDialRequest {
                    protocol: dial.protocol,
                    address: dial.address,
                    random: DialId(dial.random),
                    forward: Box::new(Forward {
                        agent_id: p.agent_id,
                        origin,
                    }),
                }
            }
            _ => return Err(ProtoError::MismatchedPayload(name)),
        })
    }
}

impl From<&Packet> for pb::Packet {
    fn from(packet: &Packet) -> Self {
        let (kind, payload) = match packet {
            Packet::DialRequest {
                protocol,
                address,
                random,
            } => (
                pb::PacketType::DialReq,
                dial_request(protocol, address, *random),
            ),
            Packet::ReverseDialRequest {
                protocol,
                address,
                random,
            } => (
                pb::PacketType::ReverseDialReq,
                dial_request(protocol, address, *random),
            ),
            Packet::DialResponse { random, result } => {
                (pb::PacketType::DialRsp, dial_response(*random, result))
            }
            Packet::ReverseDialResponse { random, result } => (
                pb::PacketType::ReverseDialRsp,
                dial_response(*random, result),
            ),
            Packet::CloseRequest { connect_id } => (
                pb::PacketType::CloseReq,
                Payload::CloseRequest(pb::CloseRequest {
                    connect_id: connect_id.0,
                }),
            ),
            Packet::CloseResponse { connect_id, error } => (
                pb::PacketType::CloseRsp,
                Payload::CloseResponse(pb::CloseResponse {
                    error: error.clone().unwrap_or_default(),
                    connect_id: connect_id.0,
                }),
            ),
            Packet::Data { connect_id, data } => (
                pb::PacketType::Data,
                Payload::Data(pb::Data {
                    connect_id: connect_id.0,
                    error: String::new(),
                    data: data.clone(),
                }),
            ),
            Packet::CloseDial { random } => (
                pb::PacketType::DialCls,
                Payload::CloseDial(pb::CloseDial { random: random.0 }),
            ),
            Packet::ReverseCloseDial { random } => (
                pb::PacketType::ReverseDialCls,
                Payload::CloseDial(pb::CloseDial { random: random.0 }),
            ),
            Packet::Drain => (pb::PacketType::Drain, Payload::Drain(pb::Drain {})),
            Packet::Credit { connect_id, bytes } => (
                pb::PacketType::Credit,
                Payload::Credit(pb::Credit {
                    connect_id: connect_id.0,
                    bytes: i64::from(*bytes),
                }),
            ),
            Packet::ResumeAck { received } => (
                pb::PacketType::ResumeAck,
                Payload::ResumeAck(pb::ResumeAck {
                    // A count of packets never nears 2^63; saturate rather than wrap.
                    received: i64::try_from(*received).unwrap_or(i64::MAX),
                }),
            ),
            Packet::PeerAgents(agents) => (
                pb::PacketType::PeerAgents,
                Payload::PeerAgents(pb::PeerAgents {
                    up: agents.up.clone(),
                    down: agents.down.clone(),
                }),
            ),
            Packet::PeerDialRequest {
                protocol,
                address,
                random,
                forward,
            } => (
                pb::PacketType::PeerDialReq,
                Payload::PeerDialRequest(pb::PeerDialRequest {
                    dial: Some(pb::DialRequest {
                        protocol: protocol.clone(),
                        address: address.clone(),
                        random: random.0,
                    }),
                    agent_id: forward.agent_id.clone(),
                    origin: Some(forward.origin.clone()),
                }),
            ),
        };
        Self {
            r#type: kind as i32,
            payload: Some(payload),
        }
    }
}

fn dial_request(protocol: &str, address: &str, random: DialId) -> Payload {
    Payload::DialRequest(pb::DialRequest {
        protocol: protocol.to_owned(),
        address: address.to_owned(),
        random: random.0,
    })
}

fn dial_response(random: DialId, result: &Result<ConnectId, String>) -> Payload {
    Payload::DialResponse(match result {
        Ok(id) => pb::DialResponse {
            error: String::new(),
            connect_id: id.0,
            random: random.0,
        },
        Err(e) => pb::DialResponse {
            error: e.clone(),
            connect_id: 0,
            random: random.0,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_malformed_packets() {
        let no_payload = pb::Packet {
            r#type: pb::PacketType::Data as i32,
            payload: None,
        };
        assert!(matches!(
            Packet::try_from(no_payload),
            Err(ProtoError::MissingPayload("DATA"))
        ));
        let mismatched = pb::Packet {
            r#type: pb::PacketType::Data as i32,
            payload: Some(Payload::CloseDial(pb::CloseDial { random: 1 })),
        };
        assert!(matches!(
            Packet::try_from(mismatched),
            Err(ProtoError::MismatchedPayload("DATA"))
        ));
        let unknown = pb::Packet {
            r#type: 57,
            payload: None,
        };
        assert!(matches!(
            Packet::try_from(unknown),
            Err(ProtoError::UnknownType(57))
        ));
        let zero = pb::Packet {
            r#type: pb::PacketType::Data as i32,
            payload: Some(Payload::Data(pb::Data::default())),
        };
        assert!(matches!(
            Packet::try_from(zero),
            Err(ProtoError::ZeroConnectId("DATA"))
        ));
    }

    #[test]
    fn rejects_peer_packets_too_large_or_incomplete() {
        let crowded = pb::Packet {
            r#type: pb::PacketType::PeerAgents as i32,
            payload: Some(Payload::PeerAgents(pb::PeerAgents {
                up: Vec::new(),
                down: vec![String::new(); MAX_PEER_AGENTS + 1],
            })),
        };
        assert!(matches!(
            Packet::try_from(crowded),
            Err(ProtoError::TooManyPeerAgents(1025))
        ));
        let no_origin = pb::Packet {
            r#type: pb::PacketType::PeerDialReq as i32,
            payload: Some(Payload::PeerDialRequest(pb::PeerDialRequest {
                dial: Some(pb::DialRequest::default()),
                agent_id: "a".into(),
                origin: None,
            })),
        };
        assert!(matches!(
            Packet::try_from(no_origin),
            Err(ProtoError::IncompletePeerDial)
        ));
    }

    #[test]
    fn reverse_dial_packets_round_trip_as_their_own_types() {
        let packets = [
            Packet::ReverseDialRequest {
                protocol: "tcp".into(),
                address: String::new(),
                random: DialId(7),
            },
            Packet::ReverseDialResponse {
                random: DialId(7),
                result: Ok(ConnectId(-1)),
            },
            Packet::ReverseDialResponse {
                random: DialId(7),
                result: Err("not allowed".into()),
            },
            Packet::ReverseCloseDial { random: DialId(7) },
            Packet::ResumeAck { received: 12 },
            Packet::PeerAgents(Box::new(PeerAgents {
                up: vec![pb::PeerAgent {
                    agent_id: "node-1".into(),
                    tenant: "default".into(),
                    ipv4: vec!["10.0.0.1".into()],
                    zone: "eu-1a".into(),
                    ..Default::default()
                }],
                down: vec!["node-2".into()],
            })),
            Packet::PeerDialRequest {
                protocol: "tcp".into(),
                address: "10.0.0.1:10250".into(),
                random: DialId(9),
                forward: Box::new(Forward {
                    agent_id: "node-1".into(),
                    origin: pb::Origin {
                        server_id: "server-a".into(),
                        frontend: "grpc".into(),
                        dial_id: 3,
                        ..Default::default()
                    },
                }),
            },
        ];
        for packet in packets {
            let wire = pb::Packet::from(&packet);
            assert!(wire.r#type >= 100, "{packet:?} is a tether-only type");
            assert_eq!(Packet::try_from(wire).unwrap(), packet);
        }
        assert!(ConnectId(-1).is_reverse() && !ConnectId(1).is_reverse());
    }

    #[test]
    fn drain_is_type_six_with_an_empty_field_eight() {
        use prost::Message;
        let bytes = pb::Packet::from(&Packet::Drain).encode_to_vec();
        assert_eq!(bytes, [0x08, 0x06, 0x42, 0x00]);
        // Field 1 is omitted for DIAL_REQ (the proto3 default).
        let dial = pb::Packet::from(&Packet::DialRequest {
            protocol: "tcp".into(),
            address: "a:1".into(),
            random: DialId(1),
        })
        .encode_to_vec();
        assert_eq!(
            dial[0], 0x12,
            "first byte is field 2 (dialRequest), not field 1"
        );
    }
}
