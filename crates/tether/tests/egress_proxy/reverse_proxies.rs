//! L7 reverse proxies in front of the server's agent port, from Debian's packages: HAProxy and
//! nginx, each terminating the agents' TLS on loopback and opening its own to the server
//! (verifying it against the test CA, and presenting the agent certificate as its client
//! certificate, as an operator's proxy would present one the server trusts). HAProxy offers
//! the server ALPN `http/1.1`; nginx offers none.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tether_testkit::Pki;
use tether_testkit::process::free_port;
use tokio::process::{Child, Command};

use crate::STEP;

/// Which proxy.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Haproxy,
    Nginx,
}

impl Kind {
    pub(crate) fn binary(self) -> &'static str {
        match self {
            Self::Haproxy => "haproxy",
            Self::Nginx => "nginx",
        }
    }
}

/// A running proxy on 127.0.0.1; killed when dropped.
pub(crate) struct ReverseProxy {
    _child: Child,
    pub(crate) port: u16,
    /// Where it logs each request.
    log: PathBuf,
    dir: tempfile::TempDir,
}

/// The path the proxies route to the server; every other path gets a 404 of the proxy's own.
pub(crate) const ROUTED_PATH: &str = "/tether/link";

impl ReverseProxy {
    /// Starts `kind` in front of the agent port `agent_port`.
    pub(crate) async fn start(kind: Kind, pki: &Pki, agent_port: u16) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let log = dir.path().join("requests.log");
        let f = &pki.files;
        let (program, args) = match kind {
            Kind::Haproxy => {
                // HAProxy wants each certificate and its key in one file.
                let front = concat(dir.path(), "front.pem", &f.server_cert, &f.server_key)?;
                let back = concat(dir.path(), "back.pem", &f.agent_cert, &f.agent_key)?;
                let config = format!(
                    "global\n\
                     \x20   log stdout format raw local0\n\
                     defaults\n\
                     \x20   mode http\n\
                     \x20   log global\n\
                     \x20   option httplog\n\
                     \x20   timeout connect 5s\n\
                     \x20   timeout client 30s\n\
                     \x20   timeout server 30s\n\
                     \x20   timeout tunnel 1h\n\
                     frontend agents\n\
                     \x20   bind 127.0.0.1:{port} ssl crt {front} alpn http/1.1\n\
                     \x20   http-request return status 404 content-type text/plain string \"no route\" unless {{ path_beg {ROUTED_PATH} }}\n\
                     \x20   default_backend tether\n\
                     backend tether\n\
                     \x20   server tether 127.0.0.1:{agent_port} ssl verify required ca-file {ca} \
                     verifyhost localhost sni str(localhost) crt {back} alpn http/1.1\n",
                    front = front.display(),
                    back = back.display(),
                    ca = f.ca_cert.display(),
                );
                let conf = dir.path().join("haproxy.cfg");
                std::fs::write(&conf, config)?;
                let args = vec![
                    "-db".to_owned(),
                    "-f".to_owned(),
                    conf.display().to_string(),
                ];
                ("haproxy", args)
            }
            Kind::Nginx => {
                let d = dir.path().display();
                let config = format!(
                    "daemon off;\n\
                     master_process off;\n\
                     pid {d}/nginx.pid;\n\
                     error_log {d}/error.log info;\n\
                     events {{ worker_connections 64; }}\n\
                     http {{\n\
                     \x20 access_log {log};\n\
                     \x20 client_body_temp_path {d}/body;\n\
                     \x20 proxy_temp_path {d}/proxy;\n\
                     \x20 fastcgi_temp_path {d}/fastcgi;\n\
                     \x20 uwsgi_temp_path {d}/uwsgi;\n\
                     \x20 scgi_temp_path {d}/scgi;\n\
                     \x20 server {{\n\
                     \x20   listen 127.0.0.1:{port} ssl;\n\
                     \x20   ssl_certificate {server_cert};\n\
                     \x20   ssl_certificate_key {server_key};\n\
                     \x20   location {ROUTED_PATH} {{\n\
                     \x20     proxy_pass https://127.0.0.1:{agent_port};\n\
                     \x20     proxy_http_version 1.1;\n\
                     \x20     proxy_set_header Upgrade $http_upgrade;\n\
                     \x20     proxy_set_header Connection \"upgrade\";\n\
                     \x20     proxy_ssl_certificate {agent_cert};\n\
                     \x20     proxy_ssl_certificate_key {agent_key};\n\
                     \x20     proxy_ssl_trusted_certificate {ca};\n\
                     \x20     proxy_ssl_verify on;\n\
                     \x20     proxy_ssl_name localhost;\n\
                     \x20     proxy_ssl_server_name on;\n\
                     \x20     proxy_read_timeout 1h;\n\
                     \x20     proxy_send_timeout 1h;\n\
                     \x20   }}\n\
                     \x20   location / {{ return 404 \"no route\"; }}\n\
                     \x20 }}\n\
                     }}\n",
                    log = log.display(),
                    server_cert = f.server_cert.display(),
                    server_key = f.server_key.display(),
                    agent_cert = f.agent_cert.display(),
                    agent_key = f.agent_key.display(),
                    ca = f.ca_cert.display(),
                );
                let conf = dir.path().join("nginx.conf");
                std::fs::write(&conf, config)?;
                let args = vec![
                    "-e".to_owned(),
                    format!("{d}/error.log"),
                    "-p".to_owned(),
                    d.to_string(),
                    "-c".to_owned(),
                    conf.display().to_string(),
                ];
                ("nginx", args)
            }
        };
        // HAProxy logs requests to its stdout; nginx to its access log.
        let stdout = match kind {
            Kind::Haproxy => Stdio::from(std::fs::File::create(&log)?),
            Kind::Nginx => Stdio::null(),
        };
        let child = Command::new(program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::from(std::fs::File::create(
                dir.path().join("stderr.log"),
            )?))
            .kill_on_drop(true)
            .spawn()?;
        let proxy = Self {
            _child: child,
            port,
            log,
            dir,
        };
        proxy.wait_listening(kind).await?;
        Ok(proxy)
    }

    async fn wait_listening(&self, kind: Kind) -> anyhow::Result<()> {
        let started = tokio::time::Instant::now();
        while started.elapsed() < STEP {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let stderr =
            std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default();
        anyhow::bail!(
            "{kind:?} is not listening on {} after {STEP:?}: {stderr}",
            self.port
        )
    }

    /// What the proxy logged of its requests.
    pub(crate) fn requests(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Writes `cert` then `key` into `dir/name`.
fn concat(dir: &Path, name: &str, cert: &Path, key: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    let mut pem = std::fs::read(cert)?;
    pem.extend(std::fs::read(key)?);
    std::fs::write(&path, pem)?;
    Ok(path)
}
