//! Hand-written SVG: horizontal grouped bar charts with min–max whiskers, and the palette,
//! scales and number formats that the time-series charts ([`super::lines`]) share.

use std::fmt::Write as _;

use crate::stats::Summary;

/// One chart: a group of bars per category (system), one bar per series.
#[derive(Debug)]
pub struct Chart {
    pub title: String,
    /// Axis caption, e.g. "MiB/s (higher is better)".
    pub axis: String,
    pub log: bool,
    pub categories: Vec<String>,
    /// (series name, one value per category)
    pub series: Vec<(String, Vec<Option<Summary>>)>,
}

pub const PALETTE: [&str; 6] = [
    "#3b73b9", "#e0803a", "#4a9a5b", "#b8475a", "#7a5fb0", "#8c8c8c",
];
const WIDTH: f64 = 920.0;
const LABEL_W: f64 = 200.0;
const RIGHT_PAD: f64 = 90.0;
const BAR_H: f64 = 13.0;
const GROUP_GAP: f64 = 10.0;
const TOP: f64 = 58.0;
const BOTTOM: f64 = 44.0;

impl Chart {
    /// Renders, leaving out categories with no value at all. `None` when nothing is left.
    pub fn render(&self) -> Option<String> {
        let keep: Vec<usize> = (0..self.categories.len())
            .filter(|&i| self.series.iter().any(|(_, v)| v[i].is_some()))
            .collect();
        if keep.is_empty() {
            return None;
        }
        let values = || {
            keep.iter()
                .flat_map(|&i| self.series.iter().filter_map(move |(_, v)| v[i]))
        };
        let max = values().map(|s| s.max).fold(0.0_f64, f64::max);
        let min_pos = values()
            .map(|s| s.min)
            .filter(|&x| x > 0.0)
            .fold(f64::INFINITY, f64::min);
        let scale = if self.log && max > 0.0 && min_pos.is_finite() {
            let lo = 10f64.powf(min_pos.log10().floor());
            let hi = 10f64.powf(max.log10().ceil()).max(lo * 10.0);
            Scale::Log { lo, hi }
        } else {
            Scale::Linear {
                hi: nice_ceiling(if max > 0.0 { max } else { 1.0 }),
            }
        };
        let n_series = self.series.len() as f64;
        let group_h = n_series * BAR_H + GROUP_GAP;
        let plot_h = group_h * keep.len() as f64;
        let height = TOP + plot_h + BOTTOM;
        let plot_w = WIDTH - LABEL_W - RIGHT_PAD;
        let x = |v: f64| LABEL_W + scale.frac(v) * plot_w;

        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            s,
            r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="15" font-weight="bold">{}</text>"#,
            10,
            esc(&self.title)
        );
        // Legend.
        let mut lx = LABEL_W;
        for (k, (name, _)) in self.series.iter().enumerate() {
            let _ = writeln!(
                s,
                r#"<rect x="{lx}" y="32" width="12" height="12" fill="{}"/><text x="{}" y="42">{}</text>"#,
                PALETTE[k % PALETTE.len()],
                lx + 16.0,
                esc(name)
            );
            lx += 24.0 + 7.0 * name.chars().count() as f64;
        }
        // Grid and ticks.
        for t in scale.ticks() {
            let tx = x(t);
            let _ = writeln!(
                s,
                r##"<line x1="{tx:.1}" y1="{TOP}" x2="{tx:.1}" y2="{:.1}" stroke="#ddd"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle" fill="#444">{}</text>"##,
                TOP + plot_h,
                TOP + plot_h + 15.0,
                short(t)
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#444">{}</text>"##,
            LABEL_W + plot_w / 2.0,
            TOP + plot_h + 34.0,
            esc(&self.axis)
        );
        // Bars.
        for (row, &i) in keep.iter().enumerate() {
            let gy = TOP + row as f64 * group_h + GROUP_GAP / 2.0;
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                LABEL_W - 8.0,
                gy + n_series * BAR_H / 2.0 + 4.0,
                esc(&self.categories[i])
            );
            for (k, (_, v)) in self.series.iter().enumerate() {
                let Some(sum) = v[i] else { continue };
                let y = gy + k as f64 * BAR_H;
                let x0 = x(scale.floor());
                let w = (x(sum.median) - x0).max(0.5);
                let _ = writeln!(
                    s,
                    r#"<rect x="{x0:.1}" y="{:.1}" width="{w:.1}" height="{:.1}" fill="{}"/>"#,
                    y + 1.0,
                    BAR_H - 2.0,
                    PALETTE[k % PALETTE.len()]
                );
                if sum.max > sum.min {
                    let (a, b, ym) = (x(sum.min), x(sum.max), y + BAR_H / 2.0);
                    let _ = writeln!(
                        s,
                        r##"<path d="M{a:.1} {ym:.1}H{b:.1}M{a:.1} {:.1}V{:.1}M{b:.1} {:.1}V{:.1}" stroke="#222" fill="none"/>"##,
                        ym - 3.0,
                        ym + 3.0,
                        ym - 3.0,
                        ym + 3.0
                    );
                }
                let _ = writeln!(
                    s,
                    r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#222">{}</text>"##,
                    x(sum.max.max(sum.median)) + 4.0,
                    y + BAR_H - 3.0,
                    short(sum.median)
                );
            }
        }
        let _ = writeln!(
            s,
            r##"<line x1="{LABEL_W}" y1="{TOP}" x2="{LABEL_W}" y2="{:.1}" stroke="#444"/></svg>"##,
            TOP + plot_h
        );
        Some(s)
    }
}

/// Where a value lands along an axis, as a fraction of its length.
#[derive(Clone, Copy, Debug)]
pub enum Scale {
    Linear { hi: f64 },
    Log { lo: f64, hi: f64 },
}

impl Scale {
    pub fn frac(&self, v: f64) -> f64 {
        match *self {
            Scale::Linear { hi } => (v / hi).clamp(0.0, 1.0),
            Scale::Log { lo, hi } => {
                ((v.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10())).clamp(0.0, 1.0)
            }
        }
    }

    fn floor(&self) -> f64 {
        match *self {
            Scale::Linear { .. } => 0.0,
            Scale::Log { lo, .. } => lo,
        }
    }

    pub fn ticks(&self) -> Vec<f64> {
        match *self {
            Scale::Linear { hi } => {
                let step = nice_step(hi / 5.0);
                (0..=((hi / step).round() as usize))
                    .map(|k| k as f64 * step)
                    .collect()
            }
            Scale::Log { lo, hi } => {
                let mut v = Vec::new();
                let mut t = lo;
                while t <= hi * 1.0001 {
                    v.push(t);
                    t *= 10.0;
                }
                v
            }
        }
    }
}

/// 1, 2 or 5 × 10^k at or above `x`.
fn nice_step(x: f64) -> f64 {
    let p = 10f64.powf(x.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= x {
            return m * p;
        }
    }
    10.0 * p
}

pub fn nice_ceiling(max: f64) -> f64 {
    let step = nice_step(max / 5.0);
    (max / step).ceil() * step
}

/// Compact number: 3 significant digits, k/M suffixes.
pub fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        let m = format!("{:.3}", v / 1e6);
        format!("{}M", m.trim_end_matches('0').trim_end_matches('.'))
    } else if a >= 10.0 && v.fract() == 0.0 && a < 10_000.0 {
        format!("{v:.0}")
    } else if a >= 10_000.0 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a == 0.0 {
        "0".into()
    } else {
        format!("{v:.3}")
    }
}

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(x: f64) -> Option<Summary> {
        Some(Summary {
            median: x,
            min: x * 0.9,
            max: x * 1.1,
            runs: 3,
        })
    }

    #[test]
    fn renders_bars_for_present_values_only() {
        let chart = Chart {
            title: "t <x>".into(),
            axis: "MiB/s".into(),
            log: false,
            categories: vec!["a".into(), "b".into(), "c".into()],
            series: vec![
                ("up".into(), vec![sum(100.0), None, None]),
                ("down".into(), vec![sum(250.0), sum(3.0), None]),
            ],
        };
        let svg = chart.render().unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("t &lt;x&gt;"));
        assert_eq!(svg.matches("<rect x=").count(), 2 + 3); // legend + bars
        assert!(!svg.contains(">c<"));
        let log = Chart { log: true, ..chart };
        assert!(log.render().unwrap().contains(">1000<"));
    }

    #[test]
    fn nice_numbers() {
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(170.0), 200.0);
        assert_eq!(nice_ceiling(3100.0), 4000.0);
        assert_eq!(short(1234.6), "1235");
        assert_eq!(short(12345.0), "12k");
        assert_eq!(short(0.1234), "0.123");
        assert_eq!(short(2_500_000.0), "2.5M");
    }
}
