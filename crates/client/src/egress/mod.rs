//! kube-apiserver's egress selector for Rust callers: load an EgressSelectorConfiguration
//! file (`--egress-selector-config-file`), validate it as kube-apiserver does, and get a
//! dialer per selection (`cluster`, `controlplane`, `etcd`).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use tether_client::egress::{EgressSelector, Selection};
//! let selector = EgressSelector::load("/etc/kubernetes/egress.yaml".as_ref())?;
//! if let Some(dialer) = selector.dialer(Selection::Cluster) {
//!     let _stream = dialer.dial("10.0.0.1:10250").await?;
//! }
//! # Ok(()) }
//! ```
//!
//! Layout: `config` is the file's schema and decoding, `validate` kube-apiserver's checks,
//! `dialer` what a selection dials through, and `error` what each of them can refuse with.

mod config;
mod dialer;
mod error;
mod validate;

use std::path::Path;
use std::sync::Arc;

pub use config::{
    API_VERSIONS, Connection, EgressSelection, EgressSelectorConfiguration, KIND, TcpTransport,
    TlsConfig, Transport, UdsTransport,
};
pub use dialer::{CONNECT_TIMEOUT, EgressDialer, EgressStream};
pub use error::{EgressError, FieldError, FieldErrorKind, aggregate};
pub use validate::{SELECTION_NAMES, validate};

/// The networks kube-apiserver dials into, each configured by one selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Selection {
    /// Nodes, pods and services: what Konnectivity agents reach.
    Cluster,
    /// Webhooks and aggregated API servers on the control plane.
    ControlPlane,
    Etcd,
}

impl Selection {
    /// The name in the file (compared case-insensitively).
    pub fn name(self) -> &'static str {
        match self {
            Self::Cluster => "cluster",
            Self::ControlPlane => "controlplane",
            Self::Etcd => "etcd",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::Cluster, Self::ControlPlane, Self::Etcd]
            .into_iter()
            .find(|s| name.eq_ignore_ascii_case(s.name()))
    }
}

/// A dialer per configured selection. A selection the file does not name has none; callers
/// then dial directly, as kube-apiserver does.
#[derive(Debug, Default)]
pub struct EgressSelector {
    dialers: Vec<(Selection, Arc<EgressDialer>)>,
}

impl EgressSelector {
    /// Reads, validates and sets up the configuration at `path`.
    pub fn load(path: &Path) -> Result<Self, EgressError> {
        Self::new(&EgressSelectorConfiguration::read(path)?)
    }

    /// Validates `config` and builds its dialers.
    pub fn new(config: &EgressSelectorConfiguration) -> Result<Self, EgressError> {
        let errors = validate(config);
        if !errors.is_empty() {
            return Err(EgressError::Invalid(errors));
        }
        let mut dialers = Vec::with_capacity(config.egress_selections.len());
        for selection in &config.egress_selections {
            // Validation admits only known, distinct names.
            let Some(which) = Selection::from_name(&selection.name) else {
                continue;
            };
            let dialer = EgressDialer::new(&selection.connection).map_err(|e| match e {
                EgressError::Transport(reason) => {
                    EgressError::Transport(format!("selection {}: {reason}", which.name()))
                }
                other => other,
            })?;
            dialers.push((which, Arc::new(dialer)));
        }
        Ok(Self { dialers })
    }

    /// The dialer for `selection`, if the configuration has one.
    pub fn dialer(&self, selection: Selection) -> Option<Arc<EgressDialer>> {
        self.dialers
            .iter()
            .find(|(s, _)| *s == selection)
            .map(|(_, d)| Arc::clone(d))
    }
}
