//! Dialing a destination on the server's behalf: name resolution, the destination policy,
//! connect, deadline, and errors worded like Go's (the server maps them to HTTP statuses by
//! their text).
//!
//! Order matters: the policy is checked after resolution on every resolved address and
//! before any connect, so a denied destination never sees a packet. Lookups and dials are
//! capped, and the whole attempt (waiting for a slot, lookup, connect) runs under the dial
//! deadline.
//!
//! The policy file is watched while the agent runs (tether-reload: read every interval and
//! at SIGHUP, parsed whole, refused when broken). Each generation is one [`Policy`] (the
//! built-in rules and the file's) swapped as a whole. A dial is checked against the
//! generation in force and its connection follows the later ones ([`PolicyWatch`]): the
//! first that denies the address it reached closes it, with that generation's error.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tether_observe::introspect::ConfigFileView;
use tether_observe::metrics::Registry;
use tether_policy::{Builtins, Denied, Policy, RuleSet};
use tether_reload::{Loaded, ReloadMetrics, Reloader};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::metrics::DialFailure;

/// How destinations are checked and dialed.
#[derive(Clone, Debug)]
pub struct DestinationConfig {
    /// `--destination-policy`: rules checked after the built-in ones; `None` allows
    /// everything the built-in rules do not deny.
    pub policy_file: Option<PathBuf>,
    /// How often the policy file is read for changes (SIGHUP reads it at once).
    pub reload_interval: Duration,
    /// `--allow-loopback-destinations`: on by default for compatibility (see tether-policy).
    pub allow_loopback: bool,
    /// `--allow-link-local-destinations`: off by default (cloud metadata).
    pub allow_link_local: bool,
    /// `--max-concurrent-dials`: dials in progress; more wait, within their deadline.
    pub max_dials: usize,
    /// `--max-concurrent-dns-lookups`: lookups in progress (each holds a blocking thread
    /// until the resolver returns, even after its dial gave up).
    pub max_lookups: usize,
}

impl Default for DestinationConfig {
    fn default() -> Self {
        Self {
            policy_file: None,
            reload_interval: tether_reload::DEFAULT_INTERVAL,
            allow_loopback: true,
            allow_link_local: false,
            max_dials: 256,
            max_lookups: 32,
        }
    }
}

/// A policy file that cannot be used at start-up: the message names the file, and the line
/// and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct PolicyFileError {
    pub message: String,
}

/// The policy file's generations as they are applied.
type Generations = watch::Receiver<Arc<Loaded<Policy>>>;

/// The policy in force.
#[derive(Debug)]
enum PolicySource {
    /// No file: the built-in rules, for the agent's whole life.
    Builtins(Arc<Policy>),
    /// The file's generations, each the built-in rules and the file's, swapped as a whole.
    File(Arc<Reloader<Policy>>),
}

/// A dialed destination, and what tells its relay when a later policy denies it.
#[derive(Debug)]
pub(crate) struct Dialed {
    pub(crate) stream: TcpStream,
    pub(crate) watch: PolicyWatch,
}

/// The policy generations applied after a connection's dial was checked.
#[derive(Debug)]
pub(crate) struct PolicyWatch {
    /// `None` without a policy file: nothing ever changes.
    generations: Option<Generations>,
    /// The host as requested, for `name` rules.
    host: String,
    port: u16,
}

/// A policy generation that denies an open connection's destination.
#[derive(Debug)]
pub(crate) struct Revoked {
    pub(crate) generation: u64,
    pub(crate) denied: Denied,
}

impl Revoked {
    /// The error the connection is closed with, which the client sees.
    pub(crate) fn close_text(&self) -> String {
        format!(
            "{} (destination policy generation {}, applied to the open connection)",
            self.denied, self.generation
        )
    }
}

impl PolicyWatch {
    /// Resolves when a generation applied after the dial's check denies the connection to
    /// `ip` (the address it reached); never without a policy file. Every generation is judged
    /// as a whole: one that allows the destination again is no news.
    pub(crate) async fn revoked(mut self, ip: IpAddr) -> Revoked {
        let Some(generations) = self.generations.as_mut() else {
            return std::future::pending().await;
        };
        loop {
            if generations.changed().await.is_err() {
                // The policy file is no longer watched: the agent is stopping.
                return std::future::pending().await;
            }
            let loaded = generations.borrow_and_update().clone();
            if let Err(denied) = loaded.config.check(&self.host, self.port, &[ip]) {
                return Revoked {
                    generation: loaded.generation,
                    denied,
                };
            }
        }
    }
}

/// The agent's destination dialer: the current policy and the dial and lookup slots.
#[derive(Debug)]
pub(crate) struct Destinations {
    config: DestinationConfig,
    policy: PolicySource,
    dials: Semaphore,
    lookups: Arc<Semaphore>,
}

impl Destinations {
    /// Loads the policy file, if any: its generation 1. `own_listeners` are the agent's bound
    /// health and admin addresses, which are never a destination. With a file, its reload
    /// metrics are registered in `registry`.
    pub(crate) fn new(
        config: DestinationConfig,
        own_listeners: Vec<SocketAddr>,
        registry: &Registry,
    ) -> Result<Self, PolicyFileError> {
        let builtins = Builtins {
            allow_loopback: config.allow_loopback,
            allow_link_local: config.allow_link_local,
            own_listeners,
        };
        let policy = match &config.policy_file {
            Some(path) => {
                let parse = move |path: &Path, bytes: &[u8]| {
                    parse(path, bytes).map(|rules| Policy::new(&builtins, Some(rules)))
                };
                let reloader = Reloader::load(
                    path.clone(),
                    Box::new(parse),
                    ReloadMetrics::register(registry, "tether_agent"),
                )
                .map_err(|message| PolicyFileError { message })?;
                PolicySource::File(Arc::new(reloader))
            }
            None => PolicySource::Builtins(Arc::new(Policy::new(&builtins, None))),
        };
        tracing::info!(
            policy = config
                .policy_file
                .as_ref()
                .map(|p| tracing::field::display(p.display())),
            sha256 = match &policy {
                PolicySource::File(reloader) => Some(reloader.current().sha256.clone()),
                PolicySource::Builtins(_) => None,
            },
            loopback = config.allow_loopback,
            link_local = config.allow_link_local,
            "destination policy"
        );
        Ok(Self {
            policy,
            dials: Semaphore::new(config.max_dials.max(1)),
            lookups: Arc::new(Semaphore::new(config.max_lookups.max(1))),
            config,
        })
    }

    /// The policy to check a dial against, and the generations after it.
    fn policy(&self) -> (Arc<Policy>, Option<Generations>) {
        match &self.policy {
            PolicySource::Builtins(policy) => (policy.clone(), None),
            PolicySource::File(reloader) => {
                let mut generations = reloader.subscribe();
                // Seen: the watch then wakes for the generations after this one only.
                let policy = generations.borrow_and_update().config.clone();
                (policy, Some(generations))
            }
        }
    }

    /// Reads the policy file every reload interval and at each SIGHUP, until `stop`; a
    /// changed content that parses becomes the next generation, one that does not is refused
    /// and the generation in force stays (see tether-reload).
    /// Without a file, SIGHUP is only logged.
    pub(crate) async fn watch(self: Arc<Self>, stop: CancellationToken) {
        match &self.policy {
            PolicySource::File(reloader) => {
                reloader
                    .clone()
                    .run(self.config.reload_interval, stop)
                    .await;
            }
            PolicySource::Builtins(_) => {
                tether_reload::log_hangups(
                    "the agent watches no configuration file (--destination-policy is not set)",
                    stop,
                )
                .await;
            }
        }
    }

    /// The policy file's generation in force and its last refusal, for `/debug/agents`.
    pub(crate) fn view(&self) -> Option<ConfigFileView> {
        let PolicySource::File(reloader) = &self.policy else {
            return None;
        };
        Some(reloader.view("destination-policy"))
    }

    /// Dials a TCP destination, trying each resolved address before the deadline.
    pub(crate) async fn dial(
        &self,
        protocol: &str,
        address: &str,
        timeout: Duration,
    ) -> Result<Dialed, (DialFailure, String)> {
        if protocol != "tcp" {
            return Err((
                DialFailure::Unknown,
                format!("dial {protocol}: unknown network {protocol}"),
            ));
        }
        let (host, port) = split_host_port(address)
            .map_err(|e| (DialFailure::Unknown, format!("dial tcp: address {e}")))?;
        match tokio::time::timeout(timeout, self.attempt(host, port)).await {
            Ok(result) => result,
            Err(_) => Err((
                DialFailure::Timeout,
                format!("dial tcp {address}: i/o timeout"),
            )),
        }
    }

    async fn attempt(&self, host: &str, port: u16) -> Result<Dialed, (DialFailure, String)> {
        let _slot = self
            .dials
            .acquire()
            .await
            .expect("the dial semaphore is never closed");
        let ips = self.resolve(host, port).await?;
        // Taken before the check: a generation applied from here on, even while connecting,
        // is judged against the connection.
        let (policy, generations) = self.policy();
        policy
            .check(host, port, &ips)
            .map_err(|denied| (DialFailure::Policy, denied.to_string()))?;
        let watch = PolicyWatch {
            generations,
            host: host.to_owned(),
            port,
        };
        let mut last = None;
        for ip in ips {
            let addr = SocketAddr::new(ip, port);
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(Dialed { stream, watch });
                }
                Err(e) => last = Some(format!("dial tcp {addr}: connect: {}", go_error_text(&e))),
            }
        }
        Err((
            DialFailure::Unknown,
            last.unwrap_or_else(|| format!("dial tcp: lookup {host}: no such host")),
        ))
    }

    /// An IP literal as is; a name through the system resolver on a blocking thread that
    /// holds a lookup slot until the resolver returns.
    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<IpAddr>, (DialFailure, String)> {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        let slot = self
            .lookups
            .clone()
            .acquire_owned()
            .await
            .expect("the lookup semaphore is never closed");
        let name = bare.to_owned();
        let lookup = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            (name.as_str(), port).to_socket_addrs()
        });
        let failed = |text: String| {
            (
                DialFailure::Unknown,
                format!("dial tcp: lookup {host}: {text}"),
            )
        };
        match lookup.await {
            Ok(Ok(addrs)) => Ok(addrs.map(|a| a.ip()).collect()),
            Ok(Err(e)) => Err(failed(go_error_text(&e))),
            Err(e) => Err(failed(e.to_string())),
        }
    }
}

/// Parses and validates a policy file's content whole; the error names the file, the line
/// and what is wrong with it, at start-up and on reload alike.
fn parse(path: &Path, bytes: &[u8]) -> Result<RuleSet, String> {
    RuleSet::parse_bytes(bytes)
        .map_err(|error| format!("destination policy {}: {error}", path.display()))
}

/// `host:port` or `[v6]:port`, as Go's `net.SplitHostPort`; errors read like Go's.
fn split_host_port(address: &str) -> Result<(&str, u16), String> {
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(format!("{address}: missing port in address"));
    };
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(format!("{address}: too many colons in address"));
    }
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("{address}: invalid port {port:?}"))?;
    Ok((host, port))
}

/// An io::Error as Go would print it: "connection refused", not "Connection refused (os error 111)".
fn go_error_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests;
