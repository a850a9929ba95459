//! deploy/observability: every metric the dashboard and the alerts query is one that a real
//! tether server or agent exports (scraped, or registered in its `metrics.rs`), and the alerts pass `promtool check rules` and their
//! `promtool test rules` unit tests.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use tether_client::{Transport, dial_http_connect};
use tether_testkit::targets::refused_addr;
use tether_testkit::{AgentOptions, ServerOptions, Stack};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/observability")
}

/// The PromQL expressions of the dashboard's panels.
fn dashboard_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(deploy_dir().join("tether-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().expect("expr").to_owned());
        }
    }
    exprs
}

/// The PrometheusRule's `spec`: a plain Prometheus rule file.
fn rules_spec() -> serde_json::Value {
    let text = std::fs::read_to_string(deploy_dir().join("tether-alerts.yaml")).unwrap();
    let rule: serde_json::Value = serde_saphyr::from_str(&text).expect("alerts YAML");
    assert_eq!(rule["kind"], "PrometheusRule");
    rule["spec"].clone()
}

fn rule_exprs() -> Vec<String> {
    let spec = rules_spec();
    let mut exprs = Vec::new();
    for group in spec["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            exprs.push(rule["expr"].as_str().expect("expr").to_owned());
        }
    }
    exprs
}

/// Metric names in a PromQL expression: identifiers that are not functions, keywords,
/// numbers, label names or matchers (inside `{}`), ranges (`[]`), grouping label lists or
/// strings.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: [&str; 6] = ["and", "or", "unless", "bool", "offset", "atan2"];
    // Aggregations may take `by (...)` before their parentheses.
    const AGGREGATIONS: [&str; 14] = [
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "limitk",
        "limit_ratio",
    ];
    const GROUPING: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let skip_to = |i: usize, close: char| {
        chars[i..]
            .iter()
            .position(|&c| c == close)
            .map_or(chars.len(), |p| i + p + 1)
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' => i = skip_to(i + 1, c),
            '{' => i = skip_to(i, '}'),
            '[' => i = skip_to(i, ']'),
            c if c.is_ascii_digit() || c == '.' => {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut next = i;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                let called = chars.get(next) == Some(&'(');
                if GROUPING.contains(&word.as_str()) && called {
                    i = skip_to(next, ')');
                } else if !called
                    && !KEYWORDS.contains(&word.as_str())
                    && !AGGREGATIONS.contains(&word.as_str())
                {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// Sample names a scrape can contain: every `# TYPE` name, with a histogram's series.
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        names.insert(name.to_owned());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// Names registered in a crate's `metrics.rs`: `name("x")` under its `PREFIX`, and literal
/// `tether_` names. Labelled families appear in a scrape only once a series exists (a stream
/// error, say), so the scrape alone does not list them all.
fn registered(source: &str) -> BTreeSet<String> {
    let prefix = source
        .split("const PREFIX: &str = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("PREFIX");
    let mut names = BTreeSet::new();
    for piece in source.split("name(\"").skip(1) {
        let suffix = piece.split('"').next().unwrap();
        names.insert(format!("{prefix}{suffix}"));
    }
    for piece in source.split("\"tether_").skip(1) {
        names.insert(format!("tether_{}", piece.split('"').next().unwrap()));
    }
    names
}

fn registered_in_sources() -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut names = BTreeSet::new();
    for file in [
        "crates/server/src/metrics.rs",
        "crates/agent/src/metrics.rs",
    ] {
        names.extend(registered(
            &std::fs::read_to_string(root.join(file)).unwrap(),
        ));
    }
    // The resume metrics both sides register from one place, as `tether_{side}_NAME`.
    let resume = std::fs::read_to_string(root.join("crates/tunnel/src/resume.rs")).unwrap();
    for piece in resume.split("name(\"").skip(1) {
        let suffix = piece.split('"').next().unwrap();
        for side in ["server", "agent"] {
            names.insert(format!("tether_{side}_{suffix}"));
        }
    }
    names
}

#[test]
fn metric_names_are_found_in_promql() {
    let names = metric_names(
        "sum by (reason) (rate(a_total{reason=\"x\"}[5m])) / on(instance) group_left(zone) \
         b > 0.5 and histogram_quantile(0.99, sum by (le) (rate(c_bucket[$__rate_interval]))) \
         or vector(0) < bool scalar(count(d))",
    );
    let want: BTreeSet<String> = ["a_total", "b", "c_bucket", "d"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(names, want);
}

#[tokio::test]
async fn dashboard_and_alerts_query_only_exported_metrics() {
    let stack = Stack::start(ServerOptions::http_connect(), AgentOptions::default())
        .await
        .expect("stack");
    // One dial that succeeds and one that fails, so that every labelled series exists.
    let transport = Transport::Unix(stack.server.uds.clone().expect("uds"));
    let tunnel = dial_http_connect(&transport, &stack.echo.addr.to_string()).await;
    drop(tunnel.expect("dial the echo target"));
    let refused = dial_http_connect(&transport, &refused_addr().to_string()).await;
    assert!(refused.is_err());

    let mut exported_names = exported(&stack.server.metrics().await.unwrap());
    exported_names.extend(exported(&stack.agent.metrics().await.unwrap()));
    assert!(exported_names.contains("konnectivity_network_proxy_server_ready_backends"));
    let registered = registered_in_sources();
    assert!(registered.contains("konnectivity_network_proxy_server_stream_errors_total"));
    assert!(registered.contains("tether_server_agent_queued_bytes"));
    exported_names.extend(registered);

    let mut used = BTreeSet::new();
    for (source, exprs) in [("dashboard", dashboard_exprs()), ("alerts", rule_exprs())] {
        assert!(!exprs.is_empty(), "{source} has no expressions");
        for expr in exprs {
            let names = metric_names(&expr);
            assert!(!names.is_empty(), "{source}: no metric in {expr}");
            let unknown: Vec<_> = names.difference(&exported_names).collect();
            assert!(
                unknown.is_empty(),
                "{source}: {unknown:?} not exported, in {expr}"
            );
            used.extend(names);
        }
    }
    // What the dashboard and alerts promise to cover.
    for needed in [
        "konnectivity_network_proxy_server_ready_backend_connections",
        "konnectivity_network_proxy_server_dial_failure_count",
        "konnectivity_network_proxy_server_dial_duration_seconds_bucket",
        "konnectivity_network_proxy_server_established_connections",
        "konnectivity_network_proxy_server_pending_backend_dials",
        "konnectivity_network_proxy_agent_open_server_connections",
        "konnectivity_network_proxy_agent_known_server_count",
        "tether_server_agent_queued_bytes",
        "tether_server_connection_closes_total",
    ] {
        assert!(used.contains(needed), "nothing queries {needed}");
    }
}

/// promtool at the version interop/promtool/go.mod pins, built on first use.
fn promtool() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../interop/build-promtool.sh");
    let out = Command::new(&script)
        .output()
        .expect("run build-promtool.sh");
    assert!(
        out.status.success(),
        "build-promtool.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn run_promtool(promtool: &Path, dir: &Path, args: &[&str]) -> String {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn alerts_pass_promtool_check_and_unit_tests() {
    let promtool = promtool();
    let dir = tempfile::tempdir().unwrap();
    let rules = serde_json::to_string_pretty(&rules_spec()).unwrap();
    std::fs::write(dir.path().join("rules.json"), rules).unwrap();
    std::fs::copy(
        deploy_dir().join("tests/alerts-test.yaml"),
        dir.path().join("alerts-test.yaml"),
    )
    .unwrap();
    let checked = run_promtool(&promtool, dir.path(), &["check", "rules", "rules.json"]);
    assert!(checked.contains("SUCCESS: 7 rules found"), "{checked}");
    run_promtool(
        &promtool,
        dir.path(),
        &["test", "rules", "alerts-test.yaml"],
    );
}
