//! `reinforge doctor`: preflight checks on this machine, or on every node of a Ray cluster.

use anyhow::{Context, Result};
use clap::Args;
use reinforge_cluster::doctor::{self, probe::ProbeRequest, Report, Status};
use reinforge_cluster::launch::Launcher;
use reinforge_trainer::TrainConfig;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct DoctorArgs {
    /// The run's TOML config: the checks compare the nodes with what it needs (placement,
    /// memory, checkpoint directory). Without one, the nodes are checked on their own.
    config: Option<PathBuf>,
    /// Dotted overrides, as for `reinforge train`.
    overrides: Vec<String>,
    /// Check every node of the Ray cluster at this address (`auto`: the cluster of this node;
    /// or the head's HOST:PORT). Default: the config's cluster.address when its backend is
    /// `ray`, else RAY_ADDRESS when set, else only this machine.
    #[arg(long)]
    address: Option<String>,
    /// Only this machine, even when a cluster is configured.
    #[arg(long, conflicts_with = "address")]
    local: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Internal: answer one probe round as JSON (run on each node by the doctor).
    #[arg(long, hide = true, value_name = "REQUEST")]
    probe: Option<String>,
}

pub fn run(a: DoctorArgs) -> Result<ExitCode> {
    if let Some(req) = &a.probe {
        let req: ProbeRequest = serde_json::from_str(req).context("reading the probe request")?;
        println!("{}", serde_json::to_string(&doctor::probe::probe(&req))?);
        return Ok(ExitCode::SUCCESS);
    }
    let t0 = Instant::now();
    let cfg = match &a.config {
        Some(path) => Some(TrainConfig::load(path, &a.overrides)?),
        None if !a.overrides.is_empty() => anyhow::bail!("overrides need a config: `reinforge doctor CONFIG {}`", a.overrides.join(" ")),
        None => None,
    };
    let mut req = cfg.as_ref().map(reinforge_trainer::preflight::requirements).unwrap_or_default();
    if cfg.is_none() {
        req.run_dir = std::path::absolute("runs").unwrap_or_else(|_| "runs".into());
    }
    let address = if a.local {
        None
    } else {
        a.address
            .clone()
            .or_else(|| cfg.as_ref().filter(|c| c.cluster.backend == "ray").map(|c| c.cluster.address.clone()))
            .or_else(|| std::env::var("RAY_ADDRESS").ok().filter(|v| !v.is_empty() && !v.starts_with("http")))
    };
    let (checks, nodes) = match &address {
        None => (doctor::local(&req), 1),
        Some(address) => {
            let ray = reinforge_cluster::ray::RayInstall::locate()?;
            eprintln!("doctor: connecting to the Ray cluster at {address} ...");
            let mut launcher = Launcher::start(&ray.python, address, &reinforge_cluster::launch::client_env(), Duration::from_secs(60))
                .with_context(|| format!("connecting to the Ray cluster at {address} (start one with `reinforge cluster start --head`)"))?;
            eprintln!("doctor: {}; probing every node ...", launcher.cluster);
            let port = cfg.as_ref().map_or(0, |c| c.cluster.controller_port);
            let listener = TcpListener::bind(("0.0.0.0", port))
                .with_context(|| format!("the controller's port {port} is taken on this node: free it or set cluster.controller_port"))?;
            let bin = reinforge_cluster::launch::worker_binary()?;
            let checks = doctor::cluster(&req, &mut launcher, &listener, &bin, doctor::PROBE_TIMEOUT)?;
            let nodes = checks.iter().filter_map(|c| c.node.clone()).collect::<std::collections::BTreeSet<_>>().len();
            (checks, nodes)
        }
    };
    let report = Report { checks, nodes, wall_s: t0.elapsed().as_secs_f64() };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(if report.count(Status::Fail) > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
