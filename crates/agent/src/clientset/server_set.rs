//! The agent's bookkeeping of server streams, and every decision about them, as a
//! synchronous state machine: no tasks, channels or clock. The connection set feeds it what
//! happened (a stream opened, broke, was resumed or ended; discovery found other addresses;
//! an address could not be reached), with the time where time matters, and acts on what it
//! answers: which streams to let go of, which suspended stream a new one resumes or shows
//! gone, whether an address needs a stream, how many servers to hold. Kept apart so that
//! each rule can be tested alone, and every sequence of events against the rules together.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use crate::connect::Answer;
use crate::discovery::Endpoints;
use crate::server_count::{self, CountSource, ServerLeases, Uncounted};

/// With `--agent-server-connections`, how long a server that could not be reached is
/// passed over for the next one in this agent's ranking before it is wanted again.
const PASS_OVER: Duration = Duration::from_secs(30);

/// The settings the decisions depend on.
#[derive(Clone, Debug)]
pub(crate) struct Rules {
    pub(crate) agent_id: String,
    /// Every stream is opened through one address (normally a load balancer), rather than
    /// one to each discovered address.
    pub(crate) through_balancer: bool,
    /// `--agent-server-connections`.
    pub(crate) server_connections: Option<NonZeroUsize>,
    /// `--server-count-source`, when counting servers by Lease.
    pub(crate) count_source: Option<CountSource>,
}

/// Which of the streams held for one server ID over time a stream is: the task of a stream
/// that was replaced must not touch its successor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Serial(u64);

/// A held server stream, as far as the decisions go.
#[derive(Debug)]
pub(crate) struct HeldStream {
    serial: Serial,
    /// The discovered address the stream was opened to; `None` through a balancer.
    endpoint: Option<SocketAddr>,
    /// The name the server keeps the stream resumable under; `None`: not resumable.
    resume_token: Option<String>,
    /// The server accepts reverse dials on it.
    reverse: bool,
    /// Its transport broke; it waits to be resumed (not counted as connected).
    suspended: bool,
    /// Suspended, and handed a resumed transport that its task has not taken yet.
    resuming: bool,
    /// Being let go of (discovery dropped its address, it is beyond K, or its Lease no
    /// longer counts): its task drains and ends it.
    dismissed: bool,
}

impl HeldStream {
    /// Has a working transport, or is being handed one, and is not being let go of.
    fn is_live(&self) -> bool {
        !self.dismissed && (!self.suspended || self.resuming)
    }

    /// Suspended, and resumable: a new stream from its server resumes it or shows it gone.
    fn awaits_resume(&self) -> bool {
        self.suspended && self.resume_token.is_some()
    }

    pub(crate) fn is_suspended(&self) -> bool {
        self.suspended
    }
}

/// What a newly opened stream means for the suspended streams.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Opened {
    /// It continues its server's suspended stream: its transport goes to that stream's task.
    Resumes,
    /// A stream of its own, to [`ServerSet::add`]; the suspended streams it shows are gone,
    /// for their tasks to end.
    Own(Vec<Gone>),
    /// The server continued a stream this agent no longer holds (asked for before its task
    /// ended it, answered after): to close. Held as a new stream, it would start counting
    /// packets from zero where the server goes on from the old stream's count.
    Stale,
}

/// A suspended stream that will not be resumed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Gone {
    /// Its server answered a new stream without it: it restarted. No longer held, so the
    /// new stream takes its place at once.
    Restarted(String),
    /// A server under another ID answers where this one was: at its address, or as the only
    /// server behind the balancer. Held until its task ends.
    Replaced(String),
}

/// What [`ServerSet::add`] did with a new stream.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Added {
    /// Held, under this serial.
    Held(Serial),
    /// Its server is already held: a duplicate, to close. Its address is now an alias.
    Duplicate,
    /// Discovery dropped its address while it was connecting: not held, to close.
    Undiscovered,
}

/// The server streams the agent holds and what it knows about the servers.
#[derive(Debug)]
pub(crate) struct ServerSet {
    rules: Rules,
    streams: HashMap<String, HeldStream>,
    next_serial: u64,
    /// Discovered addresses whose stream turned out to be a server already held through
    /// another address (one server, two addresses: IPv4 and IPv6), and that server's ID.
    aliases: HashMap<SocketAddr, String>,
    /// With `--agent-server-connections`: addresses that could not be reached, passed over
    /// until then.
    passed_over: HashMap<SocketAddr, Instant>,
    /// The servers' addresses as discovery last found them (empty with a balancer).
    endpoints: Endpoints,
    /// The last `servercount` a server announced; 0 counts as 1, as upstream.
    server_count: usize,
    draining: bool,
    /// Connected servers beyond the count without a valid Lease, and since when.
    uncounted: Uncounted,
}

impl ServerSet {
    pub(crate) fn new(rules: Rules) -> Self {
        Self {
            rules,
            streams: HashMap::new(),
            next_serial: 0,
            aliases: HashMap::new(),
            passed_over: HashMap::new(),
            endpoints: Endpoints::new(),
            server_count: 1,
            draining: false,
            uncounted: Uncounted::default(),
        }
    }

    /// A server announced how many servers there are.
    pub(crate) fn announced(&mut self, server_count: usize) {
        self.server_count = server_count.max(1);
    }

    /// The last server count a server announced.
    pub(crate) fn server_count(&self) -> usize {
        self.server_count
    }

    pub(crate) fn start_draining(&mut self) {
        self.draining = true;
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining
    }

    /// How many servers to hold streams to now, given the latest Lease reading (`None`
    /// when not counting by Lease, or before the first listing).
    pub(crate) fn target(&self, leases: Option<&ServerLeases>, now: Instant) -> usize {
        if self.rules.through_balancer {
            self.balanced_target(leases)
        } else {
            self.discovered_target(&self.wanted(now))
        }
    }

    /// Through a balancer: as many servers as are counted, or K of them.
    fn balanced_target(&self, leases: Option<&ServerLeases>) -> usize {
        let count = server_count::target(self.rules.count_source, leases, self.server_count);
        self.rules
            .server_connections
            .map_or(count, |k| count.min(k.get()))
    }

    /// Whether every counted server is connected (streams being let go of not included; a
    /// stream handed its resumed transport is).
    pub(crate) fn satisfied(&self, leases: Option<&ServerLeases>, now: Instant) -> bool {
        let target = if self.rules.through_balancer {
            self.balanced_target(leases)
        } else {
            // Ranked once: every wanted address held, and the servers they make.
            let wanted = self.wanted(now);
            if wanted.is_empty() || !self.holds_all(wanted.iter().copied()) {
                return false;
            }
            self.discovered_target(&wanted)
        };
        // With K servers only, no one server's Lease has to be among them.
        let leases = leases.filter(|_| self.rules.server_connections.is_none());
        let kept = self
            .streams
            .iter()
            .filter(|(_, stream)| stream.is_live())
            .map(|(id, _)| id.as_str());
        server_count::satisfied(kept, target, leases)
    }

    /// Servers currently connected (suspended streams are not).
    pub(crate) fn connected(&self) -> usize {
        self.streams.values().filter(|s| !s.suspended).count()
    }

    /// The discovered address `server_id`'s stream was opened to.
    pub(crate) fn endpoint(&self, server_id: &str) -> Option<SocketAddr> {
        self.streams.get(server_id).and_then(|s| s.endpoint)
    }

    /// The servers a reverse dial may go through: those that accepted reverse dials, with a
    /// working transport and not being let go of.
    pub(crate) fn reverse_candidates(&self) -> impl Iterator<Item = &str> {
        self.streams
            .iter()
            .filter(|(_, s)| s.reverse && !s.dismissed && !s.suspended)
            .map(|(id, _)| id.as_str())
    }

    /// Whether a reverse dial that finds no candidate now may find one soon: a stream that
    /// accepted reverse dials is suspended (its resume is under way), or no stream is held
    /// yet (the agent is connecting). Not while draining, nor when every stream held
    /// refuses reverse dials: waiting would not help.
    pub(crate) fn reverse_may_come(&self) -> bool {
        let held = || self.streams.values().filter(|s| !s.dismissed);
        !self.draining && (held().next().is_none() || held().any(|s| s.reverse && s.suspended))
    }

    /// The suspended streams a new stream opened to `endpoint` asks to resume (server ID,
    /// resume token): not those already handed a transport.
    pub(crate) fn resumable_at(
        &self,
        endpoint: Option<SocketAddr>,
    ) -> impl Iterator<Item = (&str, &str)> {
        self.streams
            .iter()
            .filter(move |(_, s)| s.suspended && !s.resuming && s.endpoint == endpoint)
            .filter_map(|(id, s)| Some((id.as_str(), s.resume_token.as_deref()?)))
    }

    /// A new stream, opened to `endpoint`, from a server whose stream may be suspended:
    /// resumes that stream when the server resumed it (the same token), is stale when the
    /// server resumed any other, and otherwise tells which suspended streams it shows are
    /// gone (the same server ID without the stream: it restarted; another ID where a
    /// suspended stream's server was: it was replaced).
    pub(crate) fn opened(&mut self, answer: &Answer, endpoint: Option<SocketAddr>) -> Opened {
        let awaiting = self
            .streams
            .get_mut(&answer.server_id)
            .filter(|s| s.awaits_resume());
        if answer.resumed.is_some() {
            return match awaiting {
                Some(stream)
                    if answer.resume_token.is_some()
                        && answer.resume_token == stream.resume_token =>
                {
                    // The next sync must not ask for it again before its task has taken
                    // this transport: that request would carry a count the stream is
                    // about to pass.
                    stream.resuming = true;
                    Opened::Resumes
                }
                _ => Opened::Stale,
            };
        }
        if awaiting.is_some() {
            self.streams.remove(&answer.server_id);
            return Opened::Own(vec![Gone::Restarted(answer.server_id.clone())]);
        }
        let replaced = |stream: &HeldStream| match endpoint {
            Some(endpoint) => stream.endpoint == Some(endpoint),
            None => answer.server_count <= 1,
        };
        Opened::Own(
            self.streams
                .iter()
                .filter(|(_, s)| s.awaits_resume() && replaced(s))
                .map(|(id, _)| Gone::Replaced(id.clone()))
                .collect(),
        )
    }

    /// Holds a new stream (after [`Self::opened`] said it is one of its own) unless its
    /// server is already held. `credit`: the stream runs credit flow, without which it is
    /// not resumable.
    pub(crate) fn add(
        &mut self,
        answer: &Answer,
        endpoint: Option<SocketAddr>,
        credit: bool,
    ) -> Added {
        if endpoint.is_some_and(|e| !self.endpoints.contains(&e)) {
            // Its keeper's connect finished after the address was let go of: held now, the
            // stream would stay until it broke.
            return Added::Undiscovered;
        }
        if self.streams.contains_key(&answer.server_id) {
            if let Some(endpoint) = endpoint {
                self.aliases.insert(endpoint, answer.server_id.clone());
            }
            return Added::Duplicate;
        }
        if let Some(endpoint) = endpoint {
            // The address now holds a stream of its own: whatever server it stood for
            // before (one that has since gone) no longer matters.
            self.aliases.remove(&endpoint);
        }
        let serial = Serial(self.next_serial);
        self.next_serial += 1;
        self.streams.insert(
            answer.server_id.clone(),
            HeldStream {
                serial,
                endpoint,
                resume_token: answer.resume_token.clone().filter(|_| credit),
                reverse: answer.reverse,
                suspended: false,
                resuming: false,
                dismissed: false,
            },
        );
        Added::Held(serial)
    }

    /// The stream's transport broke (`true`), or its task took a resumed one (`false`),
    /// if it is still the stream held for its server.
    pub(crate) fn set_suspended(&mut self, server_id: &str, serial: Serial, suspended: bool) {
        if let Some(stream) = self.held_mut(server_id, serial) {
            stream.suspended = suspended;
            stream.resuming = false;
        }
    }

    /// The stream ended for good: no longer held, if it still was.
    pub(crate) fn ended(&mut self, server_id: &str, serial: Serial) -> Option<HeldStream> {
        self.held_mut(server_id, serial)?;
        self.streams.remove(server_id)
    }

    fn held_mut(&mut self, server_id: &str, serial: Serial) -> Option<&mut HeldStream> {
        self.streams
            .get_mut(server_id)
            .filter(|s| s.serial == serial)
    }

    /// Marks `server_id`'s stream let go of; whether it was held and not already.
    fn dismiss(&mut self, server_id: &str) -> bool {
        match self.streams.get_mut(server_id) {
            Some(stream) if !stream.dismissed => {
                stream.dismissed = true;
                true
            }
            _ => false,
        }
    }

    /// Lets go of servers whose Lease has not counted for a while as long as more streams
    /// than the count are held; returns their IDs.
    pub(crate) fn dismiss_surplus(&mut self, leases: &ServerLeases, now: Instant) -> Vec<String> {
        let target = self.target(Some(leases), now);
        let kept = self
            .streams
            .iter()
            .filter(|(_, s)| !s.dismissed)
            .map(|(id, _)| id.as_str());
        let surplus = server_count::surplus(kept, target, leases);
        let due = self.uncounted.due(surplus, now);
        due.into_iter().filter(|id| self.dismiss(id)).collect()
    }

    /// The addresses discovery found now.
    pub(crate) fn discovered(&mut self, endpoints: Endpoints) {
        self.endpoints = endpoints;
    }

    /// Lets go of the stream opened to `endpoint`, which discovery no longer finds; returns
    /// the IDs let go of.
    pub(crate) fn let_go_of(&mut self, endpoint: SocketAddr) -> Vec<String> {
        self.aliases.remove(&endpoint);
        let at_endpoint: Vec<String> = self
            .streams
            .iter()
            .filter(|(_, s)| s.endpoint == Some(endpoint))
            .map(|(id, _)| id.clone())
            .collect();
        at_endpoint
            .into_iter()
            .filter(|id| self.dismiss(id))
            .collect()
    }

    /// With K, lets go of streams to addresses no longer wanted once every wanted one is
    /// held: a better-ranked server is back, or rendezvous moved this agent. Returns each
    /// ID let go of with its address.
    pub(crate) fn let_go_of_unwanted(&mut self, now: Instant) -> Vec<(String, SocketAddr)> {
        if self.rules.server_connections.is_none() {
            return Vec::new();
        }
        let wanted = self.wanted(now);
        if !self.holds_all(wanted.iter().copied()) {
            return Vec::new();
        }
        // A server a wanted address turned out to be (its other address) stays.
        let aliased: Vec<&String> = wanted.iter().filter_map(|w| self.aliases.get(w)).collect();
        let unwanted: Vec<(String, SocketAddr)> = self
            .streams
            .iter()
            .filter(|(id, s)| !s.dismissed && !aliased.contains(id))
            .filter_map(|(id, s)| Some((id.clone(), s.endpoint?)))
            .filter(|(_, endpoint)| !wanted.contains(endpoint))
            .collect();
        unwanted
            .into_iter()
            .filter(|(id, _)| self.dismiss(id))
            .collect()
    }

    /// Whether `endpoint`'s keeper should connect now: not draining, the address wanted
    /// and holding no live stream, nor one still being let go of (a stream opened now would
    /// reach the same server and be closed as a duplicate, again at every sync, until the old
    /// one ended).
    pub(crate) fn should_connect(&self, endpoint: SocketAddr, now: Instant) -> bool {
        let letting_go = self
            .streams
            .values()
            .any(|s| s.dismissed && s.endpoint == Some(endpoint));
        !self.draining
            && !letting_go
            && !self.holds_all([endpoint])
            && self.wanted(now).contains(&endpoint)
    }

    /// `endpoint` could not be reached: with K, another server takes its place for a while.
    /// Whether it was passed over.
    pub(crate) fn pass_over(&mut self, endpoint: SocketAddr, now: Instant) -> bool {
        if self.rules.server_connections.is_none() {
            return false;
        }
        // Entries of addresses passed over before (since gone from discovery, or reached
        // elsewhere) would otherwise stay for good.
        self.passed_over.retain(|_, until| *until > now);
        self.passed_over.insert(endpoint, now + PASS_OVER);
        true
    }

    /// `endpoint` was reached: it is no longer passed over.
    pub(crate) fn reached(&mut self, endpoint: SocketAddr) {
        self.passed_over.remove(&endpoint);
    }

    /// When `endpoint` stops being passed over; never when it is not.
    pub(crate) fn passed_over_until(&self, endpoint: SocketAddr, now: Instant) -> Option<Instant> {
        self.passed_over
            .get(&endpoint)
            .copied()
            .filter(|until| *until > now)
    }

    /// The discovered addresses to hold streams to: every one, or the K rendezvous hashing
    /// ranks first for this agent among those not passed over.
    fn wanted(&self, now: Instant) -> Endpoints {
        let Some(k) = self.rules.server_connections else {
            return self.endpoints.clone();
        };
        crate::rendezvous::wanted(&self.rules.agent_id, &self.endpoints, k.get(), |endpoint| {
            self.passed_over_until(*endpoint, now).is_some()
        })
    }

    /// Whether every wanted address holds a live stream, its own or (an alias) that of the
    /// server it turned out to be.
    /// An alias counts as held while its server's stream is suspended too: only the
    /// stream's own address resumes it, and a fresh stream through the alias would end it.
    fn holds_all(&self, endpoints: impl IntoIterator<Item = SocketAddr>) -> bool {
        endpoints.into_iter().all(|endpoint| {
            self.streams
                .values()
                .any(|s| s.endpoint == Some(endpoint) && s.is_live())
                || self
                    .aliases
                    .get(&endpoint)
                    .and_then(|id| self.streams.get(id))
                    .is_some_and(|s| !s.dismissed)
        })
    }

    /// The servers to hold streams to: one per wanted address, less the addresses that
    /// turned out to be another's server.
    fn discovered_target(&self, wanted: &Endpoints) -> usize {
        wanted
            .iter()
            .filter(|endpoint| {
                self.aliases
                    .get(endpoint)
                    .and_then(|id| self.streams.get(id))
                    .is_none_or(|s| s.endpoint == Some(**endpoint))
            })
            .count()
            .max(1)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;
    use tether_observe::time::monotonic_now;

    use super::*;

    fn discovering(k: Option<usize>) -> Rules {
        Rules {
            agent_id: "node-1".to_owned(),
            through_balancer: false,
            server_connections: k.and_then(NonZeroUsize::new),
            count_source: None,
        }
    }

    fn balancer(k: Option<usize>, count_source: Option<CountSource>) -> Rules {
        Rules {
            through_balancer: true,
            count_source,
            ..discovering(k)
        }
    }

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([198, 18, 0, i], 8091))
    }

    /// A server's answer to a new stream that is not resumable.
    fn answer(server_id: &str) -> Answer {
        Answer {
            server_id: server_id.to_owned(),
            server_count: 1,
            server_flow: None,
            reverse: false,
            resume_token: None,
            resumed: None,
            server_version: None,
        }
    }

    fn resumable(server_id: &str, token: &str) -> Answer {
        Answer {
            resume_token: Some(token.to_owned()),
            ..answer(server_id)
        }
    }

    /// The answer of a server that continues the stream `token` names.
    fn resumed(server_id: &str, token: &str) -> Answer {
        Answer {
            resumed: Some(0),
            ..resumable(server_id, token)
        }
    }

    fn counting(server_count: usize, answer: Answer) -> Answer {
        Answer {
            server_count,
            ..answer
        }
    }

    /// Opens a stream as the connection set does: `None` when it resumed a suspended one.
    fn open(set: &mut ServerSet, answer: &Answer, endpoint: Option<SocketAddr>) -> Option<Added> {
        set.announced(answer.server_count);
        match set.opened(answer, endpoint) {
            Opened::Resumes | Opened::Stale => None,
            Opened::Own(_) => Some(set.add(answer, endpoint, true)),
        }
    }

    /// Opens a stream that must be held, and returns its serial.
    fn hold(set: &mut ServerSet, answer: &Answer, endpoint: Option<SocketAddr>) -> Serial {
        match open(set, answer, endpoint) {
            Some(Added::Held(serial)) => serial,
            other => panic!("{} not held: {other:?}", answer.server_id),
        }
    }

    /// Holds a resumable stream and breaks its transport.
    fn hold_suspended(
        set: &mut ServerSet,
        server_id: &str,
        token: &str,
        endpoint: Option<SocketAddr>,
    ) -> Serial {
        let serial = hold(set, &resumable(server_id, token), endpoint);
        set.set_suspended(server_id, serial, true);
        serial
    }

    #[test]
    fn a_second_stream_to_a_held_server_is_a_duplicate_and_its_address_an_alias() {
        let now = monotonic_now();
        let mut set = ServerSet::new(discovering(None));
        set.discovered([addr(1), addr(2)].into());
        hold(&mut set, &answer("a"), Some(addr(1)));
        assert!(set.should_connect(addr(2), now));
        assert!(!set.satisfied(None, now));
        assert_eq!(
            open(&mut set, &answer("a"), Some(addr(2))),
            Some(Added::Duplicate)
        );
        assert_eq!(set.aliases.get(&addr(2)).map(String::as_str), Some("a"));
        assert!(!set.should_connect(addr(2), now), "held through the alias");
        assert_eq!(set.target(None, now), 1, "one server behind both addresses");
        assert!(set.satisfied(None, now));
        assert_eq!(set.connected(), 1);
    }

    #[test]
    fn an_alias_counts_as_held_while_its_servers_stream_is_suspended() {
        let now = monotonic_now();
        let mut set = ServerSet::new(discovering(None));
        set.discovered([addr(1), addr(2)].into());
        let serial = hold(&mut set, &resumable("a", "t1"), Some(addr(1)));
        assert_eq!(
            open(&mut set, &resumable("a", "t1"), Some(addr(2))),
            Some(Added::Duplicate)
        );
        set.set_suspended("a", serial, true);
        // Its own address resumes it; a fresh stream through the alias would end it.
        assert!(set.should_connect(addr(1), now));
        assert!(!set.should_connect(addr(2), now));
        assert!(!set.satisfied(None, now));
        assert_eq!(set.connected(), 0);
        // Handed its resumed transport: live again, though not yet connected.
        assert_eq!(
            open(&mut set, &resumed("a", "t1"), Some(addr(1))),
            None,
            "resumed"
        );
        assert!(!set.should_connect(addr(1), now));
        assert!(set.satisfied(None, now));
        assert_eq!(set.connected(), 0);
        set.set_suspended("a", serial, false);
        assert_eq!(set.connected(), 1);
        // Let go of: neither address holds it any more.
        assert_eq!(set.let_go_of(addr(1)), ["a"]);
        assert!(set.should_connect(addr(2), now));
    }

    #[test]
    fn a_resumed_stream_is_handed_over_and_not_asked_for_again() {
        let mut set = ServerSet::new(balancer(None, None));
        let serial = hold_suspended(&mut set, "a", "t1", None);
        assert_eq!(set.resumable_at(None).collect::<Vec<_>>(), [("a", "t1")]);
        assert_eq!(set.resumable_at(Some(addr(1))).count(), 0);
        assert_eq!(set.opened(&resumed("a", "t1"), None), Opened::Resumes);
        assert!(set.streams["a"].resuming);
        assert_eq!(set.resumable_at(None).count(), 0, "its task has it");
        // The task took the transport.
        set.set_suspended("a", serial, false);
        assert!(!set.streams["a"].resuming && !set.streams["a"].suspended);
        assert_eq!(set.connected(), 1);
    }

    #[test]
    fn a_server_that_restarted_ends_the_suspended_stream_and_the_new_one_takes_its_place() {
        let answers = [resumable("a", "t2"), answer("a")];
        for new in answers {
            let mut set = ServerSet::new(balancer(None, None));
            let old = hold_suspended(&mut set, "a", "t1", None);
            assert_eq!(
                set.opened(&new, None),
                Opened::Own(vec![Gone::Restarted("a".into())]),
                "{new:?}"
            );
            assert!(!set.streams.contains_key("a"));
            let Added::Held(serial) = set.add(&new, None, true) else {
                panic!("not held: {new:?}");
            };
            // The old stream's task ends without touching its successor.
            set.set_suspended("a", old, true);
            assert!(set.ended("a", old).is_none());
            assert!(!set.streams["a"].suspended);
            assert!(set.ended("a", serial).is_some());
        }
    }

    /// Soak seed 13 at 1,586 s: the agent asked to resume a stream, its task ended it (its
    /// server's Lease expired while the server was frozen), then the server thawed and
    /// continued the stream. Held as new, the stream counted the server's packets from zero
    /// and the server ended it: "peer acknowledged N packets, which is not what this end
    /// wrote".
    #[test]
    fn a_resume_answered_for_a_stream_no_longer_awaiting_it_is_stale_and_changes_nothing() {
        // The stream's task ended it before the answer came.
        let mut set = ServerSet::new(balancer(None, None));
        let serial = hold_suspended(&mut set, "a", "t1", None);
        assert!(set.ended("a", serial).is_some());
        assert_eq!(set.opened(&resumed("a", "t1"), None), Opened::Stale);
        assert!(set.streams.is_empty());
        assert!(!set.satisfied(None, monotonic_now()), "to connect again");

        // A newer stream of that server is suspended: the answer resumed an older one, or
        // one without a token, and the newer one still waits.
        for stale in [
            resumed("a", "t1"),
            Answer {
                resumed: Some(0),
                ..answer("a")
            },
        ] {
            let mut set = ServerSet::new(balancer(None, None));
            hold_suspended(&mut set, "a", "t2", None);
            assert_eq!(set.opened(&stale, None), Opened::Stale, "{stale:?}");
            assert!(set.streams["a"].awaits_resume() && !set.streams["a"].resuming);
            assert_eq!(set.resumable_at(None).collect::<Vec<_>>(), [("a", "t2")]);
        }

        // The stream was resumed through another connection meanwhile and works.
        let mut set = ServerSet::new(balancer(None, None));
        let serial = hold_suspended(&mut set, "a", "t1", None);
        assert_eq!(set.opened(&resumed("a", "t1"), None), Opened::Resumes);
        set.set_suspended("a", serial, false);
        assert_eq!(set.opened(&resumed("a", "t1"), None), Opened::Stale);
        assert_eq!(set.connected(), 1);
    }

    #[test]
    fn a_server_under_another_id_at_the_same_address_replaces_the_suspended_stream() {
        let mut set = ServerSet::new(discovering(None));
        set.discovered([addr(1), addr(2)].into());
        hold_suspended(&mut set, "a", "t1", Some(addr(1)));
        hold_suspended(&mut set, "c", "t3", Some(addr(2)));
        assert_eq!(
            set.opened(&answer("b"), Some(addr(1))),
            Opened::Own(vec![Gone::Replaced("a".into())])
        );
        assert!(set.streams.contains_key("a"), "held until its task ends");
        assert!(matches!(
            set.add(&answer("b"), Some(addr(1)), true),
            Added::Held(_)
        ));
    }

    #[test]
    fn the_only_server_behind_a_balancer_replaces_the_suspended_streams() {
        let mut set = ServerSet::new(balancer(None, None));
        hold_suspended(&mut set, "a", "t1", None);
        assert_eq!(
            set.opened(&counting(2, answer("b")), None),
            Opened::Own(Vec::new()),
            "one of two servers: the other may still resume"
        );
        assert_eq!(
            set.opened(&counting(1, answer("b")), None),
            Opened::Own(vec![Gone::Replaced("a".into())])
        );
        assert_eq!(
            set.opened(&counting(0, answer("b")), None),
            Opened::Own(vec![Gone::Replaced("a".into())])
        );
    }

    #[test]
    fn with_k_an_unreachable_address_is_passed_over_until_that_expires() {
        let t0 = monotonic_now();
        let mut set = ServerSet::new(discovering(Some(1)));
        set.discovered([addr(1), addr(2), addr(3)].into());
        let first = set.wanted(t0);
        assert_eq!(first.len(), 1);
        let best = *first.iter().next().unwrap();
        assert!(set.should_connect(best, t0));
        assert!(set.pass_over(best, t0));
        assert!(!set.wanted(t0).contains(&best));
        assert!(!set.should_connect(best, t0));
        assert_eq!(set.passed_over_until(best, t0), Some(t0 + PASS_OVER));
        let late = t0 + PASS_OVER - Duration::from_secs(1);
        assert!(!set.should_connect(best, late));
        assert_eq!(set.wanted(t0 + PASS_OVER), first, "expired");
        assert_eq!(set.passed_over_until(best, t0 + PASS_OVER), None);
        // Reached before then: wanted again at once.
        set.pass_over(best, t0);
        set.reached(best);
        assert_eq!(set.wanted(t0), first);
        // Without K, every address is wanted anyway.
        let mut every = ServerSet::new(discovering(None));
        assert!(!every.pass_over(best, t0));
        assert_eq!(every.passed_over_until(best, t0), None);
    }

    #[test]
    fn unwanted_streams_are_let_go_of_only_once_every_wanted_address_is_held() {
        let t0 = monotonic_now();
        let mut set = ServerSet::new(discovering(Some(1)));
        set.discovered([addr(1), addr(2)].into());
        let best = *set.wanted(t0).iter().next().unwrap();
        let other = if best == addr(1) { addr(2) } else { addr(1) };
        set.pass_over(best, t0);
        assert!(set.should_connect(other, t0));
        hold(&mut set, &answer("s-other"), Some(other));
        assert!(set.let_go_of_unwanted(t0).is_empty(), "nothing unwanted");
        let later = t0 + PASS_OVER;
        assert!(set.should_connect(best, later));
        assert!(
            set.let_go_of_unwanted(later).is_empty(),
            "the better-ranked address is not held yet"
        );
        set.reached(best);
        hold(&mut set, &answer("s-best"), Some(best));
        assert_eq!(
            set.let_go_of_unwanted(later),
            [("s-other".to_owned(), other)]
        );
        assert!(
            set.let_go_of_unwanted(later).is_empty(),
            "already let go of"
        );
        // Without K, nothing is unwanted.
        let mut every = ServerSet::new(discovering(None));
        every.discovered([addr(1)].into());
        hold(&mut every, &answer("a"), Some(addr(1)));
        every.discovered(Endpoints::new());
        assert!(every.let_go_of_unwanted(t0).is_empty());
    }

    #[test]
    fn an_address_wanted_again_waits_for_its_stream_being_let_go_of_to_end() {
        let now = monotonic_now();
        let mut set = ServerSet::new(discovering(None));
        set.discovered([addr(1), addr(2)].into());
        hold(&mut set, &answer("a"), Some(addr(1)));
        let serial = hold(&mut set, &answer("b"), Some(addr(2)));
        set.discovered([addr(1)].into());
        assert_eq!(set.let_go_of(addr(2)), ["b"]);
        // Back before the old stream (draining) ended: not a second stream to "b".
        set.discovered([addr(1), addr(2)].into());
        assert!(!set.should_connect(addr(2), now));
        assert!(set.ended("b", serial).is_some());
        assert!(set.should_connect(addr(2), now));
    }

    #[test]
    fn the_server_a_wanted_address_turned_out_to_be_is_kept() {
        let t0 = monotonic_now();
        let mut set = ServerSet::new(discovering(Some(1)));
        set.discovered([addr(1), addr(2)].into());
        let best = *set.wanted(t0).iter().next().unwrap();
        let other = if best == addr(1) { addr(2) } else { addr(1) };
        set.pass_over(best, t0);
        hold(&mut set, &answer("s"), Some(other));
        set.reached(best);
        assert_eq!(
            open(&mut set, &answer("s"), Some(best)),
            Some(Added::Duplicate)
        );
        assert!(set.let_go_of_unwanted(t0).is_empty());
        assert!(set.satisfied(None, t0));
    }

    #[test]
    fn a_stream_to_an_address_discovery_dropped_while_it_connected_is_not_held() {
        let now = monotonic_now();
        let mut set = ServerSet::new(discovering(None));
        set.discovered([addr(1), addr(2)].into());
        hold(&mut set, &answer("a"), Some(addr(1)));
        assert!(set.should_connect(addr(2), now));
        // The keeper of addr(2) is connecting when discovery drops it.
        set.discovered([addr(1)].into());
        assert!(set.let_go_of(addr(2)).is_empty(), "nothing held there yet");
        assert_eq!(
            set.add(&answer("b"), Some(addr(2)), true),
            Added::Undiscovered
        );
        assert_eq!(set.connected(), 1);
        assert!(set.aliases.is_empty());
        // Through a balancer there is no address to check.
        let mut balanced = ServerSet::new(Rules {
            through_balancer: true,
            ..discovering(None)
        });
        assert!(matches!(
            balanced.add(&answer("b"), None, true),
            Added::Held(_)
        ));
    }

    #[test]
    fn letting_go_of_an_address_discovery_dropped_clears_its_alias() {
        let now = monotonic_now();
        let mut set = ServerSet::new(discovering(None));
        set.discovered([addr(1), addr(2)].into());
        hold(&mut set, &answer("a"), Some(addr(1)));
        open(&mut set, &answer("a"), Some(addr(2)));
        set.discovered([addr(1)].into());
        assert!(set.let_go_of(addr(2)).is_empty(), "the server stays");
        assert!(set.aliases.is_empty());
        set.discovered([addr(1), addr(2)].into());
        assert!(set.should_connect(addr(2), now), "no alias stands for it");
        set.discovered([addr(2)].into());
        assert_eq!(set.let_go_of(addr(1)), ["a"]);
        assert!(set.let_go_of(addr(1)).is_empty(), "already let go of");
        assert_eq!(set.connected(), 1, "until its task ends it");
    }

    #[test]
    fn target_and_satisfied_through_a_balancer() {
        let now = monotonic_now();
        let mut set = ServerSet::new(balancer(None, None));
        assert_eq!(set.target(None, now), 1);
        hold(&mut set, &counting(3, answer("a")), None);
        hold(&mut set, &counting(3, answer("b")), None);
        assert_eq!(set.target(None, now), 3);
        assert!(!set.satisfied(None, now));
        hold(&mut set, &counting(3, answer("c")), None);
        assert!(set.satisfied(None, now));
        set.announced(0);
        assert_eq!(set.target(None, now), 1, "0 counts as 1");

        // Counting by Lease: one to every server holding one.
        let mut set = ServerSet::new(balancer(None, Some(CountSource::Default)));
        set.announced(3);
        let two = ServerLeases::of(2, &["a", "b"]);
        assert_eq!(set.target(Some(&two), now), 2);
        hold(&mut set, &answer("a"), None);
        hold(&mut set, &answer("c"), None);
        assert!(!set.satisfied(Some(&two), now), "none to b");
        hold(&mut set, &answer("b"), None);
        assert!(set.satisfied(Some(&two), now));
        let set = ServerSet::new(balancer(None, Some(CountSource::Max)));
        assert_eq!(set.target(Some(&ServerLeases::of(4, &[])), now), 4);

        // With K, no one server's Lease has to be among them.
        let mut set = ServerSet::new(balancer(Some(2), Some(CountSource::Default)));
        let three = ServerLeases::of(3, &["a", "b", "c"]);
        assert_eq!(set.target(Some(&three), now), 2);
        hold(&mut set, &answer("a"), None);
        hold(&mut set, &answer("x"), None);
        assert!(set.satisfied(Some(&three), now));
    }

    #[test]
    fn satisfied_leaves_out_streams_being_let_go_of_or_suspended() {
        let now = monotonic_now();
        let mut set = ServerSet::new(discovering(None));
        set.discovered([addr(1), addr(2)].into());
        assert_eq!(set.target(None, now), 2);
        assert!(!set.satisfied(None, now));
        hold(&mut set, &answer("a"), Some(addr(1)));
        let serial = hold(&mut set, &resumable("b", "t"), Some(addr(2)));
        assert!(set.satisfied(None, now));
        set.set_suspended("b", serial, true);
        assert!(!set.satisfied(None, now));
        set.set_suspended("b", serial, false);
        set.let_go_of(addr(2));
        assert!(!set.satisfied(None, now));
        // No address discovered yet: never satisfied, one server wanted.
        let empty = ServerSet::new(discovering(None));
        assert_eq!(empty.target(None, now), 1);
        assert!(!empty.satisfied(None, now));
    }

    #[test]
    fn surplus_servers_without_a_lease_are_let_go_of_after_the_grace() {
        let t0 = monotonic_now();
        let mut set = ServerSet::new(balancer(None, Some(CountSource::Default)));
        for id in ["a", "b", "c"] {
            hold(&mut set, &answer(id), None);
        }
        let two = ServerLeases::of(2, &["a", "b"]);
        assert!(set.dismiss_surplus(&two, t0).is_empty());
        let grace = t0 + server_count::UNCOUNTED_GRACE;
        assert_eq!(set.dismiss_surplus(&two, grace), ["c"]);
        assert!(
            set.dismiss_surplus(&two, grace).is_empty(),
            "let go of once"
        );
        assert!(set.satisfied(Some(&two), grace));
        assert_eq!(set.reverse_candidates().count(), 0);
    }

    #[test]
    fn reverse_dials_go_through_live_streams_that_accept_them() {
        let mut set = ServerSet::new(balancer(None, None));
        let reverse = |a: Answer| Answer { reverse: true, ..a };
        hold(&mut set, &reverse(answer("a")), None);
        hold(&mut set, &answer("b"), None);
        let serial = hold(&mut set, &reverse(resumable("c", "t")), None);
        let mut candidates: Vec<&str> = set.reverse_candidates().collect();
        candidates.sort_unstable();
        assert_eq!(candidates, ["a", "c"]);
        set.set_suspended("c", serial, true);
        assert_eq!(set.reverse_candidates().collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn a_reverse_dial_waits_for_a_resume_or_a_first_stream_but_not_for_refusers() {
        let reverse = |a: Answer| Answer { reverse: true, ..a };
        let mut set = ServerSet::new(balancer(None, None));
        assert!(set.reverse_may_come(), "no stream yet: connecting");
        hold(&mut set, &answer("a"), None);
        assert!(
            !set.reverse_may_come(),
            "the one server refuses reverse dials"
        );
        let serial = hold(&mut set, &reverse(resumable("b", "t")), None);
        assert_eq!(set.reverse_candidates().collect::<Vec<_>>(), ["b"]);
        set.set_suspended("b", serial, true);
        assert_eq!(set.reverse_candidates().count(), 0);
        assert!(set.reverse_may_come(), "b's resume is under way");
        set.start_draining();
        assert!(
            !set.reverse_may_come(),
            "a draining agent waits for nothing"
        );
    }

    #[test]
    fn a_stream_without_credit_is_not_resumable() {
        let mut set = ServerSet::new(balancer(None, None));
        set.opened(&resumable("a", "t"), None);
        let Added::Held(serial) = set.add(&resumable("a", "t"), None, false) else {
            panic!("not held");
        };
        assert_eq!(set.streams["a"].resume_token, None);
        set.set_suspended("a", serial, true);
        assert!(!set.streams["a"].awaits_resume());
        assert_eq!(set.resumable_at(None).count(), 0);
        assert_eq!(set.opened(&resumed("a", "t"), None), Opened::Stale);
    }

    #[test]
    fn a_draining_agent_connects_no_more() {
        let now = monotonic_now();
        let mut set = ServerSet::new(discovering(None));
        set.discovered([addr(1)].into());
        assert!(set.should_connect(addr(1), now));
        set.start_draining();
        assert!(set.is_draining());
        assert!(!set.should_connect(addr(1), now));
    }

    const SERVERS: u8 = 3;
    const ENDPOINTS: u8 = 3;

    /// Something that happens to the set, as the connection set would report it.
    #[derive(Clone, Debug)]
    enum Event {
        /// A stream opened: through the balancer, or to discovered address `endpoint` when
        /// its keeper would connect.
        Open {
            server: u8,
            endpoint: u8,
            token: Option<u8>,
            resumed: bool,
            server_count: usize,
            reverse: bool,
            credit: bool,
        },
        /// A held, resumable stream's transport broke.
        Break(u8),
        /// A stream's task took the resumed transport it was handed.
        TakeTransport(u8),
        /// A stream's task ended it; `stale`: the task of an earlier stream to that server.
        End {
            server: u8,
            stale: bool,
        },
        /// Discovery found these addresses (a bit each).
        Discover(u8),
        /// A keeper could not reach its address.
        Unreachable(u8),
        LetGoOfUnwanted,
        /// A Lease reading: this many, held by these servers (a bit each).
        DismissSurplus {
            count: usize,
            holders: u8,
        },
        Wait(u64),
        Drain,
    }

    fn event() -> impl Strategy<Value = Event> {
        let open = (
            0..SERVERS,
            0..ENDPOINTS,
            prop::option::weighted(0.8, 0u8..2),
            any::<bool>(),
            0usize..3,
            any::<bool>(),
            prop::bool::weighted(0.9),
        )
            .prop_map(
                |(server, endpoint, token, resumed, server_count, reverse, credit)| Event::Open {
                    server,
                    endpoint,
                    token,
                    resumed,
                    server_count,
                    reverse,
                    credit,
                },
            );
        prop_oneof![
            12 => open,
            6 => (0..SERVERS).prop_map(Event::Break),
            4 => (0..SERVERS).prop_map(Event::TakeTransport),
            4 => (0..SERVERS, any::<bool>()).prop_map(|(server, stale)| Event::End { server, stale }),
            3 => (0u8..8).prop_map(Event::Discover),
            3 => (0..ENDPOINTS).prop_map(Event::Unreachable),
            3 => Just(Event::LetGoOfUnwanted),
            3 => (0usize..4, 0u8..16)
                .prop_map(|(count, holders)| Event::DismissSurplus { count, holders }),
            4 => (0u64..40).prop_map(Event::Wait),
            1 => Just(Event::Drain),
        ]
    }

    fn server_id(server: u8) -> String {
        format!("s{server}")
    }

    /// Runs `let_go` and checks what it returns: streams held and not already let go of,
    /// each once, let go of now.
    fn check_let_go_of(
        set: &mut ServerSet,
        let_go: impl FnOnce(&mut ServerSet) -> Vec<String>,
    ) -> Result<(), TestCaseError> {
        let dismissable: HashSet<String> = set
            .streams
            .iter()
            .filter(|(_, s)| !s.dismissed)
            .map(|(id, _)| id.clone())
            .collect();
        let ids = let_go(set);
        let distinct: HashSet<&String> = ids.iter().collect();
        prop_assert_eq!(distinct.len(), ids.len(), "let go of twice: {:?}", ids);
        for id in &ids {
            prop_assert!(
                dismissable.contains(id),
                "{} was not held, or let go of",
                id
            );
            prop_assert!(set.streams[id].dismissed);
        }
        Ok(())
    }

    /// Applies `event` as the connection set would, checking each decision's promise.
    fn apply(set: &mut ServerSet, now: &mut Instant, event: Event) -> Result<(), TestCaseError> {
        let through_balancer = set.rules.through_balancer;
        let serial_of = |set: &ServerSet, id: &str| set.streams.get(id).map(|s| s.serial);
        match event {
            Event::Open {
                server,
                endpoint,
                token,
                resumed,
                server_count,
                reverse,
                credit,
            } => {
                let endpoint = (!through_balancer).then(|| addr(endpoint + 1));
                let connects = match endpoint {
                    Some(endpoint) => set.should_connect(endpoint, *now),
                    None => !set.is_draining(),
                };
                if !connects {
                    return Ok(());
                }
                let answer = Answer {
                    server_id: server_id(server),
                    server_count,
                    server_flow: None,
                    reverse,
                    resume_token: token.map(|t| format!("t{t}")),
                    resumed: resumed.then_some(0),
                    server_version: None,
                };
                if let Some(endpoint) = endpoint {
                    set.reached(endpoint);
                }
                set.announced(server_count);
                let id = &answer.server_id;
                let before = format!("{set:?}");
                match set.opened(&answer, endpoint) {
                    Opened::Resumes => {
                        let stream = &set.streams[id];
                        prop_assert!(stream.suspended && stream.resuming);
                    }
                    Opened::Stale => {
                        prop_assert!(answer.resumed.is_some());
                        prop_assert_eq!(
                            before,
                            format!("{set:?}"),
                            "a stale answer changed the set"
                        );
                    }
                    Opened::Own(gone) => {
                        prop_assert!(
                            !set.streams.get(id).is_some_and(HeldStream::awaits_resume),
                            "a suspended stream of {} outlives a new one",
                            id
                        );
                        for each in &gone {
                            match each {
                                Gone::Restarted(restarted) => {
                                    prop_assert_eq!(restarted, id);
                                    prop_assert_eq!(gone.len(), 1);
                                }
                                Gone::Replaced(replaced) => {
                                    prop_assert_ne!(replaced, id);
                                    prop_assert!(set.streams[replaced].awaits_resume());
                                }
                            }
                        }
                        let held = set.streams.contains_key(id);
                        match set.add(&answer, endpoint, credit) {
                            Added::Duplicate => {
                                prop_assert!(held);
                                if let Some(endpoint) = endpoint {
                                    prop_assert_eq!(set.aliases.get(&endpoint), Some(id));
                                }
                            }
                            Added::Undiscovered => {
                                prop_assert!(endpoint.is_some_and(|e| !set.endpoints.contains(&e)));
                            }
                            Added::Held(serial) => {
                                prop_assert!(!held);
                                prop_assert_eq!(set.streams[id].serial, serial);
                                if let Some(endpoint) = endpoint {
                                    prop_assert!(!set.aliases.contains_key(&endpoint));
                                    prop_assert!(set.holds_all([endpoint]));
                                }
                            }
                        }
                    }
                }
            }
            Event::Break(server) => {
                let id = server_id(server);
                if let Some(stream) = set.streams.get(&id)
                    && stream.resume_token.is_some()
                    && !stream.suspended
                    && !stream.dismissed
                {
                    let serial = stream.serial;
                    set.set_suspended(&id, serial, true);
                    prop_assert!(set.streams[&id].awaits_resume());
                }
            }
            Event::TakeTransport(server) => {
                let id = server_id(server);
                if let Some(stream) = set.streams.get(&id)
                    && stream.resuming
                {
                    let serial = stream.serial;
                    set.set_suspended(&id, serial, false);
                    prop_assert!(!set.streams[&id].suspended && !set.streams[&id].resuming);
                }
            }
            Event::End { server, stale } => {
                let id = server_id(server);
                if let Some(serial) = serial_of(set, &id) {
                    let serial = if stale {
                        Serial(serial.0.wrapping_sub(1))
                    } else {
                        serial
                    };
                    let ended = set.ended(&id, serial);
                    prop_assert_eq!(ended.is_some(), !stale);
                    prop_assert_eq!(set.streams.contains_key(&id), stale);
                }
            }
            Event::Discover(found) => {
                if through_balancer {
                    return Ok(());
                }
                let found: Endpoints = (0..ENDPOINTS)
                    .filter(|i| found & (1 << i) != 0)
                    .map(|i| addr(i + 1))
                    .collect();
                let dropped: Vec<SocketAddr> = set.endpoints.difference(&found).copied().collect();
                set.discovered(found);
                for endpoint in dropped {
                    check_let_go_of(set, |set| set.let_go_of(endpoint))?;
                    prop_assert!(!set.aliases.contains_key(&endpoint));
                }
            }
            Event::Unreachable(endpoint) => {
                let endpoint = addr(endpoint + 1);
                if through_balancer || !set.should_connect(endpoint, *now) {
                    return Ok(());
                }
                let k = set.rules.server_connections.is_some();
                prop_assert_eq!(set.pass_over(endpoint, *now), k);
                if k {
                    prop_assert_eq!(
                        set.passed_over_until(endpoint, *now),
                        Some(*now + PASS_OVER)
                    );
                }
            }
            Event::LetGoOfUnwanted => {
                let now = *now;
                check_let_go_of(set, |set| {
                    set.let_go_of_unwanted(now)
                        .into_iter()
                        .map(|(id, _)| id)
                        .collect()
                })?;
            }
            Event::DismissSurplus { count, holders } => {
                if !through_balancer {
                    return Ok(());
                }
                let leases = ServerLeases {
                    count,
                    holders: (0..SERVERS)
                        .filter(|i| holders & (1 << i) != 0)
                        .map(server_id)
                        .collect(),
                    ..ServerLeases::default()
                };
                let now = *now;
                check_let_go_of(set, |set| set.dismiss_surplus(&leases, now))?;
            }
            Event::Wait(seconds) => *now += Duration::from_secs(seconds),
            Event::Drain => set.start_draining(),
        }
        Ok(())
    }

    /// What holds after every event.
    fn check_invariants(set: &ServerSet, now: Instant) -> Result<(), TestCaseError> {
        let streams = &set.streams;
        prop_assert!(set.connected() <= streams.len());
        let serials: HashSet<u64> = streams.values().map(|s| s.serial.0).collect();
        prop_assert_eq!(serials.len(), streams.len(), "two streams share a serial");
        for (id, stream) in streams {
            prop_assert!(
                !stream.resuming || stream.awaits_resume(),
                "{} resuming but not suspended",
                id
            );
        }
        for (endpoint, id) in &set.aliases {
            prop_assert!(
                !streams
                    .get(id)
                    .is_some_and(|s| s.is_live() && s.endpoint == Some(*endpoint)),
                "{} is an alias of its own live stream",
                endpoint
            );
            prop_assert!(set.endpoints.contains(endpoint));
        }
        for stream in streams.values().filter(|s| !s.dismissed) {
            if let Some(endpoint) = stream.endpoint {
                prop_assert!(
                    set.endpoints.contains(&endpoint),
                    "{} no longer discovered, yet held",
                    endpoint
                );
            }
        }
        let wanted = set.wanted(now);
        prop_assert!(wanted.is_subset(&set.endpoints));
        let k = set
            .rules
            .server_connections
            .map_or(usize::MAX, NonZeroUsize::get);
        prop_assert_eq!(wanted.len(), set.endpoints.len().min(k));
        let target = set.target(None, now);
        prop_assert!(target >= 1);
        if !set.rules.through_balancer {
            prop_assert!(target <= wanted.len().max(1));
        }
        let live = streams.values().filter(|s| s.is_live()).count();
        prop_assert!(!set.satisfied(None, now) || live >= target);
        if set.is_draining() {
            prop_assert!(set.endpoints.iter().all(|e| !set.should_connect(*e, now)));
        }
        Ok(())
    }

    fn rules() -> impl Strategy<Value = Rules> {
        (
            any::<bool>(),
            prop::option::of(1usize..3),
            prop_oneof![
                Just(None),
                Just(Some(CountSource::Default)),
                Just(Some(CountSource::Max))
            ],
        )
            .prop_map(|(through_balancer, k, count_source)| {
                if through_balancer {
                    balancer(k, count_source)
                } else {
                    discovering(k)
                }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Any sequence of what happens to streams, discovery and time keeps the set
        /// consistent, and every decision keeps its promise.
        #[test]
        fn every_sequence_of_events_keeps_the_set_consistent(
            rules in rules(),
            events in prop::collection::vec(event(), 1..100),
        ) {
            let mut set = ServerSet::new(rules);
            let mut now = monotonic_now();
            for event in events {
                apply(&mut set, &mut now, event)?;
                check_invariants(&set, now)?;
            }
        }
    }
}
