//! The checks kube-apiserver makes on an EgressSelectorConfiguration before using it
//! (k8s.io/apiserver's `ValidateEgressSelectorConfiguration`), reported as [`FieldError`]s,
//! which print the way Go's `field.Error`s do so that both name the same field and reason.

use std::path::Path;

use super::config::{
    Connection, EgressSelectorConfiguration, TcpTransport, TlsConfig, Transport, UdsTransport,
};
use super::error::{FieldError, FieldErrorKind};

/// The selection names kube-apiserver knows, sorted (its error lists them so).
pub const SELECTION_NAMES: [&str; 3] = ["cluster", "controlplane", "etcd"];
const PROTOCOLS: [&str; 3] = ["Direct", "HTTPConnect", "GRPC"];
/// Go's field path for every connection check; only duplicates carry an index.
const CONNECTION: &str = "service.connection";

/// All problems with `config`, in the order kube-apiserver reports them: every connection
/// first, then names (unknown or repeated, compared case-insensitively).
pub fn validate(config: &EgressSelectorConfiguration) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for selection in &config.egress_selections {
        validate_connection(&selection.connection, &mut errors);
    }
    let mut seen: Vec<String> = Vec::new();
    for (i, selection) in config.egress_selections.iter().enumerate() {
        let name = selection.name.to_lowercase();
        if seen.contains(&name) {
            errors.push(error(
                format!("{CONNECTION}[{i}]"),
                FieldErrorKind::Duplicate,
                Some(quote(&name)),
                "",
            ));
            continue;
        }
        if !SELECTION_NAMES.contains(&name.as_str()) {
            errors.push(error(
                CONNECTION.into(),
                FieldErrorKind::NotSupported,
                Some(quote(&name)),
                &supported(&SELECTION_NAMES),
            ));
        }
        seen.push(name);
    }
    errors
}

fn validate_connection(connection: &Connection, errors: &mut Vec<FieldError>) {
    let transport = connection.transport.as_ref();
    match connection.proxy_protocol.as_str() {
        "Direct" => {
            if transport.is_some() {
                errors.push(invalid(
                    "transport",
                    "direct",
                    "config must be absent for direct connect",
                ));
            }
        }
        "HTTPConnect" => match transport {
            None => errors.push(required(
                "transport",
                "transport must be set for HTTPConnect",
            )),
            Some(Transport {
                tcp: Some(tcp),
                uds: Some(_),
            }) => errors.push(error(
                child("tcp"),
                FieldErrorKind::Invalid,
                Some(tcp_json(tcp)),
                "TCP and UDS cannot both be set",
            )),
            Some(Transport {
                tcp: None,
                uds: None,
            }) => errors.push(required("tcp", "One of TCP or UDS must be set")),
            Some(Transport { tcp: Some(tcp), .. }) => validate_tcp(tcp, errors),
            Some(Transport { uds: Some(uds), .. }) => validate_uds(uds, errors),
        },
        "GRPC" => match transport {
            None => errors.push(required("transport", "transport must be set for GRPC")),
            Some(Transport { uds: Some(uds), .. }) => validate_uds(uds, errors),
            Some(_) => errors.push(required("uds", "UDS must be set with GRPC")),
        },
        other => errors.push(error(
            child("protocol"),
            FieldErrorKind::NotSupported,
            Some(quote(other)),
            &supported(&PROTOCOLS),
        )),
    }
}

fn validate_uds(uds: &UdsTransport, errors: &mut Vec<FieldError>) {
    if uds.uds_name.is_empty() {
        errors.push(invalid(
            "udsName",
            "nil",
            "must be present for UDS connections",
        ));
    }
}

fn validate_tcp(tcp: &TcpTransport, errors: &mut Vec<FieldError>) {
    if tcp.url.starts_with("http://") {
        if tcp.tls_config.is_some() {
            errors.push(invalid(
                "tlsConfig",
                "nil",
                "config must not be present when using HTTP",
            ));
        }
    } else if tcp.url.starts_with("https://") {
        validate_tls(tcp.tls_config.as_ref(), errors);
    } else {
        errors.push(invalid(
            "url",
            &tcp.url,
            "supported connection protocols are http:// and https://",
        ));
    }
}

fn validate_tls(tls: Option<&TlsConfig>, errors: &mut Vec<FieldError>) {
    let Some(tls) = tls else {
        errors.push(required(
            "tlsConfig",
            "TLSConfig must be present when using HTTPS",
        ));
        return;
    };
    if !tls.ca_bundle.is_empty() && !exists(&tls.ca_bundle) {
        errors.push(invalid(
            "tlsConfig.caBundle",
            &tls.ca_bundle,
            "TLS config ca bundle does not exist",
        ));
    }
    // Go's wording, including its doubled "requires".
    for (field, path, missing, absent) in [
        (
            "tlsConfig.clientCert",
            &tls.client_cert,
            "Using TLS requires clientCert",
            "TLS client cert does not exist",
        ),
        (
            "tlsConfig.clientKey",
            &tls.client_key,
            "Using TLS requires requires clientKey",
            "TLS client key does not exist",
        ),
    ] {
        if path.is_empty() {
            errors.push(invalid(field, "nil", missing));
        } else if !exists(path) {
            errors.push(invalid(field, path, absent));
        }
    }
}

/// Whether `path` names something, following symlinks (a dangling link does not count).
fn exists(path: &str) -> bool {
    Path::new(path).metadata().is_ok()
}

fn child(name: &str) -> String {
    format!("{CONNECTION}.{name}")
}

fn error(field: String, kind: FieldErrorKind, value: Option<String>, detail: &str) -> FieldError {
    FieldError {
        field,
        kind,
        value,
        detail: detail.to_owned(),
    }
}

fn required(name: &str, detail: &str) -> FieldError {
    error(child(name), FieldErrorKind::Required, None, detail)
}

fn invalid(name: &str, value: &str, detail: &str) -> FieldError {
    error(
        child(name),
        FieldErrorKind::Invalid,
        Some(quote(value)),
        detail,
    )
}

fn supported(values: &[&str]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| quote(v)).collect();
    format!("supported values: {}", quoted.join(", "))
}

/// A string as Go's `%q` and JSON both write plain text: in double quotes, with `"`, `\` and
/// control characters escaped.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The TCP transport as Go marshals its internal type (Go field names, `null` for no TLS).
fn tcp_json(tcp: &TcpTransport) -> String {
    let tls = tcp.tls_config.as_ref().map_or_else(
        || "null".to_owned(),
        |t| {
            format!(
                "{{\"CABundle\":{},\"ClientKey\":{},\"ClientCert\":{},\"TLSServerName\":{}}}",
                quote(&t.ca_bundle),
                quote(&t.client_key),
                quote(&t.client_cert),
                quote(&t.tls_server_name)
            )
        },
    );
    format!("{{\"URL\":{},\"TLSConfig\":{tls}}}", quote(&tcp.url))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::aggregate;

    fn parse(yaml: &str) -> EgressSelectorConfiguration {
        let head = "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\n";
        EgressSelectorConfiguration::parse(format!("{head}{yaml}").as_bytes()).unwrap()
    }

    #[test]
    fn a_good_configuration_passes() {
        let config = parse(
            "egressSelections:
- name: Cluster
  connection: {proxyProtocol: GRPC, transport: {uds: {udsName: /run/k.sock}}}
- name: etcd
  connection: {proxyProtocol: Direct}
",
        );
        assert_eq!(validate(&config), []);
    }

    #[test]
    fn reports_like_go() {
        let config = parse(
            "egressSelections:
- name: cluster
  connection: {proxyProtocol: Socks}
- name: CLUSTER
  connection: {proxyProtocol: GRPC, transport: {tcp: {url: 'https://x:1'}}}
",
        );
        let errors = validate(&config);
        assert_eq!(
            aggregate(&errors),
            "[service.connection.protocol: Unsupported value: \"Socks\": supported values: \
             \"Direct\", \"HTTPConnect\", \"GRPC\", service.connection.uds: Required value: \
             UDS must be set with GRPC, service.connection[1]: Duplicate value: \"cluster\"]"
        );
    }
}
