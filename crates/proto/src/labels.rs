//! The `tether-labels` metadata: an agent's place in the topology, `zone=eu-1a,region=eu-1`.
//!
//! A header of its own rather than keys in `agentidentifiers`: upstream agents refuse
//! unknown identifier keys, and upstream servers read only the metadata keys they know, so
//! an upstream server keeps accepting a tether agent that declares labels.

/// Keys an agent may declare. The agent refuses others at start-up; the server ignores them.
pub const KNOWN_LABELS: [&str; 2] = ["zone", "region"];
/// Longest label value: a Kubernetes label value's limit.
pub const MAX_LABEL_VALUE: usize = 63;

/// Parsed agent labels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels {
    pub zone: Option<String>,
    pub region: Option<String>,
}

impl Labels {
    /// Parses strictly, as the agent does for `--agent-labels`: unknown keys are errors.
    pub fn parse_strict(text: &str) -> Result<Self, String> {
        for pair in text.split(',').filter(|p| !p.is_empty()) {
            let key = pair.split_once('=').map_or(pair, |(k, _)| k).trim();
            if !KNOWN_LABELS.contains(&key) {
                return Err(format!(
                    "unknown agent label {key:?} (expected one of {})",
                    KNOWN_LABELS.join(", ")
                ));
            }
        }
        Self::parse(text)
    }

    /// Parses `key=value` pairs separated by commas; unknown keys are skipped, a repeated
    /// key or a value that is not a label value is an error.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut labels = Self::default();
        for pair in text.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("agent label {pair:?} is not key=value"))?;
            let (key, value) = (key.trim(), value.trim());
            let slot = match key {
                "zone" => &mut labels.zone,
                "region" => &mut labels.region,
                _ => continue,
            };
            if slot.is_some() {
                return Err(format!("agent label {key:?} is given twice"));
            }
            let valid = !value.is_empty()
                && value.len() <= MAX_LABEL_VALUE
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !valid {
                return Err(format!(
                    "agent label {key}={value:?}: expected 1 to {MAX_LABEL_VALUE} letters, digits, '-', '_' or '.'"
                ));
            }
            *slot = Some(value.to_owned());
        }
        Ok(labels)
    }

    /// The header value, empty when there are no labels.
    pub fn to_header(&self) -> String {
        [("zone", &self.zone), ("region", &self.region)]
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_render() {
        let l = Labels::parse_strict("zone=eu-1a, region=eu-1").unwrap();
        assert_eq!(l.zone.as_deref(), Some("eu-1a"));
        assert_eq!(l.region.as_deref(), Some("eu-1"));
        assert_eq!(l.to_header(), "zone=eu-1a,region=eu-1");
        assert_eq!(Labels::parse("").unwrap(), Labels::default());
        assert_eq!(
            Labels::parse("rack=7,zone=a").unwrap().zone.as_deref(),
            Some("a")
        );
        for bad in [
            "rack=7",
            "zone",
            "zone=a,zone=b",
            "zone=",
            "zone=a b",
            &format!("zone={}", "x".repeat(64)),
        ] {
            assert!(Labels::parse_strict(bad).is_err(), "{bad}");
        }
    }
}
