//! Checking a dial address at the frontend, before any agent sees it.
//!
//! Agents answer a bad address with an error that echoes it; an address of megabytes made
//! that answer larger than a gRPC message may be and cost every tunnel on the agent's
//! stream. Anything that is not `host:port` with a plausible host is refused here instead.

use std::net::IpAddr;

use tether_grpc::LogText;

/// A DNS name's longest text form.
const MAX_HOST_BYTES: usize = 253;

/// `Ok` for `host:port` or `[ipv6]:port` with a port in 1–65535 and a host of at most 253
/// bytes (or an IP literal); otherwise the error text for the client.
pub(crate) fn check_dial_address(address: &str) -> Result<(), String> {
    let invalid = |why: &str| {
        Err(format!(
            "invalid dial address {:?}: {why}",
            LogText(address).to_string()
        ))
    };
    let (host, port) = match address.strip_prefix('[') {
        Some(rest) => match rest.split_once("]:") {
            Some((host, port)) => {
                if host.parse::<std::net::Ipv6Addr>().is_err() {
                    return invalid("bracketed host is not an IPv6 address");
                }
                (host, port)
            }
            None => return invalid("expected [ipv6]:port"),
        },
        None => match address.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => {
                return invalid("an IPv6 host must be in brackets");
            }
            Some(split) => split,
            None => return invalid("missing port"),
        },
    };
    match port.parse::<u16>() {
        Ok(p) if p != 0 && !port.starts_with('+') => {}
        _ => return invalid("port must be a number from 1 to 65535"),
    }
    if host.is_empty() {
        return invalid("empty host");
    }
    if host.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    if host.len() > MAX_HOST_BYTES {
        return invalid("host longer than 253 bytes");
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        return invalid("host is neither an IP address nor a DNS name");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_dial_address as check;

    #[test]
    fn accepts_host_port_and_ip_literals() {
        for ok in [
            "10.0.0.1:10250",
            "[fd00::1]:443",
            "node-1.cluster.local:22",
            "kubernetes:443",
            "a:65535",
        ] {
            assert!(check(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn refuses_what_no_agent_could_dial() {
        let long = format!("{}:80", "a".repeat(254));
        for bad in [
            "",
            "host",
            "host:",
            "host:0",
            "host:65536",
            "host:+80",
            ":80",
            "fd00::1:443",
            "[not-v6]:443",
            "ho st:80",
            "host\n:80",
            long.as_str(),
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
        let huge = "a".repeat(4 << 20);
        let err = check(&huge).unwrap_err();
        assert!(
            err.len() < 400,
            "error echoes a bounded prefix: {}",
            err.len()
        );
    }
}
