//! The expiry of a JWT, read without verifying anything: it only ever shortens how long a
//! review's result is cached, so a forged `exp` can do no more than cost another review.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;

/// Longest token payload decoded; ServiceAccount tokens are about 1 KiB.
const MAX_PAYLOAD: usize = 16 * 1024;

#[derive(serde::Deserialize)]
struct Claims {
    exp: Option<f64>,
}

/// How long until the token's `exp` claim, as of `now`; `None` when the token has no
/// readable `exp` (a legacy Secret-based token, or not a JWT), zero once it has passed.
pub(crate) fn remaining_lifetime(token: &str, now: SystemTime) -> Option<Duration> {
    let mut parts = token.split('.');
    let (Some(_header), Some(payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    if payload.len() > MAX_PAYLOAD {
        return None;
    }
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let exp = serde_json::from_slice::<Claims>(&json).ok()?.exp?;
    if !exp.is_finite() {
        return None;
    }
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs_f64();
    Some(Duration::from_secs_f64((exp - now).max(0.0)))
}

#[cfg(test)]
pub(crate) fn unsigned_token(claims: &str) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.c2lnbmF0dXJl",
        b64.encode(r#"{"alg":"RS256"}"#),
        b64.encode(claims)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_exp() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let token = unsigned_token(r#"{"aud":["x"],"exp":1000600,"sub":"s"}"#);
        assert_eq!(
            remaining_lifetime(&token, now),
            Some(Duration::from_secs(600))
        );
        let expired = unsigned_token(r#"{"exp":999000}"#);
        assert_eq!(remaining_lifetime(&expired, now), Some(Duration::ZERO));
    }

    #[test]
    fn no_exp_or_not_a_jwt() {
        let now = SystemTime::now();
        for token in [
            unsigned_token(r#"{"sub":"legacy"}"#),
            unsigned_token(r#"{"exp":"soon"}"#),
            unsigned_token("not json"),
            "garbage".to_owned(),
            "a.b".to_owned(),
            "a.!!!.c".to_owned(),
            "a.b.c.d".to_owned(),
        ] {
            assert_eq!(remaining_lifetime(&token, now), None, "{token}");
        }
    }
}
