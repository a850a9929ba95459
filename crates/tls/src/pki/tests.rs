use super::*;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

#[test]
fn write_to_writes_all_files_with_private_keys_0600() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate().expect("generate");
    // A nested directory that does not exist yet.
    let files = pki.write_to(&dir.path().join("pki")).expect("write");

    for (path, contents) in [
        (&files.ca_cert, &pki.ca_cert_pem),
        (&files.server_cert, &pki.server_cert_pem),
        (&files.server_key, &pki.server_key_pem),
        (&files.agent_cert, &pki.agent_cert_pem),
        (&files.agent_key, &pki.agent_key_pem),
        (&files.client_cert, &pki.client_cert_pem),
        (&files.client_key, &pki.client_key_pem),
    ] {
        assert_eq!(path.parent(), Some(files.dir.as_path()));
        assert_eq!(&fs::read_to_string(path).expect("read back"), contents);
    }

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |path: &Path| fs::metadata(path).expect("stat").permissions().mode() & 0o777;
        for key in [&files.server_key, &files.agent_key, &files.client_key] {
            assert_eq!(mode(key), 0o600, "{}", key.display());
        }
        // Overwriting a key that was left world-readable tightens it.
        fs::set_permissions(&files.agent_key, fs::Permissions::from_mode(0o644)).expect("chmod");
        pki.write_to(&files.dir).expect("rewrite");
        assert_eq!(mode(&files.agent_key), 0o600);
    }
}

#[test]
fn certificates_are_single_pem_certificates_and_keys_stay_out_of_debug() {
    let pki = Pki::generate().expect("generate");
    for pem in [
        &pki.ca_cert_pem,
        &pki.server_cert_pem,
        &pki.agent_cert_pem,
        &pki.client_cert_pem,
    ] {
        let certs: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .expect("valid PEM");
        assert_eq!(certs.len(), 1);
    }
    let debug = format!("{pki:?}");
    assert!(!debug.contains("PRIVATE KEY"), "{debug}");
    assert!(debug.contains("BEGIN CERTIFICATE"));
}

#[test]
fn every_generation_uses_a_fresh_ca() {
    let a = Pki::generate().expect("generate");
    let b = Pki::generate().expect("generate");
    assert_ne!(a.ca_cert_pem, b.ca_cert_pem);
    assert_ne!(a.server_key_pem, b.server_key_pem);
}
