//! The deployable manifests (deploy/helm/tether, deploy/kustomize), checked for real:
//! - the chart passes `helm lint --strict`, and every variant renders, with helm (built from
//!   the Go module proxy by deploy/tests/build-helm.sh) and with `kubectl kustomize`;
//! - a real kube-apiserver accepts every rendered object as rendered, nothing filtered out
//!   (`kubectl apply --server-side --dry-run=server`, which runs admission and schema
//!   validation); `helm install` as the README says installs into it and creates no Pod, and
//!   refuses nodeManifests=true; next to the kubernetes.io task's agent objects it installs
//!   with agent.serviceAccount.create=false and uninstalls leaving them in place;
//! - the node-side documents (static Pod, kube-apiserver patch), rendered apart by `helm
//!   template --set nodeManifests=true`, are valid Pods once in place;
//! - each kustomize overlay (API objects) and node/ directory yields the same objects as the
//!   chart with the matching values;
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

/// The image in every rendering: what deploy/image/build.sh names it by default, and the
/// kustomize base's.
const IMAGE_REPOSITORY: &str = "localhost/tether";

struct Variant {
    name: &'static str,
    helm: &'static [&'static str],
    /// The kustomize overlay that must match the chart with these values.
    overlay: Option<&'static str>,
    /// The deploy/kustomize/node directory that must match the node-side document.
    node: Option<&'static str>,
}

const VARIANTS: &[Variant] = &[
    Variant {
        name: "static-pod",
        helm: &[],
        overlay: Some("static-pod"),
        node: Some("static-pod"),
    },
    Variant {
        name: "static-pod-mtls",
        helm: &["auth.mode=mtls", "auth.agentIdentityBinding=off"],
        overlay: Some("static-pod-mtls"),
        node: Some("static-pod-mtls"),
    },
    Variant {
        name: "sidecar",
        helm: &["server.kind=sidecar"],
        overlay: Some("sidecar"),
        node: Some("sidecar"),
    },
    Variant {
        name: "hosted",
        helm: &["server.kind=deployment"],
        overlay: Some("hosted"),
        node: None,
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
        node: None,
    },
    Variant {
        name: "static-pod-leases",
        helm: &["leases.enabled=true"],
        overlay: None,
        node: None,
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
        node: None,
    },
    Variant {
        name: "static-pod-audit-file",
        helm: &["server.audit.output=file"],
        overlay: None,
        node: None,
    },
    Variant {
        name: "sidecar-audit-file",
        helm: &["server.kind=sidecar", "server.audit.output=file"],
        overlay: None,
        node: None,
    },
    Variant {
        name: "hosted-audit-stdout",
        helm: &["server.kind=deployment", "server.audit.output=stdout"],
        overlay: None,
        node: None,
    },
    Variant {
        name: "hosted-dns-discovery",
        helm: &[
            "server.kind=deployment",
            "server.count=3",
            "agent.serverDiscovery=dns",
        ],
        overlay: None,
        node: None,
    },
    Variant {
        name: "hosted-leases-discovery",
        helm: &[
            "server.kind=deployment",
            "server.count=3",
            "leases.enabled=true",
            "agent.serverDiscovery=leases",
        ],
        overlay: None,
        node: None,
    },
    Variant {
        name: "static-pod-leases-discovery",
        helm: &["leases.enabled=true", "agent.serverDiscovery=leases"],
        overlay: None,
        node: None,
    },
    Variant {
        name: "hosted-peering",
        helm: &[
            "server.kind=deployment",
            "server.count=3",
            "leases.enabled=true",
            "agent.serverDiscovery=leases",
            "peering.enabled=true",
            "agent.serverConnections=1",
            "server.networkPolicy.enabled=true",
        ],
        overlay: None,
        node: None,
    },
    Variant {
        name: "static-pod-peering",
        helm: &[
            "leases.enabled=true",
            "agent.serverDiscovery=leases",
            "peering.enabled=true",
            "agent.serverConnections=1",
        ],
        overlay: None,
        node: None,
    },
    Variant {
        name: "static-pod-mtls-leases",
        helm: &[
            "auth.mode=mtls",
            "auth.agentIdentityBinding=off",
            "leases.enabled=true",
        ],
        overlay: None,
        node: None,
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
    let deadline = tokio::time::Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if tokio::time::Instant::now() > deadline {
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

/// The values every documented command passes: where agents reach the servers, and the image.
fn required_values() -> [String; 2] {
    [
        format!("agent.proxyServerHost={SERVER_HOST}"),
        format!("image.repository={IMAGE_REPOSITORY}"),
    ]
}

/// `helm template tether deploy/helm/tether -n kube-system --set ...`: what `helm install`
/// with the same values applies.
fn helm_template(helm: &Path, sets: &[&str]) -> anyhow::Result<String> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "tether"])
        .arg(repo().join("deploy/helm/tether"))
        .args(["--namespace", "kube-system"]);
    set_values(&mut cmd, sets);
    run(&mut cmd, None)
}

/// `--set` for the values every install needs, then for `sets`.
fn set_values(cmd: &mut Command, sets: &[&str]) {
    for set in required_values()
        .iter()
        .map(String::as_str)
        .chain(sets.iter().copied())
    {
        cmd.args(["--set", set]);
    }
}

/// The helm rendering of a variant, applied as rendered, as kube-apiserver would store it.
async fn helm_objects(
    plane: &ControlPlane,
    helm: &Path,
    variant: &Variant,
) -> anyhow::Result<Vec<Value>> {
    let yaml = helm_template(helm, variant.helm)?;
    dry_run(plane, &yaml)
        .await
        .with_context(|| format!("helm variant {}", variant.name))
}

/// The node-side document of a variant (`helm template ... --set nodeManifests=true`) as the
/// kubelet would read it: the static Pod as rendered; the sidecar patch applied to the
/// stand-in kube-apiserver Pod, as the README's `kubectl patch --local` does.
async fn helm_node_objects(
    plane: &ControlPlane,
    helm: &Path,
    variant: &Variant,
) -> anyhow::Result<Vec<Value>> {
    let sets: Vec<&str> = variant
        .helm
        .iter()
        .copied()
        .chain(["nodeManifests=true"])
        .collect();
    let mut yaml = helm_template(helm, &sets)?;
    if variant.helm.contains(&"server.kind=sidecar") {
        let dir = tempfile::tempdir()?;
        let patch_file = dir.path().join("patch.yaml");
        std::fs::write(&patch_file, &yaml)?;
        yaml = run(
            Command::new(plane.kubectl_path())
                .args(["patch", "--local", "--type=strategic", "-o", "yaml", "-f"])
                .arg(repo().join("deploy/kustomize/node/sidecar/kube-apiserver.yaml"))
                .arg(format!("--patch-file={}", patch_file.display())),
            None,
        )?;
    }
    let objects = dry_run(plane, &yaml)
        .await
        .with_context(|| format!("helm node document of {}", variant.name))?;
    let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    ensure!(
        kinds == ["Pod"],
        "{}: nodeManifests=true renders {kinds:?}, not one Pod",
        variant.name
    );
    Ok(objects)
}

/// Whether kustomize's rendering of `dir` equals helm's objects.
async fn same_as_kustomize(
    plane: &ControlPlane,
    name: &str,
    objects: &[Value],
    dir: &Path,
) -> anyhow::Result<()> {
    let yaml = run(
        Command::new(plane.kubectl_path()).arg("kustomize").arg(dir),
        None,
    )?;
    let kustomized = dry_run(plane, &yaml)
        .await
        .with_context(|| format!("kustomize {}", dir.display()))?;
    let (from_helm, from_kustomize) = (by_key(objects), by_key(&kustomized));
    ensure!(
        from_helm.keys().eq(from_kustomize.keys()),
        "{name}: helm renders {:?}, kustomize {} {:?}",
        from_helm.keys().collect::<Vec<_>>(),
        dir.display(),
        from_kustomize.keys().collect::<Vec<_>>()
    );
    for (key, object) in &from_helm {
        ensure!(
            object == &from_kustomize[key],
            "{name}: {key} differs between helm and kustomize {}:\nhelm: {object}\nkustomize: {}",
            dir.display(),
            from_kustomize[key]
        );
    }
    Ok(())
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
                        Some("status.podIP") => "192.0.2.10".to_owned(),
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
    )
    .context("kube-system allowed explicitly")?;
    // One certificate for every agent proves no node: routing by identifiers is a choice.
    let shared_certificate = helm_template(&helm, &["auth.mode=mtls"]);
    ensure!(
        shared_certificate
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("set auth.agentIdentityBinding=off")),
        "helm rendered mtls agents whose identifiers no certificate proves: {shared_certificate:?}"
    );
    // Without identifiers destHost has no agent, and readiness follows the first strategy.
    let never_ready = helm_template(&helm, &["auth.mode=mtls", "agent.identifiers="]);
    ensure!(
        never_ready
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("Set server.proxyStrategies=default")),
        "helm rendered servers that no agent could make Ready: {never_ready:?}"
    );
    helm_template(
        &helm,
        &[
            "auth.mode=mtls",
            "agent.identifiers=",
            "server.proxyStrategies=default",
        ],
    )
    .context("mtls without identifiers")?;
    for (without, error) in [
        ("agent.proxyServerHost", "agent.proxyServerHost is required"),
        ("image.repository", "image.repository is required"),
    ] {
        let rendered = helm_template_with(&helm, &[format!("{without}=")]);
        ensure!(
            rendered
                .as_ref()
                .is_err_and(|e| format!("{e:#}").contains(error)),
            "helm rendered without {without}: {rendered:?}"
        );
    }
    // values.schema.json: wrong types, misspelt keys and unknown kinds are refused.
    for (set, error) in [
        (
            "agent.proxyServerPort=abc",
            "at '/agent/proxyServerPort': got string, want integer",
        ),
        ("server.count=0", "at '/server/count'"),
        (
            "agent.proxyServerHots=x",
            "additional properties 'proxyServerHots' not allowed",
        ),
        ("server.kind=static", "at '/server/kind'"),
        ("agent.drainSeconds=-1", "at '/agent/drainSeconds'"),
        ("server.audit.output=off", "at '/server/audit/output'"),
        ("server.audit.hostDir=var/log", "at '/server/audit/hostDir'"),
    ] {
        let rendered = helm_template(&helm, &[set]);
        ensure!(
            rendered
                .as_ref()
                .is_err_and(|e| format!("{e:#}").contains(error)),
            "helm rendered {set}: {rendered:?}"
        );
    }
    // An audit file belongs on a control-plane node; a Deployment's pod has no such place.
    let hosted_file = helm_template(
        &helm,
        &["server.kind=deployment", "server.audit.output=file"],
    );
    ensure!(
        hosted_file
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("use server.audit.output=stdout")),
        "helm rendered an audit file for a Deployment: {hosted_file:?}"
    );
    // Node-side documents exist for the static Pod and the sidecar only.
    let hosted = helm_template(&helm, &["server.kind=deployment", "nodeManifests=true"]);
    ensure!(
        hosted.as_ref().is_err_and(
            |e| format!("{e:#}").contains("server.kind=deployment has no node-side document")
        ),
        "nodeManifests=true rendered for a Deployment: {hosted:?}"
    );
    Ok(())
}

/// `helm template` with the required values overridden by `sets` (later --set wins).
fn helm_template_with(helm: &Path, sets: &[String]) -> anyhow::Result<String> {
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    helm_template(helm, &sets)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_render_apply_and_parse() -> anyhow::Result<()> {
    let helm = helm()?;
    let mut lint = Command::new(&helm);
    lint.args(["lint", "--strict"])
        .arg(repo().join("deploy/helm/tether"));
    for set in required_values() {
        lint.args(["--set", &set]);
    }
    run(&mut lint, None).context("helm lint")?;
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

        ensure!(
            !objects.iter().any(|o| o["kind"] == "Pod"),
            "{}: the install's objects hold a Pod",
            variant.name
        );
        if let Some(overlay) = variant.overlay {
            let dir = repo().join("deploy/kustomize/overlays").join(overlay);
            same_as_kustomize(&plane, variant.name, &objects, &dir).await?;
        }
        let mut objects = objects;
        if !variant.helm.contains(&"server.kind=deployment") {
            let node_objects = helm_node_objects(&plane, &helm, variant).await?;
            if let Some(node) = variant.node {
                let dir = repo().join("deploy/kustomize/node").join(node);
                same_as_kustomize(&plane, variant.name, &node_objects, &dir).await?;
            }
            objects.extend(node_objects);
        }
        secure_defaults(&objects).with_context(|| format!("{}: secure defaults", variant.name))?;
        audit_log(variant, &objects).with_context(|| format!("{}: audit log", variant.name))?;
        readiness_and_rollouts(&objects)
            .with_context(|| format!("{}: readiness and rollouts", variant.name))?;
        secrets_readable(&objects).with_context(|| format!("{}: Secret volumes", variant.name))?;
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
    installs_as_documented(&plane, &helm).await
}

/// `helm install` and `uninstall` for real against `plane`, with their own configuration
/// and cache directories.
struct HelmCli<'a> {
    helm: &'a Path,
    plane: &'a ControlPlane,
    home: tempfile::TempDir,
}

impl HelmCli<'_> {
    /// `helm ARGS` on the plane's kube-system, with the required values when `sets` is
    /// `Some` (an install).
    fn run(&self, args: &[&str], sets: Option<&[&str]>) -> anyhow::Result<String> {
        let mut cmd = Command::new(self.helm);
        for (var, dir) in [
            ("HELM_CACHE_HOME", "cache"),
            ("HELM_CONFIG_HOME", "config"),
            ("HELM_DATA_HOME", "data"),
        ] {
            cmd.env(var, self.home.path().join(dir));
        }
        cmd.args(args)
            .arg(format!("--kubeconfig={}", self.plane.kubeconfig.display()))
            .args(["--namespace", "kube-system"]);
        if let Some(sets) = sets {
            set_values(&mut cmd, sets);
        }
        run(&mut cmd, None)
    }

    fn install(&self, sets: &[&str]) -> anyhow::Result<String> {
        let chart = repo().join("deploy/helm/tether");
        let chart = chart.to_str().context("chart path")?;
        self.run(&["install", "tether", chart], Some(sets))
    }

    fn uninstall(&self) -> anyhow::Result<()> {
        self.run(&["uninstall", "tether"], None).map(drop)
    }
}

/// The README's `helm install` in each self-managed variant creates API objects and no Pod
/// (operator trial B2), refuses the node-side documents, and installs beside the kubernetes.io
/// task's agent objects with agent.serviceAccount.create=false, leaving them in place on
/// uninstall (A1: migration and rollback).
async fn installs_as_documented(plane: &ControlPlane, helm: &Path) -> anyhow::Result<()> {
    let cli = HelmCli {
        helm,
        plane,
        home: tempfile::tempdir()?,
    };
    let pods = || async {
        plane
            .kubectl(&["get", "pods", "--all-namespaces", "-o", "name"], None)
            .await
    };
    for sets in [
        &[][..],
        &["server.kind=sidecar"],
        &["server.kind=deployment"],
    ] {
        let notes = cli
            .install(sets)
            .with_context(|| format!("helm install {sets:?}"))?;
        ensure!(notes.contains("NOTES:"), "{sets:?}: {notes}");
        let left = pods().await?;
        ensure!(left.trim().is_empty(), "{sets:?} created Pods: {left}");
        cli.uninstall()?;
    }
    for kind in ["staticPod", "sidecar"] {
        let refused = cli.install(&[&format!("server.kind={kind}"), "nodeManifests=true"]);
        ensure!(
            refused.as_ref().is_err_and(|e| format!("{e:#}")
                .contains("nodeManifests=true renders the server's node-side document for `helm template ... > FILE` only")),
            "helm install took nodeManifests=true for {kind}: {refused:?}"
        );
    }

    // Side by side with upstream's agents, then back to them alone.
    plane
        .apply(include_str!(
            "manifests/kubernetes-io-konnectivity-agent.yaml"
        ))
        .await?;
    let upstream = || async {
        plane
            .kubectl(
                &[
                    "get",
                    "-n",
                    "kube-system",
                    "serviceaccount/konnectivity-agent",
                    "daemonset/konnectivity-agent",
                    "-o",
                    "name",
                ],
                None,
            )
            .await
    };
    let collision = cli.install(&["server.kind=none"]);
    ensure!(
        collision
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("konnectivity-agent")),
        "the chart's ServiceAccount did not collide with the existing one: {collision:?}"
    );
    // A failed install may leave a release record behind.
    let _ = cli.uninstall();
    cli.install(&["server.kind=none", "agent.serviceAccount.create=false"])
        .context("installing beside upstream's agents")?;
    let both = plane
        .kubectl(
            &["get", "daemonsets", "-n", "kube-system", "-o", "name"],
            None,
        )
        .await?;
    ensure!(
        both.lines().collect::<Vec<_>>()
            == [
                "daemonset.apps/konnectivity-agent",
                "daemonset.apps/tether-agent"
            ],
        "{both}"
    );
    cli.uninstall()?;
    let kept = upstream().await?;
    ensure!(
        kept.lines().count() == 2,
        "uninstall took upstream's objects: {kept}"
    );
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

/// Every server container, with its object and the pod spec it is in (a template's, or a
/// static Pod's own).
fn server_containers(objects: &[Value]) -> impl Iterator<Item = (&Value, &Value, &Value)> {
    objects.iter().flat_map(|object| {
        object
            .pointer("/spec/template/spec")
            .or_else(|| object.get("spec"))
            .into_iter()
            .flat_map(move |spec| {
                spec["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|c| c["name"] == "konnectivity-server")
                    .map(move |container| (object, spec, container))
            })
    })
}

/// The server's audit log as server.audit.output asks (issue 27): none by default (a drop-in
/// for upstream writes nothing new); `stdout` is `--audit-log-path=-`; `file` is a file in a
/// writable hostPath directory of its own, the same path in the container and on the node.
fn audit_log(variant: &Variant, objects: &[Value]) -> anyhow::Result<()> {
    let output = variant
        .helm
        .iter()
        .find_map(|set| set.strip_prefix("server.audit.output="))
        .unwrap_or("none");
    let mut servers = 0;
    for (_, spec, container) in server_containers(objects) {
        servers += 1;
        let args: Vec<&str> = container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let paths: Vec<&str> = args
            .iter()
            .filter_map(|a| a.strip_prefix("--audit-log-path="))
            .collect();
        match output {
            "none" => ensure!(paths.is_empty(), "an audit log by default: {args:?}"),
            "stdout" => ensure!(paths == ["-"], "not on standard output: {args:?}"),
            "file" => {
                ensure!(paths.len() == 1, "{args:?}");
                let dir = Path::new(paths[0]).parent().context("no directory")?;
                let mount = container["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|m| m["mountPath"].as_str().map(Path::new) == Some(dir))
                    .with_context(|| format!("nothing mounted at {}", dir.display()))?;
                ensure!(mount["readOnly"] != true, "read-only: {mount}");
                let volume = spec["volumes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|v| v["name"] == mount["name"])
                    .with_context(|| format!("no volume for {mount}"))?;
                ensure!(
                    volume["hostPath"]["path"].as_str().map(Path::new) == Some(dir)
                        && volume["hostPath"]["type"] == "Directory",
                    "not the node's prepared directory: {volume}"
                );
                ensure!(
                    volume["name"] != "audit-log",
                    "kube-apiserver's name: {volume}"
                );
            }
            other => bail!("no check for server.audit.output={other}"),
        }
    }
    ensure!(
        servers > 0 || variant.helm.contains(&"server.kind=none"),
        "no server container"
    );
    Ok(())
}

/// A Secret volume's files belong to root unless the pod sets `fsGroup`: a container that
/// runs as another user reads them only through that group (the modes here are 0440), as the
/// hosted server's TLS Secret on the real node showed when it had none.
fn secrets_readable(objects: &[Value]) -> anyhow::Result<()> {
    for object in objects {
        let Some(spec) = object.pointer("/spec/template/spec") else {
            continue;
        };
        let secret_modes: Vec<i64> = spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.get("secret"))
            .map(|secret| secret["defaultMode"].as_i64().unwrap_or(0o644))
            .collect();
        if secret_modes.iter().all(|mode| mode & 0o004 != 0) {
            continue;
        }
        let fs_group = spec
            .pointer("/securityContext/fsGroup")
            .and_then(Value::as_i64);
        let modes: Vec<String> = secret_modes.iter().map(|m| format!("{m:04o}")).collect();
        for container in spec["containers"].as_array().into_iter().flatten() {
            let group = container
                .pointer("/securityContext/runAsGroup")
                .or_else(|| spec.pointer("/securityContext/runAsGroup"))
                .and_then(Value::as_i64);
            let user = container
                .pointer("/securityContext/runAsUser")
                .or_else(|| spec.pointer("/securityContext/runAsUser"))
                .and_then(Value::as_i64);
            ensure!(
                user == Some(0) || (fs_group.is_some() && fs_group == group),
                "{} {}: container {} runs as uid {user:?} gid {group:?} but the pod's fsGroup is \
                 {fs_group:?}, so it cannot read its Secret volumes (modes {modes:?})",
                object["kind"],
                object["metadata"]["name"],
                container["name"]
            );
        }
    }
    Ok(())
}

/// Readiness that cannot deadlock or ripple, and rollouts that finish (operator trial B1, A8,
/// A9, P8), in the objects as kube-apiserver defaulted them:
/// - agents reach servers that are not Ready yet (a server turns Ready with its first agent),
///   while kube-apiserver's Service keeps routing to Ready servers only;
/// - a server Deployment replaces at least one server at a time (agents that hold
///   server.count servers dial no surge server), its PDB lets NotReady servers go, and every
///   server drains live connections within its pod's grace period;
/// - no readiness probe on the kube-apiserver sidecar (it would make kube-apiserver NotReady);
/// - the agent DaemonSet runs on Linux nodes only, under a name and selector of its own beside
///   the kubernetes.io task's konnectivity-agent, and is ready per /readyz.
fn readiness_and_rollouts(objects: &[Value]) -> anyhow::Result<()> {
    let named = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    };
    if let Some(agents) = named("Service", "konnectivity-server-agents") {
        ensure!(
            agents["spec"]["publishNotReadyAddresses"] == true,
            "agents reach only Ready servers: {agents}"
        );
        let frontend = named("Service", "konnectivity-server").context("no frontend Service")?;
        ensure!(
            frontend["spec"]["publishNotReadyAddresses"] != true,
            "kube-apiserver reaches servers without agents: {frontend}"
        );
    }
    if let Some(deployment) = named("Deployment", "konnectivity-server") {
        let unavailable = &deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"];
        ensure!(
            !matches!(unavailable.as_i64(), Some(0)) && unavailable != "0%",
            "maxUnavailable {unavailable}: a rollout would wait for a surge server no agent dials"
        );
        ensure!(
            deployment.pointer("/spec/template/spec/containers/0/readinessProbe/httpGet/path")
                == Some(&Value::from("/readyz")),
            "the frontend Service would route to servers without agents"
        );
        let pdb = named("PodDisruptionBudget", "konnectivity-server").context("no PDB")?;
        ensure!(
            pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow",
            "a NotReady server would block drains: {pdb}"
        );
    }
    for (object, spec, container) in server_containers(objects) {
        let grace = spec["terminationGracePeriodSeconds"].as_i64().unwrap_or(30);
        let timeout = container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find_map(|a| a.strip_prefix("--graceful-shutdown-timeout="))
            .and_then(|t| t.strip_suffix('s'))
            .and_then(|t| t.parse::<i64>().ok())
            .context("a server without --graceful-shutdown-timeout=Ns")?;
        ensure!(timeout > 0, "live connections are cut at once on SIGTERM");
        if object["metadata"]["name"] == "kube-apiserver" {
            ensure!(
                container.get("readinessProbe").is_none(),
                "the sidecar's readiness would make kube-apiserver NotReady"
            );
        } else {
            ensure!(
                grace > timeout,
                "terminationGracePeriodSeconds {grace} ends the {timeout}s drain early"
            );
        }
    }
    for daemonset in objects.iter().filter(|o| o["kind"] == "DaemonSet") {
        ensure!(
            daemonset["metadata"]["name"] != "konnectivity-agent"
                && daemonset["spec"]["selector"]["matchLabels"]
                    .get("k8s-app")
                    .is_none(),
            "the kubernetes.io task's DaemonSet name or selector: {daemonset}"
        );
        let pod = &daemonset["spec"]["template"]["spec"];
        let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap_or(30);
        let drain = pod["containers"][0]["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find_map(|a| a.strip_prefix("--drain-timeout="))
            .and_then(|t| t.strip_suffix('s'))
            .and_then(|t| t.parse::<i64>().ok())
            .context("an agent without --drain-timeout=Ns waits for SIGKILL on every rollout")?;
        ensure!(
            drain > 0 && grace > drain,
            "terminationGracePeriodSeconds {grace} ends the agent's {drain}s drain early"
        );
        ensure!(
            pod["nodeSelector"]["kubernetes.io/os"] == "linux",
            "agents on Windows nodes: {pod}"
        );
        ensure!(
            pod.pointer("/containers/0/readinessProbe/httpGet/path")
                == Some(&Value::from("/readyz")),
            "agents without readiness: {pod}"
        );
    }
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

/// The chart's files/ are copies, not links (helm warns about links on every command), of
/// deploy/observability's; the image tag it defaults to (its appVersion) and the kustomize
/// base's are the crate's version.
#[test]
fn chart_copies_and_versions_match_their_sources() -> anyhow::Result<()> {
    let chart = repo().join("deploy/helm/tether");
    for name in ["tether-alerts.yaml", "tether-dashboard.json"] {
        let copy = chart.join("files").join(name);
        ensure!(
            !std::fs::symlink_metadata(&copy)?.file_type().is_symlink(),
            "{} is a link",
            copy.display()
        );
        ensure!(
            std::fs::read(&copy)? == std::fs::read(repo().join("deploy/observability").join(name))?,
            "{} differs from deploy/observability/{name}: copy it again",
            copy.display()
        );
    }
    let field = |text: &str, key: &str| -> Option<String> {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().trim_matches('"').to_owned())
    };
    let crate_version = field(
        &std::fs::read_to_string(repo().join("Cargo.toml"))?,
        "version = ",
    )
    .context("no version in Cargo.toml")?;
    let app_version = field(
        &std::fs::read_to_string(chart.join("Chart.yaml"))?,
        "appVersion:",
    )
    .context("no appVersion in Chart.yaml")?;
    ensure!(
        app_version == crate_version,
        "Chart.yaml appVersion {app_version} is not the crate version {crate_version}"
    );
    let base = std::fs::read_to_string(repo().join("deploy/kustomize/base/agent.yaml"))?;
    let image = format!("image: {IMAGE_REPOSITORY}:{crate_version}");
    ensure!(base.contains(&image), "the kustomize base has no {image}");
    Ok(())
}
