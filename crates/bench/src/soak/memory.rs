//! The soak's processes' memory over the run: each process's RSS samples, as (seconds, MiB),
//! so that a restart starts a series of its own rather than a dip in one. The first server
//! and agent are never restarted (see the schedule): their series span the whole run.

use std::collections::BTreeMap;
use std::time::Duration;

use super::agents::Agent;
use crate::systems::Fleet;

/// A series is the whole run's when it spans this much of it at least.
const WHOLE_RUN: f64 = 0.9;

#[derive(Debug, Default)]
pub struct Memory {
    /// (process name, pid) → samples.
    series: BTreeMap<(String, u32), Vec<(f64, f64)>>,
}

impl Memory {
    /// Samples every running server and agent at `at` after the start.
    pub fn sample(&mut self, fleet: &Fleet, agents: &[Agent], at: Duration) {
        let servers = fleet
            .members
            .iter()
            .enumerate()
            .filter_map(|(n, m)| Some((format!("server {}", n + 1), m.proc.as_ref()?)));
        let agents = agents
            .iter()
            .filter_map(|a| Some((a.id.clone(), a.proc.as_ref()?)));
        for (name, proc) in servers.chain(agents) {
            let mib = proc.rss() as f64 / (1 << 20) as f64;
            self.series
                .entry((name, proc.pid))
                .or_default()
                .push((at.as_secs_f64(), mib));
        }
    }

    /// Every sample, one line each (`process,pid,seconds,mib`), for a closer look at a trend.
    pub fn csv(&self) -> String {
        let mut out = String::from("process,pid,seconds,mib\n");
        for ((name, pid), samples) in &self.series {
            for (at, mib) in samples {
                out.push_str(&format!("{name},{pid},{at:.0},{mib:.2}\n"));
            }
        }
        out
    }

    /// The report's lines: each process that lived the whole run `run` long, with its first
    /// and last sample and its trend; and the steepest trend of the others over a minute or
    /// more.
    pub fn report(&self, run: Duration) -> Vec<String> {
        let span = |samples: &[(f64, f64)]| match (samples.first(), samples.last()) {
            (Some(first), Some(last)) => last.0 - first.0,
            _ => 0.0,
        };
        let whole = |samples: &[(f64, f64)]| span(samples) >= WHOLE_RUN * run.as_secs_f64();
        let mut lines: Vec<String> = self
            .series
            .iter()
            .filter(|(_, samples)| whole(samples))
            .filter_map(|((name, _), samples)| {
                // Past warm-up: a leak keeps its slope in the second half, growth that
                // levels off does not.
                let second_half = &samples[samples.len() / 2..];
                Some(format!(
                    "{name}, one process for the whole run: {:.1} → {:.1} MiB, trend {:+.3} MiB/min, {:+.3} MiB/min over the second half",
                    samples.first()?.1,
                    samples.last()?.1,
                    slope(samples)?,
                    slope(second_half)?
                ))
            })
            .collect();
        let steepest = self
            .series
            .iter()
            .filter(|(_, samples)| !whole(samples) && span(samples) >= 60.0)
            .filter_map(|((name, _), samples)| Some((name, slope(samples)?, span(samples))))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        lines.push(match steepest {
            Some((name, slope, span)) => format!(
                "the steepest trend of the other processes that lived a minute or more: {slope:+.2} MiB/min ({name}, over {span:.0} s)"
            ),
            None => "no other process lived a minute".to_owned(),
        });
        lines
    }
}

/// The least-squares slope of `samples` (seconds, MiB), in MiB per minute.
fn slope(samples: &[(f64, f64)]) -> Option<f64> {
    let n = samples.len() as f64;
    if samples.len() < 3 {
        return None;
    }
    let (sx, sy) = samples
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = samples.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    (den > 0.0).then(|| num / den * 60.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_of_a_line_is_its_rise_per_minute() {
        let line: Vec<(f64, f64)> = (0..10)
            .map(|i| (i as f64 * 5.0, 100.0 + i as f64))
            .collect();
        let s = slope(&line).unwrap();
        assert!((s - 12.0).abs() < 1e-9, "{s}");
        let flat: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 7.0)).collect();
        assert_eq!(slope(&flat), Some(0.0));
        assert_eq!(slope(&flat[..2]), None);
    }

    #[test]
    fn a_process_that_lived_the_whole_run_is_reported_apart() {
        let mut memory = Memory::default();
        let samples = |from: u32, to: u32, mib: f64| -> Vec<(f64, f64)> {
            (from..=to).map(|t| (f64::from(t), mib)).collect()
        };
        memory
            .series
            .insert(("server 1".to_owned(), 10), samples(0, 100, 30.0));
        memory
            .series
            .insert(("server 2".to_owned(), 11), samples(0, 30, 30.0));
        memory
            .series
            .insert(("server 2".to_owned(), 12), samples(31, 100, 31.0));
        let lines = memory.report(Duration::from_secs(100));
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with(
                "server 1, one process for the whole run: 30.0 → 30.0 MiB, trend +0.000"
            ),
            "{}",
            lines[0]
        );
        assert!(lines[1].contains("(server 2, over 69 s)"), "{}", lines[1]);
    }
}
