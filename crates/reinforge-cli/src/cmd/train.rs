//! `reinforge train`, `reinforge config show`, `reinforge export`.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use reinforge_checkpoint::Resume;
use reinforge_compat::{hydra, openrlhf, Source, Translation};
use reinforge_trainer::TrainConfig;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Args)]
pub struct TrainArgs {
    /// The run's TOML config (see examples/); optional with --verl or --openrlhf.
    config: Option<PathBuf>,
    /// Dotted overrides, e.g. actor.lr=1e-6 trainer.total_steps=200 (with --verl: verl's
    /// overrides, as `python3 -m verl.trainer.main_ppo` takes them).
    overrides: Vec<String>,
    /// The overrides are verl's `main_ppo` overrides (Hydra syntax, verl's names and defaults);
    /// Reinforge keys may be mixed in. Prints what became of each before the run starts.
    #[arg(long, conflicts_with = "openrlhf")]
    verl: bool,
    /// Everything after this flag is OpenRLHF's `train_ppo_ray` flags (OpenRLHF's names and
    /// defaults); Reinforge `key=value` overrides may be mixed in. Put Reinforge's own flags
    /// (--resume, --dry-run, ...) before it.
    #[arg(long)]
    openrlhf: bool,
    /// The words after --openrlhf (split off before parsing).
    #[arg(skip)]
    pub openrlhf_args: Vec<String>,
    /// Print what the command resolves to (the report of a verl/OpenRLHF command line and
    /// the resolved config) and stop.
    #[arg(long)]
    dry_run: bool,
    /// `auto` (latest complete checkpoint in the run directory), `none`, or a checkpoint path
    /// (default auto, or what a verl/OpenRLHF command line asks for).
    #[arg(long)]
    resume: Option<String>,
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
    /// Write the TOML equivalent of a verl (--verl) or OpenRLHF (--openrlhf) command line,
    /// with what became of each argument as comments.
    Convert(ConvertArgs),
}

/// `reinforge config convert`.
#[derive(Args)]
pub struct ConvertArgs {
    /// Write the TOML here (default: print it).
    #[arg(long)]
    out: Option<PathBuf>,
    /// A TOML config to start from (optional).
    config: Option<PathBuf>,
    /// verl's overrides (with --verl).
    overrides: Vec<String>,
    /// The arguments are verl's `main_ppo` overrides.
    #[arg(long, conflicts_with = "openrlhf")]
    verl: bool,
    /// Everything after this flag is OpenRLHF's `train_ppo_ray` flags (a trailing
    /// `--out FILE` is still ours).
    #[arg(long)]
    openrlhf: bool,
    /// The words after --openrlhf.
    #[arg(skip)]
    pub openrlhf_args: Vec<String>,
}

#[derive(Args)]
pub struct ExportArgs {
    /// A checkpoint directory (…/checkpoints/global_step_N).
    checkpoint: PathBuf,
    /// Write a Hugging Face model directory here (must not exist).
    #[arg(long)]
    hf: PathBuf,
}

/// The config a `reinforge train` command line resolves to, and the translation of a
/// verl/OpenRLHF command line when it is one.
fn load_config(a: &TrainArgs) -> Result<(TrainConfig, Option<Translated>)> {
    let line = Line { config: &a.config, overrides: &a.overrides, verl: a.verl, openrlhf: a.openrlhf, openrlhf_args: &a.openrlhf_args, ray: &a.ray };
    line.load()
}

/// What `train` and `config convert` read a config from.
struct Line<'a> {
    config: &'a Option<PathBuf>,
    overrides: &'a [String],
    verl: bool,
    openrlhf: bool,
    openrlhf_args: &'a [String],
    ray: &'a Option<String>,
}

impl Line<'_> {
fn load(&self) -> Result<(TrainConfig, Option<Translated>)> {
    let a = self;
    let mut overrides = Vec::new();
    if let Some(addr) = a.ray.clone() {
        overrides.push("cluster.backend=\"ray\"".into());
        overrides.push(format!("cluster.address=\"{addr}\""));
    }
    let foreign = if a.verl {
        // A first word that is not a TOML file is the first override.
        let (config, mut words) = match &a.config {
            Some(c) if c.extension().is_some_and(|e| e == "toml") => (Some(c.clone()), Vec::new()),
            Some(c) => (None, vec![c.display().to_string()]),
            None => (None, Vec::new()),
        };
        words.extend(a.overrides.iter().cloned());
        Some((Source::Verl, config, words))
    } else if a.openrlhf {
        let mut words = a.overrides.to_vec();
        words.extend(a.openrlhf_args.iter().cloned());
        Some((Source::OpenRlhf, a.config.clone(), words))
    } else {
        None
    };
    match foreign {
        Some((source, config, words)) => {
            let t = translate(source, &words)?;
            // The report comes first, whatever happens next: it is how every key is answered.
            eprint!("{}", t.report(source));
            if t.refused() > 0 {
                anyhow::bail!("{} argument(s) of the {} command line refused (marked REFUSED above)", t.refused(), source.name());
            }
            let cfg = resolve(source, config.as_deref(), &t, &overrides)?;
            Ok((cfg, Some(Translated { source, t })))
        }
        None => {
            let config = a.config.as_ref().context("no config: give a TOML file (see examples/), or a verl (--verl) or OpenRLHF (--openrlhf) command line")?;
            overrides.splice(0..0, a.overrides.iter().cloned());
            Ok((TrainConfig::load(config, &overrides)?, None))
        }
    }
}
}

/// A verl/OpenRLHF command line, translated.
pub struct Translated {
    source: Source,
    t: Translation,
}

/// Parses and translates a foreign command line (`words`: verl overrides or OpenRLHF flags).
fn translate(source: Source, words: &[String]) -> Result<Translation> {
    let keys = reinforge_trainer::config::known_keys();
    let is_ours = |k: &str| keys.iter().any(|o| k == o || (k.starts_with(o.as_str()) && k[o.len()..].starts_with('.')));
    let (given, own) = match source {
        Source::Verl => {
            let given: Vec<reinforge_compat::Given> = words
                .iter()
                .map(|w| match w.strip_prefix(HYDRA_FLAG).map(|f| f.split_once('=')) {
                    Some(Some((name, value))) => Ok(reinforge_compat::Given {
                        raw: format!("--{name}={value}"),
                        key: format!("--{name}"),
                        op: hydra::Op::Set,
                        value: hydra::HValue::Str(value.to_string()),
                    }),
                    Some(None) => Err(reinforge_compat::CompatError::Syntax {
                        arg: format!("--{}", &w[HYDRA_FLAG.len()..]),
                        why: "expects a value, as Hydra's does (`--config-name ppo_trainer`)".into(),
                    }),
                    None => hydra::parse_override(w).map(|o| reinforge_compat::Given { raw: o.raw, key: o.key, op: o.op, value: o.value }),
                })
                .collect::<Result<_, _>>()?;
            (given, Vec::new())
        }
        Source::OpenRlhf => openrlhf::parse(words)?,
    };
    // Hub dataset ids (OpenRLHF's `--data.prompt_dataset OpenRLHF/…`) from the Hugging Face cache.
    let hub = |id: &str| -> Result<Option<std::path::PathBuf>, String> {
        use reinforge_assets::hub_cache::{cached_snapshot, hub_cache_dir, is_hub_id, RepoKind};
        match hub_cache_dir() {
            Some(cache) if is_hub_id(id) => cached_snapshot(&cache, id, RepoKind::Dataset),
            _ => Ok(None),
        }
    };
    let mut t = reinforge_compat::translate_with(source, &given, &is_ours, &hub);
    for o in own {
        t.lines.push(reinforge_compat::Line { arg: o.clone(), verdict: reinforge_compat::Verdict::Own });
        t.own.push(o);
    }
    Ok(t)
}

/// The config of a translated command line: the tool's defaults, then the config file (if
/// any), then what was typed, then our own overrides.
fn resolve(source: Source, config: Option<&Path>, t: &Translation, extra: &[String]) -> Result<TrainConfig> {
    let mut base = t.defaults_table();
    let origin = match config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config {}", path.display()))?;
            let file: toml::Table = text.parse().map_err(|e: toml::de::Error| anyhow::anyhow!("{}: invalid TOML: {e}", path.display()))?;
            reinforge_compat::merge(&mut base, file);
            format!("{} + {} command line", path.display(), source.name())
        }
        None => format!("{} command line", source.name()),
    };
    let text = toml::to_string(&base).context("rendering the translated config")?;
    let mut overrides = t.overrides();
    overrides.extend(extra.iter().cloned());
    Ok(TrainConfig::from_str_with(&text, &origin, &overrides)?)
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
    let (head, tail) = our_words(words[at + 1..].to_vec());
    let mut line = TrainLine::try_parse_from(head).ok()?.args;
    line.openrlhf_args = tail;
    if let Some(c) = line.config.as_mut().filter(|c| c.is_relative()) {
        *c = base.join(&*c);
    }
    let (cfg, _) = load_config(&line).ok()?;
    let dir = cfg.out_dir();
    // Relative to wherever Ray starts the job: not something to look at from here.
    dir.is_absolute().then_some((dir, line.takeover))
}

/// A command line as clap should see it, and OpenRLHF's flags apart: [`split_openrlhf`], and
/// a bare `--ray` before an override (`--ray actor.lr=1e-6`: no address contains `=`) made
/// `--ray=auto`, so the override stays where it was typed among the others (later ones win).
pub fn our_words(words: Vec<String>) -> (Vec<String>, Vec<String>) {
    let (mut head, tail) = split_openrlhf(words);
    // Words after `--` are another command's (`job submit -- reinforge train ...`).
    let end = head.iter().position(|w| w == "--").unwrap_or(head.len());
    // Hydra's own flags on a verl command line (`--config-name X`) become words the verl
    // translation answers like any key, instead of clap refusing them as unknown flags; first,
    // so that a bare `--ray` before one cannot take its name for an address.
    if head[..end].iter().any(|w| w == "--verl") {
        let mut out = Vec::with_capacity(head.len());
        let mut i = 0;
        while i < head.len() {
            let next = head.get(i + 1).filter(|_| i + 1 < end).map(String::as_str);
            match (i < end).then(|| hydra::hydra_flag(&head[i], next)).flatten() {
                Some((name, Some(value), consumed)) => {
                    out.push(format!("{HYDRA_FLAG}{name}={value}"));
                    i += 1 + usize::from(consumed);
                }
                // No value: said by the translation as the syntax error it is.
                Some((name, None, _)) => {
                    out.push(format!("{HYDRA_FLAG}{name}"));
                    i += 1;
                }
                None => {
                    out.push(head[i].clone());
                    i += 1;
                }
            }
        }
        head = out;
    }
    let end = head.iter().position(|w| w == "--").unwrap_or(head.len());
    for i in 0..end.saturating_sub(1) {
        if head[i] == "--ray" && head[i + 1].contains('=') {
            head[i] = "--ray=auto".into();
        }
    }
    (head, tail)
}

/// How [`our_words`] passes a Hydra flag on to the verl translation (`@hydra:config-name=X`).
const HYDRA_FLAG: &str = "@hydra:";

/// Splits `words` at `--openrlhf`: what comes after it is OpenRLHF's, not ours to parse.
pub fn split_openrlhf(mut words: Vec<String>) -> (Vec<String>, Vec<String>) {
    match words.iter().position(|w| w == "--openrlhf") {
        Some(i) => {
            let tail = words.split_off(i + 1);
            (words, tail)
        }
        None => (words, Vec::new()),
    }
}

pub fn train(a: TrainArgs) -> Result<ExitCode> {
    let (cfg, translated) = load_config(&a)?;
    if a.dry_run {
        print!("{}", cfg.to_toml());
        return Ok(ExitCode::SUCCESS);
    }
    let wanted = translated.as_ref().and_then(|tr| tr.t.resume.clone());
    if let Some(key) = translated.as_ref().and_then(|tr| tr.t.wandb_key.as_ref()) {
        // OpenRLHF's --use_wandb KEY logs in with KEY unless one is configured already.
        if std::env::var_os("WANDB_API_KEY").is_none() {
            std::env::set_var("WANDB_API_KEY", key);
        }
    }
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
    let resume: Resume = a.resume.clone().or(wanted).as_deref().unwrap_or("auto").parse().unwrap_or(Resume::Auto);
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
        ConfigCmd::Convert(mut c) => {
            if !c.verl && !c.openrlhf {
                anyhow::bail!("say whose command line it is: reinforge config convert --verl <overrides...> or --openrlhf <flags...>");
            }
            // `--out FILE` after the OpenRLHF flags is ours (OpenRLHF has no --out).
            if let Some(i) = c.openrlhf_args.iter().position(|w| w == "--out" || w.starts_with("--out=")) {
                let w = c.openrlhf_args.remove(i);
                let path = match w.strip_prefix("--out=") {
                    Some(p) => p.to_string(),
                    None if i < c.openrlhf_args.len() => c.openrlhf_args.remove(i),
                    None => anyhow::bail!("--out needs a file name"),
                };
                c.out = Some(PathBuf::from(path));
            }
            let line = Line { config: &c.config, overrides: &c.overrides, verl: c.verl, openrlhf: c.openrlhf, openrlhf_args: &c.openrlhf_args, ray: &None };
            let (cfg, translated) = line.load()?;
            let mut text = String::new();
            if let Some(tr) = &translated {
                text.push_str("# Converted by `reinforge config convert`: what became of each argument.\n");
                for l in tr.t.report(tr.source).lines() {
                    text.push_str(&format!("# {l}\n"));
                }
                text.push('\n');
            }
            text.push_str(&cfg.to_toml());
            match &c.out {
                Some(path) => {
                    // Written whole or not at all.
                    let tmp = path.with_extension("toml.tmp");
                    std::fs::write(&tmp, &text).with_context(|| format!("writing {}", tmp.display()))?;
                    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
                    eprintln!("wrote {}", path.display());
                }
                None => print!("{text}"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn export(a: ExportArgs) -> Result<ExitCode> {
    let out = reinforge_trainer::export_hf(&a.checkpoint, &a.hf)?;
    println!("{}", out.display());
    Ok(ExitCode::SUCCESS)
}
