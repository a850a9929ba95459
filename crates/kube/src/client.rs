//! Building a Kubernetes API client the way upstream's `--kubeconfig` flag does: a path names a
//! kubeconfig file, an empty path means the in-cluster ServiceAccount configuration.

use std::path::Path;

use tether_proxy_env::{ProxyEnvironment, ProxySetting};

/// A client for the API server named by `kubeconfig` (or the in-cluster configuration when it is
/// `None`), with upstream's `--kubeconfig-qps`/`--kubeconfig-burst` applied by the caller.
pub async fn connect(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    build(load(kubeconfig).await?)
}

/// The client configuration `kubeconfig` names (or the in-cluster one). kube's config errors
/// print their source in their own message, so only their text is kept: as `source()`s,
/// `{:#}` would print it a second time (`environment variable not found: environment
/// variable not found`).
pub(crate) async fn load(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Config> {
    let (mut config, proxy_url) = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("reading kubeconfig {}: {e}", path.display()))?;
            let proxy_url = kubeconfig_proxy(&file);
            let config = kube::Config::from_custom_kubeconfig(
                file,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| anyhow::anyhow!("loading kubeconfig {}: {e}", path.display()))?;
            (config, proxy_url)
        }
        None => {
            let config = kube::Config::incluster().map_err(|e| {
                anyhow::anyhow!(
                    "no --kubeconfig given and not running in a pod (KUBERNETES_SERVICE_HOST \
                     unset): {e}"
                )
            })?;
            (config, None)
        }
    };
    config.proxy_url = proxy(
        &config.cluster_url,
        proxy_url,
        &ProxyEnvironment::from_process(),
    )?;
    Ok(config)
}

/// The `proxy-url` of the kubeconfig's current cluster, which client-go uses instead of the
/// environment.
fn kubeconfig_proxy(file: &kube::config::Kubeconfig) -> Option<String> {
    let current = file.current_context.as_deref()?;
    let context = file.contexts.iter().find(|c| c.name == current)?;
    let cluster_name = &context.context.as_ref()?.cluster;
    let cluster = file.clusters.iter().find(|c| c.name == *cluster_name)?;
    cluster
        .cluster
        .as_ref()?
        .proxy_url
        .clone()
        .filter(|u| !u.is_empty())
}

/// The proxy to the API server at `url`, as client-go picks it: the kubeconfig's `proxy-url`,
/// else `HTTPS_PROXY` unless `NO_PROXY` (or loopback) excludes the API server's host, both
/// in the kubeconfig and in a pod. kube-rs alone ignores the environment in a pod and checks
/// `NO_PROXY` against the proxy's own address, so the choice is made here.
fn proxy(
    url: &http::Uri,
    kubeconfig_proxy: Option<String>,
    environment: &ProxyEnvironment,
) -> anyhow::Result<Option<http::Uri>> {
    let chosen = match kubeconfig_proxy {
        Some(proxy) => Some((proxy, "the kubeconfig's proxy-url".to_owned())),
        None => {
            let host = url.host().unwrap_or_default().trim_matches(['[', ']']);
            let port = url.port_u16().unwrap_or(443);
            let route =
                tether_proxy_env::route(&ProxySetting::FromEnvironment, environment, host, port)
                    .map_err(|e| anyhow::anyhow!("the Kubernetes API server {url}: {e}"))?;
            tracing::debug!(api = %url, why = %route.why, proxied = route.proxy.is_some(), "Kubernetes API client route");
            route
                .proxy
                .map(|proxy| (proxy.with_credentials(), route.why))
        }
    };
    let Some((proxy, why)) = chosen else {
        return Ok(None);
    };
    let parsed = tether_proxy_env::ProxyUrl::parse(&proxy)
        .map_err(|e| anyhow::anyhow!("the proxy to the Kubernetes API server ({why}): {e}"))?;
    tracing::info!(api = %url, proxy = %parsed, from = %why, "Kubernetes API client through a proxy");
    let uri = proxy.parse().map_err(|e| {
        anyhow::anyhow!("the proxy to the Kubernetes API server ({why}), {parsed}: {e}")
    })?;
    Ok(Some(uri))
}

/// The API server's `host:port` in a client configuration (the scheme's port if none).
pub(crate) fn endpoint(config: &kube::Config) -> Option<String> {
    let url = &config.cluster_url;
    let host = url.host()?;
    let port = url
        .port_u16()
        .unwrap_or(if url.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    Some(format!("{host}:{port}"))
}

pub(crate) fn build(config: kube::Config) -> anyhow::Result<kube::Client> {
    // kube-rs builds its rustls config from the process default: tether's, so that the
    // connection to kube-apiserver offers the post-quantum hybrid first, as Go clients do.
    tether_tls::install_default_provider();
    kube::Client::try_from(config).map_err(|e| {
        if format!("{e:?}").contains("UnsupportedCertVersion") {
            anyhow::anyhow!("{V1_CERTIFICATE}")
        } else {
            anyhow::anyhow!("building the Kubernetes API client: {e}")
        }
    })
}

/// The kubernetes.io task's openssl recipe (`openssl x509 -req` without extensions) makes
/// X.509 v1 certificates, which Go accepts and rustls (through webpki) refuses.
const V1_CERTIFICATE: &str = "the kubeconfig's client certificate is an X.509 v1 certificate, \
    which tether's TLS library refuses (Go's accepts it). Issue it again as v3: any extension \
    makes openssl write v3, e.g. add -extfile <(printf 'extendedKeyUsage=clientAuth') to the \
    `openssl x509 -req` command";

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::{ProxyEnvironment, proxy};

    fn environment(vars: &'static [(&'static str, &'static str)]) -> ProxyEnvironment {
        ProxyEnvironment::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    /// client-go's choice: the kubeconfig's proxy-url, else HTTPS_PROXY unless NO_PROXY or
    /// loopback excludes the API server.
    #[test]
    fn the_api_server_is_proxied_as_client_go_would() {
        let api: http::Uri = "https://api.cluster.example:6443".parse().unwrap();
        let env = environment(&[
            ("HTTPS_PROXY", "http://u%40x:pw@proxy.example:3128"),
            ("NO_PROXY", ".svc,10.96.0.0/12"),
        ]);
        let proxied = proxy(&api, None, &env).unwrap().expect("proxied");
        assert_eq!(proxied.to_string(), "http://u%40x:pw@proxy.example:3128/");
        let file = Some("http://file.example:8080".to_owned());
        let from_file = proxy(&api, file, &env).unwrap().expect("proxied");
        assert_eq!(
            from_file.host(),
            Some("file.example"),
            "the kubeconfig wins"
        );

        let in_pod: http::Uri = "https://10.96.0.1:443".parse().unwrap();
        assert_eq!(proxy(&in_pod, None, &env).unwrap(), None, "NO_PROXY's CIDR");
        let local: http::Uri = "https://127.0.0.1:6443".parse().unwrap();
        assert_eq!(
            proxy(&local, None, &env).unwrap(),
            None,
            "loopback never is"
        );
        assert_eq!(proxy(&api, None, &environment(&[])).unwrap(), None);

        let broken = environment(&[("HTTPS_PROXY", "socks5://proxy.example:1080")]);
        let err = format!("{:#}", proxy(&api, None, &broken).unwrap_err());
        assert!(
            err.contains("HTTPS_PROXY") && err.contains("socks5"),
            "{err}"
        );
    }

    /// A kubeconfig with an X.509 v1 client certificate, made the way the kubernetes.io task
    /// makes it (openssl without extensions), fails at start-up with the fix in the message.
    #[tokio::test]
    async fn a_v1_client_certificate_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let (key, csr, cert) = (
            dir.path().join("k.pem"),
            dir.path().join("c.csr"),
            dir.path().join("c.pem"),
        );
        let openssl = |args: &[&std::ffi::OsStr]| {
            let out = Command::new("openssl")
                .args(args)
                .output()
                .expect("openssl runs");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&[
            "genrsa".as_ref(),
            "-out".as_ref(),
            key.as_os_str(),
            "2048".as_ref(),
        ]);
        openssl(&[
            "req".as_ref(),
            "-new".as_ref(),
            "-key".as_ref(),
            key.as_os_str(),
            "-subj".as_ref(),
            "/CN=system:konnectivity-server".as_ref(),
            "-out".as_ref(),
            csr.as_os_str(),
        ]);
        openssl(&[
            "x509".as_ref(),
            "-req".as_ref(),
            "-in".as_ref(),
            csr.as_os_str(),
            "-signkey".as_ref(),
            key.as_os_str(),
            "-days".as_ref(),
            "1".as_ref(),
            "-out".as_ref(),
            cert.as_os_str(),
        ]);
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n\
                 users:\n- name: u\n  user:\n    client-certificate: {}\n    client-key: {}\n\
                 contexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
                cert.display(),
                key.display()
            ),
        )
        .unwrap();
        let err = super::connect(Some(&kubeconfig))
            .await
            .err()
            .expect("a v1 certificate was accepted");
        let err = format!("{err:#}");
        assert!(
            err.contains("X.509 v1") && err.contains("-extfile"),
            "{err}"
        );
    }
}
