//! What `tether server` starts besides the server itself: the one Kubernetes API client,
//! built only when a feature needs it (token authentication, Leases), and what uses it.

use std::sync::Arc;

use anyhow::Context as _;
use tether_kube::node_addresses::NodeAddressLookup;
use tether_kube::token_review::TokenReviewAuthenticator;
use tether_kube::{KubeApi, KubeApiOptions};
use tether_observe::metrics::Registry;
use tether_server::{AgentTokenAuth, Config, IdentityBinding, NodeAddresses};

use super::token_auth::TokenAuth;

/// A validated server command line.
#[derive(Debug)]
pub(crate) struct ServerLaunch {
    pub(crate) config: Config,
    /// `--routing-config`: watched while the server runs.
    pub(crate) routing_file: Option<super::routing::RoutingFile>,
    /// Set when some feature needs the Kubernetes API.
    pub(crate) kube: Option<KubeApiOptions>,
    pub(crate) token_auth: Option<TokenAuth>,
    /// `--enable-lease-controller`: started by the caller once the server is bound.
    pub(crate) leases: Option<super::ServerLeases>,
    /// `--control-plane-endpoints=kubeconfig`: reverse dials may reach the API server of the
    /// Kubernetes client (built for it).
    pub(crate) control_plane_from_kubeconfig: bool,
}

impl ServerLaunch {
    /// Builds the Kubernetes client if one is needed and wires token authentication into
    /// the configuration; returns the client with the Lease settings, for the Lease tasks.
    pub(crate) async fn start(
        self,
        registry: &Registry,
    ) -> anyhow::Result<(Config, Option<(KubeApi, super::ServerLeases)>)> {
        let Self {
            mut config,
            routing_file,
            kube,
            token_auth,
            leases,
            control_plane_from_kubeconfig,
        } = self;
        if let Some(file) = routing_file {
            let reloader = file.watch(registry)?;
            config.routing = (*reloader.current().config).clone();
            config.routing_reload = Some(Arc::new(reloader));
        }
        let Some(options) = kube else {
            return Ok((config, None));
        };
        let api = KubeApi::connect(&options)
            .await
            .context("--kubeconfig: the Kubernetes API client")?;
        if control_plane_from_kubeconfig {
            let endpoint = api.endpoint().context(
                "--control-plane-endpoints=kubeconfig: the API server's address is not known from --kubeconfig; list it as HOST:PORT",
            )?;
            tracing::info!(
                endpoint,
                "agents' control-plane connections (reverse dials) may reach the API server of --kubeconfig (--control-plane-endpoints=kubeconfig)"
            );
            config.control_plane =
                tether_server::ControlPlaneEndpoints::new(vec![endpoint.to_owned()]);
        }
        if let Some(auth) = token_auth {
            tracing::info!(
                namespace = %auth.account.namespace,
                service_account = %auth.account.name,
                audience = %auth.account.audience,
                "authenticating agents by ServiceAccount token (TokenReview)"
            );
            let authenticator =
                TokenReviewAuthenticator::new(api.clone(), auth.account, auth.cache, registry)
                    .with_address_limit(auth.per_address);
            // Only read when the binding needs a token agent's node addresses.
            let nodes = (config.agent_identity_binding != IdentityBinding::Off)
                .then(|| Arc::new(NodeAddressLookup::new(api.clone())) as Arc<dyn NodeAddresses>);
            config.agent_token_auth = Some(AgentTokenAuth {
                authenticator: Arc::new(authenticator),
                nodes,
            });
        }
        Ok((config, leases.map(|leases| (api, leases))))
    }
}
