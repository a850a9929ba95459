//! `AgentService.Connect`: admitting an agent stream and reading it until it ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::time::Duration;
use tether_grpc::{Code, LogText, Status};
use tether_proto::metadata::{self, Metadata};
use tether_proto::{Identifiers, Labels};
use tether_tunnel::{
    FlowConfig, Limits, Link, ResumeFailure, Role, SessionConfig, Transport, TransportEnd,
};
use tracing::Instrument;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::admission::{
    Admission, Claimant, MAX_AGENT_ID_BYTES, MAX_IDENTIFIERS, MAX_IDENTIFIERS_BYTES,
};
use super::binding::{Binding, Credential};
use super::call::AgentCall;
use super::resume::{HandOver, Registration, Resumable, Resumption};
use super::route::Route;
use super::session::AgentSession;
use super::token::AgentTokenAuth;
use crate::dial::Hub;
use crate::identity::AgentProof;
use crate::limits::SlotAdmission;
use crate::tenant::Side;

/// How long, after a frontend closed a connection, the agent's (or, for a forwarded one,
/// the peer server's) CLOSE_RSP may take.
pub(crate) const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// What every agent stream of this server is told, and how it is flow-controlled.
#[derive(Debug)]
pub(crate) struct AgentService {
    pub(crate) hub: Arc<Hub>,
    pub(crate) server_id: String,
    pub(crate) server_count: u32,
    pub(crate) flow: FlowConfig,
    /// `--backend-dial-timeout`: how long a dial waits for the agent's answer.
    pub(crate) dial_timeout: Duration,
    pub(crate) next_stream_id: AtomicU64,
    pub(crate) admission: Admission,
    /// `--agent-identity-binding`: what an agent's credential must prove.
    pub(crate) binding: Binding,
    pub(crate) limit_metrics: crate::limits::LimitMetrics,
    /// Bearer-token authentication of agents, when enabled.
    pub(crate) token_auth: Option<AgentTokenAuth>,
    /// `--resume-window` above zero: streams with tether agents survive a broken transport.
    pub(crate) resumable: Option<Arc<Resumable>>,
    /// `--dead-agent-timeout`: a busy stream whose agent sent nothing for this long ends at
    /// once, resumable or not (see `liveness`); `None` never.
    pub(crate) dead_agent_timeout: Option<Duration>,
    /// Every agent stream's task: a stream may outlive the connection it arrived on.
    pub(crate) streams: TaskTracker,
    /// Cancelled when the server stops: ends suspended streams at once.
    pub(crate) stop: CancellationToken,
}

impl AgentService {
    /// Serves one call on the agent listener; `connection` leaves its address's count of
    /// connections not yet admitted once the call's credential is admitted.
    pub(crate) async fn serve(self: Arc<Self>, call: AgentCall, connection: SlotAdmission) {
        if let Err(status) = call.check_method() {
            call.reject(&status).await;
            return;
        }
        let admitted = admit(call.metadata());
        let (agent_id, identifiers, labels) = match admitted {
            Ok(ok) => ok,
            Err(message) => {
                self.limit_metrics
                    .hit(crate::limits::Limit::BadAgentMetadata);
                if let Some(suppressed) = BAD_METADATA_WARNINGS.allow() {
                    tracing::warn!(message = %LogText(&message), suppressed, "refusing agent stream");
                }
                call.reject(&Status::new(Code::UNKNOWN, message)).await;
                return;
            }
        };
        let token = match &self.token_auth {
            Some(auth) => match auth.check(call.metadata(), call.peer().addr).await {
                Ok(principal) => Some(principal),
                Err(status) => {
                    self.limit_metrics.hit(crate::limits::Limit::AgentToken);
                    if let Some(suppressed) = TOKEN_WARNINGS.allow() {
                        tracing::warn!(
                            agent.id = %LogText(&agent_id),
                            peer = call.peer().addr.map(tracing::field::display),
                            suppressed,
                            "refusing agent stream: {}",
                            status.message
                        );
                    }
                    call.reject(&status).await;
                    return;
                }
            },
            None => None,
        };
        let token_user = match &token {
            Some(tether_grpc::Principal::Token { username, .. }) => Some(username.as_str()),
            _ => None,
        };
        let proof = AgentProof {
            peer: call.peer().clone(),
            token_user: token_user.map(str::to_owned),
        };
        // The generation the stream is admitted under; the stream's owner checks it again if
        // a reload comes before it joins its tenant.
        let running = self.hub.running();
        let tenant = match running.tenants.resolve(Side::Agent, proof.proof()) {
            Ok(tenant) => tenant.clone(),
            Err(why) => {
                if let Some(suppressed) = BAD_METADATA_WARNINGS.allow() {
                    tracing::warn!(agent.id = %LogText(&agent_id), suppressed, "refusing agent stream: {why}");
                }
                call.reject(&Status::new(Code::PERMISSION_DENIED, why))
                    .await;
                return;
            }
        };
        let credential = Credential::of(call.peer(), token.as_ref());
        if let Err(status) = self
            .binding
            .check(&agent_id, &identifiers, credential, call.peer())
            .await
        {
            call.reject(&status).await;
            return;
        }
        let claimant = Claimant {
            agent_id: &agent_id,
            principal: token.clone().unwrap_or_else(|| call.peer().principal()),
            proves_id: credential.proves_name(&agent_id),
            peer: call.peer(),
        };
        let claim = match self.admission.admit(&tenant.agent_ids, &claimant) {
            Ok(claim) => claim,
            Err(status) => {
                call.reject(&status).await;
                return;
            }
        };
        connection.admit();
        if claim.took_over {
            // The previous owner's streams are ending; no dial may reach them meanwhile.
            tenant.registry().remove_agent(&agent_id);
            self.hub.refresh_backend_gauges();
        }
        let flow = self
            .flow
            .negotiate(call.metadata().get(metadata::TETHER_FLOW));
        let resumable = self.resumable.clone().filter(|_| {
            flow.is_credit()
                && call.metadata().get(metadata::TETHER_RESUME)
                    == Some(metadata::TETHER_RESUME_VERSION)
        });
        let call = match (
            &resumable,
            call.metadata().get(metadata::TETHER_RESUME_FROM),
        ) {
            (Some(table), None) => {
                table.end_abandoned(&[], &agent_id, &tenant.name);
                call
            }
            (Some(table), Some(value)) => {
                let Some(asked) = tether_tunnel::parse_resume_from(value) else {
                    call.reject(&Status::new(
                        Code::INVALID_ARGUMENT,
                        format!("malformed {} header", metadata::TETHER_RESUME_FROM),
                    ))
                    .await;
                    return;
                };
                match table.hand_over(&asked, &agent_id, &tenant.name, call) {
                    HandOver::Taken => return,
                    HandOver::Busy(call) => {
                        call.reject(&Status::new(
                            Code::UNAVAILABLE,
                            "a resume of this stream is already under way",
                        ))
                        .await;
                        return;
                    }
                    HandOver::Unknown(call) => {
                        table.end_abandoned(&asked, &agent_id, &tenant.name);
                        tracing::info!(agent.id = %LogText(&agent_id), "agent asks to resume a stream this server does not know (it restarted, or the stream's resume window passed): starting a new one");
                        call
                    }
                }
            }
            _ => call,
        };
        let mut response = vec![
            (metadata::SERVER_ID, self.server_id.clone()),
            (metadata::SERVER_COUNT, self.server_count.to_string()),
            (metadata::TETHER_VERSION, tether_observe::VERSION.to_owned()),
        ];
        if flow.is_credit() {
            response.push(self.flow.announce());
        }
        let asks_reverse =
            call.metadata().get(metadata::TETHER_REVERSE) == Some(metadata::TETHER_REVERSE_VERSION);
        let control_plane = running
            .control_plane
            .for_tenant(&tenant.name)
            .filter(|_| asks_reverse);
        if control_plane.is_some() {
            response.push((
                metadata::TETHER_REVERSE,
                metadata::TETHER_REVERSE_VERSION.to_owned(),
            ));
        } else if asks_reverse {
            tracing::info!(agent.id = %LogText(&agent_id), tenant = %tenant.name, "agent offers control-plane connections, but reverse dials are off for its tenant (they are opt-in: --control-plane-endpoints=kubeconfig or HOST:PORT,..., or the tenant's control_plane_endpoints): declined");
        }
        let registration = resumable.map(|table| table.register(&agent_id, &tenant.name));
        let mut answer = response.clone();
        if let Some(r) = &registration {
            answer.push((metadata::TETHER_RESUME, r.token.clone()));
        }
        let keepalive = call.liveness().clone();
        let transport_name = call.transport_name();
        let version = agent_version(call.metadata());
        let transport = match call.accept(&answer).await {
            Ok(transport) => transport,
            Err(e) => {
                tracing::warn!(agent.id = %agent_id, error = %e, "could not answer agent stream");
                return;
            }
        };
        let hub = &self.hub;
        let session = Arc::new(AgentSession::new(
            agent_id,
            self.next_stream_id.fetch_add(1, Ordering::Relaxed),
            identifiers,
            labels,
            version,
            SessionConfig {
                role: Role::Server,
                flow,
                dial_timeout: self.dial_timeout,
                close_timeout: CLOSE_TIMEOUT,
                limits: Limits::default(),
                resumable: registration.is_some(),
                peering: false,
            },
            hub.metrics.clone(),
            hub.watch(&tenant),
            keepalive,
            transport_name,
            &self.server_id,
            control_plane.clone(),
            running.control_plane.max_connections_per_stream,
            proof,
        ));
        let owner = StreamOwner {
            service: self.clone(),
            session,
            tenant: tenant.state().clone(),
            admitted_under: running.generation,
            response,
            registration,
            claim,
        };
        tracing::info!(agent.id = %owner.session.agent_id, stream = owner.session.stream_id, transport = transport_name, credit = flow.is_credit(), reverse = control_plane.is_some(), resumable = owner.registration.is_some(), tenant = %owner.tenant.name, "agent connected");
        // The stream outlives this call when it resumes on another: it has its own task.
        self.streams.spawn(owner.run(transport));
    }
}

/// The task that owns one agent stream, across the transports it runs on.
#[derive(Debug)]
struct StreamOwner {
    service: Arc<AgentService>,
    session: Arc<AgentSession>,
    /// The tenant's state, which outlives the generation the stream was admitted under.
    tenant: Arc<crate::tenant::TenantState>,
    /// The routing file's generation the stream was admitted under.
    admitted_under: u64,
    /// The response headers a resumed stream is answered with, besides its token.
    response: Vec<(&'static str, String)>,
    /// Set on a resumable stream.
    registration: Option<Registration>,
    /// The hold on the agent ID; the stream ends when another principal takes the ID over.
    claim: super::admission::Claim,
}

/// Why a stream whose agent ID was taken over ends.
const EVICTED: &str = "the agent ID was taken over by an agent whose credential proves it \
    (a certificate naming it, or a token bound to that node), and this stream's credential \
    does not";

impl StreamOwner {
    /// The stream's task. Not an `async fn`: that would keep a second copy of `self` for the
    /// stream's life, as its argument beside the body's own.
    fn run(mut self, transport: Transport) -> impl Future<Output = ()> + Send + 'static {
        let span = tracing::info_span!("agent", agent.id = %self.session.agent_id, stream = self.session.stream_id);
        let hub = self.service.hub.clone();
        let stream_gauge = hub.metrics.grpc_stream("Connect");
        stream_gauge.inc();
        async move {
            let joined = self.join();
            if joined.is_ok() {
                self.tenant.registry().add(
                    Route::Local(self.session.clone()),
                    &self.session.identifiers,
                );
                hub.refresh_backend_gauges();
            }
            let reason = match joined {
                Ok(()) => self.serve(transport).await,
                Err(why) => {
                    // The stream ends at once: its transport goes with it.
                    drop(transport);
                    why
                }
            };
            self.tenant.leave(self.session.stream_id);
            // No new dial may pick a stream that has ended.
            let gone = {
                let mut registry = self.tenant.registry();
                registry.remove(&self.session.agent_id, self.session.stream_id);
                registry.first_local(&self.session.agent_id).is_none()
            };
            hub.refresh_backend_gauges();
            let link = &self.session.link;
            link.close(&reason);
            self.session.reverse_tasks.close();
            self.session.reverse_tasks.wait().await;
            tracing::info!(%reason, "agent disconnected");
            if gone {
                hub.metrics.forget_agent(&self.session.agent_id);
            }
            stream_gauge.dec();
        }
        .instrument(span)
    }

    /// Counts the stream among its tenant's, where every later reload finds it, and checks it
    /// against a generation that came after its admission; `Err` when that generation took
    /// its tenant away.
    fn join(&self) -> Result<(), String> {
        let hub = &self.service.hub;
        let now = self
            .tenant
            .join(&self.session, || hub.running().generation)?;
        if now == self.admitted_under {
            return Ok(());
        }
        let running = hub.running();
        match running
            .tenants
            .owner_of(crate::tenant::Side::Agent, self.session.proof.proof())
        {
            Ok(owner) if owner.name == self.tenant.name => Ok(()),
            Ok(owner) => Err(crate::tenant::moved(
                self.session.proof.proof(),
                &self.tenant.name,
                &owner.name,
                running.generation,
            )),
            Err(why) => Err(format!(
                "{why} in the routing file (generation {})",
                running.generation
            )),
        }
    }

    /// Runs the stream's transports until it ends for good; returns why.
    async fn serve(&mut self, mut transport: Transport) -> String {
        let link = self.session.link.clone();
        let stop = self.service.stop.clone();
        let evicted = self.claim.evicted.clone();
        let metrics = &self.service.hub.metrics.resume;
        let dead_after = self.service.dead_agent_timeout;
        let session = self.session.clone();
        loop {
            // Boxed: it is rare, and inline it would cost every stream its 232 bytes.
            let mut taken_over: Option<Box<Resumption>> = None;
            let mut silent = false;
            let resumptions = self.registration.as_mut().map(|r| &mut r.resumptions);
            let end = link
                .run_transport(transport, async {
                    tokio::select! {
                        () = stop.cancelled() => TransportEnd::Final("server stopping".into()),
                        () = evicted.cancelled() => TransportEnd::Final(EVICTED.into()),
                        why = session.retired() => TransportEnd::Final(why),
                        Some(r) = next_resumption(resumptions, &link) => {
                            taken_over = Some(Box::new(r));
                            TransportEnd::Broken("the agent resumed the stream on a new connection".into())
                        }
                        quiet = super::liveness::silent_agent(&self.session, dead_after) => {
                            silent = true;
                            TransportEnd::Broken(format!(
                                "the agent sent nothing for {quiet:.1?} while it had connections or dials \
                                 (--dead-agent-timeout {:?}): its node or process is gone, or the network \
                                 to it is cut",
                                dead_after.unwrap_or_default()
                            ))
                        }
                    }
                })
                .await;
            self.session.keepalive.watch(false);
            let TransportEnd::Broken(why) = end else {
                return end.reason().to_owned();
            };
            if silent {
                // The timeout was the wait: a resume window on top would hold its
                // connections longer than a dead agent deserves.
                if self.registration.is_some() {
                    metrics.failed(ResumeFailure::PeerSilent);
                }
                return why;
            }
            let Some(registration) = self.registration.as_mut() else {
                return why;
            };
            if stop.is_cancelled() || evicted.is_cancelled() {
                return why;
            }
            let window = registration.window();
            let Some(suspension) = link.suspend(window, metrics) else {
                return why;
            };
            self.tenant
                .registry()
                .remove(&self.session.agent_id, self.session.stream_id);
            self.service.hub.refresh_backend_gauges();
            tracing::info!(%why, ?window, "agent stream broke; its connections wait for it to resume");
            registration.set_suspended(true);
            let abandoned = registration.abandoned.clone();
            let next = match taken_over {
                Some(r) => Some(*r),
                None => link
                    .wait_resumed(async {
                        tokio::select! {
                            () = stop.cancelled() => None,
                            () = abandoned.cancelled() => None,
                            () = evicted.cancelled() => None,
                            _ = session.retired() => None,
                            r = registration.resumptions.recv() => r,
                        }
                    })
                    .await
                    .flatten(),
            };
            registration.set_suspended(false);
            let Some(Resumption {
                call,
                agent_received,
            }) = next
            else {
                let (failure, ended) = if stop.is_cancelled() {
                    (ResumeFailure::Stopping, "server stopping".to_owned())
                } else if let Some(why) = self.session.retiring() {
                    (ResumeFailure::Unknown, why.to_owned())
                } else if evicted.is_cancelled() {
                    (ResumeFailure::Unknown, EVICTED.to_owned())
                } else if registration.abandoned.is_cancelled() {
                    (
                        ResumeFailure::Unknown,
                        "the agent connected again without this stream (it restarted)".to_owned(),
                    )
                } else {
                    (
                        ResumeFailure::WindowExpired,
                        format!("not resumed within --resume-window {window:?}"),
                    )
                };
                metrics.failed(failure);
                return format!("{ended}; the stream broke: {why}");
            };
            // Nothing arrives while suspended: this count is final until the new transport.
            let received = link.resume_point().unwrap_or(0);
            if let Err(e) = link.resume(agent_received, suspension, metrics) {
                metrics.failed(ResumeFailure::BadSequence);
                call.reject(&Status::new(
                    Code::FAILED_PRECONDITION,
                    format!("cannot resume: {e}"),
                ))
                .await;
                return format!("cannot resume: {e}");
            }
            let mut answer = self.response.clone();
            answer.push((metadata::TETHER_RESUME, registration.token.clone()));
            answer.push((metadata::TETHER_RESUMED, received.to_string()));
            self.session.keepalive.replace(call.liveness().clone());
            self.session.set_transport(call.transport_name());
            transport = match call.accept(&answer).await {
                Ok(transport) => transport,
                Err(e) => return format!("answering the resumed stream: {e}"),
            };
            // A stream a reload retired takes no new dial, resumed or not.
            if self.session.retiring().is_none() {
                self.tenant.registry().add(
                    Route::Local(self.session.clone()),
                    &self.session.identifiers,
                );
                self.service.hub.refresh_backend_gauges();
            }
            tracing::info!("agent stream resumed");
        }
    }
}

/// The next resumption of a resumable stream whose transport still works; never for one
/// that is not resumable. A request the stream's log cannot serve is refused and the
/// working transport kept: the agent made it before it acknowledged more on this transport
/// (a reconnect racing its own resume), and taking it would end a stream that works.
async fn next_resumption(
    resumptions: Option<&mut tokio::sync::mpsc::Receiver<Resumption>>,
    link: &Link,
) -> Option<Resumption> {
    let Some(resumptions) = resumptions else {
        return std::future::pending().await;
    };
    loop {
        let resumption = resumptions.recv().await?;
        let Err(e) = link.inspect(|s| s.can_resume(resumption.agent_received)) else {
            return Some(resumption);
        };
        tracing::warn!(error = %e, "refused a resume of this stream on a new connection: its current connection works and the request is older than what the agent acknowledged on it");
        let status = Status::new(
            Code::FAILED_PRECONDITION,
            format!("cannot resume: {e}; the stream goes on over its current connection"),
        );
        resumption.call.reject(&status).await;
    }
}

/// Refused agent tokens are logged at most once a second, whoever sends them.
static TOKEN_WARNINGS: crate::warn_limit::WarnLimit =
    crate::warn_limit::WarnLimit::new(std::time::Duration::from_secs(1));

/// Malformed agent metadata is logged at most once a second, whoever sends it.
static BAD_METADATA_WARNINGS: crate::warn_limit::WarnLimit =
    crate::warn_limit::WarnLimit::new(std::time::Duration::from_secs(1));

/// The release a tether agent announced: one well-formed value. Anything else (upstream's
/// agents send nothing) is `None`, so the stream counts as upstream's; a version is only
/// shown, never trusted, and refusing an agent for it would help nobody.
fn agent_version(headers: &Metadata) -> Option<String> {
    let mut values = headers.get_all(metadata::TETHER_VERSION);
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    let version = metadata::text(value)?;
    metadata::is_version(version).then(|| version.to_owned())
}

/// Checks the agent's metadata: exactly one `agentid`, at most one `agentidentifiers` and
/// at most one `tether-labels`.
fn admit(headers: &Metadata) -> Result<(String, Identifiers, Labels), String> {
    let mut ids = headers.get_all(metadata::AGENT_ID);
    let (Some(id), None) = (ids.next(), ids.next()) else {
        return Err("expected one agent ID in the context".into());
    };
    let id = metadata::text(id)
        .filter(|id| !id.is_empty())
        .ok_or("agent ID is empty or not text")?;
    if id.len() > MAX_AGENT_ID_BYTES {
        return Err(format!(
            "agent ID is {} bytes, more than the {MAX_AGENT_ID_BYTES} allowed",
            id.len()
        ));
    }
    let mut idents = headers.get_all(metadata::AGENT_IDENTIFIERS);
    let identifiers = match (idents.next(), idents.next()) {
        (None, _) => Identifiers::default(),
        (Some(v), None) => {
            if v.len() > MAX_IDENTIFIERS_BYTES {
                return Err(format!(
                    "agent identifiers are {} bytes, more than the {MAX_IDENTIFIERS_BYTES} allowed",
                    v.len()
                ));
            }
            let ids =
                Identifiers::parse(metadata::text(v).ok_or("agent identifiers are not text")?)?;
            let count = ids.hosts.len() + ids.ipv4.len() + ids.ipv6.len() + ids.cidrs.len();
            if count > MAX_IDENTIFIERS {
                return Err(format!(
                    "{count} agent identifiers, more than the {MAX_IDENTIFIERS} allowed"
                ));
            }
            ids
        }
        (Some(_), Some(_)) => return Err("expected at most one set of agent identifiers".into()),
    };
    let mut labels = headers.get_all(metadata::TETHER_LABELS);
    let labels = match (labels.next(), labels.next()) {
        (None, _) => Labels::default(),
        (Some(v), None) if v.len() <= MAX_IDENTIFIERS_BYTES => {
            Labels::parse(metadata::text(v).ok_or("agent labels are not text")?)?
        }
        (Some(_), None) => return Err("agent labels are too long".into()),
        (Some(_), Some(_)) => return Err("expected at most one set of agent labels".into()),
    };
    Ok((id.to_owned(), identifiers, labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_version_is_one_short_version_or_none() {
        let mut h = Metadata::default();
        assert_eq!(agent_version(&h), None, "upstream agents send none");
        h.push("tether-version", "0.1.0-rc.1+abc");
        assert_eq!(agent_version(&h).as_deref(), Some("0.1.0-rc.1+abc"));
        h.push("tether-version", "0.2.0");
        assert_eq!(agent_version(&h), None, "two versions");
        for bad in ["", "0.1.0 (commit x)", &"9".repeat(65)] {
            let mut h = Metadata::default();
            h.push("tether-version", bad.to_owned());
            assert_eq!(agent_version(&h), None, "{bad:?}");
        }
    }

    #[test]
    fn admission_rules() {
        let mut h = Metadata::default();
        assert!(admit(&h).is_err(), "no agent id");
        h.push("agentid", "a");
        assert_eq!(admit(&h).unwrap().0, "a");
        h.push("agentidentifiers", "host=n1");
        assert_eq!(admit(&h).unwrap().1.hosts, ["n1"]);
        h.push("tether-labels", "zone=a,region=r");
        assert_eq!(admit(&h).unwrap().2.zone.as_deref(), Some("a"));
        h.push("agentid", "b");
        assert!(admit(&h).is_err(), "two agent ids");

        let mut h = Metadata::default();
        h.push("agentid", "x".repeat(254));
        assert!(admit(&h).unwrap_err().contains("254 bytes"));
        let mut h = Metadata::default();
        h.push("agentid", "a");
        let many = vec!["host=n"; 65].join("&");
        h.push("agentidentifiers", many);
        assert!(admit(&h).unwrap_err().contains("65 agent identifiers"));
    }
}
