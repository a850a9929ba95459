//! `tether quickstart`: flags.

use std::path::PathBuf;

use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct QuickstartArgs {
    /// Run the demo requests, print the results and exit (status 1 if any failed), instead
    /// of serving until Ctrl-C.
    #[arg(long)]
    pub(crate) once: bool,

    /// Where to write the generated certificates and the Unix socket; a fresh temporary
    /// directory (removed on exit) by default.
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: Option<PathBuf>,
}
