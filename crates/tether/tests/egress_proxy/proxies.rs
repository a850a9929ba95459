//! tinyproxy and stunnel processes with generated configurations, on loopback only.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tether_testkit::process::free_port;
use tokio::process::{Child, Command};

use crate::STEP;

/// tinyproxy on 127.0.0.1; killed when dropped.
pub(crate) struct Tinyproxy {
    _child: Child,
    pub(crate) port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// What a tinyproxy allows.
pub(crate) struct TinyproxyOptions {
    /// The only port CONNECT may reach (the server's agent port).
    pub(crate) connect_port: u16,
    /// `BasicAuth USER PASSWORD` (tinyproxy allows `[-a-z0-9._]` in each).
    pub(crate) basic_auth: Option<(&'static str, &'static str)>,
}

impl Tinyproxy {
    pub(crate) async fn start(options: TinyproxyOptions) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let log = dir.path().join("tinyproxy.log");
        let filter = dir.path().join("filter");
        // Destinations by name: only loopback names (the filter is case-insensitive).
        std::fs::write(&filter, "^127\\.0\\.0\\.1$\n^localhost$\n")?;
        let mut config = format!(
            "Port {port}\n\
             Listen 127.0.0.1\n\
             Bind 127.0.0.1\n\
             Timeout 30\n\
             MaxClients 50\n\
             Allow 127.0.0.1\n\
             ConnectPort {}\n\
             Filter \"{}\"\n\
             FilterType ere\n\
             FilterDefaultDeny Yes\n\
             LogFile \"{}\"\n\
             LogLevel Connect\n\
             PidFile \"{}\"\n",
            options.connect_port,
            filter.display(),
            log.display(),
            dir.path().join("tinyproxy.pid").display(),
        );
        if let Some((user, password)) = options.basic_auth {
            config.push_str(&format!("BasicAuth {user} {password}\n"));
        }
        let conf = dir.path().join("tinyproxy.conf");
        std::fs::write(&conf, config)?;
        let child = Command::new("tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        listening(port, "tinyproxy").await?;
        Ok(Self {
            _child: child,
            port,
            log,
            _dir: dir,
        })
    }

    /// The CONNECT requests tinyproxy received (its `Request (...): CONNECT ...` lines).
    pub(crate) fn connects(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                line.split_once("): CONNECT ")
                    .map(|(_, rest)| rest.to_owned())
            })
            .collect()
    }
}

/// stunnel terminating TLS on 127.0.0.1 in front of a local port: an `https://` proxy.
pub(crate) struct Stunnel {
    _child: Child,
    pub(crate) port: u16,
    _dir: tempfile::TempDir,
}

impl Stunnel {
    pub(crate) async fn start(
        cert: &std::path::Path,
        key: &std::path::Path,
        to_port: u16,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let conf = dir.path().join("stunnel.conf");
        std::fs::write(
            &conf,
            format!(
                "foreground = yes\npid =\n[proxy]\naccept = 127.0.0.1:{port}\n\
                 connect = 127.0.0.1:{to_port}\ncert = {}\nkey = {}\n",
                cert.display(),
                key.display()
            ),
        )?;
        let child = Command::new("stunnel4")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        listening(port, "stunnel4").await?;
        Ok(Self {
            _child: child,
            port,
            _dir: dir,
        })
    }
}

/// Waits until something accepts connections on 127.0.0.1:`port`.
async fn listening(port: u16, what: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + STEP;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{what} does not listen on 127.0.0.1:{port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
