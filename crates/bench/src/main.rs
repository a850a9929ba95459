//! `tether-bench`: starts each system on loopback (direct TCP, two plain relays in series
//! with and without TLS between them, tether and upstream Konnectivity in four frontend
//! shapes, OpenSSH `-L`/`-R`, rathole), drives the same workloads through each, and writes a
//! Markdown report with SVG charts. See BENCHMARKS.md.
#![forbid(unsafe_code)]
// A binary: `pub` items are the crate's internal interfaces between modules.
#![allow(unreachable_pub)]

mod binaries;
mod cli;
mod dashboard;
mod machine;
mod plan;
mod procs;
mod progress;
mod relay;
mod report;
mod results;
mod soak;
mod stats;
mod steps;
mod systems;
mod target;
mod workloads;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use tokio::time::Instant;

use cli::{Args, Cmd};
use progress::Progress;
use results::Results;
use systems::Env;
use workloads::FleetMode;

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match args.command {
        // A relay is the smallest forwarder: one thread, no hand-offs between workers.
        Some(Cmd::Relay { .. }) => tokio::runtime::Builder::new_current_thread(),
        _ => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
    }
    .enable_all()
    .build()
    .expect("tokio runtime");
    let result = rt.block_on(async {
        match args.command {
            Some(Cmd::Report { ref dir }) => rewrite_report(dir),
            Some(Cmd::Target { ref listen }) => {
                target::serve(listen).await.map(|()| ExitCode::SUCCESS)
            }
            Some(Cmd::FleetAgents {
                ref servers,
                ref mode,
                from,
                to,
                ref run_id,
                concurrency,
                ref ca,
                ref cert,
                ref key,
            }) => {
                tether_tls::install_default_provider();
                let link = workloads::fanin::Link::Native;
                let spec = async {
                    anyhow::Ok(workloads::fleet::AgentsSpec {
                        servers: servers.clone(),
                        mode: FleetMode::ALL
                            .into_iter()
                            .find(|m| m.name() == mode)
                            .with_context(|| format!("--mode: mesh or k1, not {mode:?}"))?,
                        agents: from..to,
                        run_id: run_id.clone(),
                        concurrency,
                        tls: systems::client_tls(ca, cert, key, link.alpn())?,
                    })
                };
                match spec.await {
                    Ok(spec) => workloads::fleet::serve_agents(spec)
                        .await
                        .map(|()| ExitCode::SUCCESS),
                    Err(e) => Err(e),
                }
            }
            Some(Cmd::Relay {
                ref listen,
                ref to,
                tls_connect,
                tls_accept,
                cut_on_sigusr1,
                ref ca,
                ref cert,
                ref key,
            }) => {
                let files = || relay::TlsFiles {
                    ca: ca.clone().unwrap_or_default(),
                    cert: cert.clone().unwrap_or_default(),
                    key: key.clone().unwrap_or_default(),
                };
                let tls = if tls_connect {
                    relay::Tls::Connect(files())
                } else if tls_accept {
                    relay::Tls::Accept(files())
                } else {
                    relay::Tls::None
                };
                relay::serve(listen, to, tls, cut_on_sigusr1)
                    .await
                    .map(|()| ExitCode::SUCCESS)
            }
            Some(Cmd::Dashboard {
                dashboard: ref file,
                prometheus,
                start,
                end,
                step,
                scrape_interval,
                ref subtitle,
                ref svg,
            }) => dashboard::run(&dashboard::Request {
                dashboard: file.clone(),
                prometheus,
                start,
                end,
                step,
                scrape_interval,
                subtitle: subtitle.clone(),
                out: svg.clone(),
            })
            .await
            .map(|()| ExitCode::SUCCESS),
            Some(Cmd::Soak {
                seed,
                duration,
                servers,
                agents,
                churners,
                upstream,
                upstream_agents,
                upstream_servers,
                leases,
            }) => {
                // Any seed will do; the report names it for a replay.
                let seed = seed.unwrap_or_else(|| {
                    tether_observe::time::wall_clock()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs())
                });
                let options = soak::Options {
                    seed,
                    duration: Duration::from_secs(duration),
                    servers,
                    agents,
                    churners,
                    upstream,
                    upstream_agents,
                    upstream_servers,
                    leases,
                    out: args.out.clone(),
                };
                tokio::select! {
                    r = soak(&args, &options) => r,
                    _ = tokio::signal::ctrl_c() => {
                        eprintln!("tether-bench: interrupted; stopping everything");
                        Ok(ExitCode::from(130))
                    }
                }
            }
            None => {
                tokio::select! {
                    r = bench(&args) => r,
                    _ = tokio::signal::ctrl_c() => {
                        eprintln!("tether-bench: interrupted; stopping everything");
                        Ok(ExitCode::from(130))
                    }
                }
            }
        }
    });
    // Dropping the runtime drops every task, and with them every child process.
    rt.shutdown_timeout(Duration::from_secs(5));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tether-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn rewrite_report(dir: &Path) -> anyhow::Result<ExitCode> {
    let (results, meta, p) = report::saved::load(dir)?;
    report::write(dir, &results, &meta, &p)?;
    eprintln!(
        "tether-bench: report {} written again",
        dir.join("report.md").display()
    );
    Ok(ExitCode::SUCCESS)
}

/// A run's scratch directory (removed at the end unless --keep-work), its certificates and
/// its target process, for the systems it starts.
async fn environment(
    args: &Args,
    bins: systems::Binaries,
) -> anyhow::Result<(Env, procs::Proc, Cleanup)> {
    let work = std::env::temp_dir().join(format!("tether-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let cleanup = Cleanup {
        dir: work.clone(),
        keep: args.keep_work,
    };
    let pki = tether_tls::pki::Pki::generate()?.write_to(&work.join("pki"))?;
    let (target_proc, target) = steps::spawn_target(&work.join("target.log")).await?;
    let env = Env {
        dir: work,
        pki,
        bins,
        target,
        started: Default::default(),
    };
    Ok((env, target_proc, cleanup))
}

/// The chaos soak (`tether-bench soak`): tether servers and agents only.
async fn soak(args: &Args, options: &soak::Options) -> anyhow::Result<ExitCode> {
    tether_tls::install_default_provider();
    let bins = binaries::binaries(args)?;
    let mut imps = vec![systems::Impl::Tether];
    if options.upstream || options.upstream_agents + options.upstream_servers > 0 {
        imps.push(systems::Impl::Upstream);
    }
    let needed: Vec<_> = imps
        .into_iter()
        .map(|imp| systems::System::Konn(imp, systems::Frontend::GrpcUds))
        .collect();
    binaries::check_binaries(&bins, &needed)?;
    let (env, _target, mut cleanup) = environment(args, bins).await?;
    let result = soak::run(&env, options).await;
    // The report names the logs of a failed run: they stay.
    cleanup.keep |= !matches!(result, Ok(code) if code == ExitCode::SUCCESS);
    result
}

/// A benchmark run: plans it from the flags, runs every step, writes the report, and fails
/// when a step failed or a promised figure is missing.
async fn bench(args: &Args) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    tether_tls::install_default_provider();
    let p = plan::profile(args)?;
    let bins = binaries::binaries(args)?;
    let (systems, skipped) = plan::systems(args, &bins)?;
    let workloads = plan::workloads(args)?;
    let want_fds = plan::wanted_fds(&p, &workloads);
    let fds = procs::raise_fd_limit(want_fds);
    if fds < want_fds {
        eprintln!(
            "tether-bench: fd limit is {fds} (wanted {want_fds}); many-connection workloads may fail"
        );
    }
    binaries::check_binaries(&bins, &systems)?;
    for note in &skipped {
        eprintln!("tether-bench: {note}");
    }
    let tasks = plan::tasks(&p, &systems, &workloads, &bins);

    let (env, mut target_proc, _cleanup) = environment(args, bins).await?;
    let (work, target) = (env.dir.clone(), env.target);

    let total: f64 = tasks.iter().map(|t| plan::weight(t, &p)).sum();
    eprintln!(
        "tether-bench: {} systems, {} run(s), {} steps, about {} (estimate); target {target}; work dir {}",
        systems.len(),
        p.runs,
        tasks.len(),
        progress::clock(total),
        work.display()
    );
    let progress = Progress::new(tasks.len(), total);
    let (busy0, own0) = (procs::machine_busy_seconds(), procs::own_cpu_seconds());
    let load0 = machine::loadavg();
    let mut results = Results::default();
    let mut notes = skipped;
    for task in &tasks {
        target_proc.check_alive()?;
        steps::run(task, &env, &p, &progress, &mut results, &mut notes).await;
    }
    let (busy1, own1) = (procs::machine_busy_seconds(), procs::own_cpu_seconds());
    drop(target_proc);

    let mut machine = machine::machine_info().await;
    let wall = started.elapsed().as_secs_f64();
    if let (Some(b0), Some(b1)) = (busy0, busy1) {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let foreign = ((b1 - b0) - (own1 - own0)).max(0.0);
        let line = format!(
            "other processes on the machine used {:.0}% of its {cpus} CPUs during the run ({:.0} CPU s); load average {} at the start, {} at the end",
            100.0 * foreign / (wall * cpus),
            foreign,
            load0,
            machine::loadavg()
        );
        eprintln!("tether-bench: {line}");
        machine.push_str(&format!(
            "
{line}"
        ));
    }

    let meta = report::Meta {
        command: machine::command_line(),
        date: machine::run_cmd("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
            .await
            .trim()
            .to_owned(),
        machine,
        elapsed_secs: started.elapsed().as_secs_f64(),
        quick: args.quick,
        systems: systems.clone(),
        notes,
    };
    report::write(&args.out, &results, &meta, &p)?;
    eprintln!(
        "tether-bench: done in {}; report {}",
        progress::clock(started.elapsed().as_secs_f64()),
        args.out.join("report.md").display()
    );

    // Everything planned must have produced its figures, without errors.
    let missing = plan::missing_figures(&results, &tasks, &p);
    for m in &missing {
        eprintln!("tether-bench: missing figure: {m}");
    }
    if !results.errors.is_empty() {
        eprintln!("tether-bench: {} error(s):", results.errors.len());
        for (s, w, e) in &results.errors {
            eprintln!("  {} · {w}: {e}", s.name());
        }
    }
    Ok(if results.errors.is_empty() && missing.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

struct Cleanup {
    dir: PathBuf,
    keep: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("tether-bench: kept work dir {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
