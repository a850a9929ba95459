//! Value parsers and flag groups shared by the server and the agent.
//!
//! Upstream parses flags with Go's pflag, so values follow Go's syntax: `strconv.ParseBool`
//! booleans, `time.ParseDuration` durations. Parsing them the same way lets existing manifests
//! and upstream's test runner pass their flag lines unchanged.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs as _};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use tether_session::FlowConfig;
use tether_session::MIN_WINDOW;

/// grpc-go's default keepalive timeout: how long a PING may go unanswered. Upstream's
/// keepalive flags set only the interval, so tether uses this wherever it maps one.
pub(crate) const GRPC_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Defaults of the Kubernetes client flags shared by the server and the agent.
pub(crate) const DEFAULT_KUBE_API_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
pub(crate) const DEFAULT_LEASE_NAMESPACE: &str = "kube-system";
pub(crate) const DEFAULT_LEASE_LABEL: &str = "k8s-app=konnectivity-server";

/// Go's `strconv.ParseBool`, which pflag uses for `--flag=value`.
pub(crate) fn go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("invalid boolean {s:?} (expected true or false)")),
    }
}

/// Go's `time.ParseDuration` syntax: `1h0m0s`, `100ms`, `0`.
pub(crate) fn go_duration(s: &str) -> Result<Duration, String> {
    tether_observe::duration::parse_go_duration(s).map_err(|e| e.to_string())
}

/// A byte count, optionally with a Kubernetes binary suffix (`Ki`, `Mi`, `Gi`).
pub(crate) fn byte_size(s: &str) -> Result<u64, String> {
    let (digits, shift) = [("Gi", 30), ("Mi", 20), ("Ki", 10)]
        .into_iter()
        .find_map(|(suffix, shift)| s.strip_suffix(suffix).map(|d| (d, shift)))
        .unwrap_or((s, 0));
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("invalid size {s:?} (expected bytes, optionally with Ki, Mi or Gi)"))
}

/// The address to listen on for `host` (a bind-address flag) and `port`.
///
/// As with Go's `net.Listen`, an empty host means every interface and a name is resolved
/// once, at start-up. Port 0 asks the OS for a free port, which tether's own tests use.
pub(crate) fn listen_addr(flag: &str, host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Ok((Ipv4Addr::UNSPECIFIED, port).into());
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok((ip, port).into());
    }
    (host, port)
        .to_socket_addrs()
        .with_context(|| format!("{flag}: resolving {host:?}"))?
        .next()
        .with_context(|| format!("{flag}: {host:?} has no address"))
}

/// `IP[:PORT]`, the port defaulting to `port`; an IPv6 address with a port goes in brackets,
/// without one it may have them or not.
pub(crate) fn ip_and_port(text: &str, port: u16) -> Option<SocketAddr> {
    text.parse::<SocketAddr>().ok().or_else(|| {
        let ip = text.strip_prefix('[').and_then(|t| t.strip_suffix(']'));
        let ip = ip.unwrap_or(text).parse::<IpAddr>().ok()?;
        Some(SocketAddr::new(ip, port))
    })
}

/// Upstream refuses well-known and ephemeral ports for its listeners. tether also accepts 0
/// (a free port chosen by the OS), so tests can run many servers side by side.
pub(crate) fn check_listen_port(flag: &str, port: u16) -> anyhow::Result<()> {
    match port {
        0 | 1024..=49151 => Ok(()),
        1..=1023 => bail!(
            "{flag}: please do not try to use reserved port {port} (use 1024-49151, or 0 for a free port)"
        ),
        _ => bail!(
            "{flag}: please do not try to use ephemeral port {port} (use 1024-49151, or 0 for a free port)"
        ),
    }
}

/// An ID flag's value, or a random UUID as upstream generates when neither the flag nor its
/// environment variable is set.
pub(crate) fn id_or_random(id: Option<String>) -> String {
    id.filter(|id| !id.is_empty())
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

/// Fails with a message naming `flag` when a PEM file flag is set but its partner is not
/// (upstream: "cannot have server key empty when server cert is set").
pub(crate) fn check_pair(
    flag: &str,
    value: &str,
    partner: &str,
    partner_value: &str,
) -> anyhow::Result<()> {
    if !value.is_empty() && partner_value.is_empty() {
        bail!("{partner} must be set when {flag} is set (to {value:?})");
    }
    Ok(())
}

/// A comma-separated list of `IP[:PORT]` (`port` by default; IPv6 in brackets with a port)
/// given as `flag`; `hint` says what else the operator may have meant.
pub(crate) fn address_list(
    flag: &str,
    list: &str,
    port: u16,
    hint: &str,
) -> anyhow::Result<std::collections::BTreeSet<SocketAddr>> {
    let mut addresses = std::collections::BTreeSet::new();
    for item in list.split(',').map(str::trim) {
        let address = ip_and_port(item, port).ok_or_else(|| {
            anyhow::anyhow!(
                "{flag}: {item:?} is not IP[:PORT] (an IPv6 address with a port in brackets: [::1]:8091); {hint}"
            )
        })?;
        if address.port() == 0 {
            bail!("{flag}: {item:?} has port 0");
        }
        addresses.insert(address);
    }
    Ok(addresses)
}

/// Heading of flags accepted for compatibility only.
pub(crate) const NO_EFFECT: &str = "Accepted for compatibility (no effect in tether)";

/// Upstream's profiling flags, which both binaries share. `--enable-profiling` serves
/// tether's profiles (see `tether_profiling`); `--enable-contention-profiling` has no effect
/// and is listed in the start-up warning when changed.
#[derive(Args, Clone, Debug)]
pub(crate) struct UpstreamOnlyArgs {
    /// CPU profiles (pprof protobuf, /debug/pprof/profile) and heap statistics
    /// (/debug/pprof/heap) on the admin port.
    #[arg(long, help_heading = "Endpoints", value_name = "BOOL", default_value = "false", value_parser = go_bool, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub(crate) enable_profiling: bool,

    /// Contention profiling; needs --enable-profiling.
    #[arg(long, help_heading = NO_EFFECT, value_name = "BOOL", default_value = "false", value_parser = go_bool, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub(crate) enable_contention_profiling: bool,
}

impl UpstreamOnlyArgs {
    /// Upstream's one check among these flags.
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        if self.enable_contention_profiling && !self.enable_profiling {
            bail!("--enable-contention-profiling requires --enable-profiling");
        }
        Ok(())
    }

    /// Adds the changed ones to the start-up warning's list.
    pub(crate) fn ignored(&self, ignored: &mut Vec<String>) {
        non_default(
            ignored,
            "--enable-contention-profiling",
            self.enable_contention_profiling,
            false,
        );
    }
}

/// tether's per-connection flow control, which replaces upstream's fixed-size channels
/// (`--xfr-channel-size`) so that one slow connection never stalls the others on a stream.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Flow control (tether)")]
pub(crate) struct FlowArgs {
    /// Credit each connection grants a tether peer, in bytes (Ki, Mi and Gi suffixes
    /// allowed): how much of one connection may be in flight. At least 128Ki.
    #[arg(long, value_name = "BYTES", default_value = "1Mi", value_parser = byte_size)]
    pub(crate) connection_window: u64,

    /// Bytes one connection may queue from an upstream (Go) peer, which sends without
    /// credit. When it is full the stream waits for that connection (as upstream's always
    /// does), at most --legacy-stall-timeout without progress. At least 128Ki.
    #[arg(long, value_name = "BYTES", default_value = "8Mi", value_parser = byte_size)]
    pub(crate) legacy_connection_buffer: u64,

    /// How long a stream from an upstream (Go) peer waits for a connection whose buffer is
    /// full and whose reader makes no progress; then that connection alone is closed with an
    /// error and the stream moves on.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = go_duration)]
    pub(crate) legacy_stall_timeout: std::time::Duration,

    /// How long the connections of an agent stream whose transport broke (a reset, a
    /// relay's restart, a middlebox) wait for the other end to reconnect and resume the
    /// stream, losing nothing; then they close with an error. A live agent that saw the
    /// break resumes in milliseconds; a killed one never does, so this is how long a dead
    /// agent's connections hang. Between tether peers only; 0 turns it off.
    #[arg(long, value_name = "DURATION", default_value = "4s", value_parser = go_duration)]
    pub(crate) resume_window: std::time::Duration,
}

impl FlowArgs {
    pub(crate) fn to_config(&self) -> anyhow::Result<FlowConfig> {
        let min = u64::from(MIN_WINDOW);
        let window = u32::try_from(self.connection_window)
            .ok()
            .filter(|&w| w >= MIN_WINDOW)
            .with_context(|| {
                format!(
                    "--connection-window must be between {min} and {} bytes, got {}",
                    u32::MAX,
                    self.connection_window
                )
            })?;
        if self.legacy_connection_buffer < min {
            bail!(
                "--legacy-connection-buffer must be at least {min} bytes, got {}",
                self.legacy_connection_buffer
            );
        }
        let legacy_buffer = usize::try_from(self.legacy_connection_buffer)
            .context("--legacy-connection-buffer is too large")?;
        if self.legacy_stall_timeout.is_zero() {
            bail!("--legacy-stall-timeout must be greater than 0");
        }
        Ok(FlowConfig {
            window,
            legacy_buffer,
            local_window: window,
            legacy_stall: self.legacy_stall_timeout,
        })
    }
}

/// `name=value` for the start-up warning about flags that have no effect in tether, when
/// `value` differs from the default.
pub(crate) fn non_default<T: PartialEq + std::fmt::Display>(
    ignored: &mut Vec<String>,
    name: &str,
    value: T,
    default: T,
) {
    if value != default {
        ignored.push(format!("{name}={value}"));
    }
}

/// Runs `collect` and adds what it found to `ignored` with `(condition)` after each flag:
/// for flags that do work in tether, but not without `condition`.
pub(crate) fn ignored_unless(
    ignored: &mut Vec<String>,
    condition: &str,
    collect: impl FnOnce(&mut Vec<String>),
) {
    let mut found = Vec::new();
    collect(&mut found);
    ignored.extend(
        found
            .into_iter()
            .map(|flag| format!("{flag} ({condition})")),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_bools() {
        for s in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(go_bool(s), Ok(true), "{s}");
        }
        for s in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(go_bool(s), Ok(false), "{s}");
        }
        assert!(go_bool("yes").is_err());
        assert!(go_bool("").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(byte_size("4096"), Ok(4096));
        assert_eq!(byte_size("128Ki"), Ok(128 << 10));
        assert_eq!(byte_size("1Mi"), Ok(1 << 20));
        assert_eq!(byte_size("2Gi"), Ok(2 << 30));
        assert!(byte_size("1M").is_err());
        assert!(byte_size("Mi").is_err());
        assert!(byte_size("-1").is_err());
    }

    #[test]
    fn listen_addrs() {
        let any: SocketAddr = "0.0.0.0:8092".parse().unwrap();
        assert_eq!(listen_addr("--x", "", 8092).unwrap(), any);
        let v6: SocketAddr = "[::1]:0".parse().unwrap();
        assert_eq!(listen_addr("--x", "::1", 0).unwrap(), v6);
        assert_eq!(listen_addr("--x", "[::1]", 0).unwrap(), v6);
        assert!(
            listen_addr("--x", "localhost", 1)
                .unwrap()
                .ip()
                .is_loopback()
        );
    }

    #[test]
    fn listen_ports() {
        for ok in [0, 1024, 8090, 49151] {
            check_listen_port("--agent-port", ok).unwrap();
        }
        for bad in [1, 80, 1023, 49152, 65535] {
            let err = check_listen_port("--agent-port", bad)
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("--agent-port:"), "{err}");
        }
    }

    #[test]
    fn flow_bounds() {
        let flow = |window, legacy| FlowArgs {
            connection_window: window,
            legacy_connection_buffer: legacy,
            legacy_stall_timeout: std::time::Duration::from_secs(2),
            resume_window: std::time::Duration::from_secs(30),
        };
        let config = flow(1 << 20, 8 << 20).to_config().unwrap();
        assert_eq!(
            (config.window, config.legacy_buffer, config.local_window),
            (1 << 20, 8 << 20, 1 << 20)
        );
        let err = flow(1024, 8 << 20).to_config().unwrap_err().to_string();
        assert!(err.starts_with("--connection-window"), "{err}");
        let err = flow(1 << 20, 1).to_config().unwrap_err().to_string();
        assert!(err.starts_with("--legacy-connection-buffer"), "{err}");
    }
}
