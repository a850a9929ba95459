//! `tether connections`, `tether agents` and `tether top`: read a server's or an agent's
//! admin endpoint (`/debug/connections`, `/debug/agents`) and print it.

mod fetch;
mod render;

use std::io::Write as _;
use std::process::ExitCode;
use tokio::time::Instant;

use anyhow::Context as _;
use tether_observe::introspect::{AgentsReport, ConnectionsReport, Filter};

use crate::cli::introspect::{AgentsArgs, ConnectionsArgs, Output, TopArgs, ViewArgs};

/// Clears the terminal and homes the cursor, so each refresh replaces the last.
const CLEAR: &str = "\x1b[H\x1b[2J";

pub(crate) async fn connections(args: ConnectionsArgs) -> anyhow::Result<ExitCode> {
    let path = connections_path(&args.filter.filter());
    refresh(&args.view, |view| {
        let view = view.clone();
        let path = path.clone();
        async move {
            let body = fetch::get(&view.admin_address, &path).await?;
            Ok(match view.output {
                Output::Json => String::from_utf8_lossy(&body).into_owned(),
                Output::Table => {
                    let report: ConnectionsReport =
                        serde_json::from_slice(&body).context("reading the report")?;
                    render::connections(&report)
                }
            })
        }
    })
    .await
}

pub(crate) async fn agents(args: AgentsArgs) -> anyhow::Result<ExitCode> {
    refresh(&args.view, |view| {
        let view = view.clone();
        async move {
            let body = fetch::get(&view.admin_address, "/debug/agents").await?;
            Ok(match view.output {
                Output::Json => String::from_utf8_lossy(&body).into_owned(),
                Output::Table => {
                    let report: AgentsReport =
                        serde_json::from_slice(&body).context("reading the report")?;
                    render::agents(&report)
                }
            })
        }
    })
    .await
}

/// Throughput per connection between two snapshots `--interval` apart; with `--watch`,
/// each refresh compares with the previous one (after a failed fetch, the next snapshot is
/// the new baseline).
pub(crate) async fn top(args: TopArgs) -> anyhow::Result<ExitCode> {
    let path = connections_path(&args.filter.filter());
    let view = &args.view;
    let snapshot = || async {
        let body = fetch::get(&view.admin_address, &path).await?;
        let report: ConnectionsReport =
            serde_json::from_slice(&body).context("reading the report")?;
        anyhow::Ok((Instant::now(), report))
    };
    let text = |earlier: &(Instant, ConnectionsReport), after: &(Instant, ConnectionsReport)| {
        let seconds = after.0.duration_since(earlier.0).as_secs_f64();
        let rows = render::top_rows(&earlier.1, &after.1, seconds);
        anyhow::Ok(match view.output {
            Output::Json => serde_json::to_string_pretty(&rows)? + "\n",
            Output::Table => {
                let header = render::top_header(
                    &view.admin_address,
                    tether_observe::time::wall_clock(),
                    seconds,
                    view.interval,
                );
                header + &render::top(&rows, args.limit)
            }
        })
    };
    let mut before = None;
    let mut frames = Frames::new(view);
    loop {
        // The first snapshot, and the first since a failure, is a baseline without a frame.
        let frame = match snapshot().await {
            Ok(after) => {
                let frame = before.as_ref().map(|earlier| text(earlier, &after));
                before = Some(after);
                frame
            }
            Err(e) => {
                before = None;
                Some(Err(e))
            }
        };
        if let Some(frame) = frame
            && let Some(done) = frames.show(frame)?
        {
            return Ok(done);
        }
        tokio::time::sleep(view.interval).await;
    }
}

fn connections_path(filter: &Filter) -> String {
    let query = filter.to_query();
    if query.is_empty() {
        "/debug/connections".to_owned()
    } else {
        format!("/debug/connections?{query}")
    }
}

/// Prints one frame, or with `--watch` one every `--interval` until `--count`.
async fn refresh<F, Fut>(view: &ViewArgs, mut frame: F) -> anyhow::Result<ExitCode>
where
    F: FnMut(&ViewArgs) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<String>>,
{
    let mut frames = Frames::new(view);
    loop {
        if let Some(done) = frames.show(frame(view).await)? {
            return Ok(done);
        }
        tokio::time::sleep(view.interval).await;
    }
}

/// The frames of one command: printed, counted against `--count`, and with `--watch` a
/// failed fetch shown as "disconnected, retrying" instead of ending the command, so a
/// restarting server or agent can be watched through its restart.
struct Frames<'a> {
    view: &'a ViewArgs,
    shown: u64,
}

impl<'a> Frames<'a> {
    fn new(view: &'a ViewArgs) -> Self {
        Self { view, shown: 0 }
    }

    /// Shows one frame; `Some` when the command is done. Without `--watch` a failure is the
    /// command's error; with it, only when it is the last of `--count` frames.
    fn show(&mut self, frame: anyhow::Result<String>) -> anyhow::Result<Option<ExitCode>> {
        let view = self.view;
        self.shown += 1;
        let last = !view.watch || view.count.is_some_and(|n| self.shown >= n);
        match frame {
            Ok(text) => print_frame(view.watch, &text)?,
            Err(e) if last => return Err(e),
            Err(e) => {
                let text = render::disconnected(
                    &view.admin_address,
                    tether_observe::time::wall_clock(),
                    view.interval,
                    &e,
                );
                print_frame(view.watch, &text)?;
            }
        }
        Ok(last.then_some(ExitCode::SUCCESS))
    }
}

fn print_frame(watch: bool, text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if watch {
        out.write_all(CLEAR.as_bytes())?;
    }
    out.write_all(text.as_bytes())?;
    if !text.ends_with('\n') {
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}
