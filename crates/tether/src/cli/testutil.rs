//! Helpers for the flag tests: a throwaway PKI on disk, and parsing a subcommand's flags.

use std::ffi::OsString;

use tempfile::TempDir;
use tether_tls::pki::{Pki, PkiFiles};

use super::{Cli, Command};

/// A fresh CA, server and agent certificates, written to a directory that lives as long as
/// the returned guard.
pub(super) fn pki() -> (TempDir, PkiFiles) {
    let dir = tempfile::tempdir().unwrap();
    let files = Pki::generate().unwrap().write_to(dir.path()).unwrap();
    (dir, files)
}

/// Parses `tether <args…>` as the binary would.
pub(super) fn parse(args: &[String]) -> Result<Command, clap::Error> {
    let argv = std::iter::once(OsString::from("tether")).chain(args.iter().map(OsString::from));
    Cli::from_argv(argv).map(|cli| cli.command)
}

/// Splits a flag line on whitespace.
pub(super) fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}
