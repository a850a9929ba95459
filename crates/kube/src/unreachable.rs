//! A request that got no answer from the API server, in words an operator can act on.
//! kube's own text for it is `ServiceError: client error (Connect)`: neither the API
//! server's address nor the OS error (`Connection refused`), which sit deeper in its
//! `source()` chain.

use std::error::Error as StdError;

use crate::KubeApi;

/// What went wrong with `request` to `api` when no status came back: the API server's URL,
/// the innermost cause (the OS or TLS error) and kube's own text.
pub(crate) fn describe(api: &KubeApi, request: &str, error: &kube::Error) -> String {
    let server = api.url().map_or_else(
        || "the API server".to_owned(),
        |url| format!("API server {url} (--kubeconfig)"),
    );
    let top = error.to_string();
    let cause = innermost(error).to_string();
    if cause == top {
        format!("{request} failed: {server}: {top}")
    } else {
        format!("{request} failed: {server}: {cause} ({top})")
    }
}

/// The last error of `error`'s `source()` chain.
fn innermost<'a>(error: &'a (dyn StdError + 'static)) -> &'a (dyn StdError + 'static) {
    let mut last = error;
    while let Some(next) = last.source() {
        last = next;
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request to a closed loopback port: the URL and the OS error, each once.
    #[tokio::test]
    async fn a_closed_port_is_named_with_the_os_error() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \
                 https://127.0.0.1:{port}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n\
                 - name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n"
            ),
        )
        .unwrap();
        let api = KubeApi::connect(&crate::KubeApiOptions {
            kubeconfig: Some(kubeconfig),
            ..Default::default()
        })
        .await
        .unwrap();
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(api.client().clone());
        let error = tokio::time::timeout(std::time::Duration::from_secs(20), nodes.get("n"))
            .await
            .expect("a refused connection fails at once")
            .expect_err("nothing listens there");
        let text = describe(&api, "reading the Node", &error);
        let server = format!("reading the Node failed: API server https://127.0.0.1:{port}");
        assert!(text.starts_with(&server), "{text}");
        assert_eq!(text.matches("Connection refused").count(), 1, "{text}");
    }
}
