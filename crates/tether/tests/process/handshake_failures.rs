//! Refused agent handshakes with the real binaries (issue 26): a client certificate of
//! another CA, none at all, an X.509 v1 one, and an agent that does not trust the server's
//! certificate. The server logs each with the peer and what to check, and counts it in
//! `tether_server_agent_handshake_failures_total{reason}`; the agent says what to check.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use tokio::time::Instant;

use tether_testkit::Pki;
use tether_testkit::http::{get, metric_value};
use tether_testkit::process::{Frontend, LoggedChild, agent_args, free_port, server_flags};
use tokio::process::Command;

use crate::{STEP, bin, until};

/// `openssl ARGS` in `dir`; panics with its stderr on failure.
fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("openssl (install the openssl package)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// In `dir`: `v1-ca.crt` (a v3 CA) and the agent certificate `v1-agent.crt`/`v1-agent.key`
/// it signs, made as the kubernetes.io task makes them (`openssl x509 -req` without
/// extensions), which gives X.509 v1.
fn v1_agent_certificate(dir: &Path) {
    let p256 = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        dir,
        &[
            &["req", "-x509"][..],
            &p256,
            &["-subj", "/CN=v1-ca", "-days", "2"],
        ]
        .concat()
        .into_iter()
        .chain(["-keyout", "v1-ca.key", "-out", "v1-ca.crt"])
        .collect::<Vec<_>>(),
    );
    openssl(
        dir,
        &[&["req", "-new"][..], &p256, &["-subj", "/CN=proxy-agent"]]
            .concat()
            .into_iter()
            .chain(["-keyout", "v1-agent.key", "-out", "v1-agent.csr"])
            .collect::<Vec<_>>(),
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "v1-agent.csr",
            "-CA",
            "v1-ca.crt",
            "-CAkey",
            "v1-ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "v1-agent.crt",
        ],
    );
}

/// One misconfigured agent: how its flags differ from a good agent's, and what each side
/// must say about it.
struct Case {
    name: &'static str,
    /// Flags replaced (by their `--name=` prefix) or, with an empty value, removed.
    flags: Vec<(&'static str, String)>,
    reason: &'static str,
    server_says: &'static str,
    agent_says: &'static str,
}

/// `args` with `flags` applied (see [`Case::flags`]).
fn with_flags(mut args: Vec<String>, flags: &[(&'static str, String)]) -> Vec<String> {
    for (name, value) in flags {
        let prefix = format!("{name}=");
        args.retain(|arg| !arg.starts_with(&prefix));
        if !value.is_empty() {
            args.push(format!("{prefix}{value}"));
        }
    }
    args
}

fn failures(metrics: &str, reason: &str) -> f64 {
    metric_value(
        metrics,
        &format!("tether_server_agent_handshake_failures_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_agents_are_logged_counted_and_told_what_to_check() {
    let pki = Pki::generate().unwrap();
    let other = Pki::generate().unwrap();
    let dir = pki.dir();
    v1_agent_certificate(dir);
    // The server trusts the PKI's CA and the v1 CA, so the v1 certificate fails only for
    // its version.
    let bundle = dir.join("cluster-ca.crt");
    std::fs::write(
        &bundle,
        std::fs::read_to_string(&pki.files.ca_cert).unwrap()
            + &std::fs::read_to_string(dir.join("v1-ca.crt")).unwrap(),
    )
    .unwrap();

    let ports = [free_port(), free_port(), free_port()];
    let agent_addr = SocketAddr::from(([127, 0, 0, 1], ports[0]));
    let health = SocketAddr::from(([127, 0, 0, 1], ports[1]));
    let server_args = with_flags(
        server_flags(
            &pki,
            &Frontend::GrpcUds(dir.join("frontend.sock")),
            None,
            ports,
        ),
        &[("--cluster-ca-cert", bundle.display().to_string())],
    );
    let server = LoggedChild::spawn(
        Command::new(bin()).arg("server").args(server_args),
        dir.join("server.log"),
    )
    .unwrap();
    tether_testkit::http::wait_for_200(health, "/healthz", STEP)
        .await
        .unwrap();

    let path = |p: &Path| p.display().to_string();
    let cases = [
        Case {
            name: "client certificate of another CA",
            flags: vec![
                ("--agent-cert", path(&other.files.agent_cert)),
                ("--agent-key", path(&other.files.agent_key)),
            ],
            reason: "unknown_issuer",
            server_says: "the agent's client certificate is not signed by --cluster-ca-cert",
            agent_says: "the server rejected this agent's client certificate: is --agent-cert \
                         signed by the server's --cluster-ca-cert?",
        },
        Case {
            name: "no client certificate",
            flags: vec![
                ("--agent-cert", String::new()),
                ("--agent-key", String::new()),
            ],
            reason: "no_client_certificate",
            server_says: "the agent sent no client certificate",
            agent_says: "the server requires a client certificate and this agent sent none",
        },
        Case {
            name: "X.509 v1 client certificate",
            flags: vec![
                ("--agent-cert", path(&dir.join("v1-agent.crt"))),
                ("--agent-key", path(&dir.join("v1-agent.key"))),
            ],
            reason: "v1_certificate",
            server_says: "is an X.509 v1 certificate (v3 required",
            agent_says: "is --agent-cert an X.509 v1 certificate?",
        },
        Case {
            name: "agent does not trust the server's CA",
            flags: vec![("--ca-cert", path(&other.files.ca_cert))],
            reason: "server_certificate_refused",
            server_says: "the agent does not accept this server's certificate (--cluster-cert; \
                          it sent alert UnknownCA): it is not signed by a CA the agent trusts: \
                          check the agent's --ca-cert",
            agent_says: "the server's certificate is not signed by --ca-cert",
        },
    ];

    let started = Instant::now();
    let mut agents = Vec::new();
    for case in &cases {
        let args = with_flags(
            agent_args(&pki, agent_addr, free_port(), free_port()),
            &case.flags,
        );
        let agent = LoggedChild::spawn(
            Command::new(bin()).args(args),
            dir.join(format!("agent-{}.log", case.reason)),
        )
        .unwrap();
        agent
            .wait_for_log(case.agent_says, STEP)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let log = server
            .wait_for_log(&format!("reason=\"{}\"", case.reason), STEP)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let line = log
            .lines()
            .find(|line| line.contains(&format!("reason=\"{}\"", case.reason)))
            .unwrap();
        assert!(
            line.starts_with('W') && line.contains(r#"peer="127.0.0.1:"#),
            "{}: {line}",
            case.name
        );
        assert!(line.contains(case.server_says), "{}: {line}", case.name);
        until(&format!("{}: counted", case.name), || async {
            let metrics = get(health, "/metrics").await.map(|r| r.1);
            metrics.is_ok_and(|m| failures(&m, case.reason) >= 1.0)
        })
        .await;
        agents.push(agent);
    }

    // The agents retry (from 100 ms apart, backing off to 1 s): the log holds at most one
    // line a second per reason, and a later line counts those held back.
    let held_back = |line: &str| {
        line.contains(r#"reason="unknown_issuer""#)
            && line
                .split_once("suppressed=")
                .is_some_and(|(_, n)| n.trim() != "0")
    };
    until("a line counts the lines held back", || async {
        server.log().lines().any(held_back)
    })
    .await;
    let log = server.log();
    let metrics = get(health, "/metrics").await.unwrap().1;
    let seconds = started.elapsed().as_secs_f64().ceil();
    for case in &cases {
        let lines = log
            .lines()
            .filter(|line| line.contains(&format!("reason=\"{}\"", case.reason)))
            .count() as f64;
        assert!(
            lines <= seconds + 1.0,
            "{}: {lines} lines in {seconds} s",
            case.name
        );
        assert!(
            failures(&metrics, case.reason) >= lines,
            "{}: {metrics}",
            case.name
        );
    }
    let lines = log
        .lines()
        .filter(|l| l.contains(r#"reason="unknown_issuer""#))
        .count() as f64;
    assert!(
        failures(&metrics, "unknown_issuer") > lines,
        "{metrics}\n{log}"
    );
    assert_eq!(failures(&metrics, "other"), 0.0, "{log}");
}
