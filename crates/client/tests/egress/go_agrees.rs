//! Every file under `invalid/` and `valid/` gets the verdict k8s.io/apiserver gave it.
//!
//! Validation errors must match Go's text exactly (tether prints them as Go does). Decoding
//! errors (bad YAML/JSON, unknown or repeated fields, other kinds) need only be errors too:
//! the decoders differ, so the wording does.

use std::path::{Path, PathBuf};

use tether_client::egress::{EgressError, EgressSelector, Selection};

struct GoVerdict {
    file: String,
    stage: String,
    message: String,
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/egress")
}

fn go_verdicts() -> Vec<GoVerdict> {
    let text = std::fs::read_to_string(dir().join("go-results.txt")).expect("go-results.txt");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let mut parts = line.splitn(3, '\t');
            let mut next = || parts.next().expect("FILE\\tSTAGE\\tMESSAGE").to_owned();
            let (file, stage, message) = (next(), next(), next());
            let message = message.replace("\\n", "\n").replace("\\\\", "\\");
            GoVerdict {
                file,
                stage,
                message,
            }
        })
        .collect()
}

/// The table's paths are absolute, so neither loader depends on its working directory.
fn load(file: &str) -> Result<EgressSelector, EgressError> {
    EgressSelector::load(&dir().join(file))
}

#[test]
fn every_file_has_a_go_verdict() {
    let verdicts = go_verdicts();
    for sub in ["invalid", "valid"] {
        for entry in std::fs::read_dir(dir().join(sub)).unwrap() {
            let name = format!("{sub}/{}", entry.unwrap().file_name().to_string_lossy());
            assert!(
                verdicts.iter().any(|v| v.file == name),
                "{name} is not in go-results.txt: run interop/egress-golden.sh"
            );
        }
    }
}

#[test]
fn rejects_what_go_rejects_with_the_same_validation_errors() {
    let mut validation_errors = 0;
    for go in go_verdicts()
        .iter()
        .filter(|v| v.file.starts_with("invalid/"))
    {
        assert_eq!(go.stage, "setup", "{}: Go did not reject it", go.file);
        match load(&go.file) {
            Ok(_) => panic!("{}: accepted; Go said {:?}", go.file, go.message),
            Err(EgressError::Invalid(errors)) => {
                validation_errors += 1;
                assert_eq!(
                    tether_client::egress::aggregate(&errors),
                    go.message,
                    "{}",
                    go.file
                );
            }
            Err(EgressError::Decode(ours)) => {
                let go_decode = [
                    "strict decoding error",
                    "couldn't get version/kind",
                    "Object 'Kind' is missing",
                    "no kind ",
                ];
                assert!(
                    go_decode.iter().any(|p| go.message.starts_with(p)),
                    "{}: we failed decoding ({ours}), Go failed validation: {}",
                    go.file,
                    go.message
                );
            }
            Err(other) => panic!("{}: unexpected {other}", go.file),
        }
    }
    assert!(
        validation_errors >= 15,
        "the table lost its validation cases"
    );
}

#[test]
fn accepts_what_go_accepts() {
    for go in go_verdicts()
        .iter()
        .filter(|v| v.file.starts_with("valid/"))
    {
        let selector = load(&go.file).unwrap_or_else(|e| panic!("{}: {e}", go.file));
        // Go's peer dials `cluster`; it reached the dial exactly when there was a dialer.
        assert_eq!(
            selector.dialer(Selection::Cluster).is_some(),
            go.stage == "dial",
            "{}: Go said {} {:?}",
            go.file,
            go.stage,
            go.message
        );
    }
}
