//! The controller loop (DESIGN.md §2): prompts → rollout → reward → log-probs/values → KL and
//! advantages → critic and actor updates → weight sync → metrics, validation, checkpoints.

use crate::config::{DataConfig, GenerateSpec, TrainConfig};
use crate::error::TrainError;
use crate::multi_turn::{Agent, AgentSettings, MultiTurnRollout};
use crate::build::{self, reward_fn, val_reward_fn};
use crate::roles::{ActorMiniBatch, CriticGroup, PolicyGroup, RefGroup, Roles, SeqBatch};
use reinforge_algos::{
    apply_kl_penalty, compute_advantage, AdvantageConfig, AdvantageEstimator, AdvantageInputs, GroupId, KlController,
    KlPenalty, Mat,
};
use reinforge_checkpoint::{CheckpointWriter, Resume, SaveOptions};
use reinforge_data::{DataItem, Dataset, EpochLoader, LoadOptions, LoaderConfig, LoaderState, OnBadRow, PromptRecord};
use reinforge_engine::{FinishReason, ModelConfig, SamplingParams};
use reinforge_lease::{Fence, Lease, LeaseOptions, Takeover};
use reinforge_metrics::{Console, Metrics, RunLog, RunLogOptions};
use reinforge_reward::{RewardFn, RewardInput};
use reinforge_tokenizer::{ChatTokenizer, RenderOptions};
use reinforge_trackers::{Ending, Trackers};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a finished (or interrupted) run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Output directory.
    pub out_dir: PathBuf,
    /// Steps completed (global).
    pub steps: usize,
    /// Last checkpoint written, if any.
    pub last_checkpoint: Option<PathBuf>,
    /// `metrics.jsonl`, if written.
    pub metrics_file: Option<PathBuf>,
    /// TensorBoard events, if written.
    pub tensorboard_file: Option<PathBuf>,
    /// Per-step metrics of this invocation.
    pub history: Vec<Metrics>,
    /// Whether Ctrl-C stopped it.
    pub interrupted: bool,
    /// Each time the run lost a worker and restarted itself from its last checkpoint.
    pub restarts: Vec<Restart>,
}

/// One automatic restart (`trainer.max_restarts`).
#[derive(Debug, Clone)]
pub struct Restart {
    /// What was lost (naming the step and phase when it happened inside one).
    pub cause: String,
    /// The step being computed when it happened.
    pub failed_step: Option<usize>,
    /// The checkpoint step the run continued from (0: from the start).
    pub resumed_from: usize,
    /// Seconds from the loss until the first step after it was done.
    pub seconds_to_resume: Option<f64>,
    /// The nodes the widest worker group went on with, when fewer than the config asks for
    /// (`cluster.min_nodes`).
    pub fewer_nodes: Option<usize>,
}

impl std::fmt::Display for Restart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; resumed from step {}", self.cause, self.resumed_from)?;
        if let Some(s) = self.failed_step {
            write!(f, " ({} step(s) redone)", s.saturating_sub(self.resumed_from))?;
        }
        if let Some(n) = self.fewer_nodes {
            write!(f, " on {n} node(s) (cluster.min_nodes)")?;
        }
        match self.seconds_to_resume {
            Some(t) => write!(f, ", back to training in {t:.1}s"),
            None => Ok(()),
        }
    }
}

/// An attempt at the run: the first, or one after a lost worker.
struct Attempt {
    resume: Resume,
    /// After a loss: when it happened and how long to wait for room on the cluster.
    recovering: Option<(Instant, Instant)>,
}

/// What goes into `trainer_state.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TrainerState {
    step: usize,
    loader: LoaderState,
    kl_ctrl: KlController,
    /// The resolved config's TOML, to warn when a resume changes it.
    config: String,
}

/// Files copied next to the actor weights so a checkpoint's `actor/` is a complete HF directory.
const TOKENIZER_FILES: [&str; 5] =
    ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json", "special_tokens_map.json"];

fn gen_records(spec: &GenerateSpec) -> Result<Vec<PromptRecord>, TrainError> {
    let params = toml::Value::Table(spec.params.clone());
    let bad = |e: String| TrainError::Other(format!("[data.generate] params: {e}"));
    match spec.kind.as_str() {
        "arith" => {
            let cfg: reinforge_data::gen::ArithConfig = params.try_into().map_err(|e: toml::de::Error| bad(e.to_string()))?;
            Ok(reinforge_data::gen::arith(spec.n, spec.seed, &cfg)?)
        }
        "countdown" => {
            let cfg: reinforge_data::gen::CountdownConfig = params.try_into().map_err(|e: toml::de::Error| bad(e.to_string()))?;
            Ok(reinforge_data::gen::countdown(spec.n, spec.seed, &cfg)?)
        }
        other => Err(TrainError::Other(format!("data.generate.kind = `{other}`: use `arith` or `countdown`"))),
    }
}

/// Encodes a prompt's messages as the policy sees them (`data.apply_chat_template_kwargs` as
/// extra template variables); `tools`: the schemas of `[tools.calls]`' tools, shown to the
/// policy by the template.
fn encoder<'a>(tok: &'a ChatTokenizer, data: &DataConfig, tools: Option<Vec<serde_json::Value>>) -> Result<impl Fn(&[serde_json::Value]) -> Result<Vec<u32>, String> + 'a, TrainError> {
    let chat = data.apply_chat_template;
    let extra = data.template_variables().map_err(TrainError::Other)?;
    let opts = RenderOptions { extra, tools, ..RenderOptions::generation(true) };
    Ok(move |msgs: &[serde_json::Value]| {
        if chat {
            tok.encode_chat(msgs, &opts).map_err(|e| e.to_string())
        } else {
            let text = msgs.first().and_then(|m| m["content"].as_str()).unwrap_or_default();
            tok.tokenizer().encode(text, true).map_err(|e| e.to_string())
        }
    })
}

fn load_dataset(
    cfg: &TrainConfig,
    files: &[PathBuf],
    generate: &Option<GenerateSpec>,
    tok: &ChatTokenizer,
    train: bool,
    tools: Option<Vec<serde_json::Value>>,
) -> Result<Option<Dataset>, TrainError> {
    let opts = LoadOptions {
        prompt_key: cfg.data.prompt_key.clone(),
        max_prompt_length: Some(cfg.data.max_prompt_length),
        on_bad_row: if cfg.data.on_bad_row == "skip" { OnBadRow::Skip } else { OnBadRow::Fail },
        max_samples: if train { cfg.data.max_samples } else { None },
        default_data_source: cfg.data.default_data_source.clone(),
        require_ground_truth: cfg.data.require_ground_truth,
        label_key: cfg.data.label_key.clone(),
        decode_json_ground_truth: cfg.data.decode_json_ground_truth.unwrap_or(!cfg.reward.reads_stored_ground_truth(!train)),
        ..LoadOptions::default()
    };
    let enc = encoder(tok, &cfg.data, tools)?;
    let ds = if let Some(spec) = generate {
        Dataset::from_records(gen_records(spec)?, &format!("generated {}", spec.kind), &opts, &enc)?
    } else if !files.is_empty() {
        Dataset::load_files(files, &opts, &enc)?
    } else {
        return Ok(None);
    };
    let r = ds.report();
    if r.skipped_malformed > 0 || r.filtered_too_long > 0 {
        tracing::warn!("{}: {r}", if train { "train data" } else { "val data" });
    }
    Ok(Some(ds))
}

/// The roles of a single-process run: every role in this process, actor and rollout sharing
/// weights.
fn local_roles(cfg: &TrainConfig, model_dir: &Path, resumed: Option<&reinforge_checkpoint::Checkpoint>) -> Result<Roles, TrainError> {
    let critic: Option<Box<dyn CriticGroup>> = if cfg.critic_enabled() { Some(build::critic_group(cfg, model_dir, resumed)?) } else { None };
    let reference: Option<Box<dyn RefGroup>> = if cfg.ref_enabled() { Some(build::reference_group(cfg, model_dir)?) } else { None };
    let policy: Box<dyn PolicyGroup> = build::policy_group(cfg, model_dir, resumed)?;
    Ok(Roles { policy, reference, critic, reward: None, _keep: None, monitor: None })
}

/// `placement.json` of a single-process run, in the shape a Ray run writes: every role in one
/// rank, this process, on this host.
fn write_local_placement(cfg: &TrainConfig, out_dir: &Path, fence: &Fence) -> Result<(), TrainError> {
    let mut roles = vec!["actor", "rollout"];
    if cfg.ref_enabled() {
        roles.push("ref");
    }
    if cfg.critic_enabled() {
        roles.push("critic");
    }
    let report = serde_json::json!({
        "backend": "local",
        "groups": [{
            "group": "local",
            "roles": roles,
            "ranks": [{"rank": 0, "node_ip": reinforge_lease::hostname(), "pid": std::process::id(), "device": cfg.trainer.device}],
        }],
    });
    Ok(fence.publish(&out_dir.join("placement.json"), &serde_json::to_vec_pretty(&report).unwrap_or_default())?)
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Masked values of a `[N, R]` matrix, flattened.
fn masked_values(m: &Mat, mask: &Mat) -> Vec<f64> {
    m.data().iter().zip(mask.data()).filter(|(_, &k)| k > 0.0).map(|(&x, _)| x).collect()
}

/// How a run starts.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// Which checkpoint to continue from.
    pub resume: Resume,
    /// Take the run directory even from a live run (`--takeover`); that run stops at its next write.
    pub takeover: bool,
}

/// Runs training to completion (or until `stop` is set), resuming per `resume`.
pub fn train(cfg: &TrainConfig, resume: &Resume, stop: Arc<AtomicBool>) -> Result<RunSummary, TrainError> {
    train_with(cfg, &StartOptions { resume: resume.clone(), takeover: false }, stop)
}

/// Takes the run directory (a lease: README, "One writer per run directory"), then trains: every
/// write that publishes into the directory is fenced by the lease.
pub fn train_with(cfg: &TrainConfig, start: &StartOptions, stop: Arc<AtomicBool>) -> Result<RunSummary, TrainError> {
    let out_dir = cfg.out_dir();
    // A single-process run on a GPU opens it first: no GPU, no driver or a bad index is said
    // before anything is written.
    if cfg.cluster.backend != "ray" && cfg.trainer.device.parse::<reinforge_engine::DeviceSpec>()?.is_cuda() {
        crate::cuda::open_gpu(cfg)?;
    }
    let fresh = !out_dir.exists();
    std::fs::create_dir_all(&out_dir).map_err(|e| TrainError::Other(format!("cannot create {}: {e}", out_dir.display())))?;
    let opts = LeaseOptions {
        timeout: Duration::from_secs_f64(cfg.trainer.lease_timeout_s),
        takeover: if start.takeover { Takeover::Force } else { Takeover::IfStale },
        job_id: reinforge_cluster::jobs::current_job_id(),
    };
    let (lease, how) = Lease::acquire(&out_dir, &opts)?;
    if let Some(m) = how.takeover_message() {
        eprintln!("run directory {}: {m}", out_dir.display());
    }
    let fence = lease.fence();
    sweep_temporaries(&fence, &out_dir);
    // Trackers start before any model loads: a missing package, key or server is said at once.
    let trackers = match start_trackers(cfg, &fence) {
        Ok(t) => t,
        Err(e) => {
            // A run that never started leaves nothing behind in a directory it created.
            give_up(lease, fresh, &out_dir);
            return Err(e);
        }
    };
    // The page serves the directory for as long as this run holds it.
    let _dashboard = match start_dashboard(cfg, &out_dir) {
        Ok(d) => d,
        Err(e) => {
            trackers.finish(Ending::Failed, TRACKER_WAIT);
            give_up(lease, fresh, &out_dir);
            return Err(e);
        }
    };
    let mut restarts: Vec<Restart> = Vec::new();
    let mut attempt = Attempt { resume: start.resume.clone(), recovering: None };
    let summary = loop {
        let err = match run_owned(cfg, &attempt, stop.clone(), &fence, &mut restarts, &trackers) {
            Ok(mut s) => {
                s.restarts = restarts;
                break s;
            }
            Err(e) => e,
        };
        // A lost worker is the one failure a restart fixes: the same process still owns the
        // run directory, so the restarted run cannot collide with a zombie of itself.
        if !err.is_lost_worker() || restarts.len() >= cfg.trainer.max_restarts || stop.load(Ordering::SeqCst) {
            trackers.finish(Ending::Failed, TRACKER_WAIT);
            return Err(err);
        }
        let lost_at = Instant::now();
        let resumed_from = reinforge_checkpoint::resolve(out_dir.join("checkpoints"), &Resume::Auto)?.map_or(0, |c| c.step as usize);
        eprintln!(
            "restart {}/{}: {err}; continuing from {} (trainer.max_restarts)",
            restarts.len() + 1,
            cfg.trainer.max_restarts,
            if resumed_from > 0 { format!("the checkpoint of step {resumed_from}") } else { "the start".into() }
        );
        restarts.push(Restart { cause: err.to_string(), failed_step: err.step(), resumed_from, seconds_to_resume: None, fewer_nodes: None });
        let wait = Duration::from_secs(cfg.cluster.recovery_wait_s);
        attempt = Attempt { resume: Resume::Auto, recovering: Some((lost_at, lost_at + wait)) };
    };
    trackers.finish(Ending::Finished, TRACKER_WAIT);
    if let Err(e) = lease.release() {
        tracing::warn!("giving the run directory back: {e} (the next run takes it over after trainer.lease_timeout_s)");
    }
    Ok(summary)
}

/// Deletes what earlier owners of the run directory left half-written (`.tmp-` files beside
/// the files they replace whole: the top level and each stall report); checkpoints clean their
/// own (`reinforge_checkpoint`), and the lease its.
fn sweep_temporaries(fence: &Fence, out_dir: &Path) {
    let stalls = std::fs::read_dir(out_dir.join("stalls")).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_dir());
    let mut removed = 0;
    for dir in std::iter::once(out_dir.to_path_buf()).chain(stalls) {
        match fence.sweep_temporaries(&dir) {
            Ok(n) => removed += n,
            Err(e) => tracing::warn!("cleaning temporaries in {}: {e}", dir.display()),
        }
    }
    if removed > 0 {
        tracing::info!("removed {removed} temporary file(s) an earlier run left half-written in {}", out_dir.display());
    }
}

/// Ends a run that failed while starting: deletes the run directory if it created it (while
/// still holding it), or gives it back.
fn give_up(lease: Lease, created: bool, out_dir: &Path) {
    let (what, result) = if created { ("removing", lease.remove_run_dir()) } else { ("giving back", lease.release()) };
    if let Err(e) = result {
        tracing::warn!("{what} the run directory {}: {e}", out_dir.display());
    }
}

/// The run's live page (`trainer.dashboard`), when on. A port in use gives way to a free
/// one; an address other than loopback without the cluster token is refused.
fn start_dashboard(cfg: &TrainConfig, out_dir: &Path) -> Result<Option<reinforge_dashboard::Background>, TrainError> {
    let t = &cfg.trainer;
    if !t.dashboard {
        return Ok(None);
    }
    let loopback = t.dashboard_host == "localhost" || t.dashboard_host.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback());
    let token = if loopback { None } else { reinforge_cluster::token::load(None).ok().flatten().map(|t| t.value) };
    let opts = reinforge_dashboard::DashboardOptions { host: t.dashboard_host.clone(), port: t.dashboard_port, any_port_if_taken: true, token };
    let dir = std::path::absolute(out_dir).unwrap_or_else(|_| out_dir.to_path_buf());
    match reinforge_dashboard::Background::start(vec![dir], opts) {
        Ok(page) => {
            eprintln!("dashboard: {}", page.url);
            Ok(Some(page))
        }
        Err(e @ reinforge_dashboard::DashboardError::Token(_)) => Err(TrainError::Other(format!("trainer.dashboard_host: {e}"))),
        Err(e) => {
            tracing::warn!("the run's page did not start ({e}); training goes on without it (trainer.dashboard = false turns it off)");
            Ok(None)
        }
    }
}

/// Rows of `samples.jsonl` for the first `n` completions: the prompt and response as text,
/// the reward, the answer, and for a multi-turn rollout its turns (model text and
/// observations apart).
#[allow(clippy::too_many_arguments)]
fn sample_rows(
    step: usize,
    split: &str,
    n: usize,
    inputs: &[RewardInput],
    scores: &[f64],
    comps: &[reinforge_engine::Completion],
    search: Option<&MultiTurnRollout>,
    tok: &reinforge_tokenizer::Tokenizer,
) -> Vec<serde_json::Value> {
    (0..n.min(inputs.len()))
        .map(|i| {
            let mut row = serde_json::json!({
                "step": step,
                "split": split,
                "data_source": inputs[i].data_source,
                "prompt": inputs[i].prompt,
                "response": inputs[i].response,
                "reward": scores.get(i),
                "ground_truth": inputs[i].ground_truth,
            });
            if let Some(t) = search.and_then(|s| s.trajectories.get(i)) {
                // Runs of model tokens and of observation tokens, each decoded whole.
                let ids = &comps[i].token_ids;
                let mut turns = Vec::new();
                let mut start = 0;
                while start < ids.len() {
                    let model = t.model_mask[start];
                    let end = (start..ids.len()).find(|&j| t.model_mask[j] != model).unwrap_or(ids.len());
                    let text = tok.decode(&ids[start..end], model).unwrap_or_default();
                    turns.push(serde_json::json!({"role": if model { "model" } else { "observation" }, "text": text}));
                    start = end;
                }
                row["turns"] = serde_json::Value::Array(turns);
            }
            row
        })
        .collect()
}

/// How long the end of a run waits for trackers (W&B, MLflow) to send what they hold.
const TRACKER_WAIT: Duration = Duration::from_secs(60);

/// The W&B / MLflow trackers `trainer.logger` names, told the project, the run's name and its
/// resolved config.
fn start_trackers(cfg: &TrainConfig, fence: &Fence) -> Result<Trackers, TrainError> {
    let info = reinforge_trackers::RunInfo {
        project: cfg.trainer.project_name.clone(),
        name: cfg.trainer.experiment_name.clone(),
        dir: std::path::absolute(cfg.out_dir()).unwrap_or_else(|_| cfg.out_dir()),
        config: serde_json::to_value(cfg).unwrap_or_default(),
        fence: fence.clone(),
    };
    Trackers::start(&cfg.trainer.logger, &info).map_err(|e| TrainError::Other(e.to_string()))
}

/// The phases of one RL step, in order (DESIGN.md §7). Each is one method of [`Controller`];
/// an error says which step and phase it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The rollout engines sample responses.
    Generate,
    /// Rewards for each response.
    Score,
    /// Old-policy and reference log-probs, critic values.
    LogProbs,
    /// KL in the reward, then the advantage estimator.
    Advantages,
    /// Critic and actor updates (epochs × mini-batches × micro-batches).
    Update,
    /// The actor's new weights to the rollout engines.
    Sync,
    /// Validation on the held-out prompts.
    Validate,
    /// Saving a checkpoint.
    Checkpoint,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Generate => "generate",
            Phase::Score => "score",
            Phase::LogProbs => "log-probs",
            Phase::Advantages => "advantages",
            Phase::Update => "update",
            Phase::Sync => "weight sync",
            Phase::Validate => "validate",
            Phase::Checkpoint => "checkpoint",
        })
    }
}

/// The run itself, in a directory this process owns: set up, then one step at a time.
fn run_owned(
    cfg: &TrainConfig,
    attempt: &Attempt,
    stop: Arc<AtomicBool>,
    fence: &Fence,
    restarts: &mut [Restart],
    trackers: &Trackers,
) -> Result<RunSummary, TrainError> {
    let t_start = Instant::now();
    let resume = &attempt.resume;
    let out_dir = cfg.out_dir();
    let ckpt_root = out_dir.join("checkpoints");

    // ---- models and tokenizer
    let model_dir = reinforge_assets::resolve_model(&cfg.actor.model)?;
    let tok = ChatTokenizer::load_from_dir(&model_dir)?;
    let resumed = reinforge_checkpoint::resolve(&ckpt_root, resume)?;
    let mcfg = match &resumed {
        Some(ck) => ModelConfig::from_dir(&ck.dir.join("actor"))?,
        None => ModelConfig::from_dir(&model_dir)?,
    };
    let longest = cfg.max_prompt_tokens() + cfg.max_trajectory_length();
    if longest > mcfg.max_position_embeddings {
        let what = if cfg.tools.search.enable {
            "the prompt (data.max_prompt_length, or tools.search.max_start_length) + (tools.search.max_turns + 1) × data.max_response_length + tools.search.max_turns × tools.search.max_obs_length"
        } else {
            "data.max_prompt_length + data.max_response_length"
        };
        return Err(TrainError::Other(format!(
            "{what} = {longest} exceeds the model context ({}): lower one of them",
            mcfg.max_position_embeddings
        )));
    }
    let mut roles = match cfg.cluster.backend.as_str() {
        "ray" => {
            let (roles, fewer) = place_roles(cfg, resumed.as_ref().map(|c| c.dir.as_path()), fence, attempt.recovering, &stop)?;
            if let Some(r) = restarts.last_mut().filter(|_| attempt.recovering.is_some()) {
                r.fewer_nodes = fewer;
            }
            roles
        }
        _ => {
            let roles = local_roles(cfg, &model_dir, resumed.as_ref())?;
            write_local_placement(cfg, &out_dir, fence)?;
            roles
        }
    };

    // ---- data (with the tool agent, prompts show its tools: its settings are read once, here)
    let agent_settings = if cfg.tools.search.enable {
        Some(AgentSettings::Search((&cfg.tools.search).into()))
    } else if cfg.tools.calls.enable {
        Some(AgentSettings::ToolCalls(cfg.tools.calls.settings(&cfg.data).map_err(TrainError::Other)?))
    } else {
        None
    };
    let tools = match &agent_settings {
        Some(AgentSettings::ToolCalls(s)) => Some(s.schemas()),
        _ => None,
    };
    let train_ds = load_dataset(cfg, &cfg.data.train_files, &cfg.data.generate, &tok, true, tools.clone())?
        .ok_or_else(|| TrainError::Other("no training data".into()))?;
    let val_ds = load_dataset(cfg, &cfg.data.val_files, &cfg.data.val_generate, &tok, false, tools)?;
    // With dynamic sampling the loader yields generation rounds (verl's gen_batch_size).
    let round_size = cfg.generation_batch();
    let loader_cfg = LoaderConfig {
        batch_size: round_size,
        shuffle: cfg.data.shuffle,
        seed: cfg.data.seed,
        drop_last: true,
        total_epochs: cfg.trainer.total_epochs.max(1),
    };
    let mut kl_ctrl = KlController::from_config(&reinforge_algos::KlControllerConfig {
        kind: if cfg.algorithm.kl_ctrl.kind == "adaptive" {
            reinforge_algos::KlControllerKind::Adaptive
        } else {
            reinforge_algos::KlControllerKind::Fixed
        },
        kl_coef: cfg.algorithm.kl_ctrl.kl_coef,
        target_kl: cfg.algorithm.kl_ctrl.target_kl,
        horizon: cfg.algorithm.kl_ctrl.horizon,
    })?;
    let mut start_step = 0usize;
    let mut loader = match &resumed {
        Some(ck) => {
            let st: TrainerState = serde_json::from_slice(&ck.read("trainer_state.json")?)
                .map_err(|e| TrainError::Other(format!("{}: trainer_state.json is not valid: {e}", ck.dir.display())))?;
            if st.config != cfg.to_toml() {
                tracing::warn!("the config differs from the one that wrote {}; continuing with the new one", ck.dir.display());
            }
            start_step = st.step;
            kl_ctrl = st.kl_ctrl;
            eprintln!("resuming from {} (step {})", ck.dir.display(), st.step);
            EpochLoader::from_state(train_ds.len(), loader_cfg.clone(), &st.loader)?
        }
        None => EpochLoader::new(train_ds.len(), loader_cfg.clone())?,
    };
    let total_steps = cfg.trainer.total_steps.map_or(loader.total_steps(), |s| s.min(loader.total_steps()));
    if total_steps == 0 {
        return Err(TrainError::Other(format!(
            "no full batch: {} prompts but {} = {round_size} (lower it or add data)",
            train_ds.len(),
            if round_size == cfg.data.train_batch_size { "data.train_batch_size" } else { "data.gen_batch_size" },
        )));
    }

    let reward = match roles.reward.take() {
        Some(r) => r,
        None => reward_fn(cfg)?,
    };
    let val_reward = val_reward_fn(cfg)?;
    let mut log = RunLog::open(
        &out_dir,
        Some(start_step as u64),
        &RunLogOptions {
            jsonl: cfg.trainer.logger.iter().any(|l| l == "jsonl"),
            tensorboard: cfg.trainer.logger.iter().any(|l| l == "tensorboard"),
            fence: Some(fence.clone()),
            samples: cfg.trainer.log_train_samples > 0 || cfg.trainer.log_val_generations > 0,
            text_log: true,
        },
    )?;
    // The resolved config beside the metrics, for the page and for people.
    fence.publish(&out_dir.join("config.toml"), cfg.to_toml().as_bytes())?;
    log.note(&match (&resumed, attempt.recovering) {
        (Some(ck), Some(_)) => format!("restarted after losing a worker: resuming from {} (step {start_step}), {total_steps} steps", ck.dir.display()),
        (Some(ck), None) => format!("resuming from {} (step {start_step}), {total_steps} steps", ck.dir.display()),
        (None, _) => format!("started: {total_steps} steps, pid {} on {}", std::process::id(), reinforge_lease::hostname()),
    })?;
    let cut = log.truncation();
    if let (Some(aside), true) = (&cut.superseded, cut.dropped > 0) {
        let after = if resumed.is_some() { format!("after step {start_step}") } else { "of the previous run (starting over)".into() };
        eprintln!("metrics: moved {} row(s) {after} from metrics.jsonl to {}", cut.dropped, aside.display());
    }
    let mut console = cfg.trainer.logger.iter().any(|l| l == "console").then(|| Console::new(total_steps as u64, start_step as u64));
    let mut summary = RunSummary {
        out_dir: out_dir.clone(),
        steps: start_step,
        last_checkpoint: None,
        metrics_file: log.jsonl_path().map(Path::to_path_buf),
        tensorboard_file: log.events_path().map(Path::to_path_buf),
        history: Vec::new(),
        interrupted: false,
        restarts: Vec::new(),
    };
    let agent = agent_settings.map(|s| Agent::new(s, &tok)).transpose()?;
    let mut c = Controller {
        cfg,
        agent,
        tok: &tok,
        model_dir: &model_dir,
        ckpt_root: &ckpt_root,
        fence,
        stop_ids: reinforge_engine::stop_token_ids(tok.tokenizer(), &mcfg),
        pad_id: tok.tokenizer().pad_id().or(mcfg.pad_token_id).unwrap_or(0),
        estimator: cfg.algorithm.adv_estimator.parse()?,
        kl_in_reward: if cfg.algorithm.use_kl_in_reward { Some(cfg.algorithm.kl_penalty.parse::<KlPenalty>()?) } else { None },
        kl_ctrl,
        total_steps,
        roles,
        reward,
        val_reward,
        clock: crate::watchdog::StepClock::default(),
        samples: Vec::new(),
        step: start_step,
        phase_display: console.as_ref().map(Console::phase_display).unwrap_or_default(),
    };
    let _watchdog = crate::watchdog::Watchdog::start(cfg, out_dir.clone(), c.clock.clone(), c.roles.monitor.clone(), fence.clone());

    // verl validates the resumed weights too when only validating.
    if (cfg.trainer.val_before_train && start_step == 0) || cfg.trainer.val_only {
        if let Some(v) = &val_ds {
            let m = c.in_phase(start_step, Phase::Validate, |c| c.validate(v, start_step))?;
            log.log(start_step as u64, &m)?;
            log.log_samples(&std::mem::take(&mut c.samples))?;
            let what = if cfg.trainer.val_only { format!("validation at step {start_step} (trainer.val_only: no training)") } else { "validation before training".into() };
            log.note(&format!("{what}: {}", fmt_metrics(&m, "val")))?;
            trackers.log(start_step as u64, reinforge_metrics::unix_time(), &m);
            if let Some(con) = console.as_ref() {
                con.println(&format!("{what}: {}", fmt_metrics(&m, "val")));
            }
            summary.history.push(m);
        }
    }

    let mut step = start_step;
    // The step the last checkpoint holds, and whether the data ran out mid-step.
    let (mut saved_at, mut ran_out) = (None, false);
    while step < total_steps && !cfg.trainer.val_only {
        // A run that lost its directory stops here rather than computing a step it cannot save.
        fence.check()?;
        let Some(first) = loader.next_batch() else {
            // Only dynamic sampling gets here (its total counts rounds): out of data exactly
            // at a step's end.
            ran_out = true;
            break;
        };
        let t_step = Instant::now();
        let mut m = Metrics::new();
        let n = step + 1;
        c.clock.start_step(n);
        c.step = n;

        let (rollout, batch, scores) = if cfg.algorithm.filter_groups.enable {
            match c.dynamic_batch(n, first, &mut loader, &train_ds, &mut m)? {
                Some(filled) => filled,
                None => {
                    log.note(&format!("the data ran out while filling step {n} with prompts whose samples differ; stopping"))?;
                    ran_out = true;
                    break;
                }
            }
        } else {
            let items = train_ds.batch(&first);
            let rollout = c.in_phase(n, Phase::Generate, |c| c.generate(step, 0, &items, &mut m))?;
            let scores = c.in_phase(n, Phase::Score, |c| c.score(&rollout, &items, &mut m))?;
            (rollout, first, scores)
        };
        let items = train_ds.batch(&batch);
        let lp = c.in_phase(n, Phase::LogProbs, |c| c.log_probs(&rollout.seqs, &mut m))?;
        let adv = c.in_phase(n, Phase::Advantages, |c| c.advantages(&rollout, &items, scores, &lp, &mut m))?;
        c.in_phase(n, Phase::Update, |c| c.update(step, &rollout.seqs, &lp, &adv, &mut m))?;
        c.in_phase(n, Phase::Sync, |c| c.sync(&mut m))?;
        c.step_metrics(&rollout, &lp, &mut m)?;
        let secs = t_step.elapsed().as_secs_f64();
        m.insert("timing_s/step", secs);
        m.insert("perf/throughput", m.get("perf/total_num_tokens").unwrap_or(0.0) / secs);
        m.insert("training/epoch", batch.epoch as f64);
        step += 1;
        m.insert("training/global_step", step as f64);

        let is_last = step == total_steps;
        if cfg.trainer.test_freq > 0 && (step.is_multiple_of(cfg.trainer.test_freq) || is_last) {
            if let Some(v) = &val_ds {
                let vm = c.in_phase(step, Phase::Validate, |c| c.validate(v, step))?;
                log.note(&format!("validation at step {step}: {}", fmt_metrics(&vm, "val")))?;
                for (k, x) in vm.iter() {
                    m.insert(k, x);
                }
            }
        }
        log.log(step as u64, &m)?;
        log.log_samples(&std::mem::take(&mut c.samples))?;
        log.note(&reinforge_metrics::plain_line(step as u64, total_steps as u64, start_step as u64, t_start.elapsed(), &m))?;
        trackers.log(step as u64, reinforge_metrics::unix_time(), &m);
        if let (Some((lost_at, _)), Some(r)) = (attempt.recovering, restarts.last_mut()) {
            if r.seconds_to_resume.is_none() {
                r.seconds_to_resume = Some(lost_at.elapsed().as_secs_f64());
                eprintln!("back to training: step {step} done {:.1}s after the loss", lost_at.elapsed().as_secs_f64());
            }
        }
        if let Some(con) = console.as_mut() {
            con.update(step as u64, &m);
        }
        summary.steps = step;
        summary.history.push(m);

        let interrupted = stop.load(Ordering::SeqCst);
        let due = cfg.trainer.save_freq > 0 && step.is_multiple_of(cfg.trainer.save_freq);
        if due || is_last || interrupted {
            summary.last_checkpoint = Some(c.checkpoint_after(step, &loader, &mut log)?);
            saved_at = Some(step);
        }
        c.clock.end_step();
        if interrupted {
            summary.interrupted = true;
            break;
        }
    }
    // Dynamic sampling can run out of data before `total_steps` (which counts generation
    // rounds): the last step done is then the run's end, and gets its checkpoint.
    if ran_out && step > start_step && saved_at != Some(step) {
        summary.last_checkpoint = Some(c.checkpoint_after(step, &loader, &mut log)?);
    }
    log.note(&format!("{}: {} steps in {:.1}s", if summary.interrupted { "interrupted" } else { "finished" }, summary.steps, t_start.elapsed().as_secs_f64()))?;
    if let Some(con) = console {
        let mut lines = vec![format!("steps: {} in {:.1}s", summary.steps, t_start.elapsed().as_secs_f64())];
        if let Some(p) = &summary.last_checkpoint {
            lines.push(format!("checkpoint: {}", p.display()));
        }
        if let Some(p) = &summary.metrics_file {
            lines.push(format!("metrics: {}", p.display()));
        }
        if summary.tensorboard_file.is_some() {
            lines.push(format!("tensorboard: tensorboard --logdir {}", out_dir.display()));
        }
        con.finish(&lines);
    }
    Ok(summary)
}

/// What [`Controller::raw_scores`] gives: per response, the score with the length
/// penalties, the reward's own score, the value dynamic sampling's metric reads, and the
/// reward's named parts.
struct Scored {
    scores: Vec<f64>,
    raw: Vec<f64>,
    filter: Vec<f64>,
    details: Vec<std::collections::BTreeMap<String, f64>>,
}

/// The reward's named parts over the responses trained on, as `reward/<name>/mean` (names
/// the length penalties log under are theirs).
fn log_details(details: &[std::collections::BTreeMap<String, f64>], m: &mut Metrics) {
    const OURS: [&str; 4] = ["overlong_penalty", "overlong_frac", "length_penalty", "stop_properly_penalized_frac"];
    let keys: std::collections::BTreeSet<&String> = details.iter().flat_map(|d| d.keys()).filter(|k| !OURS.contains(&k.as_str())).collect();
    for k in keys {
        let v: Vec<f64> = details.iter().filter_map(|d| d.get(k).copied()).collect();
        m.insert(format!("reward/{k}/mean"), v.iter().sum::<f64>() / v.len().max(1) as f64);
    }
}

/// The worker groups on Ray. After a loss (`recovering`: when it happened, and until when to
/// wait), a cluster without room for them yet is waited for, with a countdown, until the node
/// comes back or the time is up; with an elastic floor (`cluster.min_nodes`) the groups go on
/// over fewer nodes once `cluster.elastic_wait_s` has passed. Returns the roles, and the nodes
/// of the widest group when that is fewer than the config asks for.
fn place_roles(
    cfg: &TrainConfig,
    resume: Option<&Path>,
    fence: &Fence,
    recovering: Option<(Instant, Instant)>,
    stop: &AtomicBool,
) -> Result<(Roles, Option<usize>), TrainError> {
    let recover_until = recovering.map(|r| r.1);
    loop {
        let mut why = match crate::remote::ray_roles(cfg, resume, fence) {
            Err(TrainError::Unplaceable(why)) => why,
            other => return other.map(|r| (r, None)),
        };
        let elastic = recovering.filter(|_| cfg.cluster.min_nodes > 0).map(|(lost_at, _)| lost_at.elapsed());
        if let Some(since_loss) = elastic {
            let grace = Duration::from_secs(cfg.cluster.elastic_wait_s);
            if since_loss < grace {
                eprintln!("restart: waiting up to {}s more for every node before going on with fewer (cluster.elastic_wait_s)", (grace - since_loss).as_secs());
            } else {
                // Widest first: as many data-parallel ranks as the cluster has room for.
                for nodes in (cfg.cluster.min_nodes..cfg.widest_group_nodes()).rev() {
                    let Some(fewer) = cfg.on_fewer_nodes(nodes) else { continue };
                    match crate::remote::ray_roles(&fewer, resume, fence) {
                        Ok(roles) => {
                            eprintln!(
                                "restart: going on with {nodes} of {} node(s) (cluster.min_nodes = {}): the same global batch over fewer data-parallel ranks",
                                cfg.widest_group_nodes(),
                                cfg.cluster.min_nodes
                            );
                            return Ok((roles, Some(nodes)));
                        }
                        Err(TrainError::Unplaceable(w)) => why = format!("{why}; on {nodes} node(s): {w}"),
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        let left = recover_until.map_or(Duration::ZERO, |d| d.saturating_duration_since(Instant::now()));
        if left.is_zero() || stop.load(Ordering::SeqCst) {
            if recover_until.is_some() {
                return Err(TrainError::Unplaceable(format!(
                    "{why}; gave up waiting for room to restart (cluster.recovery_wait_s = {})",
                    cfg.cluster.recovery_wait_s
                )));
            }
            return Err(TrainError::Unplaceable(why));
        }
        let pause = left.min(Duration::from_secs(5));
        eprintln!("restart: no room for the workers yet ({why}); trying again in {}s, {}s left", pause.as_secs(), left.as_secs());
        std::thread::sleep(pause);
    }
}

/// What the controller holds across steps: the roles, the reward, the KL controller, and what
/// every phase reads.
struct Controller<'a> {
    cfg: &'a TrainConfig,
    /// The multi-turn loop, when `[tools.search]` or `[tools.calls]` is on.
    agent: Option<Agent>,
    tok: &'a ChatTokenizer,
    model_dir: &'a Path,
    ckpt_root: &'a Path,
    fence: &'a Fence,
    stop_ids: Vec<u32>,
    pad_id: u32,
    estimator: AdvantageEstimator,
    kl_in_reward: Option<KlPenalty>,
    kl_ctrl: KlController,
    total_steps: usize,
    roles: Roles,
    reward: Box<dyn RewardFn>,
    /// `[reward.val]`'s reward, when validation scores with another one.
    val_reward: Option<Box<dyn RewardFn>>,
    clock: crate::watchdog::StepClock,
    /// Rows for `samples.jsonl` since the last write.
    samples: Vec<serde_json::Value>,
    /// The step being computed (samples carry it).
    step: usize,
    /// The bar's view of the running phase.
    phase_display: reinforge_metrics::PhaseDisplay,
}

/// The responses of one step, laid out for scoring and training.
struct Rollout {
    prompts: Vec<Vec<u32>>,
    params: SamplingParams,
    comps: Vec<reinforge_engine::Completion>,
    seqs: SeqBatch,
    /// Where each response's reward goes: its last token, or with multi-turn rollouts its
    /// last model token (a reward on a masked observation token would not be trained on).
    reward_pos: Vec<usize>,
    /// Multi-turn rollouts' turns and retrieval, for their metrics.
    search: Option<MultiTurnRollout>,
}

impl Rollout {
    /// Lays completions out as sequences; `masks` (multi-turn rollouts) mark model tokens.
    fn new(
        prompts: Vec<Vec<u32>>,
        params: SamplingParams,
        comps: Vec<reinforge_engine::Completion>,
        masks: Option<&[Vec<bool>]>,
        search: Option<MultiTurnRollout>,
        pad_id: u32,
    ) -> Self {
        let prompt_refs: Vec<&[u32]> = comps.iter().map(|c| prompts[c.prompt_index].as_slice()).collect();
        let resp_refs: Vec<&[u32]> = comps.iter().map(|c| c.token_ids.as_slice()).collect();
        let seqs = SeqBatch::build_masked(&prompt_refs, &resp_refs, pad_id, masks);
        let reward_pos = comps
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let trained = masks.and_then(|ms| ms[i].iter().rposition(|&b| b));
                trained.unwrap_or(c.token_ids.len().max(1) - 1)
            })
            .collect();
        Self { prompts, params, comps, seqs, reward_pos, search }
    }
}

/// The prompts dynamic sampling keeps for a step, and their samples' scores.
#[derive(Default)]
struct KeptGroups {
    prompts: Vec<Vec<u32>>,
    indices: Vec<usize>,
    comps: Vec<reinforge_engine::Completion>,
    scores: Vec<f64>,
    raw: Vec<f64>,
    details: Vec<std::collections::BTreeMap<String, f64>>,
}

/// Completions (and, from multi-turn rollouts, each one's model-token mask) as one batch.
struct Generated {
    comps: Vec<reinforge_engine::Completion>,
    masks: Option<Vec<Vec<bool>>>,
    search: Option<MultiTurnRollout>,
}

/// Per-token log-probs and values of one step's sequences.
struct LogProbs {
    /// `None` when the batch is used once on-policy (see [`TrainConfig::old_log_probs_needed`]).
    old: Option<Mat>,
    reference: Option<Mat>,
    values: Option<Mat>,
}

impl Controller<'_> {
    /// Runs one phase, naming the step and phase in its error.
    fn in_phase<T>(&mut self, step: usize, phase: Phase, f: impl FnOnce(&mut Self) -> Result<T, TrainError>) -> Result<T, TrainError> {
        self.clock.phase(phase);
        self.phase_display.set(step as u64, &phase.to_string());
        f(self).map_err(|e| TrainError::InPhase { step, phase, source: Box::new(e) })
    }

    /// The prompts as the policy sees them (with `tools.search.max_start_length`, the last
    /// that many tokens, as Search-R1 keeps them).
    fn prompts(&self, items: &[&DataItem]) -> Vec<Vec<u32>> {
        let keep = self.cfg.max_prompt_tokens();
        items.iter().map(|it| it.prompt_ids[it.prompt_ids.len().saturating_sub(keep)..].to_vec()).collect()
    }

    /// Plain completions, or multi-turn trajectories when `[tools.search]` or `[tools.calls]`
    /// is on (the items give each prompt's `extra_info.tools_kwargs` and `interaction_kwargs`).
    fn sample(&mut self, items: &[&DataItem], prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Generated, TrainError> {
        match &self.agent {
            Some(agent) => {
                let kwargs: Vec<serde_json::Value> = items.iter().map(|it| crate::tool_calls::row_kwargs(&it.record.extra_info)).collect();
                let r = self.roles.policy.generate_turns(prompts, &kwargs, params, agent)?;
                let comps = r.trajectories.iter().map(|t| t.completion.clone()).collect();
                let masks = agent.masks_observations(self.cfg.tools.search.state_masking).then(|| r.trajectories.iter().map(|t| t.model_mask.clone()).collect());
                Ok(Generated { comps, masks, search: Some(r) })
            }
            None => Ok(Generated { comps: self.roles.policy.generate(prompts, params)?, masks: None, search: None }),
        }
    }

    /// The rollout engines answer the batch's prompts, `rollout.n` samples each; `round`
    /// counts a step's generation rounds (dynamic sampling), each drawn with a seed of its own.
    fn generate(&mut self, step: usize, round: usize, items: &[&DataItem], m: &mut Metrics) -> Result<Rollout, TrainError> {
        let cfg = self.cfg;
        let prompts = self.prompts(items);
        let params = SamplingParams {
            n: cfg.rollout.n,
            temperature: cfg.rollout.temperature,
            top_p: cfg.rollout.top_p,
            top_k: cfg.rollout.top_k,
            max_new_tokens: cfg.data.max_response_length,
            stop_token_ids: self.stop_ids.clone(),
            stop_strings: cfg.rollout.stop.clone(),
            // Each step samples with its own seed, so a resumed run draws what an
            // uninterrupted one would have drawn.
            seed: cfg.trainer.seed.wrapping_mul(1_000_003).wrapping_add(step as u64) ^ (round as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            first_prompt: 0,
            prompt_keys: Vec::new(),
            max_new_tokens_per_prompt: Vec::new(),
        };
        let t = Instant::now();
        let Generated { comps, masks, search } = self.sample(items, &prompts, &params)?;
        m.accumulate("timing_s/gen", t.elapsed().as_secs_f64());
        Ok(Rollout::new(prompts, params, comps, masks.as_deref(), search, self.pad_id))
    }

    /// DAPO's dynamic sampling: generation rounds from the loader (starting with `first`),
    /// each prompt whose samples all have the same `algorithm.filter_groups.metric` dropped,
    /// until `data.train_batch_size` prompts are kept (in order; the rest of the last round is
    /// dropped, as verl trims it). `None` when the data runs out first.
    fn dynamic_batch(
        &mut self,
        n: usize,
        first: reinforge_data::Batch,
        loader: &mut EpochLoader,
        ds: &Dataset,
        m: &mut Metrics,
    ) -> Result<Option<(Rollout, reinforge_data::Batch, Mat)>, TrainError> {
        let cfg = self.cfg;
        let fg = &cfg.algorithm.filter_groups;
        let want = cfg.data.train_batch_size;
        let mut kept = KeptGroups::default();
        let (mut rounds, mut dropped, mut params, mut last) = (0usize, 0usize, None, first.clone());
        let mut next = Some(first);
        while kept.prompts.len() < want {
            if fg.max_num_gen_batches > 0 && rounds >= fg.max_num_gen_batches {
                return Err(TrainError::Other(format!(
                    "step {n}: {rounds} generation rounds (algorithm.filter_groups.max_num_gen_batches) kept {} of {want} prompts whose samples differ in `{}`; the data may be too easy or too hard for the model: raise the limit (0: none) or change the data",
                    kept.prompts.len(),
                    fg.metric
                )));
            }
            let Some(batch) = next.take().or_else(|| loader.next_batch()) else { return Ok(None) };
            let items = ds.batch(&batch);
            let r = self.in_phase(n, Phase::Generate, |c| c.generate(n - 1, rounds, &items, m))?;
            let Scored { scores, raw, filter, mut details } = self.in_phase(n, Phase::Score, |c| c.raw_scores(&r, &items, false, m))?;
            rounds += 1;
            self.clock.round_done();
            let metric = if fg.uses_raw_score() { &filter } else { &scores };
            let mut groups: Vec<Vec<usize>> = vec![Vec::new(); r.prompts.len()];
            for (i, comp) in r.comps.iter().enumerate() {
                groups[comp.prompt_index].push(i);
            }
            for (p, members) in groups.iter().enumerate() {
                if kept.prompts.len() == want {
                    break;
                }
                let values: Vec<f64> = members.iter().map(|&i| metric[i]).collect();
                if !fg.keeps(&values) {
                    dropped += 1;
                    continue;
                }
                let index = kept.prompts.len();
                kept.prompts.push(r.prompts[p].clone());
                kept.indices.push(batch.indices[p]);
                for &i in members {
                    kept.comps.push(reinforge_engine::Completion { prompt_index: index, ..r.comps[i].clone() });
                    kept.scores.push(scores[i]);
                    kept.raw.push(raw[i]);
                    kept.details.push(std::mem::take(&mut details[i]));
                }
            }
            params.get_or_insert(r.params);
            last = batch;
        }
        m.insert("train/num_gen_batches", rounds as f64);
        m.insert("train/filtered_groups", dropped as f64);
        log_details(&kept.details, m);
        let Some(params) = params else { return Ok(None) };
        let rollout = Rollout::new(kept.prompts, params, kept.comps, None, None, self.pad_id);
        let batch = reinforge_data::Batch { indices: kept.indices, ..last };
        // Samples from what is trained on, not from the groups dropped.
        let inputs = reward_inputs(&rollout.comps, &ds.batch(&batch), &rollout.prompts, self.tok.tokenizer(), None)?;
        self.log_samples(&rollout, &inputs, &kept.scores);
        let token_scores = self.place_scores(&rollout, kept.scores, &kept.raw, m)?;
        Ok(Some((rollout, batch, token_scores)))
    }

    /// Each response's reward, placed on its last token as in verl: `[N, R]`.
    fn score(&mut self, r: &Rollout, items: &[&DataItem], m: &mut Metrics) -> Result<Mat, TrainError> {
        let Scored { scores, raw, details, .. } = self.raw_scores(r, items, true, m)?;
        log_details(&details, m);
        self.place_scores(r, scores, &raw, m)
    }

    /// The reward's score of each response, that score with the length penalties (when on;
    /// verl's dapo manager adds its, and `critic/score` includes them), the values dynamic
    /// sampling's `acc`/`score` metric reads, and the reward's numeric details.
    fn raw_scores(&mut self, r: &Rollout, items: &[&DataItem], log_samples: bool, m: &mut Metrics) -> Result<Scored, TrainError> {
        let t = Instant::now();
        let inputs = reward_inputs(&r.comps, items, &r.prompts, self.tok.tokenizer(), r.search.as_ref())?;
        let outs = self.reward.score_batch(&inputs)?;
        let raw: Vec<f64> = outs.iter().map(|o| o.score).collect();
        let limit = self.cfg.data.max_response_length;
        let scores: Vec<f64> = raw.iter().zip(&r.comps).map(|(&s, c)| self.cfg.reward.shaped(s, c.token_ids.len(), limit, c.finish_reason == FinishReason::Length)).collect();
        // verl's filter reads the reward's own `acc`/`score` entry where it returns one (a
        // dict from a Python function; OpenRLHF's `scores`), else the score.
        let name = self.cfg.algorithm.filter_groups.metric.as_str();
        let filter = outs.iter().zip(&raw).map(|(o, &r)| o.detail(name).unwrap_or(r)).collect();
        if log_samples {
            self.log_samples(r, &inputs, &scores);
        }
        m.accumulate("timing_s/reward", t.elapsed().as_secs_f64());
        let details = outs.into_iter().map(|o| o.details).collect();
        Ok(Scored { scores, raw, filter, details })
    }

    /// Queues `trainer.log_train_samples` of the step's responses for `samples.jsonl`.
    fn log_samples(&mut self, r: &Rollout, inputs: &[RewardInput], scores: &[f64]) {
        let n = self.cfg.trainer.log_train_samples;
        self.samples.extend(sample_rows(self.step, "train", n, inputs, scores, &r.comps, r.search.as_ref(), self.tok.tokenizer()));
    }

    /// The step's scores as token-level rewards `[N, R]` (whitened first with
    /// `reward.normalize`), with their metrics.
    fn place_scores(&mut self, r: &Rollout, mut scores: Vec<f64>, raw: &[f64], m: &mut Metrics) -> Result<Mat, TrainError> {
        let n = r.comps.len().max(1) as f64;
        if self.cfg.reward.overlong_buffer.enable {
            let limit = self.cfg.data.max_response_length;
            let penalties: Vec<f64> = r.comps.iter().map(|c| self.cfg.reward.overlong_buffer.penalty(c.token_ids.len(), limit).unwrap_or(0.0)).collect();
            m.add_stats("reward/overlong_penalty", &penalties);
            m.insert("reward/overlong_frac", penalties.iter().filter(|&&p| p < 0.0).count() as f64 / n);
        }
        if self.cfg.reward.stop_properly_penalty_coef.is_some() {
            let cut = r.comps.iter().filter(|c| c.finish_reason == FinishReason::Length).count();
            m.insert("reward/stop_properly_penalized_frac", cut as f64 / n);
            m.add_stats("reward/length_penalty", &scores.iter().zip(raw).map(|(s, r)| s - r).collect::<Vec<_>>());
        }
        m.add_stats("critic/score", &scores);
        if self.cfg.reward.normalize && scores.len() > 1 {
            let mu = mean(&scores);
            let sd = (scores.iter().map(|s| (s - mu).powi(2)).sum::<f64>() / (scores.len() - 1) as f64).sqrt();
            scores.iter_mut().for_each(|s| *s = (*s - mu) / (sd + 1e-6));
        }
        let (nseq, len) = (r.seqs.len(), r.seqs.response_len);
        let mut token_scores = vec![0.0; nseq * len];
        for (i, &pos) in r.reward_pos.iter().enumerate() {
            token_scores[i * len + pos] = scores[i];
        }
        Ok(Mat::new(nseq, len, token_scores)?)
    }

    /// Old-policy log-probs, the reference's, and the critic's values.
    fn log_probs(&mut self, seqs: &SeqBatch, m: &mut Metrics) -> Result<LogProbs, TrainError> {
        let micro = self.cfg.actor_micro();
        let old = if self.cfg.old_log_probs_needed() {
            let t = Instant::now();
            let old = self.roles.policy.logprobs(seqs, micro)?;
            m.insert("timing_s/old_log_prob", t.elapsed().as_secs_f64());
            Some(old)
        } else {
            None
        };
        let reference = match self.roles.reference.as_mut() {
            Some(rf) => {
                let t = Instant::now();
                let x = rf.logprobs(seqs, micro)?;
                m.insert("timing_s/ref", t.elapsed().as_secs_f64());
                Some(x)
            }
            None => None,
        };
        let values = match self.roles.critic.as_mut() {
            Some(c) => {
                let t = Instant::now();
                let v = c.values(seqs, self.cfg.critic_micro())?;
                m.insert("timing_s/values", t.elapsed().as_secs_f64());
                Some(v)
            }
            None => None,
        };
        Ok(LogProbs { old, reference, values })
    }

    /// Token rewards (with the KL penalty when it is in the reward), then advantages and returns.
    fn advantages(
        &mut self,
        r: &Rollout,
        items: &[&DataItem],
        token_scores: Mat,
        lp: &LogProbs,
        m: &mut Metrics,
    ) -> Result<reinforge_algos::AdvantageOutput, TrainError> {
        let t = Instant::now();
        let mask = &r.seqs.response_mask;
        let rewards = match (self.kl_in_reward, &lp.reference, &lp.old) {
            (Some(pen), Some(rl), Some(old)) => {
                let out = apply_kl_penalty(&token_scores, old, rl, mask, pen, &mut self.kl_ctrl)?;
                m.insert("actor/reward_kl_penalty", out.current_kl);
                m.insert("actor/reward_kl_penalty_coeff", out.beta);
                out.token_level_rewards
            }
            _ => token_scores,
        };
        // One group per prompt of this batch: a prompt that dynamic sampling kept from two
        // epochs' rounds is two groups, as verl's fresh uid per generation makes it.
        let index: Vec<GroupId> = r.comps.iter().map(|c| GroupId::Int(c.prompt_index as i64)).collect();
        let baselines = if self.estimator == AdvantageEstimator::Remax {
            Some(remax_baselines(self.roles.policy.as_mut(), &r.prompts, items, &r.params, self.reward.as_ref(), self.tok, self.cfg)?)
        } else {
            None
        };
        let cfg = self.cfg;
        let adv = compute_advantage(
            self.estimator,
            &AdvantageInputs {
                token_level_rewards: &rewards,
                response_mask: mask,
                values: lp.values.as_ref(),
                index: Some(&index),
                reward_baselines: baselines.as_deref(),
            },
            &AdvantageConfig {
                gamma: cfg.algorithm.gamma,
                lam: cfg.algorithm.lam,
                epsilon: 1e-6,
                norm_adv_by_std_in_grpo: cfg.algorithm.norm_adv_by_std_in_grpo,
            },
        )?;
        m.insert("timing_s/adv", t.elapsed().as_secs_f64());
        let seq_rewards: Vec<f64> = rewards.data().chunks(r.seqs.response_len).map(|row| row.iter().sum()).collect();
        m.add_stats("critic/rewards", &seq_rewards);
        m.add_stats("critic/advantages", &masked_values(&adv.advantages, mask));
        m.add_stats("critic/returns", &masked_values(&adv.returns, mask));
        if let Some(v) = &lp.values {
            m.add_stats("critic/values", &masked_values(v, mask));
        }
        Ok(adv)
    }

    /// The critic, then the actor: `actor.ppo_epochs` passes over mini-batches of
    /// `actor.ppo_mini_batch_size` prompts.
    fn update(
        &mut self,
        step: usize,
        seqs: &SeqBatch,
        lp: &LogProbs,
        adv: &reinforge_algos::AdvantageOutput,
        m: &mut Metrics,
    ) -> Result<(), TrainError> {
        let (cfg, a) = (self.cfg, &self.cfg.actor);
        let mini = cfg.mini_batch_seqs();
        let rows: Vec<usize> = (0..seqs.len()).collect();
        if let (Some(c), Some(v)) = (self.roles.critic.as_mut(), &lp.values) {
            let t = Instant::now();
            let lr = TrainConfig::lr_at(cfg.critic.lr, TrainConfig::warmup_steps(cfg.critic.lr_warmup_steps, cfg.critic.lr_warmup_ratio, self.total_steps), "constant", 0.0, step, self.total_steps);
            let mut acc = Vec::new();
            for _ in 0..a.ppo_epochs {
                for mb in rows.chunks(mini) {
                    acc.push(c.update(seqs, mb, v, &adv.returns, lr, None)?);
                }
            }
            merge_mean(m, &acc);
            m.insert("timing_s/update_critic", t.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        let lr = TrainConfig::lr_at(a.lr, TrainConfig::warmup_steps(a.lr_warmup_steps, a.lr_warmup_ratio, self.total_steps), &a.lr_scheduler, a.min_lr_ratio, step, self.total_steps);
        let mut acc = Vec::new();
        for epoch in 0..a.ppo_epochs {
            let mut order = rows.clone();
            if a.shuffle {
                shuffle(&mut order, cfg.trainer.seed ^ ((step as u64) << 8) ^ epoch as u64);
            }
            for mb in order.chunks(mini) {
                let mini_batch = ActorMiniBatch {
                    rows: mb,
                    old_log_probs: lp.old.as_ref(),
                    advantages: &adv.advantages,
                    ref_log_probs: lp.reference.as_ref(),
                    norm: None,
                };
                acc.push(self.roles.policy.update(seqs, &mini_batch, lr)?);
            }
        }
        merge_mean(m, &acc);
        m.insert("timing_s/update_actor", t.elapsed().as_secs_f64());
        Ok(())
    }

    /// The actor's new weights to the rollout engines.
    fn sync(&mut self, m: &mut Metrics) -> Result<(), TrainError> {
        let t = Instant::now();
        self.roles.policy.sync_rollout()?;
        m.insert("timing_s/update_weights", t.elapsed().as_secs_f64());
        Ok(())
    }

    /// KL to the reference, lengths and token counts.
    fn step_metrics(&self, r: &Rollout, lp: &LogProbs, m: &mut Metrics) -> Result<(), TrainError> {
        let mask = &r.seqs.response_mask;
        if let (Some(rl), Some(old)) = (&lp.reference, &lp.old) {
            let kl = reinforge_algos::kl_penalty(old, rl, reinforge_algos::KlEstimator::K1.into())?;
            m.insert("actor/kl_ref", mean(&masked_values(&kl, mask)));
        }
        m.insert("actor/kl_coef", self.kl_ctrl.value());
        let resp_lens: Vec<f64> = r.comps.iter().map(|c| c.token_ids.len() as f64).collect();
        m.add_stats("response_length", &resp_lens);
        let clipped = r.comps.iter().filter(|c| c.finish_reason == FinishReason::Length).count();
        m.insert("response_length/clip_ratio", clipped as f64 / r.comps.len() as f64);
        m.add_stats("prompt_length", &r.prompts.iter().map(|p| p.len() as f64).collect::<Vec<_>>());
        let tokens: usize = r.comps.iter().map(|c| c.token_ids.len() + r.prompts[c.prompt_index].len()).sum();
        m.insert("perf/total_num_tokens", tokens as f64);
        if let Some(gb) = resident_gb() {
            m.insert("perf/cpu_memory_used_gb", gb);
        }
        if let Some(s) = &r.search {
            s.metrics(m);
        }
        Ok(())
    }

    /// Mean reward per data_source and pass@k over the validation set; the first
    /// `trainer.log_val_generations` generations go to `samples.jsonl` as of `step`.
    fn validate(&mut self, ds: &Dataset, step: usize) -> Result<Metrics, TrainError> {
        let cfg = self.cfg;
        let k = cfg.rollout.val_n.max(1);
        let params = SamplingParams {
            n: k,
            temperature: cfg.rollout.val_temperature,
            top_p: cfg.rollout.val_top_p.unwrap_or(cfg.rollout.top_p),
            top_k: cfg.rollout.val_top_k.unwrap_or(cfg.rollout.top_k),
            max_new_tokens: cfg.data.max_response_length,
            stop_token_ids: self.stop_ids.clone(),
            stop_strings: cfg.rollout.stop.clone(),
            seed: cfg.trainer.seed ^ 0x7A11,
            first_prompt: 0,
            prompt_keys: Vec::new(),
            max_new_tokens_per_prompt: Vec::new(),
        };
        let t = Instant::now();
        let bs = cfg.data.val_batch_size.unwrap_or(ds.len()).max(1);
        let mut per_source: std::collections::BTreeMap<String, (Vec<f64>, Vec<f64>)> = Default::default();
        let mut val_env: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
        let mut logged = 0;
        for chunk in (0..ds.len()).collect::<Vec<_>>().chunks(bs) {
            let items: Vec<_> = chunk.iter().filter_map(|&i| ds.get(i)).collect();
            let prompts = self.prompts(&items);
            let Generated { comps, search: search_kept, .. } = self.sample(&items, &prompts, &params)?;
            if let Some(s) = &search_kept {
                let mut sm = Metrics::new();
                s.metrics(&mut sm);
                for (k, v) in sm.iter().filter(|(k, _)| ["env/", "num_turns/", "tool_calls/"].iter().any(|p| k.starts_with(p))) {
                    val_env.entry(k.to_string()).or_default().push(v);
                }
            }
            let inputs = reward_inputs(&comps, &items, &prompts, self.tok.tokenizer(), search_kept.as_ref())?;
            let reward = self.val_reward.as_deref().unwrap_or(&*self.reward);
            let scores: Vec<f64> = reward.score_batch(&inputs)?.iter().map(|o| o.score).collect();
            let room = cfg.trainer.log_val_generations.saturating_sub(logged);
            let rows = sample_rows(step, "val", room, &inputs, &scores, &comps, search_kept.as_ref(), self.tok.tokenizer());
            logged += rows.len();
            self.samples.extend(rows);
            for (p, it) in items.iter().enumerate() {
                let s: Vec<f64> = (0..k).map(|j| scores[p * k + j]).collect();
                let e = per_source.entry(it.record.data_source.clone()).or_default();
                e.0.extend_from_slice(&s);
                // pass@k: any of the k samples earned full credit.
                e.1.push(if s.iter().any(|&x| x >= 1.0) { 1.0 } else { 0.0 });
            }
        }
        let mut m = Metrics::new();
        let mut all = Vec::new();
        for (src, (scores, pass)) in &per_source {
            m.insert(format!("val/{src}/reward/mean@{k}"), mean(scores));
            m.insert(format!("val/{src}/pass@{k}"), mean(pass));
            all.extend_from_slice(scores);
        }
        m.insert("val/reward/mean", mean(&all));
        // Multi-turn validation: how the policy searched (`val/env/number_of_valid_search`, …).
        for (k, v) in &val_env {
            m.insert(format!("val/{k}"), mean(v));
        }
        m.insert("timing_s/testing", t.elapsed().as_secs_f64());
        Ok(m)
    }

    /// Checkpoints the run after `step` (the loader's position, the KL controller, the
    /// config) and says where in the log.
    fn checkpoint_after(&mut self, step: usize, loader: &EpochLoader, log: &mut RunLog) -> Result<PathBuf, TrainError> {
        let st = TrainerState { step, loader: loader.state(), kl_ctrl: self.kl_ctrl, config: self.cfg.to_toml() };
        let ck = self.in_phase(step, Phase::Checkpoint, |c| c.save_checkpoint(&st))?;
        log.note(&format!("checkpoint: {}", ck.display()))?;
        Ok(ck)
    }

    /// One copy of the actor (and critic): every data-parallel rank holds the same weights, so
    /// the checkpoint does not depend on the number of nodes that wrote it.
    fn save_checkpoint(&mut self, st: &TrainerState) -> Result<PathBuf, TrainError> {
        let actor_state = self.roles.policy.state()?;
        let critic_state = match self.roles.critic.as_mut() {
            Some(c) => Some(c.state()?),
            None => None,
        };
        let mut actor_tensors = actor_state.tensors;
        // A LoRA run's adapter goes beside the frozen weights as PEFT writes it, so
        // `PeftModel.from_pretrained(base, "…/actor")` loads it as it stands.
        let factors = reinforge_engine::lora::split_off(&mut actor_tensors);
        let adapter = match actor_state.lora {
            Some(config) if !factors.is_empty() => Some(reinforge_engine::Adapter { config, tensors: factors }),
            _ if !factors.is_empty() => return Err(TrainError::Other("the actor sent LoRA factors without the adapter's settings".into())),
            _ => None,
        };
        let mut w = CheckpointWriter::begin(self.ckpt_root, st.step as u64)?;
        let actor_tensors = &actor_tensors;
        w.add_file_with("actor/model.safetensors", |p: &Path| reinforge_engine::weights::write_safetensors(p, actor_tensors, None))?;
        if let Some(a) = &adapter {
            // PEFT (and transformers with PEFT installed) load the base from here.
            let base = std::path::absolute(self.model_dir).unwrap_or_else(|_| self.model_dir.to_path_buf());
            w.add_bytes(&format!("actor/{}", reinforge_engine::lora::CONFIG_FILE), &a.config_bytes(&base.display().to_string())?)?;
            let named = a.peft_named();
            w.add_file_with(&format!("actor/{}", reinforge_engine::lora::WEIGHTS_FILE), |p: &Path| reinforge_engine::weights::write_safetensors(p, &named, None))?;
        }
        let cfg_json = serde_json::to_vec_pretty(&actor_state.config_json).map_err(|e| TrainError::Other(e.to_string()))?;
        w.add_bytes("actor/config.json", &cfg_json)?;
        for f in TOKENIZER_FILES {
            let src = self.model_dir.join(f);
            if src.is_file() {
                let bytes = std::fs::read(&src).map_err(|e| TrainError::Other(format!("{}: {e}", src.display())))?;
                w.add_bytes(&format!("actor/{f}"), &bytes)?;
            }
        }
        let actor_opt = &actor_state.optimizer;
        w.add_file_with("actor/optimizer.safetensors", |p: &Path| actor_opt.write(p))?;
        if let Some(c) = critic_state {
            let t = &c.tensors;
            w.add_file_with("critic/model.safetensors", |p: &Path| reinforge_engine::weights::write_safetensors(p, t, None))?;
            let cj = serde_json::to_vec_pretty(&c.config_json).map_err(|e| TrainError::Other(e.to_string()))?;
            w.add_bytes("critic/config.json", &cj)?;
            let critic_opt = &c.optimizer;
            w.add_file_with("critic/optimizer.safetensors", |p: &Path| critic_opt.write(p))?;
        }
        let state = serde_json::to_vec_pretty(st).map_err(|e| TrainError::Other(e.to_string()))?;
        w.add_bytes("trainer_state.json", &state)?;
        w.set_meta(serde_json::json!({"experiment_name": self.cfg.trainer.experiment_name, "step": st.step}));
        let keep = (self.cfg.trainer.max_ckpt_to_keep > 0).then_some(self.cfg.trainer.max_ckpt_to_keep);
        let ck = w.commit(&SaveOptions { keep_last: keep, fence: Some(self.fence.clone()), ..SaveOptions::default() })?;
        Ok(ck.dir)
    }
}

/// What the reward function sees for each completion.
fn reward_inputs(
    comps: &[reinforge_engine::Completion],
    items: &[&reinforge_data::DataItem],
    prompts: &[Vec<u32>],
    tok: &reinforge_tokenizer::Tokenizer,
    turns: Option<&MultiTurnRollout>,
) -> Result<Vec<RewardInput>, TrainError> {
    comps
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let rec = &items[c.prompt_index].record;
            let mut extra_info = rec.extra_info.clone();
            // The tool agent's turn count, for Python rewards' extra_info["num_turns"] (verl
            // passes its agent loop's `__num_turns__`; a single turn counts 2), and its tool
            // rewards and turn scores.
            let tool_agent = turns.filter(|r| r.flavour == crate::multi_turn::Flavour::ToolCalls);
            if let (Some(t), Some(m)) = (tool_agent.and_then(|r| r.trajectories.get(i)), extra_info.as_object_mut()) {
                m.insert("__num_turns__".into(), serde_json::json!(t.turns));
                // verl's reward managers add the loop's extra fields to extra_info.
                m.insert("turn_scores".into(), serde_json::json!(t.turn_scores));
                m.insert("tool_rewards".into(), serde_json::json!(t.tool_rewards));
            }
            Ok(RewardInput {
                data_source: rec.data_source.clone(),
                // As the policy saw it (chat template included): reward models score it.
                prompt: tok.decode(&prompts[c.prompt_index], false)?,
                response: tok.decode(&c.token_ids, true)?,
                ground_truth: rec.ground_truth.clone(),
                extra_info,
            })
        })
        .collect()
}

/// This process's resident memory in GB (Linux `VmRSS`; verl logs it as
/// `perf/cpu_memory_used_gb`).
fn resident_gb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
    Some(kb / (1024.0 * 1024.0))
}

fn merge_mean(m: &mut Metrics, parts: &[Metrics]) {
    let mut keys: Vec<String> = parts.iter().flat_map(|p| p.iter().map(|(k, _)| k.to_string())).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let vals: Vec<f64> = parts.iter().filter_map(|p| p.get(&k)).collect();
        m.insert(k, mean(&vals));
    }
}

fn shuffle(v: &mut [usize], seed: u64) {
    // SplitMix64-driven Fisher–Yates: tiny, deterministic, independent of rand's versions.
    let mut s = seed;
    for i in (1..v.len()).rev() {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        v.swap(i, (z % (i as u64 + 1)) as usize);
    }
}

/// ReMax's baseline: the reward of the greedy response to each prompt.
fn remax_baselines(
    actor: &mut dyn PolicyGroup,
    prompts: &[Vec<u32>],
    items: &[&reinforge_data::DataItem],
    params: &SamplingParams,
    reward: &dyn RewardFn,
    tok: &ChatTokenizer,
    cfg: &TrainConfig,
) -> Result<Vec<f64>, TrainError> {
    let n = params.n;
    let greedy = SamplingParams { n: 1, temperature: 0.0, ..params.clone() };
    let comps = actor.generate(prompts, &greedy)?;
    let inputs = reward_inputs(&comps, items, prompts, tok.tokenizer(), None)?;
    // Scored as the samples are, the length penalties included (verl scores the greedy
    // baseline with the same reward function).
    let limit = cfg.data.max_response_length;
    let base: Vec<f64> = reward
        .score_batch(&inputs)?
        .iter()
        .zip(&comps)
        .map(|(o, c)| cfg.reward.shaped(o.score, c.token_ids.len(), limit, c.finish_reason == FinishReason::Length))
        .collect();
    Ok(base.iter().flat_map(|&b| std::iter::repeat_n(b, n)).collect())
}

fn fmt_metrics(m: &Metrics, prefix: &str) -> String {
    m.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, v)| format!("{k}={v:.4}")).collect::<Vec<_>>().join(" ")
}

/// Writes a checkpoint's actor as a standalone HF directory. A LoRA run's adapter is merged
/// into the weights (a plain model, as vLLM or transformers load it) and kept as PEFT wrote it
/// under `lora_adapter/` (verl's model merger does the same).
pub fn export_hf(ckpt: &Path, out: &Path) -> Result<PathBuf, TrainError> {
    use reinforge_engine::lora::{CONFIG_FILE, WEIGHTS_FILE};
    let ck = reinforge_checkpoint::open(ckpt, &Default::default())?;
    if out.exists() {
        return Err(TrainError::Other(format!("{} already exists: choose a new directory", out.display())));
    }
    let tmp = out.with_extension(format!("tmp-{}", std::process::id()));
    let written = (|| -> Result<(), TrainError> {
        std::fs::create_dir_all(&tmp).map_err(|e| TrainError::Other(format!("{}: {e}", tmp.display())))?;
        let lora = ck.manifest.files.iter().any(|f| f.path == format!("actor/{CONFIG_FILE}"));
        for f in ck.manifest.files.iter().filter(|f| f.path.starts_with("actor/") && f.path != "actor/optimizer.safetensors") {
            let name = &f.path["actor/".len()..];
            let to = match name {
                CONFIG_FILE | WEIGHTS_FILE if lora => tmp.join("lora_adapter").join(name),
                "model.safetensors" if lora => continue,
                _ => tmp.join(name),
            };
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).map_err(|e| TrainError::Other(format!("{}: {e}", parent.display())))?;
            }
            std::fs::copy(ck.path(&f.path)?, &to).map_err(|e| TrainError::Other(format!("copying {}: {e}", f.path)))?;
        }
        if lora {
            let dir = ck.dir.join("actor");
            let device = reinforge_engine::DeviceSpec::Cpu.inference_device()?;
            let model = reinforge_engine::CausalLm::load_base(&dir, &device)?.with_lora(&reinforge_engine::Adapter::read(&dir)?)?;
            reinforge_engine::weights::write_safetensors(&tmp.join("model.safetensors"), &model.merged_hf_tensors()?, None)?;
        }
        Ok(())
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, out).map_err(|e| TrainError::Other(format!("{}: {e}", out.display())))?;
    Ok(out.to_path_buf())
}
