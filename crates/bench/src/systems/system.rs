//! Which systems there are and what the report calls them. A leaf, so that every system's
//! module can name the system it starts without using the module that dispatches to it; what
//! a Konnectivity server takes on its command line (`Impl::has_caps`, a frontend's mode) is
//! `konnectivity`'s.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Impl {
    /// tether as it runs by default: its agent and server on the native link.
    Tether,
    /// tether with its agent on gRPC over HTTP/2 (`--transport=grpc`), the link every
    /// upstream peer gets: a regression for upstream peers shows here.
    TetherH2,
    /// tether with its agent on the WebSocket link (`--transport=websocket`): measured, not
    /// held to the native link's goals.
    TetherWs,
    /// tether on the native link with one peer hop: the client's server (A) holds no agent;
    /// the one agent holds a second server (B), and A reaches it over the peer link (server
    /// peering, `--peer-port`). Client → A → peer link → B → agent → target.
    TetherPeer,
    /// An earlier tether build (`--before-tether-bin`), for before/after figures in one run.
    TetherBefore,
    Upstream,
}

impl Impl {
    pub fn name(&self) -> &'static str {
        match self {
            Impl::Tether => "tether",
            Impl::TetherH2 => "tether-h2",
            Impl::TetherWs => "tether-ws",
            Impl::TetherPeer => "tether-peer",
            Impl::TetherBefore => "tether-before",
            Impl::Upstream => "upstream",
        }
    }
}

/// The frontend shape a client uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frontend {
    /// HTTP CONNECT over a Unix socket.
    HttpConnectUds,
    /// HTTP CONNECT over TCP with mutual TLS.
    HttpConnectTls,
    /// gRPC over a Unix socket (kube-apiserver's GRPC egress).
    GrpcUds,
    /// gRPC over TCP with mutual TLS (the server supports it; kube-apiserver does not use it).
    GrpcTls,
}

impl Frontend {
    pub const ALL: [Frontend; 4] = [
        Frontend::HttpConnectUds,
        Frontend::HttpConnectTls,
        Frontend::GrpcUds,
        Frontend::GrpcTls,
    ];

    pub fn name(&self) -> &'static str {
        match self {
            Frontend::HttpConnectUds => "http-connect/uds",
            Frontend::HttpConnectTls => "http-connect/mtls",
            Frontend::GrpcUds => "grpc/uds",
            Frontend::GrpcTls => "grpc/mtls",
        }
    }

    /// gRPC (one connection, many streams), not HTTP CONNECT (a connection per dial).
    pub fn is_grpc(&self) -> bool {
        matches!(self, Frontend::GrpcUds | Frontend::GrpcTls)
    }
}

/// One system under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum System {
    /// Straight TCP to the target: the limit of one socket.
    Direct,
    /// Two `tether-bench relay` processes in series, the limit of a two-hop proxy chain;
    /// with `tls`, the leg between them is mutual TLS like tether's agent link.
    RelayLimit { tls: bool },
    /// A Konnectivity implementation (server + one agent) with one frontend shape.
    Konn(Impl, Frontend),
    /// `ssh -L`: the client listens, sshd dials the target.
    SshL,
    /// `ssh -R`: sshd listens, the client dials the target (a reverse tunnel, like an agent).
    SshR,
    /// rathole server + client with Noise: another reverse tunnel.
    Rathole,
}

impl System {
    /// Every system, in report order.
    pub fn all() -> Vec<System> {
        let mut v = vec![
            System::Direct,
            System::RelayLimit { tls: false },
            System::RelayLimit { tls: true },
        ];
        for imp in [
            Impl::Tether,
            Impl::TetherH2,
            Impl::TetherWs,
            Impl::TetherPeer,
            Impl::TetherBefore,
            Impl::Upstream,
        ] {
            for f in Frontend::ALL {
                v.push(System::Konn(imp, f));
            }
        }
        v.push(System::SshL);
        v.push(System::SshR);
        v.push(System::Rathole);
        v
    }

    pub fn name(&self) -> String {
        match self {
            System::Direct => "direct".into(),
            System::RelayLimit { tls: false } => "relay-limit".into(),
            System::RelayLimit { tls: true } => "relay-limit-tls".into(),
            System::Konn(i, f) => format!("{} {}", i.name(), f.name()),
            System::SshL => "ssh -L".into(),
            System::SshR => "ssh -R".into(),
            System::Rathole => "rathole".into(),
        }
    }

    /// A short file-name-safe id.
    pub fn id(&self) -> String {
        self.name().replace(" -", "-").replace([' ', '/'], "-")
    }

    /// The same shape on upstream, for tether's ratios. None for `tether-peer`, whose extra
    /// hop upstream has no counterpart of: it is set against `tether` instead
    /// ([`System::direct_dial`]).
    pub fn upstream_peer(&self) -> Option<System> {
        match self {
            System::Konn(
                Impl::Tether | Impl::TetherH2 | Impl::TetherWs | Impl::TetherBefore,
                f,
            ) => Some(System::Konn(Impl::Upstream, *f)),
            _ => None,
        }
    }

    /// The same shape dialed directly, for a peer hop's ratios: `tether` for `tether-peer`.
    pub fn direct_dial(&self) -> Option<System> {
        match self {
            System::Konn(Impl::TetherPeer, f) => Some(System::Konn(Impl::Tether, *f)),
            _ => None,
        }
    }

    /// The same shape on the earlier tether build, for before/after ratios.
    pub fn before_peer(&self) -> Option<System> {
        match self {
            System::Konn(Impl::Tether | Impl::TetherH2, f) => {
                Some(System::Konn(Impl::TetherBefore, *f))
            }
            _ => None,
        }
    }

    /// The relay anchors a system is compared with: both for every proxy, the plain one for
    /// the TLS relay (what TLS on one leg costs), none for direct and the plain relay.
    pub fn relay_anchors(&self) -> [Option<System>; 2] {
        let (plain, tls) = (
            System::RelayLimit { tls: false },
            System::RelayLimit { tls: true },
        );
        match self {
            System::Direct | System::RelayLimit { tls: false } => [None, None],
            System::RelayLimit { tls: true } => [Some(plain), None],
            _ => [Some(plain), Some(tls)],
        }
    }

    /// The current tether build on either agent link: the systems the goals are for.
    pub fn holds_goals(&self) -> bool {
        matches!(self, System::Konn(Impl::Tether | Impl::TetherH2, _))
    }

    pub fn has_processes(&self) -> bool {
        !matches!(self, System::Direct)
    }

    /// Parses a name as printed by [`System::name`] or [`System::id`].
    pub fn parse(s: &str) -> Option<System> {
        System::all()
            .into_iter()
            .find(|sys| sys.name() == s || sys.id() == s)
    }
}
