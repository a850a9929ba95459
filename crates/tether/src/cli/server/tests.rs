use std::net::SocketAddr;

use tether_server::IdentityBinding;
use tether_tls::pki::PkiFiles;

use super::*;
use crate::cli::Command;
use crate::cli::testutil::{parse, pki, words};

fn server_args(line: &str) -> Result<ServerArgs, clap::Error> {
    let mut args = words(line);
    args.insert(0, "server".into());
    match parse(&args)? {
        Command::Server(args) => Ok(args),
        other => panic!("parsed as {other:?}"),
    }
}

/// Server flags with the mandatory agent-listener certificate and CA plus `extra`.
fn server(files: &PkiFiles, extra: &str) -> anyhow::Result<Config> {
    let line = format!(
        "--cluster-cert={} --cluster-key={} --cluster-ca-cert={} {extra}",
        files.server_cert.display(),
        files.server_key.display(),
        files.ca_cert.display()
    );
    server_args(&line)?.into_config()
}

/// A UDS frontend, as upstream's integration tests and kube-apiserver's usual setup use.
fn uds(files: &PkiFiles, extra: &str) -> anyhow::Result<Config> {
    let socket = files.dir.join("konnectivity.sock");
    server(
        files,
        &format!("--uds-name={} --server-port=0 {extra}", socket.display()),
    )
}

/// The mTLS files a TCP frontend needs.
fn frontend_tls(files: &PkiFiles) -> String {
    format!(
        "--server-cert={} --server-key={} --server-ca-cert={}",
        files.server_cert.display(),
        files.server_key.display(),
        files.ca_cert.display()
    )
}

fn error(result: anyhow::Result<Config>) -> String {
    format!("{:#}", result.expect_err("flags were accepted"))
}

#[test]
fn uds_frontend() {
    let (_dir, files) = pki();
    let config = uds(
        &files,
        "--delete-existing-uds-file=false --mode=http-connect",
    )
    .unwrap();
    let FrontendListen::Unix {
        path,
        delete_existing,
    } = &config.frontend
    else {
        panic!("{:?}", config.frontend);
    };
    assert_eq!(path, &files.dir.join("konnectivity.sock"));
    assert!(!delete_existing);
    assert_eq!(config.mode, Mode::HttpConnect);
}

#[test]
fn uds_frontend_refuses_tcp_settings() {
    let (_dir, files) = pki();
    let err = error(server(&files, "--uds-name=/tmp/x.sock"));
    assert!(
        err.starts_with("--server-port must be 0 with --uds-name"),
        "{err}"
    );
    let cert = format!("--server-cert={}", files.server_cert.display());
    let err = error(uds(&files, &cert));
    assert!(
        err.starts_with("--server-cert must not be set with --uds-name"),
        "{err}"
    );
    let ca = format!("--server-ca-cert={}", files.ca_cert.display());
    assert!(error(uds(&files, &ca)).starts_with("--server-ca-cert must not be set"));
}

#[test]
fn tcp_frontend_requires_mutual_tls() {
    let (_dir, files) = pki();
    let err = error(server(&files, ""));
    assert!(
        err.starts_with("--server-cert is required for a TCP frontend"),
        "{err}"
    );
    let without_ca = format!(
        "--server-cert={} --server-key={}",
        files.server_cert.display(),
        files.server_key.display()
    );
    let err = error(server(&files, &without_ca));
    assert!(err.starts_with("--server-ca-cert is required"), "{err}");
    let key_only = format!("--server-key={}", files.server_key.display());
    assert!(
        error(server(&files, &key_only))
            .starts_with("--server-cert must be set when --server-key is set")
    );

    let config = server(
        &files,
        &format!("{} --server-bind-address=127.0.0.1", frontend_tls(&files)),
    )
    .unwrap();
    let FrontendListen::Tls { addr, tls } = &config.frontend else {
        panic!("{:?}", config.frontend);
    };
    assert_eq!(*addr, "127.0.0.1:8090".parse::<SocketAddr>().unwrap());
    assert_eq!(tls.alpn_protocols, [b"h2".to_vec()]);

    let config = server(
        &files,
        &format!("{} --mode http-connect", frontend_tls(&files)),
    )
    .unwrap();
    let FrontendListen::Tls { tls, .. } = &config.frontend else {
        panic!("{:?}", config.frontend);
    };
    assert_eq!(tls.alpn_protocols, [b"http/1.1".to_vec()]);
}

#[test]
fn defaults_match_upstream() {
    let (_dir, files) = pki();
    let config = uds(&files, "").unwrap();
    assert_eq!(config.mode, Mode::Grpc);
    assert_eq!(
        config.agent_addr,
        "0.0.0.0:8091".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(
        config.health_addr,
        "0.0.0.0:8092".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(
        config.admin_addr,
        "127.0.0.1:8095".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(config.server_count, 1);
    assert_eq!(config.strategies, [Strategy::Default]);
    assert_eq!(config.graceful_shutdown_timeout, Duration::ZERO);
    assert_eq!(config.dial_timeout, DIAL_BACKSTOP);
    assert!(!config.server_id.is_empty());
    let agent = config.agent_keepalive.unwrap();
    assert_eq!(
        (agent.interval, agent.timeout),
        (Duration::from_secs(5), Duration::from_secs(10))
    );
    let frontend = config.frontend_keepalive.unwrap();
    assert_eq!(
        (frontend.interval, frontend.timeout),
        (Duration::from_secs(3600), Duration::from_secs(20))
    );
    assert_eq!(
        config.agent_tls.alpn_protocols,
        [b"tether/1".to_vec(), b"h2".to_vec(), b"http/1.1".to_vec()]
    );
}

#[test]
fn timeouts_and_keepalives() {
    let (_dir, files) = pki();
    let config = uds(
        &files,
        "--backend-dial-timeout=1.5s --graceful-shutdown-timeout 1m0s --keepalive-time=2s \
         --frontend-keepalive-time=0",
    )
    .unwrap();
    assert_eq!(config.dial_timeout, Duration::from_millis(1500));
    assert_eq!(config.graceful_shutdown_timeout, Duration::from_secs(60));
    assert_eq!(
        config.agent_keepalive.unwrap().interval,
        Duration::from_secs(2)
    );
    assert!(config.frontend_keepalive.is_none());
    // Without PINGs an idle live agent sends nothing, so the dead-agent watch must go too,
    // and the error says which flags.
    let err = uds(&files, "--agent-ping-timeout=0s")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--dead-agent-timeout") && err.contains("--agent-ping-timeout=0"),
        "{err}"
    );
    let config = uds(&files, "--agent-ping-timeout=0s --dead-agent-timeout=0").unwrap();
    assert!(config.agent_keepalive.is_none());
    assert!(config.dead_agent_timeout.is_none());
}

#[test]
fn identity_and_strategies() {
    let (_dir, files) = pki();
    let config = uds(
        &files,
        "--server-id=s1 --server-count=3 --proxy-strategies=destHost,default",
    )
    .unwrap();
    assert_eq!(config.server_id, "s1");
    assert_eq!(config.server_count, 3);
    assert_eq!(config.strategies, [Strategy::DestHost, Strategy::Default]);
    let config = uds(
        &files,
        "--proxy-strategies=topology,destCIDR,leastLoaded,default",
    )
    .unwrap();
    assert_eq!(
        config.strategies,
        [
            Strategy::Topology,
            Strategy::DestCidr,
            Strategy::LeastLoaded,
            Strategy::Default
        ]
    );
}

#[test]
fn routing_file_is_read_and_validated_at_start_up() {
    let (dir, files) = pki();
    let good = dir.path().join("routing.yaml");
    std::fs::write(
        &good,
        "zones:\n  - zone: a\n    cidrs: [10.0.0.0/8]\naffinity: client\n",
    )
    .unwrap();
    let config = uds(
        &files,
        &format!(
            "--routing-config={} --proxy-strategies=topology,default",
            good.display()
        ),
    )
    .unwrap();
    assert_eq!(config.routing.zone_rules[0].zone, "a");
    assert!(config.routing.client_affinity);
    assert_eq!(
        uds(&files, "").unwrap().routing,
        tether_server::RoutingConfig::default()
    );

    // Zones that no strategy reads would route nothing by zone, silently.
    let err = error(uds(&files, &format!("--routing-config={}", good.display())));
    assert!(
        err.contains("has zones") && err.contains("--proxy-strategies=topology,default"),
        "{err}"
    );

    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "zones:\n  - zone: a\n    cidrs: [10.0.0.1/8]\n").unwrap();
    let err = error(uds(&files, &format!("--routing-config={}", bad.display())));
    assert!(err.starts_with("--routing-config"), "{err}");
    assert!(err.contains("host bits"), "{err}");
    let err = error(uds(&files, "--routing-config=/nonexistent/routing.yaml"));
    assert!(
        err.starts_with("--routing-config: reading /nonexistent"),
        "{err}"
    );
}

#[test]
fn invalid_values_name_their_flag() {
    let (_dir, files) = pki();
    let cases = [
        ("--mode=socks", "--mode"),
        ("--proxy-strategies=", "--proxy-strategies"),
        ("--proxy-strategies=nearest", "--proxy-strategies"),
        ("--agent-port=80", "--agent-port"),
        ("--health-port=50000", "--health-port"),
        ("--admin-port=1023", "--admin-port"),
        ("--server-count=0", "--server-count"),
        ("--xfr-channel-size=0", "--xfr-channel-size"),
        ("--agent-ping-interval=0", "--agent-ping-interval"),
        ("--connection-window=1Ki", "--connection-window"),
        ("--tls-min-version=VersionTLS14", "--tls-min-version"),
        (
            "--cipher-suites=TLS_RSA_WITH_RC4_128_SHA",
            "--tls-min-version/--cipher-suites",
        ),
        (
            "--enable-contention-profiling",
            "--enable-contention-profiling",
        ),
    ];
    for (flags, flag) in cases {
        let err = error(uds(&files, flags));
        assert!(err.starts_with(flag), "{flags}: {err}");
    }
    let err = error(
        server_args("--uds-name=/x --server-port=0")
            .unwrap()
            .into_config(),
    );
    assert!(
        err.starts_with("--cluster-cert and --cluster-key are required"),
        "{err}"
    );
    let err = error(uds(&files, "--cluster-ca-cert=/nonexistent/ca.crt"));
    assert!(
        err.starts_with("--cluster-cert/--cluster-key/--cluster-ca-cert: ")
            && err.contains("/nonexistent/ca.crt"),
        "{err}"
    );
}

#[test]
fn ports_zero_and_tcp_port_range() {
    let (_dir, files) = pki();
    let config = uds(&files, "--agent-port=0 --health-port=0 --admin-port=0").unwrap();
    assert_eq!(config.agent_addr.port(), 0);
    let err = error(server(
        &files,
        &format!("{} --server-port=443", frontend_tls(&files)),
    ));
    assert!(
        err.starts_with("--server-port: please do not try to use reserved port 443"),
        "{err}"
    );
}

/// The agent listener without --cluster-ca-cert plus `extra`: how token authentication runs.
fn token_launch(files: &PkiFiles, extra: &str) -> anyhow::Result<ServerLaunch> {
    let line = format!(
        "--cluster-cert={} --cluster-key={} --uds-name={} --server-port=0 {extra}",
        files.server_cert.display(),
        files.server_key.display(),
        files.dir.join("konnectivity.sock").display()
    );
    server_args(&line)?.into_launch()
}

const TOKEN_AUTH: &str = "--agent-namespace=kube-system --agent-service-account=konnectivity-agent \
                          --authentication-audience=system:konnectivity-server";

#[test]
fn token_authentication_as_the_kubernetes_io_task_configures_it() {
    let (_dir, files) = pki();
    let kubeconfig = files.dir.join("kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").unwrap();
    let launch = token_launch(
        &files,
        &format!(
            "{TOKEN_AUTH} --kubeconfig={} --kubeconfig-qps=50 --kubeconfig-burst=100 \
             --kube-api-content-type=application/json",
            kubeconfig.display()
        ),
    )
    .unwrap();
    let auth = launch.token_auth.unwrap();
    assert_eq!(
        auth.account,
        tether_kube::token_review::AgentServiceAccount {
            namespace: "kube-system".into(),
            name: "konnectivity-agent".into(),
            audience: "system:konnectivity-server".into(),
        }
    );
    assert_eq!(auth.match_host_to_node, None);
    assert_eq!(
        launch.config.agent_identity_binding,
        IdentityBinding::Identifiers
    );
    assert_eq!(auth.cache.ttl, Duration::from_secs(120));
    assert_eq!(auth.cache.negative_ttl, Duration::from_secs(10));
    assert_eq!(auth.cache.stale_ttl, Duration::from_secs(3600));
    assert_eq!(auth.cache.max_entries, 10_000);
    assert_eq!(
        auth.per_address,
        tether_kube::token_review::AddressLimit { qps: 2.0, burst: 5 }
    );
    assert_eq!(
        launch.kube.unwrap(),
        tether_kube::KubeApiOptions {
            kubeconfig: Some(kubeconfig),
            qps: 50.0,
            burst: 100,
        }
    );

    let launch = token_launch(
        &files,
        &format!(
            "{TOKEN_AUTH} --match-agent-host-to-token-node=false --token-review-cache-ttl=0 \
             --token-review-negative-cache-ttl=1s --token-review-stale-ttl=5m \
             --token-review-cache-size=7 --token-review-qps-per-address=-1 \
             --token-review-burst-per-address=9"
        ),
    )
    .unwrap();
    assert_eq!(launch.config.agent_identity_binding, IdentityBinding::Off);
    let auth = launch.token_auth.unwrap();
    assert_eq!(auth.match_host_to_node, Some(false));
    assert_eq!(auth.cache.ttl, Duration::ZERO);
    assert_eq!(auth.cache.negative_ttl, Duration::from_secs(1));
    assert_eq!(auth.cache.stale_ttl, Duration::from_secs(300));
    assert_eq!(auth.cache.max_entries, 7);
    assert_eq!(
        auth.per_address,
        tether_kube::token_review::AddressLimit {
            qps: -1.0,
            burst: 9
        }
    );
    // No --kubeconfig: the in-cluster configuration, with client-go's rate defaults.
    assert_eq!(launch.kube.unwrap(), tether_kube::KubeApiOptions::default());
}

#[test]
fn token_authentication_follows_upstreams_validation() {
    let (_dir, files) = pki();
    // Any one of the three flags enables it; then all three are required.
    for (given, missing) in [
        ("--agent-namespace=ns", "--agent-service-account"),
        ("--agent-service-account=sa", "--agent-namespace"),
        ("--authentication-audience=aud", "--agent-namespace"),
        (
            "--agent-namespace=ns --agent-service-account=sa",
            "--authentication-audience",
        ),
    ] {
        let err = format!("{:#}", token_launch(&files, given).unwrap_err());
        assert_eq!(
            err,
            format!("{missing} cannot be empty when agent authentication is enabled"),
            "{given}"
        );
    }
    let err = error(uds(&files, TOKEN_AUTH));
    assert_eq!(
        err,
        "--cluster-ca-cert can not be used when agent authentication is enabled"
    );
    let err = format!(
        "{:#}",
        token_launch(
            &files,
            &format!("{TOKEN_AUTH} --kubeconfig=/nonexistent/kubeconfig")
        )
        .unwrap_err()
    );
    assert!(
        err.starts_with("checking KubeconfigPath \"/nonexistent/kubeconfig\""),
        "{err}"
    );
    for (flag, want) in [
        (
            "--kube-api-content-type=text/yaml",
            "--kube-api-content-type must be",
        ),
        (
            "--kubeconfig-burst=-1",
            "--kubeconfig-burst must be between 0",
        ),
        (
            "--allow-unauthenticated-agents",
            "contradicts agent token authentication",
        ),
        (
            "--match-agent-identity-to-certificate",
            "with token authentication use --agent-identity-binding",
        ),
    ] {
        let err = format!(
            "{:#}",
            token_launch(&files, &format!("{TOKEN_AUTH} {flag}")).unwrap_err()
        );
        assert!(err.contains(want), "{flag}: {err}");
    }
    // Without token authentication nothing Kubernetes is built, and the client flags are
    // reported as having no effect.
    let line = format!(
        "--cluster-cert={} --cluster-key={} --cluster-ca-cert={} --uds-name={} --server-port=0 \
         --kubeconfig=/nonexistent/kubeconfig",
        files.server_cert.display(),
        files.server_key.display(),
        files.ca_cert.display(),
        files.dir.join("k.sock").display()
    );
    let launch = server_args(&line).unwrap().into_launch().unwrap();
    assert!(launch.kube.is_none() && launch.token_auth.is_none());
}

fn lease_settings(files: &PkiFiles, extra: &str) -> anyhow::Result<Option<ServerLeases>> {
    let line = format!(
        "--uds-name={} --server-port=0 {extra}",
        files.dir.join("s.sock").display()
    );
    let line = format!(
        "{line} --cluster-cert={} --cluster-key={} --cluster-ca-cert={}",
        files.server_cert.display(),
        files.server_key.display(),
        files.ca_cert.display()
    );
    Ok(server_args(&line)?.into_launch()?.leases)
}

#[test]
fn lease_controller_flags() {
    let (_dir, files) = pki();
    assert!(lease_settings(&files, "").unwrap().is_none());
    let leases = lease_settings(&files, "--enable-lease-controller --server-id=srv-1")
        .unwrap()
        .unwrap();
    assert_eq!(leases.namespace, "kube-system");
    assert_eq!(leases.labels.selector(), "k8s-app=konnectivity-server");
    assert_eq!(leases.duration, Duration::from_secs(30));
    assert_eq!(leases.renew_interval, Duration::from_secs(15));

    let kubeconfig = files.dir.join("kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").unwrap();
    let leases = lease_settings(
        &files,
        &format!(
            "--enable-lease-controller --kubeconfig={} --lease-namespace=proxy \
             --lease-label=b=2,a=1 --lease-duration=4s --lease-renew-interval=1s",
            kubeconfig.display()
        ),
    )
    .unwrap()
    .unwrap();
    assert_eq!(leases.namespace, "proxy");
    assert_eq!(leases.labels.selector(), "a=1,b=2");
    assert_eq!(leases.duration, Duration::from_secs(4));
    assert_eq!(leases.renew_interval, Duration::from_secs(1));
    assert_eq!(leases.agent_address, None);
    let leases = lease_settings(
        &files,
        "--enable-lease-controller --lease-agent-address=[fd00::7]:8091",
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        leases.agent_address,
        Some("[fd00::7]:8091".parse().unwrap())
    );
    let leases = lease_settings(
        &files,
        "--enable-lease-controller --agent-port=8132 --lease-agent-address=fd00::7",
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        leases.agent_address,
        Some("[fd00::7]:8132".parse().unwrap())
    );
    for (flags, want) in [
        (
            "--enable-lease-controller --lease-agent-address=konnectivity:8091",
            "--lease-agent-address must be IP[:PORT]",
        ),
        (
            "--lease-agent-address=10.0.0.7:8091",
            "--lease-agent-address is published in the server's Lease: it needs --enable-lease-controller",
        ),
    ] {
        let err = format!("{:#}", lease_settings(&files, flags).unwrap_err());
        assert!(err.starts_with(want), "{flags}: {err}");
    }
}

#[test]
fn lease_controller_refusals_name_their_flag() {
    let (_dir, files) = pki();
    for (flags, want) in [
        ("--lease-label=a", "--lease-label: invalid label format: a"),
        ("--lease-label=", "--lease-label: empty string provided"),
        ("--lease-namespace=", "--lease-namespace must not be empty"),
        (
            "--lease-duration=1500ms",
            "--lease-duration must be a whole number of seconds",
        ),
        (
            "--lease-duration=0s",
            "--lease-duration must be a whole number of seconds",
        ),
        (
            "--lease-renew-interval=30s",
            "--lease-renew-interval must be greater than 0 and less than --lease-duration",
        ),
        (
            "--lease-renew-interval=0s",
            "--lease-renew-interval must be greater than 0",
        ),
        (
            "--server-id=Srv_1",
            "--server-id (with --enable-lease-controller): server ID \"Srv_1\" does not make a valid Lease name",
        ),
        (
            "--kubeconfig=/nonexistent/kc",
            "checking KubeconfigPath \"/nonexistent/kc\"",
        ),
    ] {
        let result = lease_settings(&files, &format!("--enable-lease-controller {flags}"));
        let err = format!("{:#}", result.unwrap_err());
        assert!(err.starts_with(want), "{flags}: {err}");
        // Without the controller they are not checked (as upstream), only reported.
        lease_settings(&files, flags).unwrap();
    }
}

#[test]
fn no_op_flags_are_reported_when_set() {
    let args = server_args(
        "--enable-profiling --kubeconfig-qps=50 --xfr-channel-size=10 --warn-on-channel-limit=false \
         --lease-namespace=kube-system --vmodule=x=5 --lease-label=a=b --kubeconfig=/k",
    )
    .unwrap();
    assert!(
        args.upstream_only.enable_profiling,
        "--enable-profiling has an effect"
    );
    assert_eq!(
        args.ignored(false),
        [
            "--kubeconfig=/k (without token auth, Leases or --control-plane-endpoints=kubeconfig)",
            "--kubeconfig-qps=50 (without token auth, Leases or --control-plane-endpoints=kubeconfig)",
            "--lease-label=a=b (without --enable-lease-controller)",
            "--warn-on-channel-limit=false",
            "--vmodule=x=5"
        ]
    );
    // With a Kubernetes client (token authentication) the client flags take effect.
    assert_eq!(
        args.ignored(true),
        [
            "--lease-label=a=b (without --enable-lease-controller)",
            "--warn-on-channel-limit=false",
            "--vmodule=x=5"
        ]
    );
    let args = server_args("--enable-lease-controller --lease-label=a=b --kubeconfig=/k").unwrap();
    assert!(
        !args
            .ignored(true)
            .iter()
            .any(|f| f.contains("lease") || f.contains("--kubeconfig="))
    );
}

#[test]
fn cipher_suites_accumulate_like_pflag_slices() {
    let args = server_args(
        "--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 \
         --cipher-suites TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA256",
    )
    .unwrap();
    assert_eq!(args.cipher_suites.len(), 2);
}

#[test]
fn agents_must_be_authenticated_unless_explicitly_allowed() {
    let (_dir, files) = pki();
    let socket = files.dir.join("konnectivity.sock");
    let without_ca = format!(
        "--cluster-cert={} --cluster-key={} --uds-name={} --server-port=0",
        files.server_cert.display(),
        files.server_key.display(),
        socket.display()
    );
    let err = error(server_args(&without_ca).unwrap().into_config());
    assert!(
        err.contains("--cluster-ca-cert") && err.contains("--allow-unauthenticated-agents"),
        "{err}"
    );
    let lab = format!("{without_ca} --allow-unauthenticated-agents");
    let config = server_args(&lab).unwrap().into_config().unwrap();
    assert_eq!(config.agent_identity_binding, IdentityBinding::Identifiers);
    let err = error(uds(&files, "--allow-unauthenticated-agents"));
    assert!(err.contains("contradicts --cluster-ca-cert"), "{err}");
    let err = error(
        server_args(&format!("{lab} --match-agent-identity-to-certificate"))
            .unwrap()
            .into_config(),
    );
    assert!(err.contains("needs --cluster-ca-cert"), "{err}");
}

#[test]
fn hardening_defaults_and_overrides() {
    let (_dir, files) = pki();
    let limits = uds(&files, "").unwrap().limits;
    assert_eq!(limits.setup_timeout, Duration::from_secs(10));
    assert_eq!(limits.max_streams_per_frontend_connection, 4_000);
    assert_eq!(limits.max_agent_connections_per_address, 100);
    let config = uds(
        &files,
        "--connection-setup-timeout=3s --idle-connection-timeout=0 --max-agents=5 \
         --max-streams-per-frontend-connection=20000 --match-agent-identity-to-certificate",
    )
    .unwrap();
    assert_eq!(config.limits.setup_timeout, Duration::from_secs(3));
    assert_eq!(config.limits.idle_connection_timeout, None);
    assert_eq!(config.limits.max_agents, 5);
    assert_eq!(config.limits.max_streams_per_frontend_connection, 20_000);
    assert_eq!(config.agent_identity_binding, IdentityBinding::All);
    for flag in ["--connection-setup-timeout=0", "--max-agents=0"] {
        assert!(error(uds(&files, flag)).starts_with(flag.split('=').next().unwrap()));
    }
}

#[test]
fn identity_binding_is_on_by_default_and_the_old_flags_map_onto_it() {
    let (_dir, files) = pki();
    let binding = |extra: &str| uds(&files, extra).map(|c| c.agent_identity_binding);
    assert_eq!(binding("").unwrap(), IdentityBinding::Identifiers);
    for (flag, want) in [
        ("--agent-identity-binding=off", IdentityBinding::Off),
        ("--agent-identity-binding=all", IdentityBinding::All),
        (
            "--agent-identity-binding=identifiers",
            IdentityBinding::Identifiers,
        ),
        (
            "--match-agent-identity-to-certificate",
            IdentityBinding::All,
        ),
        (
            "--match-agent-identity-to-certificate=false",
            IdentityBinding::Off,
        ),
    ] {
        assert_eq!(binding(flag).unwrap(), want, "{flag}");
    }
    let err = error(uds(
        &files,
        "--agent-identity-binding=all --match-agent-identity-to-certificate",
    ));
    assert!(
        err.contains("replaced by --agent-identity-binding"),
        "{err}"
    );
    assert!(server_args("--agent-identity-binding=on").is_err());
    // With tokens: the old token flag maps too, and `all` binds the ID to the token's node.
    let launch = |extra: &str| {
        token_launch(&files, &format!("{TOKEN_AUTH} {extra}"))
            .map(|l| l.config.agent_identity_binding)
    };
    assert_eq!(launch("").unwrap(), IdentityBinding::Identifiers);
    assert_eq!(
        launch("--match-agent-host-to-token-node").unwrap(),
        IdentityBinding::Identifiers
    );
    assert_eq!(
        launch("--agent-identity-binding=all").unwrap(),
        IdentityBinding::All
    );
    let err = format!(
        "{:#}",
        launch("--agent-identity-binding=off --match-agent-host-to-token-node=false").unwrap_err()
    );
    assert!(
        err.contains("--match-agent-host-to-token-node is replaced"),
        "{err}"
    );
}

#[test]
fn the_audit_log_is_off_by_default_and_takes_a_path_or_stdout() {
    use tether_observe::audit::AuditTarget;
    let (_dir, files) = pki();
    assert_eq!(uds(&files, "").unwrap().audit_log, None);
    assert_eq!(
        uds(&files, "--audit-log-path=-").unwrap().audit_log,
        Some(AuditTarget::Stdout)
    );
    assert_eq!(
        uds(&files, "--audit-log-path=/var/log/tether/audit.log")
            .unwrap()
            .audit_log,
        Some(AuditTarget::File("/var/log/tether/audit.log".into()))
    );
}

#[test]
fn control_plane_endpoints_are_a_checked_list_and_off_without_one() {
    let (_dir, files) = pki();
    // Opt-in: no flag, no reverse dials.
    assert_eq!(uds(&files, "").unwrap().control_plane, None);
    assert_eq!(
        uds(&files, "--control-plane-endpoints=none")
            .unwrap()
            .control_plane,
        None
    );
    let config = uds(
        &files,
        "--control-plane-endpoints=127.0.0.1:6443,[::1]:6443,kubernetes.default.svc:443",
    )
    .unwrap();
    assert_eq!(
        config.control_plane.unwrap().endpoints(),
        ["127.0.0.1:6443", "[::1]:6443", "kubernetes.default.svc:443"]
    );
    for bad in [
        "127.0.0.1",
        "127.0.0.1:0",
        ":6443",
        "::1:6443",
        "h:port",
        "kubeconfig,127.0.0.1:6443",
    ] {
        let err = error(uds(&files, &format!("--control-plane-endpoints={bad}")));
        assert!(
            err.starts_with("--control-plane-endpoints: "),
            "{bad}: {err}"
        );
    }
}

#[test]
fn reverse_connections_per_stream_have_a_positive_cap() {
    let (_dir, files) = pki();
    assert_eq!(
        uds(&files, "")
            .unwrap()
            .limits
            .max_reverse_connections_per_stream,
        tether_server::DEFAULT_MAX_REVERSE_CONNECTIONS_PER_STREAM
    );
    assert_eq!(
        uds(&files, "--control-plane-max-connections-per-stream=3")
            .unwrap()
            .limits
            .max_reverse_connections_per_stream,
        3
    );
    let err = error(uds(&files, "--control-plane-max-connections-per-stream=0"));
    assert!(
        err.contains("--control-plane-max-connections-per-stream must be at least 1"),
        "{err}"
    );
}

#[test]
fn the_kubeconfigs_api_server_is_a_reverse_endpoint_only_when_asked() {
    let (_dir, files) = pki();
    let kubeconfig = files.dir.join("kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").unwrap();
    // Token authentication builds a Kubernetes client, but no longer opens reverse dials.
    let launch = token_launch(
        &files,
        &format!("{TOKEN_AUTH} --kubeconfig={}", kubeconfig.display()),
    )
    .unwrap();
    assert!(launch.kube.is_some());
    assert!(!launch.control_plane_from_kubeconfig);
    assert_eq!(launch.config.control_plane, None);
    // `kubeconfig` asks for it, and builds the client for it alone.
    let launch = token_launch(
        &files,
        &format!(
            "--cluster-ca-cert={} --control-plane-endpoints=kubeconfig --kubeconfig={}",
            files.ca_cert.display(),
            kubeconfig.display()
        ),
    )
    .unwrap();
    assert!(launch.control_plane_from_kubeconfig);
    assert_eq!(launch.kube.unwrap().kubeconfig, Some(kubeconfig.clone()));
}

/// The peer files of the test PKI, as flags.
fn peer_tls(files: &PkiFiles) -> String {
    format!(
        "--peer-cert-file={} --peer-key-file={} --peer-ca-cert={}",
        files.peer_cert.display(),
        files.peer_key.display(),
        files.ca_cert.display()
    )
}

#[test]
fn server_peering_is_off_unless_asked_and_lists_its_peers() {
    let (_dir, files) = pki();
    assert!(uds(&files, "").unwrap().peering.is_none());
    let config = uds(
        &files,
        &format!(
            "--peer-port=8093 {} --peer-addresses=10.0.0.2,10.0.0.3:9000,[fd00::4]",
            peer_tls(&files)
        ),
    )
    .unwrap();
    let peering = config.peering.unwrap();
    assert_eq!(
        peering.listen,
        "0.0.0.0:8093".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(peering.name, "tether-peer");
    let want: std::collections::BTreeSet<SocketAddr> =
        ["10.0.0.2:8093", "10.0.0.3:9000", "[fd00::4]:8093"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
    assert_eq!(*peering.addresses.borrow(), want);
    assert_eq!(
        peering.server_tls.alpn_protocols,
        [tether_server::PEER_ALPN.to_vec()]
    );
    // Peers from the Leases: the Lease carries this server's peer address.
    let leases = lease_settings(
        &files,
        &format!(
            "--enable-lease-controller --peer-port=8093 {} --lease-peer-address=10.0.0.7",
            peer_tls(&files)
        ),
    )
    .unwrap()
    .unwrap();
    assert_eq!(leases.peer_address, Some("10.0.0.7:8093".parse().unwrap()));
    assert!(leases.peers.is_some(), "the Lease tasks publish the peers");
}

#[test]
fn server_peering_refusals_name_their_flag() {
    let (_dir, files) = pki();
    let tls = peer_tls(&files);
    for (flags, want) in [
        (
            format!("--peer-addresses=10.0.0.2 {tls}"),
            "--peer-cert-file is a server peering setting: it needs --peer-port",
        ),
        (
            "--peer-port=8093 --peer-addresses=10.0.0.2".to_owned(),
            "--peer-port needs --peer-cert-file",
        ),
        (
            format!("--peer-port=8093 {tls}"),
            "--peer-port needs its peers",
        ),
        (
            format!("--peer-port=8093 {tls} --peer-addresses=peers.example"),
            "--peer-addresses: \"peers.example\" is not IP[:PORT]",
        ),
        (
            format!("--peer-port=8093 {tls} --peer-addresses=10.0.0.2 --peer-name=a/b"),
            "--peer-name must be a DNS name or an IP address",
        ),
        (
            format!(
                "--peer-port=8093 {tls} --peer-addresses=10.0.0.2 --enable-lease-controller --lease-peer-address=10.0.0.7"
            ),
            "--peer-addresses lists the peers, --lease-peer-address finds them in the Leases",
        ),
        (
            "--enable-lease-controller --lease-peer-address=10.0.0.7".to_owned(),
            "--lease-peer-address publishes where peers reach this server's peer port: it needs --peer-port",
        ),
    ] {
        let err = error(uds(&files, &flags));
        assert!(err.contains(want), "{flags}: {err}");
    }
}
