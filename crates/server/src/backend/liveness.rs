//! Dead agents fail fast: an agent stream that carries connections or dials and from whose
//! agent nothing at all arrives for `--dead-agent-timeout` is ended, with its connections
//! and dials, rather than held for the agent to resume it.
//!
//! A process that dies closes its sockets, so its stream breaks at once and waits only the
//! resume window. A node that is gone, or a network that stopped carrying packets, says
//! nothing: only silence tells. While a stream is busy the server PINGs the agent every
//! second (`tether_grpc::WATCHED_PING_INTERVAL`), so a live agent is heard many times within
//! the timeout; any byte it sends counts, so a PONG queued behind bulk data is no false
//! alarm. Silence is what the connection's reads prove: a read that found nothing to read
//! the timeout after the last byte, not a clock alone, so a server too busy to read its
//! sockets for a while takes no live agent for dead. An idle stream is not watched: nothing
//! waits on it, and it costs no timer.

use std::time::Duration;
use tether_observe::time::monotonic_now;

use tokio::time::Instant;

use super::session::AgentSession;

/// How often a busy stream's silence is checked: the timeout is met within this.
const CHECK_EVERY: Duration = Duration::from_millis(250);

/// Resolves, with how long it was silent, once the agent of `session` has sent nothing for
/// `timeout` while the stream had connections or dials; never when `timeout` is `None`.
pub(crate) async fn silent_agent(session: &AgentSession, timeout: Option<Duration>) -> Duration {
    let Some(timeout) = timeout else {
        return std::future::pending().await;
    };
    loop {
        session.health.wait_busy().await;
        // Silence counts from the first dial, not from the last PING of an idle stream.
        let busy_since = monotonic_now();
        loop {
            session.keepalive.watch(true);
            tokio::time::sleep_until(Instant::now() + CHECK_EVERY).await;
            if !session.health.is_busy() {
                session.keepalive.watch(false);
                break;
            }
            let since = session.keepalive.heard().max(busy_since);
            let silent = session.keepalive.quiet().saturating_duration_since(since);
            if silent >= timeout {
                return silent;
            }
        }
    }
}
