//! The labels a server puts on its Lease (`--lease-label`) and the selector agents count by
//! (`--lease-label-selector`).

use std::collections::BTreeMap;

/// `--lease-label`: comma-separated `key=value` pairs, parsed as upstream's `ParseLabels`
/// does (each pair split at its one `=`, both sides trimmed), except that an empty key is
/// refused here rather than by the API server on every write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseLabels(BTreeMap<String, String>);

impl std::str::FromStr for LeaseLabels {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("empty string provided".into());
        }
        let mut labels = BTreeMap::new();
        for pair in s.split(',') {
            let mut parts = pair.split('=');
            let (Some(key), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("invalid label format: {pair}"));
            };
            let key = key.trim();
            if key.is_empty() {
                return Err(format!("invalid label format: {pair} (empty key)"));
            }
            labels.insert(key.to_owned(), value.trim().to_owned());
        }
        Ok(Self(labels))
    }
}

impl LeaseLabels {
    pub fn map(&self) -> &BTreeMap<String, String> {
        &self.0
    }

    /// The equality selector matching exactly these labels, sorted by key as
    /// `labels.FormatLabels` writes it (the garbage collector lists with it).
    pub fn selector(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `--lease-label-selector`, checked only for emptiness: the API server parses it, and a
/// syntax error shows up on the first list. An empty selector would count every Lease in
/// the namespace, leader-election Leases included, so it is refused.
pub fn check_selector(selector: &str) -> Result<(), String> {
    if selector.trim().is_empty() {
        return Err(
            "must not be empty: it would count every Lease in the namespace (leader-election \
             Leases too); upstream servers label theirs k8s-app=konnectivity-server"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<LeaseLabels, String> {
        s.parse()
    }

    #[test]
    fn parses_as_upstream() {
        let l = parse("k8s-app=konnectivity-server").unwrap();
        assert_eq!(l.selector(), "k8s-app=konnectivity-server");
        let l = parse(" z = 1 ,a=2,app=").unwrap();
        assert_eq!(l.selector(), "a=2,app=,z=1");
        assert_eq!(l.map()["z"], "1");
    }

    #[test]
    fn refuses_what_upstream_refuses() {
        assert_eq!(parse("").unwrap_err(), "empty string provided");
        assert!(parse("a").unwrap_err().contains("invalid label format: a"));
        assert!(parse("a=b=c").is_err());
        assert!(parse("a=b,").is_err());
        assert!(parse("=b").unwrap_err().contains("empty key"));
    }

    #[test]
    fn selectors_must_not_be_empty() {
        check_selector("k8s-app=konnectivity-server").unwrap();
        check_selector("app in (a,b),!legacy").unwrap();
        assert!(check_selector(" ").is_err());
    }
}
