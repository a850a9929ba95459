//! The policy file parser: one rule per line, errors carry the line number.

use std::fmt;

use crate::cidr::Cidr;
use crate::rule::{Action, Destination, NameSuffix, PortRange, Rule};

/// More rules than any real policy needs; every dial walks the list.
pub const MAX_RULES: usize = 10_000;

/// A policy file's rules in order, each with the line it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSet {
    rules: Vec<(usize, Rule)>,
}

/// Why a policy file was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based.
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

impl RuleSet {
    /// Parses a file's bytes; text that is not UTF-8 is refused at the line it breaks on.
    pub fn parse_bytes(bytes: &[u8]) -> Result<Self, ParseError> {
        match std::str::from_utf8(bytes) {
            Ok(text) => Self::parse(text),
            Err(e) => {
                let valid = &bytes[..e.valid_up_to()];
                Err(ParseError {
                    line: 1 + valid.iter().filter(|b| **b == b'\n').count(),
                    message: "not UTF-8 text".to_owned(),
                })
            }
        }
    }

    /// Parses policy text. See the crate documentation for the syntax.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        Self::parse_numbered(text.lines().enumerate().map(|(i, line)| (i + 1, line)))
    }

    /// Parses rules that each carry their own line number, for rules kept inside another
    /// file (the server's routing file lists them in YAML), so errors and denials name the
    /// line of that file.
    pub fn parse_numbered<'a>(
        lines: impl IntoIterator<Item = (usize, &'a str)>,
    ) -> Result<Self, ParseError> {
        let mut rules = Vec::new();
        for (line_no, line) in lines {
            let at = |message: String| ParseError {
                line: line_no,
                message,
            };
            let content = line.split_once('#').map_or(line, |(before, _)| before);
            let tokens: Vec<&str> = content.split_whitespace().collect();
            if tokens.is_empty() {
                continue;
            }
            if rules.len() == MAX_RULES {
                return Err(at(format!("more than {MAX_RULES} rules")));
            }
            rules.push((line_no, parse_rule(&tokens).map_err(at)?));
        }
        Ok(Self { rules })
    }

    /// The first rule that matches `dest`, with its line.
    pub(crate) fn first_match(&self, dest: &Destination<'_>) -> Option<(usize, &Rule)> {
        self.rules
            .iter()
            .find(|(_, rule)| rule.matches(dest))
            .map(|(line, rule)| (*line, rule))
    }

    /// The rules in order.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter().map(|(_, rule)| rule)
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// One rule per line, comments dropped: parses back to the same rules.
impl fmt::Display for RuleSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for rule in self.rules() {
            writeln!(f, "{rule}")?;
        }
        Ok(())
    }
}

fn parse_rule(tokens: &[&str]) -> Result<Rule, String> {
    let action = match tokens[0] {
        "allow" => Action::Allow,
        "deny" => Action::Deny,
        other => return Err(format!("expected \"allow\" or \"deny\", found {other:?}")),
    };
    let mut rule = Rule {
        action,
        to: Vec::new(),
        names: Vec::new(),
        ports: Vec::new(),
    };
    match &tokens[1..] {
        [] => {
            return Err(format!(
                "{action} needs conditions (to, name, port) or \"all\""
            ));
        }
        ["all"] => return Ok(rule),
        _ => {}
    }
    let mut rest = &tokens[1..];
    while let [keyword, tail @ ..] = rest {
        let [value, tail @ ..] = tail else {
            return Err(format!("{keyword:?} needs a value"));
        };
        rest = tail;
        let filled = match *keyword {
            "to" => fill(&mut rule.to, value, Cidr::parse)?,
            "name" => fill(&mut rule.names, value, NameSuffix::parse)?,
            "port" => fill(&mut rule.ports, value, parse_ports)?,
            "all" => return Err("\"all\" stands alone: it cannot have conditions".to_owned()),
            other => {
                return Err(format!(
                    "unknown condition {other:?} (expected to, name or port)"
                ));
            }
        };
        if !filled {
            return Err(format!(
                "{keyword:?} given twice (use a comma-separated list)"
            ));
        }
    }
    Ok(rule)
}

/// Parses a comma-separated list into an empty `slot`; `false` if it was already filled.
fn fill<T>(
    slot: &mut Vec<T>,
    list: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<bool, String> {
    if !slot.is_empty() {
        return Ok(false);
    }
    for item in list.split(',') {
        if item.is_empty() {
            return Err(format!("empty item in list {list:?}"));
        }
        slot.push(parse(item)?);
    }
    Ok(true)
}

fn parse_ports(text: &str) -> Result<PortRange, String> {
    let port = |p: &str| {
        Some(p)
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| format!("{p:?} is not a port (0 to 65535)"))
    };
    let (first, last) = match text.split_once('-') {
        Some((first, last)) => (port(first)?, port(last)?),
        None => (port(text)?, port(text)?),
    };
    if first > last {
        return Err(format!("port range {text:?} runs backwards"));
    }
    Ok(PortRange { first, last })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example_and_prints_it_back() {
        let text = "\
# Cluster networks only.
deny to 10.0.0.0/24 port 2379-2380   # etcd peers
allow to 10.0.0.0/8,fd00::/8 port 443,6443,10250
allow name svc.cluster.local

deny all
";
        let set = RuleSet::parse(text).unwrap();
        let lines: Vec<usize> = set.rules.iter().map(|(line, _)| *line).collect();
        assert_eq!(lines, [2, 3, 4, 6]);
        let printed = set.to_string();
        assert_eq!(
            printed,
            "deny to 10.0.0.0/24 port 2379-2380\n\
             allow to 10.0.0.0/8,fd00::/8 port 443,6443,10250\n\
             allow name svc.cluster.local\n\
             deny all\n"
        );
        assert_eq!(
            RuleSet::parse(&printed)
                .unwrap()
                .rules()
                .collect::<Vec<_>>(),
            set.rules().collect::<Vec<_>>()
        );
    }

    #[test]
    fn errors_name_the_line_and_the_problem() {
        let cases = [
            ("allow all\npermit all", 2, "expected \"allow\" or \"deny\""),
            ("\n\ndeny", 3, "needs conditions"),
            ("deny to", 1, "\"to\" needs a value"),
            ("deny to 10.0.0.1/8", 1, "did you mean 10.0.0.0/8"),
            ("deny port 80 port 81", 1, "given twice"),
            ("deny port 90-80", 1, "runs backwards"),
            ("deny port 65536", 1, "not a port"),
            ("deny port 80,,81", 1, "empty item"),
            ("deny host x", 1, "unknown condition \"host\""),
            ("deny all port 80", 1, "stands alone"),
            ("deny name *.x", 1, "not a DNS name suffix"),
        ];
        for (text, line, message) in cases {
            let e = RuleSet::parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.message.contains(message), "{text:?}: {e}");
            assert!(e.to_string().starts_with(&format!("line {line}: ")));
        }
        let e = RuleSet::parse_bytes(b"allow all\ndeny \xff all\n").unwrap_err();
        assert_eq!((e.line, e.message.as_str()), (2, "not UTF-8 text"));
    }
}
