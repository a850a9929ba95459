//! A draining agent (after the first SIGTERM or SIGINT): what it tells the operator it waits
//! for, and, with `--drain-timeout`, stopping it once its connections are gone so that a pod
//! deletion or a Ctrl-C does not wait for a second signal.

use std::time::Duration;

use tether_observe::duration::format_go_duration;
use tokio_util::sync::CancellationToken;

/// How often a draining agent counts its open connections.
const POLL: Duration = Duration::from_millis(100);

/// The line logged when draining starts: what is open, what ends the wait, and that a
/// second signal ends it now.
pub(crate) fn announcement(open: usize, bound: Option<Duration>) -> String {
    let connections = match open {
        1 => "1 connection open".to_owned(),
        n => format!("{n} connections open"),
    };
    let until = match bound {
        Some(bound) => format!(
            "exiting when they close or after {} (--drain-timeout)",
            format_go_duration(bound)
        ),
        None => "running until a second signal (--drain-timeout=0s, as upstream)".to_owned(),
    };
    format!(
        "draining: told every server, opening no new server connections; {connections}; \
         {until}; send the signal again to exit now"
    )
}

/// After `drain`, cancels `stop` once the agent is draining and no connection or dial is
/// open on any server stream, or when `bound` has passed; returns early if `stop` comes
/// first. `open` counts the connections and dials once the agent drains (`None` before).
pub(crate) async fn stop_when_drained(
    open: impl Fn() -> Option<usize>,
    drain: CancellationToken,
    bound: Duration,
    stop: CancellationToken,
) {
    tokio::select! {
        () = drain.cancelled() => {}
        () = stop.cancelled() => return,
    }
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        // The sync loop tells the servers and logs the announcement first.
        let open = open();
        if open == Some(0) {
            tracing::info!("drained: no connections open; stopping");
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::info!(
                open = open.unwrap_or_default(),
                "--drain-timeout {} passed with connections still open; stopping (they are cut)",
                format_go_duration(bound)
            );
            break;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(POLL) => {}
        }
    }
    stop.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcement_says_what_ends_the_wait() {
        assert_eq!(
            announcement(0, Some(Duration::from_secs(30))),
            "draining: told every server, opening no new server connections; 0 connections \
             open; exiting when they close or after 30s (--drain-timeout); send the signal \
             again to exit now"
        );
        let upstream = announcement(1, None);
        assert!(upstream.contains("; 1 connection open; running until a second signal"));
        assert!(upstream.ends_with("send the signal again to exit now"));
    }
}
