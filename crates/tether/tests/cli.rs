//! The built binary: exit codes, error messages, upstream binary names and signals.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use tokio::time::Instant;

use tempfile::TempDir;
use tether_tls::pki::{Pki, PkiFiles};

const TETHER: &str = env!("CARGO_BIN_EXE_tether");

fn run(program: &Path, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A server's or agent's standard error after a start-up error: the log's first line (what
/// runs, with which flags), then the error alone on one line, which is returned.
fn start_up_error(output: &Output) -> String {
    let err = stderr(output);
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines.len() == 2 && lines[0].contains(r#"] "tether starting" version="#),
        "the start line, then the error: {err}"
    );
    lines[1].to_owned()
}

#[test]
fn invalid_flag_values_exit_1_naming_the_flag() {
    let cases: [&[&str]; 4] = [
        &["server", "--mode=socks"],
        &["server", "--server-count=0"],
        &["agent", "--agent-identifiers=zone=a"],
        &["agent", "--server-count-source=min"],
    ];
    for args in cases {
        let output = run(Path::new(TETHER), args);
        let flag = args[1].split('=').next().unwrap();
        assert_eq!(
            output.status.code(),
            Some(1),
            "{args:?}: {}",
            stderr(&output)
        );
        let err = start_up_error(&output);
        assert!(
            err.starts_with(&format!("error: {flag}")),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn syntax_errors_exit_2_naming_the_flag() {
    for args in [
        &["agent", "--sync-forever=maybe"][..],
        &["agent", "--sync-interval=10"],
        &["server", "--no-such-flag"],
    ] {
        let output = run(Path::new(TETHER), args);
        let flag = args[1].split('=').next().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(
            stderr(&output).contains(flag),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}

#[test]
fn upstream_binary_names_run_the_matching_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    for (name, flag) in [
        ("proxy-agent", "--proxy-server-host"),
        ("proxy-server", "--uds-name"),
    ] {
        let link = dir.path().join(name);
        std::os::unix::fs::symlink(TETHER, &link).unwrap();
        let output = run(&link, &["--help"]);
        assert!(output.status.success(), "{name}: {}", stderr(&output));
        let help = String::from_utf8(output.stdout).unwrap();
        assert!(help.contains(flag), "{name}: {help}");
    }
    // Arguments keep their meaning: klog's underscore spelling, Go booleans.
    let output = run(
        &dir.path().join("proxy-agent"),
        &["--log_file_max_size=0", "--sync-forever=maybe"],
    );
    assert!(
        stderr(&output).contains("--sync-forever"),
        "{}",
        stderr(&output)
    );
}

/// `tether --version`, after a subcommand too, and under the upstream names the image links
/// to the binary (`proxy-agent --version` used to fail with "unexpected argument").
#[test]
fn version_under_every_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut invocations = vec![
        (Path::new(TETHER).to_path_buf(), vec!["--version"]),
        (Path::new(TETHER).to_path_buf(), vec!["server", "--version"]),
        (Path::new(TETHER).to_path_buf(), vec!["agent", "--version"]),
    ];
    for name in ["proxy-server", "proxy-agent"] {
        let link = dir.path().join(name);
        std::os::unix::fs::symlink(TETHER, &link).unwrap();
        invocations.push((link, vec!["--version"]));
    }
    let version = env!("CARGO_PKG_VERSION");
    for (program, args) in invocations {
        let output = run(&program, &args);
        let out = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{} {args:?}: {}",
            program.display(),
            stderr(&output)
        );
        assert!(
            out.contains(&format!(" {version} (commit ")) && out.contains(", rustc 1."),
            "{} {args:?}: {out}",
            program.display()
        );
    }
}

/// How long a test waits for a log line or an exit before failing.
const DEADLINE: Duration = Duration::from_secs(30);

/// A running `tether` whose standard error is read line by line. Killed when dropped, so a
/// failing test leaves no process behind.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Running {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(TETHER)
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let (tx, lines) = mpsc::channel();
        // Ends at the process's exit, when its standard error closes.
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    /// Waits for a log line containing `text`; the lines read until then, that one last.
    fn wait_for(&self, text: &str) -> Vec<String> {
        let deadline = Instant::now() + DEADLINE;
        let mut read = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(text);
                    read.push(line);
                    if found {
                        return read;
                    }
                }
                Err(e) => panic!("no log line {text:?}: {e}; read: {read:#?}"),
            }
        }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn exit_code(&mut self) -> Option<i32> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(Instant::now() < deadline, "still running");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pki() -> (TempDir, PkiFiles) {
    let dir = tempfile::tempdir().unwrap();
    let files = Pki::generate().unwrap().write_to(dir.path()).unwrap();
    (dir, files)
}

fn start_server(files: &PkiFiles, socket: &Path, extra: &[&str]) -> Running {
    let cert = format!("--cluster-cert={}", files.server_cert.display());
    let key = format!("--cluster-key={}", files.server_key.display());
    let ca = format!("--cluster-ca-cert={}", files.ca_cert.display());
    let uds = format!("--uds-name={}", socket.display());
    let mut args = vec!["server", &uds, "--server-port=0", &cert, &key, &ca];
    args.extend(["--agent-port=0", "--health-port=0", "--admin-port=0"]);
    args.extend(extra);
    let server = Running::start(&args);
    server.wait_for("proxy server listening");
    server
}

#[test]
fn a_tenant_frontend_on_another_listeners_address_is_a_start_up_error() {
    let (dir, files) = pki();
    let socket = dir.path().join("proxy.sock");
    let routing = dir.path().join("routing.yaml");
    let cert = format!("--cluster-cert={}", files.server_cert.display());
    let key = format!("--cluster-key={}", files.server_key.display());
    let ca = format!("--cluster-ca-cert={}", files.ca_cert.display());
    let uds = format!("--uds-name={}", socket.display());
    let routing_flag = format!("--routing-config={}", routing.display());
    for (frontend, expected) in [
        (
            format!("{{unix: \"{}\"}}", socket.display()),
            format!(
                "tenant \"a\"'s frontend.unix {} is the main frontend's socket (--uds-name)",
                socket.display()
            ),
        ),
        (
            "{tcp: \"127.0.0.1:8131\"}".to_owned(),
            "tenant \"a\"'s frontend.tcp 127.0.0.1:8131 needs the mTLS frontend's certificates"
                .to_owned(),
        ),
    ] {
        std::fs::write(
            &routing,
            format!(
                "tenants:\n  - {{name: a, clients: [\"cert:api.a\"], agents: [\"cert:agent.a\"], frontend: {frontend}}}\n"
            ),
        )
        .unwrap();
        let output = run(
            Path::new(TETHER),
            &[
                "server",
                &uds,
                "--server-port=0",
                &cert,
                &key,
                &ca,
                "--agent-port=0",
                "--health-port=0",
                "--admin-port=0",
                &routing_flag,
            ],
        );
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{err}");
        assert!(err.contains(&expected), "{err}");
    }
    assert!(!socket.exists(), "nothing was left listening");
}

/// The operator trial's P3: a port in use is reported once, with the listener's flags; the
/// same port given to two flags is reported as such before anything is bound, by the server
/// and by the agent.
#[test]
fn listener_errors_name_their_flags_and_say_the_os_error_once() {
    let (dir, files) = pki();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let socket = dir.path().join("proxy.sock");
    let server = |ports: [u16; 3]| {
        let args = [
            "server".to_owned(),
            format!("--uds-name={}", socket.display()),
            "--server-port=0".into(),
            format!("--cluster-cert={}", files.server_cert.display()),
            format!("--cluster-key={}", files.server_key.display()),
            format!("--cluster-ca-cert={}", files.ca_cert.display()),
            "--agent-bind-address=127.0.0.1".into(),
            format!("--agent-port={}", ports[0]),
            "--health-bind-address=127.0.0.1".into(),
            format!("--health-port={}", ports[1]),
            "--admin-bind-address=127.0.0.1".into(),
            format!("--admin-port={}", ports[2]),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = run(Path::new(TETHER), &args);
        assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
        start_up_error(&output)
    };

    let err = server([port, 0, 0]);
    let in_use = "Address already in use (os error 98)";
    assert_eq!(
        err.trim_end(),
        format!(
            "error: listening on agent 127.0.0.1:{port} (--agent-bind-address, --agent-port): \
             {in_use}"
        ),
    );
    assert_eq!(err.matches(in_use).count(), 1, "{err}");

    let free = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let err = server([free, 0, free]);
    assert_eq!(
        err.trim_end(),
        format!(
            "error: --admin-port and --agent-port are both {free} (on the same or overlapping \
             bind addresses): each listener needs a port of its own"
        ),
    );
    assert!(!socket.exists(), "nothing was bound");
    drop(taken);

    let agent = [
        "agent".to_owned(),
        "--proxy-server-host=127.0.0.1".into(),
        format!("--proxy-server-port={port}"),
        format!("--ca-cert={}", files.ca_cert.display()),
        format!("--agent-cert={}", files.agent_cert.display()),
        format!("--agent-key={}", files.agent_key.display()),
        format!("--health-server-port={free}"),
        "--admin-bind-address=127.0.0.1".into(),
        format!("--admin-server-port={free}"),
    ];
    let agent: Vec<&str> = agent.iter().map(String::as_str).collect();
    let output = run(Path::new(TETHER), &agent);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert_eq!(
        start_up_error(&output).trim_end(),
        format!(
            "error: --admin-server-port and --health-server-port are both {free} (on the same \
             or overlapping bind addresses): each listener needs a port of its own"
        ),
    );
}

/// The operator trial's A6: with token authentication and no API server behind the
/// kubeconfig, the warning names the API server's URL and the OS error, and kube's own
/// ERROR line, which said neither, is not written at the default verbosity.
#[test]
fn an_unreachable_kubernetes_api_is_named_with_its_url_and_the_os_error() {
    let (dir, files) = pki();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let kubeconfig = dir.path().join("kubeconfig");
    let yaml = tether_testkit::control_plane::kubeconfig_yaml(
        &format!("https://127.0.0.1:{port}"),
        &files.ca_cert,
        "u",
        "token: t",
    );
    std::fs::write(&kubeconfig, yaml).unwrap();
    let args = [
        "server".to_owned(),
        format!("--uds-name={}", dir.path().join("proxy.sock").display()),
        "--server-port=0".into(),
        format!("--cluster-cert={}", files.server_cert.display()),
        format!("--cluster-key={}", files.server_key.display()),
        "--agent-namespace=kube-system".into(),
        "--agent-service-account=konnectivity-agent".into(),
        "--authentication-audience=system:konnectivity-server".into(),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--agent-port=0".into(),
        "--health-port=0".into(),
        "--admin-port=0".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Running::start(&args);
    let lines = server.wait_for("kubernetes API server unavailable");
    let warning = lines.last().unwrap();
    let expected = format!(
        "the TokenReview failed: API server https://127.0.0.1:{port}/ (--kubeconfig): \
         Connection refused (os error 111)"
    );
    assert!(warning.contains(&expected), "{warning}");
    assert!(
        !lines.iter().any(|line| line.contains("kube_client")),
        "{lines:#?}"
    );
}

/// An expired certificate at start-up stops the process with the flag, the file and the
/// time it expired: serving it would fail every handshake while health checks pass (N9).
#[test]
fn an_expired_certificate_stops_server_and_agent_naming_flag_file_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate().unwrap();
    let files = pki.write_to(dir.path()).unwrap();
    let now = tether_observe::time::wall_clock();
    let day = Duration::from_secs(86_400);
    let expired = |leaf, name: &str| {
        let issued = pki.reissue(leaf, now - 2 * day, now - day).unwrap();
        let (cert, key) = (
            dir.path().join(format!("{name}.crt")),
            dir.path().join(format!("{name}.key")),
        );
        std::fs::write(&cert, issued.cert_pem).unwrap();
        std::fs::write(&key, issued.key_pem).unwrap();
        (cert, key)
    };
    let (cert, key) = expired(tether_tls::pki::Leaf::Server, "server");
    let socket = dir.path().join("proxy.sock");
    let args = [
        "server".to_owned(),
        format!("--uds-name={}", socket.display()),
        "--server-port=0".into(),
        format!("--cluster-cert={}", cert.display()),
        format!("--cluster-key={}", key.display()),
        format!("--cluster-ca-cert={}", files.ca_cert.display()),
        "--agent-port=0".into(),
        "--health-port=0".into(),
        "--admin-port=0".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = run(Path::new(TETHER), &args);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = start_up_error(&output);
    let expected = format!(
        "error: --cluster-cert/--cluster-key/--cluster-ca-cert: certificate {}: expired at ",
        cert.display()
    );
    assert!(
        err.starts_with(&expected) && err.contains("(notAfter); the time is now "),
        "{err}"
    );
    assert!(!socket.exists(), "nothing was left listening");

    let (cert, key) = expired(tether_tls::pki::Leaf::Agent, "agent");
    let args = [
        "agent".to_owned(),
        "--proxy-server-host=127.0.0.1".into(),
        format!("--ca-cert={}", files.ca_cert.display()),
        format!("--agent-cert={}", cert.display()),
        format!("--agent-key={}", key.display()),
        "--health-server-port=0".into(),
        "--admin-server-port=0".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = run(Path::new(TETHER), &args);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let err = start_up_error(&output);
    let expected = format!(
        "error: --ca-cert/--agent-cert/--agent-key: certificate {}: expired at ",
        cert.display()
    );
    assert!(err.starts_with(&expected), "{err}");
}

#[test]
fn a_tenant_tcp_frontend_that_cannot_tell_its_clients_apart_is_a_start_up_error() {
    let (dir, files) = pki();
    let routing = dir.path().join("routing.yaml");
    let missing_ca = dir.path().join("missing-ca.crt");
    let args = [
        "server".to_owned(),
        "--server-port=0".into(),
        format!("--server-cert={}", files.server_cert.display()),
        format!("--server-key={}", files.server_key.display()),
        format!("--server-ca-cert={}", files.ca_cert.display()),
        format!("--cluster-cert={}", files.server_cert.display()),
        format!("--cluster-key={}", files.server_key.display()),
        format!("--cluster-ca-cert={}", files.ca_cert.display()),
        "--agent-port=0".into(),
        "--health-port=0".into(),
        "--admin-port=0".into(),
        format!("--routing-config={}", routing.display()),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for (frontend, expected) in [
        // Every client certificate of the main frontend's CA would be tenant a's.
        (
            "{tcp: \"127.0.0.1:0\"}".to_owned(),
            format!(
                "error: --routing-config {}: tenants[0] (\"a\"): frontend.tcp 127.0.0.1:0 would admit every client certificate of the main frontend's CA: add the tenant's client certificate names to clients (\"cert:NAME\", the CN or a DNS/URI SAN), or a CA of the tenant's own as frontend.client_ca",
                routing.display()
            ),
        ),
        (
            format!(
                "{{tcp: \"127.0.0.1:0\", client_ca: \"{}\"}}",
                missing_ca.display()
            ),
            format!(
                "error: --routing-config {}: tenant \"a\"'s frontend.client_ca: reading client CA bundle {}: ",
                routing.display(),
                missing_ca.display()
            ),
        ),
    ] {
        std::fs::write(
            &routing,
            format!(
                "tenants:\n  - {{name: a, agents: [\"cert:agent.a\"], frontend: {frontend}}}\n"
            ),
        )
        .unwrap();
        // Bounded: a server that starts anyway is killed when `server` drops.
        let mut server = Running::start(&args);
        assert_eq!(server.exit_code(), Some(1), "the server started");
        server.wait_for(&expected);
    }
}

#[test]
fn a_bad_destination_policy_stops_the_server_naming_the_file_and_line() {
    let (dir, files) = pki();
    let routing = dir.path().join("routing.yaml");
    std::fs::write(
        &routing,
        "destinations:\n  - name: kubelets\n    clients: [\"cert:kube-apiserver\"]\n    rules:\n      - allow to 10.0.0.0/8 port 10250\n      - deny to 10.0.0.1/8\n",
    )
    .unwrap();
    let socket = dir.path().join("proxy.sock");
    let args = [
        "server".to_owned(),
        format!("--uds-name={}", socket.display()),
        "--server-port=0".into(),
        format!("--cluster-cert={}", files.server_cert.display()),
        format!("--cluster-key={}", files.server_key.display()),
        format!("--cluster-ca-cert={}", files.ca_cert.display()),
        "--agent-port=0".into(),
        "--health-port=0".into(),
        "--admin-port=0".into(),
        format!("--routing-config={}", routing.display()),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = run(Path::new(TETHER), &args);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    let expected = format!(
        "error: --routing-config {}: destinations[0] (\"kubelets\"): rules: line 6: \"10.0.0.1/8\" has host bits set (did you mean 10.0.0.0/8?)",
        routing.display()
    );
    assert!(err.lines().any(|l| l == expected), "{err}");
    assert!(!socket.exists(), "nothing was served");
}

#[test]
fn dial_names_both_frontends_and_the_mode_to_try() {
    let missing = run(Path::new(TETHER), &["dial", "127.0.0.1:9"]);
    assert_eq!(missing.status.code(), Some(2));
    let text = stderr(&missing);
    assert!(
        text.contains("--uds") && text.contains("--proxy-server"),
        "{text}"
    );

    let (dir, files) = pki();
    let socket = dir.path().join("proxy.sock");
    let _server = start_server(&files, &socket, &["--mode=grpc"]);
    let uds = socket.display().to_string();
    let crossed = run(
        Path::new(TETHER),
        &[
            "dial",
            "--mode",
            "http-connect",
            "--timeout=10s",
            "--uds",
            &uds,
            "127.0.0.1:9",
        ],
    );
    assert_eq!(crossed.status.code(), Some(1));
    let text = stderr(&crossed);
    assert!(
        text.contains("--mode=grpc") && text.contains("try --mode grpc"),
        "{text}"
    );
}

#[test]
fn dial_says_what_to_check_when_tls_with_the_frontend_fails() {
    let (_dir, files) = pki();
    let (_other_dir, other) = pki();
    let ca = format!("--server-ca-cert={}", files.ca_cert.display());
    let cert = format!("--server-cert={}", files.server_cert.display());
    let key = format!("--server-key={}", files.server_key.display());
    for mode in ["http-connect", "grpc"] {
        let cluster_ca = format!("--cluster-ca-cert={}", files.ca_cert.display());
        let cluster_cert = format!("--cluster-cert={}", files.server_cert.display());
        let cluster_key = format!("--cluster-key={}", files.server_key.display());
        let server = Running::start(&[
            "server",
            &format!("--mode={mode}"),
            "--server-port=0",
            "--server-bind-address=127.0.0.1",
            &ca,
            &cert,
            &key,
            &cluster_cert,
            &cluster_key,
            &cluster_ca,
            "--agent-port=0",
            "--health-port=0",
            "--admin-port=0",
        ]);
        let listening = server.wait_for("proxy server listening");
        let line = listening.last().unwrap();
        let frontend = line
            .split_whitespace()
            .find_map(|f| f.strip_prefix("frontend=\""))
            .and_then(|f| f.strip_suffix('"'))
            .unwrap_or_else(|| panic!("no frontend address in {line}"))
            .to_owned();
        let path = |p: &Path| p.display().to_string();
        let (right_ca, wrong_ca) = (path(&files.ca_cert), path(&other.ca_cert));
        let (client_cert, client_key) = (path(&files.client_cert), path(&files.client_key));
        let (stranger_cert, stranger_key) = (path(&other.client_cert), path(&other.client_key));
        let cases: [(&[&str], &str); 4] = [
            (
                &[
                    "--ca-cert",
                    &wrong_ca,
                    "--cert",
                    &client_cert,
                    "--key",
                    &client_key,
                ],
                "the server's certificate is not signed by --ca-cert",
            ),
            (
                &["--ca-cert", &right_ca],
                "the server asks for a client certificate: pass --cert and --key",
            ),
            (
                &[
                    "--ca-cert",
                    &right_ca,
                    "--cert",
                    &stranger_cert,
                    "--key",
                    &stranger_key,
                ],
                "the server refused this client's certificate: is --cert signed by the \
                 server's --server-ca-cert",
            ),
            (
                &[
                    "--ca-cert",
                    &right_ca,
                    "--cert",
                    &client_cert,
                    "--key",
                    &client_key,
                    "--server-name=elsewhere.invalid",
                ],
                "does not name \"elsewhere.invalid\": pass --server-name",
            ),
        ];
        for (flags, advice) in cases {
            let mut args = vec!["dial", "--mode", mode, "--timeout=10s"];
            args.extend(["--proxy-server", &frontend]);
            args.extend(flags);
            args.push("127.0.0.1:9");
            let output = run(Path::new(TETHER), &args);
            let text = stderr(&output);
            assert_eq!(output.status.code(), Some(1), "{mode} {flags:?}: {text}");
            assert!(text.contains(advice), "{mode} {flags:?}: {text}");
        }
        // The server's side of the same refusals.
        let refused = server.wait_for("refused a frontend client's TLS handshake");
        assert!(
            refused
                .last()
                .unwrap()
                .contains("reason=\"server_certificate_refused\""),
            "{refused:#?}"
        );
        server.wait_for("reason=\"no_client_certificate\"");
    }
}

#[test]
fn validate_checks_each_file_as_its_reader_does_and_reports_all() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("konnectivity-server.socket");
    let egress = dir.path().join("egress.yaml");
    let egress_yaml = |name: &str| {
        format!(
            "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\n\
             egressSelections:\n- name: {name}\n  connection:\n    proxyProtocol: GRPC\n    \
             transport:\n      uds:\n        udsName: {}\n",
            socket.display()
        )
    };
    std::fs::write(&egress, egress_yaml("cluster")).unwrap();
    let policy = dir.path().join("destinations.policy");
    std::fs::write(&policy, "deny port 8133,8134\nallow all\n").unwrap();
    let routing = dir.path().join("routing.yaml");
    std::fs::write(&routing, "zones:\n  - zone: a\n    cidrs: [10.0.0.0/8]\n").unwrap();
    let flag = |name: &str, path: &Path| format!("--{name}={}", path.display());
    let validate = |files: &[String]| {
        let mut args = vec!["validate"];
        args.extend(files.iter().map(String::as_str));
        run(Path::new(TETHER), &args)
    };
    let all = [
        flag("egress-selector-config-file", &egress),
        flag("routing-config", &routing),
        flag("destination-policy", &policy),
    ];

    let valid = validate(&all);
    let out = String::from_utf8_lossy(&valid.stdout).into_owned();
    assert_eq!(valid.status.code(), Some(0), "{out}{}", stderr(&valid));
    assert!(
        out.contains(&format!(
            "  cluster: GRPC over unix socket {} (absent: no server has created it yet)",
            socket.display()
        )),
        "{out}"
    );
    assert!(
        out.contains("  controlplane: not configured (dials directly)"),
        "{out}"
    );
    assert!(out.contains("  1 zone rules, 0 tenants"), "{out}");
    assert!(out.contains("  2 rules, after the built-in ones"), "{out}");

    // Every file is checked, and each error names its flag, file and what is wrong.
    std::fs::write(&egress, egress_yaml("clusters")).unwrap();
    std::fs::write(&policy, "deny port 8133,8134\nallow to 10.0.0.1/8\n").unwrap();
    let invalid = validate(&all);
    let err = stderr(&invalid);
    assert_eq!(invalid.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "error: --egress-selector-config-file {}: invalid",
            egress.display()
        )) && err.contains("clusters"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "error: --destination-policy {}: line 2:",
            policy.display()
        )),
        "{err}"
    );
    let out = String::from_utf8_lossy(&invalid.stdout).into_owned();
    assert!(
        out.contains("--routing-config"),
        "the valid one is reported too: {out}"
    );

    let none = validate(&[]);
    assert_eq!(none.status.code(), Some(2), "a file is required");
}

#[test]
fn a_request_the_destination_policy_denies_gets_a_403_and_an_info_line() {
    use std::os::unix::fs::MetadataExt as _;
    let (dir, files) = pki();
    let uid = std::fs::metadata(dir.path()).unwrap().uid();
    let routing = dir.path().join("routing.yaml");
    std::fs::write(
        &routing,
        format!(
            "destinations:\n  - name: local\n    clients: [\"uid:{uid}\"]\n    rules: [\"allow to 127.0.0.1 port 10250\", \"deny all\"]\n"
        ),
    )
    .unwrap();
    let socket = dir.path().join("proxy.sock");
    let routing_flag = format!("--routing-config={}", routing.display());
    // No agent: the refusal comes before any agent would be chosen.
    let server = start_server(&files, &socket, &["--mode=http-connect", &routing_flag]);
    let mut stream = UnixStream::connect(&socket).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    stream
        .write_all(b"CONNECT 169.254.169.254:80 HTTP/1.1\r\nHost: 169.254.169.254:80\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(
        response.starts_with("HTTP/1.1 403 Forbidden\r\n"),
        "{response}"
    );
    assert!(
        response.ends_with(
            "\r\n\r\npolicy: 169.254.169.254:80 denied by server policy \"local\" (line 4: deny all)\r\n"
        ),
        "{response}"
    );
    server.wait_for("dial refused by destination policy");
}

#[test]
fn server_stops_on_a_signal_and_exits_1_on_a_second() {
    let (dir, files) = pki();
    let socket = dir.path().join("proxy.sock");

    let mut server = start_server(&files, &socket, &[]);
    server.signal("TERM");
    assert_eq!(server.exit_code(), Some(0));

    // A live frontend connection keeps the server in its grace period until the second
    // signal, which ends it at once, as upstream does.
    let mut server = start_server(&files, &socket, &["--graceful-shutdown-timeout=1m"]);
    let mut client = UnixStream::connect(&socket).unwrap();
    // Make sure the server is serving this connection, not just holding it in the backlog:
    // send the HTTP/2 preface and an empty SETTINGS frame and read the server's SETTINGS.
    client
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut frame_header = [0u8; 9];
    client.read_exact(&mut frame_header).unwrap();
    assert_eq!(frame_header[3], 0x4, "the server's first frame is SETTINGS");
    server.signal("TERM");
    server.wait_for("draining live connections");
    server.signal("INT");
    assert_eq!(server.exit_code(), Some(1));
}

#[test]
fn agent_drains_on_a_signal_and_exits_0_on_a_second() {
    let (_dir, files) = pki();
    let ca = format!("--ca-cert={}", files.ca_cert.display());
    // Port 1 on loopback refuses: the agent keeps trying, which is all this needs.
    let mut agent = Running::start(&[
        "agent",
        &ca,
        "--proxy-server-port=1",
        "--health-server-host=127.0.0.1",
        "--health-server-port=0",
        "--admin-server-port=0",
    ]);
    agent.wait_for("proxy agent starting");
    agent.signal("TERM");
    agent.wait_for("first signal received");
    agent.signal("TERM");
    assert_eq!(agent.exit_code(), Some(0));
}

/// The operator trial's B3: the image runs as uid 65532, and a kubeadm node hands it a
/// root-only key and a root-owned socket directory. Each refusal says which uid the process
/// runs as, who owns the file, what to change on the node and how to run as root instead,
/// with the io error printed once. Run as uid 65532 (as the image) when the test is root, as
/// itself with modes that refuse it otherwise.
#[test]
fn refused_files_name_the_uid_and_what_to_change() {
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::process::CommandExt as _;
    let as_root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap();
    let (dir, files) = pki();
    let mode = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    // Every file readable and the directory searchable, but for what each case refuses.
    mode(dir.path(), 0o755);
    for file in [&files.ca_cert, &files.server_cert, &files.server_key] {
        mode(file, 0o644);
    }
    let socket_dir = dir.path().join("konnectivity-server");
    std::fs::create_dir(&socket_dir).unwrap();
    let socket = socket_dir.join("konnectivity-server.socket");
    // The build directory may be out of uid 65532's reach (under /root): a link it can run
    // (a copy on another filesystem), named as in the image.
    let binary = dir.path().join("proxy-server");
    if std::fs::hard_link(TETHER, &binary).is_err() {
        std::fs::copy(TETHER, &binary).unwrap();
        mode(&binary, 0o755);
    }
    let server = |key_mode: u32, dir_mode: u32| {
        mode(&files.server_key, key_mode);
        mode(&socket_dir, dir_mode);
        let mut cmd = Command::new(&binary);
        cmd.arg(format!("--uds-name={}", socket.display()))
            .arg(format!("--cluster-cert={}", files.server_cert.display()))
            .arg(format!("--cluster-key={}", files.server_key.display()))
            .arg(format!("--cluster-ca-cert={}", files.ca_cert.display()))
            .args(["--server-port=0", "--agent-port=0", "--health-port=0"])
            .arg("--admin-port=0");
        if as_root {
            cmd.uid(65532).gid(65532);
        }
        let output = cmd.output().unwrap();
        assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
        stderr(&output)
    };
    let me = if as_root {
        "This process runs as uid 65532, gid 65532".to_owned()
    } else {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap();
        format!(
            "This process runs as uid {}",
            uid.split_whitespace().nth(1).unwrap()
        )
    };
    let denied = "Permission denied (os error 13)";

    // kubeadm's apiserver.key: root's, 0600 (not readable by its owner either when not root).
    let err = server(if as_root { 0o600 } else { 0o000 }, 0o755);
    let key = files.server_key.display();
    for part in [
        format!(
            "error: --cluster-cert/--cluster-key/--cluster-ca-cert: reading private key {key}: {denied}. {me}"
        ),
        format!("which cannot read {key} (owned by uid "),
        format!("&& chmod 0640 {key}"),
        "securityContext: {runAsUser: 0, runAsNonRoot: false}".to_owned(),
    ] {
        assert!(err.contains(&part), "{part:?} not in {err}");
    }

    // The kubelet's DirectoryOrCreate: root's, 0755 (read-only to its owner when not root).
    let err = server(0o644, if as_root { 0o755 } else { 0o555 });
    let dir = socket_dir.display();
    for part in [
        format!(
            "error: listening on frontend socket {} (--uds-name): {denied}. {me}",
            socket.display()
        ),
        format!("which cannot create a socket in {dir} (owned by uid "),
        format!("-m 0770 {dir}"),
        "or set --uds-name to a directory it can write".to_owned(),
    ] {
        assert!(err.contains(&part), "{part:?} not in {err}");
    }
    assert_eq!(err.matches(denied).count(), 1, "{err}");
    assert!(!socket.exists());
}
