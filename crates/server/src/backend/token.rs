//! Agent authentication by bearer token (upstream's ServiceAccount token authentication).
//!
//! The server only reads the `authorization` metadata; who vouches for a token (a TokenReview
//! against the Kubernetes API, with its cache) is a [`TokenAuthenticator`] handed in by the
//! binary, so this crate links no Kubernetes client. What the token then proves about the
//! agent's identifiers is `binding`'s concern.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tether_grpc::{Code, LogText, Principal, Status};
use tether_proto::metadata::{self, Metadata};

use super::binding::NodeAddresses;

/// What a reviewed token proved about the agent presenting it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenIdentity {
    /// The authenticated user, `system:serviceaccount:NS:NAME`.
    pub username: String,
    /// The node of the pod the token is bound to, when the token carries one.
    pub node: Option<String>,
}

/// Why a token did not admit an agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenRefusal {
    /// The token is not valid for this server: the agent should not retry with it.
    Invalid(String),
    /// The token could not be checked now (the API server is unreachable, throttled or
    /// refused the review): the agent may retry.
    Unavailable(String),
}

/// A boxed future, so the trait stays object-safe without an async-trait dependency.
pub type AuthFuture<'a> =
    Pin<Box<dyn Future<Output = Result<TokenIdentity, TokenRefusal>> + Send + 'a>>;

/// Checks bearer tokens for the agent listener.
pub trait TokenAuthenticator: Send + Sync + fmt::Debug + 'static {
    /// Reviews `token` (without its `Bearer ` prefix) presented from `peer` (the agent's
    /// address, which bounds how many reviews one source can cause).
    fn authenticate<'a>(&'a self, token: &'a str, peer: Option<SocketAddr>) -> AuthFuture<'a>;

    /// Why new agents cannot be authenticated right now (shown on `/readyz`), or `None`.
    fn unready_reason(&self) -> Option<String>;
}

/// Token authentication of agent streams.
#[derive(Clone, Debug)]
pub struct AgentTokenAuth {
    pub authenticator: Arc<dyn TokenAuthenticator>,
    /// Where the addresses of a token's node are read, to prove the agent's `ipv4=`/`ipv6=`
    /// identifiers; `None` refuses those claims (`--agent-identity-binding`).
    pub nodes: Option<Arc<dyn NodeAddresses>>,
}

impl AgentTokenAuth {
    /// Authenticates an agent stream's metadata; the principal that then owns its agent ID.
    pub(crate) async fn check(
        &self,
        headers: &Metadata,
        peer: Option<SocketAddr>,
    ) -> Result<Principal, Status> {
        let token = bearer(headers).map_err(|e| unauthenticated(&e))?;
        let identity =
            self.authenticator.authenticate(token, peer).await.map_err(
                |refusal| match refusal {
                    TokenRefusal::Invalid(why) => unauthenticated(&why),
                    TokenRefusal::Unavailable(why) => Status::new(
                        Code::UNAVAILABLE,
                        format!("agent token could not be checked: {why}"),
                    ),
                },
            )?;
        Ok(Principal::Token {
            username: identity.username,
            node: identity.node,
        })
    }
}

fn unauthenticated(why: &str) -> Status {
    Status::new(
        Code::UNAUTHENTICATED,
        format!("agent token refused: {}", LogText(why)),
    )
}

/// The one `authorization` value's token, with upstream's checks.
fn bearer(headers: &Metadata) -> Result<&str, String> {
    let mut values = headers.get_all(metadata::AUTHORIZATION);
    let value = match (values.next(), values.count()) {
        (None, _) => return Err("no authorization metadata (the agent sent no token)".into()),
        (Some(value), 0) => value,
        (Some(_), more) => return Err(format!("too many ({}) tokens are received", more + 1)),
    };
    let value = metadata::text(value).ok_or("the token is not text")?;
    value
        .strip_prefix("Bearer ")
        .filter(|token| !token.is_empty())
        .ok_or_else(|| "the authorization value does not have the \"Bearer \" prefix".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> Metadata {
        let mut h = Metadata::default();
        for v in values {
            h.push(metadata::AUTHORIZATION, v.to_string());
        }
        h
    }

    #[test]
    fn bearer_needs_exactly_one_prefixed_value() {
        assert_eq!(bearer(&headers(&["Bearer abc"])), Ok("abc"));
        assert!(
            bearer(&headers(&[]))
                .unwrap_err()
                .contains("no authorization")
        );
        assert!(
            bearer(&headers(&["Bearer a", "Bearer b"]))
                .unwrap_err()
                .contains("too many (2)")
        );
        for bad in ["abc", "bearer abc", "Bearer "] {
            assert!(
                bearer(&headers(&[bad])).unwrap_err().contains("prefix"),
                "{bad}"
            );
        }
    }
}
