//! Start-up errors caused by a refused file or directory (EACCES) say which uid and groups the
//! process runs as, who owns what it was refused, and what to change. The image runs as uid
//! 65532, and a kubeadm node's files are root's (keys 0600, directories created by the
//! kubelet's `DirectoryOrCreate` 0755), so a manifest that only swaps the image meets this
//! first.

use std::fmt;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use tether_tls::{PemOrigin, PemProblem, TlsError};

/// `error` with what to do appended when it was caused by a refused file or directory;
/// any other error unchanged.
pub(crate) fn explain(error: anyhow::Error) -> anyhow::Error {
    match (refusal(&error), Identity::current()) {
        (Some(refused), Some(identity)) => {
            anyhow::anyhow!("{error:#}. {}", advice(&refused, &identity))
        }
        _ => error,
    }
}

/// What the process was refused.
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    /// Reading this file (a certificate, key or CA bundle).
    Read(PathBuf),
    /// Creating a Unix socket in this directory, whose path the flag names.
    SocketDirectory { dir: PathBuf, flag: &'static str },
    /// Something else: a file read through another library, a port below 1024.
    Other,
}

fn refusal(error: &anyhow::Error) -> Option<Refused> {
    let denied = |e: &io::Error| e.kind() == io::ErrorKind::PermissionDenied;
    error.chain().find_map(|cause| {
        if let Some(TlsError::Pem {
            origin: PemOrigin::File(path),
            problem: PemProblem::Io(e),
            ..
        }) = cause.downcast_ref::<TlsError>()
        {
            return denied(e).then(|| Refused::Read(path.clone()));
        }
        if let Some(tether_server::ServerError::Listen {
            what, addr, error, ..
        }) = cause.downcast_ref()
        {
            let flag = match *what {
                "frontend socket" => "--uds-name",
                "tenant frontend socket" => "--routing-config (frontend.unix)",
                _ => return denied(error).then_some(Refused::Other),
            };
            let dir = Path::new(addr)
                .parent()
                .unwrap_or(Path::new("/"))
                .to_owned();
            return denied(error).then_some(Refused::SocketDirectory { dir, flag });
        }
        let io = cause.downcast_ref::<io::Error>().or_else(|| {
            match cause.downcast_ref::<tether_agent::AgentError>() {
                Some(tether_agent::AgentError::Listen { error, .. }) => Some(error),
                _ => None,
            }
        })?;
        denied(io).then_some(Refused::Other)
    })
}

/// The uid, gid and supplementary groups the process runs as (the effective ones).
#[derive(Debug, PartialEq, Eq)]
struct Identity {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

impl Identity {
    /// From `/proc/self/status` (the binary runs on Linux only, and forbids `unsafe`).
    fn current() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/self/status").ok()?)
    }

    fn parse(status: &str) -> Option<Self> {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .map(|rest| {
                    rest.split_whitespace()
                        .filter_map(|n| n.parse().ok())
                        .collect::<Vec<u32>>()
                })
        };
        // Uid: and Gid: list real, effective, saved and filesystem ids; the effective one counts.
        Some(Self {
            uid: *field("Uid:")?.get(1)?,
            gid: *field("Gid:")?.get(1)?,
            groups: field("Groups:").unwrap_or_default(),
        })
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uid {}, gid {}", self.uid, self.gid)?;
        if !self.groups.is_empty() {
            let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
            write!(f, ", groups {}", groups.join(","))?;
        }
        Ok(())
    }
}

/// Owner and mode of `path`, as `owned by uid 0, gid 0, mode 0600`, if it can be read.
fn ownership(path: &Path) -> String {
    match std::fs::metadata(path) {
        Ok(m) => format!(
            " (owned by uid {}, gid {}, mode {:04o})",
            m.uid(),
            m.gid(),
            m.mode() & 0o7777
        ),
        Err(_) => String::new(),
    }
}

const AS_ROOT: &str = "or run it as root (in the Pod: securityContext: {runAsUser: 0, \
                       runAsNonRoot: false}; in the chart: --set securityContext.runAsUser=0 \
                       --set securityContext.runAsNonRoot=false)";

fn advice(refused: &Refused, identity: &Identity) -> String {
    let me = format!("This process runs as {identity}");
    if identity.uid == 0 {
        // Root is refused only by a security module or a read-only mount, not by modes.
        return format!("{me}: check SELinux or AppArmor denials and the mount's options");
    }
    let gid = identity.gid;
    match refused {
        Refused::Read(path) => {
            let file = path.display();
            format!(
                "{me}, which cannot read {file}{}: on the node, give its group read access \
                 (chgrp {gid} {file} && chmod 0640 {file}; kubeadm's certificate renewal \
                 rewrites a key in place, keeping its group and mode), {AS_ROOT}",
                ownership(path)
            )
        }
        Refused::SocketDirectory { dir, flag } => {
            let d = dir.display();
            format!(
                "{me}, which cannot create a socket in {d}{}: on the node, prepare the \
                 directory for it (install -d -o {uid} -g {gid} -m 0770 {d}; kube-apiserver, \
                 as root, still reaches the socket), or set {flag} to a directory it can \
                 write, {AS_ROOT}",
                ownership(dir),
                uid = identity.uid,
            )
        }
        Refused::Other => format!(
            "{me}: give it access to what was refused (a file's group: chgrp {gid} and \
             chmod g+r), {AS_ROOT}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image_user() -> Identity {
        Identity {
            uid: 65532,
            gid: 65532,
            groups: vec![65532],
        }
    }

    #[test]
    fn the_effective_ids_are_read_from_proc_status() {
        let status = "Name:\ttether\nUid:\t1000\t65532\t65532\t65532\n\
                      Gid:\t1000\t65533\t65533\t65533\nGroups:\t65533 4 \n";
        assert_eq!(
            Identity::parse(status),
            Some(Identity {
                uid: 65532,
                gid: 65533,
                groups: vec![65533, 4]
            })
        );
        assert_eq!(Identity::parse("Name:\ttether\n"), None);
        let me = Identity::current().expect("/proc/self/status");
        assert!(me.to_string().starts_with("uid "), "{me}");
    }

    #[test]
    fn a_refused_key_names_the_identity_and_both_fixes() {
        let error = anyhow::Error::new(TlsError::Pem {
            what: "private key",
            origin: PemOrigin::File("/etc/kubernetes/pki/apiserver.key".into()),
            problem: PemProblem::Io(io::Error::from(io::ErrorKind::PermissionDenied)),
        })
        .context("--cluster-cert/--cluster-key/--cluster-ca-cert");
        let refused = refusal(&error).expect("a refusal");
        assert_eq!(
            refused,
            Refused::Read("/etc/kubernetes/pki/apiserver.key".into())
        );
        let advice = advice(&refused, &image_user());
        for part in [
            "runs as uid 65532, gid 65532, groups 65532, which cannot read /etc/kubernetes/pki/apiserver.key",
            "chgrp 65532 /etc/kubernetes/pki/apiserver.key && chmod 0640",
            "runAsUser: 0",
        ] {
            assert!(advice.contains(part), "{part:?} not in {advice}");
        }
    }

    #[test]
    fn a_refused_socket_directory_names_the_flag() {
        let error = anyhow::Error::new(tether_server::ServerError::Listen {
            what: "frontend socket",
            addr: "/etc/kubernetes/konnectivity-server/konnectivity-server.socket".into(),
            flags: "--uds-name",
            error: io::Error::from(io::ErrorKind::PermissionDenied),
        });
        let refused = refusal(&error).expect("a refusal");
        let advice = advice(&refused, &image_user());
        for part in [
            "cannot create a socket in /etc/kubernetes/konnectivity-server",
            "install -d -o 65532 -g 65532 -m 0770 /etc/kubernetes/konnectivity-server",
            "set --uds-name",
        ] {
            assert!(advice.contains(part), "{part:?} not in {advice}");
        }
    }

    #[test]
    fn other_errors_pass_unchanged() {
        let in_use = anyhow::Error::new(tether_server::ServerError::Listen {
            what: "agent",
            addr: "127.0.0.1:8132".into(),
            flags: "--agent-bind-address, --agent-port",
            error: io::Error::from(io::ErrorKind::AddrInUse),
        });
        assert_eq!(refusal(&in_use), None);
        let missing = anyhow::Error::new(TlsError::Pem {
            what: "private key",
            origin: PemOrigin::File("/nowhere.key".into()),
            problem: PemProblem::Io(io::Error::from(io::ErrorKind::NotFound)),
        });
        assert_eq!(refusal(&missing), None);
        let text = format!("{:#}", explain(missing));
        assert!(!text.contains("runs as"), "{text}");
    }
}
