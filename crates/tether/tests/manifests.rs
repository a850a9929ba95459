//! The deployable manifests (deploy/helm/tether, deploy/kustomize), checked for real:
//! - the chart passes `helm lint --strict`, and every variant renders, with helm (built from
//!   the Go module proxy by deploy/tests/build-helm.sh) and with `kubectl kustomize`;
//! - a real kube-apiserver accepts every rendered object (`kubectl apply --server-side
//!   --dry-run=server`, which runs admission and schema validation);
//! - each kustomize overlay yields the same objects as the chart with the matching values;
//! - every tether container's command line goes through the tether binary's own argument
//!   parser and start-up checks, invoked under the container's `command[0]` (`/proxy-server`,
//!   `/proxy-agent`), as the image runs it.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;
use tether_testkit::control_plane::{ControlPlane, ControlPlaneOptions};

/// The agents' server address in every rendering: a name under `.internal`, never resolved,
/// since the agent stops at the missing CA file before it dials.
const SERVER_HOST: &str = "konnectivity.example.internal";

struct Variant {
    name: &'static str,
    helm: &'static [&'static str],
    /// The kustomize overlay that must match the chart with these values.
    overlay: Option<&'static str>,
}

const VARIANTS: &[Variant] = &[
    Variant {
        name: "static-pod",
        helm: &[],
        overlay: Some("static-pod"),
    },
    Variant {
        name: "static-pod-mtls",
        helm: &["auth.mode=mtls", "auth.agentIdentityBinding=off"],
        overlay: Some("static-pod-mtls"),
    },
    Variant {
        name: "sidecar",
        helm: &["server.kind=sidecar"],
        overlay: Some("sidecar"),
    },
    Variant {
        name: "hosted",
        helm: &["server.kind=deployment"],
        overlay: Some("hosted"),
    },
    Variant {
        name: "hosted-mtls",
        helm: &[
            "server.kind=deployment",
            "auth.mode=mtls",
            "auth.agentIdentityBinding=off",
            "monitoring.dashboard.enabled=true",
            "monitoring.prometheusRule.enabled=true",
        ],
        overlay: Some("hosted-mtls"),
    },
    Variant {
        name: "static-pod-leases",
        helm: &["leases.enabled=true"],
        overlay: None,
    },
    Variant {
        name: "hosted-leases-kubeconfig",
        helm: &[
            "server.kind=deployment",
            "server.count=3",
            "leases.enabled=true",
            "server.kubeconfigSecretName=hosted-kubeconfig",
            "server.networkPolicy.enabled=true",
            "server.networkPolicy.nodeCIDRs={192.0.2.0/24}",
            "server.networkPolicy.healthFrom[0].namespaceSelector.matchLabels.name=monitoring",
        ],
        overlay: None,
    },
    Variant {
        name: "static-pod-mtls-leases",
        helm: &[
            "auth.mode=mtls",
            "auth.agentIdentityBinding=off",
            "leases.enabled=true",
        ],
        overlay: None,
    },
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs a command with a deadline; its stdout, or an error with stderr.
fn run(cmd: &mut Command, stdin: Option<&str>) -> anyhow::Result<String> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write as _;
        pipe.write_all(input.as_bytes())?;
    }
    let out = wait_bounded(child, Duration::from_secs(120)).with_context(|| what.clone())?;
    ensure!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// Waits for `child` at most `limit`, killing it after that.
fn wait_bounded(
    mut child: std::process::Child,
    limit: Duration,
) -> anyhow::Result<std::process::Output> {
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if std::time::Instant::now() > deadline {
            child.kill()?;
            child.wait()?;
            bail!("still running after {limit:?}, killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child.wait_with_output()?)
}

/// The helm binary: what deploy/tests/build-helm.sh prints last (seconds when cached).
fn helm() -> anyhow::Result<PathBuf> {
    let out = run(
        Command::new("bash").arg(repo().join("deploy/tests/build-helm.sh")),
        None,
    )?;
    Ok(PathBuf::from(
        out.lines()
            .last()
            .context("build-helm.sh printed nothing")?,
    ))
}

fn helm_template(helm: &Path, sets: &[&str], only: Option<&str>) -> anyhow::Result<String> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "tether"])
        .arg(repo().join("deploy/helm/tether"))
        .args(["--namespace", "kube-system"])
        .args(["--set", &format!("agent.proxyServerHost={SERVER_HOST}")]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    if let Some(template) = only {
        cmd.args(["--show-only", template]);
    }
    run(&mut cmd, None)
}

/// The helm rendering of a variant, as kube-apiserver would store it; for the sidecar, the
/// chart's patch applied to the overlay's stand-in kube-apiserver Pod, as a user would.
async fn helm_objects(
    plane: &ControlPlane,
    helm: &Path,
    variant: &Variant,
) -> anyhow::Result<Vec<Value>> {
    let mut yaml = helm_template(helm, variant.helm, None)?;
    if variant.helm.contains(&"server.kind=sidecar") {
        let patch = helm_template(
            helm,
            variant.helm,
            Some("templates/server-sidecar-patch.yaml"),
        )?;
        let dir = tempfile::tempdir()?;
        let patch_file = dir.path().join("patch.yaml");
        std::fs::write(&patch_file, patch)?;
        let patched = run(
            Command::new(plane.kubectl_path())
                .args(["patch", "--local", "--type=strategic", "-o", "yaml", "-f"])
                .arg(repo().join("deploy/kustomize/overlays/sidecar/kube-apiserver.yaml"))
                .arg(format!("--patch-file={}", patch_file.display())),
            None,
        )?;
        // Replace the patch document with the patched Pod.
        yaml = yaml
            .split("\n---")
            .filter(|doc| !doc.contains("templates/server-sidecar-patch.yaml"))
            .collect::<Vec<_>>()
            .join("\n---");
        yaml.push_str("\n---\n");
        yaml.push_str(&patched);
    }
    dry_run(plane, &yaml)
        .await
        .with_context(|| format!("helm variant {}", variant.name))
}

/// `kubectl apply --server-side --dry-run=server`: the API server validates and defaults
/// every object and returns them, but stores nothing.
async fn dry_run(plane: &ControlPlane, yaml: &str) -> anyhow::Result<Vec<Value>> {
    let out = plane
        .kubectl(
            &[
                "apply",
                "--server-side",
                "--dry-run=server",
                "--field-manager=tether-manifests-test",
                "-o",
                "json",
                "-f",
                "-",
            ],
            Some(yaml),
        )
        .await?;
    let value: Value = serde_json::from_str(&out)?;
    Ok(match value["kind"].as_str() {
        Some("List") => value["items"].as_array().cloned().unwrap_or_default(),
        _ => vec![value],
    })
}

/// An object without what the API server or a renderer adds on its own: server metadata,
/// labels (helm's bookkeeping labels are not in the plain YAML) and status.
fn essence(object: &Value) -> (String, Value) {
    let mut object = object.clone();
    let key = format!(
        "{}/{}/{}",
        object["kind"].as_str().unwrap_or_default(),
        object["metadata"]["namespace"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or_default()
    );
    if let Some(map) = object.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
    }
    if let Some(template) = object.pointer_mut("/spec/template/metadata") {
        *template = Value::Null;
    }
    // The ServiceAccount admission plugin's token volume has a random name.
    let generated = |v: &Value| {
        v["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("kube-api-access-"))
    };
    if let Some(volumes) = object
        .pointer_mut("/spec/volumes")
        .and_then(Value::as_array_mut)
    {
        volumes.retain(|v| !generated(v));
    }
    let containers = object
        .pointer_mut("/spec/containers")
        .and_then(Value::as_array_mut);
    for container in containers.into_iter().flatten() {
        if let Some(mounts) = container["volumeMounts"].as_array_mut() {
            mounts.retain(|v| !generated(v));
        }
    }
    (key, object)
}

fn by_key(objects: &[Value]) -> BTreeMap<String, Value> {
    objects.iter().map(essence).collect()
}

/// Every tether container of `objects`: (where, command line, environment it reads).
fn tether_containers(objects: &[Value]) -> Vec<(String, Vec<String>, BTreeMap<String, String>)> {
    let mut found = Vec::new();
    for object in objects {
        let spec = object
            .pointer("/spec/template/spec")
            .or_else(|| object.get("spec"));
        let containers = spec
            .and_then(|s| s.get("containers"))
            .and_then(Value::as_array);
        for container in containers.into_iter().flatten() {
            let strings = |field: &str| -> Vec<String> {
                container[field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            };
            let mut argv = strings("command");
            argv.extend(strings("args"));
            let program = argv.first().map(|p| p.rsplit('/').next().unwrap_or(p));
            if !matches!(program, Some("proxy-server" | "proxy-agent" | "tether")) {
                continue;
            }
            // Stand-ins for what the kubelet fills in from the downward API.
            let env = container["env"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| {
                    let name = e["name"].as_str()?.to_owned();
                    let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                        Some("spec.nodeName") => "node-a".to_owned(),
                        Some("status.hostIP") => "192.0.2.1".to_owned(),
                        Some("metadata.name") => "konnectivity-server-node-a".to_owned(),
                        Some(other) => panic!("no stand-in for fieldRef {other}"),
                        None => e["value"].as_str()?.to_owned(),
                    };
                    Some((name, value))
                })
                .collect();
            let place = format!(
                "{} {}/{}",
                object["kind"].as_str().unwrap_or_default(),
                object["metadata"]["name"].as_str().unwrap_or_default(),
                container["name"].as_str().unwrap_or_default()
            );
            found.push((place, argv, env));
        }
    }
    found
}

/// `$(VAR)` references expanded as the kubelet does.
fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    env.iter().fold(arg.to_owned(), |arg, (name, value)| {
        arg.replace(&format!("$({name})"), value)
    })
}

/// Runs the tether binary as the container would (argv[0] = `command[0]`, so `/proxy-server`
/// exercises the argv[0] dispatch), with the container's environment only.
/// Passes when every flag parsed and passed every check up to the first file the pod would
/// mount (absent here): what a correct command line gets outside its pod.
fn check_command_line(argv: &[String], env: &BTreeMap<String, String>) -> anyhow::Result<()> {
    let args: Vec<String> = argv[1..].iter().map(|a| expand(a, env)).collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tether"));
    cmd.arg0(&argv[0]).args(&args).env_clear().envs(env);
    if argv[0].rsplit('/').next() == Some("tether") {
        cmd.arg0("tether");
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let out = wait_bounded(child, Duration::from_secs(20))
        .context("the tether binary kept running: it must stop at a missing file")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(2) => bail!("the argument parser refused it: {stderr}"),
        Some(1) if stderr.contains("No such file or directory") => Ok(()),
        _ => bail!("unexpected outcome {}: {stderr}", out.status),
    }
}

/// The checks can fail: a misspelt flag, a bad value and a missing required value are caught.
#[test]
fn the_checks_catch_broken_manifests() -> anyhow::Result<()> {
    let env = BTreeMap::new();
    for argv in [
        &["/proxy-agent", "--proxy-server-hots=127.0.0.1"][..],
        &["/proxy-server", "--keepalive-time=forever"],
        &["/proxy-agent", "--agent-identifiers=hots=node-a"],
    ] {
        let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
        ensure!(
            check_command_line(&argv, &env).is_err(),
            "{argv:?} passed the check"
        );
    }
    let helm = helm()?;
    let shared = helm_template(
        &helm,
        &["leases.enabled=true", "leases.namespace=kube-system"],
        None,
    );
    ensure!(
        shared
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("set leases.allowSharedNamespace=true")),
        "helm rendered Lease permissions on kube-system: {shared:?}"
    );
    helm_template(
        &helm,
        &[
            "leases.enabled=true",
            "leases.namespace=kube-system",
            "leases.allowSharedNamespace=true",
            "leases.createNamespace=false",
        ],
        None,
    )
    .context("kube-system allowed explicitly")?;
    // One certificate for every agent proves no node: routing by identifiers is a choice.
    let shared_certificate = helm_template(&helm, &["auth.mode=mtls"], None);
    ensure!(
        shared_certificate
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("set auth.agentIdentityBinding=off")),
        "helm rendered mtls agents whose identifiers no certificate proves: {shared_certificate:?}"
    );
    helm_template(&helm, &["auth.mode=mtls", "agent.identifiers="], None)
        .context("mtls without identifiers")?;
    let missing_host = helm_template_without_host(&helm);
    ensure!(
        missing_host
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("agent.proxyServerHost is required")),
        "helm rendered without agent.proxyServerHost: {missing_host:?}"
    );
    Ok(())
}

fn helm_template_without_host(helm: &Path) -> anyhow::Result<String> {
    run(
        Command::new(helm)
            .args(["template", "tether"])
            .arg(repo().join("deploy/helm/tether")),
        None,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_render_apply_and_parse() -> anyhow::Result<()> {
    let helm = helm()?;
    run(
        Command::new(&helm)
            .args(["lint", "--strict"])
            .arg(repo().join("deploy/helm/tether"))
            .args(["--set", &format!("agent.proxyServerHost={SERVER_HOST}")]),
        None,
    )
    .context("helm lint")?;
    let plane = ControlPlane::start(ControlPlaneOptions::default()).await?;
    // The PrometheusRule kind, as prometheus-operator's CRD names it (schema left open: the
    // rule file itself is checked by promtool in observability.rs).
    plane
        .apply(include_str!("manifests/prometheusrule-crd.yaml"))
        .await?;
    // What kube-controller-manager (not running here) creates in every namespace; Pod
    // admission looks it up.
    plane
        .apply("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n  namespace: kube-system\n")
        .await?;
    // The chart's own Lease namespace: a dry run creates nothing, so the Roles in it need it
    // to exist.
    plane
        .apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: konnectivity-leases\n")
        .await?;

    let mut checked = 0;
    for variant in VARIANTS {
        let objects = helm_objects(&plane, &helm, variant).await?;
        ensure!(
            !objects.is_empty(),
            "{}: helm rendered nothing",
            variant.name
        );

        if let Some(overlay) = variant.overlay {
            let dir = repo().join("deploy/kustomize/overlays").join(overlay);
            let yaml = run(
                Command::new(plane.kubectl_path())
                    .arg("kustomize")
                    .arg(&dir),
                None,
            )?;
            let kustomized = dry_run(&plane, &yaml)
                .await
                .with_context(|| format!("kustomize overlay {overlay}"))?;
            let (from_helm, from_kustomize) = (by_key(&objects), by_key(&kustomized));
            ensure!(
                from_helm.keys().eq(from_kustomize.keys()),
                "{}: helm renders {:?}, kustomize {:?}",
                variant.name,
                from_helm.keys().collect::<Vec<_>>(),
                from_kustomize.keys().collect::<Vec<_>>()
            );
            for (key, object) in &from_helm {
                ensure!(
                    object == &from_kustomize[key],
                    "{}: {key} differs between helm and kustomize:\nhelm: {object}\nkustomize: {}",
                    variant.name,
                    from_kustomize[key]
                );
            }
        }

        secure_defaults(&objects).with_context(|| format!("{}: secure defaults", variant.name))?;
        let containers = tether_containers(&objects);
        ensure!(
            !containers.is_empty(),
            "{}: no tether container",
            variant.name
        );
        for (place, argv, env) in containers {
            check_command_line(&argv, &env)
                .with_context(|| format!("{}: {place}: {argv:?}", variant.name))?;
            checked += 1;
        }
    }
    eprintln!("checked {checked} tether command lines");
    Ok(())
}

/// What every variant renders with the chart's defaults (issue 25, N4 and N11): no Lease
/// permission in kube-system, agents only listing Leases, token reviews and Node look-ups
/// without system:auth-delegator, reverse dials off, agents with a destination policy that
/// refuses their own ports and with loopback closed, and a static Pod that does not read
/// kube-apiserver's serving key.
fn secure_defaults(objects: &[Value]) -> anyhow::Result<()> {
    let kind = |o: &Value| o["kind"].as_str().unwrap_or_default().to_owned();
    let rules = |o: &Value| o["rules"].as_array().cloned().unwrap_or_default();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    let grants_leases = |rule: &Value| strings(&rule["resources"]).iter().any(|r| r == "leases");
    for object in objects {
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        match kind(object).as_str() {
            "Role" | "ClusterRole" => {
                for rule in rules(object).iter().filter(|r| grants_leases(r)) {
                    ensure!(
                        kind(object) == "Role" && namespace == "konnectivity-leases",
                        "{name} grants Leases outside the Lease namespace: {rule}"
                    );
                    if name == "konnectivity-agent-leases" {
                        ensure!(strings(&rule["verbs"]) == ["list"], "agents: {rule}");
                    }
                }
            }
            "ClusterRoleBinding" | "RoleBinding" => {
                let role = object["roleRef"]["name"].as_str().unwrap_or_default();
                ensure!(role != "system:auth-delegator", "{name} binds {role}");
            }
            _ => {}
        }
    }
    let token_mode = objects.iter().any(|o| {
        kind(o) == "ClusterRole"
            && rules(o)
                .iter()
                .any(|r| strings(&r["resources"]) == ["nodes"] && strings(&r["verbs"]) == ["get"])
            && rules(o)
                .iter()
                .any(|r| strings(&r["resources"]) == ["tokenreviews"])
    });
    for (place, argv, _) in tether_containers(objects) {
        if argv[0].ends_with("proxy-server") {
            ensure!(
                argv.iter().any(|a| a == "--control-plane-endpoints=none"),
                "{place}: reverse dials are not off: {argv:?}"
            );
            ensure!(
                !argv.iter().any(|a| a.contains("/pki/apiserver.")),
                "{place}: kube-apiserver's serving key: {argv:?}"
            );
            if argv
                .iter()
                .any(|a| a.starts_with("--authentication-audience="))
            {
                ensure!(token_mode, "{place}: token mode without its ClusterRole");
            }
        } else {
            for flag in [
                "--destination-policy=/etc/tether/policy/destinations.policy",
                "--allow-loopback-destinations=false",
            ] {
                ensure!(
                    argv.iter().any(|a| a == flag),
                    "{place}: no {flag}: {argv:?}"
                );
            }
        }
    }
    let policy = objects
        .iter()
        .find(|o| {
            kind(o) == "ConfigMap"
                && o["metadata"]["name"] == "konnectivity-agent-destination-policy"
        })
        .context("no destination policy ConfigMap")?;
    let text = policy["data"]["destinations.policy"]
        .as_str()
        .unwrap_or_default();
    let rules: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    ensure!(
        rules == ["deny port 8133,8134", "allow all"],
        "agents' policy: {text:?}"
    );
    tether_policy::RuleSet::parse(text).context("the agents' policy file")?;
    Ok(())
}

/// The image's layout (deploy/image): /proxy-server and /proxy-agent are symbolic links to the
/// tether binary, which picks the subcommand from the name it was started under.
#[test]
fn upstream_names_work_as_symlinks() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    for (name, usage) in [
        ("proxy-server", "Usage: tether server"),
        ("proxy-agent", "Usage: tether agent"),
    ] {
        let link = dir.path().join(name);
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tether"), &link)?;
        let help = run(Command::new(&link).arg("--help"), None)?;
        ensure!(help.contains(usage), "{name} --help: {help}");
    }
    Ok(())
}
