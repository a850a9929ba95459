//! A throwaway PKI for the quickstart, tests and benchmarks.
//!
//! It mirrors the shape of upstream's test PKI (`tests/framework/certs.go`): one CA, a server
//! certificate used for both the frontend and the agent listener, and client certificates for
//! the agent (`CN=proxy-agent`) and for a frontend client (`CN=proxy-client`). Keys are ECDSA
//! P-256 rather than upstream's RSA because handshakes are much cheaper, which matters for
//! benchmarks that open many connections.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::TlsError;

/// Subject alternative names of the server certificate: what local clients dial, plus the
/// in-cluster name kube-apiserver uses, as upstream's test certificate has.
const SERVER_SANS: &[&str] = &["localhost", "127.0.0.1", "::1", "kubernetes"];

/// Back-dating of `notBefore`, so that peers with a slightly slow clock accept fresh
/// certificates.
const BACKDATE: Duration = Duration::from_secs(60 * 60);

/// Lifetime of every certificate, counted from now.
const VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// PEM-encoded CA, server and client credentials, all issued by one fresh CA.
///
/// Every certificate is valid from one hour ago for one year. `Debug` omits the private keys so
/// that the struct can be logged safely.
#[derive(Clone)]
pub struct Pki {
    /// The CA certificate (trust root for both sides).
    pub ca_cert_pem: String,
    /// Server certificate (`CN=proxy-frontend`, serverAuth, SANs localhost, 127.0.0.1, ::1,
    /// kubernetes).
    pub server_cert_pem: String,
    /// Server private key (PKCS#8).
    pub server_key_pem: String,
    /// Agent client certificate (`CN=proxy-agent`, clientAuth).
    pub agent_cert_pem: String,
    /// Agent private key (PKCS#8).
    pub agent_key_pem: String,
    /// Frontend client certificate (`CN=proxy-client`, clientAuth).
    pub client_cert_pem: String,
    /// Frontend client private key (PKCS#8).
    pub client_key_pem: String,
    /// A server's peer certificate for server peering (`CN=`[`PEER_NAME`], DNS SAN the
    /// same, serverAuth and clientAuth: each link's two ends show one).
    pub peer_cert_pem: String,
    /// Peer private key (PKCS#8).
    pub peer_key_pem: String,
    /// The CA's private key, for [`Pki::reissue`].
    ca_key_pem: String,
}

impl fmt::Debug for Pki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pki")
            .field("ca_cert_pem", &self.ca_cert_pem)
            .field("server_cert_pem", &self.server_cert_pem)
            .field("agent_cert_pem", &self.agent_cert_pem)
            .field("client_cert_pem", &self.client_cert_pem)
            .finish_non_exhaustive()
    }
}

/// Paths of the files written by [`Pki::write_to`], ready to pass as flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PkiFiles {
    /// The directory holding all files.
    pub dir: PathBuf,
    /// `ca.crt`
    pub ca_cert: PathBuf,
    /// `server.crt`
    pub server_cert: PathBuf,
    /// `server.key` (mode 0600)
    pub server_key: PathBuf,
    /// `agent.crt`
    pub agent_cert: PathBuf,
    /// `agent.key` (mode 0600)
    pub agent_key: PathBuf,
    /// `client.crt`
    pub client_cert: PathBuf,
    /// `client.key` (mode 0600)
    pub client_key: PathBuf,
    /// `peer.crt`
    pub peer_cert: PathBuf,
    /// `peer.key` (mode 0600)
    pub peer_key: PathBuf,
}

impl PkiFiles {
    /// The paths [`Pki::write_to`] writes in `dir` (whether written yet or not).
    pub fn in_dir(dir: &Path) -> PkiFiles {
        PkiFiles {
            dir: dir.to_owned(),
            ca_cert: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            agent_cert: dir.join("agent.crt"),
            agent_key: dir.join("agent.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
            peer_cert: dir.join("peer.crt"),
            peer_key: dir.join("peer.key"),
        }
    }
}

/// The name the generated peer certificate carries (`--peer-name`).
pub const PEER_NAME: &str = "tether-peer";

/// Which certificate of the PKI [`Pki::reissue`] issues again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leaf {
    /// Like `server_cert_pem`: `CN=proxy-frontend`, serverAuth, the server's SANs.
    Server,
    /// Like `agent_cert_pem`: `CN=proxy-agent`, clientAuth.
    Agent,
}

/// An extra client certificate for [`Pki::generate_with_clients`]: its subject CN and SANs
/// (DNS names or IP literals).
#[derive(Clone, Copy, Debug)]
pub struct ClientSpec<'a> {
    pub common_name: &'a str,
    pub sans: &'a [&'a str],
}

/// A certificate and key PEM issued by [`Pki::generate_with_clients`] or [`Pki::reissue`].
#[derive(Clone)]
pub struct IssuedClient {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for IssuedClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedClient")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl Pki {
    /// Generates a fresh CA and the server, agent and client certificates it signs.
    pub fn generate() -> Result<Self, TlsError> {
        Ok(Self::generate_with_clients(&[])?.0)
    }

    /// Like [`generate`](Self::generate), plus one client certificate (clientAuth) per entry
    /// of `extra`, signed by the same CA: distinct agent identities for identity tests.
    pub fn generate_with_clients(
        extra: &[ClientSpec<'_>],
    ) -> Result<(Self, Vec<IssuedClient>), TlsError> {
        let ca_key = new_key("CA key")?;
        let ca_key_pem = ca_key.serialize_pem();
        let ca = CertifiedIssuer::self_signed(ca_params(&ca_key), ca_key).map_err(|error| {
            TlsError::Generate {
                what: "CA certificate",
                error,
            }
        })?;

        let (not_before, not_after) = default_validity();
        let leaf = |what: &'static str, cn: &str, sans: &[&str], eku: ExtendedKeyUsagePurpose| {
            issue_leaf(&ca, what, cn, sans, &[eku], not_before, not_after)
        };

        let (server_cert_pem, server_key_pem) = leaf(
            "server certificate",
            "proxy-frontend",
            SERVER_SANS,
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let (agent_cert_pem, agent_key_pem) = leaf(
            "agent certificate",
            "proxy-agent",
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let (client_cert_pem, client_key_pem) = leaf(
            "client certificate",
            "proxy-client",
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;

        let (peer_cert_pem, peer_key_pem) = issue_leaf(
            &ca,
            "peer certificate",
            PEER_NAME,
            &[PEER_NAME],
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            not_before,
            not_after,
        )?;

        let issued = extra
            .iter()
            .map(|spec| {
                let (cert_pem, key_pem) = leaf(
                    "extra client certificate",
                    spec.common_name,
                    spec.sans,
                    ExtendedKeyUsagePurpose::ClientAuth,
                )?;
                Ok::<_, TlsError>(IssuedClient { cert_pem, key_pem })
            })
            .collect::<Result<Vec<_>, _>>()?;

        let pki = Self {
            ca_cert_pem: ca.pem(),
            server_cert_pem,
            server_key_pem,
            agent_cert_pem,
            agent_key_pem,
            client_cert_pem,
            client_key_pem,
            peer_cert_pem,
            peer_key_pem,
            ca_key_pem,
        };
        Ok((pki, issued))
    }

    /// A certificate and key like `leaf`'s, from the same CA, valid only from `not_before` to
    /// `not_after`: an expired or not yet valid certificate, for tests of what refuses one.
    pub fn reissue(
        &self,
        leaf: Leaf,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<IssuedClient, TlsError> {
        let (what, cn, sans, eku) = match leaf {
            Leaf::Server => (
                "server certificate",
                "proxy-frontend",
                SERVER_SANS,
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
            Leaf::Agent => (
                "agent certificate",
                "proxy-agent",
                &[][..],
                ExtendedKeyUsagePurpose::ClientAuth,
            ),
        };
        let ca_key = KeyPair::from_pem(&self.ca_key_pem).map_err(|error| TlsError::Generate {
            what: "CA key",
            error,
        })?;
        let ca = Issuer::new(ca_params(&ca_key), ca_key);
        let (cert_pem, key_pem) = issue_leaf(&ca, what, cn, sans, &[eku], not_before, not_after)?;
        Ok(IssuedClient { cert_pem, key_pem })
    }

    /// Writes `ca.crt`, `server.crt`, `server.key`, `agent.crt`, `agent.key`, `client.crt`,
    /// `client.key`, `peer.crt` and `peer.key` into `dir` (created if missing) and returns their paths.
    ///
    /// Private keys are written with mode 0600 (also when overwriting an existing file), as
    /// tools such as kubeadm expect and as anyone copying these paths into a manifest should.
    pub fn write_to(&self, dir: &Path) -> Result<PkiFiles, TlsError> {
        fs::create_dir_all(dir).map_err(|error| TlsError::Write {
            path: dir.to_owned(),
            error,
        })?;
        let files = PkiFiles::in_dir(dir);
        write_file(&files.ca_cert, &self.ca_cert_pem, false)?;
        write_file(&files.server_cert, &self.server_cert_pem, false)?;
        write_file(&files.server_key, &self.server_key_pem, true)?;
        write_file(&files.agent_cert, &self.agent_cert_pem, false)?;
        write_file(&files.agent_key, &self.agent_key_pem, true)?;
        write_file(&files.client_cert, &self.client_cert_pem, false)?;
        write_file(&files.client_key, &self.client_key_pem, true)?;
        write_file(&files.peer_cert, &self.peer_cert_pem, false)?;
        write_file(&files.peer_key, &self.peer_key_pem, true)?;
        Ok(files)
    }
}

/// The CA of a key: its name derives from the key, so the same key always makes the same
/// issuer (see [`ca_common_name`]).
fn ca_params(ca_key: &KeyPair) -> CertificateParams {
    let mut params = CertificateParams::default();
    let ca_name = ca_common_name(&params.key_identifier(ca_key));
    params.distinguished_name.push(DnType::CommonName, ca_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let (not_before, not_after) = default_validity();
    set_validity(&mut params, not_before, not_after);
    params
}

/// A fresh key and a certificate for it signed by `ca`: `cn`, `sans` (DNS names or IP
/// literals), its extended key usages, valid from `not_before` to `not_after`.
fn issue_leaf(
    ca: &Issuer<'_, KeyPair>,
    what: &'static str,
    cn: &str,
    sans: &[&str],
    eku: &[ExtendedKeyUsagePurpose],
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<(String, String), TlsError> {
    let fail = |error| TlsError::Generate { what, error };
    let key = new_key(what)?;
    let sans: Vec<String> = sans.iter().map(|san| (*san).to_owned()).collect();
    let mut params = CertificateParams::new(sans).map_err(fail)?;
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = eku.to_vec();
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, not_before, not_after);
    let cert = params.signed_by(&key, ca).map_err(fail)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Valid from [`BACKDATE`] ago for [`VALIDITY`].
fn default_validity() -> (SystemTime, SystemTime) {
    let now = tether_observe::time::wall_clock();
    (now - BACKDATE, now + VALIDITY)
}

/// Makes `params` valid from `not_before` to `not_after`.
///
/// The times are converted from the Unix epoch with `std` durations because rcgen builds
/// `time` without its `std` feature (so there is no `OffsetDateTime::now_utc`), and this
/// avoids a direct dependency on `time`. A time before 1970 is treated as the epoch.
fn set_validity(params: &mut CertificateParams, not_before: SystemTime, not_after: SystemTime) {
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let since_epoch = |time: SystemTime| time.duration_since(UNIX_EPOCH).unwrap_or_default();
    params.not_before = epoch + since_epoch(not_before);
    params.not_after = epoch + since_epoch(not_after);
}

/// A CA name unique to the CA's key (given as its subject key identifier), like upstream's
/// `127.0.0.1@<timestamp>`.
///
/// Verifiers look issuers up by name: if two throwaway CAs shared a name, a certificate from
/// the wrong one would be reported as a bad signature instead of an unknown issuer.
fn ca_common_name(key_id: &[u8]) -> String {
    let fingerprint: String = key_id
        .iter()
        .take(8)
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("tether throwaway CA {fingerprint}")
}

/// A fresh ECDSA P-256 key pair (rcgen's default algorithm).
fn new_key(what: &'static str) -> Result<KeyPair, TlsError> {
    KeyPair::generate().map_err(|error| TlsError::Generate { what, error })
}

/// Writes `contents` to `path`, restricting it to the owner when `private` is set.
fn write_file(path: &Path, contents: &str, private: bool) -> Result<(), TlsError> {
    let fail = |error| TlsError::Write {
        path: path.to_owned(),
        error,
    };
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(fail)?;
    // `mode` only applies when the file is created; tighten a pre-existing file as well,
    // before the key is written into it.
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::PermissionsExt as _;
        file.set_permissions(fs::Permissions::from_mode(0o600))
            .map_err(fail)?;
    }
    file.write_all(contents.as_bytes()).map_err(fail)
}

#[cfg(test)]
mod tests;
