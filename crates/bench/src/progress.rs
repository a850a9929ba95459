//! Progress on stderr, one line per event, so that it reads the same in a terminal and in CI
//! logs: which step of how many, what is being measured, elapsed and estimated time left.

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug)]
pub struct Progress {
    start: Instant,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    total_steps: usize,
    step: usize,
    /// Estimated seconds of all steps, and of the finished ones.
    total_weight: f64,
    done_weight: f64,
    current_weight: f64,
    label: String,
}

impl Progress {
    pub fn new(total_steps: usize, total_weight: f64) -> Self {
        Self {
            start: Instant::now(),
            state: Mutex::new(State {
                total_steps,
                step: 0,
                total_weight: total_weight.max(1.0),
                done_weight: 0.0,
                current_weight: 0.0,
                label: String::new(),
            }),
        }
    }

    /// Starts the next step (`weight`: its estimated seconds).
    pub fn begin(&self, label: &str, weight: f64) {
        let mut s = self.state.lock().expect("progress lock");
        s.done_weight += s.current_weight;
        s.current_weight = weight;
        s.step += 1;
        s.label = label.to_owned();
        let elapsed = self.start.elapsed().as_secs_f64();
        let frac = (s.done_weight / s.total_weight).clamp(0.0, 1.0);
        let left = if frac > 0.02 {
            format!(", ~{} left", clock(elapsed / frac - elapsed))
        } else {
            String::new()
        };
        eprintln!(
            "[{:>3}/{} {:>3.0}% {}{}] {}",
            s.step,
            s.total_steps,
            frac * 100.0,
            clock(elapsed),
            left,
            label
        );
    }

    /// A detail of the current step (a result, or how far a long step is).
    pub fn note(&self, msg: &str) {
        eprintln!("          {msg}");
    }
}

/// `mm:ss`.
pub fn clock(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    format!("{:02}:{:02}", s / 60, s % 60)
}

/// Rate-limits "how far" notes inside a long step.
#[derive(Debug)]
pub struct Ticker {
    every: Duration,
    last: Instant,
}

impl Ticker {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: Instant::now(),
        }
    }

    pub fn due(&mut self) -> bool {
        if self.last.elapsed() >= self.every {
            self.last = Instant::now();
            true
        } else {
            false
        }
    }
}
