//! `reinforge train`, `reinforge config show`, `reinforge export`.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use reinforge_checkpoint::Resume;
use reinforge_trainer::TrainConfig;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Args)]
pub struct TrainArgs {
    /// The run's TOML config (see examples/).
    config: PathBuf,
    /// Dotted overrides, e.g. actor.lr=1e-6 trainer.total_steps=200.
    overrides: Vec<String>,
    /// `auto` (latest complete checkpoint in the run directory), `none`, or a checkpoint path.
    #[arg(long, default_value = "auto")]
    resume: String,
    /// Run the roles on a Ray cluster (`auto`: the cluster of this node or of the job; or the
    /// head's HOST:PORT). Same as cluster.backend=ray cluster.address=ADDRESS.
    #[arg(long, num_args = 0..=1, default_missing_value = "auto", value_name = "ADDRESS")]
    ray: Option<String>,
    /// Take the run directory even if another live run holds it (that run stops at its next
    /// write). Without it, a held directory is refused and a silent holder is taken over
    /// after trainer.lease_timeout_s.
    #[arg(long)]
    takeover: bool,
}

/// `reinforge worker`: a rank of a worker group, started by Ray on behalf of `reinforge train`.
#[derive(Args)]
pub struct WorkerArgs {}

pub fn worker(_a: WorkerArgs) -> Result<ExitCode> {
    let env = reinforge_trainer::worker::WorkerEnv::from_env()?;
    reinforge_trainer::worker::serve(&env)?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Subcommand)]
pub enum ConfigCmd {
    /// Print the fully resolved config, with every default.
    Show {
        /// The run's TOML config.
        config: PathBuf,
        /// Dotted overrides.
        overrides: Vec<String>,
    },
}

#[derive(Args)]
pub struct ExportArgs {
    /// A checkpoint directory (…/checkpoints/global_step_N).
    checkpoint: PathBuf,
    /// Write a Hugging Face model directory here (must not exist).
    #[arg(long)]
    hf: PathBuf,
}

/// The config a `reinforge train` command line resolves to.
fn load_config(a: &TrainArgs) -> Result<TrainConfig> {
    let mut overrides = a.overrides.clone();
    if let Some(mut addr) = a.ray.clone() {
        // `--ray key=value` took an override as its address (no address contains `=`).
        if addr.contains('=') {
            overrides.push(addr);
            addr = "auto".into();
        }
        overrides.push("cluster.backend=\"ray\"".into());
        overrides.push(format!("cluster.address=\"{addr}\""));
    }
    Ok(TrainConfig::load(&a.config, &overrides)?)
}

/// For `job submit`: if `command` is a `reinforge train` whose run directory can be seen from
/// here (an absolute path, config files relative to `base`) and a live run holds it, the
/// refusal that run would get at its start — the same lease check, made before submitting.
pub fn held_run_dir(command: &[String], base: &Path) -> Option<reinforge_lease::LeaseError> {
    let words: Vec<String> = match command {
        // One word is a shell command line; only plain words are looked into.
        [line] if !line.contains(['\'', '"', '\\', '$', '`']) => line.split_whitespace().map(str::to_string).collect(),
        many => many.to_vec(),
    };
    let (dir, takeover) = run_dir_of(&words, base)?;
    if takeover {
        return None;
    }
    reinforge_lease::inspect(&dir).ok()?.refusal()
}

/// The run directory of the `reinforge train` in `words` (a command line split into words,
/// config files relative to `base`), when it is an absolute path that can be looked at from
/// here; and whether the line asks for `--takeover`.
pub fn run_dir_of(words: &[String], base: &Path) -> Option<(PathBuf, bool)> {
    /// `reinforge train`'s arguments as a parser of their own.
    #[derive(clap::Parser)]
    struct TrainLine {
        #[command(flatten)]
        args: TrainArgs,
    }
    let at = words.windows(2).position(|w| Path::new(&w[0]).file_name().is_some_and(|n| n == "reinforge") && w[1] == "train")?;
    let mut line = TrainLine::try_parse_from(&words[at + 1..]).ok()?.args;
    if line.config.is_relative() {
        line.config = base.join(&line.config);
    }
    let cfg = load_config(&line).ok()?;
    let dir = cfg.out_dir();
    // Relative to wherever Ray starts the job: not something to look at from here.
    dir.is_absolute().then_some((dir, line.takeover))
}

pub fn train(a: TrainArgs) -> Result<ExitCode> {
    let cfg = load_config(&a)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    // First Ctrl-C: finish the step, checkpoint, exit cleanly. Second: exit at once.
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            eprintln!("\ninterrupted again: exiting without a checkpoint");
            std::process::exit(130);
        }
        eprintln!("\ninterrupt: finishing this step and saving a checkpoint (Ctrl-C again to abort)");
    })
    .context("installing the Ctrl-C handler")?;
    let resume: Resume = a.resume.parse().unwrap_or(Resume::Auto);
    eprintln!("run directory: {}", cfg.out_dir().display());
    let start = reinforge_trainer::StartOptions { resume, takeover: a.takeover };
    let summary = reinforge_trainer::train_with(&cfg, &start, stop)?;
    let first = summary.history.iter().find_map(|m| m.get("critic/score/mean"));
    let last = summary.history.iter().rev().find_map(|m| m.get("critic/score/mean"));
    if let (Some(f), Some(l)) = (first, last) {
        eprintln!("reward (critic/score/mean): first step {f:.3}, last step {l:.3}");
    }
    for (i, r) in summary.restarts.iter().enumerate() {
        eprintln!("restart {}: {r}", i + 1);
    }
    Ok(if summary.interrupted { ExitCode::from(130) } else { ExitCode::SUCCESS })
}

pub fn config(c: ConfigCmd) -> Result<ExitCode> {
    match c {
        ConfigCmd::Show { config, overrides } => {
            let cfg = TrainConfig::load(&config, &overrides)?;
            print!("{}", cfg.to_toml());
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn export(a: ExportArgs) -> Result<ExitCode> {
    let out = reinforge_trainer::export_hf(&a.checkpoint, &a.hf)?;
    println!("{}", out.display());
    Ok(ExitCode::SUCCESS)
}
