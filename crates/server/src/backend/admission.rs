//! Which agent streams are admitted: metadata limits, identity binding, agent count.
//!
//! An agent chooses its own ID and identifiers, so on their own they prove nothing. What
//! the listener proved (the client certificate) decides instead:
//! - a second live stream for an agent ID is refused unless it comes from the same principal
//!   (certificate names) as the streams already there, so one node's certificate cannot
//!   capture traffic meant for another node's agent;
//! - with `match_certificate`, the ID and every `host=`/`ipv4=`/`ipv6=` identifier must be
//!   names of the certificate itself.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tether_grpc::{Code, LogText, PeerIdentity, Principal, Status};
use tether_proto::Identifiers;

use crate::limits::{Limit, LimitMetrics};
use crate::warn_limit::WarnLimit;

/// Longest agent ID accepted: a DNS name (253 bytes) or a UUID fits.
pub(crate) const MAX_AGENT_ID_BYTES: usize = 253;
/// Longest `agentidentifiers` value accepted.
pub(crate) const MAX_IDENTIFIERS_BYTES: usize = 4096;
/// Most entries in `agentidentifiers`.
pub(crate) const MAX_IDENTIFIERS: usize = 64;

/// Admission rules and the live agent IDs with their owners.
#[derive(Debug)]
pub(crate) struct Admission {
    match_certificate: bool,
    max_agents: usize,
    owners: Mutex<HashMap<String, Owner>>,
    metrics: LimitMetrics,
    warn: WarnLimit,
}

#[derive(Debug)]
struct Owner {
    principal: Principal,
    streams: usize,
}

/// An admitted stream's hold on its agent ID; released on drop.
#[derive(Debug)]
pub(crate) struct Claim {
    admission: Arc<Admission>,
    agent_id: String,
}

impl Admission {
    pub(crate) fn new(match_certificate: bool, max_agents: usize, metrics: LimitMetrics) -> Self {
        Self {
            match_certificate,
            max_agents,
            owners: Mutex::default(),
            metrics,
            warn: WarnLimit::new(Duration::from_secs(1)),
        }
    }

    /// Admits a stream of `agent_id` from `peer`, or returns the status to refuse it with.
    /// `token` is the principal a bearer token proved, which then owns the agent ID in place
    /// of the peer's (absent) certificate.
    pub(crate) fn admit(
        self: &Arc<Self>,
        agent_id: &str,
        identifiers: &Identifiers,
        peer: &PeerIdentity,
        token: Option<Principal>,
    ) -> Result<Claim, Status> {
        if self.match_certificate {
            self.check_names(agent_id, identifiers, peer)?;
        }
        let principal = token.unwrap_or_else(|| peer.principal());
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        let known = owners.len();
        match owners.get_mut(agent_id) {
            Some(owner) if owner.principal != principal => {
                self.metrics.hit(Limit::DuplicateAgentId);
                if let Some(suppressed) = self.warn.allow() {
                    tracing::warn!(
                        agent.id = %LogText(agent_id),
                        peer = ?peer.addr,
                        claimed_by = %principal,
                        owned_by = %owner.principal,
                        suppressed,
                        "refusing a second stream for a live agent ID from a different identity"
                    );
                }
                return Err(Status::new(
                    Code::ALREADY_EXISTS,
                    format!(
                        "agent ID {} is connected with a different identity ({}); refusing {}",
                        LogText(agent_id),
                        owner.principal,
                        principal
                    ),
                ));
            }
            Some(owner) => owner.streams += 1,
            None if known >= self.max_agents => {
                self.metrics.hit(Limit::Agents);
                return Err(Status::new(
                    Code::RESOURCE_EXHAUSTED,
                    format!("this server already has {known} agents (--max-agents)"),
                ));
            }
            None => {
                owners.insert(
                    agent_id.to_owned(),
                    Owner {
                        principal,
                        streams: 1,
                    },
                );
            }
        }
        Ok(Claim {
            admission: self.clone(),
            agent_id: agent_id.to_owned(),
        })
    }

    /// `--match-agent-identity-to-certificate`: the ID and identifiers are certificate names.
    fn check_names(
        &self,
        agent_id: &str,
        identifiers: &Identifiers,
        peer: &PeerIdentity,
    ) -> Result<(), Status> {
        let refuse = |what: String| {
            self.metrics.hit(Limit::AgentIdentity);
            if let Some(suppressed) = self.warn.allow() {
                tracing::warn!(peer = ?peer.addr, suppressed, "refusing agent stream: {what}");
            }
            Err(Status::new(Code::PERMISSION_DENIED, what))
        };
        let Some(names) = &peer.certificate else {
            return refuse("no client certificate to match the agent ID against".into());
        };
        if !names.has_name(agent_id) {
            return refuse(format!(
                "agent ID {} is not a name (CN or SAN) of the client certificate",
                LogText(agent_id)
            ));
        }
        if let Some(host) = identifiers.hosts.iter().find(|h| !names.has_name(h)) {
            return refuse(format!(
                "identifier host={} is not a name of the client certificate",
                LogText(host)
            ));
        }
        let ip_ok = |ip: &String| ip.parse::<IpAddr>().is_ok_and(|ip| names.has_ip(ip));
        if let Some(ip) = identifiers
            .ipv4
            .iter()
            .chain(&identifiers.ipv6)
            .find(|ip| !ip_ok(ip))
        {
            return refuse(format!(
                "identifier {} is not an IP address SAN of the client certificate",
                LogText(ip)
            ));
        }
        Ok(())
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut owners = self
            .admission
            .owners
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(owner) = owners.get_mut(&self.agent_id) {
            owner.streams -= 1;
            if owner.streams == 0 {
                owners.remove(&self.agent_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tether_grpc::{CertificateNames, PeerTransport};

    use super::*;

    fn peer(cn: &str, dns: &[&str], ips: &[&str]) -> PeerIdentity {
        PeerIdentity {
            transport: PeerTransport::Tls,
            addr: None,
            certificate: Some(CertificateNames {
                common_name: Some(cn.into()),
                dns: dns.iter().map(|d| (*d).into()).collect(),
                ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
                uris: vec![],
            }),
            unix: None,
        }
    }

    fn admission(match_certificate: bool, max_agents: usize) -> Arc<Admission> {
        let registry = tether_observe::metrics::Registry::new();
        Arc::new(Admission::new(
            match_certificate,
            max_agents,
            LimitMetrics::register(&registry),
        ))
    }

    #[test]
    fn same_identity_may_reconnect_another_may_not() {
        let a = admission(false, 10);
        let none = Identifiers::default();
        let first = a
            .admit("n1", &none, &peer("node-1", &[], &[]), None)
            .unwrap();
        let again = a
            .admit("n1", &none, &peer("node-1", &[], &[]), None)
            .unwrap();
        let err = a
            .admit("n1", &none, &peer("node-2", &[], &[]), None)
            .unwrap_err();
        assert_eq!(err.code, Code::ALREADY_EXISTS, "{err}");
        drop((first, again));
        // Once the owner is gone the ID is free again.
        a.admit("n1", &none, &peer("node-2", &[], &[]), None)
            .unwrap();
    }

    #[test]
    fn token_principals_own_agent_ids_per_node() {
        let a = admission(false, 10);
        let none = Identifiers::default();
        let anonymous = PeerIdentity::unknown();
        let on = |node: &str| {
            Some(Principal::Token {
                username: "system:serviceaccount:kube-system:agent".into(),
                node: Some(node.into()),
            })
        };
        let _first = a.admit("n1", &none, &anonymous, on("node-1")).unwrap();
        a.admit("n1", &none, &anonymous, on("node-1")).unwrap();
        let err = a.admit("n1", &none, &anonymous, on("node-2")).unwrap_err();
        assert_eq!(err.code, Code::ALREADY_EXISTS, "{err}");
    }

    #[test]
    fn agent_count_is_capped() {
        let a = admission(false, 1);
        let none = Identifiers::default();
        let _one = a.admit("a", &none, &peer("x", &[], &[]), None).unwrap();
        let err = a.admit("b", &none, &peer("x", &[], &[]), None).unwrap_err();
        assert_eq!(err.code, Code::RESOURCE_EXHAUSTED);
    }

    #[test]
    fn certificate_match_checks_id_hosts_and_ips() {
        let a = admission(true, 10);
        let p = peer("node-1", &["node-1.example"], &["10.0.0.1"]);
        let ids = |q| Identifiers::parse(q).unwrap();
        a.admit(
            "node-1",
            &ids("host=node-1.example&ipv4=10.0.0.1"),
            &p,
            None,
        )
        .unwrap();
        for (id, q) in [
            ("node-2", ""),
            ("node-1", "host=node-2"),
            ("node-1", "ipv4=10.0.0.2"),
            ("node-1", "ipv6=not-an-ip"),
        ] {
            let err = a.admit(id, &ids(q), &p, None).unwrap_err();
            assert_eq!(err.code, Code::PERMISSION_DENIED, "{id} {q}: {err}");
        }
        let anonymous = PeerIdentity::unknown();
        assert!(a.admit("node-1", &ids(""), &anonymous, None).is_err());
    }
}
