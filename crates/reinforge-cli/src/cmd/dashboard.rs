//! `reinforge dashboard RUN_DIR...` (the live page of finished, running or remote runs) and
//! `reinforge plot RUN_DIR... --out curves.png|svg`.

use anyhow::{bail, Context, Result};
use clap::Args;
use reinforge_dashboard::plot::{PlotOptions, XAxis};
use reinforge_dashboard::{DashboardOptions, Run};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct DashboardArgs {
    /// Run directories (each with its metrics.jsonl): one page, the runs overlaid.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// Address to bind: 127.0.0.1 (this machine), or an interface's, which needs --token.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port.
    #[arg(long, default_value_t = reinforge_dashboard::DEFAULT_PORT)]
    port: u16,
    /// Token required on every request when bound beyond loopback (default: the cluster's,
    /// from RAY_AUTH_TOKEN or ~/.ray/auth_token).
    #[arg(long)]
    token: Option<String>,
}

#[derive(Args)]
pub struct PlotArgs {
    /// Run directories: their curves overlaid.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// Metrics, one panel each.
    #[arg(long, value_delimiter = ',', default_value = "critic/score/mean")]
    metrics: Vec<String>,
    /// `step` or `time` (minutes).
    #[arg(long, default_value = "step")]
    x: String,
    /// Exponential smoothing in [0, 1).
    #[arg(long, default_value_t = 0.0)]
    smooth: f64,
    /// Width in pixels.
    #[arg(long, default_value_t = 900)]
    width: u32,
    /// Height of each panel in pixels.
    #[arg(long, default_value_t = 300)]
    panel_height: u32,
    /// The figure: a .png or .svg file.
    #[arg(long)]
    out: PathBuf,
}

fn checked_runs(dirs: &[PathBuf]) -> Result<Vec<Run>> {
    for d in dirs {
        if !d.join("metrics.jsonl").is_file() {
            bail!("{} has no metrics.jsonl: name a run directory (trainer.default_local_dir, e.g. runs/quickstart)", d.display());
        }
    }
    let abs: Vec<PathBuf> = dirs.iter().map(|d| std::path::absolute(d).unwrap_or_else(|_| d.clone())).collect();
    Ok(Run::from_dirs(&abs))
}

pub fn dashboard(a: DashboardArgs) -> Result<ExitCode> {
    let runs = checked_runs(&a.runs)?;
    let loopback = a.host == "localhost" || a.host.parse::<std::net::IpAddr>().is_ok_and(|h| h.is_loopback());
    let token = match (a.token, loopback) {
        (Some(t), _) => Some(t),
        (None, true) => None,
        (None, false) => reinforge_cluster::token::load(None).ok().flatten().map(|t| t.value),
    };
    let shown = token.clone();
    let n = runs.len();
    reinforge_dashboard::serve(
        runs,
        DashboardOptions { host: a.host, port: a.port, any_port_if_taken: false, token },
        |addr| {
            println!("{}", reinforge_dashboard::url(addr, shown.as_deref()));
            eprintln!("dashboard of {n} run(s); Ctrl-C stops it");
        },
        None,
    )?;
    Ok(ExitCode::SUCCESS)
}

pub fn plot(a: PlotArgs) -> Result<ExitCode> {
    let runs = checked_runs(&a.runs)?;
    let x = match a.x.as_str() {
        "step" => XAxis::Step,
        "time" => XAxis::Time,
        other => bail!("--x {other}: use step or time"),
    };
    if !(0.0..1.0).contains(&a.smooth) {
        bail!("--smooth {}: use a weight in [0, 1)", a.smooth);
    }
    if a.width < 200 || a.panel_height < 120 || a.width > 8000 || a.panel_height > 4000 {
        bail!("--width {} --panel-height {}: use 200–8000 and 120–4000 pixels", a.width, a.panel_height);
    }
    let opts = PlotOptions { metrics: a.metrics, x, smooth: a.smooth, width: a.width, panel_height: a.panel_height };
    reinforge_dashboard::plot::plot(&runs, &opts, &a.out).with_context(|| format!("plotting {}", a.out.display()))?;
    eprintln!("wrote {} ({} metric(s) × {} run(s))", a.out.display(), opts.metrics.len(), runs.len());
    Ok(ExitCode::SUCCESS)
}
