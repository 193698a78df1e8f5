//! OpenRLHF's `train_ppo_ray` flags (the `--snake_case` set of releases 0.8 to 0.10.1, and the
//! older names its README still shows) in Reinforge's terms: the argument parser ([`parse`]),
//! the one table [`RULES`], and OpenRLHF's defaults ([`defaults`], release 0.8.9).
//!
//! Batch sizes: `--rollout_batch_size` counts prompts (our `data.train_batch_size`),
//! `--train_batch_size` counts sequences over all GPUs per optimizer step (our
//! `actor.ppo_mini_batch_size` × `rollout.n`, so it must divide by `--n_samples_per_prompt`),
//! `--micro_train_batch_size` counts sequences per GPU (our `ppo_micro_batch_size`). KL: with
//! `--use_kl_loss` it is a loss term, otherwise a per-token reward penalty; `--init_kl_coef 0`
//! turns it off (no reference model).

use crate::hydra::{HValue, Op};
use crate::rules::{conv, na, off_only as off_switch, one_only, refuse, to, unset_only, zero_only, Conv, Ctx, Outcome, Rule};
use crate::{CompatError, Given};

const NO_DEEPSPEED: &str = "Reinforge runs data-parallel ranks that each hold the whole model (no DeepSpeed ZeRO, offload or sleep)";
const OWN_ENGINE: &str = "Reinforge's own engine generates (no vLLM) and shares the actor's weights in memory";
const LOGPROB_MICRO: &str = "log-probs and values run in micro-batches of --micro_train_batch_size";
const ROLLOUT_TOKENS: &str = "log-prob and value passes form micro-batches as the updates do (--train_max_tokens_per_gpu with --use_dynamic_batch)";
const UNUSED: &str = "parsed but never read by OpenRLHF itself";

/// How many values a flag takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arity {
    /// `store_true`.
    Switch,
    /// One value.
    One,
    /// Exactly two values.
    Two,
    /// Any number (`nargs='*'`).
    Many,
}

/// `store_true` flags.
const SWITCHES: &[&str] = &[
    "colocate_actor_ref", "colocate_critic_reward", "colocate_all_models", "async_train", "partial_rollout", "vllm_sync_with_ray",
    "enable_prefix_caching", "enforce_eager", "vllm_enable_sleep", "enable_vllm_is_correction", "ref_reward_offload",
    "freeze_visual_encoder", "save_hf_ckpt", "disable_ds_ckpt", "load_checkpoint", "use_ds_universal_ckpt", "save_value_network",
    "gradient_checkpointing", "deepcompile", "bf16", "enable_ema", "adam_offload", "actor_init_on_gpu", "flash_attn",
    "use_liger_kernel", "overlap_comm", "gradient_checkpointing_use_reentrant", "disable_fast_tokenizer", "deepspeed_enable_sleep",
    "packing_samples", "use_dynamic_batch", "load_in_4bit", "full_determinism", "perf", "use_ms", "normalize_reward", "use_kl_loss",
    "no_advantage_std_norm", "dynamic_filtering", "apply_chat_template", "use_icepop",
];

/// Flags of two values.
const PAIRS: &[&str] = &["eps_clip_low_high", "adam_betas", "reward_clip_range", "dynamic_filtering_reward_range", "vllm_is_truncated_threshold", "actor.adam.betas", "critic.adam.betas"];

/// `store_true` / `store_false` flags that exist only under v0.10.2+'s dotted names.
const DOTTED_SWITCHES: &[&str] = &["ref.offload", "reward.offload", "actor.muon.nesterov", "actor.muon.no_nesterov", "critic.muon.nesterov", "critic.muon.no_nesterov"];

/// v0.10.2+ flags answered by a family row (`actor.muon.*`), named for argparse's prefixes.
const DOTTED_FAMILY_FLAGS: &[&str] = &[
    "actor.muon.lr", "actor.muon.momentum", "actor.muon.ns_steps", "actor.muon.nesterov", "actor.muon.no_nesterov",
    "critic.muon.lr", "critic.muon.momentum", "critic.muon.ns_steps", "critic.muon.nesterov", "critic.muon.no_nesterov",
];

/// v0.10.2+'s dotted flag → the v0.10.1 flag it renamed (`actor.model_name_or_path` →
/// `pretrain`), from `data/openrlhf_dotted_flags.tsv`.
fn dotted_renames() -> &'static std::collections::BTreeMap<&'static str, &'static str> {
    static MAP: std::sync::OnceLock<std::collections::BTreeMap<&'static str, &'static str>> = std::sync::OnceLock::new();
    MAP.get_or_init(|| {
        include_str!("data/openrlhf_dotted_flags.tsv")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| l.split_once('\t'))
            .collect()
    })
}

/// The table's flag for a typed name: a v0.10.2+ dotted name is renamed to its v0.10.1 flag
/// (or kept, for the dotted flags with rows of their own), and argparse's unambiguous
/// prefixes name a flag of the version the name comes from.
pub fn canonical(name: &str) -> String {
    if !name.contains('.') {
        return resolve(name);
    }
    let flags = || dotted_flags().chain(DOTTED_FAMILY_FLAGS.iter().copied());
    let full = if flags().any(|k| k == name) {
        name.to_string()
    } else {
        let hits: Vec<&str> = flags().filter(|k| k.starts_with(name)).collect();
        match hits.as_slice() {
            [one] => one.to_string(),
            _ => return name.to_string(),
        }
    };
    dotted_renames().get(full.as_str()).map_or(full, |old| old.to_string())
}

/// v0.10.2+'s dotted flags: the renamed ones and those with rows of their own.
fn dotted_flags() -> impl Iterator<Item = &'static str> {
    dotted_renames().keys().copied().chain(RULES.iter().map(|r| r.key).filter(|k| k.contains('.') && !k.ends_with(".*")))
}

/// The v0.10.2+ dotted flag nearest to a misspelt one.
pub fn nearest_dotted(key: &str) -> Option<&'static str> {
    let score = |k: &str| strsim::normalized_levenshtein(k, key);
    dotted_flags().max_by(|a, b| score(a).total_cmp(&score(b))).filter(|k| score(k) > 0.6)
}

fn arity(flag: &str) -> Arity {
    if SWITCHES.contains(&flag) || DOTTED_SWITCHES.contains(&flag) {
        Arity::Switch
    } else if PAIRS.contains(&flag) {
        Arity::Two
    } else if flag == "target_modules" {
        Arity::Many
    } else {
        Arity::One
    }
}

/// Splits an OpenRLHF command line into flags (as argparse would: `--flag value`,
/// `--flag=value`, unambiguous prefixes) and Reinforge's own `key=value` overrides.
pub fn parse(args: &[String]) -> Result<(Vec<Given>, Vec<String>), CompatError> {
    let mut flags = Vec::new();
    let mut own = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        let Some(body) = a.strip_prefix("--") else {
            if a.contains('=') && !a.starts_with('-') {
                own.push(a.clone());
                continue;
            }
            return Err(CompatError::Syntax {
                arg: a.clone(),
                why: "expected an OpenRLHF --flag (or a Reinforge key=value override)".into(),
            });
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        let name = canonical(name);
        let take = |i: &mut usize, n: usize| -> Vec<String> {
            let mut out = Vec::new();
            while out.len() < n && *i < args.len() && !(args[*i].starts_with("--") && args[*i].len() > 2) {
                out.push(args[*i].clone());
                *i += 1;
            }
            out
        };
        let missing = |what: &str| CompatError::Syntax { arg: a.clone(), why: format!("expects {what}") };
        let (value, shown) = match (arity(&name), inline) {
            (Arity::Switch, None) => (HValue::Bool(true), a.clone()),
            (Arity::Switch, Some(_)) => return Err(CompatError::Syntax { arg: a.clone(), why: "takes no value".into() }),
            (_, Some(v)) => (word(&v), a.clone()),
            (Arity::One, None) => match take(&mut i, 1).first() {
                Some(v) => (word(v), format!("{a} {v}")),
                // A flag of no known version, with no value after it: answered as unknown
                // (with the nearest real flag) rather than as a missing value.
                None if crate::rules::lookup(RULES, &name).is_none() => (HValue::Bool(true), a.clone()),
                None => return Err(missing("a value")),
            },
            (Arity::Two, None) => {
                let v = take(&mut i, 2);
                if v.len() != 2 {
                    return Err(missing("two values"));
                }
                (HValue::List(v.iter().map(|x| word(x)).collect()), format!("{a} {}", v.join(" ")))
            }
            (Arity::Many, None) => {
                let v = take(&mut i, usize::MAX);
                let shown = if v.is_empty() { a.clone() } else { format!("{a} {}", v.join(" ")) };
                (HValue::List(v.iter().map(|x| word(x)).collect()), shown)
            }
        };
        flags.push(Given { raw: shown, key: name, op: Op::Set, value });
    }
    Ok((flags, own))
}

/// argparse's prefix matching: an unambiguous prefix of one known flag names it.
fn resolve(name: &str) -> String {
    if RULES.iter().any(|r| r.key == name) {
        return name.to_string();
    }
    let hits: Vec<&str> = RULES.iter().map(|r| r.key).filter(|k| k.starts_with(name)).collect();
    match hits.as_slice() {
        [one] => one.to_string(),
        _ => name.to_string(),
    }
}

/// One command-line word typed as argparse's `type=int/float` would read it.
fn word(w: &str) -> HValue {
    match w.parse::<i64>() {
        Ok(i) => HValue::Int(i),
        Err(_) => match w.parse::<f64>() {
            Ok(f) => HValue::Float(f),
            Err(_) => HValue::Str(w.to_string()),
        },
    }
}

/// Every OpenRLHF flag Reinforge answers for.
pub static RULES: &[Rule] = &[
    // ---- placement
    conv("actor_num_nodes", placement, "placement, with the other *_num_nodes / *_num_gpus_per_node, --vllm_num_engines and --colocate_*: `cluster.backend = \"ray\"` and `cluster.{actor,ref,critic,reward,rollout}.{nnodes,gpus_per_node}`; --colocate_all_models on 1 GPU runs in one process"),
    conv("actor_num_gpus_per_node", placement, "see --actor_num_nodes"),
    conv("ref_num_nodes", placement, "see --actor_num_nodes"),
    conv("ref_num_gpus_per_node", placement, "see --actor_num_nodes"),
    conv("critic_num_nodes", placement, "see --actor_num_nodes"),
    conv("critic_num_gpus_per_node", placement, "see --actor_num_nodes"),
    conv("reward_num_nodes", placement, "see --actor_num_nodes"),
    conv("reward_num_gpus_per_node", placement, "see --actor_num_nodes"),
    conv("vllm_num_engines", placement, "`cluster.rollout`: one generation rank per engine (see --actor_num_nodes)"),
    conv("colocate_all_models", placement, "`cluster.colocate_all = true`"),
    conv("colocate_actor_ref", placement, "`cluster.colocate_actor_ref = true`"),
    conv("colocate_critic_reward", placement, "`cluster.colocate_critic_reward = true`"),
    conv("vllm_tensor_parallel_size", vllm_tp, "accepted: one generation rank per GPU, so --vllm_num_engines × this many ranks"),
    conv("ds_tensor_parallel_size", one_only, "1 accepted; more refused (no tensor parallelism yet)"),
    conv("ring_attn_size", ring_attention, "n/a: every rank holds whole sequences (the same loss and gradient; a sequence must fit one GPU)"),
    na("ring_head_stride", "applies with --ring_attn_size > 1"),
    conv("async_train", off_switch, "refused: generation and training alternate (on-policy)"),
    na("async_queue_size", "applies with --async_train"),
    na("partial_rollout", "applies with --async_train"),
    // ---- generation engine
    to("vllm_gpu_memory_utilization", "rollout.gpu_memory_utilization", Conv::Float),
    na("vllm_sync_backend", OWN_ENGINE),
    na("vllm_sync_with_ray", OWN_ENGINE),
    na("enable_prefix_caching", OWN_ENGINE),
    to("enforce_eager", "rollout.enforce_eager", Conv::Bool),
    na("vllm_enable_sleep", OWN_ENGINE),
    na("vllm_generate_batch_size", "every prompt of the step is generated in one batch"),
    na("enable_vllm_is_correction", "rollout and training use one engine's weights: there is no engine mismatch to correct"),
    na("vllm_is_truncated_threshold", "applies with --enable_vllm_is_correction"),
    na("vllm_is_correction_type", "applies with --enable_vllm_is_correction"),
    na("use_icepop", "applies with --enable_vllm_is_correction"),
    // ---- models and rewards
    to("pretrain", "actor.model", Conv::Text),
    conv("reward_pretrain", reward_pretrain, "`reward.kind = \"reward_model\"`, `reward.params.path` (one model); with gae and no --critic_pretrain also `critic.model`"),
    to("critic_pretrain", "critic.model", Conv::Text),
    conv("remote_rm_url", remote_rm, "a `.py` file: `reward.kind = \"python\"` with `style = \"openrlhf\"` (its reward_func runs as OpenRLHF calls it); a URL: `reward.kind = \"remote\"` with `protocol = \"openrlhf\"`"),
    conv("value_head_prefix", value_head, "`score` accepted (the head Reinforge reads); others refused"),
    conv("agent_func_path", agent, "refused: Python agent functions do not run in Reinforge"),
    na("freeze_visual_encoder", "text models only"),
    // ---- batch sizes and schedule
    to("num_episodes", "trainer.total_epochs", Conv::Count),
    to("rollout_batch_size", "data.train_batch_size", Conv::Count),
    na("micro_rollout_batch_size", LOGPROB_MICRO),
    to("max_epochs", "actor.ppo_epochs", Conv::Count),
    to("max_samples", "data.max_samples", Conv::Count),
    conv("micro_train_batch_size", micro_train, "`actor.ppo_micro_batch_size` and `critic.ppo_micro_batch_size` (sequences per GPU)"),
    conv("train_batch_size", mini_batch, "`actor.ppo_mini_batch_size` = value ÷ --n_samples_per_prompt (sequences → prompts, exact)"),
    conv("n_samples_per_prompt", mini_batch, "`rollout.n` (and the mini-batch conversion above)"),
    // ---- optimizer
    conv("max_norm", grad_clip, "`actor.grad_clip` and `critic.grad_clip`"),
    conv("l2", weight_decay, "`actor.weight_decay` and `critic.weight_decay`"),
    to("actor_learning_rate", "actor.lr", Conv::Float),
    to("critic_learning_rate", "critic.lr", Conv::Float),
    conv("lr_warmup_ratio", warmup_ratio, "`actor.lr_warmup_ratio` and `critic.lr_warmup_ratio`"),
    conv("lr_scheduler", lr_scheduler, "cosine_with_min_lr → `actor.lr_scheduler = \"cosine\"`, `actor.min_lr_ratio = 0.1`; cosine; constant(_with_warmup) → constant"),
    to("adam_betas", "actor.betas", Conv::Same),
    // ---- RL algorithm
    na("ptx_coef", UNUSED),
    na("actor_init_on_gpu", UNUSED),
    na("perf", UNUSED),
    to("eps_clip", "actor.clip_ratio", Conv::Float),
    conv("eps_clip_low_high", eps_low_high, "`actor.clip_ratio_low`, `actor.clip_ratio_high`"),
    conv("dual_clip", dual_clip, "`actor.clip_ratio_c` (unset: no dual clip)"),
    to("value_clip", "critic.cliprange_value", Conv::Float),
    to("lambd", "algorithm.lam", Conv::Float),
    to("gamma", "algorithm.gamma", Conv::Float),
    na("normalize_reward", "reward-model scores are used as they are (OpenRLHF divides by a mean/std stored in the reward model's config.json)"),
    conv("freezing_actor_steps", freezing, "-1 accepted; more refused (critic warm-up: not yet)"),
    conv("init_kl_coef", kl, "KL: 0 → none; with --use_kl_loss → `actor.use_kl_loss`, `actor.kl_loss_coef`, `actor.kl_loss_type`; otherwise → `algorithm.use_kl_in_reward`, `algorithm.kl_ctrl.kl_coef`, `algorithm.kl_penalty`"),
    conv("use_kl_loss", kl, "see --init_kl_coef"),
    conv("kl_estimator", kl, "k1 → kl, k2 → mse, k3 → low_var_kl (see --init_kl_coef)"),
    conv("kl_target", kl_target, "`algorithm.kl_ctrl.type = \"adaptive\"`, `algorithm.kl_ctrl.target_kl`"),
    to("kl_horizon", "algorithm.kl_ctrl.horizon", Conv::Float),
    conv("policy_loss_type", policy_loss, "`ppo`; `gspo`: `actor.policy_loss.loss_mode = \"gspo\"` with `actor.loss_agg_mode = \"seq-mean-token-mean\"`"),
    conv("aux_loss_coef", zero_only, "0 accepted; more refused (no MoE auxiliary loss)"),
    conv("entropy_loss_coef", entropy, "`actor.entropy_coeff` (unset: 0)"),
    na("reward_clip_range", "scores are not clipped before the KL penalty"),
    conv("advantage_estimator", estimator, "gae → gae, reinforce → reinforce_plus_plus, rloo → rloo, reinforce_baseline → reinforce_plus_plus_baseline, group_norm → grpo, dr_grpo → grpo with `algorithm.norm_adv_by_std_in_grpo = false`"),
    conv("no_advantage_std_norm", off_switch, "refused: advantages are whitened as OpenRLHF's default does"),
    conv("overlong_buffer_len", overlong, "`reward.overlong_buffer` (DAPO's overlong penalty: `len`, `penalty_factor` from --overlong_penalty_factor)"),
    conv("overlong_penalty_factor", overlong_factor, "`reward.overlong_buffer.penalty_factor` (with --overlong_buffer_len)"),
    conv("dynamic_filtering", dynamic_filtering, "`algorithm.filter_groups` with `reward_range` (a prompt is kept when its samples' mean score is inside the range: a reward_func's or server's `scores`, else the reward's)"),
    na("dynamic_filtering_reward_range", "read with --dynamic_filtering"),
    to("stop_properly_penalty_coef", "reward.stop_properly_penalty_coef", Conv::Float),
    // ---- lengths and sampling
    to("prompt_max_len", "data.max_prompt_length", Conv::Count),
    to("generate_max_len", "data.max_response_length", Conv::Count),
    to("max_new_tokens", "data.max_response_length", Conv::Count),
    conv("max_len", max_len, "without --generate_max_len/--max_new_tokens: `data.max_response_length` = value − prompt length"),
    to("top_p", "rollout.top_p", Conv::Float),
    to("temperature", "rollout.temperature", Conv::Float),
    to("eval_temperature", "rollout.val_temperature", Conv::Float),
    to("eval_n_samples_per_prompt", "rollout.val_n", Conv::Count),
    // ---- data
    conv("prompt_data", train_files, "`data.train_files` (local parquet/JSONL/JSON files or dataset directories, or Hub dataset ids in the Hugging Face cache; comma separated)"),
    conv("prompt_data_probs", unset_only, "unset accepted; mixing probabilities refused (files are concatenated)"),
    na("prompt_split", "read with --prompt_data: the split whose files a local dataset directory gives (default train)"),
    conv("eval_dataset", val_files, "`data.val_files`"),
    na("eval_split", "read with --eval_dataset: the split whose files a local dataset directory gives (default train)"),
    to("input_key", "data.prompt_key", Conv::Text),
    to("label_key", "data.label_key", Conv::Text),
    conv("input_template", unset_only, "unset accepted; a template refused (write it into the prompts)"),
    to("apply_chat_template", "data.apply_chat_template", Conv::Bool),
    refuse("image_key", "multimodal prompts are not supported"),
    conv("max_images_per_prompt", zero_only, "0 accepted; more refused (text only)"),
    na("dataloader_num_workers", "the loader runs in the controller"),
    na("disable_fast_tokenizer", "Reinforge has one (fast) tokenizer"),
    // ---- checkpoints, eval and logging
    to("eval_steps", "trainer.test_freq", Conv::Never),
    to("save_steps", "trainer.save_freq", Conv::Never),
    na("logging_steps", "every step is logged"),
    to("ckpt_path", "trainer.default_local_dir", Conv::Text),
    na("save_hf_ckpt", "`reinforge export RUN/checkpoints/global_step_N --hf OUT` writes a Hugging Face directory from any checkpoint"),
    na("disable_ds_ckpt", NO_DEEPSPEED),
    to("max_ckpt_num", "trainer.max_ckpt_to_keep", Conv::Count),
    na("max_ckpt_mem", "checkpoints are kept by count (--max_ckpt_num)"),
    conv("load_checkpoint", load_checkpoint, "`--resume auto` (without it: `--resume none`)"),
    na("use_ds_universal_ckpt", "Reinforge checkpoints resume on any number of ranks"),
    na("save_path", "`reinforge export` writes the final Hugging Face directory"),
    na("save_value_network", "the critic is in every checkpoint"),
    na("best_metric_key", "every checkpoint is kept per --max_ckpt_num"),
    conv("use_wandb", use_wandb, "adds `wandb` to `trainer.logger` (a key given here is used as WANDB_API_KEY when none is set)"),
    na("wandb_org", "set WANDB_ENTITY"),
    na("wandb_group", "not passed to W&B"),
    to("wandb_project", "trainer.project_name", Conv::Text),
    to("wandb_run_name", "trainer.experiment_name", Conv::Text),
    conv("use_tensorboard", tensorboard, "adds `tensorboard` to `trainer.logger` (event files in the run directory)"),
    // ---- DeepSpeed, memory, precision
    na("local_rank", "Ray starts the ranks"),
    na("zero_stage", NO_DEEPSPEED),
    na("zpg", NO_DEEPSPEED),
    na("adam_offload", NO_DEEPSPEED),
    na("deepspeed_enable_sleep", NO_DEEPSPEED),
    na("ref_reward_offload", NO_DEEPSPEED),
    na("overlap_comm", NO_DEEPSPEED),
    na("grad_accum_dtype", "gradients accumulate in f32"),
    na("deepcompile", NO_DEEPSPEED),
    to("gradient_checkpointing", "actor.gradient_checkpointing", Conv::Bool),
    na("gradient_checkpointing_use_reentrant", "applies to PyTorch's checkpointing"),
    conv("bf16", bf16, "`trainer.dtype = \"bf16\"`"),
    conv("param_dtype", param_dtype, "bf16 → `trainer.dtype = \"bf16\"`; fp16 refused"),
    na("flash_attn", "the CUDA engine's attention is fused already"),
    na("attn_implementation", "the CUDA engine's attention is fused already"),
    na("use_liger_kernel", "Reinforge uses its own fused kernels"),
    na("packing_samples", "Reinforge always packs sequences"),
    conv("use_dynamic_batch", dynamic_batch, "`actor.use_dynamic_bsz` and `critic.use_dynamic_bsz`, with `ppo_max_token_len_per_gpu` = --train_max_tokens_per_gpu (default 16192)"),
    na("rollout_max_tokens_per_gpu", ROLLOUT_TOKENS),
    conv("train_max_tokens_per_gpu", train_max_tokens, "`actor.ppo_max_token_len_per_gpu` and `critic.ppo_max_token_len_per_gpu`"),
    conv("load_in_4bit", off_switch, "refused: quantized training is not supported"),
    conv("lora_rank", lora_rank, "`actor.lora_rank`; refused with a critic (gae), since OpenRLHF gives the critic the same LoRA and Reinforge's critic fine-tunes every weight"),
    to("lora_alpha", "actor.lora_alpha", Conv::Float),
    to("target_modules", "actor.target_modules", Conv::TextList),
    conv("lora_dropout", zero_only, "0 accepted; LoRA dropout refused (not yet)"),
    to("seed", "trainer.seed", Conv::Count),
    na("full_determinism", "a Reinforge run is deterministic for a seed and a rank count"),
    conv("enable_ema", off_switch, "refused: an EMA copy of the actor is not supported"),
    na("ema_beta", "applies with --enable_ema"),
    na("use_ms", "models come from local directories"),
    refuse("pretrain_data", "mixing a pretraining loss (ptx) into PPO is not supported"),
    na("pretrain_data_probs", "applies with --pretrain_data"),
    na("pretrain_split", "applies with --pretrain_data"),
    // ---- v0.10.2+ (dotted flags): the rest are renames of the rows above
    // (data/openrlhf_dotted_flags.tsv); these split a flag per model, or are new.
    to("actor.max_norm", "actor.grad_clip", Conv::Float),
    to("critic.max_norm", "critic.grad_clip", Conv::Float),
    to("actor.adam.weight_decay", "actor.weight_decay", Conv::Float),
    to("critic.adam.weight_decay", "critic.weight_decay", Conv::Float),
    to("actor.lr_warmup_ratio", "actor.lr_warmup_ratio", Conv::Float),
    to("critic.lr_warmup_ratio", "critic.lr_warmup_ratio", Conv::Float),
    na("critic.lr_scheduler", "the critic's learning rate is constant after its warm-up (critic.lr)"),
    conv("actor.adam.betas", actor_betas, "`actor.betas`; refused when a critic trains with other betas (Reinforge's critic uses the actor's)"),
    conv("critic.adam.betas", critic_betas, "accepted when equal to --actor.adam.betas (the critic uses the actor's betas); otherwise refused"),
    conv("actor.min_lr_ratio", min_lr_ratio, "`actor.min_lr_ratio` with --actor.lr_scheduler cosine_with_min_lr"),
    na("critic.min_lr_ratio", "the critic's learning rate is constant after its warm-up (critic.lr)"),
    conv("actor.optim", optimizer, "adam accepted (AdamW); muon refused"),
    conv("critic.optim", optimizer, "adam accepted (AdamW); muon refused"),
    na("actor.muon.*", "applies with --actor.optim muon"),
    na("critic.muon.*", "applies with --critic.optim muon"),
    conv("actor.adam.eps", adam_eps, "1e-8 accepted (Reinforge's AdamW eps); other values refused"),
    conv("critic.adam.eps", adam_eps, "1e-8 accepted (Reinforge's AdamW eps); other values refused"),
    na("ref.offload", NO_DEEPSPEED),
    na("reward.offload", NO_DEEPSPEED),
    na("ds.experts_implementation", "a transformers MoE kernel choice; Reinforge's engine runs dense Llama/Qwen2 decoders"),
];

/// OpenRLHF 0.8.9's defaults for every flag whose default differs from Reinforge's or that a
/// conversion reads.
pub fn defaults() -> Vec<(&'static str, HValue)> {
    use HValue::*;
    vec![
        ("actor_num_nodes", Int(1)),
        ("actor_num_gpus_per_node", Int(8)),
        ("rollout_batch_size", Int(1024)),
        ("train_batch_size", Int(128)),
        ("n_samples_per_prompt", Int(1)),
        ("micro_train_batch_size", Int(4)),
        ("max_epochs", Int(1)),
        ("num_episodes", Int(1)),
        ("prompt_max_len", Int(1024)),
        ("generate_max_len", Int(1024)),
        ("actor_learning_rate", Float(1e-6)),
        ("critic_learning_rate", Float(9e-6)),
        ("lr_warmup_ratio", Float(0.03)),
        ("lr_scheduler", Str("cosine_with_min_lr".into())),
        ("adam_betas", List(vec![Float(0.9), Float(0.95)])),
        ("l2", Float(0.0)),
        ("max_norm", Float(1.0)),
        ("eps_clip", Float(0.2)),
        ("dual_clip", Null),
        ("value_clip", Float(0.5)),
        ("gamma", Float(1.0)),
        ("lambd", Float(1.0)),
        ("init_kl_coef", Float(0.01)),
        ("kl_estimator", Str("k1".into())),
        ("kl_horizon", Int(10000)),
        ("advantage_estimator", Str("gae".into())),
        ("temperature", Float(1.0)),
        ("top_p", Float(1.0)),
        ("eval_temperature", Float(0.6)),
        ("eval_n_samples_per_prompt", Int(4)),
        ("seed", Int(42)),
        ("input_key", Str("input".into())),
        ("save_steps", Int(-1)),
        ("eval_steps", Int(-1)),
        ("max_ckpt_num", Int(3)),
        ("ckpt_path", Str("./ckpt/checkpoints_ppo_ray".into())),
        ("wandb_project", Str("openrlhf_train_ppo".into())),
        ("vllm_gpu_memory_utilization", Float(0.95)),
        ("apply_chat_template", Bool(false)),
        ("load_checkpoint", Bool(false)),
        ("use_tensorboard", Null),
        ("use_wandb", Null),
    ]
}

fn text(v: &HValue) -> String {
    v.as_text().unwrap_or_else(|| v.to_string())
}

fn placement(c: &mut Ctx<'_>, _: &HValue) -> Result<Outcome, String> {
    let role = |c: &Ctx<'_>, r: &str| (c.count(&format!("{r}_num_nodes"), 1), c.count(&format!("{r}_num_gpus_per_node"), 8));
    let all = c.flag("colocate_all_models", false);
    let actor = role(c, "actor");
    if actor.0 == 0 || actor.1 == 0 {
        return Err("--actor_num_nodes and --actor_num_gpus_per_node must be ≥ 1".into());
    }
    // vLLM's tensor parallelism splits an engine over GPUs; Reinforge runs one engine per GPU,
    // so the same GPUs make engines × TP generation ranks.
    let engines = c.count("vllm_num_engines", 0) * c.count("vllm_tensor_parallel_size", 1).max(1);
    if all && actor.0 * actor.1 == 1 {
        c.set("cluster.backend", "local");
        return Ok(Outcome::Mapped);
    }
    c.set("cluster.backend", "ray");
    c.set("cluster.colocate_all", all);
    c.set("cluster.colocate_actor_ref", c.flag("colocate_actor_ref", false));
    c.set("cluster.colocate_critic_reward", c.flag("colocate_critic_reward", false));
    for r in ["actor", "ref", "critic", "reward"] {
        let (n, g) = role(c, r);
        c.set(&format!("cluster.{r}.nnodes"), n as i64);
        c.set(&format!("cluster.{r}.gpus_per_node"), g as i64);
    }
    // Generation ranks: one per vLLM engine, spread over the actor's nodes when they divide
    // evenly; without vLLM OpenRLHF generates in the actor's ranks, so as many.
    let (rn, rg) = match engines {
        0 => actor,
        e if e % actor.0 == 0 => (actor.0, e / actor.0),
        e => (1, e),
    };
    c.set("cluster.rollout.nnodes", rn as i64);
    c.set("cluster.rollout.gpus_per_node", rg as i64);
    Ok(Outcome::Mapped)
}

fn vllm_tp(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_usize() {
        Some(1) => Ok(Outcome::NotApplicable("one engine per GPU".into())),
        Some(tp) if tp > 1 => {
            let engines = c.count("vllm_num_engines", 0);
            Ok(Outcome::NotApplicable(format!(
                "one generation rank per GPU instead of engines split over {tp} GPUs: the {engines} engine(s) × {tp} GPUs make {} ranks (cluster.rollout)",
                engines * tp
            )))
        }
        _ => Err(format!("expected a GPU count ≥ 1, got `{v}`")),
    }
}

fn reward_pretrain(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let paths = text(v);
    let first = paths.split(',').next().unwrap_or_default().trim().to_string();
    if paths.contains(',') {
        return Err("several reward models are not supported; give one (or use reward.kind = \"combined\")".into());
    }
    if c.get("remote_rm_url").is_some() {
        return Ok(Outcome::NotApplicable("--remote_rm_url scores instead".into()));
    }
    c.set("reward.kind", "reward_model");
    c.set("reward.params.path", first.clone());
    // OpenRLHF's prompt files are `{input, label}` rows: nothing routes a reward model, and it
    // needs no answer.
    c.set("data.default_data_source", "openrlhf");
    c.set("data.require_ground_truth", false);
    if c.get("critic_pretrain").is_none() && trains_critic(c) {
        c.set("critic.model", first);
    }
    Ok(Outcome::Mapped)
}

/// OpenRLHF's `--remote_rm_url`: a Python file with `reward_func(queries, prompts, labels)`,
/// or a reward server speaking its protocol. Its prompt rows are `{input, label}`: nothing
/// routes them, and the label (`--label_key`) is the ground truth when there is one.
fn remote_rm(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if v.is_null() {
        return Ok(Outcome::NotApplicable("unset".into()));
    }
    let target = text(v);
    if target.contains(',') {
        return Err("several reward servers (OpenRLHF shards a batch over them): give one, or put a load balancer in front of them".into());
    }
    if target.ends_with(".py") {
        c.set("reward.kind", "python");
        c.set("reward.params.path", target);
        c.set("reward.params.style", "openrlhf");
    } else if target.starts_with("http://") || target.starts_with("https://") {
        // OpenRLHF's client: 180 s a request, five tries; it sends one sample a request,
        // many at once, where ours go in chunks of 64 one after another.
        c.set("reward.kind", "remote");
        c.set("reward.params.url", target);
        c.set("reward.params.protocol", "openrlhf");
        c.set("reward.params.timeout_s", 180.0);
        c.set("reward.params.max_tries", 5);
        c.set("reward.params.batch_size", 64);
    } else {
        return Err(format!("`{target}` is neither a .py file with reward_func nor an http(s) URL of a reward server"));
    }
    c.set("data.default_data_source", "openrlhf");
    if c.get("label_key").is_none() {
        c.set("data.require_ground_truth", false);
    }
    Ok(Outcome::Mapped)
}

fn value_head(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match text(v).as_str() {
        "score" => Ok(Outcome::NotApplicable("the value head is `score`".into())),
        other => Err(format!("value head `{other}`: Reinforge reads `score.weight`; rename the tensor")),
    }
}

fn agent(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if v.is_null() {
        return Ok(Outcome::NotApplicable("unset".into()));
    }
    Err("Python agent functions do not run in Reinforge; its multi-turn rollouts are verl's tool agent (tools.calls, README \"Tool calling\") and Search-R1's search loop (tools.search, README \"Search-R1\")".into())
}

fn micro_train(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let n = v.as_usize().filter(|n| *n > 0).ok_or_else(|| format!("expected a batch size ≥ 1, got `{v}`"))?;
    c.set("actor.ppo_micro_batch_size", n as i64);
    c.set("critic.ppo_micro_batch_size", n as i64);
    Ok(Outcome::Mapped)
}

/// OpenRLHF's token-budget micro-batches: ours for both trained roles, at OpenRLHF's budget.
fn dynamic_batch(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let on = v.as_bool().ok_or_else(|| format!("expected a switch, got `{v}`"))?;
    c.set("actor.use_dynamic_bsz", on);
    c.set("critic.use_dynamic_bsz", on);
    if on {
        let t = c.count("train_max_tokens_per_gpu", 16192) as i64;
        c.set("actor.ppo_max_token_len_per_gpu", t);
        c.set("critic.ppo_max_token_len_per_gpu", t);
    }
    Ok(Outcome::Mapped)
}

fn train_max_tokens(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let n = v.as_usize().filter(|n| *n > 0).ok_or_else(|| format!("expected a token count ≥ 1, got `{v}`"))?;
    c.set("actor.ppo_max_token_len_per_gpu", n as i64);
    c.set("critic.ppo_max_token_len_per_gpu", n as i64);
    Ok(Outcome::Mapped)
}

fn mini_batch(c: &mut Ctx<'_>, _: &HValue) -> Result<Outcome, String> {
    let (train, n) = (c.count("train_batch_size", 128), c.count("n_samples_per_prompt", 1));
    if n == 0 || train == 0 || train % n != 0 {
        return Err(format!(
            "--train_batch_size {train} is not a whole number of prompt groups of --n_samples_per_prompt {n}; Reinforge's mini-batches hold whole groups: use a multiple of {n}"
        ));
    }
    c.set("rollout.n", n as i64);
    c.set("actor.ppo_mini_batch_size", (train / n) as i64);
    Ok(Outcome::Mapped)
}

fn grad_clip(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    set_both(c, v, "actor.grad_clip", "critic.grad_clip")
}

fn weight_decay(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    set_both(c, v, "actor.weight_decay", "critic.weight_decay")
}

fn warmup_ratio(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    set_both(c, v, "actor.lr_warmup_ratio", "critic.lr_warmup_ratio")
}

fn set_both(c: &mut Ctx<'_>, v: &HValue, a: &str, b: &str) -> Result<Outcome, String> {
    let x = v.as_f64().ok_or_else(|| format!("expected a number, got `{v}`"))?;
    c.set(a, x);
    c.set(b, x);
    Ok(Outcome::Mapped)
}

fn lr_scheduler(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    // v0.10.2+ sets the floor with --actor.min_lr_ratio (default 0.1, v0.10.1's fixed value).
    let min_lr = c.get("actor.min_lr_ratio").and_then(HValue::as_f64).unwrap_or(0.1);
    let (sched, floor) = match text(v).as_str() {
        "cosine_with_min_lr" => ("cosine", min_lr),
        "cosine" => ("cosine", 0.0),
        "constant" | "constant_with_warmup" => ("constant", 0.0),
        other => return Err(format!("schedule `{other}` is not supported; cosine_with_min_lr, cosine or constant_with_warmup")),
    };
    c.set("actor.lr_scheduler", sched);
    c.set("actor.min_lr_ratio", floor);
    Ok(Outcome::Mapped)
}

fn min_lr_ratio(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let x = v.as_f64().filter(|x| (0.0..=1.0).contains(x)).ok_or_else(|| format!("expected a fraction of the learning rate, got `{v}`"))?;
    if c.get("lr_scheduler").and_then(HValue::as_text).as_deref() != Some("cosine_with_min_lr") {
        return Ok(Outcome::NotApplicable("applies with --actor.lr_scheduler cosine_with_min_lr".into()));
    }
    c.set("actor.min_lr_ratio", x);
    Ok(Outcome::Mapped)
}

/// v0.10.2+'s per-model Adam betas (default (0.9, 0.95), v0.10.1's `--adam_betas`, which set
/// both): Reinforge's critic uses the actor's, so they must agree when a critic trains.
fn betas_of(c: &Ctx<'_>, model: &str) -> Option<Vec<f64>> {
    let pair = |h: &HValue| match h {
        HValue::List(p) if p.len() == 2 => p.iter().map(HValue::as_f64).collect::<Option<Vec<f64>>>(),
        _ => None,
    };
    match c.get(&format!("{model}.adam.betas")).or_else(|| c.get("adam_betas")) {
        Some(h) => pair(h),
        None => Some(vec![0.9, 0.95]),
    }
}

fn lora_rank(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let r = v.as_usize().ok_or_else(|| format!("expected a rank (a count), got `{v}`"))?;
    if r > 0 && trains_critic(c) {
        return Err(format!(
            "{r}: OpenRLHF puts the same LoRA on the critic (gae, its default estimator), and LoRA on the critic is not supported yet; use a critic-free --advantage_estimator (group_norm, rloo, reinforce_baseline, dr_grpo) or --lora_rank 0"
        ));
    }
    c.set("actor.lora_rank", r as i64);
    Ok(Outcome::Mapped)
}

/// OpenRLHF trains a critic for gae (its default estimator) only.
fn trains_critic(c: &Ctx<'_>) -> bool {
    c.get("advantage_estimator").and_then(HValue::as_text).as_deref().unwrap_or("gae") == "gae"
}

fn actor_betas(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let actor = betas_of(c, "actor").ok_or_else(|| format!("expected two numbers, got `{v}`"))?;
    if trains_critic(c) && betas_of(c, "critic").as_ref() != Some(&actor) {
        return Err(format!(
            "the actor's Adam betas ({v}) differ from the critic's ({}); Reinforge's critic uses the actor's: give --critic.adam.betas the same",
            betas_of(c, "critic").map_or("?".into(), |b| format!("{} {}", b[0], b[1]))
        ));
    }
    c.set("actor.betas", toml::Value::Array(actor.into_iter().map(toml::Value::Float).collect()));
    Ok(Outcome::Mapped)
}

fn critic_betas(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if !trains_critic(c) {
        return Ok(Outcome::NotApplicable("no critic trains with this estimator".into()));
    }
    match (betas_of(c, "critic"), betas_of(c, "actor")) {
        (Some(a), Some(b)) if a == b => Ok(Outcome::NotApplicable("the critic uses the actor's Adam betas, which are the same".into())),
        _ => Err(format!("the critic's Adam betas ({v}) differ from the actor's; Reinforge's critic uses the actor's: give both the same")),
    }
}

fn optimizer(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match text(v).as_str() {
        "adam" => Ok(Outcome::NotApplicable("AdamW, as Reinforge trains".into())),
        other => Err(format!("optimizer `{other}` is not supported; Reinforge trains with AdamW (adam)")),
    }
}

fn adam_eps(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_f64() {
        Some(e) if (e - 1e-8).abs() < 1e-12 => Ok(Outcome::NotApplicable("Reinforge's AdamW eps is 1e-8".into())),
        _ => Err(format!("Adam eps {v} is not supported; Reinforge's AdamW uses 1e-8")),
    }
}

fn eps_low_high(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v {
        HValue::List(p) if p.len() == 2 => {
            let (lo, hi) = (p[0].as_f64().ok_or("expected two numbers")?, p[1].as_f64().ok_or("expected two numbers")?);
            c.set("actor.clip_ratio_low", lo);
            c.set("actor.clip_ratio_high", hi);
            Ok(Outcome::Mapped)
        }
        HValue::Null => Ok(Outcome::NotApplicable("--eps_clip both ways".into())),
        _ => Err("expected two numbers".into()),
    }
}

fn dual_clip(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_f64() {
        // OpenRLHF without --dual_clip has no dual clip: a bound no ratio reaches.
        None if v.is_null() => c.set("actor.clip_ratio_c", 1e9),
        Some(x) if x > 1.0 => c.set("actor.clip_ratio_c", x),
        _ => return Err(format!("--dual_clip {v}: expected a number > 1")),
    }
    Ok(Outcome::Mapped)
}

/// OpenRLHF refills filtered prompts from the dataloader until the rollout batch is full,
/// keeping a prompt whose samples' mean reward is strictly inside the range (default (0, 1)).
fn dynamic_filtering(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if v.as_bool() != Some(true) {
        return Ok(Outcome::NotApplicable("off".into()));
    }
    let range = match c.get("dynamic_filtering_reward_range") {
        Some(HValue::List(p)) if p.len() == 2 => (p[0].as_f64(), p[1].as_f64()),
        None | Some(HValue::Null) => (Some(0.0), Some(1.0)),
        Some(other) => return Err(format!("--dynamic_filtering_reward_range {other}: expected two numbers")),
    };
    let (Some(lo), Some(hi)) = range else { return Err("--dynamic_filtering_reward_range: expected two numbers".into()) };
    if lo >= hi || lo.is_nan() || hi.is_nan() {
        return Err(format!("--dynamic_filtering_reward_range {lo} {hi}: the low end must be below the high end"));
    }
    c.set("algorithm.filter_groups.enable", true);
    c.set("algorithm.filter_groups.metric", "score");
    c.set("algorithm.filter_groups.reward_range", toml::Value::Array(vec![toml::Value::Float(lo), toml::Value::Float(hi)]));
    Ok(Outcome::Mapped)
}

/// DAPO's overlong penalty as OpenRLHF's `apply_overlong_penalty` computes it: the ramp ends
/// at `--max_new_tokens`, or without it at `--max_len` (prompt included, as OpenRLHF reads it).
fn overlong(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if v.is_null() {
        return Ok(Outcome::NotApplicable("unset: no overlong penalty".into()));
    }
    let len = v.as_f64().filter(|x| *x >= 1.0 && x.fract() == 0.0).ok_or_else(|| format!("expected a whole number of tokens ≥ 1, got `{v}`"))?;
    c.set("reward.overlong_buffer.enable", true);
    c.set("reward.overlong_buffer.len", len as i64);
    let factor = c.get("overlong_penalty_factor").map_or(Some(1.0), HValue::as_f64).ok_or("--overlong_penalty_factor: expected a number")?;
    c.set("reward.overlong_buffer.penalty_factor", factor);
    if c.get("max_new_tokens").is_none() {
        if let Some(total) = c.get("max_len") {
            let total = total.as_usize().ok_or_else(|| format!("--max_len: expected a length, got `{total}`"))?;
            c.set("reward.overlong_buffer.max_resp_len", total as i64);
        }
    }
    Ok(Outcome::Mapped)
}

fn overlong_factor(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    v.as_f64().ok_or_else(|| format!("expected a number, got `{v}`"))?;
    match c.get("overlong_buffer_len") {
        Some(_) => Ok(Outcome::Mapped),
        None => Ok(Outcome::NotApplicable("applies with --overlong_buffer_len".into())),
    }
}

fn ring_attention(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    crate::rules::sequence_split("ring attention", v)
}

fn freezing(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_i64() {
        Some(n) if n <= 0 => Ok(Outcome::NotApplicable("the actor trains from the first step".into())),
        _ => Err("freezing the actor for a critic warm-up is not supported yet; leave it out".into()),
    }
}

fn kl(c: &mut Ctx<'_>, _: &HValue) -> Result<Outcome, String> {
    let coef = c.get("init_kl_coef").and_then(HValue::as_f64).unwrap_or(0.01);
    let est = match c.get("kl_estimator").map(text).as_deref().unwrap_or("k1") {
        "k1" => "kl",
        "k2" => "mse",
        "k3" => "low_var_kl",
        other => return Err(format!("--kl_estimator {other}: OpenRLHF takes k1, k2 or k3")),
    };
    let as_loss = c.flag("use_kl_loss", false);
    c.set("actor.use_kl_loss", coef > 0.0 && as_loss);
    c.set("algorithm.use_kl_in_reward", coef > 0.0 && !as_loss);
    if as_loss {
        c.set("actor.kl_loss_coef", coef);
        c.set("actor.kl_loss_type", est);
    } else {
        c.set("algorithm.kl_ctrl.kl_coef", coef);
        c.set("algorithm.kl_penalty", est);
    }
    Ok(Outcome::Mapped)
}

fn kl_target(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if v.is_null() {
        return Ok(Outcome::NotApplicable("fixed KL coefficient".into()));
    }
    let t = v.as_f64().ok_or_else(|| format!("expected a number, got `{v}`"))?;
    c.set("algorithm.kl_ctrl.type", "adaptive");
    c.set("algorithm.kl_ctrl.target_kl", t);
    Ok(Outcome::Mapped)
}

fn policy_loss(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match text(v).as_str() {
        "ppo" => Ok(Outcome::NotApplicable("the token-level PPO clipped loss".into())),
        "gspo" if c.get("dual_clip").is_some_and(|d| !d.is_null()) => {
            Err("--dual_clip with GSPO is not supported (Reinforge's GSPO, verl's, has no dual clip); leave --dual_clip out".into())
        }
        // OpenRLHF differentiates through the sequence's mean log ratio, verl (and Reinforge)
        // through each token's own: the same gradient only when a sequence's tokens share one
        // advantage, which GAE's are not.
        "gspo" if c.get("advantage_estimator").is_some_and(|e| text(e) == "gae") => {
            Err("GSPO with GAE's per-token advantages: OpenRLHF's gradient differs from verl's (Reinforge's) there; use a sequence-level --advantage_estimator (group_norm, rloo, reinforce_baseline, dr_grpo)".into())
        }
        "gspo" => {
            // OpenRLHF's GSPO averages each sequence's tokens, then the sequences.
            c.set("actor.policy_loss.loss_mode", "gspo");
            c.set("actor.loss_agg_mode", "seq-mean-token-mean");
            Ok(Outcome::Mapped)
        }
        other => Err(format!("policy loss `{other}` is not an OpenRLHF loss; use ppo or gspo")),
    }
}

fn entropy(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if v.is_null() {
        return Ok(Outcome::NotApplicable("no entropy bonus".into()));
    }
    c.set("actor.entropy_coeff", v.as_f64().ok_or_else(|| format!("expected a number, got `{v}`"))?);
    Ok(Outcome::Mapped)
}

fn estimator(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let ours = match text(v).as_str() {
        "gae" => "gae",
        "reinforce" => "reinforce_plus_plus",
        "rloo" => "rloo",
        "reinforce_baseline" => "reinforce_plus_plus_baseline",
        "group_norm" => "grpo",
        "dr_grpo" => {
            c.set("algorithm.norm_adv_by_std_in_grpo", false);
            "grpo"
        }
        other => return Err(format!("advantage estimator `{other}`: OpenRLHF takes gae, reinforce, rloo, reinforce_baseline, group_norm, dr_grpo")),
    };
    c.set("algorithm.adv_estimator", ours);
    Ok(Outcome::Mapped)
}

fn max_len(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if v.is_null() {
        return Ok(Outcome::NotApplicable("unset".into()));
    }
    let total = v.as_usize().ok_or_else(|| format!("expected a length, got `{v}`"))?;
    let prompt = c.count("prompt_max_len", 1024);
    if c.get("max_new_tokens").is_some() {
        return Ok(Outcome::NotApplicable("--max_new_tokens bounds the responses".into()));
    }
    if total <= prompt {
        return Err(format!("--max_len {total} leaves no room for a response after {prompt} prompt tokens; give --generate_max_len"));
    }
    c.set("data.max_response_length", (total - prompt) as i64);
    Ok(Outcome::Mapped)
}

fn train_files(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let split = c.get("prompt_split").map(text).unwrap_or_else(|| "train".into());
    set_files(c, v, "data.train_files", &split)
}

fn val_files(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let split = c.get("eval_split").map(text).unwrap_or_else(|| "train".into());
    set_files(c, v, "data.val_files", &split)
}

fn is_data_file(p: &std::path::Path) -> bool {
    let ext = p.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    matches!(ext.as_deref(), Some("parquet" | "pq" | "jsonl" | "ndjson" | "json"))
}

/// Comma-separated datasets: local files, local dataset directories (`DIR@SUBDIR` for a
/// `data_dir`), or Hub dataset ids downloaded into the Hugging Face cache, read as OpenRLHF's
/// `load_dataset` reads them: the files of `split`.
fn set_files(c: &mut Ctx<'_>, v: &HValue, ours: &str, split: &str) -> Result<Outcome, String> {
    if v.is_null() {
        return Ok(Outcome::NotApplicable("unset".into()));
    }
    let mut list = Vec::new();
    for given in text(v).split(',').map(str::trim) {
        let (path, sub) = given.split_once('@').map_or((given, None), |(p, s)| (p.trim(), Some(s.trim())));
        let local = std::path::Path::new(path);
        // OpenRLHF's examples name Hub datasets (`OpenRLHF/prompt-collection-v0.1`): a
        // snapshot in the Hugging Face cache reads as the directory it is.
        let hub = if local.exists() || is_data_file(local) { None } else { c.hub_dataset(path).map_err(|e| format!("`{given}`: {e}"))? };
        if let Some(dir) = hub.or_else(|| local.is_dir().then(|| local.to_path_buf())) {
            let dir = sub.map_or(dir.clone(), |s| dir.join(s));
            list.extend(split_files(&dir, split)?.into_iter().map(toml::Value::String));
        } else if sub.is_some() {
            return Err(format!("`{given}`: name@data_dir needs a local dataset directory or a downloaded Hub dataset before the @; `{path}` is neither"));
        } else if is_data_file(local) {
            list.push(toml::Value::String(given.to_string()));
        } else {
            return Err(format!(
                "`{given}` is not a local .parquet/.jsonl/.json file or dataset directory, nor a Hub dataset in the Hugging Face cache (Reinforge reads no hub at run time): for a Hub dataset, `hf download --repo-type dataset {path}` (`huggingface-cli download` before huggingface_hub 1.0; the cache is shared through HF_HOME), then give it again"
            ));
        }
    }
    c.set(ours, toml::Value::Array(list));
    Ok(Outcome::Mapped)
}

/// The data files of `split` under `dir`, as the `datasets` library infers splits from file
/// and directory names (`train-00000-of-00001.parquet`, `data/test.jsonl`, `valid/x.json`):
/// a name word `train`/`training`, `validation`/`valid`/`val`/`dev`, `test`/`testing`/
/// `eval`/`evaluation` names the split; with no such word anywhere every file is `train`.
fn split_files(dir: &std::path::Path, split: &str) -> Result<Vec<String>, String> {
    const SPLITS: [(&str, &[&str]); 3] = [
        ("train", &["train", "training"]),
        ("validation", &["validation", "valid", "val", "dev"]),
        ("test", &["test", "testing", "eval", "evaluation"]),
    ];
    // JSON files of a dataset repository or `save_to_disk` directory that describe it.
    const METADATA: [&str; 4] = ["dataset_infos.json", "dataset_info.json", "dataset_dict.json", "state.json"];
    fn walk(d: &std::path::Path, out: &mut Vec<std::path::PathBuf>, arrow: &mut bool) -> std::io::Result<()> {
        for e in std::fs::read_dir(d)? {
            let p = e?.path();
            // Hub downloads keep their metadata under .cache/; hidden entries are never data.
            if p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.')) {
                continue;
            }
            if p.is_dir() {
                walk(&p, out, arrow)?;
            } else if p.extension().is_some_and(|e| e == "arrow") {
                *arrow = true;
            } else if is_data_file(&p) && !METADATA.iter().any(|m| p.file_name().is_some_and(|n| n == *m)) {
                out.push(p);
            }
        }
        Ok(())
    }
    let (mut files, mut arrow) = (Vec::new(), false);
    walk(dir, &mut files, &mut arrow).map_err(|e| format!("reading dataset directory {}: {e}", dir.display()))?;
    files.sort();
    // save_to_disk's directories hold Arrow files beside JSON metadata that is not data.
    if arrow {
        return Err(format!("{} was saved with save_to_disk (Arrow files): write it as parquet (`ds.to_parquet(\"train.parquet\")`) and give that", dir.display()));
    }
    if files.is_empty() {
        return Err(format!("{} holds no .parquet/.jsonl/.json files", dir.display()));
    }
    let split_of = |p: &std::path::Path| -> Option<&str> {
        let rel = p.strip_prefix(dir).unwrap_or(p).to_string_lossy().to_ascii_lowercase();
        let words: Vec<&str> = rel.split(|ch: char| "-._ /\\".contains(ch) || ch.is_ascii_digit()).collect();
        SPLITS.iter().find(|(_, names)| words.iter().any(|w| names.contains(w))).map(|(s, _)| *s)
    };
    let named = files.iter().any(|f| split_of(f).is_some());
    let want = SPLITS.iter().find(|(s, names)| *s == split || names.contains(&split)).map_or(split, |(s, _)| *s);
    let chosen: Vec<&std::path::PathBuf> = files.iter().filter(|f| if named { split_of(f) == Some(want) } else { want == "train" }).collect();
    if chosen.is_empty() {
        return Err(format!("{} has no `{split}` files (its files: {}); choose the split with --prompt_split / --eval_split", dir.display(), files.iter().map(|f| f.strip_prefix(dir).unwrap_or(f).display().to_string()).collect::<Vec<_>>().join(", ")));
    }
    let exts: std::collections::BTreeSet<String> = chosen.iter().filter_map(|f| f.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase)).collect();
    if exts.len() > 1 {
        return Err(format!("{}'s `{split}` files come in several formats ({}): give the files of one, comma separated", dir.display(), exts.into_iter().collect::<Vec<_>>().join(", ")));
    }
    Ok(chosen.iter().map(|f| f.display().to_string()).collect())
}

fn load_checkpoint(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    c.set(crate::RESUME, if v.as_bool().unwrap_or(false) { "auto" } else { "none" });
    Ok(Outcome::Mapped)
}

/// `trainer.logger` from --use_wandb and --use_tensorboard together.
fn loggers(c: &mut Ctx<'_>) {
    let mut l = vec!["console", "jsonl"];
    if c.get("use_wandb").is_some() {
        l.push("wandb");
    }
    if c.get("use_tensorboard").is_some() {
        l.push("tensorboard");
    }
    c.set("trainer.logger", toml::Value::Array(l.into_iter().map(|s| toml::Value::String(s.into())).collect()));
}

fn use_wandb(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let key = text(v);
    // OpenRLHF logs in with the value unless a key is configured; "True" is its "already logged in".
    if v.is_null() || key.eq_ignore_ascii_case("false") {
        return Ok(Outcome::NotApplicable("W&B off".into()));
    }
    if !key.eq_ignore_ascii_case("true") {
        c.set(crate::WANDB_KEY, key);
    }
    loggers(c);
    Ok(Outcome::Mapped)
}

fn tensorboard(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if v.is_null() {
        return Ok(Outcome::NotApplicable("TensorBoard off".into()));
    }
    loggers(c);
    Ok(Outcome::Mapped)
}

fn bf16(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if v.as_bool() == Some(true) {
        c.set("trainer.dtype", "bf16");
    }
    Ok(Outcome::Mapped)
}

fn param_dtype(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match text(v).as_str() {
        "bf16" => {
            c.set("trainer.dtype", "bf16");
            Ok(Outcome::Mapped)
        }
        other => Err(format!("--param_dtype {other}: bf16 (or leave it out for the default)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// v0.11.0's flags that take no value or several (argparse `store_true`/`store_false`,
    /// `nargs`), from its train_ppo_ray.py: each reads as many words as OpenRLHF's does.
    #[test]
    fn dotted_flags_take_the_values_openrlhf_0_11_gives_them() {
        let kinds = [
            ("train.colocate_actor_ref", Arity::Switch),
            ("train.colocate_critic_reward", Arity::Switch),
            ("train.colocate_all", Arity::Switch),
            ("vllm.sync_with_ray", Arity::Switch),
            ("vllm.enable_prefix_caching", Arity::Switch),
            ("vllm.enforce_eager", Arity::Switch),
            ("vllm.enable_sleep", Arity::Switch),
            ("algo.advantage.is_correction_enable", Arity::Switch),
            ("algo.advantage.is_correction_threshold", Arity::Two),
            ("train.async_enable", Arity::Switch),
            ("train.partial_rollout_enable", Arity::Switch),
            ("ckpt.save_hf", Arity::Switch),
            ("ckpt.disable_ds", Arity::Switch),
            ("ckpt.load_enable", Arity::Switch),
            ("ds.use_universal_ckpt", Arity::Switch),
            ("actor.gradient_checkpointing_enable", Arity::Switch),
            ("ds.deepcompile", Arity::Switch),
            ("train.enable_ema", Arity::Switch),
            ("ds.adam_offload", Arity::Switch),
            ("ds.use_liger_kernel", Arity::Switch),
            ("ds.overlap_comm", Arity::Switch),
            ("actor.gradient_checkpointing_reentrant", Arity::Switch),
            ("data.disable_fast_tokenizer", Arity::Switch),
            ("ds.enable_sleep", Arity::Switch),
            ("ds.packing_samples", Arity::Switch),
            ("train.dynamic_batch_enable", Arity::Switch),
            ("ds.load_in_4bit", Arity::Switch),
            ("ds.lora.target_modules", Arity::Many),
            ("actor.eps_clip_low_high", Arity::Two),
            ("reward.normalize_enable", Arity::Switch),
            ("train.full_determinism_enable", Arity::Switch),
            ("critic.save_value_network", Arity::Switch),
            ("reward.clip_range", Arity::Two),
            ("actor.muon.nesterov", Arity::Switch),
            ("actor.muon.no_nesterov", Arity::Switch),
            ("actor.adam.betas", Arity::Two),
            ("critic.muon.nesterov", Arity::Switch),
            ("critic.muon.no_nesterov", Arity::Switch),
            ("critic.adam.betas", Arity::Two),
            ("algo.kl.use_loss", Arity::Switch),
            ("algo.advantage.no_std_norm", Arity::Switch),
            ("ref.offload", Arity::Switch),
            ("reward.offload", Arity::Switch),
            ("data.apply_chat_template", Arity::Switch),
            ("algo.dynamic_filtering_enable", Arity::Switch),
            ("algo.dynamic_filtering_range", Arity::Two),
            ("actor.freeze_visual_encoder", Arity::Switch),
        ];
        for (flag, want) in kinds {
            assert_eq!(arity(&canonical(flag)), want, "--{flag}");
        }
        assert_eq!(arity(&canonical("train.batch_size")), Arity::One);
    }
}
