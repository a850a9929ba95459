//! Dialing a destination on the server's behalf: name resolution, the destination policy,
//! connect, deadline, and errors worded like Go's (the server maps them to HTTP statuses by
//! their text).
//!
//! Order matters: the policy is checked after resolution on every resolved address and
//! before any connect, so a denied destination never sees a packet. Lookups and dials are
//! capped, and the whole attempt (waiting for a slot, lookup, connect) runs under the dial
//! deadline.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tether_policy::{Builtins, Policy, RuleSet};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::metrics::{AgentMetrics, DialFailure};

/// How destinations are checked and dialed.
#[derive(Clone, Debug)]
pub struct DestinationConfig {
    /// `--destination-policy`: rules checked after the built-in ones; `None` allows
    /// everything the built-in rules do not deny.
    pub policy_file: Option<PathBuf>,
    /// How often the policy file is checked for changes.
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
            reload_interval: Duration::from_secs(5),
            allow_loopback: true,
            allow_link_local: false,
            max_dials: 256,
            max_lookups: 32,
        }
    }
}

/// A policy file that cannot be used. The errors are plain fields, not `source()`s, which
/// `{:#}` would print a second time after the message that already holds them.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    #[error("reading destination policy {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("destination policy {path}: {error}")]
    Parse {
        path: String,
        error: tether_policy::ParseError,
    },
}

/// The agent's destination dialer: the current policy and the dial and lookup slots.
#[derive(Debug)]
pub(crate) struct Destinations {
    config: DestinationConfig,
    builtins: Builtins,
    policy: RwLock<Arc<Policy>>,
    dials: Semaphore,
    lookups: Arc<Semaphore>,
    metrics: Arc<AgentMetrics>,
}

impl Destinations {
    /// Loads the policy file, if any. `own_listeners` are the agent's bound health and admin
    /// addresses, which are never a destination.
    pub(crate) fn new(
        config: DestinationConfig,
        own_listeners: Vec<SocketAddr>,
        metrics: Arc<AgentMetrics>,
    ) -> Result<Self, PolicyFileError> {
        let builtins = Builtins {
            allow_loopback: config.allow_loopback,
            allow_link_local: config.allow_link_local,
            own_listeners,
        };
        let file = match &config.policy_file {
            Some(path) => Some(load(
                path,
                &std::fs::read(path).map_err(|error| PolicyFileError::Read {
                    path: path.display().to_string(),
                    error,
                })?,
            )?),
            None => None,
        };
        tracing::info!(
            policy = config
                .policy_file
                .as_ref()
                .map(|p| tracing::field::display(p.display())),
            rules = file.as_ref().map_or(0, |f| f.rules().count()),
            loopback = config.allow_loopback,
            link_local = config.allow_link_local,
            "destination policy"
        );
        Ok(Self {
            policy: RwLock::new(Arc::new(Policy::new(&builtins, file))),
            builtins,
            dials: Semaphore::new(config.max_dials.max(1)),
            lookups: Arc::new(Semaphore::new(config.max_lookups.max(1))),
            config,
            metrics,
        })
    }

    fn policy(&self) -> Arc<Policy> {
        self.policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Re-reads the policy file whenever its content changes, until `stop`. A file that
    /// cannot be read or parsed keeps the policy in force; it is logged and counted once
    /// per distinct content.
    pub(crate) async fn watch(self: Arc<Self>, stop: CancellationToken) {
        let Some(path) = self.config.policy_file.clone() else {
            return;
        };
        let mut current = std::fs::read(&path).ok();
        let mut ticks = tokio::time::interval(self.config.reload_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = stop.cancelled() => return,
            }
            let reading = path.clone();
            let read = tokio::task::spawn_blocking(move || std::fs::read(reading))
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            let seen = match &read {
                Ok(bytes) => Some(bytes.clone()),
                Err(_) => None,
            };
            if seen == current {
                continue;
            }
            current = seen;
            let loaded = read
                .map_err(|error| PolicyFileError::Read {
                    path: path.display().to_string(),
                    error,
                })
                .and_then(|bytes| load(&path, &bytes));
            match loaded {
                Ok(file) => {
                    let rules = file.rules().count();
                    *self.policy.write().unwrap_or_else(|e| e.into_inner()) =
                        Arc::new(Policy::new(&self.builtins, Some(file)));
                    self.metrics.policy_reload(true);
                    tracing::info!(path = %path.display(), rules, "destination policy reloaded");
                }
                Err(e) => {
                    self.metrics.policy_reload(false);
                    tracing::warn!(error = %e, "keeping the current destination policy");
                }
            }
        }
    }

    /// Dials a TCP destination, trying each resolved address before the deadline.
    pub(crate) async fn dial(
        &self,
        protocol: &str,
        address: &str,
        timeout: Duration,
    ) -> Result<TcpStream, (DialFailure, String)> {
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

    async fn attempt(&self, host: &str, port: u16) -> Result<TcpStream, (DialFailure, String)> {
        let _slot = self
            .dials
            .acquire()
            .await
            .expect("the dial semaphore is never closed");
        let ips = self.resolve(host, port).await?;
        self.policy()
            .check(host, port, &ips)
            .map_err(|denied| (DialFailure::Policy, denied.to_string()))?;
        let mut last = None;
        for ip in ips {
            let addr = SocketAddr::new(ip, port);
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
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

/// Parses and validates a policy file's content, naming the file in errors.
fn load(path: &std::path::Path, bytes: &[u8]) -> Result<RuleSet, PolicyFileError> {
    RuleSet::parse_bytes(bytes).map_err(|error| PolicyFileError::Parse {
        path: path.display().to_string(),
        error,
    })
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
