//! The EgressSelectorConfiguration file kube-apiserver reads (`--egress-selector-config-file`):
//! its schema and loading it from YAML or JSON.
//!
//! The schema is `apiserver.k8s.io/v1beta1` (`v1alpha1` is the same); decoding is strict, as
//! kube-apiserver's: an unknown or repeated field is an error, not something silently ignored.

use std::path::Path;

use serde::Deserialize;

use super::error::EgressError;

/// The API versions that carry the kind; their schemas are identical.
pub const API_VERSIONS: [&str; 2] = ["apiserver.k8s.io/v1beta1", "apiserver.k8s.io/v1alpha1"];
/// The `kind` of the document.
pub const KIND: &str = "EgressSelectorConfiguration";

/// A decoded configuration, before validation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressSelectorConfiguration {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    /// `null` and absent both mean none, as in Go.
    #[serde(default, deserialize_with = "null_as_default")]
    pub egress_selections: Vec<EgressSelection>,
}

/// One named selection: which network (`cluster`, `controlplane`, `etcd`) goes how.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressSelection {
    #[serde(default)]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub connection: Connection,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Connection {
    /// `Direct`, `HTTPConnect` or `GRPC`; anything else fails validation.
    #[serde(default)]
    pub proxy_protocol: String,
    #[serde(default)]
    pub transport: Option<Transport>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Transport {
    #[serde(default)]
    pub tcp: Option<TcpTransport>,
    #[serde(default)]
    pub uds: Option<UdsTransport>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TcpTransport {
    /// `https://host:port`.
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub tls_config: Option<TlsConfig>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UdsTransport {
    /// A plain path, no `unix://` prefix.
    #[serde(default)]
    pub uds_name: String,
}

/// File paths of the mutual-TLS credentials, and the name to verify the server by.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsConfig {
    #[serde(default)]
    pub ca_bundle: String,
    #[serde(default)]
    pub client_key: String,
    #[serde(default)]
    pub client_cert: String,
    /// Empty: the URL's host.
    #[serde(default)]
    pub tls_server_name: String,
}

impl EgressSelectorConfiguration {
    /// Reads and decodes `path`; see [`parse`](Self::parse).
    pub fn read(path: &Path) -> Result<Self, EgressError> {
        let data = std::fs::read(path).map_err(|error| EgressError::Read {
            path: path.to_owned(),
            error,
        })?;
        Self::parse(&data)
    }

    /// Decodes a YAML or JSON document (JSON is YAML) of a supported `apiVersion` and `kind`.
    ///
    /// As kube-apiserver does when converting to its internal form, the deprecated selection
    /// name `master` becomes `controlplane`.
    pub fn parse(data: &[u8]) -> Result<Self, EgressError> {
        let mut config: Self =
            serde_saphyr::from_slice(data).map_err(|e| EgressError::Decode(e.to_string()))?;
        if config.kind.is_empty() {
            return Err(EgressError::Decode("kind is missing".into()));
        }
        if config.api_version.is_empty() {
            return Err(EgressError::Decode("apiVersion is missing".into()));
        }
        if !API_VERSIONS.contains(&config.api_version.as_str()) || config.kind != KIND {
            return Err(EgressError::Decode(format!(
                "unsupported kind {:?} of apiVersion {:?}: want {KIND} of {}",
                config.kind,
                config.api_version,
                API_VERSIONS.join(" or ")
            )));
        }
        for selection in &mut config.egress_selections {
            if selection.name == "master" {
                selection.name = "controlplane".into();
            }
        }
        Ok(config)
    }
}

/// Reads `null` as the type's default, like Go's decoder does for slices and structs.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_yaml_and_json_alike() {
        let yaml = b"apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: master
  connection:
    proxyProtocol: GRPC
    transport:
      uds:
        udsName: /run/k.sock
- name: etcd
  connection:
    proxyProtocol: Direct
";
        let json =
            br#"{"apiVersion":"apiserver.k8s.io/v1alpha1","kind":"EgressSelectorConfiguration",
            "egressSelections":[{"name":"master","connection":{"proxyProtocol":"GRPC",
            "transport":{"uds":{"udsName":"/run/k.sock"}}}},
            {"name":"etcd","connection":{"proxyProtocol":"Direct"}}]}"#;
        let from_yaml = EgressSelectorConfiguration::parse(yaml).unwrap();
        let from_json = EgressSelectorConfiguration::parse(json).unwrap();
        assert_eq!(from_yaml.egress_selections, from_json.egress_selections);
        let first = &from_yaml.egress_selections[0];
        assert_eq!(first.name, "controlplane");
        let uds = first.connection.transport.as_ref().unwrap().uds.as_ref();
        assert_eq!(uds.unwrap().uds_name, "/run/k.sock");
    }

    #[test]
    fn rejects_unknown_fields_and_other_kinds() {
        for bad in [
            "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\nextra: 1\n",
            "apiVersion: apiserver.k8s.io/v1\nkind: EgressSelectorConfiguration\n",
            "apiVersion: apiserver.k8s.io/v1beta1\nkind: TracingConfiguration\n",
            "kind: EgressSelectorConfiguration\n",
            "egressSelections: []\n",
            "- not a map\n",
        ] {
            let got = EgressSelectorConfiguration::parse(bad.as_bytes());
            assert!(
                matches!(got, Err(EgressError::Decode(_))),
                "{bad:?}: {got:?}"
            );
        }
    }
}
