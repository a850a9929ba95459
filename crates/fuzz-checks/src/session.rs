//! The session table under arbitrary packet sequences from its peer, interleaved with its
//! owners' commands and the clock, in both roles and both flow modes, with forward and
//! reverse dials mixed.
//!
//! Invariants: nothing panics; queue accounting adds up and stays within each queue's
//! bound; every connection that opened ends exactly once; after the stream ends and every
//! owner lets go, no dial or connection is left.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tether_proto::{ConnectId, DialId, Packet};
use tether_session::{
    CloseError, Event, FlowConfig, Limits, Outgoing, Role, Session, SessionConfig,
};

/// Reads the fuzzer's bytes as small numbers; zeros once they run out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }

    fn small(&mut self) -> i64 {
        i64::from(self.byte() % 8) + 1
    }

    /// A connection ID from either end's range: 1 to 4 (the agent's), -1 to -4 (the
    /// server's, for reverse dials).
    fn connect_id(&mut self) -> ConnectId {
        let v = self.small();
        ConnectId(if v > 4 { 4 - v } else { v })
    }

    fn len(&mut self) -> usize {
        usize::from(self.byte()) * 512 + usize::from(self.byte())
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

pub fn check(data: &[u8]) {
    let mut input = Input(data);
    let first = input.byte();
    let role = if first % 2 == 0 {
        Role::Server
    } else {
        Role::Agent
    };
    let flow = if input.byte() % 2 == 0 {
        FlowConfig::default().negotiate(Some("1048576"))
    } else {
        FlowConfig::default().negotiate(None)
    };
    let limits = Limits {
        max_pending_dials: 16,
        max_unknown_packets: 64,
        max_reply_backlog: 32,
        max_error_text: 64,
    };
    let mut s = Session::new(SessionConfig {
        role,
        flow,
        dial_timeout: Duration::from_secs(30),
        close_timeout: Duration::from_secs(10),
        limits,
        // Resumable sessions number, log and acknowledge every packet; only with credit.
        resumable: flow.is_credit() && first & 2 != 0,
        // A peer link takes PEER_AGENTS and PEER_DIAL_REQ; an agent stream ignores them.
        peering: first & 4 != 0,
    });
    // The session core only compares the instants it is given; the run moves time by hand.
    #[expect(clippy::disallowed_methods, reason = "a sans-IO run's base instant")]
    let mut now = Instant::now();
    let mut opened: HashMap<ConnectId, u32> = HashMap::new();
    let mut ended: HashMap<ConnectId, u32> = HashMap::new();
    let mut steps = 0;
    while !input.is_empty() && steps < 2_000 {
        steps += 1;
        let op = input.byte() % 16;
        let id = input.connect_id();
        let random = DialId(input.small());
        match op {
            0..=5 if !s.is_parked() => {
                let packet = match op {
                    0 => Packet::Data {
                        connect_id: id,
                        data: Bytes::from(vec![0; input.len()]),
                    },
                    // Odd dial IDs forward, even ones reverse.
                    1 if random.0 % 2 == 1 => Packet::DialRequest {
                        protocol: "tcp".into(),
                        address: "127.0.0.1:1".into(),
                        random,
                    },
                    1 => Packet::ReverseDialRequest {
                        protocol: "tcp".into(),
                        address: String::new(),
                        random,
                    },
                    2 => {
                        let result = if input.byte() % 2 == 0 {
                            Ok(id)
                        } else {
                            Err("x".repeat(input.len() % 200))
                        };
                        if random.0 % 2 == 1 {
                            Packet::DialResponse { random, result }
                        } else {
                            Packet::ReverseDialResponse { random, result }
                        }
                    }
                    3 => Packet::CloseResponse {
                        connect_id: id,
                        error: (input.byte() % 2 == 0).then(|| "boom".into()),
                    },
                    4 => match input.byte() % 4 {
                        0 => Packet::CloseRequest { connect_id: id },
                        1 => Packet::CloseDial { random },
                        2 => Packet::ReverseCloseDial { random },
                        _ => Packet::Drain,
                    },
                    _ => Packet::Credit {
                        connect_id: id,
                        bytes: u32::from(input.byte()) << 16,
                    },
                };
                if s.handle_packet(now, packet).is_err() {
                    s.close_stream(now, "violation");
                }
            }
            6 => {
                let _ = s.open_dial(now, random, "tcp".into(), "127.0.0.1:1".into(), None);
            }
            7 => {
                let _ = s.take_dial(random);
            }
            8 => {
                s.abandon_dial(now, random);
            }
            9 => {
                if input.byte() % 2 == 0 {
                    s.dial_succeeded(now, random);
                } else {
                    s.dial_failed(random, "refused".into());
                }
            }
            10 => {
                let _ = s.send_data(id, Bytes::from(vec![1; input.len() % 65_536 + 1]));
            }
            11 => {
                s.recv(now, id);
                s.consumed(id);
            }
            12 => match input.byte() % 3 {
                0 => s.close(now, id),
                1 => s.finish(now, id, Some(CloseError::Local("x".into()))),
                _ => s.release(now, id),
            },
            13 => {
                let mut batch: Vec<Outgoing> = Vec::new();
                s.poll_transmit(&mut batch, usize::from(input.byte()) * 1024);
                for item in batch {
                    if let Some((id, cost)) = item.release {
                        s.transmitted(id, cost);
                    }
                }
            }
            14 => {
                now += Duration::from_millis(u64::from(input.byte()) * 200);
                s.handle_timeout(now);
            }
            _ => match input.byte() % 4 {
                0 => s.drain(),
                // A broken transport, and a resume with whatever count the peer claims.
                1 => {
                    s.suspend(now, Duration::from_secs(5));
                }
                2 => {
                    let _ = s.resume(u64::from(input.byte()));
                }
                _ => {
                    let ack = Packet::ResumeAck {
                        received: u64::from(input.byte()),
                    };
                    if s.handle_packet(now, ack).is_err() {
                        s.close_stream(now, "violation");
                    }
                }
            },
        }
        record(&mut s, &mut opened, &mut ended);
        check_bounds(&s);
    }

    // The stream ends; every owner lets go.
    s.close_stream(now, "end of input");
    let ids: Vec<ConnectId> = s.connections().map(|c| c.id).collect();
    for id in ids {
        s.release(now, id);
    }
    for random in 1..=8 {
        if let Some(Ok(id)) = s.take_dial(DialId(random)) {
            s.release(now, id);
        }
    }
    now += Duration::from_secs(60);
    s.handle_timeout(now);
    record(&mut s, &mut opened, &mut ended);
    assert_eq!(s.connection_count(), 0, "a connection outlived its stream");
    assert_eq!(s.pending_dial_count(), 0, "a pending dial never ended");
    assert_eq!(s.queued_bytes(), 0);
    assert_eq!(s.replay_log(), (0, 0), "the replay log outlived its stream");
    assert_eq!(opened, ended, "every opened connection ends exactly once");
}

/// Counts openings and endings per connection ID (a peer may reuse an ID once it is free).
fn record(
    s: &mut Session,
    opened: &mut HashMap<ConnectId, u32>,
    ended: &mut HashMap<ConnectId, u32>,
) {
    while let Some(event) = s.poll_event() {
        match event {
            Event::Opened(id) => *opened.entry(id).or_insert(0) += 1,
            Event::Ended(e) => {
                let n = ended.entry(e.id).or_insert(0);
                *n += 1;
                assert!(
                    *n <= opened.get(&e.id).copied().unwrap_or(0),
                    "{} ended twice",
                    e.id
                );
            }
            _ => {}
        }
    }
}

fn check_bounds(s: &Session) {
    let mut total = 0;
    for c in s.connections() {
        assert!(c.queued <= c.limit.max(512 * 256 + 256), "{c:?}");
        assert!(c.window <= 1 << 40, "{c:?}");
        total += c.queued;
    }
    assert_eq!(s.queued_bytes(), total);
}
