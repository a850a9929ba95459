//! The soak's faults as data: a schedule drawn from a seed, so a failing run can be replayed
//! fault for fault, and printed in the report with each fault's time.

use std::time::Duration;

/// What a fault does to one agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// kill -9, and a new process after `hold`.
    Kill,
    /// SIGSTOP, and SIGCONT after `hold`.
    Freeze,
    /// Every connection of its links to the servers reset, and new ones refused for `hold`:
    /// shorter or longer than the resume window.
    Cut,
}

impl FaultKind {
    pub const ALL: [FaultKind; 3] = [FaultKind::Kill, FaultKind::Freeze, FaultKind::Cut];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill -9 and restart",
            FaultKind::Freeze => "SIGSTOP, then SIGCONT",
            FaultKind::Cut => "links cut",
        }
    }

    /// How long the fault lasts before it heals, at most.
    fn max_hold(self) -> Duration {
        match self {
            FaultKind::Kill => Duration::from_secs(3),
            FaultKind::Freeze => Duration::from_secs(4),
            // Up to twice the default 4 s resume window: some streams resume, some end.
            FaultKind::Cut => Duration::from_secs(8),
        }
    }
}

/// One fault: at `at` after the start, `kind` on agent `agent`, healed `hold` later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub at: Duration,
    pub kind: FaultKind,
    pub agent: usize,
    pub hold: Duration,
}

/// Draws the faults of a run: one every `gap` (jittered by half either way) until `until`,
/// each of a random kind on a random agent that has no fault still unhealed, so every
/// fault heals on its own and no agent takes two at once.
pub fn draw(seed: u64, agents: usize, gap: Duration, until: Duration) -> Vec<Fault> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut faults: Vec<Fault> = Vec::new();
    let mut at = Duration::ZERO;
    let millis = |d: Duration| d.as_millis() as u64;
    loop {
        at += Duration::from_millis(rng.u64(millis(gap) / 2..=millis(gap) * 3 / 2));
        let kind = FaultKind::ALL[rng.usize(..FaultKind::ALL.len())];
        let hold = Duration::from_millis(rng.u64(200..=millis(kind.max_hold())));
        if at + hold >= until {
            break;
        }
        let busy = |agent: usize| {
            faults
                .iter()
                .any(|f| f.agent == agent && f.at + f.hold + Duration::from_secs(1) > at)
        };
        let free: Vec<usize> = (0..agents).filter(|a| !busy(*a)).collect();
        if free.is_empty() {
            continue;
        }
        let agent = free[rng.usize(..free.len())];
        faults.push(Fault {
            at,
            kind,
            agent,
            hold,
        });
    }
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    const GAP: Duration = Duration::from_secs(2);
    const UNTIL: Duration = Duration::from_secs(600);

    #[test]
    fn a_seed_draws_the_same_schedule_and_another_seed_another() {
        assert_eq!(draw(7, 10, GAP, UNTIL), draw(7, 10, GAP, UNTIL));
        assert_ne!(draw(7, 10, GAP, UNTIL), draw(8, 10, GAP, UNTIL));
    }

    #[test]
    fn every_fault_heals_before_the_end_and_no_agent_takes_two_at_once() {
        for seed in 0..50 {
            let faults = draw(seed, 4, GAP, UNTIL);
            assert!(faults.len() > 100, "seed {seed}: {} faults", faults.len());
            for (i, f) in faults.iter().enumerate() {
                assert!(f.at + f.hold < UNTIL);
                assert!(f.agent < 4);
                assert!(f.hold <= f.kind.max_hold());
                for g in &faults[..i] {
                    assert!(
                        g.agent != f.agent || g.at + g.hold < f.at,
                        "seed {seed}: {g:?} overlaps {f:?}"
                    );
                }
            }
            for kind in FaultKind::ALL {
                assert!(
                    faults.iter().any(|f| f.kind == kind),
                    "seed {seed}: {kind:?}"
                );
            }
        }
    }
}
