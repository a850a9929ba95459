//! The running configuration: one generation of the routing file, as dials and agent streams
//! read it. A value, never changed once built: a reload builds the next one
//! ([`crate::reload`]) and swaps it in as a whole, so a dial sees one generation from its
//! tenant to its destination policy, never half of two.
//!
//! What must outlive a generation (a tenant's agents, registry, load and buckets) is not in
//! here but in each tenant's [`TenantState`](crate::tenant::TenantState), which the next
//! generation takes over by name.

use std::sync::Arc;

use crate::backend::outlier::EjectionConfig;
use crate::control_plane::ReversePolicy;
use crate::destinations::DestinationPolicies;
use crate::tenant::{TenantState, Tenants};

/// One generation of the routing file at run time.
#[derive(Debug)]
pub(crate) struct Running {
    /// 1 at start, one more per applied reload.
    pub(crate) generation: u64,
    /// The tenant table: who belongs where, each tenant's limits.
    pub(crate) tenants: Tenants,
    /// What each frontend client may ask for, checked before any agent is chosen.
    pub(crate) destinations: DestinationPolicies,
    /// Where each tenant's agents' reverse dials may go.
    pub(crate) control_plane: ReversePolicy,
    /// Outlier ejection for agent streams admitted under this generation.
    pub(crate) ejection: EjectionConfig,
    /// Tenants this or an earlier generation removed whose agent streams had not all ended
    /// when it was built: they wait out the grace period, and `/debug/agents` lists them.
    pub(crate) leaving: Vec<Arc<TenantState>>,
}
