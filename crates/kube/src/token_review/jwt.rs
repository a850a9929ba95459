//! What can be told about a token without the API server: its shape as a JWT, its audience
//! and its validity period. A token that fails here is refused at once (it could never pass a
//! TokenReview for this audience), so a flood of junk costs no review; one that passes still
//! goes to the API server, which alone checks the signature, so nothing read here is trusted
//! beyond refusing or shortening how long a result is cached.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;

/// Longest token examined; ServiceAccount tokens are about 1 KiB.
const MAX_TOKEN: usize = 16 * 1024;
/// Clock skew allowed on `exp` and `nbf`, as kube-apiserver allows (`jwt.DefaultLeeway`).
pub(crate) const LEEWAY: Duration = Duration::from_secs(60);

#[derive(serde::Deserialize)]
struct Header {
    alg: String,
}

#[derive(serde::Deserialize)]
struct Claims {
    #[serde(default)]
    aud: Option<Audience>,
    exp: Option<f64>,
    nbf: Option<f64>,
}

/// `aud` is one string or a list of them (RFC 7519 §4.1.3).
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Audience {
    fn contains(&self, audience: &str) -> bool {
        match self {
            Self::One(one) => one == audience,
            Self::Many(many) => many.iter().any(|a| a == audience),
        }
    }
}

/// Refuses a token that cannot pass a TokenReview for `audience` at `now`: not a JWT (three
/// base64url parts, a JSON header naming an algorithm, JSON claims), not issued for
/// `audience`, expired or not yet valid (beyond [`LEEWAY`]). Legacy Secret-based tokens carry
/// no audience, and the API server refuses them for any audience but its own, so they fail
/// here as they would there.
pub(crate) fn precheck(token: &str, audience: &str, now: SystemTime) -> Result<(), String> {
    if token.len() > MAX_TOKEN {
        return Err(format!(
            "the token is {} bytes long, more than any ServiceAccount token ({MAX_TOKEN})",
            token.len()
        ));
    }
    let not_jwt = |what: &str| Err(format!("the token is not a JWT: {what}"));
    let mut parts = token.split('.');
    let (Some(header), Some(claims), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return not_jwt("it does not have three dot-separated parts");
    };
    if signature.is_empty() || decode(signature).is_none() {
        return not_jwt("its signature is not base64url");
    }
    let Some(header) = decode(header).and_then(|h| serde_json::from_slice::<Header>(&h).ok())
    else {
        return not_jwt("its header is not a JSON object naming an algorithm");
    };
    if header.alg.eq_ignore_ascii_case("none") {
        return not_jwt("it is unsigned (alg none)");
    }
    let Some(claims) = decode(claims).and_then(|c| serde_json::from_slice::<Claims>(&c).ok())
    else {
        return not_jwt("its claims are not a JSON object");
    };
    if !claims
        .aud
        .as_ref()
        .is_some_and(|aud| aud.contains(audience))
    {
        return Err(format!(
            "the token is not issued for the audience {audience:?} (--authentication-audience)"
        ));
    }
    let now = seconds(now);
    let leeway = LEEWAY.as_secs_f64();
    if let Some(exp) = claims.exp
        && !(exp.is_finite() && now < exp + leeway)
    {
        return Err("the token has expired".into());
    }
    if let Some(nbf) = claims.nbf
        && !(nbf.is_finite() && nbf <= now + leeway)
    {
        return Err("the token is not valid yet (nbf)".into());
    }
    Ok(())
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
    if payload.len() > MAX_TOKEN {
        return None;
    }
    let exp = serde_json::from_slice::<Claims>(&decode(payload)?)
        .ok()?
        .exp?;
    if !exp.is_finite() {
        return None;
    }
    Some(Duration::from_secs_f64((exp - seconds(now)).max(0.0)))
}

fn decode(part: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .ok()
}

fn seconds(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
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
    fn prechecks_shape_audience_and_validity() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let ok = |claims: &str| precheck(&unsigned_token(claims), "agents", now);
        ok(r#"{"aud":["x","agents"],"exp":1000600,"nbf":999000}"#).unwrap();
        ok(r#"{"aud":"agents","exp":1000600}"#).unwrap();
        ok(r#"{"aud":"agents"}"#).unwrap();
        // Within the leeway either side.
        ok(r#"{"aud":"agents","exp":999950,"nbf":1000050}"#).unwrap();
        for (claims, want) in [
            (r#"{"aud":["x"],"exp":1000600}"#, "audience"),
            (r#"{"exp":1000600}"#, "audience"),
            (r#"{"aud":"agents","exp":999900}"#, "expired"),
            (r#"{"aud":"agents","nbf":1000100}"#, "not valid yet"),
            ("[1]", "claims"),
            ("not json", "claims"),
        ] {
            let why = ok(claims).unwrap_err();
            assert!(why.contains(want), "{claims}: {why}");
        }
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let claims = b64(r#"{"aud":"agents"}"#);
        for (token, want) in [
            ("garbage".to_owned(), "three"),
            ("a.b".to_owned(), "three"),
            ("a.b.c.d".to_owned(), "three"),
            (
                format!("{}.{claims}.", b64(r#"{"alg":"RS256"}"#)),
                "signature",
            ),
            (
                format!("{}.{claims}.!!", b64(r#"{"alg":"RS256"}"#)),
                "signature",
            ),
            (
                format!("{}.{claims}.c2ln", b64(r#"{"typ":"JWT"}"#)),
                "header",
            ),
            (format!("!.{claims}.c2ln"), "header"),
            (
                format!("{}.{claims}.c2ln", b64(r#"{"alg":"none"}"#)),
                "unsigned",
            ),
            ("a".repeat(MAX_TOKEN + 1), "bytes long"),
        ] {
            let why = precheck(&token, "agents", now).unwrap_err();
            assert!(why.contains(want), "{token:.40}: {why}");
        }
    }

    #[test]
    fn no_exp_or_not_a_jwt() {
        let now = tether_observe::time::wall_clock();
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
