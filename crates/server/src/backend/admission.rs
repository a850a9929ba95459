//! Which agent streams are admitted: metadata limits, agent-ID ownership, agent count.
//!
//! Each tenant has its own table of live agent IDs ([`AgentTable`]) and its own
//! `--max-agents`, so one tenant's agents can neither squat another's node names nor fill
//! its table. A live agent ID belongs to the principal (certificate names, or a token's user
//! and node) that holds it, and ownership is decided by identity, not by arrival order:
//! - a claimant whose credential proves the ID (a certificate naming it, a token bound to
//!   that node) takes it over from a holder whose credential does not: the holder's streams
//!   end, a suspended one included, so whoever took the ID while its node was away cannot
//!   lock the node out when it returns;
//! - otherwise a second principal is refused (`ALREADY_EXISTS`), so one node's credential
//!   cannot queue behind another node's agent ID and capture its traffic later.
//!
//! What a stream's identifiers must prove is [`super::binding`]'s concern.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tether_grpc::{Code, LogText, PeerIdentity, Principal, Status};
use tokio_util::sync::CancellationToken;

use crate::limits::{Limit, LimitMetrics};
use crate::warn_limit::WarnLimit;

/// Longest agent ID accepted: a DNS name (253 bytes) or a UUID fits.
pub(crate) const MAX_AGENT_ID_BYTES: usize = 253;
/// Longest `agentidentifiers` value accepted.
pub(crate) const MAX_IDENTIFIERS_BYTES: usize = 4096;
/// Most entries in `agentidentifiers`.
pub(crate) const MAX_IDENTIFIERS: usize = 64;

/// The admission rules every tenant's table is held to.
#[derive(Debug)]
pub(crate) struct Admission {
    /// `--max-agents`: distinct live agent IDs per tenant.
    max_agents: usize,
    metrics: LimitMetrics,
    warn: WarnLimit,
}

/// One tenant's live agent IDs with their owners.
#[derive(Debug, Default)]
pub(crate) struct AgentTable {
    owners: Mutex<Owners>,
}

#[derive(Debug, Default)]
struct Owners {
    by_id: HashMap<String, Owner>,
    /// Tells an evicted owner's claims from its successor's.
    next_generation: u64,
}

#[derive(Debug)]
struct Owner {
    principal: Principal,
    /// Whether the owner's credential proves the agent ID itself.
    proves_id: bool,
    streams: usize,
    generation: u64,
    /// Cancelled when a claimant that proves the ID takes it over.
    evicted: CancellationToken,
}

/// Who asks for an agent ID.
#[derive(Debug)]
pub(crate) struct Claimant<'a> {
    pub(crate) agent_id: &'a str,
    pub(crate) principal: Principal,
    /// Its credential names the agent ID (see `Credential::proves_name`).
    pub(crate) proves_id: bool,
    pub(crate) peer: &'a PeerIdentity,
}

/// An admitted stream's hold on its agent ID; released on drop.
#[derive(Debug)]
pub(crate) struct Claim {
    table: Arc<AgentTable>,
    agent_id: String,
    generation: u64,
    /// Cancelled when another principal took the agent ID over: the stream must end.
    pub(crate) evicted: CancellationToken,
    /// This claim took the ID over: the previous owner's streams are to be unregistered.
    pub(crate) took_over: bool,
}

impl AgentTable {
    fn lock(&self) -> MutexGuard<'_, Owners> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Owners {
    fn insert(&mut self, agent_id: &str, claimant: &Claimant<'_>) -> (u64, CancellationToken) {
        let generation = self.next_generation;
        self.next_generation += 1;
        let evicted = CancellationToken::new();
        self.by_id.insert(
            agent_id.to_owned(),
            Owner {
                principal: claimant.principal.clone(),
                proves_id: claimant.proves_id,
                streams: 1,
                generation,
                evicted: evicted.clone(),
            },
        );
        (generation, evicted)
    }
}

impl Admission {
    /// Logs (at most once a second) a claim of an agent ID that another identity holds.
    fn warn_conflict(
        &self,
        agent_id: &str,
        claimant: &Claimant<'_>,
        owner: &Principal,
        what: &'static str,
    ) {
        if let Some(suppressed) = self.warn.allow() {
            tracing::warn!(
                agent.id = %LogText(agent_id),
                peer = claimant.peer.addr.map(tracing::field::display),
                claimed_by = %claimant.principal,
                owned_by = %owner,
                suppressed,
                "{what}"
            );
        }
    }

    pub(crate) fn new(max_agents: usize, metrics: LimitMetrics) -> Self {
        Self {
            max_agents,
            metrics,
            warn: WarnLimit::new(Duration::from_secs(1)),
        }
    }

    /// Admits a stream of `claimant` into `table` (its tenant's), or returns the status to
    /// refuse it with.
    pub(crate) fn admit(
        &self,
        table: &Arc<AgentTable>,
        claimant: &Claimant<'_>,
    ) -> Result<Claim, Status> {
        let agent_id = claimant.agent_id;
        let mut owners = table.lock();
        let known = owners.by_id.len();
        let claim = |generation, evicted, took_over| Claim {
            table: table.clone(),
            agent_id: agent_id.to_owned(),
            generation,
            evicted,
            took_over,
        };
        match owners.by_id.get_mut(agent_id) {
            Some(owner) if owner.principal == claimant.principal => {
                owner.streams += 1;
                Ok(claim(owner.generation, owner.evicted.clone(), false))
            }
            Some(owner) if claimant.proves_id && !owner.proves_id => {
                owner.evicted.cancel();
                self.warn_conflict(
                    agent_id,
                    claimant,
                    &owner.principal,
                    "an agent whose credential proves the agent ID takes it over from one whose credential does not; ending the previous owner's streams",
                );
                let (generation, evicted) = owners.insert(agent_id, claimant);
                Ok(claim(generation, evicted, true))
            }
            Some(owner) => {
                self.metrics.hit(Limit::DuplicateAgentId);
                self.warn_conflict(
                    agent_id,
                    claimant,
                    &owner.principal,
                    "refusing a second stream for a live agent ID from a different identity",
                );
                Err(Status::new(
                    Code::ALREADY_EXISTS,
                    format!(
                        "agent ID {} is connected with a different identity ({}); refusing {} \
                         (only a credential that proves the agent ID, a certificate naming it \
                         or a token bound to that node, takes over an ID whose holder's does not)",
                        LogText(agent_id),
                        owner.principal,
                        claimant.principal
                    ),
                ))
            }
            None if known >= self.max_agents => {
                self.metrics.hit(Limit::Agents);
                Err(Status::new(
                    Code::RESOURCE_EXHAUSTED,
                    format!("this tenant already has {known} agents (--max-agents, per tenant)"),
                ))
            }
            None => {
                let (generation, evicted) = owners.insert(agent_id, claimant);
                Ok(claim(generation, evicted, false))
            }
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut owners = self.table.lock();
        let Some(owner) = owners.by_id.get_mut(&self.agent_id) else {
            return;
        };
        // An evicted owner's claims no longer count: the ID has a new owner.
        if owner.generation != self.generation {
            return;
        }
        owner.streams -= 1;
        if owner.streams == 0 {
            owners.by_id.remove(&self.agent_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use tether_grpc::{CertificateNames, PeerTransport};

    use super::*;

    fn peer(cn: &str) -> PeerIdentity {
        PeerIdentity {
            transport: PeerTransport::Tls,
            addr: None,
            certificate: Some(CertificateNames {
                common_name: Some(cn.into()),
                ..Default::default()
            }),
            unix: None,
        }
    }

    fn admission(max_agents: usize) -> Admission {
        let registry = tether_observe::metrics::Registry::new();
        Admission::new(max_agents, LimitMetrics::register(&registry))
    }

    /// `agent_id` claimed by the certificate `cn`, which proves the ID when they are equal.
    fn by_cert(
        a: &Admission,
        table: &Arc<AgentTable>,
        agent_id: &str,
        cn: &str,
    ) -> Result<Claim, Status> {
        let peer = peer(cn);
        a.admit(
            table,
            &Claimant {
                agent_id,
                principal: peer.principal(),
                proves_id: agent_id == cn,
                peer: &peer,
            },
        )
    }

    fn count(table: &AgentTable) -> usize {
        table.lock().by_id.len()
    }

    #[test]
    fn same_identity_may_reconnect_another_may_not() {
        let (a, t) = (admission(10), Arc::default());
        let first = by_cert(&a, &t, "n1", "node-1").unwrap();
        let again = by_cert(&a, &t, "n1", "node-1").unwrap();
        let err = by_cert(&a, &t, "n1", "node-2").unwrap_err();
        assert_eq!(err.code, Code::ALREADY_EXISTS, "{err}");
        drop((first, again));
        // Once the owner is gone the ID is free again.
        by_cert(&a, &t, "n1", "node-2").unwrap();
    }

    #[test]
    fn a_prover_takes_the_id_from_a_squatter_and_not_the_other_way() {
        let (a, t) = (admission(10), Arc::default());
        let squatter = by_cert(&a, &t, "node-1", "node-2").unwrap();
        let squatter_again = by_cert(&a, &t, "node-1", "node-2").unwrap();
        let real = by_cert(&a, &t, "node-1", "node-1").unwrap();
        assert!(real.took_over && !squatter.took_over);
        assert!(squatter.evicted.is_cancelled() && squatter_again.evicted.is_cancelled());
        assert!(!real.evicted.is_cancelled());
        // The squatter's leftover claims do not release the new owner's hold.
        drop((squatter, squatter_again));
        assert_eq!(count(&t), 1);
        let err = by_cert(&a, &t, "node-1", "node-2").unwrap_err();
        assert_eq!(err.code, Code::ALREADY_EXISTS, "{err}");
        assert!(err.message.contains("proves the agent ID"), "{err}");
        // A second prover does not take it from the first.
        let other = peer("node-1");
        let mut renamed = other.clone();
        renamed.certificate.as_mut().unwrap().dns = vec!["node-1.example".into()];
        let err = a
            .admit(
                &t,
                &Claimant {
                    agent_id: "node-1",
                    principal: renamed.principal(),
                    proves_id: true,
                    peer: &renamed,
                },
            )
            .unwrap_err();
        assert_eq!(err.code, Code::ALREADY_EXISTS);
        drop(real);
        assert_eq!(count(&t), 0, "the ID is free once its owner left");
    }

    #[test]
    fn token_principals_own_agent_ids_per_node() {
        let (a, t) = (admission(10), Arc::default());
        let anonymous = PeerIdentity::unknown();
        let on = |node: &str| Claimant {
            agent_id: "n1",
            principal: Principal::Token {
                username: "system:serviceaccount:kube-system:agent".into(),
                node: Some(node.into()),
            },
            proves_id: node == "n1",
            peer: &anonymous,
        };
        let _first = a.admit(&t, &on("node-1")).unwrap();
        a.admit(&t, &on("node-1")).unwrap();
        let err = a.admit(&t, &on("node-2")).unwrap_err();
        assert_eq!(err.code, Code::ALREADY_EXISTS, "{err}");
        let owner = a.admit(&t, &on("n1")).unwrap();
        assert!(
            owner.took_over,
            "the token bound to node n1 proves agent ID n1"
        );
    }

    #[test]
    fn agent_count_is_capped_per_table() {
        let a = admission(1);
        let (t1, t2) = (Arc::default(), Arc::default());
        let _one = by_cert(&a, &t1, "a", "x").unwrap();
        let err = by_cert(&a, &t1, "b", "x").unwrap_err();
        assert_eq!(err.code, Code::RESOURCE_EXHAUSTED);
        // Another tenant's table has its own IDs and its own cap.
        let _other = by_cert(&a, &t2, "a", "y").unwrap();
    }
}
