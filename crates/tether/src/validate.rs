//! Runs `tether validate`: each named file read and checked the way its reader checks it at
//! start-up, all of them reported, with status 1 if any is invalid.

use std::path::Path;
use std::process::ExitCode;

use tether_client::egress::{EgressSelector, EgressSelectorConfiguration, Selection, Transport};

use crate::cli::validate::ValidateArgs;

pub(crate) fn run(args: &ValidateArgs) -> ExitCode {
    let mut reports = Vec::new();
    if let Some(path) = &args.egress_selector_config_file {
        reports.push(("--egress-selector-config-file", path, egress_selector(path)));
    }
    if let Some(path) = &args.routing_config {
        reports.push(("--routing-config", path, routing(path)));
    }
    if let Some(path) = &args.destination_policy {
        reports.push(("--destination-policy", path, destination_policy(path)));
    }
    let mut status = ExitCode::SUCCESS;
    for (flag, path, report) in reports {
        match report {
            Ok(lines) => {
                println!("{flag} {}: valid", path.display());
                for line in lines {
                    println!("  {line}");
                }
            }
            Err(error) => {
                eprintln!("error: {flag} {}: {error}", path.display());
                status = ExitCode::FAILURE;
            }
        }
    }
    status
}

/// kube-apiserver's checks, then tether's client's: what each selection goes through.
fn egress_selector(path: &Path) -> Result<Vec<String>, String> {
    let config = EgressSelectorConfiguration::read(path).map_err(|e| e.to_string())?;
    EgressSelector::new(&config).map_err(|e| e.to_string())?;
    let mut lines = Vec::new();
    for name in [Selection::Cluster, Selection::ControlPlane, Selection::Etcd] {
        let selection = config
            .egress_selections
            .iter()
            .find(|s| s.name.eq_ignore_ascii_case(name.name()));
        let Some(selection) = selection else {
            lines.push(format!("{}: not configured (dials directly)", name.name()));
            continue;
        };
        let connection = &selection.connection;
        let over = match connection.transport.as_ref() {
            Some(Transport { uds: Some(uds), .. }) => {
                format!(" over {}", socket(Path::new(&uds.uds_name)))
            }
            Some(Transport { tcp: Some(tcp), .. }) => format!(" to {}", tcp.url),
            _ => String::new(),
        };
        lines.push(format!(
            "{}: {}{over}",
            name.name(),
            connection.proxy_protocol
        ));
    }
    Ok(lines)
}

/// A proxy's Unix socket, and whether a server listens there now: a missing one is not an
/// error (kube-apiserver may start first), but worth seeing.
fn socket(path: &Path) -> String {
    use std::os::unix::fs::FileTypeExt as _;
    let state = match std::fs::metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => "a socket",
        Ok(_) => "not a socket: is this the server's --uds-name?",
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            "absent: no server has created it yet"
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            "cannot be looked at by this user"
        }
        Err(_) => "cannot be looked at",
    };
    format!("unix socket {} ({state})", path.display())
}

fn routing(path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading it: {e}"))?;
    let routing = tether_server::RoutingConfig::from_yaml(&text)?;
    Ok(vec![format!(
        "{} zone rules, {} tenants, {} destination policies, client affinity {}",
        routing.zone_rules.len(),
        routing.tenants.len(),
        routing.destinations.len(),
        if routing.client_affinity { "on" } else { "off" },
    )])
}

fn destination_policy(path: &Path) -> Result<Vec<String>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading it: {e}"))?;
    let rules = tether_policy::RuleSet::parse_bytes(&bytes).map_err(|e| e.to_string())?;
    Ok(vec![format!(
        "{} rules, after the built-in ones",
        rules.rules().count()
    )])
}
