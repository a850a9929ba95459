//! Metrics of agent selection: which strategy answered, among how many, and ejections.

use std::sync::{Arc, OnceLock};

use tether_observe::metrics::{Counter, CounterVec, Histogram, Registry};

use super::selection::Strategy;

const CANDIDATE_BUCKETS: [f64; 9] = [1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 100.0, 1000.0, 10000.0];

#[derive(Debug)]
pub(crate) struct SelectionMetrics {
    selections: Arc<CounterVec>,
    /// Children of `selections` per strategy, looked up once: selection runs per dial.
    by_strategy: [OnceLock<Arc<Counter>>; 6],
    candidates: Arc<Histogram>,
    pub(crate) ejections: Arc<Counter>,
    pub(crate) recoveries: Arc<Counter>,
}

impl SelectionMetrics {
    pub(crate) fn register(registry: &Registry) -> Self {
        Self {
            selections: registry.counter_vec(
                "tether_server_agent_selections_total",
                "Dials given an agent, by the proxy strategy that chose it",
                &["proxy_strategy"],
            ),
            by_strategy: Default::default(),
            candidates: registry.histogram(
                "tether_server_agent_selection_candidates",
                "Agent streams the answering strategy chose among, per dial",
                &CANDIDATE_BUCKETS,
            ),
            ejections: registry.counter(
                "tether_server_agent_ejections_total",
                "Agent streams ejected from selection after consecutive failed dials",
            ),
            recoveries: registry.counter(
                "tether_server_agent_recoveries_total",
                "Ejected agent streams that answered a dial successfully again",
            ),
        }
    }

    pub(crate) fn selected(&self, strategy: Strategy, candidates: usize) {
        self.by_strategy[strategy as usize]
            .get_or_init(|| self.selections.with(&[strategy.as_str()]))
            .inc();
        self.candidates.observe(candidates as f64);
    }
}
