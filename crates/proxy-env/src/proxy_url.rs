//! A proxy URL as `HTTPS_PROXY` or `--https-proxy` gives it: parsed the way Go's
//! `httpproxy.parseProxy` does, with the user info percent-decoded for Basic authentication
//! and kept out of every `Display` and `Debug`.

use std::fmt;

/// `http://` or `https://`: plain HTTP to the proxy, or TLS to the proxy first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyScheme {
    Http,
    Https,
}

/// A parsed proxy URL. Its credentials never appear in `Display` or `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    pub scheme: ProxyScheme,
    /// Without brackets for an IPv6 address.
    pub host: String,
    /// The URL's port, else the scheme's (80, 443), as Go's `net/http` transport does.
    pub port: u16,
    /// Percent-decoded user and password (the password is empty when the URL has none, as Go's
    /// `url.Userinfo.Password` returns it).
    credentials: Option<(String, String)>,
}

/// Why a proxy URL does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProxyUrlError {
    #[error("{0:?} is not a URL: {1}")]
    Invalid(String, &'static str),
    #[error(
        "proxy scheme {0:?} is not supported: the agent speaks HTTP CONNECT to an http:// or https:// proxy"
    )]
    Scheme(String),
}

impl ProxyUrl {
    /// Parses `value` as Go's `httpproxy.parseProxy`: a full URL, or else `host[:port]` with
    /// `http://` assumed. Unlike Go, a value with `://` is never retried with `http://` in
    /// front (Go turns `http://h:bad` into a proxy named `http`); its error is reported. The
    /// error never quotes the user info.
    pub fn parse(value: &str) -> Result<Self, ProxyUrlError> {
        let parsed = match GoUrl::parse(value) {
            Ok(url) if !url.scheme.is_empty() && !url.host.is_empty() => url,
            first if !value.contains("://") => GoUrl::parse(&format!("http://{value}"))
                .map_err(|retried| first.err().unwrap_or(retried))?,
            first => first?,
        };
        let scheme = match parsed.scheme.to_ascii_lowercase().as_str() {
            "http" => ProxyScheme::Http,
            "https" => ProxyScheme::Https,
            _ => return Err(ProxyUrlError::Scheme(parsed.scheme)),
        };
        if parsed.host.is_empty() {
            return Err(ProxyUrlError::Invalid(parsed.redacted(), "no proxy host"));
        }
        let port = match parsed.port {
            Some(port) => port,
            None if scheme == ProxyScheme::Https => 443,
            None => 80,
        };
        Ok(Self {
            scheme,
            host: parsed.host,
            port,
            credentials: parsed.credentials,
        })
    }

    /// `user:password` for `Proxy-Authorization: Basic`, when the URL has user info.
    pub fn basic_credentials(&self) -> Option<String> {
        self.credentials
            .as_ref()
            .map(|(user, password)| format!("{user}:{password}"))
    }

    /// The URL with its user info, percent-encoded, for a client that takes the proxy as a
    /// URL and sends the Basic credentials itself (the Kubernetes client). Never log it.
    pub fn with_credentials(&self) -> String {
        let user_info = match &self.credentials {
            Some((user, password)) => format!("{}:{}@", encode(user), encode(password)),
            None => String::new(),
        };
        let scheme = match self.scheme {
            ProxyScheme::Http => "http",
            ProxyScheme::Https => "https",
        };
        format!("{scheme}://{user_info}{}", self.address())
    }

    /// The proxy's `host:port`, bracketed for IPv6, to dial.
    pub fn address(&self) -> String {
        join_host_port(&self.host, self.port)
    }
}

impl fmt::Display for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            ProxyScheme::Http => "http",
            ProxyScheme::Https => "https",
        };
        let user_info = if self.credentials.is_some() {
            "REDACTED@"
        } else {
            ""
        };
        write!(f, "{scheme}://{user_info}{}", self.address())
    }
}

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProxyUrl({self})")
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `host:port`, with brackets around an IPv6 host (Go's `net.JoinHostPort`).
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The parts of Go's `url.Parse` that a proxy URL uses.
struct GoUrl {
    scheme: String,
    host: String,
    port: Option<u16>,
    credentials: Option<(String, String)>,
}

impl GoUrl {
    fn parse(raw: &str) -> Result<Self, ProxyUrlError> {
        let invalid = |why| ProxyUrlError::Invalid(redact_raw(raw), why);
        if raw.bytes().any(|b| b < 0x20 || b == 0x7f || b == b' ') {
            return Err(invalid("control character or space"));
        }
        let (scheme, rest) = split_scheme(raw).map_err(invalid)?;
        // Without "//" there is no authority: Go leaves the host empty (an opaque URL).
        let Some(rest) = rest.strip_prefix("//") else {
            return Ok(Self {
                scheme: scheme.to_owned(),
                host: String::new(),
                port: None,
                credentials: None,
            });
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let (credentials, host_port) = match authority.rfind('@') {
            Some(at) => (
                Some(parse_user_info(&authority[..at]).map_err(invalid)?),
                &authority[at + 1..],
            ),
            None => (None, authority),
        };
        let (host, port) = parse_host_port(host_port).map_err(invalid)?;
        Ok(Self {
            scheme: scheme.to_owned(),
            host,
            port,
            credentials,
        })
    }

    fn redacted(&self) -> String {
        let user_info = if self.credentials.is_some() {
            "REDACTED@"
        } else {
            ""
        };
        format!("{}://{user_info}{}", self.scheme, self.host)
    }
}

/// `raw` with anything before an `@` replaced, for error messages.
fn redact_raw(raw: &str) -> String {
    match raw.rfind('@') {
        Some(at) => {
            let start = raw.find("//").map_or(0, |i| i + 2);
            if start <= at {
                format!("{}REDACTED{}", &raw[..start], &raw[at..])
            } else {
                format!("REDACTED{}", &raw[at..])
            }
        }
        None => raw.to_owned(),
    }
}

/// Go's `getScheme`: letters, digits, `+`, `-`, `.` before the first `:`, starting with a
/// letter; none when the first such character is not allowed there.
fn split_scheme(raw: &str) -> Result<(&str, &str), &'static str> {
    for (i, c) in raw.char_indices() {
        match c {
            'a'..='z' | 'A'..='Z' => {}
            '0'..='9' | '+' | '-' | '.' if i > 0 => {}
            ':' if i == 0 => return Err("missing protocol scheme"),
            ':' => return Ok((&raw[..i], &raw[i + 1..])),
            _ => return Ok(("", raw)),
        }
    }
    Ok(("", raw))
}

/// `user[:password]`, each percent-decoded (Go's `url.User`/`url.UserPassword`).
fn parse_user_info(info: &str) -> Result<(String, String), &'static str> {
    let allowed =
        |c: char| c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c) || !c.is_ascii();
    if !info.chars().all(allowed) {
        return Err("invalid character in user info");
    }
    let (user, password) = info.split_once(':').unwrap_or((info, ""));
    Ok((percent_decode(user)?, percent_decode(password)?))
}

/// `%XX` escapes decoded; `+` stays `+` (Go's `unescape` in user-info mode).
fn percent_decode(s: &str) -> Result<String, &'static str> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                .ok_or("invalid URL escape")?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| "invalid URL escape")?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "user info is not UTF-8 after decoding")
}

/// `host[:port]` or `[v6][:port]` (Go's `parseHost` and `validOptionalPort`); the port must
/// fit 16 bits here, where Go would fail only at the dial.
fn parse_host_port(host_port: &str) -> Result<(String, Option<u16>), &'static str> {
    let (host, port) = if let Some(rest) = host_port.strip_prefix('[') {
        let end = rest.find(']').ok_or("missing ']' in host")?;
        let port = &rest[end + 1..];
        if !port.is_empty() && !port.starts_with(':') {
            return Err("invalid port after host");
        }
        (&rest[..end], port.strip_prefix(':'))
    } else {
        match host_port.rfind(':') {
            Some(colon) => (&host_port[..colon], Some(&host_port[colon + 1..])),
            None => (host_port, None),
        }
    };
    if host.contains(['[', ']', '%', '@']) || (!host_port.starts_with('[') && host.contains(':')) {
        return Err("invalid character in host");
    }
    let port = match port {
        None | Some("") => None,
        Some(port) if port.bytes().all(|b| b.is_ascii_digit()) => {
            Some(port.parse::<u16>().map_err(|_| "port out of range")?)
        }
        Some(_) => return Err("invalid port"),
    };
    Ok((host.to_ascii_lowercase(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(value: &str) -> ProxyUrl {
        ProxyUrl::parse(value).unwrap_or_else(|e| panic!("{value:?}: {e}"))
    }

    #[test]
    fn full_urls_and_default_ports() {
        let url = parsed("http://proxy.corp:3128");
        assert_eq!(
            (url.scheme, url.host.as_str(), url.port),
            (ProxyScheme::Http, "proxy.corp", 3128)
        );
        assert_eq!(parsed("http://proxy.corp").port, 80);
        assert_eq!(parsed("https://proxy.corp").port, 443);
        assert_eq!(
            parsed("HTTPS://Proxy.Corp:8443/ignored?path").to_string(),
            "https://proxy.corp:8443"
        );
        let v6 = parsed("http://[::1]:3128");
        assert_eq!(
            (v6.host.as_str(), v6.address()),
            ("::1", "[::1]:3128".to_owned())
        );
        assert_eq!(parsed("http://[fd00::1]").address(), "[fd00::1]:80");
    }

    /// httpproxy's own cases (proxy_test.go): a bare `host:port` or host means `http://`.
    #[test]
    fn without_a_scheme_http_is_assumed() {
        for (value, address) in [
            ("cache.corp.example.com:1234", "cache.corp.example.com:1234"),
            ("cache.corp.example.com", "cache.corp.example.com:80"),
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            ("[::1]:3128", "[::1]:3128"),
        ] {
            let url = parsed(value);
            assert_eq!(
                (url.scheme, url.address()),
                (ProxyScheme::Http, address.to_owned()),
                "{value}"
            );
        }
        // "user:pass@host:port" parses as http:// with credentials.
        let url = parsed("user:secret@proxy:3128");
        assert_eq!(url.basic_credentials().as_deref(), Some("user:secret"));
    }

    #[test]
    fn with_credentials_encodes_what_parse_decodes() {
        let url = ProxyUrl::parse("http://al%40ice:p%3Aw@proxy.example:3128").unwrap();
        assert_eq!(
            url.with_credentials(),
            "http://al%40ice:p%3Aw@proxy.example:3128"
        );
        assert_eq!(ProxyUrl::parse(&url.with_credentials()).unwrap(), url);
        let plain = ProxyUrl::parse("[fd00::1]:8080").unwrap();
        assert_eq!(plain.with_credentials(), "http://[fd00::1]:8080");
    }

    #[test]
    fn user_info_is_percent_decoded_and_kept_out_of_display_and_debug() {
        let url = parsed("http://us%65r:p%40ss%3Aw+rd@proxy:3128");
        assert_eq!(url.basic_credentials().as_deref(), Some("user:p@ss:w+rd"));
        // The last '@' ends the user info, as in Go.
        let url = parsed("http://me@corp:p@ss@proxy:3128");
        assert_eq!(url.basic_credentials().as_deref(), Some("me@corp:p@ss"));
        assert_eq!(url.host, "proxy");
        for shown in [url.to_string(), format!("{url:?}"), format!("{url:#?}")] {
            assert!(
                !shown.contains("p@ss") && !shown.contains("corp:"),
                "{shown}"
            );
            assert!(shown.contains("REDACTED@proxy:3128"), "{shown}");
        }
        // A user without a password authenticates with an empty one (Go's Password()).
        assert_eq!(
            parsed("http://alice@proxy").basic_credentials().as_deref(),
            Some("alice:")
        );
        assert_eq!(parsed("http://proxy").basic_credentials(), None);
    }

    #[test]
    fn bad_urls_are_refused_without_quoting_credentials() {
        for value in [
            "http://user:p%zzss@proxy:3128",
            "http://user:secret@proxy:notaport",
            "http://user:secret@proxy:70000",
            "http://user:secret@[::1",
            "http://user:se cret@proxy",
        ] {
            let err = ProxyUrl::parse(value).expect_err(value).to_string();
            assert!(
                !err.contains("secret") && !err.contains("p%zzss"),
                "{value}: {err}"
            );
        }
        assert_eq!(
            ProxyUrl::parse("socks5://proxy:1080"),
            Err(ProxyUrlError::Scheme("socks5".into()))
        );
        assert!(ProxyUrl::parse("http://").is_err());
        assert!(ProxyUrl::parse("http://:3128").is_err());
    }
}
