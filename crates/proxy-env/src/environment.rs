//! Which proxy, if any, a connection takes: the agent's `--https-proxy` for its server
//! connections, else the environment as grpc-go and client-go read it.

use crate::no_proxy::NoProxy;
use crate::proxy_url::{ProxyUrl, ProxyUrlError};

/// The proxy variables grpc-go consults, read once at start-up (Go caches them too).
///
/// grpc-go maps every target to `https://host:port` and asks `http.ProxyFromEnvironment`, so
/// only `HTTPS_PROXY` counts (`HTTP_PROXY` and `ALL_PROXY` never do), with `NO_PROXY`. Of each
/// pair the upper-case variable wins when it is set and not empty, as in Go 1.26's vendored
/// `httpproxy.FromEnvironment` (`getEnvAny("HTTPS_PROXY", "https_proxy")`; x/net v0.61.0 flipped
/// that to lower case first, which Go's standard library has not taken yet).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyEnvironment {
    /// The variable that named the proxy, and its value.
    pub https_proxy: Option<(&'static str, String)>,
    pub no_proxy: String,
}

impl ProxyEnvironment {
    /// Reads the process environment.
    pub fn from_process() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `lookup` (the process environment, or a test's).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let first = |names: [&'static str; 2]| {
            names
                .into_iter()
                .find_map(|name| lookup(name).filter(|v| !v.is_empty()).map(|v| (name, v)))
        };
        Self {
            https_proxy: first(["HTTPS_PROXY", "https_proxy"]),
            no_proxy: first(["NO_PROXY", "no_proxy"])
                .map(|(_, v)| v)
                .unwrap_or_default(),
        }
    }
}

/// `--https-proxy`: a proxy URL, `none`, or empty for the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxySetting {
    FromEnvironment,
    Direct,
    Url(ProxyUrl),
}

impl ProxySetting {
    /// Parses the flag's value.
    pub fn parse(flag: &str) -> Result<Self, ProxyUrlError> {
        match flag {
            "" => Ok(Self::FromEnvironment),
            "none" => Ok(Self::Direct),
            url => ProxyUrl::parse(url).map(Self::Url),
        }
    }
}

/// What the agent does for the server at `host:port`, and why (for the start-up log line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub proxy: Option<ProxyUrl>,
    pub why: String,
}

/// Why the environment's proxy cannot be used.
#[derive(Debug, thiserror::Error)]
#[error(
    "{variable}: {error} (upstream's agent would silently connect directly; set a valid proxy URL, or --https-proxy=none to ignore the environment)"
)]
pub struct EnvironmentError {
    variable: &'static str,
    error: ProxyUrlError,
}

/// The route to the server at `host:port`: the flag wins; otherwise `HTTPS_PROXY` unless
/// `NO_PROXY` (or the loopback rule) excludes the server. A malformed `HTTPS_PROXY` that
/// would be used is an error here, where Go ignores it and connects directly.
pub fn route(
    setting: &ProxySetting,
    environment: &ProxyEnvironment,
    host: &str,
    port: u16,
) -> Result<Route, EnvironmentError> {
    let route = |proxy, why: String| Ok(Route { proxy, why });
    match setting {
        ProxySetting::Direct => route(None, "--https-proxy=none".into()),
        ProxySetting::Url(url) => route(Some(url.clone()), "--https-proxy".into()),
        ProxySetting::FromEnvironment => {
            let Some((variable, value)) = &environment.https_proxy else {
                return route(None, "HTTPS_PROXY and https_proxy are not set".into());
            };
            if !NoProxy::parse(&environment.no_proxy).use_proxy(host, port) {
                return route(
                    None,
                    format!("{host}:{port} is loopback or matches NO_PROXY/no_proxy"),
                );
            }
            let url =
                ProxyUrl::parse(value).map_err(|error| EnvironmentError { variable, error })?;
            route(Some(url), (*variable).to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn environment(vars: &[(&str, &str)]) -> ProxyEnvironment {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ProxyEnvironment::from_lookup(|name| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    fn proxy_for(vars: &[(&str, &str)], host: &str) -> Option<String> {
        route(
            &ProxySetting::FromEnvironment,
            &environment(vars),
            host,
            8091,
        )
        .unwrap()
        .proxy
        .map(|url| url.address())
    }

    #[test]
    fn upper_case_wins_when_set_and_not_empty() {
        let both = [("HTTPS_PROXY", "upper:1"), ("https_proxy", "lower:2")];
        assert_eq!(
            proxy_for(&both, "server.example").as_deref(),
            Some("upper:1")
        );
        let empty_upper = [("HTTPS_PROXY", ""), ("https_proxy", "lower:2")];
        assert_eq!(
            proxy_for(&empty_upper, "server.example").as_deref(),
            Some("lower:2")
        );
        let no_proxy = [
            ("HTTPS_PROXY", "upper:1"),
            ("NO_PROXY", "other.example"),
            ("no_proxy", "server.example"),
        ];
        assert_eq!(
            proxy_for(&no_proxy, "server.example").as_deref(),
            Some("upper:1")
        );
        let lower_no_proxy = [("https_proxy", "lower:2"), ("no_proxy", "server.example")];
        assert_eq!(proxy_for(&lower_no_proxy, "server.example"), None);
    }

    #[test]
    fn only_https_proxy_counts() {
        let vars = [("HTTP_PROXY", "http:1"), ("ALL_PROXY", "all:2")];
        assert_eq!(proxy_for(&vars, "server.example"), None);
    }

    #[test]
    fn loopback_and_no_proxy_go_direct() {
        let vars = [
            ("HTTPS_PROXY", "proxy:3128"),
            ("NO_PROXY", ".cluster.local"),
        ];
        assert_eq!(proxy_for(&vars, "127.0.0.1"), None);
        assert_eq!(proxy_for(&vars, "localhost"), None);
        assert_eq!(proxy_for(&vars, "konnectivity.cluster.local"), None);
        assert_eq!(
            proxy_for(&vars, "konnectivity.example").as_deref(),
            Some("proxy:3128")
        );
    }

    #[test]
    fn the_flag_overrides_the_environment() {
        let vars = environment(&[("HTTPS_PROXY", "env:1"), ("NO_PROXY", "*")]);
        let flag = ProxySetting::parse("http://flag:2").unwrap();
        let via = route(&flag, &vars, "127.0.0.1", 8091).unwrap();
        assert_eq!(via.proxy.map(|u| u.address()).as_deref(), Some("flag:2"));
        let none = ProxySetting::parse("none").unwrap();
        let direct = route(
            &none,
            &environment(&[("HTTPS_PROXY", "env:1")]),
            "s.example",
            1,
        );
        assert_eq!(direct.unwrap().proxy, None);
        assert_eq!(
            ProxySetting::parse("").unwrap(),
            ProxySetting::FromEnvironment
        );
    }

    #[test]
    fn a_malformed_environment_proxy_names_the_variable_and_the_way_out() {
        let vars = environment(&[("https_proxy", "http://u:secret@proxy:bad")]);
        let err = route(&ProxySetting::FromEnvironment, &vars, "s.example", 1)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("https_proxy: "), "{err}");
        assert!(
            err.contains("--https-proxy=none") && !err.contains("secret"),
            "{err}"
        );
        // Not an error where the server does not use the proxy anyway.
        let excluded = environment(&[("HTTPS_PROXY", "http://proxy:bad"), ("NO_PROXY", "*")]);
        assert!(route(&ProxySetting::FromEnvironment, &excluded, "s.example", 1).is_ok());
    }
}
