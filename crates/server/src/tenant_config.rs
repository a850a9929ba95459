//! A tenant as the routing file declares it: its name, the identities of its clients and
//! agents, its caps and its own frontend. Plain data below the tenant table, the reverse
//! dial policy and the server's listeners, which each read their part of it.

use crate::identity::Identity;
use crate::tenant_frontend::TenantFrontend;

/// Most tenants a routing file may declare: bounds the `tenant` label's cardinality.
pub const MAX_TENANTS: usize = 10_000;

/// Caps on one tenant; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TenantLimits {
    /// Established connections plus pending dials.
    pub connections: Option<u64>,
    pub pending_dials: Option<u64>,
    /// New dials per second, with a burst of one second's worth.
    pub dials_per_second: Option<f64>,
    /// Bytes per second over all the tenant's connections, both directions together.
    pub bytes_per_second: Option<u64>,
}

/// One row of the tenant table.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantConfig {
    pub name: String,
    pub clients: Vec<Identity>,
    pub agents: Vec<Identity>,
    pub limits: TenantLimits,
    /// The tenant's own listeners: every client on them is this tenant's.
    pub frontend: Option<TenantFrontend>,
    /// Its share of the server's bandwidth against other busy tenants (1 unless set).
    pub weight: u32,
    /// Where its agents' reverse dials may go; `None`: the server's `--control-plane-endpoints`,
    /// empty: nowhere.
    pub control_plane_endpoints: Option<Vec<String>>,
}
