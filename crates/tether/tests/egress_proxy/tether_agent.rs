//! tether's agent through tinyproxy: from `HTTPS_PROXY`, with Basic authentication (right,
//! wrong and missing credentials), refused by the proxy's rules, through an `https://` proxy,
//! and directly when `NO_PROXY` matches.

use tether_testkit::Pki;

use crate::proxies::{Stunnel, Tinyproxy, TinyproxyOptions};
use crate::{AgentProcess, SERVER_HOST, echo_through, have, server, tether_bin};

fn tether_agent(
    pki: &Pki,
    server: &tether_testkit::process::ServerProcess,
    args: &[String],
    env: &[(&str, &str)],
) -> anyhow::Result<AgentProcess> {
    AgentProcess::spawn(tether_bin(), Some("agent"), pki, server, args, env)
}

/// `HTTPS_PROXY` alone sends the agent through the proxy: one CONNECT to the server's name and
/// port, and a dial's bytes come back exactly. With `NO_PROXY` naming the server (in lower
/// case, as entries are compared), the same agent connects directly: the proxy sees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_proxy_from_the_environment_and_no_proxy() -> anyhow::Result<()> {
    if !have("tinyproxy") {
        return Ok(());
    }
    let pki = Pki::generate()?;
    let server = server(&pki).await?;
    let port = server.agent_addr.port();
    let proxy = Tinyproxy::start(TinyproxyOptions {
        connect_port: port,
        basic_auth: None,
    })
    .await?;
    let proxy_url = format!("http://127.0.0.1:{}", proxy.port);

    let direct = tether_agent(
        &pki,
        &server,
        &[],
        &[
            ("HTTPS_PROXY", &proxy_url),
            ("NO_PROXY", "example.com,localhost"),
        ],
    )?;
    direct.wait_ready().await?;
    echo_through(&pki, &server).await?;
    assert_eq!(
        proxy.connects(),
        Vec::<String>::new(),
        "NO_PROXY matched, yet the proxy was used"
    );
    drop(direct);

    let proxied = tether_agent(&pki, &server, &[], &[("https_proxy", &proxy_url)])?;
    proxied.wait_ready().await?;
    echo_through(&pki, &server).await?;
    assert_eq!(
        proxy.connects(),
        vec![format!("{SERVER_HOST}:{port} HTTP/1.1")],
        "the agent's one server connection goes through the proxy"
    );
    Ok(())
}

/// Basic authentication from the URL's user info, percent-decoded; a wrong password and none at
/// all are reported with what the proxy answered, and the password never reaches the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_authentication() -> anyhow::Result<()> {
    if !have("tinyproxy") {
        return Ok(());
    }
    let pki = Pki::generate()?;
    let server = server(&pki).await?;
    let proxy = Tinyproxy::start(TinyproxyOptions {
        connect_port: server.agent_addr.port(),
        basic_auth: Some(("alice", "pw-1.2_3")),
    })
    .await?;
    let flag = |user_info: &str| {
        vec![format!(
            "--https-proxy=http://{user_info}@127.0.0.1:{}",
            proxy.port
        )]
    };

    // "%2D" and "%2E" decode to "-" and ".": undecoded, the proxy would refuse them.
    let agent = tether_agent(&pki, &server, &flag("alice:pw%2D1%2E2_3"), &[])?;
    agent.wait_ready().await?;
    echo_through(&pki, &server).await?;
    assert!(!agent.log().contains("pw%2D1"), "{}", agent.log());
    drop(agent);

    // tinyproxy answers a wrong password with 401 (and a missing one with 407).
    let wrong = tether_agent(&pki, &server, &flag("alice:not-the-password"), &[])?;
    let log = wrong
        .wait_for_log("the proxy answered CONNECT LocalHost")
        .await?;
    assert!(log.contains("401 Unauthorized"), "{log}");
    assert!(log.contains("it refused the user and password"), "{log}");
    assert!(log.contains("REDACTED@127.0.0.1"), "{log}");
    assert!(
        !log.contains("not-the-password"),
        "the password was logged:\n{log}"
    );
    drop(wrong);

    let anonymous = tether_agent(
        &pki,
        &server,
        &[format!("--https-proxy=127.0.0.1:{}", proxy.port)],
        &[],
    )?;
    let log = anonymous
        .wait_for_log("407 Proxy Authentication Required")
        .await?;
    assert!(log.contains("Proxy-Authenticate: Basic realm="), "{log}");
    assert!(log.contains("it wants credentials"), "{log}");
    Ok(())
}

/// A proxy whose rules refuse the server's port answers 403, and the agent says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_proxy_is_reported() -> anyhow::Result<()> {
    if !have("tinyproxy") {
        return Ok(());
    }
    let pki = Pki::generate()?;
    let server = server(&pki).await?;
    let proxy = Tinyproxy::start(TinyproxyOptions {
        connect_port: tether_testkit::process::free_port(),
        basic_auth: None,
    })
    .await?;
    let flag = format!("--https-proxy=http://127.0.0.1:{}", proxy.port);
    let agent = tether_agent(&pki, &server, &[flag], &[])?;
    let log = agent.wait_for_log("403 Access violation").await?;
    assert!(
        log.contains("its access rules do not allow CONNECT"),
        "{log}"
    );
    Ok(())
}

/// An `https://` proxy (stunnel in front of tinyproxy, its certificate from another CA):
/// verified with --https-proxy-ca-cert, then the server's own TLS inside the tunnel.
/// Without that CA the TLS handshake with the proxy fails, and the agent says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_an_https_proxy() -> anyhow::Result<()> {
    if !have("tinyproxy") || !have("stunnel4") {
        return Ok(());
    }
    let pki = Pki::generate()?;
    let proxy_pki = Pki::generate()?;
    let server = server(&pki).await?;
    let proxy = Tinyproxy::start(TinyproxyOptions {
        connect_port: server.agent_addr.port(),
        basic_auth: None,
    })
    .await?;
    let tls = Stunnel::start(
        &proxy_pki.files.server_cert,
        &proxy_pki.files.server_key,
        proxy.port,
    )
    .await?;
    let url = format!("https://localhost:{}", tls.port);

    let agent = tether_agent(
        &pki,
        &server,
        &[format!(
            "--https-proxy-ca-cert={}",
            proxy_pki.files.ca_cert.display()
        )],
        &[("HTTPS_PROXY", &url)],
    )?;
    agent.wait_ready().await?;
    echo_through(&pki, &server).await?;
    assert_eq!(proxy.connects().len(), 1, "{:?}", proxy.connects());
    drop(agent);

    // The cluster's CA does not verify the proxy.
    let wrong_ca = tether_agent(
        &pki,
        &server,
        &[
            format!("--https-proxy={url}"),
            format!("--https-proxy-ca-cert={}", pki.files.ca_cert.display()),
        ],
        &[],
    )?;
    let log = wrong_ca
        .wait_for_log("TLS handshake with proxy https://localhost:")
        .await?;
    assert!(
        log.contains("UnknownIssuer") || log.contains("unknown issuer"),
        "{log}"
    );
    assert_eq!(
        proxy.connects().len(),
        1,
        "no CONNECT without a verified proxy"
    );
    Ok(())
}

/// An `https://` proxy without --https-proxy-ca-cert stops the agent at start-up, naming the flag.
#[test]
fn an_https_proxy_without_its_ca_does_not_start() {
    let pki = Pki::generate().unwrap();
    let output = std::process::Command::new(tether_bin())
        .arg("agent")
        .arg(format!("--ca-cert={}", pki.files.ca_cert.display()))
        .arg("--https-proxy=https://user:secret@proxy.example:3129")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("--https-proxy-ca-cert is required"),
        "{stderr}"
    );
    assert!(
        stderr.contains("https://REDACTED@proxy.example:3129") && !stderr.contains("secret"),
        "{stderr}"
    );
}
