//! verl's `main_ppo` keys (and Search-R1's additions) in Reinforge's terms: the one table
//! [`RULES`], and verl's defaults ([`defaults`]) so a command means what it means in verl.
//!
//! Batch sizes: verl's `data.train_batch_size` and `ppo_mini_batch_size` count prompts, as ours
//! do (verl multiplies the mini-batch by `rollout.n` itself); `*_per_gpu` micro-batches count
//! sequences per GPU, as our `ppo_micro_batch_size` counts them per rank; the deprecated global
//! `ppo_micro_batch_size` is divided by the GPU count (`nnodes × n_gpus_per_node`), exactly as
//! verl's `fsdp_workers.py` normalises it. Placement: verl colocates every role on all GPUs
//! (its hybrid engine), which is our `cluster.colocate_all` over `nnodes × n_gpus_per_node` ranks.

use crate::hydra::HValue;
use crate::rules::{conv, generic, na, off_only, one_only, refuse, to, unset_only, zero_only, Conv, Ctx, Outcome, Rule};

const NO_SHARDING: &str = "Reinforge runs data-parallel ranks that each hold the whole model; no FSDP sharding or offload yet";
const OWN_ENGINE: &str = "Reinforge's own engine generates (no vLLM/SGLang); its KV cache is sized by gpu_memory_utilization";
const LOGPROB_MICRO: &str = "log-probs run in micro-batches of the actor's ppo_micro_batch_size_per_gpu";
const LOGPROB_DYNAMIC: &str = "log-prob passes form micro-batches as the actor's update does (actor.use_dynamic_bsz, actor.ppo_max_token_len_per_gpu)";
const VALUES_DYNAMIC: &str = "the values pass forms micro-batches as the critic's update does (critic.use_dynamic_bsz, critic.ppo_max_token_len_per_gpu)";
const REWARD_DYNAMIC: &str = "the reward model scores in batches of reward_model.micro_batch_size_per_gpu sequences, packed without padding";

/// Every key of verl's composed PPO config (commit b178a3cd) and the keys verl 0.9.1 added,
/// from verl's own `_generated_ppo_trainer.yaml` and its 0.9.1 wheel: a key under a family
/// row (`prefix.*`) counts as verl's only if it is one of these (or the family is open), so a
/// typo is refused with a suggestion instead of being accepted as part of the family.
pub fn known_keys() -> &'static std::collections::BTreeSet<&'static str> {
    static KEYS: std::sync::OnceLock<std::collections::BTreeSet<&'static str>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        include_str!("data/verl_keys_head.txt")
            .lines()
            .chain(include_str!("data/verl_keys_0.9.1.txt").lines())
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect()
    })
}

/// Families whose members are free-form (engine arguments, dicts passed through, or keys that
/// older verl and the Search-R1 fork had): any key under them is accepted as the family says.
pub const OPEN_FAMILIES: &[&str] = &[
    "actor_rollout_ref.actor.fsdp_config.",
    "actor_rollout_ref.ref.fsdp_config.",
    "critic.model.fsdp_config.",
    "critic.fsdp.",
    "actor_rollout_ref.rollout.engine_kwargs.",
    "actor_rollout_ref.model.override_config.",
    "data.custom_cls.",
    "data.apply_chat_template_kwargs.",
    "reward_model.reward_kwargs.",
    "reward.reward_kwargs.",
    "custom_reward_function.reward_kwargs.",
    "reward.custom_reward_function.reward_kwargs.",
    "ray_init.",
    "ray_kwargs.",
    // Profiler and Megatron settings: verl's generated key list leaves these sections out
    // (their dataclasses fill them in), so their members cannot be checked one by one.
    "global_profiler.",
    "actor_rollout_ref.actor.profiler.",
    "actor_rollout_ref.ref.profiler.",
    "actor_rollout_ref.rollout.profiler.",
    "critic.profiler.",
    "reward_model.profiler.",
    "trainer.controller_nsight_options.",
    "trainer.worker_nsight_options.",
    "trainer.npu_profile.",
    "critic.fsdp_config.",
    "actor_rollout_ref.actor.megatron.",
    "actor_rollout_ref.actor.optim.override_optimizer_config.",
    "critic.optim.override_optimizer_config.",
    "actor_rollout_ref.ref.megatron.",
    "critic.megatron.",
];

/// Every verl key Reinforge answers for, in verl's order.
pub static RULES: &[Rule] = &[
    // ---- Hydra's own flags (`--config-name ppo_megatron_trainer`)
    conv("--config-name", config_name, "ppo_trainer and ppo_megatron_trainer accepted (verl's PPO keys, ppo_trainer's defaults); verl's multi-turn tool configs (gsm8k_multiturn_grpo, search_multiturn_grpo, …) accepted, their values applied as defaults; multimodal ones (geo3k) refused"),
    na("--config-path", "verl's config directory: Reinforge has verl's defaults built in"),
    na("--config-dir", "verl's config directory: Reinforge has verl's defaults built in"),
    // ---- data
    to("data.train_files", "data.train_files", Conv::TextList),
    to("data.val_files", "data.val_files", Conv::TextList),
    to("data.prompt_key", "data.prompt_key", Conv::Text),
    conv("data.reward_fn_key", reward_fn_key, "accepted when `data_source` (rewards are routed by each row's data_source)"),
    to("data.max_prompt_length", "data.max_prompt_length", Conv::Count),
    to("data.max_response_length", "data.max_response_length", Conv::Count),
    to("data.train_batch_size", "data.train_batch_size", Conv::Count),
    to("data.val_batch_size", "data.val_batch_size", Conv::Count),
    to("data.shuffle", "data.shuffle", Conv::Bool),
    to("data.seed", "data.seed", Conv::Count),
    to("data.train_max_samples", "data.max_samples", Conv::Count),
    na("data.val_max_samples", "validation uses every row of data.val_files"),
    na("data.tokenizer", "the tokenizer comes from the model directory"),
    na("data.use_shm", "models are read from local directories"),
    na("data.return_raw_input_ids", "internal to verl's dataloader"),
    na("data.return_raw_chat", "internal to verl's dataloader"),
    na("data.return_full_prompt", "internal to verl's dataloader"),
    na("data.return_multi_modal_inputs", "internal to verl's dataloader"),
    na("data.filter_overlong_prompts", "prompts longer than data.max_prompt_length are always filtered out (and counted)"),
    na("data.filter_overlong_prompts_workers", "filtering runs in the loader"),
    na("data.truncation", "prompts are never truncated: longer ones are filtered out"),
    na("data.dataloader_num_workers", "the loader runs in the controller"),
    na("data.trust_remote_code", "no Python code is loaded"),
    na("data.image_key", "text-only: the column is not read"),
    na("data.video_key", "text-only: the column is not read"),
    na("data.audio_key", "text-only: the column is not read"),
    na("data.image_patch_size", "text-only"),
    conv("data.mm_processor_kwargs", unset_only, "unset accepted; multimodal processor arguments refused (text only)"),
    na("data.validation_shuffle", "validation reads every row in order"),
    conv("data.gen_batch_size", gen_batch_size, "`data.gen_batch_size` (with algorithm.filter_groups.enable)"),
    conv("data.tool_config_path", data_tools, "unset, or with multi_turn.enable, accepted (prompts show tools.calls.tool_config_path's schemas); tool schemas in single-turn prompts refused"),
    conv("data.function_tool_path", unset_only, "unset accepted; tool functions refused (Python tools do not run in Reinforge; tool calling: `tools.calls`)"),
    na("data.train_data_num", "Search-R1's name: use data.train_max_samples"),
    na("data.val_data_num", "Search-R1's name: validation uses every row"),
    to("data.shuffle_train_dataloader", "data.shuffle", Conv::Bool),
    refuse("data.custom_cls.*", "custom dataset classes are Python; write parquet/JSONL in verl's schema (prompt, data_source, reward_model.ground_truth)"),
    refuse("data.sampler.*", "curriculum samplers are not supported; data.shuffle picks the order"),
    refuse("data.datagen.*", "dynamic data generation is not supported; `reinforge data gen` writes datasets"),
    conv("data.apply_chat_template_kwargs", template_kwargs, "`data.apply_chat_template_kwargs` (variables for the chat template, e.g. enable_thinking)"),
    conv("data.apply_chat_template_kwargs.*", template_kwargs, "`data.apply_chat_template_kwargs.*`"),
    to("data.max_start_length", "tools.search.max_start_length", Conv::Count),
    to("data.max_obs_length", "tools.search.max_obs_length", Conv::Count),
    // ---- actor_rollout_ref
    na("actor_rollout_ref.hybrid_engine", "actor and rollout share one copy of the weights whenever they are colocated"),
    to("actor_rollout_ref.model.path", "actor.model", Conv::Text),
    to("actor_rollout_ref.model.enable_gradient_checkpointing", "actor.gradient_checkpointing", Conv::Bool),
    na("actor_rollout_ref.model.use_remove_padding", "Reinforge always packs sequences (no padding is computed)"),
    na("actor_rollout_ref.model.use_liger", "Reinforge uses its own fused kernels"),
    na("actor_rollout_ref.model.use_fused_kernels", "Reinforge uses its own fused kernels"),
    na("actor_rollout_ref.model.fused_kernel_options.*", "Reinforge uses its own fused kernels"),
    na("actor_rollout_ref.model.trust_remote_code", "no model code is loaded: Reinforge implements the architectures it runs"),
    na("actor_rollout_ref.model.external_lib", "no Python libraries are imported"),
    na("actor_rollout_ref.model.use_shm", "models are read from local directories"),
    na("actor_rollout_ref.model.enable_activation_offload", "no activation offload yet; use enable_gradient_checkpointing to save memory"),
    to("actor_rollout_ref.model.lora_rank", "actor.lora_rank", Conv::Count),
    to("actor_rollout_ref.model.lora_alpha", "actor.lora_alpha", Conv::Float),
    to("actor_rollout_ref.model.target_modules", "actor.target_modules", Conv::TextList),
    conv("actor_rollout_ref.model.override_config", unset_only, "empty accepted; overrides refused (edit config.json in a copy of the model directory)"),
    refuse("actor_rollout_ref.model.override_config.*", "model config overrides are not supported; edit config.json in a copy of the model directory"),
    na("actor_rollout_ref.model.hf_config_path", "config.json is read from actor_rollout_ref.model.path"),
    na("actor_rollout_ref.model.tokenizer_path", "the tokenizer is read from actor_rollout_ref.model.path"),
    conv("actor_rollout_ref.model.exclude_modules", exclude_modules, "null accepted; exclusions refused (list the linears to adapt in target_modules)"),
    to("actor_rollout_ref.model.lora_adapter_path", "actor.lora_adapter_path", Conv::Text),
    conv("actor_rollout_ref.model.lora.rank", zero_only, "0 accepted; Megatron's LoRA section refused (use actor_rollout_ref.model.lora_rank)"),
    na("actor_rollout_ref.model.lora.*", "applies with Megatron's LoRA section only"),
    na("actor_rollout_ref.model.tiled_mlp.*", "the MLP runs in Reinforge's own fused kernels"),
    conv("actor_rollout_ref.model.mtp.enable", off_only, "false accepted; multi-token prediction refused (not yet)"),
    na("actor_rollout_ref.model.mtp.*", "applies with mtp.enable"),
    to("actor_rollout_ref.nccl_timeout", "cluster.nccl_timeout_s", Conv::Float),
    conv("actor_rollout_ref.model.custom_chat_template", custom_chat_template, "null accepted; a template refused (put it in tokenizer_config.json)"),
    conv("actor_rollout_ref.actor.strategy", strategy, "fsdp, fsdp2, megatron: accepted, not applicable (data-parallel ranks)"),
    conv("actor_rollout_ref.actor.ppo_mini_batch_size", mini_batch, "`actor.ppo_mini_batch_size` (prompts; with Search-R1's rollout.n_agent the value counts sequences: ÷ n_agent, or `actor.ppo_mini_batch_sequences` when not a multiple)"),
    conv("actor_rollout_ref.actor.ppo_micro_batch_size", actor_micro_global, "global → per rank: `actor.ppo_micro_batch_size` = value ÷ (nnodes × n_gpus_per_node), exact"),
    to("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor.ppo_micro_batch_size", Conv::Count),
    to("actor_rollout_ref.actor.use_dynamic_bsz", "actor.use_dynamic_bsz", Conv::Bool),
    to("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor.ppo_max_token_len_per_gpu", Conv::Count),
    to("actor_rollout_ref.actor.grad_clip", "actor.grad_clip", Conv::Float),
    to("actor_rollout_ref.actor.clip_ratio", "actor.clip_ratio", Conv::Float),
    to("actor_rollout_ref.actor.clip_ratio_low", "actor.clip_ratio_low", Conv::Float),
    to("actor_rollout_ref.actor.clip_ratio_high", "actor.clip_ratio_high", Conv::Float),
    to("actor_rollout_ref.actor.clip_ratio_c", "actor.clip_ratio_c", Conv::Float),
    conv("actor_rollout_ref.actor.loss_agg_mode", loss_agg, "`actor.loss_agg_mode` (and `critic.loss_agg_mode` unless given, as verl's critic follows the actor)"),
    to("actor_rollout_ref.actor.entropy_coeff", "actor.entropy_coeff", Conv::Float),
    na("actor_rollout_ref.actor.entropy_from_logits_with_chunking", "entropies are computed row by row already"),
    na("actor_rollout_ref.actor.entropy_checkpointing", "entropies are computed row by row already"),
    to("actor_rollout_ref.actor.use_kl_loss", "actor.use_kl_loss", Conv::Bool),
    to("actor_rollout_ref.actor.kl_loss_coef", "actor.kl_loss_coef", Conv::Float),
    to("actor_rollout_ref.actor.kl_loss_type", "actor.kl_loss_type", Conv::Text),
    na("actor_rollout_ref.actor.use_torch_compile", "no torch here: the kernels are compiled already"),
    to("actor_rollout_ref.actor.ppo_epochs", "actor.ppo_epochs", Conv::Count),
    to("actor_rollout_ref.actor.shuffle", "actor.shuffle", Conv::Bool),
    na("actor_rollout_ref.actor.data_loader_seed", "mini-batch order follows trainer.seed"),
    conv("actor_rollout_ref.actor.ulysses_sequence_parallel_size", sequence_parallel, SEQUENCE_PARALLEL_DOC),
    conv("actor_rollout_ref.actor.policy_loss.loss_mode", loss_mode, "`actor.policy_loss.loss_mode` (every verl 0.9 mode but `bypass_mode`)"),
    to("actor_rollout_ref.actor.policy_loss.clip_cov_ratio", "actor.policy_loss.clip_cov_ratio", Conv::Float),
    to("actor_rollout_ref.actor.policy_loss.clip_cov_lb", "actor.policy_loss.clip_cov_lb", Conv::Float),
    to("actor_rollout_ref.actor.policy_loss.clip_cov_ub", "actor.policy_loss.clip_cov_ub", Conv::Float),
    to("actor_rollout_ref.actor.policy_loss.kl_cov_ratio", "actor.policy_loss.kl_cov_ratio", Conv::Float),
    to("actor_rollout_ref.actor.policy_loss.ppo_kl_coef", "actor.policy_loss.ppo_kl_coef", Conv::Float),
    conv("actor_rollout_ref.actor.policy_loss.dro_beta", dro_beta, "`actor.policy_loss.dro_beta` (null: unset)"),
    na("actor_rollout_ref.actor.policy_loss.*", "rollout correction: rollout and training share one engine's weights, there is no engine mismatch to correct"),
    na("actor_rollout_ref.actor.checkpoint.*", "a Reinforge checkpoint always holds the model, the optimizer and the trainer state"),
    to("actor_rollout_ref.actor.optim.lr", "actor.lr", Conv::Float),
    conv("actor_rollout_ref.actor.optim.lr_warmup_steps", actor_warmup_steps, "`actor.lr_warmup_steps` (-1: use the ratio)"),
    to("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", "actor.lr_warmup_ratio", Conv::Float),
    to("actor_rollout_ref.actor.optim.min_lr_ratio", "actor.min_lr_ratio", Conv::Float),
    conv("actor_rollout_ref.actor.optim.warmup_style", actor_schedule, "`actor.lr_scheduler` (constant, cosine)"),
    conv("actor_rollout_ref.actor.optim.lr_scheduler_type", actor_schedule, "`actor.lr_scheduler` (constant, cosine)"),
    conv("actor_rollout_ref.actor.optim.lr_decay_style", actor_schedule, "Megatron's schedule: `actor.lr_scheduler` (constant, cosine)"),
    na("actor_rollout_ref.actor.optim.override_optimizer_config.*", "Megatron's distributed-optimizer options (offload, overlap): no sharded optimizer"),
    na("critic.optim.override_optimizer_config.*", "Megatron's distributed-optimizer options (offload, overlap): no sharded optimizer"),
    to("actor_rollout_ref.actor.optim.weight_decay", "actor.weight_decay", Conv::Float),
    to("actor_rollout_ref.actor.optim.betas", "actor.betas", Conv::Same),
    to("actor_rollout_ref.actor.optim.clip_grad", "actor.grad_clip", Conv::Float),
    na("actor_rollout_ref.actor.optim.total_training_steps", "set by the trainer from the data and trainer.total_epochs/total_training_steps"),
    conv("actor_rollout_ref.actor.optim.num_cycles", cosine_cycles, "0.5 accepted (half a cosine); others refused"),
    na("actor_rollout_ref.actor.optim.*", "AdamW with decoupled weight decay is the optimizer"),
    na("actor_rollout_ref.actor.fsdp_config.*", NO_SHARDING),
    na("actor_rollout_ref.actor.rollout_n", "follows actor_rollout_ref.rollout.n"),
    to("actor_rollout_ref.actor.tau_pos", "actor.tau_pos", Conv::Float),
    to("actor_rollout_ref.actor.tau_neg", "actor.tau_neg", Conv::Float),
    na("actor_rollout_ref.actor.calculate_sum_pi_squared", "applies to other policy-loss modes"),
    na("actor_rollout_ref.actor.sum_pi_squared_checkpointing", "applies to other policy-loss modes"),
    na("actor_rollout_ref.actor.freeze_vision_tower", "text models only"),
    conv("actor_rollout_ref.actor.loss_scale_factor", unset_only, "unset accepted; a constant loss scale refused (use actor.loss_agg_mode)"),
    na("actor_rollout_ref.actor.calculate_entropy", "entropies are always computed"),
    na("actor_rollout_ref.actor.use_prefix_grouper", "sequences are packed"),
    na("actor_rollout_ref.actor.use_fused_kernels", "Reinforge uses its own fused kernels"),
    na("actor_rollout_ref.actor.use_remove_padding", "Reinforge always packs sequences"),
    na("actor_rollout_ref.actor.router_replay.*", "applies to mixture-of-experts models"),
    na("actor_rollout_ref.actor.entropy_from_logits_chunk_size", "entropies are computed row by row already"),
    na("actor_rollout_ref.actor.pad_to_length", "sequences are packed, not padded"),
    conv("actor_rollout_ref.actor.qat.enable", off_only, "false accepted; quantization-aware training refused"),
    na("actor_rollout_ref.actor.qat.*", "applies with qat.enable"),
    na("actor_rollout_ref.actor.megatron.*", NO_SHARDING),
    to("actor_rollout_ref.actor.state_masking", "tools.search.state_masking", Conv::Bool),
    // rollout
    conv("actor_rollout_ref.rollout.name", rollout_name, "vllm, sglang, hf: accepted, not applicable (Reinforge's own engine generates)"),
    na("actor_rollout_ref.rollout.mode", "generation is synchronous with training (on-policy)"),
    conv("actor_rollout_ref.rollout.temperature", temperature, "`rollout.temperature` (0 when rollout.do_sample is false)"),
    to("actor_rollout_ref.rollout.top_k", "rollout.top_k", Conv::TopK),
    to("actor_rollout_ref.rollout.top_p", "rollout.top_p", Conv::Float),
    conv(DO_SAMPLE, do_sample, "false → `rollout.temperature = 0` (greedy)"),
    to("actor_rollout_ref.rollout.n", "rollout.n", Conv::Count),
    conv("actor_rollout_ref.rollout.n_agent", mini_batch, "Search-R1's group size: `rollout.n` (and the mini-batch, which Search-R1 counts in sequences)"),
    na("actor_rollout_ref.rollout.prompt_length", "follows data.max_prompt_length"),
    na("actor_rollout_ref.rollout.response_length", "follows data.max_response_length"),
    na("actor_rollout_ref.rollout.dtype", "trainer.dtype sets the CUDA engine's type (bf16 by default)"),
    to("actor_rollout_ref.rollout.gpu_memory_utilization", "rollout.gpu_memory_utilization", Conv::Float),
    conv("actor_rollout_ref.rollout.ignore_eos", ignore_eos, "false accepted; true refused"),
    to("actor_rollout_ref.rollout.enforce_eager", "rollout.enforce_eager", Conv::Bool),
    na("actor_rollout_ref.rollout.free_cache_engine", OWN_ENGINE),
    na("actor_rollout_ref.rollout.load_format", "weights are shared in memory, not reloaded"),
    na("actor_rollout_ref.rollout.layered_summon", "weights are shared in memory, not gathered"),
    conv("actor_rollout_ref.rollout.tensor_model_parallel_size", rollout_tp, "accepted: one engine per GPU whatever vLLM's split"),
    to("actor_rollout_ref.rollout.max_num_batched_tokens", "rollout.max_num_batched_tokens", Conv::Count),
    na("actor_rollout_ref.rollout.max_model_len", OWN_ENGINE),
    to("actor_rollout_ref.rollout.max_num_seqs", "rollout.max_num_seqs", Conv::Count),
    na("actor_rollout_ref.rollout.enable_chunked_prefill", OWN_ENGINE),
    na("actor_rollout_ref.rollout.disable_log_stats", OWN_ENGINE),
    na("actor_rollout_ref.rollout.engine_kwargs.*", OWN_ENGINE),
    na("actor_rollout_ref.rollout.calculate_log_probs", "the rollout's log-probs are always kept"),
    na("actor_rollout_ref.rollout.log_prob_micro_batch_size", LOGPROB_MICRO),
    na("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", LOGPROB_MICRO),
    na("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", LOGPROB_DYNAMIC),
    na("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", LOGPROB_DYNAMIC),
    to("actor_rollout_ref.rollout.val_kwargs.temperature", "rollout.val_temperature", Conv::Float),
    to("actor_rollout_ref.rollout.val_kwargs.n", "rollout.val_n", Conv::Count),
    conv("actor_rollout_ref.rollout.val_kwargs.do_sample", val_do_sample, "true or false accepted: validation samples at val_kwargs.temperature (0, verl's default, is greedy), as verl's agent loop does"),
    to("actor_rollout_ref.rollout.val_kwargs.top_k", "rollout.val_top_k", Conv::TopK),
    to("actor_rollout_ref.rollout.val_kwargs.top_p", "rollout.val_top_p", Conv::Float),
    to("actor_rollout_ref.rollout.multi_turn.enable", "tools.calls.enable", Conv::Bool),
    to("actor_rollout_ref.rollout.multi_turn.tool_config_path", "tools.calls.tool_config_path", Conv::Text),
    to("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", "tools.calls.max_assistant_turns", Conv::Count),
    to("actor_rollout_ref.rollout.multi_turn.max_user_turns", "tools.calls.max_user_turns", Conv::Count),
    to("actor_rollout_ref.rollout.multi_turn.max_parallel_calls", "tools.calls.max_parallel_calls", Conv::Count),
    to("actor_rollout_ref.rollout.multi_turn.max_tool_response_length", "tools.calls.max_tool_response_length", Conv::Count),
    to("actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side", "tools.calls.tool_response_truncate_side", Conv::Text),
    conv("actor_rollout_ref.rollout.multi_turn.format", tool_format, "`tools.calls.format`: hermes accepted (Qwen's and Hermes' <tool_call> blocks); gpt-oss refused"),
    to("actor_rollout_ref.rollout.multi_turn.interaction_config_path", "tools.calls.interaction_config_path", Conv::Text),
    conv("actor_rollout_ref.rollout.multi_turn.function_tool_path", function_tools, "null accepted; Python function tools refused"),
    na("actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode", "trajectories grow by appending token ids, never by re-tokenizing the conversation: nothing to check"),
    na("actor_rollout_ref.rollout.multi_turn.*", "applies to SGLang's own multi-turn rollouts only"),
    conv("actor_rollout_ref.rollout.agent.default_agent_loop", agent_loop, "single_turn_agent accepted; tool_agent: `tools.calls.enable = true`; other agent loops refused"),
    na("actor_rollout_ref.rollout.agent.*", "applies to agent-loop rollouts only"),
    na("actor_rollout_ref.rollout.trace.*", "rollout tracing is not supported"),
    conv("actor_rollout_ref.rollout.data_parallel_size", one_only, "1 accepted (one engine per rank)"),
    conv("actor_rollout_ref.rollout.expert_parallel_size", one_only, "1 accepted"),
    conv("actor_rollout_ref.rollout.pipeline_model_parallel_size", one_only, "1 accepted"),
    conv("actor_rollout_ref.rollout.quantization", unset_only, "unset accepted; quantized rollouts refused"),
    conv("actor_rollout_ref.rollout.skip_rollout", off_only, "false accepted; replaying dumped rollouts refused"),
    na("actor_rollout_ref.rollout.*", OWN_ENGINE),
    // ref
    na("actor_rollout_ref.ref.log_prob_micro_batch_size", LOGPROB_MICRO),
    na("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", LOGPROB_MICRO),
    na("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", LOGPROB_DYNAMIC),
    na("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", LOGPROB_DYNAMIC),
    na("actor_rollout_ref.ref.fsdp_config.*", NO_SHARDING),
    na("actor_rollout_ref.ref.strategy", NO_SHARDING),
    conv("actor_rollout_ref.ref.ulysses_sequence_parallel_size", sequence_parallel, SEQUENCE_PARALLEL_DOC),
    na("actor_rollout_ref.ref.use_torch_compile", "no torch here: the kernels are compiled already"),
    na("actor_rollout_ref.ref.*", "the reference is the actor's initial model; its other keys set memory layouts"),
    // ---- critic
    to("critic.enable", "critic.enable", Conv::Bool),
    to("critic.optim.lr", "critic.lr", Conv::Float),
    conv("critic.optim.lr_warmup_steps", critic_warmup_steps, "`critic.lr_warmup_steps` (-1: use the ratio)"),
    to("critic.optim.lr_warmup_steps_ratio", "critic.lr_warmup_ratio", Conv::Float),
    to("critic.optim.weight_decay", "critic.weight_decay", Conv::Float),
    to("critic.optim.clip_grad", "critic.grad_clip", Conv::Float),
    na("critic.optim.*", "the critic's AdamW takes lr, warmup, weight_decay and grad_clip"),
    to("critic.model.path", "critic.model", Conv::Text),
    na("critic.model.tokenizer_path", "the critic reads prompts tokenized by the actor's tokenizer"),
    na("critic.model.*", "the critic is the backbone of critic.model.path with a value head"),
    conv("critic.model.lora_rank", critic_lora_rank, "0 accepted (full fine-tuning); LoRA on the critic refused (not yet)"),
    na("critic.model.enable_gradient_checkpointing", "the critic recomputes its layers when the actor does (actor_rollout_ref.model.enable_gradient_checkpointing)"),
    na("critic.model.fsdp_config.*", NO_SHARDING),
    na("critic.strategy", NO_SHARDING),
    conv("critic.ppo_mini_batch_size", critic_mini, "accepted when equal to the actor's (the critic updates on the actor's mini-batches)"),
    conv("critic.ppo_micro_batch_size", critic_micro_global, "global → per rank: `critic.ppo_micro_batch_size` = value ÷ (nnodes × n_gpus_per_node), exact"),
    to("critic.ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size", Conv::Count),
    na("critic.forward_micro_batch_size", "values are computed in micro-batches of critic.ppo_micro_batch_size_per_gpu"),
    na("critic.forward_micro_batch_size_per_gpu", "values are computed in micro-batches of critic.ppo_micro_batch_size_per_gpu"),
    to("critic.use_dynamic_bsz", "critic.use_dynamic_bsz", Conv::Bool),
    to("critic.ppo_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu", Conv::Count),
    na("critic.forward_max_token_len_per_gpu", VALUES_DYNAMIC),
    conv("critic.ulysses_sequence_parallel_size", sequence_parallel, SEQUENCE_PARALLEL_DOC),
    conv("critic.ppo_epochs", critic_epochs, "accepted when equal to the actor's ppo_epochs"),
    na("critic.shuffle", "the critic sees the actor's mini-batches"),
    to("critic.grad_clip", "critic.grad_clip", Conv::Float),
    to("critic.cliprange_value", "critic.cliprange_value", Conv::Float),
    to("critic.loss_agg_mode", "critic.loss_agg_mode", Conv::Text),
    na("critic.rollout_n", "follows actor_rollout_ref.rollout.n"),
    na("critic.checkpoint.*", "a Reinforge checkpoint always holds the critic with the rest"),
    na("critic.fsdp_config.*", NO_SHARDING),
    na("critic.fsdp.*", NO_SHARDING),
    na("critic.data_loader_seed", "the critic sees the actor's mini-batches"),
    conv("critic.loss_scale_factor", unset_only, "unset accepted; a constant loss scale refused (use critic.loss_agg_mode)"),
    // ---- reward
    conv("reward_model.enable", reward_model_enable, "true → `reward.kind = \"reward_model\"` with `reward.params.path` = reward_model.model.path"),
    conv("reward_model.model.path", reward_model_path, "`reward.params.path` (with reward_model.enable=true)"),
    conv("reward_model.micro_batch_size_per_gpu", reward_model_micro, "`reward.params.batch_size` (with reward_model.enable=true)"),
    na("reward_model.micro_batch_size", "use reward_model.micro_batch_size_per_gpu"),
    na("reward_model.model.*", "the reward model is read from reward_model.model.path"),
    na("reward_model.strategy", NO_SHARDING),
    na("reward_model.max_length", "the reward model scores prompt + response as generated"),
    na("reward_model.use_dynamic_bsz", REWARD_DYNAMIC),
    na("reward_model.forward_max_token_len_per_gpu", REWARD_DYNAMIC),
    conv("reward_model.reward_manager", reward_manager, "`naive`, `dapo` (with its overlong penalty) accepted; others refused"),
    na("reward_model.launch_reward_fn_async", "rule rewards are computed in the controller"),
    refuse("reward_model.sandbox_fusion.*", "code sandboxes: serve them behind reward.kind = \"remote\" (an HTTP scorer)"),
    conv("reward_model.reward_kwargs.overlong_buffer_cfg.enable", overlong_enable, "`reward.overlong_buffer.enable` (with reward_manager `dapo`)"),
    to("reward_model.reward_kwargs.overlong_buffer_cfg.len", "reward.overlong_buffer.len", Conv::Count),
    to("reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor", "reward.overlong_buffer.penalty_factor", Conv::Float),
    na("reward_model.reward_kwargs.overlong_buffer_cfg.log", OVERLONG_LOGGED),
    to("reward_model.reward_kwargs.max_resp_len", "reward.overlong_buffer.max_resp_len", Conv::Count),
    na("reward_model.reward_kwargs.*", "applies to verl's reward managers"),
    conv("reward.reward_kwargs.overlong_buffer_cfg.enable", overlong_enable, "as reward_model.reward_kwargs.overlong_buffer_cfg.enable"),
    to("reward.reward_kwargs.overlong_buffer_cfg.len", "reward.overlong_buffer.len", Conv::Count),
    to("reward.reward_kwargs.overlong_buffer_cfg.penalty_factor", "reward.overlong_buffer.penalty_factor", Conv::Float),
    na("reward.reward_kwargs.overlong_buffer_cfg.log", OVERLONG_LOGGED),
    to("reward.reward_kwargs.max_resp_len", "reward.overlong_buffer.max_resp_len", Conv::Count),
    na("reward.reward_kwargs.*", "applies to verl's reward managers"),
    na("reward_model.enable_resource_pool", "the reward model is placed per cluster.reward"),
    na("reward_model.nnodes", "the reward model is placed per cluster.reward"),
    na("reward_model.n_gpus_per_node", "the reward model is placed per cluster.reward"),
    na("reward_model.num_workers", "rule rewards are computed in the controller"),
    na("reward_model.use_reward_loop", "rewards are computed once per step"),
    na("reward_model.reward_loop_source", "rewards are computed once per step"),
    na("reward_model.reward_loop_module_path", "rewards are computed once per step"),
    na("reward_model.reward_loop_class_name", "rewards are computed once per step"),
    conv("reward_model.ulysses_sequence_parallel_size", sequence_parallel, SEQUENCE_PARALLEL_DOC),
    na("reward_model.rollout.*", "a reward model scores with a value head (sequence classification); generative reward models are not supported"),
    conv("reward_manager.name", reward_manager, "as reward_model.reward_manager"),
    na("reward_manager.*", "rewards are computed by the kind in [reward]"),
    refuse("sandbox_fusion.*", "code sandboxes: serve them behind reward.kind = \"remote\" (an HTTP scorer)"),
    // verl 0.9.1's reward group
    conv("reward.reward_model.enable", reward_model_enable, "as reward_model.enable (with reward.reward_model.model_path)"),
    conv("reward.reward_model.model_path", reward_model_path, "as reward_model.model.path"),
    na("reward.reward_model.*", "the reward model is placed per cluster.reward and scores with a value head"),
    conv("reward.custom_reward_function.path", custom_reward_path, "as custom_reward_function.path"),
    na("reward.custom_reward_function.name", "read with the path (default compute_score)"),
    na("reward.custom_reward_function.reward_kwargs.*", "read with the path: `reward.params.kwargs`"),
    conv("reward.reward_manager.name", reward_manager, "as reward_model.reward_manager"),
    na("reward.reward_manager.*", "rewards are computed by the kind in [reward]"),
    na("reward.num_workers", "rule rewards are computed in the controller"),
    refuse("reward.sandbox_fusion.*", "code sandboxes: serve them behind reward.kind = \"remote\" (an HTTP scorer)"),
    conv("custom_reward_function.path", custom_reward_path, "`reward.kind = \"python\"`: the function runs as verl calls it (`reward.params.path`, `function` from custom_reward_function.name, `kwargs` from its reward_kwargs)"),
    na("custom_reward_function.name", "read with custom_reward_function.path (default compute_score)"),
    na("custom_reward_function.reward_kwargs.*", "read with custom_reward_function.path: `reward.params.kwargs`"),
    // ---- algorithm
    to("algorithm.adv_estimator", "algorithm.adv_estimator", Conv::Text),
    to("algorithm.gamma", "algorithm.gamma", Conv::Float),
    to("algorithm.lam", "algorithm.lam", Conv::Float),
    to("algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std_in_grpo", Conv::Bool),
    to("algorithm.use_kl_in_reward", "algorithm.use_kl_in_reward", Conv::Bool),
    to("algorithm.kl_penalty", "algorithm.kl_penalty", Conv::Text),
    to("algorithm.kl_ctrl.type", "algorithm.kl_ctrl.type", Conv::Text),
    to("algorithm.kl_ctrl.kl_coef", "algorithm.kl_ctrl.kl_coef", Conv::Float),
    to("algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.horizon", Conv::Float),
    to("algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.target_kl", Conv::Float),
    conv("algorithm.use_pf_ppo", off_only, "false accepted; true refused (not supported)"),
    na("algorithm.pf_ppo.*", "applies with algorithm.use_pf_ppo"),
    to("algorithm.filter_groups.enable", "algorithm.filter_groups.enable", Conv::Bool),
    conv("algorithm.filter_groups.metric", filter_metric, "`algorithm.filter_groups.metric` (acc, score, seq_reward, seq_final_reward)"),
    conv("algorithm.filter_groups.max_num_gen_batches", max_gen_batches, "`algorithm.filter_groups.max_num_gen_batches` (≤ 0: no cap)"),
    na("algorithm.filter_groups.*", "generation rounds run one after another"),
    na("algorithm.rollout_correction.*", "rollout and training share one engine's weights: there is no engine mismatch to correct"),
    conv("distillation.enabled", off_only, "false accepted; distillation refused (not yet)"),
    na("distillation.*", "applies with distillation.enabled"),
    conv("algorithm.no_think_rl", off_only, "false accepted; true refused (Search-R1's no-think mode: not yet)"),
    // ---- trainer
    to("trainer.total_epochs", "trainer.total_epochs", Conv::Count),
    to("trainer.total_training_steps", "trainer.total_steps", Conv::Count),
    to("trainer.project_name", "trainer.project_name", Conv::Text),
    to("trainer.experiment_name", "trainer.experiment_name", Conv::Text),
    conv("trainer.logger", logger, "`trainer.logger` (console, wandb, mlflow, tensorboard; metrics.jsonl is always written)"),
    to("trainer.log_val_generations", "trainer.log_val_generations", Conv::Count),
    na("trainer.rollout_data_dir", "rollouts are not dumped"),
    na("trainer.validation_data_dir", "validation generations are not dumped"),
    conv("trainer.nnodes", placement, "with n_gpus_per_node: 1 GPU in all → one process; more → `cluster.backend = \"ray\"`, `cluster.colocate_all = true`, every role on nnodes × n_gpus_per_node ranks"),
    conv("trainer.n_gpus_per_node", placement, "see trainer.nnodes"),
    to("trainer.save_freq", "trainer.save_freq", Conv::Never),
    to("trainer.test_freq", "trainer.test_freq", Conv::Never),
    conv("trainer.critic_warmup", critic_warmup, "0 accepted; more refused (not yet)"),
    na("trainer.default_hdfs_dir", "checkpoints go to trainer.default_local_dir (a shared file system on a cluster)"),
    na("trainer.del_local_ckpt_after_load", "checkpoints are kept per trainer.max_actor_ckpt_to_keep"),
    conv("trainer.default_local_dir", local_dir, "`trainer.default_local_dir` (verl's `${trainer.project_name}`-style references resolved)"),
    conv("trainer.resume_mode", resume_mode, "auto → `--resume auto`; disable → `--resume none`; resume_path → `--resume trainer.resume_from_path`"),
    na("trainer.resume_from_path", "read with trainer.resume_mode=resume_path"),
    to("trainer.val_before_train", "trainer.val_before_train", Conv::Bool),
    conv("trainer.val_only", val_only, "`trainer.val_only` (validate once, no training), as verl only with trainer.val_before_train"),
    conv("trainer.max_actor_ckpt_to_keep", ckpt_keep, "`trainer.max_ckpt_to_keep` (null: all)"),
    na("trainer.max_critic_ckpt_to_keep", "the critic is saved in the same checkpoints as the actor"),
    na("trainer.balance_batch", "sequences are packed and split evenly across ranks"),
    conv("trainer.device", device, "`trainer.device` (cuda, cpu)"),
    to("trainer.seed", "trainer.seed", Conv::Count),
    na("trainer.ray_wait_register_center_timeout", "workers connect to the controller within cluster.startup_timeout_s"),
    na("trainer.use_legacy_worker_impl", "one worker implementation"),
    na("trainer.esi_redundant_time", "not applicable outside verl's elastic server instances"),
    na("trainer.profile_steps", "profiling is not supported"),
    na("trainer.controller_nsight_options.*", "profiling is not supported"),
    na("trainer.worker_nsight_options.*", "profiling is not supported"),
    na("trainer.npu_profile.*", "profiling is not supported"),
    na("ray_init.*", "the Ray cluster is the one `reinforge cluster start` (or your own) runs"),
    na("ray_kwargs.*", "the Ray cluster is the one `reinforge cluster start` (or your own) runs"),
    na("global_profiler.*", "profiling is not supported"),
    na("actor_rollout_ref.actor.profiler.*", "profiling is not supported"),
    na("actor_rollout_ref.ref.profiler.*", "profiling is not supported"),
    na("actor_rollout_ref.rollout.profiler.*", "profiling is not supported"),
    na("critic.profiler.*", "profiling is not supported"),
    na("reward_model.profiler.*", "profiling is not supported"),
    na("actor_rollout_ref.ref.megatron.*", NO_SHARDING),
    na("critic.megatron.*", NO_SHARDING),
    na("transfer_queue.*", "batches move over the controller's connections"),
    na("trainer.use_v1", "one trainer loop"),
    na("trainer.v1.*", "one trainer loop: generation and training alternate (on-policy)"),
    conv("trainer.checkpoint_callback_class", unset_only, "unset accepted; Python callbacks refused"),
    na("skip.*", "rollouts are always generated fresh (no dump or replay)"),
    // ---- Search-R1's additions
    to("do_search", "tools.search.enable", Conv::Bool),
    to("max_turns", "tools.search.max_turns", Conv::Count),
    conv("reward_model.structure_format_score", search_r1_format, SEARCH_R1_FORMAT_DOC),
    conv("reward_model.final_format_score", search_r1_format, SEARCH_R1_FORMAT_DOC),
    conv("reward_model.retrieval_score", search_r1_format, SEARCH_R1_FORMAT_DOC),
    to("retriever.url", "tools.search.url", Conv::Text),
    to("retriever.topk", "tools.search.topk", Conv::Count),
];

/// verl's defaults (ppo_trainer.yaml) for every key whose default differs from Reinforge's or
/// that a conversion reads.
pub fn defaults() -> Vec<(&'static str, HValue)> {
    use HValue::*;
    vec![
        ("data.max_prompt_length", Int(512)),
        ("data.max_response_length", Int(512)),
        ("data.train_batch_size", Int(1024)),
        ("data.shuffle", Bool(true)),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", Int(256)),
        ("actor_rollout_ref.actor.grad_clip", Float(1.0)),
        ("actor_rollout_ref.actor.clip_ratio", Float(0.2)),
        // verl's clip bounds default to 0.2 themselves, not to `clip_ratio`: a command that sets
        // only `clip_ratio` clips at 0.2 in verl, so it must here too.
        ("actor_rollout_ref.actor.clip_ratio_low", Float(0.2)),
        ("actor_rollout_ref.actor.clip_ratio_high", Float(0.2)),
        ("actor_rollout_ref.actor.clip_ratio_c", Float(3.0)),
        ("actor_rollout_ref.actor.loss_agg_mode", Str("token-mean".into())),
        ("actor_rollout_ref.actor.entropy_coeff", Float(0.0)),
        ("actor_rollout_ref.actor.use_kl_loss", Bool(false)),
        ("actor_rollout_ref.actor.kl_loss_coef", Float(0.001)),
        ("actor_rollout_ref.actor.kl_loss_type", Str("low_var_kl".into())),
        ("actor_rollout_ref.actor.ppo_epochs", Int(1)),
        ("actor_rollout_ref.actor.shuffle", Bool(false)),
        ("actor_rollout_ref.actor.optim.lr", Float(1e-6)),
        ("actor_rollout_ref.actor.optim.lr_warmup_steps", Int(-1)),
        ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", Float(0.0)),
        ("actor_rollout_ref.actor.optim.min_lr_ratio", Float(0.0)),
        ("actor_rollout_ref.actor.optim.warmup_style", Str("constant".into())),
        ("actor_rollout_ref.actor.optim.weight_decay", Float(0.01)),
        ("actor_rollout_ref.model.enable_gradient_checkpointing", Bool(true)),
        ("actor_rollout_ref.rollout.temperature", Float(1.0)),
        ("actor_rollout_ref.rollout.top_k", Int(-1)),
        ("actor_rollout_ref.rollout.top_p", Float(1.0)),
        ("actor_rollout_ref.rollout.n", Int(1)),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", Float(0.5)),
        ("actor_rollout_ref.rollout.val_kwargs.temperature", Float(0.0)),
        ("actor_rollout_ref.rollout.val_kwargs.n", Int(1)),
        // verl's validation has a sampler of its own, not the rollout's.
        ("actor_rollout_ref.rollout.val_kwargs.top_k", Int(-1)),
        ("actor_rollout_ref.rollout.val_kwargs.top_p", Float(1.0)),
        ("critic.optim.lr", Float(1e-5)),
        ("critic.optim.lr_warmup_steps", Int(-1)),
        ("critic.optim.lr_warmup_steps_ratio", Float(0.0)),
        ("critic.optim.weight_decay", Float(0.01)),
        ("critic.grad_clip", Float(1.0)),
        ("critic.cliprange_value", Float(0.5)),
        ("algorithm.adv_estimator", Str("gae".into())),
        ("algorithm.gamma", Float(1.0)),
        ("algorithm.lam", Float(1.0)),
        ("algorithm.norm_adv_by_std_in_grpo", Bool(true)),
        ("algorithm.use_kl_in_reward", Bool(false)),
        ("algorithm.kl_penalty", Str("kl".into())),
        ("algorithm.kl_ctrl.type", Str("fixed".into())),
        ("algorithm.kl_ctrl.kl_coef", Float(0.001)),
        ("algorithm.kl_ctrl.horizon", Float(10000.0)),
        ("algorithm.kl_ctrl.target_kl", Float(0.1)),
        ("trainer.total_epochs", Int(30)),
        ("trainer.project_name", Str("verl_examples".into())),
        ("trainer.experiment_name", Str("gsm8k".into())),
        ("trainer.logger", List(vec![Str("console".into()), Str("wandb".into())])),
        ("trainer.nnodes", Int(1)),
        ("trainer.n_gpus_per_node", Int(8)),
        ("trainer.save_freq", Int(-1)),
        ("trainer.test_freq", Int(-1)),
        ("trainer.val_before_train", Bool(true)),
        ("trainer.default_local_dir", Str("checkpoints/${trainer.project_name}/${trainer.experiment_name}".into())),
        ("trainer.max_actor_ckpt_to_keep", Null),
        ("trainer.device", Str("cuda".into())),
    ]
}

/// Data-parallel ranks of a verl command: every role sits on all GPUs.
fn world(c: &Ctx<'_>) -> usize {
    c.count("trainer.nnodes", 1) * c.count("trainer.n_gpus_per_node", 8)
}

fn text(v: &HValue) -> String {
    v.as_text().unwrap_or_else(|| v.to_string())
}

fn mini_batch(c: &mut Ctx<'_>, _: &HValue) -> Result<Outcome, String> {
    let mini = c.count("actor_rollout_ref.actor.ppo_mini_batch_size", 256);
    let Some(agents) = c.get("actor_rollout_ref.rollout.n_agent").and_then(HValue::as_usize) else {
        c.set("actor.ppo_mini_batch_size", mini as i64);
        return Ok(Outcome::Mapped);
    };
    // Search-R1 repeats each prompt n_agent times before generating, so its mini-batch counts
    // sequences; ours counts prompts (× rollout.n), or sequences when it is not whole prompts.
    if agents == 0 {
        return Err("rollout.n_agent = 0: Search-R1 samples n_agent responses per prompt; use ≥ 1".into());
    }
    c.set("rollout.n", agents as i64);
    if mini.is_multiple_of(agents) {
        c.set("actor.ppo_mini_batch_size", (mini / agents) as i64);
        return Ok(Outcome::Mapped);
    }
    let seqs = c.count("data.train_batch_size", 1024) * agents;
    if mini == 0 || !seqs.is_multiple_of(mini) {
        return Err(format!(
            "Search-R1's ppo_mini_batch_size ({mini} sequences) does not split the step's {seqs} sequences (data.train_batch_size × n_agent) into whole mini-batches; use a divisor of {seqs}"
        ));
    }
    c.set("actor.ppo_mini_batch_sequences", mini as i64);
    Ok(Outcome::Mapped)
}

fn loss_agg(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let mode = text(v);
    if c.get("critic.loss_agg_mode").is_none() {
        c.set("critic.loss_agg_mode", mode.clone());
    }
    c.set("actor.loss_agg_mode", mode);
    Ok(Outcome::Mapped)
}

fn reward_fn_key(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match text(v).as_str() {
        "data_source" => Ok(Outcome::NotApplicable("rewards are routed by each row's data_source".into())),
        other => Err(format!("rewards are routed by `data_source`, not `{other}`; rename the column or set reward.kind")),
    }
}

fn exclude_modules(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    unset_only(c, v).map_err(|_| format!("`{v}`: exclusions are not supported; list the linears to adapt in actor_rollout_ref.model.target_modules instead"))
}

fn critic_lora_rank(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_f64() {
        Some(0.0) => Ok(Outcome::NotApplicable("full fine-tuning (no LoRA)".into())),
        None if v.is_null() => Ok(Outcome::NotApplicable("full fine-tuning (no LoRA)".into())),
        _ => Err("LoRA on the critic is not supported yet: the critic fine-tunes every weight (critic.model.lora_rank=0); the actor's LoRA is actor_rollout_ref.model.lora_rank".into()),
    }
}

fn custom_chat_template(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if v.is_null() {
        return Ok(Outcome::NotApplicable("the model's own chat template is used".into()));
    }
    Err("a custom chat template on the command line is not supported; put it in the model's tokenizer_config.json".into())
}

fn strategy(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match text(v).as_str() {
        "fsdp" | "fsdp2" | "megatron" => Ok(Outcome::NotApplicable(NO_SHARDING.into())),
        other => Err(format!("unknown strategy `{other}`: verl takes fsdp, fsdp2 or megatron")),
    }
}

fn global_micro(c: &mut Ctx<'_>, v: &HValue, ours: &str) -> Result<Outcome, String> {
    let Some(n) = v.as_usize() else {
        return if v.is_null() { Ok(Outcome::NotApplicable("null: the *_per_gpu size applies".into())) } else { Err(format!("expected a number, got `{v}`")) };
    };
    let w = world(c);
    if n % w != 0 || n == 0 {
        return Err(format!("a global micro-batch of {n} does not split over {w} GPUs; give the *_per_gpu size instead"));
    }
    c.set(ours, (n / w) as i64);
    Ok(Outcome::Mapped)
}

fn actor_micro_global(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    global_micro(c, v, "actor.ppo_micro_batch_size")
}

fn critic_micro_global(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    global_micro(c, v, "critic.ppo_micro_batch_size")
}

const SEQUENCE_PARALLEL_DOC: &str = "n/a: every rank holds whole sequences (the same loss and gradient; a sequence must fit one GPU)";

fn sequence_parallel(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    crate::rules::sequence_split("Ulysses sequence parallelism", v)
}

/// verl 0.9's registered policy losses that Reinforge has (reinforge-algos' `PolicyLossMode`).
pub const LOSS_MODES: &[&str] = &["vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo"];

fn loss_mode(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let name = text(v);
    match name.as_str() {
        "bypass_mode" => Err("policy loss `bypass_mode` is rollout correction against a separate inference engine's log-probs; Reinforge's rollout shares the trainer's weights, so use `vanilla`".into()),
        n if LOSS_MODES.contains(&n) => {
            c.set("actor.policy_loss.loss_mode", n);
            Ok(Outcome::Mapped)
        }
        other => Err(format!("policy loss `{other}` is not a verl loss mode Reinforge has; use one of {}", LOSS_MODES.join(", "))),
    }
}

fn dro_beta(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if v.is_null() {
        return Ok(Outcome::NotApplicable("unset (only `dro` needs it)".into()));
    }
    c.set("actor.policy_loss.dro_beta", v.as_f64().ok_or_else(|| format!("expected a number, got `{v}`"))?);
    Ok(Outcome::Mapped)
}

fn warmup_steps(c: &mut Ctx<'_>, v: &HValue, ours: &str) -> Result<Outcome, String> {
    match v.as_i64() {
        Some(n) if n < 0 => {
            c.set(ours, 0);
            Ok(Outcome::Mapped)
        }
        Some(n) => {
            c.set(ours, n);
            Ok(Outcome::Mapped)
        }
        None => Err(format!("expected a whole number of steps (-1: use the ratio), got `{v}`")),
    }
}

fn actor_warmup_steps(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    warmup_steps(c, v, "actor.lr_warmup_steps")
}

fn critic_warmup_steps(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    warmup_steps(c, v, "critic.lr_warmup_steps")
}

fn actor_schedule(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match text(v).as_str() {
        s @ ("constant" | "cosine") => {
            c.set("actor.lr_scheduler", s);
            Ok(Outcome::Mapped)
        }
        other => Err(format!("learning-rate schedule `{other}` is not supported; constant or cosine")),
    }
}

fn cosine_cycles(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_f64() {
        Some(x) if (x - 0.5).abs() < 1e-12 => Ok(Outcome::NotApplicable("half a cosine, as Reinforge's cosine schedule".into())),
        _ => Err(format!("cosine cycles {v} are not supported; 0.5 (one half cosine)")),
    }
}

fn rollout_name(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match text(v).as_str() {
        "vllm" | "sglang" | "hf" => Ok(Outcome::NotApplicable(OWN_ENGINE.into())),
        other => Err(format!("unknown rollout engine `{other}`: verl takes vllm, sglang or hf")),
    }
}

const DO_SAMPLE: &str = "actor_rollout_ref.rollout.do_sample";

/// verl's rollouts that read `do_sample` decode greedily when it is false whatever the
/// temperature, so both keys set temperature 0 then, in whichever order they come.
fn do_sample(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_bool() {
        Some(true) => Ok(Outcome::NotApplicable("sampling at actor_rollout_ref.rollout.temperature".into())),
        Some(false) => {
            c.set("rollout.temperature", 0.0);
            Ok(Outcome::Mapped)
        }
        None => Err(format!("expected true or false, got `{v}`")),
    }
}

fn temperature(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let Some(t) = v.as_f64() else {
        return match v.is_null() {
            true => Ok(Outcome::NotApplicable("null: Reinforge's default temperature".into())),
            false => Err(format!("expected a number, got `{v}`")),
        };
    };
    c.set("rollout.temperature", if c.flag(DO_SAMPLE, true) { t } else { 0.0 });
    Ok(Outcome::Mapped)
}

/// verl's agent loop (`experimental/agent_loop/agent_loop.py`, its default `rollout.mode: async`)
/// validates with val_kwargs' temperature, top-p and top-k and never reads
/// `val_kwargs.do_sample`: greedy is temperature 0, verl's default. (Its older synchronous
/// rollouts read do_sample too; following the agent loop also keeps the conversion from
/// depending on the order of the two keys.)
fn val_do_sample(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_bool() {
        Some(_) => Ok(Outcome::NotApplicable("validation samples at val_kwargs.temperature (0 is greedy), as verl's agent loop does".into())),
        None => Err(format!("expected true or false, got `{v}`")),
    }
}

fn tool_format(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_text().as_deref() {
        Some("hermes") => {
            c.set("tools.calls.format", "hermes");
            Ok(Outcome::Mapped)
        }
        Some("qwen") => Err("`qwen` is not one of verl's tool parsers (hermes, gpt-oss): verl stops with \"Unknown tool parser\"; Qwen models write hermes blocks: use multi_turn.format=hermes".into()),
        Some(other) => Err(format!("`{other}`: calls are read in the hermes format (<tool_call>{{\"name\": …, \"arguments\": …}}</tool_call>); use multi_turn.format=hermes")),
        None => Err(format!("expected a parser name, got `{v}`")),
    }
}

/// verl picks the loop per row (`agent_name`), else this default; here one loop runs the run.
fn agent_loop(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_text().as_deref() {
        Some("single_turn_agent") => Ok(Outcome::NotApplicable(
            "verl's default loop for rows without agent_name; here multi_turn.enable decides for every row (README \"Tool calling\")".into(),
        )),
        Some("tool_agent") => {
            c.set("tools.calls.enable", true);
            Ok(Outcome::Mapped)
        }
        _ => Err(format!("`{v}`: the agent loops here are single_turn_agent and tool_agent (tools.calls, README \"Tool calling\")")),
    }
}

/// verl's single-turn loop shows `data.tool_config_path`'s schemas in its prompts; here the
/// tool agent does (its tool config), so the key is fine with it and refused without.
fn data_tools(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let agent = c.flag("actor_rollout_ref.rollout.multi_turn.enable", false) || c.get("actor_rollout_ref.rollout.agent.default_agent_loop").and_then(HValue::as_text).as_deref() == Some("tool_agent");
    match v {
        HValue::Null => Ok(Outcome::NotApplicable("unset".into())),
        _ if agent => Ok(Outcome::NotApplicable("the tool agent's prompts show its tools' schemas (multi_turn.tool_config_path)".into())),
        _ => Err("tool schemas in single-turn prompts are not supported: set actor_rollout_ref.rollout.multi_turn.enable=True and multi_turn.tool_config_path for tool calling (README \"Tool calling\")".into()),
    }
}

/// verl 0.9's Python function tools: fine when unset.
fn function_tools(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v {
        HValue::Null => Ok(Outcome::NotApplicable("unset".into())),
        _ => Err(format!("`{v}`: Python function tools do not run here; the tool agent runs verl's Gsm8kTool and SearchTool (tools.calls, README \"Tool calling\")")),
    }
}

/// What verl's example multi-turn configs (`examples/sglang_multiturn/config/*.yaml`) set over
/// ppo_trainer's defaults; their tools come from `multi_turn.tool_config_path`.
pub fn config_defaults(name: &str) -> Vec<(&'static str, HValue)> {
    use HValue::*;
    let mut v = match name {
        "gsm8k_multiturn_grpo" | "gsm8k_multiturn_megatron_grpo" | "gsm8k_multiturn_grpo_server" | "gsm8k_multiturn_grpo_w_interaction" | "search_multiturn_grpo" => vec![
            ("data.max_prompt_length", Int(1024)),
            ("data.max_response_length", Int(1024)),
            ("data.train_batch_size", Int(256)),
            ("actor_rollout_ref.rollout.multi_turn.enable", Bool(true)),
        ],
        _ => return Vec::new(),
    };
    match name {
        "gsm8k_multiturn_grpo_w_interaction" => v.push(("actor_rollout_ref.rollout.multi_turn.max_user_turns", Int(5))),
        "search_multiturn_grpo" => v.extend([
            ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", Int(2)),
            ("actor_rollout_ref.rollout.multi_turn.format", Str("qwen".into())),
            ("data.shuffle", Bool(false)),
        ]),
        _ => v.push(("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", Int(5))),
    }
    v
}

fn ignore_eos(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_bool() {
        Some(false) => Ok(Outcome::NotApplicable("generation stops at EOS".into())),
        _ => Err("ignore_eos is not supported: generation stops at EOS or data.max_response_length".into()),
    }
}

fn config_name(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let typed = v.as_text().unwrap_or_default();
    let name = typed.trim_end_matches(".yaml");
    match name {
        "ppo_trainer" => Ok(Outcome::NotApplicable("verl's default config, whose defaults Reinforge's translation starts from".into())),
        "ppo_megatron_trainer" => Ok(Outcome::NotApplicable(
            "verl's Megatron config: the same PPO keys, translated with ppo_trainer's defaults; its parallelism (megatron.*) does not apply (data-parallel ranks)".into(),
        )),
        n if !config_defaults(n).is_empty() => Ok(Outcome::NotApplicable(format!(
            "verl's multi-turn tool config: its values apply as defaults ({}); the tools come from multi_turn.tool_config_path",
            config_defaults(n).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
        ))),
        n if n.contains("multiturn") || n.contains("multi_turn") => Err(format!(
            "`{typed}` is a multimodal or custom multi-turn config: not translated; the tool agent runs text tools (gsm8k_multiturn_grpo, search_multiturn_grpo: tools.calls, README \"Tool calling\")"
        )),
        _ => Err(format!("`{typed}` is not a verl config Reinforge translates; it reads ppo_trainer's keys (drop --config-name/--config-path)")),
    }
}

fn rollout_tp(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    // vLLM's layout only: the batch arithmetic never sees it, and a model the actor trains on
    // one GPU generates on one, so every GPU runs an engine of its own on the same weights.
    match v.as_usize() {
        Some(1) => Ok(Outcome::NotApplicable("one engine per GPU".into())),
        Some(tp) if tp > 1 => Ok(Outcome::NotApplicable(format!(
            "one engine per GPU instead of one split over {tp}: every rollout GPU generates on its own (same samples, same batch sizes)"
        ))),
        _ => Err(format!("expected a GPU count ≥ 1, got `{v}`")),
    }
}

fn critic_mini(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let actor = c.count("actor_rollout_ref.actor.ppo_mini_batch_size", 256);
    match v.as_usize() {
        Some(n) if n == actor => Ok(Outcome::NotApplicable("the critic updates on the actor's mini-batches".into())),
        _ => Err(format!("the critic updates on the actor's mini-batches ({actor} prompts); drop critic.ppo_mini_batch_size or set it to {actor}")),
    }
}

fn critic_epochs(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let actor = c.count("actor_rollout_ref.actor.ppo_epochs", 1);
    match v.as_usize() {
        Some(n) if n == actor => Ok(Outcome::NotApplicable("the critic trains for the actor's ppo_epochs".into())),
        _ => Err(format!("the critic trains for the actor's ppo_epochs ({actor}); drop critic.ppo_epochs or set it to {actor}")),
    }
}

fn reward_model_enable(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_bool() {
        Some(false) => Ok(Outcome::NotApplicable("rewards come from rule functions routed by data_source".into())),
        Some(true) => {
            let path = c.get("reward_model.model.path").or_else(|| c.get("reward.reward_model.model_path")).and_then(HValue::as_text);
            let Some(path) = path else {
                return Err("reward_model.enable=True needs reward_model.model.path".into());
            };
            c.set("reward.kind", "reward_model");
            c.set("reward.params.path", path);
            Ok(Outcome::Mapped)
        }
        None => Err(format!("expected true or false, got `{v}`")),
    }
}

fn reward_model_path(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if !c.flag("reward_model.enable", false) && !c.flag("reward.reward_model.enable", false) {
        return Ok(Outcome::NotApplicable("read only with reward_model.enable=True".into()));
    }
    c.set("reward.params.path", text(v));
    Ok(Outcome::Mapped)
}

fn reward_model_micro(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if !c.flag("reward_model.enable", false) {
        return Ok(Outcome::NotApplicable("read only with reward_model.enable=True".into()));
    }
    let n = v.as_usize().filter(|n| *n > 0).ok_or_else(|| format!("expected a batch size ≥ 1, got `{v}`"))?;
    c.set("reward.params.batch_size", n as i64);
    Ok(Outcome::Mapped)
}

fn reward_manager(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match text(v).as_str() {
        "naive" => Ok(Outcome::NotApplicable("one score per response from the reward routed by data_source".into())),
        "dapo" => Ok(Outcome::NotApplicable("one score per response by data_source, plus DAPO's overlong penalty when overlong_buffer_cfg.enable (reward.overlong_buffer)".into())),
        other => Err(format!("reward manager `{other}` is not supported; `naive` or `dapo` (one score per response; reward.kind = \"combined\" adds format or length terms)")),
    }
}

fn filter_metric(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if v.is_null() {
        return Ok(Outcome::NotApplicable("unset: `acc` (the reward's score)".into()));
    }
    if !c.get("algorithm.filter_groups.enable").and_then(HValue::as_bool).unwrap_or(false) {
        return Ok(Outcome::NotApplicable("applies with algorithm.filter_groups.enable".into()));
    }
    match text(v).as_str() {
        m @ ("acc" | "score" | "seq_reward" | "seq_final_reward") => {
            c.set("algorithm.filter_groups.metric", m);
            Ok(Outcome::Mapped)
        }
        other => Err(format!("filter_groups metric `{other}` is not one Reinforge scores; use acc, score, seq_reward or seq_final_reward")),
    }
}

/// verl's dataloader yields `gen_batch_size` prompts; only dynamic sampling then fills a step
/// of `train_batch_size` from them.
fn gen_batch_size(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    // ray_trainer.py: `gen_batch_size or train_batch_size`, so 0 is unset too.
    if v.is_null() || v.as_i64() == Some(0) {
        return Ok(Outcome::NotApplicable("unset: data.train_batch_size prompts per generation".into()));
    }
    let g = v.as_usize().filter(|&g| g > 0).ok_or_else(|| format!("expected a whole number ≥ 1, got `{v}`"))?;
    let filtering = c.get("algorithm.filter_groups.enable").and_then(HValue::as_bool).unwrap_or(false);
    let train = c.get("data.train_batch_size").and_then(HValue::as_usize);
    if filtering {
        c.set("data.gen_batch_size", g as i64);
        Ok(Outcome::Mapped)
    } else if train == Some(g) {
        Ok(Outcome::NotApplicable("equals data.train_batch_size".into()))
    } else {
        Err(format!("without algorithm.filter_groups.enable verl trains on data.gen_batch_size ({g}) prompts per step: set data.train_batch_size={g} instead"))
    }
}

/// verl's recipe keeps generating while `max_num_gen_batches <= 0 or num_gen_batches <
/// max_num_gen_batches`: any value ≤ 0 is no cap, ours 0.
fn max_gen_batches(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let n = v.as_i64().ok_or_else(|| format!("expected a whole number, got `{v}`"))?;
    c.set("algorithm.filter_groups.max_num_gen_batches", n.max(0));
    Ok(Outcome::Mapped)
}

const OVERLONG_LOGGED: &str = "the penalty is always logged (reward/overlong_penalty, reward/overlong_frac)";

/// verl passes `reward_kwargs` to the reward manager's constructor: only `dapo`'s takes
/// `overlong_buffer_cfg` (the naive manager would fail on it).
fn overlong_enable(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let on = v.as_bool().ok_or_else(|| format!("expected true or false, got `{v}`"))?;
    let manager = ["reward_model.reward_manager", "reward.reward_manager.name", "reward_manager.name"]
        .iter()
        .find_map(|k| c.get(k).filter(|m| !m.is_null()).map(text))
        .unwrap_or_else(|| "naive".into());
    if on && manager != "dapo" {
        return Err(format!("the overlong penalty is the `dapo` reward manager's, not `{manager}`'s: add reward_model.reward_manager=dapo"));
    }
    c.set("reward.overlong_buffer.enable", on);
    Ok(Outcome::Mapped)
}

/// verl's custom reward function (`custom_reward_function`, or 0.9.1's
/// `reward.custom_reward_function`): it scores every data source, called as verl's naive
/// manager calls it, with `reward_kwargs` merged in.
fn custom_reward_path(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    if v.is_null() || text(v).is_empty() {
        return Ok(Outcome::NotApplicable("built-in rewards by data_source".into()));
    }
    if c.flag("reward_model.enable", false) || c.flag("reward.reward_model.enable", false) {
        return Err("a custom reward function and reward_model.enable=True: Reinforge scores with one reward; drop one (or combine them with reward.kind = \"combined\")".into());
    }
    let group = ["custom_reward_function", "reward.custom_reward_function"]
        .into_iter()
        .find(|g| c.get(&format!("{g}.path")).is_some_and(|p| text(p) == text(v)))
        .unwrap_or("custom_reward_function");
    let name = c.get(&format!("{group}.name")).map(text).unwrap_or_else(|| "compute_score".into());
    let kwargs = keyword_table(c, &format!("{group}.reward_kwargs"), "a keyword argument")?;
    c.set("reward.kind", "python");
    c.set("reward.params.path", text(v));
    c.set("reward.params.function", name);
    if !kwargs.is_empty() {
        c.set("reward.params.kwargs", kwargs);
    }
    Ok(Outcome::Mapped)
}

const SEARCH_R1_FORMAT_DOC: &str = "Search-R1's format scores (`main_ppo_format`): its QA sources route to `qa_em` with them (reward.params.routes)";

/// The data sources Search-R1's `main_ppo_format` scores with `qa_em_format`.
const SEARCH_R1_FORMAT_SOURCES: [&str; 9] =
    ["nq", "triviaqa", "popqa", "web_questions", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "strategyqa"];

/// Search-R1's `reward_model.structure_format_score`, `final_format_score` and
/// `retrieval_score`: each one's rule reads all three and routes Search-R1's QA sources to
/// `qa_em` with them (the same route whichever key sets it).
fn search_r1_format(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    v.as_f64().ok_or_else(|| format!("expected a number, got `{v}`"))?;
    let mut params = toml::Table::new();
    for key in ["structure_format_score", "final_format_score", "retrieval_score"] {
        let x = match c.get(&format!("reward_model.{key}")) {
            Some(x) => x.as_f64().ok_or_else(|| format!("reward_model.{key}: expected a number, got `{x}`"))?,
            None => 0.0,
        };
        if x != 0.0 {
            params.insert(key.into(), x.into());
        }
    }
    if params.is_empty() {
        return Ok(Outcome::NotApplicable("0: off".into()));
    }
    if c.flag("reward_model.enable", false) {
        return Err("Search-R1's format scores grade rule rewards; with reward_model.enable=True its reward model scores instead: drop one".into());
    }
    let mut reward = toml::Table::new();
    reward.insert("kind".into(), "qa_em".into());
    reward.insert("params".into(), params.into());
    let route = |reward: toml::Table| {
        let mut route = toml::Table::new();
        route.insert("data_sources".into(), toml::Value::Array(SEARCH_R1_FORMAT_SOURCES.iter().map(|s| (*s).into()).collect()));
        route.insert("reward".into(), reward.into());
        toml::Value::Array(vec![route.into()])
    };
    c.set("reward.params.routes", route(reward));
    // main_ppo_format validates with a RewardManager whose format scores are all 0: plain EM,
    // over the same sources.
    let mut em = toml::Table::new();
    em.insert("kind".into(), "qa_em".into());
    c.set("reward.val.kind", "router");
    c.set("reward.val.params.routes", route(em));
    Ok(Outcome::Mapped)
}

/// Search-R1's keys: any of them in a command turns its search rollouts on, as Search-R1's
/// `do_search` (true by default there) does, unless the command says `do_search=false`.
pub const SEARCH_R1_KEYS: &[&str] =
    &["max_turns", "retriever.url", "retriever.topk", "data.max_obs_length", "data.max_start_length", "actor_rollout_ref.actor.state_masking"];

fn logger(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let names: Vec<String> = match v {
        HValue::List(items) => items.iter().map(text).collect(),
        HValue::Null => Vec::new(),
        one => vec![text(one)],
    };
    let mut ours = vec![toml::Value::String("jsonl".into())];
    for n in &names {
        match n.as_str() {
            "console" | "wandb" | "mlflow" | "tensorboard" => ours.push(toml::Value::String(n.clone())),
            "jsonl" => {}
            other => return Err(format!("logger `{other}` is not supported; console, wandb, mlflow, tensorboard")),
        }
    }
    c.set("trainer.logger", toml::Value::Array(ours));
    Ok(Outcome::Mapped)
}

fn placement(c: &mut Ctx<'_>, _: &HValue) -> Result<Outcome, String> {
    let (nodes, gpus) = (c.count("trainer.nnodes", 1), c.count("trainer.n_gpus_per_node", 8));
    if nodes == 0 || gpus == 0 {
        return Err("trainer.nnodes and trainer.n_gpus_per_node must be ≥ 1".into());
    }
    if nodes * gpus == 1 {
        c.set("cluster.backend", "local");
        return Ok(Outcome::Mapped);
    }
    c.set("cluster.backend", "ray");
    c.set("cluster.colocate_all", true);
    for role in ["actor", "rollout", "ref", "critic", "reward"] {
        c.set(&format!("cluster.{role}.nnodes"), nodes as i64);
        c.set(&format!("cluster.{role}.gpus_per_node"), gpus as i64);
    }
    Ok(Outcome::Mapped)
}

/// verl reads `val_only` inside its validation before training: with
/// `val_before_train=False` it trains as if `val_only` were unset.
fn val_only(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_bool() {
        Some(false) => Ok(Outcome::NotApplicable("off".into())),
        Some(true) if !c.flag("trainer.val_before_train", true) => {
            Ok(Outcome::NotApplicable("verl ignores it with trainer.val_before_train=False (it trains)".into()))
        }
        Some(true) => {
            c.set("trainer.val_only", true);
            Ok(Outcome::Mapped)
        }
        None => Err(format!("expected true or false, got `{v}`")),
    }
}

/// A dict of keyword arguments verl passes on (`reward_kwargs`, `apply_chat_template_kwargs`),
/// typed whole (`KEY={a:1}`) or one by one (`+KEY.a=1`); null entries left out. `what` names
/// an entry in the error for a dotted one.
fn keyword_table(c: &Ctx<'_>, key: &str, what: &str) -> Result<toml::Table, String> {
    let mut table = toml::Table::new();
    if let Some(HValue::Dict(whole)) = c.get(key) {
        table.extend(whole.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), generic(v))));
    }
    for (k, v) in c.family(key) {
        if k.contains('.') {
            return Err(format!("{key}.{k}: {what} is one name, not a dotted path"));
        }
        if !v.is_null() {
            table.insert(k.to_string(), generic(v));
        }
    }
    Ok(table)
}

/// verl passes `apply_chat_template_kwargs` to `apply_chat_template` as keyword arguments,
/// given whole (`={enable_thinking:False}`) or one by one (`+…kwargs.enable_thinking=False`):
/// each of its rules writes them all.
fn template_kwargs(c: &mut Ctx<'_>, _: &HValue) -> Result<Outcome, String> {
    let vars = keyword_table(c, "data.apply_chat_template_kwargs", "a template variable")?;
    if vars.is_empty() {
        return Ok(Outcome::NotApplicable("empty".into()));
    }
    c.set("data.apply_chat_template_kwargs", vars);
    Ok(Outcome::Mapped)
}

fn critic_warmup(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_usize() {
        Some(0) => Ok(Outcome::NotApplicable("the actor trains from the first step".into())),
        _ => Err("critic warm-up steps are not supported yet; use 0".into()),
    }
}

/// Resolves verl's `${trainer.key}` references from the command's other values.
fn interpolate(c: &Ctx<'_>, s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let Some(end) = rest[at..].find('}') else { return Err(format!("unclosed `${{` in `{s}`")) };
        let key = &rest[at + 2..at + end];
        let v = c.get(key).and_then(HValue::as_text).ok_or_else(|| format!("`${{{key}}}` in `{s}` names no value"))?;
        out.push_str(&v);
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn local_dir(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let dir = interpolate(c, &text(v))?;
    c.set("trainer.default_local_dir", dir);
    Ok(Outcome::Mapped)
}

fn resume_mode(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match text(v).as_str() {
        "auto" => c.set(crate::RESUME, "auto"),
        "disable" => c.set(crate::RESUME, "none"),
        "resume_path" => {
            let path = c.get("trainer.resume_from_path").and_then(HValue::as_text).ok_or("resume_mode=resume_path needs trainer.resume_from_path")?;
            c.set(crate::RESUME, path);
        }
        other => return Err(format!("resume_mode `{other}`: verl takes auto, disable or resume_path")),
    }
    Ok(Outcome::Mapped)
}

fn ckpt_keep(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v {
        HValue::Null => c.set("trainer.max_ckpt_to_keep", 0),
        v => c.set("trainer.max_ckpt_to_keep", v.as_usize().ok_or_else(|| format!("expected a count, got `{v}`"))? as i64),
    }
    Ok(Outcome::Mapped)
}

fn device(c: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match text(v).as_str() {
        d @ ("cuda" | "cpu") => {
            c.set("trainer.device", d);
            Ok(Outcome::Mapped)
        }
        other => Err(format!("device `{other}` is not supported; cuda or cpu")),
    }
}
