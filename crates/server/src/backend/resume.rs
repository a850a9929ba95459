//! The server's resumable agent streams, by token: a new `Connect` call that names one in
//! `tether-resume-from` is handed to the task that owns the stream, which continues the
//! stream's session on it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::call::AgentCall;

/// A `Connect` call that continues a suspended (or about to be suspended) stream.
#[derive(Debug)]
pub(crate) struct Resumption {
    pub(crate) call: AgentCall,
    /// How many of the server's packets the agent received in the session.
    pub(crate) agent_received: u64,
}

/// Who may continue a stream: the same agent ID in the same tenant. (The admission of the
/// new call already proved the identity that owns the agent ID.)
#[derive(Debug)]
struct Entry {
    agent_id: String,
    tenant: String,
    handover: mpsc::Sender<Resumption>,
    suspended: Arc<AtomicBool>,
    abandoned: CancellationToken,
}

/// Resumable streams of this server, and how long a broken one waits (`--resume-window`).
#[derive(Debug)]
pub(crate) struct Resumable {
    pub(crate) window: Duration,
    streams: Mutex<HashMap<String, Entry>>,
}

/// A stream's place in the table; removed when the stream ends for good.
#[derive(Debug)]
pub(crate) struct Registration {
    table: Arc<Resumable>,
    pub(crate) token: String,
    pub(crate) resumptions: mpsc::Receiver<Resumption>,
    suspended: Arc<AtomicBool>,
    /// Cancelled when the agent opened a new stream without asking for this suspended one:
    /// it no longer has it (it restarted, or gave up on it).
    pub(crate) abandoned: CancellationToken,
}

impl Registration {
    /// How long the stream waits for a resume when suspended (`--resume-window`).
    pub(crate) fn window(&self) -> Duration {
        self.table.window
    }

    /// Marks the stream suspended (its agent may resume it) or running.
    pub(crate) fn set_suspended(&self, suspended: bool) {
        self.suspended.store(suspended, Ordering::Release);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.table.lock().remove(&self.token);
    }
}

/// What [`Resumable::hand_over`] did with a call.
#[derive(Debug)]
pub(crate) enum HandOver {
    /// The owner of the session took it.
    Taken,
    /// A resume of that session is already under way: refuse this one.
    Busy(AgentCall),
    /// No session named matches: serve it as a new stream.
    Unknown(AgentCall),
}

impl Resumable {
    pub(crate) fn new(window: Duration) -> Arc<Self> {
        Arc::new(Self {
            window,
            streams: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new resumable stream: its token (unguessable, from the OS's random source) and
    /// where its resumptions arrive.
    pub(crate) fn register(self: &Arc<Self>, agent_id: &str, tenant: &str) -> Registration {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let (handover, resumptions) = mpsc::channel(1);
        let suspended = Arc::new(AtomicBool::new(false));
        let abandoned = CancellationToken::new();
        self.lock().insert(
            token.clone(),
            Entry {
                agent_id: agent_id.to_owned(),
                tenant: tenant.to_owned(),
                handover,
                suspended: suspended.clone(),
                abandoned: abandoned.clone(),
            },
        );
        Registration {
            table: self.clone(),
            token,
            resumptions,
            suspended,
            abandoned,
        }
    }

    /// Gives `call` to the owner of the first session in `asked` that belongs to this agent.
    pub(crate) fn hand_over(
        &self,
        asked: &[(String, u64)],
        agent_id: &str,
        tenant: &str,
        call: AgentCall,
    ) -> HandOver {
        let streams = self.lock();
        let found = asked.iter().find_map(|(token, received)| {
            let entry = streams.get(token)?;
            (entry.agent_id == agent_id && entry.tenant == tenant)
                .then(|| (entry.handover.clone(), *received))
        });
        drop(streams);
        let Some((handover, agent_received)) = found else {
            return HandOver::Unknown(call);
        };
        match handover.try_send(Resumption {
            call,
            agent_received,
        }) {
            Ok(()) => HandOver::Taken,
            Err(mpsc::error::TrySendError::Full(r)) => HandOver::Busy(r.call),
            // The stream just ended for good; its entry is on its way out.
            Err(mpsc::error::TrySendError::Closed(r)) => HandOver::Unknown(r.call),
        }
    }

    /// A new stream of this agent that asked for none of `asked`: its suspended streams
    /// not among them are abandoned, and end now rather than at the end of their window.
    pub(crate) fn end_abandoned(&self, asked: &[(String, u64)], agent_id: &str, tenant: &str) {
        for (token, entry) in self.lock().iter() {
            let abandoned = entry.agent_id == agent_id
                && entry.tenant == tenant
                && entry.suspended.load(Ordering::Acquire)
                && !asked.iter().any(|(t, _)| t == token);
            if abandoned {
                entry.abandoned.cancel();
            }
        }
    }
}
