//! Tenants: one server fleet for many clusters.
//!
//! A tenant is resolved from what the listener proved (certificate names, Unix uid) or, for
//! agents, what their reviewed token proved (a ServiceAccount), through the routing file's
//! static table, for frontend clients and agents alike. Each tenant owns its own agent
//! registry, so a dial can only ever see its tenant's agents, and its own agent IDs and
//! `--max-agents`, so no tenant can squat or fill another's; an identity that
//! maps to no tenant, or to more than one, is refused (fail closed). Without a `tenants`
//! table every peer belongs to one implicit tenant with no limits (upstream's behaviour).
//!
//! The table is one generation of the routing file ([`Tenants`], read-only); what a tenant
//! holds at run time (its agents, registry, load and buckets: [`TenantState`]) is kept by
//! name from one generation to the next ([`Tenants::next`]), so that a reload changes a
//! tenant's limits without touching its agents or connections.
//!
//! An idle tenant is its table entry, an empty registry and a few counters: metric series
//! are created on first use.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use tokio::time::Instant;

use tether_grpc::{PeerIdentity, PeerTransport};
use tether_observe::metrics::{Counter, CounterVec, GaugeVec, Registry as Metrics};

use crate::backend::admission::AgentTable;
use crate::backend::health::TenantLoad;
use crate::backend::registry::Registry;
use crate::backend::route::Route;
use crate::backend::selection::{SelectionConfig, Strategy};
use crate::backend::session::AgentSession;
use crate::bandwidth::Bandwidth;
use crate::byte_rate::{ByteRate, TenantShare};
use crate::identity::Proof;
use crate::tenant_config::{TenantConfig, TenantLimits};

/// Which cap a dial hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TenantLimit {
    Connections,
    PendingDials,
    DialRate,
}

impl TenantLimit {
    fn label(self) -> &'static str {
        match self {
            Self::Connections => "connections",
            Self::PendingDials => "pending_dials",
            Self::DialRate => "dial_rate",
        }
    }
}

/// A token bucket for the dial rate.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// What a tenant holds at run time, kept by name across generations of the routing file.
#[derive(Debug)]
pub(crate) struct TenantState {
    /// Shared with the requests of its own frontend, which name it.
    pub(crate) name: Arc<str>,
    pub(crate) load: Arc<TenantLoad>,
    bucket: Mutex<Option<Bucket>>,
    registry: Mutex<Registry<Route>>,
    /// The tenant's live agent IDs and their owners, capped by `--max-agents`.
    pub(crate) agent_ids: Arc<AgentTable>,
    metrics: Arc<TenantMetrics>,
    dials: OnceLock<Arc<Counter>>,
    /// The bytes/s limit or bandwidth share, shared by the tenant's connections (idle
    /// without either); each generation sets its rate.
    pub(crate) byte_rate: Arc<ByteRate>,
    /// Every agent stream of the tenant, in the registry or suspended, so that a reload can
    /// find each one; and whether the tenant was removed.
    streams: Mutex<Streams>,
}

#[derive(Debug, Default)]
struct Streams {
    live: HashMap<u64, Arc<AgentSession>>,
    /// Set when a generation removed the tenant: why (no stream joins after it).
    removed: Option<String>,
}

/// A tenant in one generation: the limits that generation gives it, and its state.
#[derive(Debug)]
pub(crate) struct Tenant {
    limits: TenantLimits,
    state: Arc<TenantState>,
}

impl std::ops::Deref for Tenant {
    type Target = TenantState;
    fn deref(&self) -> &TenantState {
        &self.state
    }
}

impl TenantState {
    fn new(
        name: &str,
        strategies: &[Strategy],
        selection: &Arc<SelectionConfig>,
        metrics: Arc<TenantMetrics>,
    ) -> Self {
        let waits = metrics.byte_rate_waits.with(&[name]);
        Self {
            name: name.into(),
            load: Arc::default(),
            bucket: Mutex::new(None),
            registry: Mutex::new(Registry::new(strategies, selection.clone())),
            agent_ids: Arc::default(),
            metrics,
            dials: OnceLock::new(),
            byte_rate: Arc::new(ByteRate::new(None, None, waits)),
            streams: Mutex::default(),
        }
    }

    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry<Route>> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn streams(&self) -> MutexGuard<'_, Streams> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts `session` among the tenant's streams until [`leave`](Self::leave); `Err` with
    /// the reason when a generation removed the tenant meanwhile. Returns the generation in
    /// force as seen under the same lock that [`remove`](Self::remove) and
    /// [`streams_now`](Self::streams_now) take: a stream admitted under an older one is checked
    /// again by its owner, every later reload finds it.
    pub(crate) fn join(
        &self,
        session: &Arc<AgentSession>,
        generation: impl FnOnce() -> u64,
    ) -> Result<u64, String> {
        let mut streams = self.streams();
        if let Some(why) = &streams.removed {
            return Err(why.clone());
        }
        streams.live.insert(session.stream_id, session.clone());
        Ok(generation())
    }

    pub(crate) fn leave(&self, stream_id: u64) {
        self.streams().live.remove(&stream_id);
    }

    /// Whether any of the tenant's streams is still running.
    pub(crate) fn has_streams(&self) -> bool {
        !self.streams().live.is_empty()
    }

    /// The tenant's streams now.
    pub(crate) fn streams_now(&self) -> Vec<Arc<AgentSession>> {
        self.streams().live.values().cloned().collect()
    }

    /// Marks the tenant removed (no stream joins any more) and returns its streams.
    pub(crate) fn remove(&self, why: &str) -> Vec<Arc<AgentSession>> {
        let mut streams = self.streams();
        streams.removed = Some(why.to_owned());
        streams.live.values().cloned().collect()
    }
}

impl Tenant {
    /// The state this generation's entry points at.
    pub(crate) fn state(&self) -> &Arc<TenantState> {
        &self.state
    }

    /// Reserves a pending dial within the tenant's caps; the reservation is released with
    /// [`TenantLoad::release_pending`] when the dial settles or is given up.
    pub(crate) fn reserve_dial(&self, now: Instant) -> Result<(), (TenantLimit, String)> {
        let refuse = |limit: TenantLimit, text: String| {
            self.metrics
                .refusals
                .with(&[&self.name, limit.label()])
                .inc();
            Err((limit, text))
        };
        if let Some(rate) = self.limits.dials_per_second {
            let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
            let burst = rate.max(1.0);
            let b = bucket.get_or_insert(Bucket {
                tokens: burst,
                at: now,
            });
            b.tokens =
                (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate).min(burst);
            b.at = now;
            if b.tokens < 1.0 {
                return refuse(
                    TenantLimit::DialRate,
                    format!("tenant {} is over its dial rate ({rate}/s)", self.name),
                );
            }
            b.tokens -= 1.0;
        }
        let pending = self.load.pending.fetch_add(1, Ordering::Relaxed) + 1;
        let open = self.load.open.load(Ordering::Relaxed);
        let over = if self.limits.pending_dials.is_some_and(|cap| pending > cap) {
            Some((
                TenantLimit::PendingDials,
                pending - 1,
                self.limits.pending_dials,
            ))
        } else if self
            .limits
            .connections
            .is_some_and(|cap| pending + open > cap)
        {
            Some((
                TenantLimit::Connections,
                pending - 1 + open,
                self.limits.connections,
            ))
        } else {
            None
        };
        if let Some((limit, count, cap)) = over {
            self.load.release_pending();
            let what = match limit {
                TenantLimit::PendingDials => "pending dials",
                _ => "connections and pending dials",
            };
            return refuse(
                limit,
                format!(
                    "tenant {} has {count} {what}, its limit is {}",
                    self.name,
                    cap.unwrap_or_default()
                ),
            );
        }
        self.dials
            .get_or_init(|| self.metrics.dials.with(&[&self.name]))
            .inc();
        Ok(())
    }
}

/// Per-tenant metrics: the `tenant` label takes only names from the table.
#[derive(Debug)]
pub(crate) struct TenantMetrics {
    dials: Arc<CounterVec>,
    refusals: Arc<CounterVec>,
    unknown: Arc<CounterVec>,
    byte_rate_waits: Arc<CounterVec>,
    bandwidth_share: Arc<GaugeVec>,
}

impl TenantMetrics {
    pub(crate) fn register(metrics: &Metrics) -> Self {
        Self {
            dials: metrics.counter_vec(
                "tether_server_tenant_dials_total",
                "Dials admitted, per tenant",
                &["tenant"],
            ),
            refusals: metrics.counter_vec(
                "tether_server_tenant_refusals_total",
                "Dials refused because the tenant was over a limit, by tenant and limit",
                &["tenant", "limit"],
            ),
            unknown: metrics.counter_vec(
                "tether_server_tenant_unmapped_total",
                "Frontend clients and agents refused because their identity maps to no tenant or to several, by side; on a tenant's own frontend (listener=tenant), clients that are not that tenant's",
                &["side", "listener"],
            ),
            byte_rate_waits: metrics.counter_vec(
                "tether_server_tenant_byte_rate_waits_total",
                "Times a connection waited because its tenant was over its bytes/s limit or bandwidth share, per tenant",
                &["tenant"],
            ),
            bandwidth_share: metrics.gauge_vec(
                "tether_server_tenant_bandwidth_share_bytes_per_second",
                "Each tenant's planned part of the server's bandwidth (only with bandwidth set)",
                &["tenant"],
            ),
        }
    }
}

/// The tenant table of one generation of the routing file: read-only, replaced as a whole.
#[derive(Debug)]
pub(crate) struct Tenants {
    /// Empty: no table, one implicit tenant (`implicit`).
    table: Vec<(TenantConfig, Arc<Tenant>)>,
    implicit: Option<Arc<Tenant>>,
    metrics: Arc<TenantMetrics>,
    /// `--proxy-strategies`, for the registries of tenants a later generation adds.
    strategies: Arc<[Strategy]>,
    /// The generation of the routing file this table is (1 at start).
    pub(crate) generation: u64,
}

/// Why a reload ends an agent stream of tenant `from` whose identity generation `generation`
/// gives to tenant `to`.
pub(crate) fn moved(proof: Proof<'_>, from: &str, to: &str, generation: u64) -> String {
    format!(
        "agent identity {proof} moved from tenant {from} to tenant {to} in the routing file \
         (generation {generation}): reconnect to register under tenant {to}"
    )
}

/// Why a reload ends the streams of tenant `name`.
pub(crate) fn removed(name: &str, generation: u64) -> String {
    if name == IMPLICIT {
        format!(
            "the routing file now has a tenants table (generation {generation}), which maps \
             every agent and client to a tenant"
        )
    } else {
        format!("tenant {name} was removed from the routing file (generation {generation})")
    }
}

/// Which side of the server an identity came from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Side {
    Client,
    Agent,
}

/// The implicit tenant's name: no table names a tenant so (names are 1 to 63 characters).
const IMPLICIT: &str = "";

impl Tenants {
    /// The table of `tenants` (none: one implicit tenant), sharing `bandwidth` bytes/s by
    /// weight when set; every tenant's registry selects with `strategies` and `selection`.
    pub(crate) fn new(
        strategies: &[Strategy],
        tenants: &[TenantConfig],
        bandwidth: Option<u64>,
        selection: SelectionConfig,
        metrics: &Metrics,
    ) -> Self {
        let metrics = Arc::new(TenantMetrics::register(metrics));
        Self::build(
            None,
            metrics,
            strategies.into(),
            tenants,
            bandwidth,
            Arc::new(selection),
            1,
        )
        .0
    }

    /// The table of the routing file's `generation`, keeping the state of every tenant it
    /// still names (by name); also returns the tenants it no longer names.
    pub(crate) fn next(
        &self,
        tenants: &[TenantConfig],
        bandwidth: Option<u64>,
        selection: SelectionConfig,
        generation: u64,
    ) -> (Self, Vec<Arc<TenantState>>) {
        Self::build(
            Some(self),
            self.metrics.clone(),
            self.strategies.clone(),
            tenants,
            bandwidth,
            Arc::new(selection),
            generation,
        )
    }

    fn build(
        previous: Option<&Self>,
        metrics: Arc<TenantMetrics>,
        strategies: Arc<[Strategy]>,
        tenants: &[TenantConfig],
        bandwidth: Option<u64>,
        selection: Arc<SelectionConfig>,
        generation: u64,
    ) -> (Self, Vec<Arc<TenantState>>) {
        // The implicit tenant, alone, has no limits and the whole bandwidth.
        let implicit_config = tenants.is_empty().then(|| TenantConfig {
            name: IMPLICIT.into(),
            clients: Vec::new(),
            agents: Vec::new(),
            limits: TenantLimits::default(),
            frontend: None,
            weight: 1,
            control_plane_endpoints: None,
        });
        let configs: Vec<&TenantConfig> = implicit_config.iter().chain(tenants).collect();
        let bandwidth = bandwidth.map(|rate| {
            let weights: Vec<u32> = configs.iter().map(|t| t.weight).collect();
            let gauges = configs
                .iter()
                .map(|t| metrics.bandwidth_share.with(&[&t.name]))
                .collect();
            Arc::new(Bandwidth::new(rate, &weights, gauges, Instant::now()))
        });
        let mut kept: HashMap<&str, Arc<TenantState>> = previous
            .map(|p| p.all().map(|t| (&*t.name, t.state.clone())).collect())
            .unwrap_or_default();
        let mut entries: Vec<(TenantConfig, Arc<Tenant>)> = configs
            .iter()
            .enumerate()
            .map(|(index, config)| {
                let state = match kept.remove(config.name.as_str()) {
                    Some(state) => {
                        state.registry().set_config(selection.clone());
                        state
                    }
                    None => Arc::new(TenantState::new(
                        &config.name,
                        &strategies,
                        &selection,
                        metrics.clone(),
                    )),
                };
                let share = bandwidth
                    .clone()
                    .map(|bandwidth| TenantShare { bandwidth, index });
                state
                    .byte_rate
                    .configure(config.limits.bytes_per_second, share);
                let tenant = Tenant {
                    limits: config.limits,
                    state,
                };
                ((*config).clone(), Arc::new(tenant))
            })
            .collect();
        let removed: Vec<Arc<TenantState>> = kept.into_values().collect();
        for state in &removed {
            metrics.bandwidth_share.remove(&[&state.name]);
        }
        if bandwidth.is_none() {
            for (config, _) in &entries {
                metrics.bandwidth_share.remove(&[&config.name]);
            }
        }
        let implicit = if implicit_config.is_some() {
            Some(entries.remove(0).1)
        } else {
            None
        };
        let table = Self {
            table: entries,
            implicit,
            metrics,
            strategies,
            generation,
        };
        (table, removed)
    }

    /// The one tenant `proof` belongs to on `side`, on a listener shared by every tenant;
    /// `Err` names why there is none, and is counted.
    pub(crate) fn resolve(&self, side: Side, proof: Proof<'_>) -> Result<&Arc<Tenant>, String> {
        let label = match side {
            Side::Client => "client",
            Side::Agent => "agent",
        };
        self.owner(side, proof).inspect_err(|_| {
            self.metrics.unknown.with(&[label, "shared"]).inc();
        })
    }

    /// Whether a client on `tenant`'s own frontend is that tenant's: decided at accept and
    /// again at every dial. When the tenant lists client identities this transport can prove
    /// (`cert:` over TLS, `uid:` on a Unix socket), the peer must resolve to this tenant
    /// through the whole table, as on the main frontend: another tenant's certificate, or
    /// one of no tenant, is refused. Otherwise the listener is the gate: the socket's file
    /// mode, or the tenant's own `client_ca`; a TCP frontend with neither is refused (the
    /// routing file's validation already refuses to start with one). `Err` is counted.
    pub(crate) fn admit_own_frontend(
        &self,
        tenant: &Tenant,
        peer: &PeerIdentity,
    ) -> Result<(), String> {
        let refuse = |why: String| {
            self.metrics.unknown.with(&["client", "tenant"]).inc();
            Err(why)
        };
        let Some((config, _)) = self.table.iter().find(|(_, t)| t.name == tenant.name) else {
            return refuse(format!("tenant {} has no own frontend", tenant.name));
        };
        if !config
            .clients
            .iter()
            .any(|id| id.provable_over(peer.transport))
        {
            let own_ca = config
                .frontend
                .as_ref()
                .is_some_and(|f| f.client_ca.is_some());
            return match peer.transport {
                PeerTransport::Unix => Ok(()),
                PeerTransport::Tls if own_ca => Ok(()),
                _ => refuse(format!(
                    "tenant {}'s frontend lists no client identity to check {} against",
                    tenant.name,
                    peer.principal()
                )),
            };
        }
        let proof = Proof::peer(peer);
        match self.owner(Side::Client, proof) {
            Ok(owner) if owner.name == tenant.name => Ok(()),
            Ok(owner) => refuse(format!(
                "client identity {proof} is tenant {}'s, not tenant {}'s, whose frontend this is",
                owner.name, tenant.name
            )),
            Err(why) => refuse(format!(
                "{why}; this is tenant {}'s own frontend",
                tenant.name
            )),
        }
    }

    /// The one tenant `proof` belongs to on `side`; `Err` names why there is none.
    fn owner(&self, side: Side, proof: Proof<'_>) -> Result<&Arc<Tenant>, String> {
        if let Some(implicit) = &self.implicit {
            return Ok(implicit);
        }
        let mut found = self.table.iter().filter(|(config, _)| {
            let list = match side {
                Side::Client => &config.clients,
                Side::Agent => &config.agents,
            };
            list.iter().any(|id| id.matches(&proof))
        });
        let what = match side {
            Side::Client => "client",
            Side::Agent => "agent",
        };
        match (found.next(), found.next()) {
            (Some((_, tenant)), None) => Ok(tenant),
            (None, _) => Err(format!("{what} identity {proof} belongs to no tenant")),
            (Some((a, _)), Some((b, _))) => Err(format!(
                "{what} identity {proof} matches tenants {} and {}; refusing rather than guessing",
                a.name, b.name
            )),
        }
    }

    /// Why no tenant is called `name` in this generation.
    pub(crate) fn not_found(&self, name: &str) -> String {
        format!(
            "tenant {name} is not in the routing file (generation {}): it was removed",
            self.generation
        )
    }

    /// The tenant `proof` belongs to on `side`, without counting a refusal: a reload's check
    /// of a live stream.
    pub(crate) fn owner_of(&self, side: Side, proof: Proof<'_>) -> Result<&Arc<Tenant>, String> {
        self.owner(side, proof)
    }

    /// The table's tenant called `name`.
    pub(crate) fn by_name(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.table
            .iter()
            .find(|(config, _)| config.name == name)
            .map(|(_, tenant)| tenant)
    }

    /// The tenant called `name`, the implicit one (no tenant table) included.
    pub(crate) fn named(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.all().find(|tenant| &*tenant.name == name)
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.implicit
            .iter()
            .chain(self.table.iter().map(|(_, t)| t))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use tether_grpc::{CertificateNames, PeerTransport, UnixCredentials};

    use super::*;
    use crate::identity::Identity;
    use crate::routing::RoutingConfig;

    /// The table a routing file declares.
    fn table(routing: &RoutingConfig, metrics: &Metrics) -> Tenants {
        Tenants::new(
            &[Strategy::Default],
            &routing.tenants,
            routing.bandwidth,
            routing.selection(),
            metrics,
        )
    }

    /// A TLS peer whose certificate names are `names` (the first is the common name).
    pub(crate) fn cert(names: &[&str]) -> PeerIdentity {
        PeerIdentity {
            transport: PeerTransport::Tls,
            addr: None,
            certificate: Some(CertificateNames {
                common_name: Some(names[0].into()),
                dns: names.iter().map(|n| (*n).into()).collect(),
                ips: vec![],
                uris: vec![],
            }),
            unix: None,
        }
    }

    fn tenant(limits: TenantLimits) -> Tenant {
        let metrics = Arc::new(TenantMetrics::register(&Metrics::new()));
        Tenant {
            limits,
            state: Arc::new(TenantState::new(
                "t",
                &[Strategy::Default],
                &Arc::default(),
                metrics,
            )),
        }
    }

    #[test]
    fn pending_dials_and_connections_are_capped_and_released() {
        let t = tenant(TenantLimits {
            connections: Some(3),
            pending_dials: Some(2),
            ..TenantLimits::default()
        });
        let now = Instant::now();
        t.reserve_dial(now).unwrap();
        t.reserve_dial(now).unwrap();
        let (limit, text) = t.reserve_dial(now).unwrap_err();
        assert_eq!(limit, TenantLimit::PendingDials);
        assert_eq!(text, "tenant t has 2 pending dials, its limit is 2");
        // Both dials became connections: one more pending fits under 3, then no more.
        t.load.release_pending();
        t.load.release_pending();
        t.load.open.store(2, Ordering::Relaxed);
        t.reserve_dial(now).unwrap();
        assert_eq!(t.reserve_dial(now).unwrap_err().0, TenantLimit::Connections);
        assert_eq!(
            t.load.pending.load(Ordering::Relaxed),
            1,
            "refusals hold nothing"
        );
    }

    #[test]
    fn dial_rate_refills_over_time() {
        let t = tenant(TenantLimits {
            dials_per_second: Some(2.0),
            ..TenantLimits::default()
        });
        let t0 = Instant::now();
        t.reserve_dial(t0).unwrap();
        t.reserve_dial(t0).unwrap();
        assert_eq!(t.reserve_dial(t0).unwrap_err().0, TenantLimit::DialRate);
        t.reserve_dial(t0 + Duration::from_millis(500)).unwrap();
        assert!(t.reserve_dial(t0 + Duration::from_millis(500)).is_err());
    }

    #[test]
    fn identities_resolve_to_exactly_one_tenant() {
        let routing = RoutingConfig::from_yaml(
            "tenants:\n  - {name: a, clients: [\"cert:api.a\", \"uid:1001\"], agents: [\"cert:ag.a\"]}\n  - {name: b, clients: [\"cert:api.b\"], agents: [\"cert:ag.b\"]}\n",
        )
        .unwrap();
        let tenants = table(&routing, &Metrics::new());
        let name = |side, peer: &PeerIdentity| {
            tenants
                .resolve(side, Proof::peer(peer))
                .map(|t| t.name.to_string())
        };
        assert_eq!(name(Side::Client, &cert(&["api.b"])).unwrap(), "b");
        assert_eq!(name(Side::Agent, &cert(&["ag.a"])).unwrap(), "a");
        assert!(
            name(Side::Agent, &cert(&["api.a"]))
                .unwrap_err()
                .contains("no tenant"),
            "sides differ"
        );
        assert!(
            name(Side::Client, &cert(&["api.a", "api.b"]))
                .unwrap_err()
                .contains("matches tenants a and b")
        );
        assert!(name(Side::Client, &PeerIdentity::unknown()).is_err());
        let unix = PeerIdentity {
            transport: PeerTransport::Unix,
            addr: None,
            certificate: None,
            unix: Some(UnixCredentials {
                uid: 1001,
                gid: 0,
                pid: None,
            }),
        };
        assert_eq!(name(Side::Client, &unix).unwrap(), "a");
        // No table: one implicit tenant for everyone.
        let open = table(&RoutingConfig::default(), &Metrics::new());
        assert!(
            open.resolve(Side::Client, Proof::peer(&PeerIdentity::unknown()))
                .is_ok()
        );
    }

    fn unix(uid: u32) -> PeerIdentity {
        PeerIdentity {
            transport: PeerTransport::Unix,
            addr: None,
            certificate: None,
            unix: Some(UnixCredentials {
                uid,
                gid: 0,
                pid: None,
            }),
        }
    }

    #[test]
    fn a_tenants_own_frontend_admits_only_the_tenants_clients() {
        let registry = Metrics::new();
        let routing = RoutingConfig::from_yaml(
            "tenants:
  - {name: a, clients: [\"cert:api.a\", \"uid:1001\"], agents: [\"cert:ag.a\"], frontend: {tcp: \"127.0.0.1:0\", unix: /run/a.sock}}
  - {name: b, clients: [\"cert:api.b\"], agents: [\"cert:ag.b\"], frontend: {tcp: \"127.0.0.1:0\", unix: /run/b.sock}}
  - {name: c, agents: [\"cert:ag.c\"], frontend: {tcp: \"127.0.0.1:0\", client_ca: /c.crt}}
  - {name: d, clients: [\"cert:api.d\"], agents: [\"cert:ag.d\"], frontend: {tcp: \"127.0.0.1:0\", client_ca: /d.crt}}
",
        )
        .unwrap();
        let tenants = table(&routing, &registry);
        let on = |name: &str, peer: &PeerIdentity| {
            tenants.admit_own_frontend(tenants.by_name(name).unwrap(), peer)
        };
        // T3, T5b: one tenant's certificate on the other's frontend, both ways.
        assert_eq!(on("b", &cert(&["api.b"])), Ok(()));
        assert_eq!(
            on("b", &cert(&["api.a"])).unwrap_err(),
            "client identity certificate CN=api.a DNS=api.a is tenant a's, not tenant b's, whose frontend this is"
        );
        assert!(on("a", &cert(&["api.b"])).is_err());
        // T5: a certificate of no tenant, or of two.
        let none = on("b", &cert(&["proxy-client"])).unwrap_err();
        assert!(
            none.contains("belongs to no tenant; this is tenant b's own frontend"),
            "{none}"
        );
        assert!(on("b", &cert(&["api.b", "api.a"])).is_err());
        assert!(on("b", &PeerIdentity::unknown()).is_err());
        // A Unix socket checks the uid: identities the tenant lists, else its mode is the gate.
        assert_eq!(on("a", &unix(1001)), Ok(()));
        assert!(on("a", &unix(1002)).is_err());
        assert_eq!(on("b", &unix(1001)), Ok(()), "b lists no uid");
        // With its own CA, the CA is the gate, and listed names still apply.
        assert_eq!(on("c", &cert(&["anything"])), Ok(()));
        assert_eq!(on("d", &cert(&["api.d"])), Ok(()));
        assert!(on("d", &cert(&["other.d"])).is_err());
        let text = registry.render();
        assert!(
            text.contains(
                "tether_server_tenant_unmapped_total{listener=\"tenant\",side=\"client\"} 7\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_tcp_frontend_without_names_or_its_own_ca_admits_nobody() {
        // The routing file refuses this; the check itself fails closed too.
        let mut routing = RoutingConfig::from_yaml(
            "tenants:\n  - {name: a, clients: [\"cert:api.a\"], agents: [\"cert:ag.a\"], frontend: {tcp: \"127.0.0.1:0\"}}\n",
        )
        .unwrap();
        routing.tenants[0].clients.clear();
        let tenants = table(&routing, &Metrics::new());
        let a = tenants.by_name("a").unwrap();
        let err = tenants
            .admit_own_frontend(a, &cert(&["api.a"]))
            .unwrap_err();
        assert_eq!(
            err,
            "tenant a's frontend lists no client identity to check certificate CN=api.a DNS=api.a against"
        );
    }

    #[test]
    fn agents_resolve_by_service_account_namespace_and_name() {
        let routing = RoutingConfig::from_yaml(
            "tenants:\n  - {name: a, clients: [\"cert:api.a\"], agents: [\"sa:tenant-a\"]}\n  - {name: b, clients: [\"cert:api.b\"], agents: [\"sa:tenant-b:agent\"]}\n",
        )
        .unwrap();
        let tenants = table(&routing, &Metrics::new());
        let peer = PeerIdentity::unknown();
        let agent = |user: &str| {
            tenants
                .resolve(
                    Side::Agent,
                    Proof {
                        peer: &peer,
                        token_user: Some(user),
                    },
                )
                .map(|t| t.name.to_string())
        };
        assert_eq!(
            agent("system:serviceaccount:tenant-a:anything").unwrap(),
            "a"
        );
        assert_eq!(agent("system:serviceaccount:tenant-b:agent").unwrap(), "b");
        assert_eq!(
            agent("system:serviceaccount:tenant-b:other").unwrap_err(),
            "agent identity system:serviceaccount:tenant-b:other belongs to no tenant"
        );
        assert!(agent("system:serviceaccount:tenant-c:agent").is_err());
        assert!(
            agent("system:node:tenant-a").is_err(),
            "not a ServiceAccount"
        );
        assert!(
            tenants.resolve(Side::Agent, Proof::peer(&peer)).is_err(),
            "no token, no ServiceAccount"
        );
        for bad in ["sa:", "sa:Tenant", "sa:a_b", "sa:-a", "sa:a:", "sa:a:b:c"] {
            assert!(Identity::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_new_generation_keeps_each_tenants_state_by_name() {
        let registry = Metrics::new();
        let first = RoutingConfig::from_yaml(
            "tenants:\n  - {name: a, clients: [\"cert:api.a\"], agents: [\"cert:ag.a\"], limits: {connections: 1}}\n  - {name: b, clients: [\"cert:api.b\"], agents: [\"cert:ag.b\"]}\n",
        )
        .unwrap();
        let one = table(&first, &registry);
        let a1 = one.by_name("a").unwrap().clone();
        a1.load.open.store(1, Ordering::Relaxed);
        assert_eq!(
            a1.reserve_dial(Instant::now()).unwrap_err().0,
            TenantLimit::Connections
        );
        // a: a higher cap and a byte rate; b removed; c added.
        let second = RoutingConfig::from_yaml(
            "tenants:\n  - {name: a, clients: [\"cert:api.a\"], agents: [\"cert:ag.a\"], limits: {connections: 5, bytes_per_second: 1000}}\n  - {name: c, clients: [\"cert:api.c\"], agents: [\"cert:ag.b\"]}\n",
        )
        .unwrap();
        let (two, removed) = one.next(&second.tenants, None, second.selection(), 2);
        assert_eq!(two.generation, 2);
        let a2 = two.by_name("a").unwrap();
        assert!(Arc::ptr_eq(a1.state(), a2.state()), "a keeps its state");
        assert_eq!(a2.load.open.load(Ordering::Relaxed), 1, "and its load");
        a2.reserve_dial(Instant::now()).unwrap();
        assert_eq!(removed.iter().map(|s| &*s.name).collect::<Vec<_>>(), ["b"]);
        assert!(two.by_name("b").is_none());
        assert_eq!(
            two.not_found("b"),
            "tenant b is not in the routing file (generation 2): it was removed"
        );
        // ag.b is c's now.
        let agent = cert(&["ag.b"]);
        assert_eq!(
            &*two.resolve(Side::Agent, Proof::peer(&agent)).unwrap().name,
            "c"
        );
        // A removed tenant takes no new stream.
        let why = super::removed("b", 2);
        assert_eq!(
            why,
            "tenant b was removed from the routing file (generation 2)"
        );
        let streams = removed_state_streams(&removed[0], &why);
        assert!(streams.is_empty());
    }

    fn removed_state_streams(state: &TenantState, why: &str) -> Vec<Arc<AgentSession>> {
        state.remove(why)
    }
}
