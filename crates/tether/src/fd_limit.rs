//! The open-file limit of the long-running roles.
//!
//! Each connection takes a descriptor, and the connection caps (20,000 frontend and 40,000
//! agent connections by default) assume far more than the 1,024 soft limit most systems
//! start processes with. Go programs, upstream's among them, raise the soft limit to the
//! hard one at start (Go 1.19 and later); tether does the same, so that it is the caps, not
//! the descriptor limit, that refuse connections.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, logging the change; a failure is
/// logged and the process keeps the limit it has.
pub(crate) fn raise() {
    match rlimit::Resource::NOFILE.get() {
        Ok((soft, hard)) if soft < hard => match rlimit::Resource::NOFILE.set(hard, hard) {
            Ok(()) => tracing::info!(
                from = soft,
                to = hard,
                "raised the open-file limit (RLIMIT_NOFILE) to its hard limit"
            ),
            Err(error) => {
                tracing::warn!(%error, soft, hard, "could not raise the open-file limit (RLIMIT_NOFILE); connections beyond it will be refused")
            }
        },
        Ok((soft, _)) => tracing::debug!(
            limit = soft,
            "the open-file limit (RLIMIT_NOFILE) is already at its hard limit"
        ),
        Err(error) => tracing::warn!(%error, "could not read the open-file limit (RLIMIT_NOFILE)"),
    }
}
