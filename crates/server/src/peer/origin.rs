//! Who asked for a forwarded dial, carried from the server the client is connected to, to
//! the one that holds the agent: that server checks the client's tenant and destination
//! policy again, and names the client in its audit records, from what the first server's
//! listener proved.

use std::net::IpAddr;
use std::sync::Arc;

use tether_conn::CertificateNames;
use tether_grpc::{PeerIdentity, PeerTransport, UnixCredentials};
use tether_proto::{DialId, pb};

use crate::request::{FrontendKind, Hop, RequestContext};

/// `request`'s origin, for a dial this server (`server_id`) forwards; `tenant` is the one it
/// resolved the request to.
pub(crate) fn of(request: &RequestContext, tenant: &str, server_id: &str) -> pb::Origin {
    let peer = &request.peer;
    let certificate = peer.certificate.as_ref();
    let unix = peer.unix;
    pb::Origin {
        server_id: server_id.to_owned(),
        frontend: request.frontend.as_str().to_owned(),
        tenant: tenant.to_owned(),
        tenant_frontend: request.tenant.is_some(),
        dial_id: request.dial_id.0,
        transport: match peer.transport {
            PeerTransport::Unix => "unix",
            PeerTransport::Tls => "tls",
            PeerTransport::Tcp => "tcp",
        }
        .to_owned(),
        client_address: peer.addr.map(|a| a.to_string()).unwrap_or_default(),
        certificate: certificate.is_some(),
        common_name: certificate
            .and_then(|c| c.common_name.clone())
            .unwrap_or_default(),
        dns_names: certificate.map(|c| c.dns.clone()).unwrap_or_default(),
        ip_names: certificate
            .map(|c| c.ips.iter().map(ToString::to_string).collect())
            .unwrap_or_default(),
        uri_names: certificate.map(|c| c.uris.clone()).unwrap_or_default(),
        unix: unix.is_some(),
        uid: unix.map_or(0, |u| u.uid),
        gid: unix.map_or(0, |u| u.gid),
        pid: unix.and_then(|u| u.pid).unwrap_or(0),
    }
}

/// The request a peer forwarded, as this server checks and records it: the client as the
/// peer's listener proved it, the tenant pinned when the client came through the tenant's
/// own frontend, and the hop. `random` is the dial's ID on the peer link.
pub(crate) fn request(
    origin: &pb::Origin,
    protocol: String,
    address: String,
    random: DialId,
) -> Result<RequestContext, String> {
    let frontend = match origin.frontend.as_str() {
        "grpc" => FrontendKind::Grpc,
        "http-connect" => FrontendKind::HttpConnect,
        other => {
            return Err(format!(
                "peer forwarded a dial from an unknown frontend {other:?}"
            ));
        }
    };
    let transport = match origin.transport.as_str() {
        "unix" => PeerTransport::Unix,
        "tls" => PeerTransport::Tls,
        "tcp" => PeerTransport::Tcp,
        other => {
            return Err(format!(
                "peer forwarded a dial over an unknown client transport {other:?}"
            ));
        }
    };
    let addr = match origin.client_address.as_str() {
        "" => None,
        text => Some(
            text.parse()
                .map_err(|_| format!("peer forwarded an unreadable client address {text:?}"))?,
        ),
    };
    let certificate = origin
        .certificate
        .then(|| {
            let ips = origin
                .ip_names
                .iter()
                .map(|ip| {
                    ip.parse::<IpAddr>()
                        .map_err(|_| format!("peer forwarded an unreadable IP name {ip:?}"))
                })
                .collect::<Result<_, _>>()?;
            Ok::<_, String>(CertificateNames {
                common_name: (!origin.common_name.is_empty()).then(|| origin.common_name.clone()),
                dns: origin.dns_names.clone(),
                ips,
                uris: origin.uri_names.clone(),
            })
        })
        .transpose()?;
    let unix = origin.unix.then_some(UnixCredentials {
        uid: origin.uid,
        gid: origin.gid,
        pid: (origin.pid != 0).then_some(origin.pid),
    });
    let peer = PeerIdentity {
        transport,
        addr,
        certificate,
        unix,
    };
    let tenant = origin
        .tenant_frontend
        .then(|| Arc::<str>::from(origin.tenant.as_str()));
    Ok(RequestContext {
        hop: Some(Hop::From(origin.server_id.as_str().into())),
        ..RequestContext::new(frontend, Arc::new(peer), protocol, address, random, tenant)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_crosses_the_hop_as_its_listener_proved_it() {
        let peer = PeerIdentity {
            transport: PeerTransport::Tls,
            addr: Some("127.0.0.1:4000".parse().unwrap()),
            certificate: Some(CertificateNames {
                common_name: Some("kube-apiserver".into()),
                dns: vec!["apiserver".into()],
                ips: vec!["127.0.0.1".parse().unwrap()],
                uris: vec!["spiffe://cluster/apiserver".into()],
            }),
            unix: None,
        };
        let sent = RequestContext::new(
            FrontendKind::HttpConnect,
            Arc::new(peer.clone()),
            "tcp".into(),
            "10.0.0.1:10250".into(),
            DialId(9),
            Some("blue".into()),
        );
        let origin = of(&sent, "blue", "server-b");
        let got = request(&origin, "tcp".into(), "10.0.0.1:10250".into(), DialId(9)).unwrap();
        assert_eq!(*got.peer, peer);
        assert_eq!(got.frontend, FrontendKind::HttpConnect);
        assert_eq!(got.tenant.as_deref(), Some("blue"));
        assert_eq!(got.hop, Some(Hop::From("server-b".into())));
        // A tenant resolved from the client's identity is resolved again, not pinned.
        let resolved = RequestContext {
            tenant: None,
            ..sent
        };
        let origin = of(&resolved, "blue", "server-b");
        let got = request(&origin, "tcp".into(), "x:1".into(), DialId(1)).unwrap();
        assert_eq!(got.tenant, None);
    }

    #[test]
    fn a_unix_client_keeps_its_credentials() {
        let peer = PeerIdentity {
            transport: PeerTransport::Unix,
            addr: None,
            certificate: None,
            unix: Some(UnixCredentials {
                uid: 1000,
                gid: 1000,
                pid: Some(77),
            }),
        };
        let sent = RequestContext::new(
            FrontendKind::Grpc,
            Arc::new(peer.clone()),
            "tcp".into(),
            "x:1".into(),
            DialId(1),
            None,
        );
        let got = request(&of(&sent, "", "s"), "tcp".into(), "x:1".into(), DialId(1)).unwrap();
        assert_eq!(*got.peer, peer);
    }

    #[test]
    fn an_unreadable_origin_is_refused_with_what_was_wrong() {
        let bad = pb::Origin {
            frontend: "smtp".into(),
            ..pb::Origin::default()
        };
        let error = request(&bad, "tcp".into(), "x:1".into(), DialId(1)).unwrap_err();
        assert!(error.contains("unknown frontend"), "{error}");
        let bad = pb::Origin {
            frontend: "grpc".into(),
            transport: "tls".into(),
            client_address: "nowhere".into(),
            ..pb::Origin::default()
        };
        let error = request(&bad, "tcp".into(), "x:1".into(), DialId(1)).unwrap_err();
        assert!(error.contains("client address"), "{error}");
    }
}
