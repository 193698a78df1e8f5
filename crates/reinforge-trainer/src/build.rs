//! Builds each role's local implementation from the config: used by the single-process
//! backend and by every `reinforge worker` rank, so a role is the same code wherever it runs.
//! `trainer.device` picks the engine: the CPU engine's roles here, the CUDA engine's in
//! [`crate::cuda`], behind the same traits.

use crate::config::{ConfigError, TrainConfig};
use crate::error::TrainError;
use crate::roles::{agg_mode, optim, ActorSettings, HostedCritic, HostedPolicy, LocalActorRollout, LocalCritic, LocalRef, LocalRollout, RefGroup, RolloutEngine};
use reinforge_algos::{KlPenalty, PolicyLossConfig, ValueLossConfig};
use reinforge_checkpoint::Checkpoint;
use reinforge_engine::{Adapter, CausalLm, Decoder, DeviceSpec, ModelConfig, Trainer, ValueModel};
use reinforge_reward::{RewardFn, RewardSpec};
use reinforge_tokenizer::ChatTokenizer;
use std::path::{Path, PathBuf};

/// Loads the actor's model (weights or random init) on `device`.
pub fn load_policy_model(cfg: &TrainConfig, dir: &Path, device: &burn::tensor::Device) -> Result<CausalLm, TrainError> {
    Ok(if cfg.actor.init == "random" {
        CausalLm::random(ModelConfig::from_dir(dir)?, cfg.actor.init_seed, device)?
    } else {
        CausalLm::load(dir, device)?
    })
}

/// The reward function named by `[reward]`.
pub fn reward_fn(cfg: &TrainConfig) -> Result<Box<dyn RewardFn>, TrainError> {
    build_reward(cfg, &cfg.reward.kind, &cfg.reward.params, "reward.params")
}

/// The reward `[reward.val]` names for validation, when it names one.
pub fn val_reward_fn(cfg: &TrainConfig) -> Result<Option<Box<dyn RewardFn>>, TrainError> {
    cfg.reward.val.as_ref().map(|v| build_reward(cfg, &v.kind, &v.params, "reward.val.params")).transpose()
}

fn build_reward(cfg: &TrainConfig, kind: &str, params: &toml::Table, key: &str) -> Result<Box<dyn RewardFn>, TrainError> {
    let json = serde_json::to_value(params).map_err(|e| TrainError::Other(format!("{key}: {e}")))?;
    let json = if params.is_empty() { serde_json::Value::Null } else { json };
    Ok(crate::reward_model::registry_on(cfg).build(&RewardSpec::with_params(kind.to_string(), json))?)
}

/// `[actor]`'s policy-loss settings; an unknown mode names its key and the valid ones.
pub(crate) fn policy_loss_config(a: &crate::config::ActorConfig) -> Result<PolicyLossConfig, ConfigError> {
    let named = |key: &str, e: reinforge_algos::AlgoError| ConfigError::Invalid(format!("actor.{key}: {e}"));
    let p = &a.policy_loss;
    Ok(PolicyLossConfig {
        loss_mode: p.loss_mode.parse().map_err(|e| named("policy_loss.loss_mode", e))?,
        clip_ratio: a.clip_ratio,
        clip_ratio_low: a.clip_ratio_low,
        clip_ratio_high: a.clip_ratio_high,
        clip_ratio_c: a.clip_ratio_c,
        loss_agg_mode: a.loss_agg_mode.parse().map_err(|e| named("loss_agg_mode", e))?,
        agg: Default::default(),
        clip_cov_ratio: p.clip_cov_ratio,
        clip_cov_lb: p.clip_cov_lb,
        clip_cov_ub: p.clip_cov_ub,
        kl_cov_ratio: p.kl_cov_ratio,
        ppo_kl_coef: p.ppo_kl_coef,
        tau_pos: a.tau_pos,
        tau_neg: a.tau_neg,
        dro_beta: p.dro_beta,
    })
}

/// The policy-update settings of `[actor]`.
pub fn actor_settings(cfg: &TrainConfig) -> Result<ActorSettings, TrainError> {
    let a = &cfg.actor;
    Ok(ActorSettings {
        temperature: cfg.rollout.logprob_temperature(),
        micro: cfg.actor_micro(),
        policy: policy_loss_config(a)?,
        entropy_coeff: a.entropy_coeff,
        kl_loss: if a.use_kl_loss { Some((a.kl_loss_type.parse::<KlPenalty>()?, a.kl_loss_coef)) } else { None },
        share_prompts: a.share_prompts,
    })
}

/// The current policy's weights on `device`: the checkpoint's when resuming, else the model
/// directory's (or a random init); with `actor.lora_rank`, frozen under its LoRA adapter.
pub fn policy_weights(cfg: &TrainConfig, model_dir: &Path, resumed: Option<&Checkpoint>, device: &burn::tensor::Device) -> Result<CausalLm, TrainError> {
    let model = match resumed {
        // A LoRA checkpoint's adapter is attached below.
        Some(ck) => CausalLm::load_base(&ck.dir.join("actor"), device)?,
        None => load_policy_model(cfg, model_dir, device)?,
    };
    with_adapter(cfg, model, resumed)
}

/// Puts the actor's LoRA adapter ([`actor_adapter`]) on `model`.
fn with_adapter(cfg: &TrainConfig, model: CausalLm, resumed: Option<&Checkpoint>) -> Result<CausalLm, TrainError> {
    match actor_adapter(cfg, &model.config, resumed)? {
        Some((adapter, dir)) => model.with_lora(&adapter).map_err(|e| TrainError::Other(format!("{}: {e}", dir.display()))),
        None => Ok(model),
    }
}

/// The actor's LoRA adapter, with where it comes from, on either engine: the checkpoint's when
/// resuming from one that has it, else `actor.lora_adapter_path`'s (whose own
/// `adapter_config.json` gives its rank, alpha and targets, as in verl), else a fresh one
/// (PEFT's init, from `trainer.seed`, so every data-parallel rank draws the same); `None`
/// without LoRA. The factors are checked against `model`.
pub fn actor_adapter(cfg: &TrainConfig, model: &ModelConfig, resumed: Option<&Checkpoint>) -> Result<Option<(Adapter, PathBuf)>, TrainError> {
    let asked = cfg.actor_lora()?;
    let fit = |adapter: Adapter, dir: PathBuf| -> Result<Option<(Adapter, PathBuf)>, TrainError> {
        adapter.check(model).map_err(|e| TrainError::Other(format!("{}: {e}", dir.display())))?;
        Ok(Some((adapter, dir)))
    };
    if let Some(dir) = resumed.map(|ck| ck.dir.join("actor")).filter(|d| Adapter::present(d)) {
        let adapter = Adapter::read(&dir)?;
        let saved = &adapter.config;
        let fits = match (&asked, &cfg.actor.lora_adapter_path) {
            (_, Some(_)) => true,
            (Some(a), None) => a == saved,
            (None, None) => false,
        };
        if !fits {
            return Err(TrainError::Other(format!(
                "{}: this checkpoint trains a LoRA adapter of rank {}, alpha {}, targets {:?}; set actor.lora_rank, lora_alpha and target_modules so to continue it, or start over with --resume none",
                dir.display(),
                saved.rank,
                saved.alpha,
                saved.targets
            )));
        }
        return fit(adapter, dir);
    }
    if let (Some(ck), true) = (resumed, asked.is_some() || cfg.actor.lora_adapter_path.is_some()) {
        // Its optimizer state (and step count) are full fine-tuning's, and the reference would
        // stay the original model rather than these weights.
        return Err(TrainError::Other(format!(
            "{}: this checkpoint fine-tunes every weight, and a LoRA run cannot continue it; start over with --resume none, or `reinforge export` it and start a LoRA run from that model",
            ck.dir.display()
        )));
    }
    if let Some(dir) = &cfg.actor.lora_adapter_path {
        let adapter = Adapter::read(dir)?;
        if let Some(a) = asked.as_ref().filter(|a| **a != adapter.config) {
            let got = &adapter.config;
            tracing::warn!(
                "{}: the adapter's own rank {}, alpha {} and targets {:?} apply (as in verl), not actor.lora_rank {} / lora_alpha {} / target_modules {:?}",
                dir.display(),
                got.rank,
                got.alpha,
                got.targets,
                a.rank,
                a.alpha,
                a.targets
            );
        }
        return fit(adapter, dir.clone());
    }
    match asked {
        Some(lora) => fit(Adapter::fresh(model, &lora, cfg.trainer.seed), PathBuf::from("a fresh LoRA adapter")),
        None => Ok(None),
    }
}

/// The actor (with its hybrid rollout view), optimizer state restored from the checkpoint when
/// resuming. Data-parallel ranks join their group afterwards (`collective`).
pub fn actor(cfg: &TrainConfig, model_dir: &Path, resumed: Option<&Checkpoint>) -> Result<LocalActorRollout, TrainError> {
    let spec: DeviceSpec = cfg.trainer.device.parse()?;
    let model = policy_weights(cfg, model_dir, resumed, &spec.training_device(cfg.actor.gradient_checkpointing)?)?;
    if let Some(lora) = &model.lora {
        let all = burn::module::Module::num_params(&model);
        let trained = model.lora_params();
        tracing::info!(
            "LoRA rank {} (alpha {}) on {}: {trained} of {all} parameters train ({:.2}%)",
            lora.rank,
            lora.alpha,
            lora.targets.join(", "),
            100.0 * trained as f64 / all.max(1) as f64
        );
    }
    let a = &cfg.actor;
    let mut trainer = Trainer::new(model, optim(a.weight_decay, a.betas, a.grad_clip))?;
    if let Some(ck) = resumed {
        trainer.load_optimizer_state(&optimizer_state(ck, "actor")?)?;
    }
    let tok = ChatTokenizer::load_from_dir(model_dir)?;
    let rollout_model = trainer.inference_model();
    Ok(LocalActorRollout {
        decoder: Decoder::new(&rollout_model)?,
        rollout_model,
        trainer,
        tokenizer: tok.tokenizer().clone(),
        settings: actor_settings(cfg)?,
        collective: None,
    })
}

/// The frozen reference: the initial policy, also after a resume.
pub fn reference(cfg: &TrainConfig, model_dir: &Path) -> Result<LocalRef, TrainError> {
    let spec: DeviceSpec = cfg.trainer.device.parse()?;
    Ok(LocalRef { model: load_policy_model(cfg, model_dir, &spec.inference_device()?)?, temperature: cfg.rollout.logprob_temperature(), share_prompts: cfg.actor.share_prompts })
}

/// The critic: `critic.model`, else the policy's backbone with a fresh value head.
pub fn critic(cfg: &TrainConfig, model_dir: &Path, resumed: Option<&Checkpoint>) -> Result<LocalCritic, TrainError> {
    let spec: DeviceSpec = cfg.trainer.device.parse()?;
    let dev = spec.training_device(cfg.actor.gradient_checkpointing)?;
    let (a, c) = (&cfg.actor, &cfg.critic);
    let model = match resumed {
        Some(ck) => ValueModel::load(&ck.dir.join("critic"), &dev)?,
        None => match &c.model {
            Some(m) => ValueModel::load(&reinforge_assets::resolve_model(m)?, &dev)?,
            None if a.init == "random" => {
                let mcfg = ModelConfig::from_dir(model_dir)?;
                let base = CausalLm::random(mcfg.clone(), a.init_seed, &spec.inference_device()?)?;
                ValueModel::from_hf_tensors(mcfg, base.to_hf_tensors()?, &dev)?
            }
            None => ValueModel::load(model_dir, &dev)?,
        },
    };
    let mut trainer = Trainer::new(model, optim(c.weight_decay, a.betas, c.grad_clip))?;
    if let Some(ck) = resumed {
        trainer.load_optimizer_state(&optimizer_state(ck, "critic")?)?;
    }
    Ok(LocalCritic {
        trainer,
        micro: cfg.critic_micro(),
        loss: ValueLossConfig { cliprange_value: c.cliprange_value, loss_agg_mode: agg_mode(&c.loss_agg_mode)?, agg: Default::default() },
        collective: None,
    })
}

/// Whether `trainer.device` is the CUDA engine's (a GPU or its emulator).
fn on_cuda(cfg: &TrainConfig) -> Result<bool, TrainError> {
    Ok(cfg.trainer.device.parse::<DeviceSpec>()?.is_cuda())
}

/// The actor (with its colocated rollout) on the configured engine.
pub fn policy_group(cfg: &TrainConfig, model_dir: &Path, resumed: Option<&Checkpoint>) -> Result<Box<dyn HostedPolicy>, TrainError> {
    Ok(if on_cuda(cfg)? {
        Box::new(crate::cuda::CudaActorRollout::build(&crate::cuda::open_gpu(cfg)?, cfg, model_dir, resumed)?)
    } else {
        Box::new(actor(cfg, model_dir, resumed)?)
    })
}

/// The reference policy on the configured engine.
pub fn reference_group(cfg: &TrainConfig, model_dir: &Path) -> Result<Box<dyn RefGroup>, TrainError> {
    Ok(if on_cuda(cfg)? { Box::new(crate::cuda::CudaRef::build(&crate::cuda::open_gpu(cfg)?, cfg, model_dir)?) } else { Box::new(reference(cfg, model_dir)?) })
}

/// The critic on the configured engine.
pub fn critic_group(cfg: &TrainConfig, model_dir: &Path, resumed: Option<&Checkpoint>) -> Result<Box<dyn HostedCritic>, TrainError> {
    Ok(if on_cuda(cfg)? {
        Box::new(crate::cuda::CudaCritic::build(&crate::cuda::open_gpu(cfg)?, cfg, model_dir, resumed)?)
    } else {
        Box::new(critic(cfg, model_dir, resumed)?)
    })
}

/// A rollout engine with its own copy of the policy's current weights (a rollout rank not
/// colocated with the actor), on the configured engine.
pub fn rollout_engine(cfg: &TrainConfig, model_dir: &Path, resumed: Option<&Checkpoint>) -> Result<Box<dyn RolloutEngine>, TrainError> {
    if on_cuda(cfg)? {
        return Ok(Box::new(crate::cuda::CudaRollout::build(&crate::cuda::open_gpu(cfg)?, cfg, model_dir, resumed)?));
    }
    let spec: DeviceSpec = cfg.trainer.device.parse()?;
    let model = policy_weights(cfg, model_dir, resumed, &spec.inference_device()?)?;
    let tok = ChatTokenizer::load_from_dir(model_dir)?;
    Ok(Box::new(LocalRollout { decoder: Decoder::new(&model)?, tokenizer: tok.tokenizer().clone() }))
}

/// A checkpoint's optimizer state for `role` (`actor`, `critic`), whichever engine wrote it.
pub fn optimizer_state(ck: &Checkpoint, role: &str) -> Result<reinforge_engine::OptimizerState, TrainError> {
    let file = format!("{role}/optimizer.safetensors");
    if !ck.dir.join(&file).is_file() && ck.dir.join(format!("{role}/optimizer.bin")).is_file() {
        return Err(TrainError::Other(format!(
            "{}: this checkpoint keeps its optimizer state in the old burnpack format ({role}/optimizer.bin), which this version cannot read; \
             continue it with the reinforge that wrote it, or start over with --resume none",
            ck.dir.display()
        )));
    }
    let path = ck.dir.join(&file);
    let st = reinforge_engine::OptimizerState::read(&ck.read(&file)?, &path)?;
    let step = resumed_step(ck)?;
    if st.steps != step {
        tracing::debug!("{}: optimizer steps {} at trainer step {step}", path.display(), st.steps);
    }
    Ok(st)
}

/// The step a checkpoint was written at.
pub fn resumed_step(ck: &Checkpoint) -> Result<u64, TrainError> {
    let st: serde_json::Value = serde_json::from_slice(&ck.read("trainer_state.json")?)
        .map_err(|e| TrainError::Other(format!("{}: trainer_state.json is not valid: {e}", ck.dir.display())))?;
    st.get("step")
        .and_then(|s| s.as_u64())
        .ok_or_else(|| TrainError::Other(format!("{}: trainer_state.json has no step", ck.dir.display())))
}
