//! The routing file (`--routing-config`): the destination topology, client affinity and
//! outlier ejection. YAML, validated as a whole at start-up, so a typo stops the server with
//! the field's name instead of routing silently differently.
//!
//! ```yaml
//! zones:
//!   - zone: eu-1a
//!     region: eu-1
//!     cidrs: ["10.1.0.0/16", "fd00:1::/64"]
//! affinity: client          # or none (the default)
//! ejection:
//!   consecutive_failures: 5 # 0 disables ejection
//!   base_seconds: 10
//!   max_seconds: 300
//! ```

use std::time::Duration;

use serde::Deserialize;
use tether_policy::Cidr;

pub use crate::backend::outlier::EjectionConfig;
pub use crate::backend::selection::ZoneRule;

/// Selection settings beyond `--proxy-strategies`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutingConfig {
    /// CIDR → zone rules; the longest matching prefix wins.
    pub zone_rules: Vec<ZoneRule>,
    /// Keep each client (by its proven identity) on one agent while that agent stays.
    pub client_affinity: bool,
    pub ejection: EjectionConfig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    zones: Vec<ZoneEntry>,
    #[serde(default)]
    affinity: Option<String>,
    #[serde(default)]
    ejection: Option<EjectionEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ZoneEntry {
    zone: String,
    #[serde(default)]
    region: Option<String>,
    cidrs: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EjectionEntry {
    consecutive_failures: u32,
    base_seconds: f64,
    max_seconds: f64,
}

impl RoutingConfig {
    /// Parses and validates a routing file's text; errors name the entry at fault.
    pub fn from_yaml(text: &str) -> Result<Self, String> {
        let file: File = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        let mut zone_rules = Vec::new();
        for (n, entry) in file.zones.into_iter().enumerate() {
            let at = || format!("zones[{n}] ({:?})", entry.zone);
            if entry.zone.is_empty() {
                return Err(format!("zones[{n}]: zone must not be empty"));
            }
            if entry.cidrs.is_empty() {
                return Err(format!("{}: cidrs must list at least one block", at()));
            }
            for text in &entry.cidrs {
                let cidr = Cidr::parse(text).map_err(|e| format!("{}: {e}", at()))?;
                if let Some(other) = zone_rules.iter().find(|r: &&ZoneRule| r.cidr == cidr) {
                    return Err(format!(
                        "{}: {cidr} is already mapped to zone {:?}",
                        at(),
                        other.zone
                    ));
                }
                zone_rules.push(ZoneRule {
                    cidr,
                    zone: entry.zone.clone(),
                    region: entry.region.clone(),
                });
            }
        }
        let client_affinity = match file.affinity.as_deref() {
            None | Some("none") => false,
            Some("client") => true,
            Some(other) => {
                return Err(format!(
                    "affinity: expected \"client\" or \"none\", got {other:?}"
                ));
            }
        };
        let ejection = match file.ejection {
            None => EjectionConfig::default(),
            Some(e) => {
                let seconds = |what: &str, s: f64| {
                    Duration::try_from_secs_f64(s)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .ok_or_else(|| {
                            format!(
                                "ejection.{what}: expected a positive number of seconds, got {s}"
                            )
                        })
                };
                let base = seconds("base_seconds", e.base_seconds)?;
                let max = seconds("max_seconds", e.max_seconds)?;
                if max < base {
                    return Err("ejection.max_seconds must not be less than base_seconds".into());
                }
                EjectionConfig {
                    consecutive_failures: e.consecutive_failures,
                    base_ejection: base,
                    max_ejection: max,
                }
            }
        };
        Ok(Self {
            zone_rules,
            client_affinity,
            ejection,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_file() {
        let c = RoutingConfig::from_yaml(
            "zones:\n  - zone: a\n    region: r\n    cidrs: [\"10.1.0.0/16\", \"fd00:1::/64\"]\n  - zone: b\n    cidrs: [10.2.0.0/16]\naffinity: client\nejection:\n  consecutive_failures: 3\n  base_seconds: 0.5\n  max_seconds: 60\n",
        )
        .unwrap();
        assert_eq!(c.zone_rules.len(), 3);
        assert_eq!(c.zone_rules[1].zone, "a");
        assert_eq!(c.zone_rules[1].region.as_deref(), Some("r"));
        assert_eq!(c.zone_rules[2].region, None);
        assert!(c.client_affinity);
        assert_eq!(c.ejection.base_ejection, Duration::from_millis(500));
        assert_eq!(
            RoutingConfig::from_yaml("{}").unwrap(),
            RoutingConfig::default()
        );
    }

    #[test]
    fn errors_name_the_entry() {
        for (text, expected) in [
            (
                "zones:\n  - zone: a\n    cidrs: [10.0.0.1/8]\n",
                "zones[0] (\"a\"): \"10.0.0.1/8\" has host bits set",
            ),
            ("zones:\n  - zone: a\n    cidrs: []\n", "cidrs must list"),
            (
                "zones:\n  - zone: a\n    cidrs: [10.0.0.0/8]\n  - zone: b\n    cidrs: [10.0.0.0/8]\n",
                "already mapped to zone \"a\"",
            ),
            ("affinity: sticky\n", "affinity: expected"),
            (
                "ejection:\n  consecutive_failures: 1\n  base_seconds: 10\n  max_seconds: 1\n",
                "max_seconds",
            ),
            (
                "ejection:\n  consecutive_failures: 1\n  base_seconds: -1\n  max_seconds: 1\n",
                "base_seconds",
            ),
            ("zonez: []\n", "zonez"),
        ] {
            let err = RoutingConfig::from_yaml(text).unwrap_err();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }
}
