//! Go's duration syntax, so flags such as `--keepalive-time=1h0m0s` parse and print exactly
//! as upstream's do.

use std::time::Duration;

/// Why a duration string was rejected; the messages follow Go's `time.ParseDuration`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("time: invalid duration {0:?}")]
    Invalid(String),
    #[error("time: missing unit in duration {0:?}")]
    MissingUnit(String),
    #[error("time: unknown unit {unit:?} in duration {input:?}")]
    UnknownUnit { unit: String, input: String },
    #[error("negative duration {0:?} is not allowed")]
    Negative(String),
}

/// Go's int64 nanosecond range, which bounds what upstream accepts.
const MAX_NANOS: u64 = i64::MAX as u64;

/// Parses `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+` (or a bare `0`) like Go's `time.ParseDuration`,
/// including its truncation of fractions and its overflow limit. Negative durations are
/// rejected, since no flag of ours means anything by them.
pub fn parse_go_duration(input: &str) -> Result<Duration, DurationError> {
    let invalid = || DurationError::Invalid(input.to_owned());
    let (negative, mut s) = match input.as_bytes().first() {
        Some(b'-') => (true, &input[1..]),
        Some(b'+') => (false, &input[1..]),
        _ => (false, input),
    };
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        if !s.starts_with(|c: char| c == '.' || c.is_ascii_digit()) {
            return Err(invalid());
        }
        let (int, rest) = leading_int(s).ok_or_else(invalid)?;
        let had_int = rest.len() != s.len();
        s = rest;
        let (mut frac, mut scale, mut had_frac) = (0, 1.0, false);
        if let Some(rest) = s.strip_prefix('.') {
            (frac, scale, s) = leading_fraction(rest);
            had_frac = s.len() != rest.len();
        }
        if !had_int && !had_frac {
            return Err(invalid());
        }
        let unit_len = s
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if unit_len == 0 {
            return Err(DurationError::MissingUnit(input.to_owned()));
        }
        let (unit, rest) = s.split_at(unit_len);
        s = rest;
        let nanos_per_unit = unit_nanos(unit).ok_or_else(|| DurationError::UnknownUnit {
            unit: unit.to_owned(),
            input: input.to_owned(),
        })?;
        // Go allows up to 1<<63 in each step so that the most negative value parses.
        let limit = MAX_NANOS + 1;
        if int > limit / nanos_per_unit {
            return Err(invalid());
        }
        let mut value = int * nanos_per_unit;
        if frac > 0 {
            // Float math is exact enough here: at most an hour's worth of nanoseconds.
            value += (frac as f64 * (nanos_per_unit as f64 / scale)) as u64;
            if value > limit {
                return Err(invalid());
            }
        }
        total += value;
        if total > limit {
            return Err(invalid());
        }
    }
    if negative && total > 0 {
        return Err(DurationError::Negative(input.to_owned()));
    }
    if total > MAX_NANOS {
        return Err(invalid());
    }
    Ok(Duration::from_nanos(total))
}

/// Consumes `[0-9]*`; `None` on overflow past 1<<63.
fn leading_int(s: &str) -> Option<(u64, &str)> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let mut x: u64 = 0;
    for digit in s[..end].bytes() {
        x = x.checked_mul(10)?.checked_add(u64::from(digit - b'0'))?;
        if x > MAX_NANOS + 1 {
            return None;
        }
    }
    Some((x, &s[end..]))
}

/// Consumes `[0-9]*` after a decimal point as `x / scale`, ignoring digits beyond what fits
/// (Go drops them rather than failing).
fn leading_fraction(s: &str) -> (u64, f64, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (mut x, mut scale, mut overflow) = (0u64, 1.0, false);
    for digit in s[..end].bytes() {
        if overflow {
            continue;
        }
        match x.checked_mul(10).map(|x| x + u64::from(digit - b'0')) {
            Some(y) if y <= MAX_NANOS + 1 => {
                x = y;
                scale *= 10.0;
            }
            _ => overflow = true,
        }
    }
    (x, scale, &s[end..])
}

fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => 1,
        // Go accepts the micro sign (U+00B5) and the Greek mu (U+03BC).
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Formats like Go's `Duration.String()`: `0s`, `1.5µs`, `100ms`, `2m30s`, `1h0m0s`.
pub fn format_go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < 1_000_000_000 {
        // Below a second Go picks the largest unit that keeps an integer part.
        let (digits, unit) = if nanos < 1_000 {
            (0, "ns")
        } else if nanos < 1_000_000 {
            (3, "\u{b5}s")
        } else {
            (6, "ms")
        };
        return format!("{}{unit}", decimal(nanos, digits));
    }
    let secs = nanos / 1_000_000_000;
    let mut out = String::new();
    if secs >= 3600 {
        out.push_str(&format!("{}h", secs / 3600));
    }
    if secs >= 60 {
        out.push_str(&format!("{}m", secs / 60 % 60));
    }
    let sub_minute = nanos % 60_000_000_000;
    out.push_str(&decimal(sub_minute, 9));
    out.push('s');
    out
}

/// `v / 10^digits` with trailing fractional zeros (and a bare point) removed.
fn decimal(v: u128, digits: u32) -> String {
    let scale = 10u128.pow(digits);
    let (int, frac) = (v / scale, v % scale);
    if frac == 0 {
        return int.to_string();
    }
    let frac = format!("{frac:0width$}", width = digits as usize);
    format!("{int}.{}", frac.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_syntax() {
        let cases = [
            ("0", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("+0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("-0s", Duration::ZERO),
            ("100ms", Duration::from_millis(100)),
            ("1s", Duration::from_secs(1)),
            ("+5s", Duration::from_secs(5)),
            ("1h0m0s", Duration::from_secs(3600)),
            ("1.5h", Duration::from_secs(5400)),
            ("300us", Duration::from_micros(300)),
            ("1\u{b5}s", Duration::from_micros(1)),
            ("1\u{3bc}s", Duration::from_micros(1)),
            ("2m30s", Duration::from_secs(150)),
            ("1h1m1.001s", Duration::from_millis(3_661_001)),
            (".5s", Duration::from_millis(500)),
            ("5.s", Duration::from_secs(5)),
            ("1.0000000001s", Duration::from_secs(1)),
            (
                "0.3333333333333333333h",
                Duration::from_nanos(1_200_000_000_000),
            ),
            ("3ns2ns", Duration::from_nanos(5)),
            (
                "9223372036854775807ns",
                Duration::from_nanos(i64::MAX as u64),
            ),
            (
                "2562047h47m16.854775807s",
                Duration::from_nanos(i64::MAX as u64),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(parse_go_duration(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn rejects_what_go_rejects_and_negatives() {
        let invalid = |s: &str| DurationError::Invalid(s.to_owned());
        let cases = [
            ("", invalid("")),
            ("-", invalid("-")),
            ("s", invalid("s")),
            (".s", invalid(".s")),
            ("1", DurationError::MissingUnit("1".to_owned())),
            ("1.2.3s", DurationError::MissingUnit("1.2.3s".to_owned())),
            (
                "1x",
                DurationError::UnknownUnit {
                    unit: "x".to_owned(),
                    input: "1x".to_owned(),
                },
            ),
            (
                "1 s",
                DurationError::UnknownUnit {
                    unit: " s".to_owned(),
                    input: "1 s".to_owned(),
                },
            ),
            ("-1s", DurationError::Negative("-1s".to_owned())),
            ("9223372036854775808ns", invalid("9223372036854775808ns")),
            ("2562048h", invalid("2562048h")),
            ("99999999999999999999s", invalid("99999999999999999999s")),
        ];
        for (input, want) in cases {
            assert_eq!(parse_go_duration(input), Err(want), "{input}");
        }
        assert_eq!(
            parse_go_duration("1x").unwrap_err().to_string(),
            r#"time: unknown unit "x" in duration "1x""#
        );
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_nanos(1_500), "1.5\u{b5}s"),
            (Duration::from_micros(300), "300\u{b5}s"),
            (Duration::from_millis(100), "100ms"),
            (Duration::from_nanos(1_100_000), "1.1ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(150), "2m30s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(3_661_001), "1h1m1.001s"),
            (
                Duration::from_nanos(i64::MAX as u64),
                "2562047h47m16.854775807s",
            ),
        ];
        for (d, want) in cases {
            assert_eq!(format_go_duration(d), want, "{d:?}");
            assert_eq!(parse_go_duration(want), Ok(d), "round trip of {want}");
        }
    }
}
