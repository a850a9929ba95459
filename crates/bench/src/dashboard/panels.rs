//! A Grafana dashboard's panels as this renderer needs them: rows, and time-series panels
//! with their queries, legends, unit and place on the grid, read from the dashboard JSON.

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::report::lines::{Calc, Unit};

/// A panel's place on Grafana's grid: 24 columns, rows of one height unit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grid {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

#[derive(Debug)]
pub enum Panel {
    Row {
        title: String,
        grid: Grid,
    },
    TimeSeries {
        title: String,
        grid: Grid,
        unit: Unit,
        stacked: bool,
        calcs: Vec<Calc>,
        targets: Vec<Target>,
    },
}

/// One query of a panel.
#[derive(Debug)]
pub struct Target {
    pub expr: String,
    /// Grafana's legend template: `{{label}}` is replaced by the series' label value.
    pub legend: String,
}

/// The dashboard's title and panels, rows' folded panels included, in grid order.
pub fn parse(json: &str) -> anyhow::Result<(String, Vec<Panel>)> {
    let dashboard: Value = serde_json::from_str(json).context("not JSON")?;
    let title = dashboard["title"]
        .as_str()
        .unwrap_or("dashboard")
        .to_owned();
    let mut panels = Vec::new();
    for panel in dashboard["panels"].as_array().context("no panels array")? {
        panels.push(panel_of(panel)?);
        // A collapsed row holds its panels itself.
        for inner in panel["panels"].as_array().into_iter().flatten() {
            panels.push(panel_of(inner)?);
        }
    }
    panels.sort_by(|a, b| {
        let (a, b) = (a.grid(), b.grid());
        (a.y, a.x)
            .partial_cmp(&(b.y, b.x))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    Ok((title, panels))
}

impl Panel {
    pub fn grid(&self) -> Grid {
        match self {
            Panel::Row { grid, .. } | Panel::TimeSeries { grid, .. } => *grid,
        }
    }
}

fn panel_of(panel: &Value) -> anyhow::Result<Panel> {
    let title = panel["title"].as_str().unwrap_or_default().to_owned();
    let number = |key: &str| {
        panel["gridPos"][key]
            .as_f64()
            .with_context(|| format!("panel {title:?}: no gridPos.{key}"))
    };
    let grid = Grid {
        x: number("x")?,
        y: number("y")?,
        w: number("w")?,
        h: number("h")?,
    };
    match panel["type"].as_str() {
        Some("row") => Ok(Panel::Row { title, grid }),
        Some("timeseries") => {
            let defaults = &panel["fieldConfig"]["defaults"];
            let targets = panel["targets"]
                .as_array()
                .with_context(|| format!("panel {title:?}: no targets"))?
                .iter()
                .map(|t| -> anyhow::Result<Target> {
                    let expr = t["expr"]
                        .as_str()
                        .with_context(|| format!("panel {title:?}: a target without expr"))?;
                    Ok(Target {
                        expr: expr.to_owned(),
                        legend: t["legendFormat"].as_str().unwrap_or_default().to_owned(),
                    })
                })
                .collect::<anyhow::Result<_>>()?;
            Ok(Panel::TimeSeries {
                unit: Unit::from_grafana(defaults["unit"].as_str().unwrap_or("short")),
                stacked: defaults["custom"]["stacking"]["mode"].as_str() == Some("normal"),
                calcs: panel["options"]["legend"]["calcs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.as_str().and_then(Calc::from_grafana))
                    .collect(),
                title,
                grid,
                targets,
            })
        }
        other => bail!("panel {title:?}: type {other:?} is not drawn (row and timeseries are)"),
    }
}

/// `expr` with Grafana's interval variables replaced as Grafana would for a query at `step`
/// seconds against data scraped every `scrape` seconds; any other variable is an error.
pub fn expand(expr: &str, step: f64, scrape: f64) -> anyhow::Result<String> {
    // Grafana: $__rate_interval = max($__interval + scrape interval, 4 × scrape interval).
    let rate_interval = (step + scrape).max(4.0 * scrape);
    let mut out = expr.to_owned();
    for (name, seconds) in [("__rate_interval", rate_interval), ("__interval", step)] {
        let value = format!("{}s", seconds.ceil());
        out = out
            .replace(&format!("${{{name}}}"), &value)
            .replace(&format!("${name}"), &value);
    }
    if let Some(at) = out.find('$') {
        bail!("unknown variable at {:?} in {expr:?}", &out[at..]);
    }
    Ok(out)
}

/// The legend of a series with `labels`: `template` with `{{label}}` filled in; the label
/// set itself (sorted) when there is no template, as Grafana shows it.
pub fn legend(template: &str, labels: &serde_json::Map<String, Value>) -> String {
    let label = |name: &str| labels.get(name).and_then(Value::as_str).unwrap_or_default();
    if template.is_empty() || template == "__auto" {
        let mut pairs: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", v.as_str().unwrap_or_default()))
            .collect();
        pairs.sort();
        return format!("{{{}}}", pairs.join(", "));
    }
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else {
            out.push_str(&rest[open..]);
            return out;
        };
        out.push_str(label(after[..close].trim()));
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rows_and_time_series_in_grid_order() {
        let json = r#"{"title": "t", "panels": [
            {"type": "timeseries", "title": "b", "gridPos": {"x": 12, "y": 1, "w": 12, "h": 8},
             "fieldConfig": {"defaults": {"unit": "s", "custom": {"stacking": {"mode": "normal"}}}},
             "options": {"legend": {"calcs": ["lastNotNull", "max", "variance"]}},
             "targets": [{"expr": "up", "legendFormat": "{{instance}}"}]},
            {"type": "row", "title": "a", "gridPos": {"x": 0, "y": 0, "w": 24, "h": 1}}
        ]}"#;
        let (title, panels) = parse(json).unwrap();
        assert_eq!(title, "t");
        assert!(matches!(&panels[0], Panel::Row { title, .. } if title == "a"));
        let Panel::TimeSeries {
            unit,
            stacked,
            calcs,
            targets,
            ..
        } = &panels[1]
        else {
            panic!("{panels:?}")
        };
        assert_eq!(*unit, Unit::Seconds);
        assert!(*stacked);
        assert_eq!(calcs, &[Calc::Last, Calc::Max]);
        assert_eq!(targets[0].expr, "up");
        let stat = r#"{"panels": [{"type": "stat", "title": "s", "gridPos": {"x": 0, "y": 0, "w": 1, "h": 1}}]}"#;
        assert!(parse(stat).unwrap_err().to_string().contains("stat"));
    }

    #[test]
    fn expands_interval_variables_only() {
        let expr = "rate(x[$__rate_interval]) + rate(y[${__interval}])";
        assert_eq!(expand(expr, 1.0, 1.0).unwrap(), "rate(x[4s]) + rate(y[1s])");
        assert_eq!(
            expand("rate(x[$__rate_interval])", 10.0, 1.0).unwrap(),
            "rate(x[11s])"
        );
        assert!(expand("up{job=\"$job\"}", 1.0, 1.0).is_err());
    }

    #[test]
    fn fills_legends() {
        let labels: serde_json::Map<String, Value> =
            serde_json::from_str(r#"{"reason": "no_agent", "instance": "s1"}"#).unwrap();
        assert_eq!(legend("failed: {{reason}}", &labels), "failed: no_agent");
        assert_eq!(legend("{{ instance }} {{missing}}x", &labels), "s1 x");
        assert_eq!(legend("p99", &labels), "p99");
        assert_eq!(legend("", &labels), r#"{instance="s1", reason="no_agent"}"#);
    }
}
