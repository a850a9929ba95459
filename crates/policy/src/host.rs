//! This host's own addresses, for the rule that keeps the agent's listeners out of reach on
//! every address the host answers on, not only loopback: its node IP, a pod IP, a name that
//! resolves to one of them.

use std::io;
use std::net::IpAddr;

/// Whether `ip` is an address of one of this host's interfaces (IPv4-mapped IPv6 compared as
/// IPv4). The interfaces are listed afresh on every call (one `getifaddrs`): the question is
/// asked only for a destination port one of the agent's own listeners uses, and a fresh
/// list counts an address from the moment it exists (a DHCP lease, an added alias).
pub(crate) fn is_own_address(ip: IpAddr) -> io::Result<bool> {
    let ip = ip.to_canonical();
    Ok(if_addrs::get_if_addrs()?
        .iter()
        .any(|interface| interface.ip().to_canonical() == ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_interface_address_is_the_hosts_own_and_others_are_not() {
        let listed = if_addrs::get_if_addrs().unwrap();
        assert!(!listed.is_empty(), "a host has at least its loopback");
        for interface in &listed {
            assert!(is_own_address(interface.ip()).unwrap(), "{interface:?}");
        }
        assert!(is_own_address("127.0.0.1".parse().unwrap()).unwrap());
        assert!(is_own_address("::ffff:127.0.0.1".parse().unwrap()).unwrap());
        // Documentation addresses (RFC 5737, 3849) that no interface here carries.
        for other in ["203.0.113.77", "2001:db8::77"] {
            let ip: IpAddr = other.parse().unwrap();
            assert!(
                listed.iter().all(|i| i.ip() != ip),
                "{other} is configured here"
            );
            assert!(!is_own_address(ip).unwrap(), "{other}");
        }
    }
}
