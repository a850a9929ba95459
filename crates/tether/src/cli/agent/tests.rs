use std::collections::BTreeSet;
use std::net::SocketAddr;

use super::*;
use crate::cli::Command;
use crate::cli::testutil::{parse, pki, words};

/// The flag line upstream's integration tests pass to an external agent (dossier §7.2),
/// with `{…}` placeholders for the paths and ports.
const UPSTREAM_TEST_RUNNER_LINE: &str = "--admin-bind-address=127.0.0.1 \
    --admin-server-port=18094 --agent-cert={agent_cert} \
    --agent-id=5d9b8e4c-7c36-4f43-8f5e-3f1f5e0b6a11 --agent-identifiers= \
    --agent-key={agent_key} --alpn-proto=[] --ca-cert={ca} --count-server-leases=false \
    --enable-contention-profiling=false --enable-profiling=false \
    --health-server-host=127.0.0.1 --health-server-port=18093 --keepalive-time=1h0m0s \
    --kube-api-content-type=application/vnd.kubernetes.protobuf --kubeconfig= \
    --lease-label=k8s-app=konnectivity-server \
    --lease-label-selector=k8s-app=konnectivity-server --lease-namespace=kube-system \
    --probe-interval=100ms --proxy-server-host=127.0.0.1 --proxy-server-port=18091 \
    --server-count-source=default --service-account-token-path= --sync-forever=false \
    --sync-interval=100ms --sync-interval-cap=1s --warn-on-channel-limit=false \
    --xfr-channel-size=150";

fn agent_args(line: &str) -> Result<AgentArgs, clap::Error> {
    let mut args = words(line);
    args.insert(0, "agent".into());
    match parse(&args)? {
        Command::Agent(args) => Ok(args),
        other => panic!("parsed as {other:?}"),
    }
}

/// Agent flags with the mandatory CA plus `extra`.
fn agent(files: &tether_tls::pki::PkiFiles, extra: &str) -> anyhow::Result<Config> {
    let line = format!("--ca-cert={} {extra}", files.ca_cert.display());
    agent_args(&line)?.into_config()
}

fn error(result: anyhow::Result<Config>) -> String {
    format!("{:#}", result.expect_err("flags were accepted"))
}

#[test]
fn upstream_test_runner_line_yields_a_valid_config() {
    let (_dir, files) = pki();
    let line = UPSTREAM_TEST_RUNNER_LINE
        .replace("{agent_cert}", &files.agent_cert.display().to_string())
        .replace("{agent_key}", &files.agent_key.display().to_string())
        .replace("{ca}", &files.ca_cert.display().to_string());
    let config = agent_args(&line).unwrap().into_config().unwrap();

    assert_eq!(config.server_host, "127.0.0.1");
    assert_eq!(config.server_port, 18091);
    assert_eq!(config.agent_id, "5d9b8e4c-7c36-4f43-8f5e-3f1f5e0b6a11");
    assert_eq!(config.identifiers, "");
    assert_eq!(config.labels, tether_proto::Labels::default());
    assert_eq!(
        config.tls.alpn_protocols,
        [b"tether/1".to_vec(), b"h2".to_vec()]
    );
    assert_eq!(
        config.health_addr,
        "127.0.0.1:18093".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(
        config.admin_addr,
        "127.0.0.1:18094".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(config.sync_interval, Duration::from_millis(100));
    assert_eq!(config.sync_interval_cap, Duration::from_secs(1));
    assert!(!config.sync_forever);
    // --keepalive-time=1h0m0s, capped by --upstream-server-ping-interval (35s).
    let legacy = config.legacy_keepalive.unwrap();
    assert_eq!(
        (legacy.interval, legacy.timeout),
        (Duration::from_secs(35), Duration::from_secs(20))
    );
    let keepalive = config.keepalive.unwrap();
    assert_eq!(
        (keepalive.interval, keepalive.timeout),
        (Duration::from_secs(5), Duration::from_secs(10))
    );
    assert_eq!(config.dial_timeout, Duration::from_secs(5));
    assert_eq!(config.flow.window, 1 << 20);
    assert_eq!(config.token_path, None);
}

#[test]
fn defaults_match_upstream() {
    let (_dir, files) = pki();
    let config = agent(&files, "").unwrap();
    assert_eq!(
        (config.server_host.as_str(), config.server_port),
        ("127.0.0.1", 8091)
    );
    assert_eq!(
        config.health_addr,
        "0.0.0.0:8093".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(
        config.admin_addr,
        "127.0.0.1:8094".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(config.sync_interval, Duration::from_secs(1));
    assert_eq!(config.sync_interval_cap, Duration::from_secs(10));
    assert!(!config.agent_id.is_empty());
    assert_eq!(
        config.drain_timeout, None,
        "a draining agent runs until a second signal, as upstream's"
    );
}

#[test]
fn drain_timeout_bounds_a_draining_agent() {
    let (_dir, files) = pki();
    let config = agent(&files, "--drain-timeout=25s").unwrap();
    assert_eq!(config.drain_timeout, Some(Duration::from_secs(25)));
    let config = agent(&files, "--drain-timeout=0s").unwrap();
    assert_eq!(config.drain_timeout, None);
    let err = agent_args("--drain-timeout=25").unwrap_err().to_string();
    assert!(err.contains("--drain-timeout"), "{err}");
}

#[test]
fn alpn_protocols() {
    let grpc = |values: &[&str]| {
        alpn(
            &values.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>(),
            Transport::Grpc,
        )
    };
    assert_eq!(grpc(&[]), [b"h2".to_vec()]);
    assert_eq!(grpc(&["[]"]), [b"h2".to_vec()]);
    assert_eq!(grpc(&[""]), [b"h2".to_vec()]);
    assert_eq!(
        grpc(&["a,b", "c"]),
        [b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"h2".to_vec()]
    );
    assert_eq!(grpc(&["h2,x"]), [b"h2".to_vec(), b"x".to_vec()]);
    assert_eq!(grpc(&["tether/1"]), [b"h2".to_vec()], "only auto offers it");
    let auto = |values: &[&str]| {
        alpn(
            &values.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>(),
            Transport::Auto,
        )
    };
    assert_eq!(auto(&["[]"]), [b"tether/1".to_vec(), b"h2".to_vec()]);
    assert_eq!(
        auto(&["h2,x", "tether/1"]),
        [b"tether/1".to_vec(), b"h2".to_vec(), b"x".to_vec()]
    );

    let (_dir, files) = pki();
    let config = agent(&files, "--alpn-proto=proxy --alpn-proto x,y").unwrap();
    let want: Vec<Vec<u8>> = ["proxy", "x", "y", "tether/1", "h2"]
        .map(|p| p.as_bytes().to_vec())
        .into();
    assert_eq!(config.tls.alpn_protocols, want);
    let config = agent(&files, "--alpn-proto=proxy --transport=grpc").unwrap();
    let want: Vec<Vec<u8>> = ["proxy", "h2"].map(|p| p.as_bytes().to_vec()).into();
    assert_eq!(config.tls.alpn_protocols, want);
    let config = agent(&files, "--alpn-proto=proxy,h2 --transport=websocket").unwrap();
    let want: Vec<Vec<u8>> = ["proxy", "http/1.1"].map(|p| p.as_bytes().to_vec()).into();
    assert_eq!(
        config.tls.alpn_protocols, want,
        "websocket offers http/1.1 alone"
    );
    assert_eq!(config.websocket_path.as_deref(), Some("/"));
    let config = agent(&files, "--transport=websocket --websocket-path=/tether/x").unwrap();
    assert_eq!(config.websocket_path.as_deref(), Some("/tether/x"));
    assert_eq!(agent(&files, "").unwrap().websocket_path, None);
    for (flags, says) in [
        ("--websocket-path=/x", "needs --transport=websocket"),
        (
            "--transport=websocket --websocket-path=x",
            "must be a request path",
        ),
        (
            "--transport=websocket --websocket-path=/ä",
            "must be a request path",
        ),
    ] {
        let err = format!("{:#}", agent(&files, flags).unwrap_err());
        assert!(
            err.contains("--websocket-path") && err.contains(says),
            "{flags}: {err}"
        );
    }
    let err = agent_args("--transport=quic").unwrap_err().to_string();
    assert!(
        err.contains("--transport") && err.contains("auto, grpc, websocket"),
        "{err}"
    );
}

#[test]
fn server_discovery_flags() {
    let (_dir, files) = pki();
    assert_eq!(agent(&files, "").unwrap().discovery, Discovery::Balancer);
    let config = agent(
        &files,
        "--server-discovery=dns --proxy-server-host=konnectivity.kube-system.svc",
    )
    .unwrap();
    assert_eq!(
        config.discovery,
        Discovery::Dns {
            name: "konnectivity.kube-system.svc".into(),
            interval: Duration::from_secs(5)
        }
    );
    assert_eq!(
        config.server_host, "konnectivity.kube-system.svc",
        "TLS verifies the name"
    );
    let config = agent(
        &files,
        "--server-discovery=dns --proxy-server-host=konnectivity.svc --server-discovery-name=pods.svc --server-discovery-interval=1s",
    )
    .unwrap();
    assert_eq!(
        config.discovery,
        Discovery::Dns {
            name: "pods.svc".into(),
            interval: Duration::from_secs(1)
        }
    );
    assert_eq!(config.server_host, "konnectivity.svc");
    let config = agent(
        &files,
        "--proxy-server-port=8132 --proxy-server-addresses=10.0.0.2,10.0.0.3:9000,[fd00::4],10.0.0.2",
    )
    .unwrap();
    let want: BTreeSet<SocketAddr> = ["10.0.0.2:8132", "10.0.0.3:9000", "[fd00::4]:8132"]
        .map(|a| a.parse().unwrap())
        .into();
    assert_eq!(config.discovery, Discovery::List(want));
    for (flags, says) in [
        (
            "--proxy-server-addresses=10.0.0.2 --server-discovery=dns",
            "--proxy-server-addresses replaces --server-discovery",
        ),
        (
            "--proxy-server-addresses=konnectivity.svc",
            "\"konnectivity.svc\" is not IP[:PORT]",
        ),
        (
            "--proxy-server-addresses=10.0.0.2,",
            "\"\" is not IP[:PORT]",
        ),
        ("--proxy-server-addresses=10.0.0.2:0", "has port 0"),
        (
            "--server-discovery-name=pods.svc",
            "needs --server-discovery=dns",
        ),
        (
            "--server-discovery=dns --server-discovery-interval=10ms",
            "--server-discovery-interval must be at least 100ms",
        ),
        (
            "--server-discovery=dns --sync-forever",
            "drop --sync-forever",
        ),
    ] {
        let err = error(agent(&files, flags));
        assert!(err.contains(says), "{flags}: {err}");
    }
    let err = error(agent(&files, "--server-discovery=leases"));
    assert!(err.contains("needs --count-server-leases"), "{err}");
    let err = agent_args("--server-discovery=mdns")
        .unwrap_err()
        .to_string();
    assert!(err.contains("balancer, dns, leases"), "{err}");
}

#[test]
fn booleans_in_every_pflag_form() {
    for (flags, want) in [
        ("", false),
        ("--sync-forever", true),
        ("--sync-forever=true", true),
        ("--sync-forever=false", false),
        ("--sync-forever=1", true),
        ("--sync-forever=F", false),
        ("--sync-forever --sync-forever=false", false),
    ] {
        assert_eq!(agent_args(flags).unwrap().sync_forever, want, "{flags}");
    }
    // pflag never takes a boolean's value from the next argument.
    assert!(agent_args("--sync-forever false").is_err());
    assert!(agent_args("--sync-forever=maybe").is_err());
}

#[test]
fn durations_in_go_syntax() {
    let args =
        agent_args("--sync-interval=1m30s --sync-interval-cap=1h0m0s --probe-interval 250ms")
            .unwrap();
    assert_eq!(args.sync_interval, Duration::from_secs(90));
    assert_eq!(args.sync_interval_cap, Duration::from_secs(3600));
    assert_eq!(args.probe_interval, Duration::from_millis(250));
    let err = agent_args("--sync-interval=5").unwrap_err().to_string();
    assert!(err.contains("--sync-interval"), "{err}");
}

#[test]
fn invalid_values_name_their_flag() {
    let (_dir, files) = pki();
    let cases = [
        ("--agent-identifiers=host=a&zone=b", "--agent-identifiers"),
        ("--agent-labels=rack=7", "--agent-labels"),
        ("--sync-interval=20s", "--sync-interval"),
        ("--proxy-server-port=0", "--proxy-server-port"),
        ("--xfr-channel-size=0", "--xfr-channel-size"),
        ("--server-ping-interval=0s", "--server-ping-interval"),
        ("--server-count-source=min", "--server-count-source"),
        (
            "--enable-contention-profiling",
            "--enable-contention-profiling",
        ),
        (
            "--service-account-token-path=/nonexistent/token",
            "--service-account-token-path",
        ),
    ];
    for (flags, flag) in cases {
        let err = error(agent(&files, flags));
        assert!(err.starts_with(flag), "{flags}: {err}");
    }
    let cert = format!("--agent-cert={}", files.agent_cert.display());
    assert!(error(agent(&files, &cert)).contains("--agent-key must be set"));
    assert!(error(agent_args("").unwrap().into_config()).starts_with("--ca-cert is required"));
}

fn lease_settings(
    files: &tether_tls::pki::PkiFiles,
    extra: &str,
) -> anyhow::Result<Option<AgentLeases>> {
    let line = format!("--ca-cert={} {extra}", files.ca_cert.display());
    let args = agent_args(&line)?;
    args.clone().into_config()?;
    args.lease_settings()
}

#[test]
fn lease_counting_flags() {
    let (_dir, files) = pki();
    assert!(
        lease_settings(&files, "--count-server-leases=false")
            .unwrap()
            .is_none()
    );
    assert!(
        agent(&files, "").unwrap().lease_counting.is_none(),
        "the binary fills it in"
    );

    let kubeconfig = files.dir.join("kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").unwrap();
    let leases = lease_settings(
        &files,
        &format!(
            "--count-server-leases --kubeconfig={}",
            kubeconfig.display()
        ),
    )
    .unwrap()
    .unwrap();
    assert_eq!(leases.kubeconfig.as_deref(), Some(kubeconfig.as_path()));
    assert_eq!(leases.namespace, "kube-system");
    assert_eq!(leases.selector, "k8s-app=konnectivity-server");
    assert_eq!(leases.source, tether_agent::CountSource::Default);
    assert_eq!(leases.poll_interval, Duration::from_secs(10));

    // An empty --kubeconfig means in-cluster; either spelling of the selector; `max`.
    let leases = lease_settings(
        &files,
        "--count-server-leases --kubeconfig= --lease-namespace=proxy --lease-label=app=p \
         --server-count-source=max --lease-poll-interval=1s",
    )
    .unwrap()
    .unwrap();
    assert!(leases.kubeconfig.is_none());
    assert_eq!(
        (leases.namespace.as_str(), leases.selector.as_str()),
        ("proxy", "app=p")
    );
    assert_eq!(leases.source, tether_agent::CountSource::Max);
    assert_eq!(leases.poll_interval, Duration::from_secs(1));
    let leases = lease_settings(
        &files,
        "--count-server-leases --lease-label-selector=app,!legacy --lease-label=app,!legacy",
    )
    .unwrap()
    .unwrap();
    assert_eq!(leases.selector, "app,!legacy");
}

#[test]
fn lease_counting_refusals_name_their_flag() {
    let (_dir, files) = pki();
    for (flags, want) in [
        (
            "--count-server-leases --lease-label-selector=",
            "--lease-label-selector must not be empty",
        ),
        (
            "--lease-label-selector=a=b --lease-label=c=d",
            "--lease-label is the older spelling",
        ),
        (
            "--server-count-source=min",
            "--server-count-source must be 'default' or 'max'",
        ),
        (
            "--kubeconfig=/nonexistent/kubeconfig",
            "checking KubeconfigPath \"/nonexistent/kubeconfig\"",
        ),
        (
            "--count-server-leases --lease-namespace=",
            "--lease-namespace must not be empty",
        ),
        (
            "--count-server-leases --lease-poll-interval=0s",
            "--lease-poll-interval must be greater than 0",
        ),
    ] {
        let err = format!("{:#}", lease_settings(&files, flags).unwrap_err());
        assert!(err.starts_with(want), "{flags}: {err}");
    }
}

#[test]
fn no_op_flags_are_reported_when_set() {
    let args = agent_args(
        "--enable-profiling --xfr-channel-size=10 --lease-label=a=b --log-file-max-size=0 \
         --kubeconfig=/k --server-count-source=max",
    )
    .unwrap();
    assert!(
        args.upstream_only.enable_profiling,
        "--enable-profiling has an effect"
    );
    // --log-file-max-size has no effect upstream either while logging to stderr.
    assert_eq!(
        args.ignored(),
        [
            "--kubeconfig=/k (without --count-server-leases)",
            "--lease-label-selector=a=b (without --count-server-leases)",
            "--server-count-source=max (without --count-server-leases)",
            "--xfr-channel-size=10"
        ]
    );
    // With --count-server-leases they all matter.
    let args = agent_args(
        "--count-server-leases --kubeconfig=/k --lease-label=a=b --server-count-source=max",
    )
    .unwrap();
    assert!(args.ignored().is_empty(), "{:?}", args.ignored());
}

#[test]
fn pings_and_tokens() {
    let (_dir, files) = pki();
    let config = agent(&files, "--server-ping-timeout=0 --keepalive-time=0").unwrap();
    assert!(config.keepalive.is_none() && config.legacy_keepalive.is_none());
    let token = files.dir.join("token");
    std::fs::write(&token, "t").unwrap();
    let config = agent(
        &files,
        &format!("--service-account-token-path={}", token.display()),
    )
    .unwrap();
    assert_eq!(config.token_path, Some(token));
}

#[test]
fn destination_flags() {
    let (_dir, files) = pki();
    let defaults = agent(&files, "").unwrap().destinations;
    assert_eq!(defaults.policy_file, None);
    assert!(defaults.allow_loopback && !defaults.allow_link_local);
    assert_eq!((defaults.max_dials, defaults.max_lookups), (256, 32));
    assert_eq!(defaults.reload_interval, Duration::from_millis(500));

    let set = agent(
        &files,
        "--destination-policy=/etc/tether/destinations \
         --destination-policy-reload-interval=250ms --allow-loopback-destinations=false \
         --allow-link-local-destinations --max-concurrent-dials=8 \
         --max-concurrent-dns-lookups=2",
    )
    .unwrap()
    .destinations;
    assert_eq!(
        set.policy_file.as_deref(),
        Some(Path::new("/etc/tether/destinations"))
    );
    assert_eq!(set.reload_interval, Duration::from_millis(250));
    assert!(!set.allow_loopback && set.allow_link_local);
    assert_eq!((set.max_dials, set.max_lookups), (8, 2));

    assert!(error(agent(&files, "--max-concurrent-dials=0")).contains("--max-concurrent-dials"));
    assert!(
        error(agent(&files, "--destination-policy-reload-interval=0s"))
            .contains("--destination-policy-reload-interval")
    );
}

#[test]
fn the_control_plane_listener_takes_an_address_or_a_socket() {
    let (_dir, files) = pki();
    assert!(agent(&files, "").unwrap().control_plane.is_none());
    let cp = agent(&files, "--control-plane-listen=127.0.0.1:6443")
        .unwrap()
        .control_plane
        .unwrap();
    assert_eq!(
        cp.listen,
        tether_agent::ListenAddr::Tcp("127.0.0.1:6443".parse().unwrap())
    );
    assert_eq!(cp.endpoint, "");
    assert_eq!(cp.max_connections, 1000);
    let cp = agent(
        &files,
        "--control-plane-listen=unix:/run/tether/cp.sock --control-plane-endpoint=10.0.0.1:6443",
    )
    .unwrap()
    .control_plane
    .unwrap();
    assert_eq!(
        cp.listen,
        tether_agent::ListenAddr::Unix("/run/tether/cp.sock".into())
    );
    assert_eq!(cp.endpoint, "10.0.0.1:6443");
    let err = error(agent(&files, "--control-plane-listen=localhost:6443"));
    assert!(err.starts_with("--control-plane-listen: "), "{err}");
    let err = error(agent(&files, "--control-plane-endpoint=10.0.0.1:6443"));
    assert!(err.contains("needs --control-plane-listen"), "{err}");
    let err = error(agent(
        &files,
        "--control-plane-listen=127.0.0.1:6443 --control-plane-endpoint=nope",
    ));
    assert!(err.starts_with("--control-plane-endpoint: "), "{err}");
    let cp = agent(
        &files,
        "--control-plane-listen=127.0.0.1:6443 --control-plane-max-connections=5",
    )
    .unwrap()
    .control_plane
    .unwrap();
    assert_eq!(cp.max_connections, 5);
    assert_eq!(cp.protocol, tether_agent::ControlPlaneProtocol::Tcp);
    let cp = agent(
        &files,
        "--control-plane-listen=127.0.0.1:3128 --control-plane-protocol=http-connect",
    )
    .unwrap()
    .control_plane
    .unwrap();
    assert_eq!(cp.protocol, tether_agent::ControlPlaneProtocol::HttpConnect);
    let err = error(agent(&files, "--control-plane-protocol=http-connect"));
    assert!(err.contains("needs --control-plane-listen"), "{err}");
    let err = error(agent(&files, "--control-plane-max-connections=5"));
    assert!(err.contains("needs --control-plane-listen"), "{err}");
    assert!(
        agent(
            &files,
            "--control-plane-listen=127.0.0.1:6443 --control-plane-max-connections=0"
        )
        .is_err()
    );
}

/// `--https-proxy`: a URL (credentials never quoted back), `none`, or the environment; an
/// https:// proxy needs its own CA bundle, and an http:// one takes none.
#[test]
fn https_proxy_flags() {
    let (_dir, files) = pki();
    let config = agent(&files, "--https-proxy=http://u:hunter2@proxy.example:3128").unwrap();
    let proxy = config.egress.proxy().expect("a proxy").to_string();
    assert_eq!(proxy, "http://REDACTED@proxy.example:3128");
    assert!(!format!("{config:?}").contains("hunter2"));
    let config = agent(&files, "--https-proxy=none").unwrap();
    assert!(config.egress.proxy().is_none());

    let err = error(agent(
        &files,
        "--https-proxy=socks5://u:hunter2@proxy.example:1080",
    ));
    assert!(err.starts_with("--https-proxy: proxy scheme"), "{err}");
    let err = error(agent(
        &files,
        "--https-proxy=http://u:hunter2@proxy.example:port",
    ));
    assert!(
        err.starts_with("--https-proxy: ") && !err.contains("hunter2"),
        "{err}"
    );

    let err = error(agent(&files, "--https-proxy=https://proxy.example"));
    assert!(
        err.starts_with(
            "--https-proxy-ca-cert is required for the https:// proxy https://proxy.example:443"
        ),
        "{err}"
    );
    let ca = format!("--https-proxy-ca-cert={}", files.ca_cert.display());
    let config = agent(&files, &format!("--https-proxy=https://proxy.example {ca}")).unwrap();
    assert_eq!(
        config.egress.proxy().unwrap().to_string(),
        "https://proxy.example:443"
    );
    let err = error(agent(
        &files,
        "--https-proxy=https://proxy.example --https-proxy-ca-cert=/nonexistent",
    ));
    assert!(err.starts_with("--https-proxy-ca-cert: "), "{err}");
}
