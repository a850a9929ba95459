//! Hand-written SVG: a time-series chart (lines over wall-clock time) in the bar charts'
//! style, with their palette, linear scale and number format ([`super::svg`]). It draws one
//! dashboard panel; [`crate::dashboard`] lays the panels out.

use std::fmt::Write as _;

use super::svg::{PALETTE, Scale, esc, nice_ceiling, short};

/// What a panel's values measure, as Grafana's unit ids name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A plain number (`short`, or a unit this chart does not know).
    Count,
    /// Events per second (`reqps`, `pps`, `ops`).
    PerSecond(&'static str),
    /// Seconds, shown in s, ms or µs.
    Seconds,
    /// Bytes, shown in B, KiB, MiB or GiB.
    Bytes,
}

impl Unit {
    pub fn from_grafana(id: &str) -> Self {
        match id {
            "reqps" => Self::PerSecond("req/s"),
            "pps" => Self::PerSecond("packets/s"),
            "ops" => Self::PerSecond("ops/s"),
            "s" => Self::Seconds,
            "bytes" => Self::Bytes,
            _ => Self::Count,
        }
    }

    /// The divisor and caption that keep values up to `max` readable.
    fn scaled(self, max: f64) -> (f64, &'static str) {
        match self {
            Self::Count => (1.0, ""),
            Self::PerSecond(caption) => (1.0, caption),
            Self::Seconds if max < 1e-3 => (1e-6, "µs"),
            Self::Seconds if max < 1.0 => (1e-3, "ms"),
            Self::Seconds => (1.0, "s"),
            Self::Bytes if max >= f64::from(1u32 << 30) => (f64::from(1u32 << 30), "GiB"),
            Self::Bytes if max >= f64::from(1u32 << 20) => (f64::from(1u32 << 20), "MiB"),
            Self::Bytes if max >= 1024.0 => (1024.0, "KiB"),
            Self::Bytes => (1.0, "B"),
        }
    }
}

/// Figures shown beside each series' name, as Grafana's legend `calcs` name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Calc {
    Last,
    Max,
    Mean,
    Min,
}

impl Calc {
    /// `None` for a calculation this chart does not draw.
    pub fn from_grafana(id: &str) -> Option<Self> {
        match id {
            "lastNotNull" | "last" => Some(Self::Last),
            "max" => Some(Self::Max),
            "mean" => Some(Self::Mean),
            "min" => Some(Self::Min),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Last => "last",
            Self::Max => "max",
            Self::Mean => "mean",
            Self::Min => "min",
        }
    }

    fn of(self, points: &[(f64, f64)]) -> Option<f64> {
        let values = points.iter().map(|&(_, v)| v);
        match self {
            Self::Last => points.last().map(|&(_, v)| v),
            Self::Max => values.reduce(f64::max),
            Self::Min => values.reduce(f64::min),
            Self::Mean => (!points.is_empty()).then(|| values.sum::<f64>() / points.len() as f64),
        }
    }
}

/// One line: (Unix seconds, value) points in time order, NaN-free (a gap is a gap).
#[derive(Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One time-series chart over `[start, end]` (Unix seconds).
#[derive(Debug)]
pub struct LineChart {
    pub title: String,
    pub unit: Unit,
    pub start: f64,
    pub end: f64,
    /// Points further apart than this are a gap in the line.
    pub step: f64,
    /// Each series drawn on top of the ones before it (Grafana's "normal" stacking).
    pub stacked: bool,
    pub calcs: Vec<Calc>,
    pub series: Vec<Series>,
}

const PLOT_LEFT: f64 = 52.0;
const PLOT_RIGHT: f64 = 14.0;
const PLOT_TOP: f64 = 30.0;
const AXIS_H: f64 = 20.0;
const LEGEND_ROW: f64 = 14.0;

impl LineChart {
    /// An `<svg>` element `width` × `height` placed at (`x`, `y`) of its parent (or of the
    /// page, for a standalone file).
    pub fn render(&self, x: f64, y: f64, width: f64, height: f64) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            r##"<svg xmlns="http://www.w3.org/2000/svg" x="{x:.1}" y="{y:.1}" width="{width:.1}" height="{height:.1}" viewBox="0 0 {width:.1} {height:.1}" font-family="Helvetica, Arial, sans-serif" font-size="11"><rect x="0.5" y="0.5" width="{:.1}" height="{:.1}" fill="white" stroke="#ccc"/><text x="10" y="19" font-size="13" font-weight="bold">{}</text>"##,
            width - 1.0,
            height - 1.0,
            esc(&self.title)
        );
        let lines = self.drawn();
        let max = lines
            .iter()
            .flat_map(|points| points.iter().map(|&(_, v)| v))
            .fold(0.0_f64, f64::max);
        let (divisor, caption) = self.unit.scaled(max);
        if !caption.is_empty() {
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="19" text-anchor="end" fill="#666">{caption}</text>"##,
                width - PLOT_RIGHT
            );
        }
        let legend_h = LEGEND_ROW * self.series.len() as f64 + 6.0;
        let plot = Rect {
            x: PLOT_LEFT,
            y: PLOT_TOP,
            w: width - PLOT_LEFT - PLOT_RIGHT,
            h: (height - PLOT_TOP - AXIS_H - legend_h).max(20.0),
        };
        let scale = Scale::Linear {
            hi: nice_ceiling(if max > 0.0 { max / divisor } else { 1.0 }),
        };
        let px = |t: f64| plot.x + (t - self.start) / (self.end - self.start).max(1.0) * plot.w;
        let py = |v: f64| plot.y + plot.h - scale.frac(v / divisor) * plot.h;

        for tick in scale.ticks() {
            let ty = plot.y + plot.h - scale.frac(tick) * plot.h;
            let _ = writeln!(
                s,
                r##"<line x1="{:.1}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#444">{}</text>"##,
                plot.x,
                plot.x + plot.w,
                plot.x - 6.0,
                ty + 4.0,
                short(tick)
            );
        }
        for t in time_ticks(self.start, self.end, plot.w) {
            let tx = px(t);
            let _ = writeln!(
                s,
                r##"<line x1="{tx:.1}" y1="{:.1}" x2="{tx:.1}" y2="{:.1}" stroke="#444"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle" fill="#444">{}</text>"##,
                plot.y + plot.h,
                plot.y + plot.h + 4.0,
                plot.y + plot.h + 15.0,
                clock(t)
            );
        }
        let _ = writeln!(
            s,
            r##"<path d="M{:.1} {:.1}V{:.1}H{:.1}" stroke="#444" fill="none"/>"##,
            plot.x,
            plot.y,
            plot.y + plot.h,
            plot.x + plot.w
        );

        if lines.iter().all(Vec::is_empty) {
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13" fill="#888">No data</text>"##,
                plot.x + plot.w / 2.0,
                plot.y + plot.h / 2.0
            );
        }
        for (k, points) in lines.iter().enumerate() {
            let d = self.path(points, &px, &py);
            if d.is_empty() {
                continue;
            }
            let _ = writeln!(
                s,
                r#"<path d="{d}" stroke="{}" stroke-width="1.6" fill="none" stroke-linejoin="round"/>"#,
                PALETTE[k % PALETTE.len()]
            );
        }

        let mut ly = plot.y + plot.h + AXIS_H + 10.0;
        for (k, series) in self.series.iter().enumerate() {
            let figures: Vec<String> = self
                .calcs
                .iter()
                .filter_map(|c| {
                    c.of(&series.points)
                        .map(|v| format!("{} {}", c.name(), short(v / divisor)))
                })
                .collect();
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{:.1}" width="10" height="3" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#444">{}</text>"##,
                plot.x,
                ly - 4.0,
                PALETTE[k % PALETTE.len()],
                plot.x + 16.0,
                ly,
                esc(&series.name),
                plot.x + plot.w,
                ly,
                esc(&figures.join("   "))
            );
            ly += LEGEND_ROW;
        }
        s.push_str("</svg>\n");
        s
    }

    /// The points as drawn: each series on top of the ones before when stacked.
    fn drawn(&self) -> Vec<Vec<(f64, f64)>> {
        let mut below: Vec<(f64, f64)> = Vec::new();
        let mut out = Vec::with_capacity(self.series.len());
        for series in &self.series {
            if !self.stacked {
                out.push(series.points.clone());
                continue;
            }
            let stacked: Vec<(f64, f64)> = series
                .points
                .iter()
                .map(|&(t, v)| {
                    let under = below
                        .iter()
                        .find(|&&(bt, _)| (bt - t).abs() < self.step / 2.0)
                        .map_or(0.0, |&(_, bv)| bv);
                    (t, v + under)
                })
                .collect();
            for &(t, v) in &stacked {
                match below
                    .iter_mut()
                    .find(|(bt, _)| (*bt - t).abs() < self.step / 2.0)
                {
                    Some(slot) => slot.1 = v,
                    None => below.push((t, v)),
                }
            }
            out.push(stacked);
        }
        out
    }

    /// An SVG path through `points`, broken where a point is missing.
    fn path(
        &self,
        points: &[(f64, f64)],
        px: &impl Fn(f64) -> f64,
        py: &impl Fn(f64) -> f64,
    ) -> String {
        let mut d = String::new();
        let mut last: Option<f64> = None;
        for &(t, v) in points {
            let joined = last.is_some_and(|prev| t - prev <= self.step * 1.5);
            let _ = write!(
                d,
                "{}{:.1} {:.1}",
                if joined { "L" } else { "M" },
                px(t),
                py(v)
            );
            last = Some(t);
        }
        d
    }
}

#[derive(Clone, Copy)]
struct Rect {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

/// Round wall-clock instants across `[start, end]`, about one per 110 pixels.
fn time_ticks(start: f64, end: f64, width: f64) -> Vec<f64> {
    let span = (end - start).max(1.0);
    let wanted = (width / 110.0).max(2.0);
    let step = [
        1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0,
    ]
    .into_iter()
    .find(|&s| span / s <= wanted)
    .unwrap_or(7200.0);
    let mut t = (start / step).ceil() * step;
    let mut ticks = Vec::new();
    while t <= end {
        ticks.push(t);
        t += step;
    }
    ticks
}

/// `HH:MM:SS` (UTC) of a Unix time.
fn clock(t: f64) -> String {
    let day = t.rem_euclid(86_400.0) as u64;
    format!("{:02}:{:02}:{:02}", day / 3600, day / 60 % 60, day % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(series: Vec<Series>, stacked: bool) -> LineChart {
        LineChart {
            title: "Dial rate <all>".into(),
            unit: Unit::from_grafana("reqps"),
            start: 1_000.0,
            end: 1_060.0,
            step: 1.0,
            stacked,
            calcs: vec![Calc::Last, Calc::Max],
            series,
        }
    }

    fn series(name: &str, points: &[(f64, f64)]) -> Series {
        Series {
            name: name.into(),
            points: points.to_vec(),
        }
    }

    #[test]
    fn draws_one_path_per_series_with_gaps_and_a_legend() {
        let svg = chart(
            vec![
                series("ok", &[(1_000.0, 1.0), (1_001.0, 3.0), (1_010.0, 2.0)]),
                series("failed", &[(1_000.0, 0.5)]),
            ],
            false,
        )
        .render(0.0, 0.0, 600.0, 240.0);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("Dial rate &lt;all&gt;"), "{svg}");
        assert!(svg.contains(">req/s<"), "{svg}");
        assert_eq!(svg.matches("stroke-width=\"1.6\"").count(), 2);
        // The 9 s hole after 1001 starts a new subpath.
        let first = svg.split("<path d=\"").nth(2).unwrap();
        assert_eq!(first.split('"').next().unwrap().matches('M').count(), 2);
        assert!(svg.contains("last 2.00   max 3.00"), "{svg}");
        assert!(!svg.contains("No data"));
    }

    #[test]
    fn says_no_data_and_stacks() {
        let empty = chart(vec![series("ok", &[])], false).render(0.0, 0.0, 600.0, 240.0);
        assert!(empty.contains("No data"));
        let stacked = chart(
            vec![
                series("a", &[(1_000.0, 2.0)]),
                series("b", &[(1_000.0, 3.0)]),
            ],
            true,
        );
        assert_eq!(stacked.drawn()[1], vec![(1_000.0, 5.0)]);
    }

    #[test]
    fn units_and_clock() {
        assert_eq!(Unit::from_grafana("s").scaled(0.004), (1e-3, "ms"));
        assert_eq!(Unit::from_grafana("bytes").scaled(3e6), (1048576.0, "MiB"));
        assert_eq!(Unit::from_grafana("short").scaled(7.0), (1.0, ""));
        assert_eq!(clock(86_400.0 * 3.0 + 3_723.0), "01:02:03");
        assert_eq!(
            time_ticks(1_003.0, 1_063.0, 550.0),
            vec![1_005.0, 1_020.0, 1_035.0, 1_050.0]
        );
    }
}
