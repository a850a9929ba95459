//! `tether connections`, `tether agents` and `tether top`: read a server's or an agent's
//! admin endpoint (`/debug/connections`, `/debug/agents`) and print it.

mod fetch;
mod render;

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Instant;

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
/// each refresh compares with the previous one.
pub(crate) async fn top(args: TopArgs) -> anyhow::Result<ExitCode> {
    let path = connections_path(&args.filter.filter());
    let view = &args.view;
    let snapshot = || async {
        let body = fetch::get(&view.admin_address, &path).await?;
        let report: ConnectionsReport =
            serde_json::from_slice(&body).context("reading the report")?;
        anyhow::Ok((Instant::now(), report))
    };
    let mut before = snapshot().await?;
    let mut shown = 0u64;
    loop {
        tokio::time::sleep(view.interval).await;
        let after = snapshot().await?;
        let seconds = after.0.duration_since(before.0).as_secs_f64();
        let rows = render::top_rows(&before.1, &after.1, seconds);
        let text = match view.output {
            Output::Json => serde_json::to_string_pretty(&rows)? + "\n",
            Output::Table => render::top(&rows, args.limit),
        };
        print_frame(view.watch, &text)?;
        shown += 1;
        if !view.watch || view.count.is_some_and(|n| shown >= n) {
            return Ok(ExitCode::SUCCESS);
        }
        before = after;
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
    let mut shown = 0u64;
    loop {
        let text = frame(view).await?;
        print_frame(view.watch, &text)?;
        shown += 1;
        if !view.watch || view.count.is_some_and(|n| shown >= n) {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(view.interval).await;
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
