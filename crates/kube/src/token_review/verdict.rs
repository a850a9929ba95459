//! What a TokenReview's answer means for an agent, with upstream's checks: the token is
//! authenticated, the user is `system:serviceaccount:NS:NAME` with exactly those four parts,
//! and NS and NAME are the configured ones, or anything where the configuration says
//! [`ANY`] (tether: the routing file's `sa:` tenant identities then decide).

use k8s_openapi::api::authentication::v1::TokenReviewStatus;
use tether_server::TokenIdentity;

/// The `user.extra` key under which bound ServiceAccount tokens carry their pod's node.
pub(crate) const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// `--agent-namespace` or `--agent-service-account` accepting any value (tether). Only
/// allowed with a tenant table, which refuses every agent it does not map.
pub const ANY: &str = "*";

/// Which tokens admit an agent: upstream's `--agent-namespace`, `--agent-service-account`
/// and `--authentication-audience`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentServiceAccount {
    pub namespace: String,
    pub name: String,
    pub audience: String,
}

/// The API server's answer, judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Admit(TokenIdentity),
    /// Why the token does not admit an agent.
    Refuse(String),
}

impl AgentServiceAccount {
    pub(crate) fn judge(&self, status: Option<&TokenReviewStatus>) -> Verdict {
        let Some(status) = status else {
            return Verdict::Refuse("the TokenReview came back without a status".into());
        };
        if status.authenticated != Some(true) {
            return Verdict::Refuse(match status.error.as_deref() {
                Some(error) if !error.is_empty() => format!("lookup failed: {error}"),
                _ => "lookup failed: service account jwt not valid".into(),
            });
        }
        // The API server already checked the audience; a status that names others is not
        // an answer to this review.
        if let Some(audiences) = &status.audiences
            && !audiences.contains(&self.audience)
        {
            return Verdict::Refuse(format!(
                "the token is valid for audiences {audiences:?}, not {:?}",
                self.audience
            ));
        }
        let user = status.user.as_ref();
        let username = user.and_then(|u| u.username.as_deref()).unwrap_or("");
        let parts: Vec<&str> = username.split(':').collect();
        let [system, serviceaccount, namespace, name] = parts[..] else {
            return Verdict::Refuse(format!("unexpected username format {username:?}"));
        };
        if system != "system" || serviceaccount != "serviceaccount" {
            return Verdict::Refuse(format!("username {username:?} is not a service account"));
        }
        if self.namespace != ANY && namespace != self.namespace {
            return Verdict::Refuse(format!(
                "incoming request from {namespace:?} namespace. Expected {:?}",
                self.namespace
            ));
        }
        if self.name != ANY && name != self.name {
            return Verdict::Refuse(format!(
                "incoming request from {name:?} service account. Expected {:?}",
                self.name
            ));
        }
        let node = user
            .and_then(|u| u.extra.as_ref())
            .and_then(|extra| extra.get(NODE_NAME_EXTRA))
            .and_then(|values| values.first())
            .filter(|node| !node.is_empty())
            .cloned();
        Verdict::Admit(TokenIdentity {
            username: username.to_owned(),
            node,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::authentication::v1::UserInfo;

    use super::*;

    fn sa() -> AgentServiceAccount {
        AgentServiceAccount {
            namespace: "kube-system".into(),
            name: "konnectivity-agent".into(),
            audience: "system:konnectivity-server".into(),
        }
    }

    fn ok(username: &str, node: Option<&str>) -> TokenReviewStatus {
        let extra =
            node.map(|n| BTreeMap::from([(NODE_NAME_EXTRA.to_owned(), vec![n.to_owned()])]));
        TokenReviewStatus {
            authenticated: Some(true),
            audiences: Some(vec!["system:konnectivity-server".into()]),
            user: Some(UserInfo {
                username: Some(username.into()),
                extra,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn refused(status: &TokenReviewStatus) -> String {
        match sa().judge(Some(status)) {
            Verdict::Refuse(why) => why,
            Verdict::Admit(id) => panic!("admitted {id:?}"),
        }
    }

    #[test]
    fn admits_the_service_account_with_its_node() {
        let user = "system:serviceaccount:kube-system:konnectivity-agent";
        assert_eq!(
            sa().judge(Some(&ok(user, Some("node-1")))),
            Verdict::Admit(TokenIdentity {
                username: user.into(),
                node: Some("node-1".into())
            })
        );
        assert_eq!(
            sa().judge(Some(&ok(user, None))),
            Verdict::Admit(TokenIdentity {
                username: user.into(),
                node: None
            })
        );
    }

    #[test]
    fn refuses_with_upstreams_reasons() {
        let not_authenticated = TokenReviewStatus {
            error: Some("invalid bearer token".into()),
            ..Default::default()
        };
        assert_eq!(
            refused(&not_authenticated),
            "lookup failed: invalid bearer token"
        );
        assert_eq!(
            refused(&TokenReviewStatus::default()),
            "lookup failed: service account jwt not valid"
        );
        for (user, want) in [
            (
                "system:serviceaccount:kube-system",
                "unexpected username format",
            ),
            ("system:serviceaccount:a:b:c", "unexpected username format"),
            (
                "system:node:kube-system:konnectivity-agent",
                "is not a service account",
            ),
            (
                "system:serviceaccount:default:konnectivity-agent",
                "\"default\" namespace",
            ),
            (
                "system:serviceaccount:kube-system:other",
                "\"other\" service account",
            ),
        ] {
            let why = refused(&ok(user, None));
            assert!(why.contains(want), "{user}: {why}");
        }
        let mut other_audience = ok("system:serviceaccount:kube-system:konnectivity-agent", None);
        other_audience.audiences = Some(vec!["https://kubernetes.default.svc".into()]);
        assert!(refused(&other_audience).contains("audiences"));
        assert!(matches!(sa().judge(None), Verdict::Refuse(_)));
    }

    #[test]
    fn any_namespace_and_name_admit_every_service_account_but_nothing_else() {
        let any = AgentServiceAccount {
            namespace: ANY.into(),
            name: ANY.into(),
            ..sa()
        };
        let user = "system:serviceaccount:tenant-a:agent";
        assert!(
            matches!(any.judge(Some(&ok(user, None))), Verdict::Admit(id) if id.username == user)
        );
        for user in [
            "system:node:tenant-a:agent",
            "system:serviceaccount:tenant-a",
        ] {
            assert!(
                matches!(any.judge(Some(&ok(user, None))), Verdict::Refuse(_)),
                "{user}"
            );
        }
        let any_name = AgentServiceAccount {
            name: ANY.into(),
            ..sa()
        };
        assert!(matches!(
            any_name.judge(Some(&ok("system:serviceaccount:kube-system:x", None))),
            Verdict::Admit(_)
        ));
        assert!(matches!(
            any_name.judge(Some(&ok("system:serviceaccount:default:x", None))),
            Verdict::Refuse(_)
        ));
    }
}
