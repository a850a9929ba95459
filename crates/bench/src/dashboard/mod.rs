//! `tether-bench dashboard`: a Grafana dashboard drawn without Grafana. Every panel's own
//! queries, read from the dashboard JSON, go to a Prometheus server's range API; the answers
//! are drawn as time-series charts laid out on the dashboard's grid, in one SVG file.
//! scripts/dashboard-snapshot.sh feeds it a live quickstart.

mod panels;
mod prometheus;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context as _, bail};

use crate::report::lines::{LineChart, Series};
use crate::report::svg::esc;
use panels::Panel;

/// What to draw, from where, over which range.
#[derive(Debug)]
pub struct Request {
    pub dashboard: PathBuf,
    /// Prometheus's HTTP address; loopback only.
    pub prometheus: SocketAddr,
    /// Range, Unix seconds.
    pub start: f64,
    pub end: f64,
    pub step: f64,
    /// How often Prometheus scraped (for `$__rate_interval`).
    pub scrape_interval: f64,
    pub subtitle: String,
    pub out: PathBuf,
}

const BOARD_W: f64 = 1200.0;
const COLUMNS: f64 = 24.0;
/// Height of one grid unit, as Grafana's 30 px.
const UNIT_H: f64 = 30.0;
const HEADER_H: f64 = 58.0;
const GAP: f64 = 4.0;

/// Draws the dashboard; says on standard output what each panel got.
pub async fn run(req: &Request) -> anyhow::Result<()> {
    if !req.prometheus.ip().is_loopback() {
        bail!(
            "--prometheus must be a loopback address, not {}",
            req.prometheus
        );
    }
    if req.end <= req.start || req.step <= 0.0 {
        bail!(
            "empty range: --start {} --end {} --step {}",
            req.start,
            req.end,
            req.step
        );
    }
    let json = std::fs::read_to_string(&req.dashboard)
        .with_context(|| format!("reading {}", req.dashboard.display()))?;
    let (title, panels) =
        panels::parse(&json).with_context(|| req.dashboard.display().to_string())?;

    let mut body = String::new();
    let mut height = HEADER_H;
    let mut drawn_series = 0;
    for panel in &panels {
        let grid = panel.grid();
        let (x, y) = (grid.x * BOARD_W / COLUMNS, HEADER_H + grid.y * UNIT_H);
        let (w, h) = (grid.w * BOARD_W / COLUMNS, grid.h * UNIT_H);
        height = height.max(y + h);
        match panel {
            Panel::Row { title, .. } => {
                let _ = writeln!(
                    body,
                    r##"<text x="{:.1}" y="{:.1}" font-size="14" font-weight="bold" fill="#333">{}</text><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#bbb"/>"##,
                    x + GAP,
                    y + h - 9.0,
                    esc(title),
                    x + GAP,
                    y + h - 3.0,
                    x + w - GAP,
                    y + h - 3.0
                );
            }
            Panel::TimeSeries {
                title,
                unit,
                stacked,
                calcs,
                targets,
                ..
            } => {
                let mut series = Vec::new();
                for target in targets {
                    let expr = panels::expand(&target.expr, req.step, req.scrape_interval)
                        .with_context(|| format!("panel {title:?}"))?;
                    let answer = prometheus::query_range(
                        req.prometheus,
                        &expr,
                        req.start,
                        req.end,
                        req.step,
                    )
                    .await
                    .with_context(|| format!("panel {title:?}"))?;
                    for s in answer {
                        series.push(Series {
                            name: panels::legend(&target.legend, &s.labels),
                            points: s.points,
                        });
                    }
                }
                let points: usize = series.iter().map(|s| s.points.len()).sum();
                println!(
                    "{title}: {} series, {points} points{}",
                    series.len(),
                    if points == 0 { " (no data)" } else { "" }
                );
                if points > 0 {
                    drawn_series += series.len();
                }
                let chart = LineChart {
                    title: title.clone(),
                    unit: *unit,
                    start: req.start,
                    end: req.end,
                    step: req.step,
                    stacked: *stacked,
                    calcs: calcs.clone(),
                    series,
                };
                body.push_str(&chart.render(x + GAP, y + GAP, w - 2.0 * GAP, h - 2.0 * GAP));
            }
        }
    }
    if drawn_series == 0 {
        bail!("no panel has data: did Prometheus scrape anything between --start and --end?");
    }

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{BOARD_W}" height="{height:.0}" viewBox="0 0 {BOARD_W} {height:.0}" font-family="Helvetica, Arial, sans-serif" font-size="12"><rect width="100%" height="100%" fill="#f4f5f7"/><text x="{GAP}" y="24" font-size="17" font-weight="bold">{}</text><text x="{GAP}" y="44" fill="#555">{}</text>"##,
        esc(&title),
        esc(&req.subtitle)
    );
    svg.push_str(&body);
    svg.push_str("</svg>\n");
    std::fs::write(&req.out, svg).with_context(|| format!("writing {}", req.out.display()))?;
    println!("wrote {}", req.out.display());
    Ok(())
}
