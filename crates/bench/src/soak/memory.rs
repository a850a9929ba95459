//! The soak's processes' memory over the run: each process's samples, so that a restart starts
//! a series of its own rather than a dip in one. The first server and agent are never
//! restarted (see the schedule): their series span the whole run.
//!
//! A sample holds the process's RSS, its anonymous part (RSS without the pages of the binary
//! and libraries, which fault in as code runs for the first time and which the kernel can
//! drop), and, for tether's processes (started with `--enable-profiling`), two of its
//! allocator's figures (`/debug/pprof/heap`): the heap in use (handed out and not had back:
//! small chunks plus large mmapped blocks) and the heap held (everything the allocator has
//! from the kernel, in use or free). Anonymous RSS that grows while the heap in use stays
//! level is memory the allocator keeps, not data tether holds on to.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::task::JoinSet;

use super::agents::Agent;
use crate::systems::{Fleet, http_get, metric_sum};

/// A series is the whole run's when it spans this much of it at least.
const WHOLE_RUN: f64 = 0.9;
/// How long a process may take to give its heap figures: a frozen one gives none.
const HEAP_DEADLINE: Duration = Duration::from_secs(1);

/// One sample: seconds after the start, RSS, anonymous RSS and the heap's figures (MiB).
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: f64,
    rss: f64,
    anon: f64,
    heap: Option<Heap>,
}

/// A tether process's allocator figures, in MiB.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Heap {
    /// Handed out and not had back.
    in_use: f64,
    /// Had from the kernel, in use or free.
    held: f64,
}

#[derive(Debug, Default)]
pub struct Memory {
    /// (process name, pid) → samples.
    series: BTreeMap<(String, u32), Vec<Sample>>,
}

impl Memory {
    /// Samples every running server and agent at `at` after the start.
    pub async fn sample(&mut self, fleet: &Fleet, agents: &[Agent], at: Duration) {
        let servers = fleet.members.iter().enumerate().filter_map(|(n, m)| {
            let admin = (!m.upstream).then_some(m.admin);
            Some((format!("server {}", n + 1), m.proc.as_ref()?, admin))
        });
        let agents = agents.iter().filter_map(|a| {
            let admin = (!a.upstream).then_some(a.admin);
            Some((a.id.clone(), a.proc.as_ref()?, admin))
        });
        let mut heaps = JoinSet::new();
        for (name, proc, admin) in servers.chain(agents) {
            let key = (name, proc.pid);
            if let Some(port) = admin {
                let key = key.clone();
                heaps.spawn(async move { (key, heap(port).await) });
            }
            self.series.entry(key).or_default().push(Sample {
                at: at.as_secs_f64(),
                rss: mib(proc.rss()),
                anon: mib(proc.rss_anon()),
                heap: None,
            });
        }
        while let Some(joined) = heaps.join_next().await {
            let Ok((key, heap)) = joined else { continue };
            if let Some(last) = self.series.get_mut(&key).and_then(|s| s.last_mut()) {
                last.heap = heap;
            }
        }
    }

    /// Every sample, one line each (`process,pid,seconds,rss_mib,anon_rss_mib,heap_in_use_mib,
    /// heap_held_mib`; no heap figures for upstream's processes or a frozen one), for a closer
    /// look at a trend.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "process,pid,seconds,rss_mib,anon_rss_mib,heap_in_use_mib,heap_held_mib\n",
        );
        for ((name, pid), samples) in &self.series {
            for s in samples {
                let heap = s
                    .heap
                    .map(|h| format!("{:.2},{:.2}", h.in_use, h.held))
                    .unwrap_or_else(|| ",".to_owned());
                out.push_str(&format!(
                    "{name},{pid},{:.0},{:.2},{:.2},{heap}\n",
                    s.at, s.rss, s.anon
                ));
            }
        }
        out
    }

    /// The report's lines: each process that lived the whole run `run` long, with the first
    /// and last sample of its RSS and heap figures and their trends; and the steepest RSS trend
    /// of the others over a minute or more.
    pub fn report(&self, run: Duration) -> Vec<String> {
        let span = |samples: &[Sample]| match (samples.first(), samples.last()) {
            (Some(first), Some(last)) => last.at - first.at,
            _ => 0.0,
        };
        let whole = |samples: &[Sample]| span(samples) >= WHOLE_RUN * run.as_secs_f64();
        let mut lines: Vec<String> = self
            .series
            .iter()
            .filter(|(_, samples)| whole(samples))
            .filter_map(|((name, _), samples)| {
                let heap =
                    |figure: fn(&Heap) -> f64| points(samples, |s| Some(figure(s.heap.as_ref()?)));
                let mut line = format!(
                    "{name}, one process for the whole run: RSS {}; anonymous RSS {}",
                    trend(&points(samples, |s| Some(s.rss)))?,
                    trend(&points(samples, |s| Some(s.anon)))?
                );
                if let (Some(in_use), Some(held)) =
                    (trend(&heap(|h| h.in_use)), trend(&heap(|h| h.held)))
                {
                    line.push_str(&format!("; heap in use {in_use}; heap held {held}"));
                }
                Some(line)
            })
            .collect();
        let steepest = self
            .series
            .iter()
            .filter(|(_, samples)| !whole(samples) && span(samples) >= 60.0)
            .filter_map(|((name, _), samples)| {
                let rss = points(samples, |s| Some(s.rss));
                Some((name, slope(&rss)?, span(samples)))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1));
        lines.push(match steepest {
            Some((name, slope, span)) => format!(
                "the steepest RSS trend of the other processes that lived a minute or more: {slope:+.2} MiB/min ({name}, over {span:.0} s)"
            ),
            None => "no other process lived a minute".to_owned(),
        });
        lines
    }
}

/// `first → last MiB, trend ±x MiB/min, ±y MiB/min over the second half` of a series: past
/// warm-up, a leak keeps its slope in the second half, growth that levels off does not.
fn trend(points: &[(f64, f64)]) -> Option<String> {
    let second_half = &points[points.len() / 2..];
    Some(format!(
        "{:.1} → {:.1} MiB, trend {:+.3} MiB/min, {:+.3} MiB/min over the second half",
        points.first()?.1,
        points.last()?.1,
        slope(points)?,
        slope(second_half)?
    ))
}

/// A tether process's heap figures, from its `/debug/pprof/heap` on `admin`; `None` if it
/// does not answer within [`HEAP_DEADLINE`].
async fn heap(admin: u16) -> Option<Heap> {
    let (status, text) = tokio::time::timeout(HEAP_DEADLINE, http_get(admin, "/debug/pprof/heap"))
        .await
        .ok()?
        .ok()?;
    if status != 200 {
        return None;
    }
    // `name value` lines, as a Prometheus text exposition's.
    let figure = |name| metric_sum(&text, name, "");
    let mmapped = figure("malloc_mmap_bytes")?;
    Some(Heap {
        in_use: (figure("malloc_in_use_bytes")? + mmapped) / MIB,
        held: (figure("malloc_arena_bytes")? + mmapped) / MIB,
    })
}

const MIB: f64 = (1 << 20) as f64;

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB
}

/// One figure of each sample that has it, as (seconds, MiB) points.
fn points(samples: &[Sample], figure: impl Fn(&Sample) -> Option<f64>) -> Vec<(f64, f64)> {
    samples
        .iter()
        .filter_map(|s| Some((s.at, figure(s)?)))
        .collect()
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
        let samples = |from: u32, to: u32, rss: f64| -> Vec<Sample> {
            (from..=to)
                .map(|t| Sample {
                    at: f64::from(t),
                    rss,
                    anon: rss - 10.0,
                    heap: Some(Heap {
                        in_use: rss / 2.0 + f64::from(t) / 60.0,
                        held: rss / 2.0 + 1.0,
                    }),
                })
                .collect()
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
        assert_eq!(
            lines[0],
            "server 1, one process for the whole run: \
             RSS 30.0 → 30.0 MiB, trend +0.000 MiB/min, +0.000 MiB/min over the second half; \
             anonymous RSS 20.0 → 20.0 MiB, trend +0.000 MiB/min, +0.000 MiB/min over the second half; \
             heap in use 15.0 → 16.7 MiB, trend +1.000 MiB/min, +1.000 MiB/min over the second half; \
             heap held 16.0 → 16.0 MiB, trend +0.000 MiB/min, +0.000 MiB/min over the second half"
        );
        assert!(lines[1].contains("(server 2, over 69 s)"), "{}", lines[1]);
    }

    #[test]
    fn a_sample_without_heap_figures_leaves_its_column_empty() {
        let mut memory = Memory::default();
        let sample = |at, heap| Sample {
            at,
            rss: 20.0,
            anon: 4.0,
            heap,
        };
        memory.series.insert(
            ("soak-agent-3".to_owned(), 7),
            vec![
                sample(
                    0.0,
                    Some(Heap {
                        in_use: 4.5,
                        held: 9.25,
                    }),
                ),
                sample(5.0, None),
            ],
        );
        assert_eq!(
            memory.csv(),
            "process,pid,seconds,rss_mib,anon_rss_mib,heap_in_use_mib,heap_held_mib\n\
             soak-agent-3,7,0,20.00,4.00,4.50,9.25\n\
             soak-agent-3,7,5,20.00,4.00,,\n"
        );
    }
}
