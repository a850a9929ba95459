use super::*;

fn tls12_suites(provider: &CryptoProvider) -> Vec<CipherSuite> {
    provider
        .cipher_suites
        .iter()
        .filter(|suite| matches!(suite, SupportedCipherSuite::Tls12(_)))
        .map(|suite| suite.suite())
        .collect()
}

#[test]
fn min_version_defaults_to_tls12() {
    let (opts, warning) = TlsOptions::from_go_flags("", "").expect("valid flags");
    assert_eq!(opts.min_version, TlsVersion::Tls12);
    assert!(opts.cipher_suites.is_empty());
    assert!(warning.is_none());
    assert_eq!(opts.protocol_versions().len(), 2);
}

#[test]
fn min_version_go_names() {
    let (opts, warning) = TlsOptions::from_go_flags("VersionTLS12", "").expect("valid flags");
    assert_eq!((opts.min_version, warning), (TlsVersion::Tls12, None));

    let (opts, warning) = TlsOptions::from_go_flags("VersionTLS13", "").expect("valid flags");
    assert_eq!((opts.min_version, warning), (TlsVersion::Tls13, None));
    assert_eq!(opts.protocol_versions(), &[&rustls::version::TLS13]);
}

#[test]
fn min_version_tls13_leaves_the_provider_no_tls12_suite() {
    let (opts, _) =
        TlsOptions::from_go_flags("VersionTLS13", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256")
            .expect("valid flags");
    let provider = provider(&opts);
    assert!(tls12_suites(&provider).is_empty());
    assert_eq!(provider.cipher_suites.len(), 3, "the TLS 1.3 suites stay");
}

#[test]
fn min_version_below_tls12_warns_and_uses_tls12() {
    for old in ["VersionTLS10", "VersionTLS11"] {
        let (opts, warning) = TlsOptions::from_go_flags(old, "").expect("accepted");
        assert_eq!(opts.min_version, TlsVersion::Tls12);
        let warning = warning.expect("a warning for the caller to log");
        assert!(warning.contains(old), "{warning}");
    }
}

#[test]
fn min_version_unknown_is_an_error() {
    for bad in ["VersionTLS14", "1.2", "tls12", "versiontls12"] {
        let err = TlsOptions::from_go_flags(bad, "").expect_err(bad);
        assert!(matches!(err, TlsError::UnknownTlsVersion { ref value } if value == bad));
        assert!(err.to_string().contains("--tls-min-version"), "{err}");
    }
}

#[test]
fn cipher_suites_filter_tls12_and_keep_tls13() {
    let (opts, _) = TlsOptions::from_go_flags(
        "",
        " TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 ,,TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
    )
    .expect("valid flags");
    assert_eq!(
        opts.cipher_suites,
        [
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"
        ]
    );
    let provider = provider(&opts);
    let mut tls12 = tls12_suites(&provider);
    tls12.sort_by_key(|suite| u16::from(*suite));
    assert_eq!(
        tls12,
        [
            CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ]
    );
    let tls13 = provider.cipher_suites.len() - 2;
    assert_eq!(tls13, 3, "all TLS 1.3 suites stay enabled");
}

#[test]
fn cipher_suites_tls13_names_are_accepted_and_ignored() {
    let (opts, _) =
        TlsOptions::from_go_flags("", "TLS_AES_128_GCM_SHA256").expect("Go accepts TLS 1.3 names");
    let provider = provider(&opts);
    assert!(tls12_suites(&provider).is_empty());
    assert_eq!(provider.cipher_suites.len(), 3);
}

#[test]
fn cipher_suites_empty_keeps_rustls_defaults() {
    let (opts, _) = TlsOptions::from_go_flags("", "").expect("valid flags");
    assert_eq!(
        provider(&opts).cipher_suites.len(),
        aws_lc_rs::default_provider().cipher_suites.len()
    );
}

#[test]
fn cipher_suites_unsupported_lists_supported_ones() {
    for bad in [
        "TLS_RSA_WITH_AES_128_CBC_SHA",
        "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
        "bogus",
    ] {
        let flag = format!("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,{bad}");
        let err = TlsOptions::from_go_flags("", &flag).expect_err(bad);
        let TlsError::UnsupportedCipherSuite { name, supported } = &err else {
            panic!("unexpected error {err}");
        };
        assert_eq!(name, bad);
        assert!(supported.contains("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"));
        assert!(supported.contains("TLS_AES_256_GCM_SHA384"));
        assert!(err.to_string().starts_with("--cipher-suites"), "{err}");
    }
}
