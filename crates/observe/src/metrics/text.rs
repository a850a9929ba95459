//! The lexical details of the text exposition format, as Go's `expfmt` writes them.

use std::fmt::Write as _;

/// Formats a sample value or bucket bound like Go's `strconv.FormatFloat(f, 'g', -1, 64)`
/// (which `expfmt` uses): shortest round-trip digits, switching to exponent form below 1e-4
/// and from 1e6 on, with a signed exponent of at least two digits (`1e-06`, `1.048576e+06`).
pub(super) fn go_float(f: f64) -> String {
    if f == 0.0 {
        return "0".to_owned();
    }
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    // Rust's `{:e}` also yields the shortest round-trip digits; only the layout differs.
    let sci = format!("{:e}", f.abs());
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return sci;
    };
    let Ok(exp) = exp.parse::<i32>() else {
        return sci;
    };
    let digits = mantissa.replace('.', "");
    let mut out = String::with_capacity(digits.len() + 8);
    if f < 0.0 {
        out.push('-');
    }
    if !(-4..6).contains(&exp) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let sign = if exp < 0 { '-' } else { '+' };
        let _ = write!(out, "e{sign}{:02}", exp.unsigned_abs());
    } else if exp < 0 {
        out.push_str("0.");
        for _ in 1..exp.unsigned_abs() {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        // 0 <= exp < 6, so the integer part has exp + 1 digits.
        let int_len = exp.unsigned_abs() as usize + 1;
        if digits.len() <= int_len {
            out.push_str(&digits);
            for _ in digits.len()..int_len {
                out.push('0');
            }
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    }
    out
}

/// Escapes a label value: backslash, double quote and newline.
pub(super) fn push_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Escapes HELP text: backslash and newline (quotes stay as they are there).
pub(super) fn push_help(out: &mut String, help: &str) {
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Metric names as Prometheus allows them: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub(super) fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Label names as Prometheus allows them: `[a-zA-Z_][a-zA-Z0-9_]*`, minus the reserved `__`
/// prefix.
pub(super) fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_match_go_strconv_g() {
        let cases = [
            (0.0, "0"),
            (-0.0, "0"),
            (1.0, "1"),
            (-1.0, "-1"),
            (1e-6, "1e-06"),
            (1e-5, "1e-05"),
            (1e-4, "0.0001"),
            (0.005, "0.005"),
            (0.025, "0.025"),
            (0.1, "0.1"),
            (2.5, "2.5"),
            (12.5, "12.5"),
            (30.0, "30"),
            (86400.0, "86400"),
            (999_999.0, "999999"),
            (1e6, "1e+06"),
            (1_048_576.0, "1.048576e+06"),
            (1_712_345_678.91, "1.71234567891e+09"),
            (-2.5e-7, "-2.5e-07"),
            (1e21, "1e+21"),
            (1e100, "1e+100"),
            (u64::MAX as f64, "1.8446744073709552e+19"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
        ];
        for (value, want) in cases {
            assert_eq!(go_float(value), want, "{value:?}");
        }
    }

    #[test]
    fn escaping() {
        let mut out = String::new();
        push_label_value(&mut out, "a\\b\"c\nd");
        assert_eq!(out, r#"a\\b\"c\nd"#);
        out.clear();
        push_help(&mut out, "a\\b\"c\nd");
        assert_eq!(out, r#"a\\b"c\nd"#);
    }

    #[test]
    fn names() {
        assert!(is_metric_name(
            "konnectivity_network_proxy_server_dial_failure_count"
        ));
        assert!(is_metric_name("a:b"));
        assert!(!is_metric_name("1a"));
        assert!(!is_metric_name(""));
        assert!(!is_metric_name("a-b"));
        assert!(is_label_name("service_method"));
        assert!(!is_label_name("__name"));
        assert!(!is_label_name("a:b"));
    }
}
