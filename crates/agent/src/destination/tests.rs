//! Dialing against real loopback listeners. Denied destinations outside loopback are only
//! ever checked, never connected: the policy runs before connect, which the loopback cases
//! prove by watching their listener stay silent.

use std::io::Write;

use tether_observe::metrics::Registry;
use tokio::net::TcpListener;

use super::*;

const STEP: Duration = Duration::from_secs(10);

fn destinations(config: DestinationConfig) -> (Destinations, Registry) {
    let registry = Registry::new();
    (
        Destinations::new(config, Vec::new(), &registry).unwrap(),
        registry,
    )
}

fn with_policy(text: &str) -> (tempfile::NamedTempFile, DestinationConfig) {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    let config = DestinationConfig {
        policy_file: Some(file.path().to_owned()),
        reload_interval: Duration::from_millis(20),
        ..DestinationConfig::default()
    };
    (file, config)
}

/// Fails if anything connects to `listener` within a short while.
async fn assert_never_connected(listener: &TcpListener) {
    let accepted = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
    assert!(accepted.is_err(), "a denied destination was connected to");
}

async fn policy_error(d: &Destinations, address: &str) -> String {
    match d.dial("tcp", address, STEP).await {
        Err((DialFailure::Policy, text)) => text,
        Err((other, text)) => panic!("{address}: not a policy error: {other:?} {text}"),
        Ok(_) => panic!("{address}: dialed"),
    }
}

#[tokio::test]
async fn dial_errors_read_like_go() {
    let (d, _) = destinations(DestinationConfig::default());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let (_, error) = d.dial("tcp", &addr.to_string(), STEP).await.unwrap_err();
    assert_eq!(
        error,
        format!("dial tcp {addr}: connect: connection refused")
    );
    let (_, error) = d.dial("udp", "127.0.0.1:1", STEP).await.unwrap_err();
    assert_eq!(error, "dial udp: unknown network udp");
    let (_, error) = d.dial("tcp", "127.0.0.1", STEP).await.unwrap_err();
    assert_eq!(
        error,
        "dial tcp: address 127.0.0.1: missing port in address"
    );
}

#[tokio::test]
async fn metadata_and_link_local_are_refused_by_the_built_in_rules() {
    let (d, _) = destinations(DestinationConfig::default());
    for address in [
        "169.254.169.254:80",
        "[fd00:ec2::254]:80",
        "[::ffff:169.254.169.254]:80",
        "[fe80::1]:443",
    ] {
        let text = policy_error(&d, address).await;
        assert!(
            text.starts_with("policy: ") && text.contains("built-in rule"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn a_denied_loopback_port_is_never_connected() {
    let denied = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let allowed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = denied.local_addr().unwrap().port();
    let (_file, config) = with_policy(&format!("deny to 127.0.0.1 port {port}\nallow all\n"));
    let (d, _) = destinations(config);
    assert_eq!(
        policy_error(&d, &format!("127.0.0.1:{port}")).await,
        format!("policy: 127.0.0.1:{port} denied by line 1: deny to 127.0.0.1/32 port {port}")
    );
    assert_never_connected(&denied).await;
    d.dial("tcp", &allowed.local_addr().unwrap().to_string(), STEP)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_name_that_resolves_to_a_denied_address_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (d, _) = destinations(DestinationConfig {
        allow_loopback: false,
        ..DestinationConfig::default()
    });
    let text = policy_error(&d, &format!("localhost:{port}")).await;
    assert!(text.contains("--allow-loopback-destinations"), "{text}");
    assert_never_connected(&listener).await;
}

#[tokio::test]
async fn a_changed_policy_applies_and_a_broken_one_keeps_the_last_good() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (file, config) = with_policy("allow all\n");
    let (d, registry) = destinations(config);
    let d = Arc::new(d);
    let stop = CancellationToken::new();
    let watcher = tokio::spawn(d.clone().watch(stop.clone()));
    d.dial("tcp", &address, STEP).await.unwrap();
    assert_eq!(d.view().unwrap().generation, 1);

    std::fs::write(file.path(), "deny to 127.0.0.0/8\nallow all\n").unwrap();
    wait_for(&registry, "result=\"applied\"} 1").await;
    assert!(
        policy_error(&d, &address)
            .await
            .contains("line 1: deny to 127.0.0.0/8")
    );
    let view = d.view().unwrap();
    assert_eq!(view.generation, 2);
    assert_eq!(
        view.sha256,
        tether_reload::sha256_hex(b"deny to 127.0.0.0/8\nallow all\n")
    );
    assert!(view.last_refusal.is_none());

    std::fs::write(file.path(), "allow all\nallow to 10.0.0.300\n").unwrap();
    wait_for(&registry, "result=\"refused\"} 1").await;
    assert!(
        policy_error(&d, &address)
            .await
            .contains("line 1: deny to 127.0.0.0/8")
    );
    let view = d.view().unwrap();
    assert_eq!(view.generation, 2);
    let refusal = view.last_refusal.unwrap();
    assert!(
        refusal.message.starts_with(&format!(
            "destination policy {}: line 2: ",
            file.path().display()
        )),
        "{}",
        refusal.message
    );

    stop.cancel();
    tokio::time::timeout(STEP, watcher).await.unwrap().unwrap();
}

#[tokio::test]
async fn an_open_connection_is_revoked_by_the_first_generation_that_denies_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (file, config) = with_policy("allow all\n");
    let (d, _registry) = destinations(config);
    let Dialed { stream, watch } = d
        .dial("tcp", &format!("localhost:{port}"), STEP)
        .await
        .unwrap();
    let ip = stream.peer_addr().unwrap().ip();
    let reloader = match &d.policy {
        PolicySource::File(reloader) => reloader.clone(),
        PolicySource::Builtins(_) => unreachable!(),
    };
    let mut revoked = Box::pin(watch.revoked(ip));

    // A generation that still allows it (here by its name) changes nothing.
    std::fs::write(
        file.path(),
        format!("allow name localhost port {port}\ndeny all\n"),
    )
    .unwrap();
    assert_eq!(
        reloader.check(),
        tether_reload::Outcome::Applied { generation: 2 }
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut revoked)
            .await
            .is_err()
    );

    // A refused content is no generation at all.
    std::fs::write(file.path(), "deny all\nallow to 10.0.0.300\n").unwrap();
    assert!(matches!(
        reloader.check(),
        tether_reload::Outcome::Refused { .. }
    ));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut revoked)
            .await
            .is_err()
    );

    std::fs::write(
        file.path(),
        format!("deny to {ip} port {port}\nallow all\n"),
    )
    .unwrap();
    assert_eq!(
        reloader.check(),
        tether_reload::Outcome::Applied { generation: 3 }
    );
    let revoked = tokio::time::timeout(STEP, revoked).await.unwrap();
    assert_eq!(revoked.generation, 3);
    assert_eq!(
        revoked.close_text(),
        format!(
            "policy: {ip}:{port} denied by line 1: deny to {ip}/32 port {port} \
             (destination policy generation 3, applied to the open connection)"
        )
    );
}

#[tokio::test]
async fn without_a_policy_file_nothing_is_ever_revoked() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (d, registry) = destinations(DestinationConfig::default());
    let dialed = d
        .dial("tcp", &listener.local_addr().unwrap().to_string(), STEP)
        .await
        .unwrap();
    assert!(d.view().is_none());
    assert!(!registry.render().contains("tether_agent_config_"));
    let ip = dialed.stream.peer_addr().unwrap().ip();
    assert!(
        tokio::time::timeout(Duration::from_millis(50), dialed.watch.revoked(ip))
            .await
            .is_err()
    );
}

/// Waits until the reload counter shows `line` (after the `file` label).
async fn wait_for(registry: &Registry, line: &str) {
    tokio::time::timeout(STEP, async {
        while !registry
            .render()
            .lines()
            .any(|l| l.starts_with("tether_agent_config_reloads_total{") && l.ends_with(line))
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {line} in\n{}", registry.render()));
}
