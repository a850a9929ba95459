//! klog's flags, which upstream's binaries register with `_` turned into `-`.
//!
//! Deployments pass them routinely (`--logtostderr=true`, `--log-file=…`,
//! `--log-file-max-size=0`, `-v=2`), so all of them are accepted. tether honours `-v`,
//! `--logtostderr`, `--alsologtostderr` and `--log-file` (see [`crate::logging`]); the rest only
//! change klog's file handling and header format and have no effect here. `--log-format` is
//! tether's own.

use clap::{ArgAction, Args, ValueEnum};

use super::common::{go_bool, non_default};

/// `-v`'s default in upstream's binaries.
const DEFAULT_VERBOSITY: u32 = 4;
const DEFAULT_LOG_FILE_MAX_SIZE: u64 = 1800;
const DEFAULT_STDERR_THRESHOLD: &str = "2";
const DEFAULT_BACKTRACE_AT: &str = ":0";

#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Logging (klog)")]
pub(crate) struct KlogArgs {
    /// Log verbosity: up to 4 logs at INFO, 5-7 adds DEBUG, 8 and above TRACE. RUST_LOG, when
    /// set, overrides it with a tracing filter.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", default_value_t = DEFAULT_VERBOSITY)]
    pub(crate) v: u32,

    /// Log to standard error instead of files.
    #[arg(long, value_name = "BOOL", default_value = "true", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub(crate) logtostderr: bool,

    /// Log to standard error as well as to --log-file (no effect when --logtostderr=true).
    #[arg(long, value_name = "BOOL", default_value = "false", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub(crate) alsologtostderr: bool,

    /// Log line format: `text` (one readable line per event) or `json` (one JSON object per
    /// line: timestamp, level, target, message, the event's fields, and the spans it happened
    /// in with their fields). tether's own flag.
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,

    /// Append logs to this file (no effect when --logtostderr=true).
    #[arg(long, value_name = "PATH", default_value = "")]
    pub(crate) log_file: String,

    /// No effect: tether does not rotate --log-file.
    #[arg(long, value_name = "MB", default_value_t = DEFAULT_LOG_FILE_MAX_SIZE)]
    log_file_max_size: u64,

    /// No effect: tether writes no per-severity files; without --log-file it logs to
    /// standard error.
    #[arg(long, value_name = "DIR", default_value = "")]
    log_dir: String,

    /// No effect: use RUST_LOG for per-module levels.
    #[arg(long, value_name = "PATTERN=N,...", default_value = "")]
    vmodule: String,

    /// No effect.
    #[arg(long, value_name = "SEVERITY", default_value = DEFAULT_STDERR_THRESHOLD)]
    stderrthreshold: String,

    /// No effect.
    #[arg(long, value_name = "SEVERITY", default_value = "")]
    alsologtostderrthreshold: String,

    /// No effect.
    #[arg(long, value_name = "BOOL", default_value = "true", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    legacy_stderr_threshold_behavior: bool,

    /// No effect.
    #[arg(long, value_name = "BOOL", default_value = "false", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    one_output: bool,

    /// No effect: tether's log lines have their own format.
    #[arg(long, value_name = "BOOL", default_value = "false", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    skip_headers: bool,

    /// No effect.
    #[arg(long, value_name = "BOOL", default_value = "false", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    skip_log_headers: bool,

    /// No effect.
    #[arg(long, value_name = "BOOL", default_value = "false", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    add_dir_header: bool,

    /// No effect.
    #[arg(long, value_name = "FILE:N", default_value = DEFAULT_BACKTRACE_AT)]
    log_backtrace_at: String,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

impl KlogArgs {
    /// Flags set to values that would change upstream's logging but not tether's. Flags that
    /// only matter for klog's log files are left out while logging to standard error, where
    /// upstream ignores them too.
    pub(crate) fn ignored(&self) -> Vec<String> {
        let mut ignored = Vec::new();
        let files = !self.logtostderr;
        non_default(&mut ignored, "--vmodule", self.vmodule.as_str(), "");
        non_default(&mut ignored, "--skip-headers", self.skip_headers, false);
        non_default(&mut ignored, "--add-dir-header", self.add_dir_header, false);
        non_default(
            &mut ignored,
            "--log-backtrace-at",
            self.log_backtrace_at.as_str(),
            DEFAULT_BACKTRACE_AT,
        );
        if files {
            if self.log_file.is_empty() {
                non_default(&mut ignored, "--log-dir", self.log_dir.as_str(), "");
            } else {
                non_default(
                    &mut ignored,
                    "--log-file-max-size",
                    self.log_file_max_size,
                    DEFAULT_LOG_FILE_MAX_SIZE,
                );
            }
            non_default(
                &mut ignored,
                "--stderrthreshold",
                self.stderrthreshold.as_str(),
                DEFAULT_STDERR_THRESHOLD,
            );
            non_default(
                &mut ignored,
                "--alsologtostderrthreshold",
                self.alsologtostderrthreshold.as_str(),
                "",
            );
            non_default(
                &mut ignored,
                "--legacy-stderr-threshold-behavior",
                self.legacy_stderr_threshold_behavior,
                true,
            );
            non_default(&mut ignored, "--one-output", self.one_output, false);
            non_default(
                &mut ignored,
                "--skip-log-headers",
                self.skip_log_headers,
                false,
            );
        }
        ignored
    }
}
