//! A server-side table and an agent-side table wired back to back in memory, with a clock
//! the test controls. What one end queues, [`Pair::pump`] hands to the other.

#![allow(dead_code, unreachable_pub)]

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tether_proto::{ConnectId, DialId, Packet};
use tether_session::{
    Ended, Event, Flow, FlowConfig, Limits, Outgoing, Recv, Role, Session, SessionConfig,
};

pub const DIAL_TIMEOUT: Duration = Duration::from_secs(30);
pub const AGENT_DIAL_TIMEOUT: Duration = Duration::from_secs(5);
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

pub fn credit() -> Flow {
    FlowConfig::default().negotiate(Some(&FlowConfig::default().window.to_string()))
}

pub fn legacy() -> Flow {
    FlowConfig::default().negotiate(None)
}

pub fn config(role: Role, flow: Flow) -> SessionConfig {
    SessionConfig {
        role,
        flow,
        dial_timeout: match role {
            Role::Server => DIAL_TIMEOUT,
            Role::Agent => AGENT_DIAL_TIMEOUT,
        },
        close_timeout: CLOSE_TIMEOUT,
        limits: Limits::default(),
        resumable: false,
        peering: false,
    }
}

/// Everything one end's table reported, in order.
#[derive(Debug, Default)]
pub struct Log {
    pub events: Vec<Event>,
    pub sent: Vec<Packet>,
}

impl Log {
    pub fn ended(&self) -> Vec<&Ended> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Ended(ended) => Some(ended),
                _ => None,
            })
            .collect()
    }

    pub fn opened(&self) -> Vec<ConnectId> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Opened(id) => Some(*id),
                _ => None,
            })
            .collect()
    }

    pub fn dial_requests(&self) -> Vec<DialId> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::DialRequested { random, .. } => Some(*random),
                _ => None,
            })
            .collect()
    }
}

pub struct Pair {
    pub server: Session,
    pub agent: Session,
    pub now: Instant,
    pub server_log: Log,
    pub agent_log: Log,
    /// Set when a table reported a violation; the harness then cuts the stream.
    pub violation: Option<String>,
}

impl Pair {
    pub fn new(server_flow: Flow, agent_flow: Flow) -> Self {
        Self {
            server: Session::new(config(Role::Server, server_flow)),
            agent: Session::new(config(Role::Agent, agent_flow)),
            now: base_instant(),
            server_log: Log::default(),
            agent_log: Log::default(),
            violation: None,
        }
    }

    pub fn credit() -> Self {
        Self::new(credit(), credit())
    }

    /// Two servers' peer link, or (`peering` false) an agent stream given the same packets.
    pub fn peers(peering: bool) -> Self {
        let config = |role| SessionConfig {
            peering,
            ..config(role, credit())
        };
        Self {
            server: Session::new(config(Role::Server)),
            agent: Session::new(config(Role::Agent)),
            ..Self::credit()
        }
    }

    fn collect(&mut self) {
        while let Some(e) = self.server.poll_event() {
            self.server_log.events.push(e);
        }
        while let Some(e) = self.agent.poll_event() {
            self.agent_log.events.push(e);
        }
    }

    /// Delivers queued packets both ways until both outboxes are empty or a reader parks.
    /// Bounded: a table that keeps producing packets forever fails the test.
    pub fn pump(&mut self) {
        for _ in 0..10_000 {
            self.collect();
            let mut moved = false;
            moved |= Self::deliver(
                &mut self.server,
                &mut self.agent,
                self.now,
                &mut self.server_log,
                &mut self.violation,
            );
            moved |= Self::deliver(
                &mut self.agent,
                &mut self.server,
                self.now,
                &mut self.agent_log,
                &mut self.violation,
            );
            self.collect();
            if !moved {
                return;
            }
        }
        panic!("the pair never went quiet");
    }

    /// Moves `from`'s outbox into `to`, stopping while `to` is parked.
    fn deliver(
        from: &mut Session,
        to: &mut Session,
        now: Instant,
        log: &mut Log,
        violation: &mut Option<String>,
    ) -> bool {
        let mut moved = false;
        while !to.is_parked() {
            let mut batch: Vec<Outgoing> = Vec::new();
            if !from.poll_transmit(&mut batch, 1) {
                break;
            }
            for item in batch {
                moved = true;
                if let Some((id, cost)) = item.release {
                    from.transmitted(id, cost);
                }
                log.sent.push(item.packet.clone());
                if let Err(v) = to.handle_packet(now, item.packet) {
                    violation.get_or_insert(v.to_string());
                }
            }
        }
        moved
    }

    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        self.server.handle_timeout(self.now);
        self.agent.handle_timeout(self.now);
        self.pump();
    }

    /// Opens a dial at the server (nothing delivered yet).
    pub fn open(&mut self, random: i64) -> DialId {
        let random = DialId(random);
        self.server
            .open_dial(self.now, random, "tcp".into(), "127.0.0.1:9".into(), None)
            .expect("dial opens");
        random
    }

    /// Opens a dial and lets the agent connect at once; returns the connection's ID.
    pub fn connect(&mut self, random: i64) -> ConnectId {
        let random = DialId(random);
        self.server
            .open_dial(self.now, random, "tcp".into(), "127.0.0.1:80".into(), None)
            .expect("dial opens");
        self.pump();
        let id = self
            .agent
            .dial_succeeded(self.now, random)
            .expect("dial wanted");
        self.pump();
        let taken = self.server.take_dial(random).expect("settled");
        assert_eq!(taken, Ok(id));
        id
    }

    /// Reads everything waiting on `id` at `side`.
    pub fn drain(side: &mut Session, now: Instant, id: ConnectId) -> (Vec<u8>, Option<Recv>) {
        let mut bytes = Vec::new();
        loop {
            match side.recv(now, id) {
                Recv::Data(d) => bytes.extend_from_slice(&d),
                Recv::Empty => return (bytes, None),
                closed @ Recv::Closed(_) => return (bytes, Some(closed)),
            }
        }
    }

    /// Ends the stream at both ends.
    pub fn cut(&mut self, reason: &str) {
        self.server.close_stream(self.now, reason);
        self.agent.close_stream(self.now, reason);
        self.collect();
    }

    /// Every connection either end opened ended exactly once.
    pub fn assert_one_outcome_each(&self) {
        for log in [&self.server_log, &self.agent_log] {
            let opened: HashSet<ConnectId> = log.opened().into_iter().collect();
            let mut ended = HashMap::new();
            for e in log.ended() {
                *ended.entry(e.id).or_insert(0) += 1;
            }
            assert!(
                ended.values().all(|&n| n == 1),
                "a connection ended twice: {ended:?}"
            );
            let ended: HashSet<ConnectId> = ended.into_keys().collect();
            assert_eq!(opened, ended, "opened and ended differ");
        }
    }
}

/// The instant a test's clock starts at. The session core only compares instants it is
/// given, so any will do; the test then moves time by hand.
#[expect(clippy::disallowed_methods, reason = "a sans-IO test's base instant")]
pub fn base_instant() -> Instant {
    Instant::now()
}
