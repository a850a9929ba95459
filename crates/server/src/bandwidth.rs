//! The server's bandwidth (`bandwidth.bytes_per_second` in the routing file), shared by the
//! tenants that use it in proportion to their weights.
//!
//! Tenants never share an agent stream, so what they contend for is the server itself; this
//! gives that contention a declared size and a fair split. Every [`PLAN_PERIOD`] the planner
//! looks at what each tenant moved and whether it had to wait:
//! - a tenant that waited is *limited*: it wants more than it got;
//! - a tenant that moved bytes without waiting is *satisfied*: it keeps what it uses, and may
//!   grow to its weighted share of the busy tenants before it waits;
//! - the limited tenants split what the satisfied ones leave, by weight, and never get less
//!   than their weighted share.
//!
//! So the split is weighted max-min fair and work-conserving: an idle or light tenant's share
//! goes to the others within a period. The rates feed each tenant's own token bucket
//! ([`crate::byte_rate`]), which applies them with back-pressure. The planner is plain state
//! and arithmetic on the instants it is given, tested without a clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use tether_observe::metrics::Gauge;

/// How often the split is planned again: short enough that a freed share moves on quickly,
/// long enough to see each busy tenant move a few chunks.
pub(crate) const PLAN_PERIOD: Duration = Duration::from_millis(50);

/// One tenant's place in the plan.
#[derive(Debug)]
struct TenantUse {
    weight: f64,
    /// Bytes charged since the last plan.
    moved: f64,
    /// Whether it waited for its bucket since the last plan.
    waited: bool,
    /// The end of its latest wait: a tenant asleep through a whole period still wants more.
    waits_until: Option<Instant>,
    /// Its bytes/s until the next plan.
    rate: f64,
    /// `tether_server_tenant_bandwidth_share_bytes_per_second` for it.
    gauge: Arc<Gauge>,
}

#[derive(Debug)]
struct Plan {
    tenants: Vec<TenantUse>,
    planned_at: Instant,
}

/// The server's bandwidth and each tenant's current rate within it.
#[derive(Debug)]
pub(crate) struct Bandwidth {
    per_second: f64,
    plan: Mutex<Plan>,
}

impl Bandwidth {
    /// A bandwidth of `per_second` for tenants with these `weights` and rate `gauges`,
    /// indexed as given.
    pub(crate) fn new(
        per_second: u64,
        weights: &[u32],
        gauges: Vec<Arc<Gauge>>,
        now: Instant,
    ) -> Self {
        let per_second = per_second as f64;
        let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
        let tenants = weights
            .iter()
            .zip(gauges)
            .map(|(&w, gauge)| {
                // Before any traffic: each tenant's share as if all were busy.
                let rate = per_second * f64::from(w) / total;
                gauge.set(rate as i64);
                TenantUse {
                    weight: f64::from(w),
                    moved: 0.0,
                    waited: false,
                    waits_until: None,
                    rate,
                    gauge,
                }
            })
            .collect();
        Self {
            per_second,
            plan: Mutex::new(Plan {
                tenants,
                planned_at: now,
            }),
        }
    }

    /// Records that tenant `index` moved `bytes` at `now`; its current rate in bytes/s.
    pub(crate) fn moved(&self, index: usize, bytes: usize, now: Instant) -> f64 {
        let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        if now.saturating_duration_since(plan.planned_at) >= PLAN_PERIOD {
            self.replan(&mut plan, now);
        }
        let tenant = &mut plan.tenants[index];
        tenant.moved += bytes as f64;
        tenant.rate
    }

    /// Records that tenant `index` has to wait for its bucket until `until`.
    pub(crate) fn waits(&self, index: usize, until: Instant) {
        let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        let tenant = &mut plan.tenants[index];
        tenant.waited = true;
        tenant.waits_until = tenant.waits_until.max(Some(until));
    }

    fn replan(&self, plan: &mut Plan, now: Instant) {
        let seconds = now.saturating_duration_since(plan.planned_at).as_secs_f64();
        for tenant in &mut plan.tenants {
            tenant.waited |= tenant.waits_until.is_some_and(|until| until > now);
        }
        let busy = |t: &TenantUse| t.moved > 0.0 || t.waited;
        let busy_weight: f64 = plan
            .tenants
            .iter()
            .filter(|t| busy(t))
            .map(|t| t.weight)
            .sum();
        let limited_weight: f64 = plan
            .tenants
            .iter()
            .filter(|t| t.waited)
            .map(|t| t.weight)
            .sum();
        let satisfied_use: f64 = plan
            .tenants
            .iter()
            .filter(|t| busy(t) && !t.waited)
            .map(|t| t.moved / seconds)
            .sum();
        let left_over = (self.per_second - satisfied_use).max(0.0);
        for tenant in &mut plan.tenants {
            // What it gets if all busy tenants (and it) want more than their share.
            let joining = if busy(tenant) { 0.0 } else { tenant.weight };
            let share = self.per_second * tenant.weight / (busy_weight + joining);
            tenant.rate = if tenant.waited {
                share.max(left_over * tenant.weight / limited_weight)
            } else {
                share
            };
            tenant.gauge.set(tenant.rate as i64);
            tenant.moved = 0.0;
            tenant.waited = false;
        }
        plan.planned_at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = (1 << 20) as f64;

    /// Runs one plan period in which each tenant moves `moved[i]` bytes and waits or not, and
    /// returns the rates planned for the next.
    fn period(bw: &Bandwidth, t: &mut Instant, moved: &[(usize, bool)]) -> Vec<f64> {
        for (i, &(bytes, waited)) in moved.iter().enumerate() {
            if bytes > 0 {
                bw.moved(i, bytes, *t);
            }
            if waited {
                bw.waits(i, *t);
            }
        }
        *t += PLAN_PERIOD;
        (0..moved.len()).map(|i| bw.moved(i, 0, *t)).collect()
    }

    fn bandwidth(per_second: u64, weights: &[u32], now: Instant) -> Bandwidth {
        let gauges = weights.iter().map(|_| Arc::default()).collect();
        Bandwidth::new(per_second, weights, gauges, now)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-4 * b.max(1.0)
    }

    #[test]
    fn contending_tenants_split_by_weight() {
        let mut t = Instant::now();
        let bw = bandwidth(4 << 20, &[3, 1, 1], t);
        // Before traffic: shares of all three.
        assert!(close(bw.moved(0, 0, t), 4.0 * MIB * 3.0 / 5.0));
        // Tenants 0 and 1 both want more than they get; tenant 2 is idle.
        let chunk = (MIB * 0.1) as usize;
        let rates = period(&bw, &mut t, &[(chunk, true), (chunk, true), (0, false)]);
        assert!(close(rates[0], 3.0 * MIB), "{rates:?}");
        assert!(close(rates[1], MIB), "{rates:?}");
        // The idle tenant would get its share of the busy ones and itself.
        assert!(close(rates[2], 4.0 * MIB / 5.0), "{rates:?}");
    }

    #[test]
    fn a_light_tenants_unused_share_goes_to_the_limited_one() {
        let mut t = Instant::now();
        let bw = bandwidth(4 << 20, &[1, 1], t);
        // Tenant 1 moves 0.5 MiB/s without waiting; tenant 0 is limited.
        let light = (0.5 * MIB * PLAN_PERIOD.as_secs_f64()) as usize;
        let rates = period(&bw, &mut t, &[(1 << 16, true), (light, false)]);
        assert!(close(rates[0], 3.5 * MIB), "{rates:?}");
        // The light one may still grow to its weighted share before it waits.
        assert!(close(rates[1], 2.0 * MIB), "{rates:?}");
        // Alone, a tenant gets everything.
        let rates = period(&bw, &mut t, &[(1 << 16, true), (0, false)]);
        assert!(close(rates[0], 4.0 * MIB), "{rates:?}");
    }

    #[test]
    fn a_limited_tenant_never_gets_less_than_its_share() {
        let mut t = Instant::now();
        let bw = bandwidth(4 << 20, &[1, 1], t);
        // The satisfied tenant moved more than the whole bandwidth in one period (a burst):
        // the limited one still keeps its half.
        let burst = (8.0 * MIB * PLAN_PERIOD.as_secs_f64()) as usize;
        let rates = period(&bw, &mut t, &[(1 << 16, true), (burst, false)]);
        assert!(close(rates[0], 2.0 * MIB), "{rates:?}");
    }

    #[test]
    fn rates_hold_between_plans() {
        let t = Instant::now();
        let bw = bandwidth(1 << 20, &[1, 1], t);
        bw.waits(0, t);
        let before = bw.moved(0, 1000, t);
        assert!(close(bw.moved(0, 1000, t + PLAN_PERIOD / 2), before));
    }

    #[test]
    fn a_tenant_asleep_through_a_period_still_counts_as_limited() {
        let mut t = Instant::now();
        let bw = bandwidth(4 << 20, &[3, 1], t);
        bw.moved(0, 1 << 16, t);
        bw.waits(0, t);
        // Tenant 1 waits past the next plan, and the one after it.
        bw.moved(1, 1 << 16, t);
        bw.waits(1, t + PLAN_PERIOD * 3);
        for _ in 0..2 {
            t += PLAN_PERIOD;
            let rates = [bw.moved(0, 1 << 16, t), bw.moved(1, 0, t)];
            bw.waits(0, t);
            assert!(close(rates[0], 3.0 * MIB), "{rates:?}");
            assert!(close(rates[1], MIB), "{rates:?}");
        }
    }
}
