//! Prometheus's HTTP API, `GET /api/v1/query_range`, over one HTTP/1.0 exchange per query
//! (so the answer is never chunked), with a deadline and a size cap.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Connecting and the whole exchange must finish within this.
const TIMEOUT: Duration = Duration::from_secs(20);
/// An answer larger than this is refused rather than buffered.
const MAX_RESPONSE: u64 = 32 << 20;

/// One series of a range query: its labels and its (Unix seconds, value) points, NaN and
/// infinite values left out (Grafana draws them as gaps too).
#[derive(Debug)]
pub struct RangeSeries {
    pub labels: serde_json::Map<String, Value>,
    pub points: Vec<(f64, f64)>,
}

/// The range query `expr` over `[start, end]` at `step` seconds.
pub async fn query_range(
    prometheus: SocketAddr,
    expr: &str,
    start: f64,
    end: f64,
    step: f64,
) -> anyhow::Result<Vec<RangeSeries>> {
    let path = format!(
        "/api/v1/query_range?query={}&start={start}&end={end}&step={step}",
        encode(expr)
    );
    let body = tokio::time::timeout(TIMEOUT, get(prometheus, &path))
        .await
        .with_context(|| format!("{prometheus}: no answer within {TIMEOUT:?}"))??;
    parse(&body).with_context(|| format!("query {expr:?}"))
}

async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to Prometheus at {addr}"))?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    (&mut stream)
        .take(MAX_RESPONSE + 1)
        .read_to_end(&mut response)
        .await?;
    if response.len() as u64 > MAX_RESPONSE {
        bail!("{addr}: answer larger than {MAX_RESPONSE} bytes");
    }
    let end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("not an HTTP response")?;
    // Prometheus answers errors (400, 422, 503) with the same JSON envelope as results.
    Ok(response[end + 4..].to_vec())
}

fn parse(body: &[u8]) -> anyhow::Result<Vec<RangeSeries>> {
    let answer: Value = serde_json::from_slice(body).context("the answer is not JSON")?;
    if answer["status"] != "success" {
        bail!(
            "Prometheus: {}: {}",
            answer["errorType"].as_str().unwrap_or("error"),
            answer["error"].as_str().unwrap_or("no message")
        );
    }
    if answer["data"]["resultType"] != "matrix" {
        bail!("expected a matrix, got {}", answer["data"]["resultType"]);
    }
    let mut out = Vec::new();
    for series in answer["data"]["result"].as_array().context("no result")? {
        let labels = series["metric"].as_object().cloned().unwrap_or_default();
        let points = series["values"]
            .as_array()
            .context("a series without values")?
            .iter()
            .filter_map(|pair| {
                let t = pair[0].as_f64()?;
                let v: f64 = pair[1].as_str()?.parse().ok()?;
                v.is_finite().then_some((t, v))
            })
            .collect();
        out.push(RangeSeries { labels, points });
    }
    Ok(out)
}

/// Percent-encoding for a query parameter: everything but RFC 3986's unreserved bytes.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_promql() {
        assert_eq!(
            encode("sum by (le) (rate(x{a=\"b\"}[4s]))"),
            "sum%20by%20%28le%29%20%28rate%28x%7Ba%3D%22b%22%7D%5B4s%5D%29%29"
        );
    }

    #[test]
    fn parses_matrices_and_errors() {
        let ok = br#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"instance":"a"},"values":[[10,"1.5"],[11,"NaN"],[12,"+Inf"],[13,"2"]]}]}}"#;
        let series = parse(ok).unwrap();
        assert_eq!(series.len(), 1);
        assert_eq!(series[0].labels["instance"], "a");
        assert_eq!(series[0].points, vec![(10.0, 1.5), (13.0, 2.0)]);
        let bad = br#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#;
        let e = parse(bad).unwrap_err().to_string();
        assert!(e.contains("bad_data") && e.contains("char 3"), "{e}");
    }
}
