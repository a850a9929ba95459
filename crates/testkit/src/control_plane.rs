//! A real Kubernetes control plane on loopback for tests: etcd and kube-apiserver, built from the
//! Go module proxy by `interop/k8s/build.sh` (cached outside the repo), with throwaway
//! certificates, a static admin token and a service-account signing key. Both processes are
//! killed when the [`ControlPlane`] is dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::AsyncWriteExt as _;
use tokio::process::{Child, Command};

use crate::Pki;
use crate::process::free_port;

/// The token of a `system:masters` user, accepted through `--token-auth-file`.
pub const ADMIN_TOKEN: &str = "tether-testkit-admin";

/// The audience kube-apiserver accepts for its own API (`--api-audiences`).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// Readiness and shutdown bounds: generous, to catch hangs on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(60);

/// How often a start-up is tried again when a picked port was taken in the meantime.
const PORT_ATTEMPTS: usize = 3;

/// How much of a failed process's log a start-up error quotes.
const LOG_TAIL_LINES: usize = 20;

/// How to start the API server.
#[derive(Debug, Default, Clone)]
pub struct ControlPlaneOptions {
    /// `--egress-selector-config-file`, for tests that send the API server's traffic through a
    /// proxy server.
    pub egress_selector_config: Option<PathBuf>,
    /// More kube-apiserver flags, appended last (later flags win).
    pub extra_args: Vec<String>,
}

/// A running etcd and kube-apiserver on 127.0.0.1.
#[derive(Debug)]
pub struct ControlPlane {
    // The processes come first: fields drop in order, so they are killed before the temporary
    // directory holding etcd's data is removed.
    apiserver: Option<Child>,
    etcd: Child,
    bin: PathBuf,
    /// The serving CA, server certificate and spare client certificates (signed by the CA that
    /// kube-apiserver trusts for x509 client authentication).
    pub pki: Pki,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    pub port: u16,
    /// A kubeconfig for the admin user.
    pub kubeconfig: PathBuf,
    etcd_url: String,
    options: ControlPlaneOptions,
}

/// The directory holding `etcd`, `kube-apiserver`, `kubectl` and `kwok`: `$TETHER_K8S_BIN`, or
/// what `interop/k8s/build.sh` prints (seconds when its cache is warm, minutes when cold).
pub fn binaries() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("TETHER_K8S_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../interop/k8s/build.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    anyhow::ensure!(out.status.success(), "{} failed", script.display());
    let stdout = String::from_utf8(out.stdout)?;
    let dir = stdout
        .lines()
        .last()
        .context("interop/k8s/build.sh printed nothing")?;
    Ok(PathBuf::from(dir))
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver and waits until `/readyz` answers `ok`.
    pub async fn start(options: ControlPlaneOptions) -> anyhow::Result<Self> {
        let bin = binaries()?;
        let pki = Pki::generate()?;
        let dir = pki.dir().to_owned();
        std::fs::write(
            dir.join("tokens.csv"),
            format!("{ADMIN_TOKEN},admin,admin-uid,system:masters\n"),
        )?;
        let signing_key = rcgen::KeyPair::generate().context("service-account signing key")?;
        std::fs::write(dir.join("sa.key"), signing_key.serialize_pem())?;
        std::fs::write(dir.join("sa.pub"), signing_key.public_key_pem())?;

        let (etcd, etcd_url) = start_etcd(&bin, &dir).await?;

        let mut plane = Self {
            bin,
            pki,
            url: String::new(),
            port: 0,
            kubeconfig: dir.join("admin.kubeconfig"),
            etcd,
            etcd_url,
            apiserver: None,
            options,
        };
        // The port was free when picked, but another test may bind it before kube-apiserver
        // does; then pick another.
        let mut attempt = 1;
        loop {
            plane.use_port(free_port())?;
            match plane.start_apiserver().await {
                Err(error) if attempt < PORT_ATTEMPTS && port_taken(&error) => {
                    plane.apiserver = None;
                    attempt += 1;
                }
                result => return result.map(|()| plane),
            }
        }
    }

    fn use_port(&mut self, port: u16) -> anyhow::Result<()> {
        self.port = port;
        self.url = format!("https://127.0.0.1:{port}");
        std::fs::write(
            &self.kubeconfig,
            kubeconfig_yaml(
                &self.url,
                &self.pki.files.ca_cert,
                "admin",
                &format!("token: {ADMIN_TOKEN}"),
            ),
        )?;
        Ok(())
    }

    /// Starts kube-apiserver again after [`stop_apiserver`](Self::stop_apiserver), on the same
    /// port, etcd and keys, and waits until it is ready.
    pub async fn start_apiserver(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.apiserver.is_none(),
            "kube-apiserver is already running"
        );
        let dir = self.pki.dir();
        let files = &self.pki.files;
        let mut args = vec![
            format!("--etcd-servers={}", self.etcd_url),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={}", self.port),
            format!("--tls-cert-file={}", files.server_cert.display()),
            format!("--tls-private-key-file={}", files.server_key.display()),
            format!("--client-ca-file={}", files.ca_cert.display()),
            format!("--token-auth-file={}", dir.join("tokens.csv").display()),
            format!("--service-account-issuer={API_AUDIENCE}"),
            format!(
                "--service-account-key-file={}",
                dir.join("sa.pub").display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                dir.join("sa.key").display()
            ),
            format!("--api-audiences={API_AUDIENCE}"),
            "--authorization-mode=Node,RBAC".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            // No Endpoints for the kubernetes Service: nothing may dial off loopback.
            "--endpoint-reconciler-type=none".into(),
            "--enable-priority-and-fairness=false".into(),
            "--profiling=false".into(),
            "-v=1".into(),
        ];
        if let Some(egress) = &self.options.egress_selector_config {
            args.push(format!(
                "--egress-selector-config-file={}",
                egress.display()
            ));
        }
        args.extend(self.options.extra_args.iter().cloned());
        let log = self.pki.dir().join("kube-apiserver.log");
        self.apiserver = Some(spawn(&self.bin.join("kube-apiserver"), &args, &log)?);
        self.wait_ready(&log).await
    }

    /// Kills kube-apiserver (etcd keeps running), for tests of an unreachable API server.
    pub async fn stop_apiserver(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.apiserver.take() {
            child.start_kill()?;
            tokio::time::timeout(Duration::from_secs(30), child.wait())
                .await
                .context("kube-apiserver did not exit within 30 s of SIGKILL")??;
        }
        Ok(())
    }

    async fn wait_ready(&mut self, log: &Path) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let mut last = String::new();
        while tokio::time::Instant::now() < deadline {
            if let Some(status) = self.etcd.try_wait()? {
                anyhow::bail!("etcd exited while kube-apiserver started: {status}");
            }
            if let Some(status) = self
                .apiserver
                .as_mut()
                .and_then(|c| c.try_wait().transpose())
            {
                anyhow::bail!(
                    "kube-apiserver exited during start-up: {}\n{}",
                    status?,
                    log_tail(log)
                );
            }
            match self.kubectl(&["get", "--raw=/readyz"], None).await {
                Ok(out) if out.trim() == "ok" => return Ok(()),
                Ok(out) => last = out,
                Err(error) => last = format!("{error:#}"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        anyhow::bail!("kube-apiserver not ready within {READY_TIMEOUT:?}: {last}")
    }

    /// The `kubectl` binary built with the control plane.
    pub fn kubectl_path(&self) -> PathBuf {
        self.bin.join("kubectl")
    }

    /// Runs `kubectl --kubeconfig=<admin> ARGS` (with `stdin` piped in when given) and returns
    /// its stdout; an error carries stderr.
    pub async fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        let mut child = Command::new(self.kubectl_path())
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes()).await?;
        }
        let out = tokio::time::timeout(KUBECTL_TIMEOUT, child.wait_with_output())
            .await
            .with_context(|| {
                format!("kubectl {args:?} still running after {KUBECTL_TIMEOUT:?}")
            })??;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        anyhow::ensure!(
            out.status.success(),
            "kubectl {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(stdout)
    }

    /// Applies YAML documents with `kubectl apply -f -`.
    pub async fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        self.kubectl(&["apply", "-f", "-"], Some(yaml))
            .await
            .map(drop)
    }

    /// A token from the TokenRequest API for `namespace/service_account` with `audience`,
    /// optionally bound to a Pod (bound tokens carry the pod's node name).
    pub async fn create_token(
        &self,
        namespace: &str,
        service_account: &str,
        audience: &str,
        bound_pod: Option<&str>,
    ) -> anyhow::Result<String> {
        let audience = format!("--audience={audience}");
        let mut args = vec![
            "create",
            "token",
            service_account,
            "-n",
            namespace,
            &audience,
        ];
        let pod;
        if let Some(name) = bound_pod {
            pod = format!("--bound-object-name={name}");
            args.extend(["--bound-object-kind=Pod", &pod]);
        }
        Ok(self.kubectl(&args, None).await?.trim().to_owned())
    }

    /// kube-apiserver's Prometheus metrics, read with the admin credentials.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        self.kubectl(&["get", "--raw=/metrics"], None).await
    }

    /// Writes a kubeconfig for this API server that authenticates with a bearer token, for a
    /// component under test, and returns its path.
    pub fn write_token_kubeconfig(&self, name: &str, token: &str) -> anyhow::Result<PathBuf> {
        let path = self.pki.dir().join(format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            kubeconfig_yaml(
                &self.url,
                &self.pki.files.ca_cert,
                name,
                &format!("token: {token}"),
            ),
        )?;
        Ok(path)
    }
}

/// A kubeconfig for one API server at `url`, verified with `ca`, as `user` with `credentials`
/// (a YAML line such as `token: t`).
pub fn kubeconfig_yaml(url: &str, ca: &Path, user: &str, credentials: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {url}\n    \
         certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    {credentials}\n\
         contexts:\n- name: local\n  context: {{cluster: local, user: {user}, namespace: default}}\n\
         current-context: local\n",
        ca = ca.display()
    )
}

/// Starts etcd on two free ports and waits until its client port accepts connections, picking
/// other ports when another process took one first.
async fn start_etcd(bin: &Path, dir: &Path) -> anyhow::Result<(Child, String)> {
    let mut attempt = 1;
    loop {
        let (client, peer) = (free_port(), free_port());
        let url = format!("http://127.0.0.1:{client}");
        let log = dir.join(format!("etcd-{attempt}.log"));
        let mut etcd = spawn(
            &bin.join("etcd"),
            &[
                "--name=default".into(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={url}"),
                format!("--advertise-client-urls={url}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-cluster=default=http://127.0.0.1:{peer}"),
                "--log-level=warn".into(),
            ],
            &log,
        )?;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let error = loop {
            if let Some(status) = etcd.try_wait()? {
                break anyhow::anyhow!("etcd exited during start-up: {status}\n{}", log_tail(&log));
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", client))
                .await
                .is_ok()
            {
                return Ok((etcd, url));
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "etcd not listening on {url} within {READY_TIMEOUT:?}\n{}",
                log_tail(&log)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if attempt == PORT_ATTEMPTS || !port_taken(&error) {
            return Err(error);
        }
        // A failed first start may leave a half-made data directory behind.
        let _ = std::fs::remove_dir_all(dir.join("etcd"));
        attempt += 1;
    }
}

/// Whether a start-up error says a listening port was taken by someone else.
fn port_taken(error: &anyhow::Error) -> bool {
    format!("{error:#}").contains("address already in use")
}

/// The last lines of a process's log, for a start-up error.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(LOG_TAIL_LINES);
    format!(
        "last lines of {}:\n{}",
        log.display(),
        lines[start..].join("\n")
    )
}

/// Spawns a control-plane process with its stdout and stderr in `log`.
fn spawn(bin: &Path, args: &[String], log: &Path) -> anyhow::Result<Child> {
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}
