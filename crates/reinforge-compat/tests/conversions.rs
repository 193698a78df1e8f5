//! Each conversion the tables make, checked against what verl and OpenRLHF do with the same
//! setting (their code is quoted in the modules' docs): batch-size vocabularies, placement,
//! KL placement, estimators, schedules, loggers, resume, and the refusals.

use std::collections::BTreeMap;

use reinforge_compat::hydra::parse_override;
use reinforge_compat::{openrlhf, translate, Given, Source, Translation, Verdict};

fn ours(k: &str) -> bool {
    ["reward.kind", "trainer.device", "trainer.total_steps"].contains(&k) || k.starts_with("reward.params.")
}

fn verl(args: &[&str]) -> Translation {
    let given: Vec<Given> = args
        .iter()
        .map(|a| {
            let o = parse_override(a).unwrap();
            Given { raw: o.raw, key: o.key, op: o.op, value: o.value }
        })
        .collect();
    translate(Source::Verl, &given, &ours)
}

fn orlhf(args: &[&str]) -> Translation {
    let words: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let (given, own) = openrlhf::parse(&words).unwrap();
    let mut t = translate(Source::OpenRlhf, &given, &ours);
    t.own = own;
    t
}

/// Our keys as the config would see them: defaults, then what was typed (last wins).
fn resolved(t: &Translation) -> BTreeMap<String, toml::Value> {
    t.defaults.iter().chain(t.given.iter()).map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn int(t: &Translation, k: &str) -> i64 {
    resolved(t).get(k).and_then(toml::Value::as_integer).unwrap_or_else(|| panic!("{k} not set: {:?}", resolved(t)))
}

fn float(t: &Translation, k: &str) -> f64 {
    resolved(t).get(k).and_then(toml::Value::as_float).unwrap_or_else(|| panic!("{k} not set"))
}

fn string(t: &Translation, k: &str) -> String {
    resolved(t).get(k).and_then(|v| v.as_str().map(str::to_string)).unwrap_or_else(|| panic!("{k} not set"))
}

fn boolean(t: &Translation, k: &str) -> bool {
    resolved(t).get(k).and_then(toml::Value::as_bool).unwrap_or_else(|| panic!("{k} not set"))
}

fn refusal(t: &Translation) -> String {
    t.lines
        .iter()
        .find_map(|l| match &l.verdict {
            Verdict::Refused(why) => Some(format!("{}: {why}", l.arg)),
            _ => None,
        })
        .unwrap_or_default()
}

#[test]
fn verl_defaults_resolve_without_a_refusal() {
    let t = verl(&[]);
    assert!(t.lines.is_empty() && t.refused() == 0);
    assert_eq!(string(&t, "algorithm.adv_estimator"), "gae");
    assert_eq!(int(&t, "data.train_batch_size"), 1024);
    assert_eq!(int(&t, "actor.ppo_mini_batch_size"), 256);
    assert_eq!(int(&t, "data.max_response_length"), 512);
    assert_eq!(string(&t, "trainer.device"), "cuda");
    assert_eq!(string(&t, "trainer.default_local_dir"), "checkpoints/verl_examples/gsm8k");
    // verl's 1 node × 8 GPUs, every role colocated.
    assert_eq!(string(&t, "cluster.backend"), "ray");
    assert!(boolean(&t, "cluster.colocate_all"));
    assert_eq!((int(&t, "cluster.actor.nnodes"), int(&t, "cluster.actor.gpus_per_node")), (1, 8));
}

#[test]
fn verl_global_micro_batches_divide_over_every_gpu_exactly() {
    // fsdp_workers.py: ppo_micro_batch_size //= device_mesh.size() // sp_size.
    let t = verl(&["actor_rollout_ref.actor.ppo_micro_batch_size=64", "trainer.nnodes=1", "trainer.n_gpus_per_node=8"]);
    assert_eq!(int(&t, "actor.ppo_micro_batch_size"), 8);
    let t = verl(&["actor_rollout_ref.actor.ppo_micro_batch_size=64", "trainer.nnodes=2", "trainer.n_gpus_per_node=8"]);
    assert_eq!(int(&t, "actor.ppo_micro_batch_size"), 4);
    let t = verl(&["critic.ppo_micro_batch_size=8", "trainer.n_gpus_per_node=8"]);
    assert_eq!(int(&t, "critic.ppo_micro_batch_size"), 1);
    let t = verl(&["actor_rollout_ref.actor.ppo_micro_batch_size=10", "trainer.n_gpus_per_node=8"]);
    assert!(refusal(&t).contains("does not split over 8 GPUs"), "{}", refusal(&t));
    // Per-GPU sizes are ours as they are.
    let t = verl(&["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=2"]);
    assert_eq!((int(&t, "actor.ppo_micro_batch_size"), int(&t, "critic.ppo_micro_batch_size")), (4, 2));
}

#[test]
fn verl_mini_batches_count_prompts_but_search_r1_counts_sequences() {
    let t = verl(&["actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor_rollout_ref.rollout.n=5"]);
    assert_eq!((int(&t, "actor.ppo_mini_batch_size"), int(&t, "rollout.n")), (64, 5));
    // Search-R1 repeats prompts n_agent times before generating: its 250 are sequences.
    let t = verl(&["actor_rollout_ref.rollout.n_agent=5", "actor_rollout_ref.actor.ppo_mini_batch_size=250"]);
    assert_eq!((int(&t, "actor.ppo_mini_batch_size"), int(&t, "rollout.n")), (50, 5));
    // Search-R1's train_grpo.sh: 512 prompts, 256 sequences per update, 5 agents: 10 updates
    // of 256 sequences, as Search-R1 makes (a prompt's samples may straddle two of them).
    let t = verl(&["data.train_batch_size=512", "actor_rollout_ref.actor.ppo_mini_batch_size=256", "actor_rollout_ref.rollout.n_agent=5"]);
    assert_eq!(refusal(&t), "");
    assert_eq!((int(&t, "actor.ppo_mini_batch_sequences"), int(&t, "rollout.n")), (256, 5));
    // One that does not split the step's 2560 sequences is refused with the reason.
    let t = verl(&["data.train_batch_size=512", "actor_rollout_ref.actor.ppo_mini_batch_size=248", "actor_rollout_ref.rollout.n_agent=5"]);
    assert!(refusal(&t).contains("use a divisor of 2560"), "{}", refusal(&t));
    let t = verl(&["actor_rollout_ref.rollout.n_agent=1", "actor_rollout_ref.actor.ppo_mini_batch_size=256"]);
    assert_eq!((int(&t, "actor.ppo_mini_batch_size"), int(&t, "rollout.n")), (256, 1));
}

#[test]
fn verl_placement_is_one_process_on_one_gpu_and_colocated_ray_ranks_beyond() {
    let t = verl(&["trainer.nnodes=1", "trainer.n_gpus_per_node=1"]);
    assert_eq!(string(&t, "cluster.backend"), "local");
    let t = verl(&["trainer.n_gpus_per_node=4", "trainer.nnodes=2"]);
    assert_eq!(string(&t, "cluster.backend"), "ray");
    for role in ["actor", "rollout", "ref", "critic", "reward"] {
        assert_eq!((int(&t, &format!("cluster.{role}.nnodes")), int(&t, &format!("cluster.{role}.gpus_per_node"))), (2, 4), "{role}");
    }
}

#[test]
fn verl_values_that_mean_something_else_here_are_converted() {
    let t = verl(&["actor_rollout_ref.rollout.do_sample=False", "actor_rollout_ref.rollout.top_k=-1", "trainer.save_freq=-1"]);
    assert_eq!((float(&t, "rollout.temperature"), int(&t, "rollout.top_k"), int(&t, "trainer.save_freq")), (0.0, 0, 0));
    // do_sample=False is greedy beside any temperature, in either order.
    for args in [["actor_rollout_ref.rollout.temperature=0.7", "actor_rollout_ref.rollout.do_sample=False"], ["actor_rollout_ref.rollout.do_sample=False", "actor_rollout_ref.rollout.temperature=0.7"]] {
        assert_eq!(float(&verl(&args), "rollout.temperature"), 0.0, "{args:?}");
    }
    assert_eq!(float(&verl(&["actor_rollout_ref.rollout.temperature=0.7", "actor_rollout_ref.rollout.do_sample=True"]), "rollout.temperature"), 0.7);
    let t = verl(&["trainer.project_name=p", "trainer.experiment_name=e"]);
    assert_eq!(string(&t, "trainer.default_local_dir"), "checkpoints/p/e");
    let t = verl(&["actor_rollout_ref.actor.optim.lr_warmup_steps=-1", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1"]);
    assert_eq!((int(&t, "actor.lr_warmup_steps"), float(&t, "actor.lr_warmup_ratio")), (0, 0.1));
    let t = verl(&["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum"]);
    assert_eq!(string(&t, "critic.loss_agg_mode"), "seq-mean-token-sum");
    let t = verl(&["reward_model.enable=True", "reward_model.model.path=/m/rm", "reward_model.micro_batch_size_per_gpu=4"]);
    assert_eq!((string(&t, "reward.kind"), string(&t, "reward.params.path"), int(&t, "reward.params.batch_size")), ("reward_model".into(), "/m/rm".into(), 4));
    let t = verl(&["reward_model.enable=True"]);
    assert!(refusal(&t).contains("needs reward_model.model.path"));
    // Validation samples with val_kwargs' top-k and top-p, not the rollout's: verl's defaults
    // (no cut) unless given.
    let t = verl(&["actor_rollout_ref.rollout.top_p=0.9", "actor_rollout_ref.rollout.top_k=50"]);
    assert_eq!((int(&t, "rollout.val_top_k"), float(&t, "rollout.val_top_p")), (0, 1.0));
    let t = verl(&["actor_rollout_ref.rollout.val_kwargs.top_p=0.95", "actor_rollout_ref.rollout.val_kwargs.top_k=20", "actor_rollout_ref.rollout.val_kwargs.do_sample=True"]);
    assert_eq!((int(&t, "rollout.val_top_k"), float(&t, "rollout.val_top_p")), (20, 0.95));
    assert_eq!(t.refused(), 0);
    // As verl's agent loop, validation samples at val_kwargs.temperature whatever do_sample
    // says, and in either order of the two keys; its default, 0, is greedy.
    let (temp, sample) = ("actor_rollout_ref.rollout.val_kwargs.temperature=0.6", "actor_rollout_ref.rollout.val_kwargs.do_sample=False");
    assert_eq!(float(&verl(&[temp, sample]), "rollout.val_temperature"), 0.6);
    assert_eq!(float(&verl(&[sample, temp]), "rollout.val_temperature"), 0.6);
    assert_eq!(float(&verl(&[sample]), "rollout.val_temperature"), 0.0);
}

#[test]
fn verl_loggers_and_resume() {
    let list = |t: &Translation| -> Vec<String> {
        resolved(t)["trainer.logger"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
    };
    assert_eq!(list(&verl(&["trainer.logger=['console','wandb']"])), ["jsonl", "console", "wandb"]);
    assert_eq!(list(&verl(&["trainer.logger=[console,mlflow,tensorboard]"])), ["jsonl", "console", "mlflow", "tensorboard"]);
    assert_eq!(list(&verl(&["trainer.logger=console"])), ["jsonl", "console"]);
    assert!(refusal(&verl(&["trainer.logger=[swanlab]"])).contains("logger `swanlab` is not supported"));
    assert_eq!(verl(&["trainer.resume_mode=disable"]).resume.as_deref(), Some("none"));
    assert_eq!(verl(&["trainer.resume_mode=resume_path", "trainer.resume_from_path=/r/global_step_5"]).resume.as_deref(), Some("/r/global_step_5"));
    assert_eq!(verl(&[]).resume, None);
}

#[test]
fn every_verl_argument_gets_an_answer() {
    let t = verl(&[
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.actor.fsdp_config.param_offload=True",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "data.train_batch_sise=4",
        "reward.kind=countdown",
        "~actor_rollout_ref.actor.optim.lr",
        "+trainer.val_only=false",
    ]);
    let v: Vec<&Verdict> = t.lines.iter().map(|l| &l.verdict).collect();
    assert!(matches!(v[0], Verdict::NotApplicable(w) if w.contains("own engine")));
    assert!(matches!(v[1], Verdict::NotApplicable(w) if w.contains("no FSDP")));
    // vLLM's split of an engine: every GPU generates on its own here, same samples.
    assert!(matches!(v[2], Verdict::NotApplicable(w) if w.contains("one engine per GPU instead of one split over 2")));
    assert!(matches!(v[3], Verdict::Refused(w) if w.contains("did you mean `data.train_batch_size`")));
    assert_eq!(v[4], &Verdict::Own);
    assert_eq!(v[5], &Verdict::Reset);
    assert!(matches!(v[6], Verdict::NotApplicable(_)));
    assert_eq!(t.own, ["reward.kind=\"countdown\""]);
    assert_eq!(float(&t, "actor.lr"), 1e-6, "~ puts verl's default back");
    let report = t.report(Source::Verl);
    assert!(report.starts_with("verl command line → Reinforge: 1 mapped, 4 not applicable, 1 refused, 1 Reinforge key(s)"), "{report}");
}

#[test]
fn openrlhf_flags_parse_as_argparse_reads_them() {
    let words: Vec<String> = "--bf16 --adam_betas 0.9 0.95 --target_modules q_proj v_proj --eps_clip=0.1 --vllm_num_eng 4 trainer.device=cpu --pretrain /m"
        .split(' ')
        .map(str::to_string)
        .collect();
    let (given, own) = openrlhf::parse(&words).unwrap();
    let keys: Vec<&str> = given.iter().map(|g| g.key.as_str()).collect();
    assert_eq!(keys, ["bf16", "adam_betas", "target_modules", "eps_clip", "vllm_num_engines", "pretrain"]);
    assert_eq!(given[1].raw, "--adam_betas 0.9 0.95");
    assert_eq!(own, ["trainer.device=cpu"]);
    let err = |w: &str| openrlhf::parse(&w.split(' ').map(str::to_string).collect::<Vec<_>>()).unwrap_err().to_string();
    assert!(err("--pretrain").contains("expects a value"));
    assert!(err("--adam_betas 0.9").contains("expects two values"));
    assert!(err("--bf16=1").contains("takes no value"));
    assert!(err("pretrain").contains("expected an OpenRLHF --flag"));
}

#[test]
fn openrlhf_batch_sizes_count_sequences_and_prompts_as_openrlhf_does() {
    // 1024 prompts × 4 samples, 128 sequences per optimizer step = 32 prompt groups.
    let t = orlhf(&["--rollout_batch_size", "1024", "--n_samples_per_prompt", "4", "--train_batch_size", "128", "--micro_train_batch_size", "8"]);
    assert_eq!(int(&t, "data.train_batch_size"), 1024);
    assert_eq!((int(&t, "rollout.n"), int(&t, "actor.ppo_mini_batch_size")), (4, 32));
    assert_eq!((int(&t, "actor.ppo_micro_batch_size"), int(&t, "critic.ppo_micro_batch_size")), (8, 8));
    let t = orlhf(&["--n_samples_per_prompt", "3", "--train_batch_size", "128"]);
    assert!(refusal(&t).contains("not a whole number of prompt groups"), "{}", refusal(&t));
    // The defaults: 128 sequences of 1 sample, micro 4, 1024 prompts.
    let t = orlhf(&[]);
    assert_eq!((int(&t, "actor.ppo_mini_batch_size"), int(&t, "actor.ppo_micro_batch_size"), int(&t, "data.train_batch_size")), (128, 4, 1024));
}

#[test]
fn openrlhf_kl_goes_to_the_reward_or_the_loss() {
    let t = orlhf(&[]);
    assert!(boolean(&t, "algorithm.use_kl_in_reward") && !boolean(&t, "actor.use_kl_loss"));
    assert_eq!((float(&t, "algorithm.kl_ctrl.kl_coef"), string(&t, "algorithm.kl_penalty")), (0.01, "kl".into()));
    let t = orlhf(&["--use_kl_loss", "--kl_estimator", "k3", "--init_kl_coef", "0.001"]);
    assert!(!boolean(&t, "algorithm.use_kl_in_reward") && boolean(&t, "actor.use_kl_loss"));
    assert_eq!((float(&t, "actor.kl_loss_coef"), string(&t, "actor.kl_loss_type")), (0.001, "low_var_kl".into()));
    let t = orlhf(&["--init_kl_coef", "0"]);
    assert!(!boolean(&t, "algorithm.use_kl_in_reward") && !boolean(&t, "actor.use_kl_loss"));
    let t = orlhf(&["--kl_target", "0.05", "--kl_horizon", "500"]);
    assert_eq!((string(&t, "algorithm.kl_ctrl.type"), float(&t, "algorithm.kl_ctrl.target_kl"), float(&t, "algorithm.kl_ctrl.horizon")), ("adaptive".into(), 0.05, 500.0));
}

#[test]
fn openrlhf_estimators_schedules_and_clips() {
    for (theirs, ours) in [
        ("gae", "gae"),
        ("reinforce", "reinforce_plus_plus"),
        ("rloo", "rloo"),
        ("reinforce_baseline", "reinforce_plus_plus_baseline"),
        ("group_norm", "grpo"),
        ("dr_grpo", "grpo"),
    ] {
        let t = orlhf(&["--advantage_estimator", theirs, "--n_samples_per_prompt", "4"]);
        assert_eq!(string(&t, "algorithm.adv_estimator"), ours, "{theirs}");
    }
    assert!(!boolean(&orlhf(&["--advantage_estimator", "dr_grpo"]), "algorithm.norm_adv_by_std_in_grpo"));
    let t = orlhf(&[]);
    // cosine_with_min_lr: min_lr = 0.1 × lr; warm-up 3 % of the run for actor and critic.
    assert_eq!((string(&t, "actor.lr_scheduler"), float(&t, "actor.min_lr_ratio")), ("cosine".into(), 0.1));
    assert_eq!((float(&t, "actor.lr_warmup_ratio"), float(&t, "critic.lr_warmup_ratio")), (0.03, 0.03));
    assert!(float(&t, "actor.clip_ratio_c") > 1e6, "no dual clip unless --dual_clip");
    let t = orlhf(&["--eps_clip_low_high", "0.2", "0.28", "--dual_clip", "3"]);
    assert_eq!((float(&t, "actor.clip_ratio_low"), float(&t, "actor.clip_ratio_high"), float(&t, "actor.clip_ratio_c")), (0.2, 0.28, 3.0));
    let t = orlhf(&["--max_len", "2048", "--prompt_max_len", "512"]);
    assert_eq!(int(&t, "data.max_response_length"), 1536);
}

#[test]
fn openrlhf_placement_and_loggers() {
    let t = orlhf(&["--colocate_all_models", "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "1"]);
    assert_eq!(string(&t, "cluster.backend"), "local");
    let t = orlhf(&["--actor_num_nodes", "2", "--actor_num_gpus_per_node", "4", "--vllm_num_engines", "4", "--ref_num_gpus_per_node", "2"]);
    assert_eq!(string(&t, "cluster.backend"), "ray");
    assert_eq!((int(&t, "cluster.rollout.nnodes"), int(&t, "cluster.rollout.gpus_per_node")), (2, 2));
    assert_eq!((int(&t, "cluster.ref.nnodes"), int(&t, "cluster.ref.gpus_per_node")), (1, 2));
    // Without vLLM OpenRLHF generates in the actor's ranks: as many generation ranks.
    let t = orlhf(&["--actor_num_gpus_per_node", "4"]);
    assert_eq!((int(&t, "cluster.rollout.nnodes"), int(&t, "cluster.rollout.gpus_per_node")), (1, 4));
    let t = orlhf(&["--use_wandb", "0123456789abcdef0123456789abcdef01234567", "--wandb_project", "p", "--wandb_run_name", "r"]);
    assert_eq!(t.wandb_key.as_deref(), Some("0123456789abcdef0123456789abcdef01234567"));
    assert_eq!((string(&t, "trainer.project_name"), string(&t, "trainer.experiment_name")), ("p".into(), "r".into()));
    let logger = resolved(&t)["trainer.logger"].clone();
    assert_eq!(logger.to_string(), r#"["console", "jsonl", "wandb"]"#);
    let t = orlhf(&["--use_wandb", "True"]);
    assert_eq!(t.wandb_key, None);
    assert_eq!(orlhf(&["--load_checkpoint"]).resume.as_deref(), Some("auto"));
    assert_eq!(orlhf(&[]).resume, None, "defaults do not pick --resume");
    assert_eq!(string(&orlhf(&[]), "trainer.device"), "cuda");
}

#[test]
fn a_typo_under_a_family_is_refused_not_swallowed() {
    let t = verl(&["actor_rollout_ref.actor.optim.lrr=1e-6"]);
    assert!(refusal(&t).contains("did you mean `actor_rollout_ref.actor.optim.lr`"), "{}", refusal(&t));
    let t = verl(&["actor_rollout_ref.rollout.max_num_seq=256"]);
    assert!(refusal(&t).contains("did you mean `actor_rollout_ref.rollout.max_num_seqs`"), "{}", refusal(&t));
    // Members of the family, and open families (Search-R1's grad_offload is older than verl's list).
    let t = verl(&["actor_rollout_ref.actor.optim.optimizer=AdamW", "actor_rollout_ref.actor.fsdp_config.grad_offload=true"]);
    assert_eq!(t.refused(), 0, "{}", t.report(Source::Verl));
}

/// Search-R1's own command (`train_grpo.sh`), its search keys as it writes them.
#[test]
fn search_r1s_command_turns_on_the_search_rollouts() {
    let t = verl(&[
        "data.max_prompt_length=4096",
        "data.max_response_length=500",
        "data.max_start_length=2048",
        "data.max_obs_length=500",
        "actor_rollout_ref.actor.state_masking=true",
        "actor_rollout_ref.rollout.n_agent=5",
        "actor_rollout_ref.actor.ppo_mini_batch_size=255",
        "algorithm.no_think_rl=false",
        "max_turns=2",
        "retriever.url=\"http://127.0.0.1:8000/retrieve\"",
        "retriever.topk=3",
    ]);
    assert_eq!(t.refused(), 0, "{}", refusal(&t));
    assert!(boolean(&t, "tools.search.enable"));
    assert_eq!(string(&t, "tools.search.url"), "http://127.0.0.1:8000/retrieve");
    assert_eq!((int(&t, "tools.search.topk"), int(&t, "tools.search.max_turns")), (3, 2));
    assert_eq!((int(&t, "tools.search.max_obs_length"), int(&t, "tools.search.max_start_length")), (500, 2048));
    assert!(boolean(&t, "tools.search.state_masking"));
    assert_eq!((int(&t, "data.max_prompt_length"), int(&t, "data.max_response_length")), (4096, 500));
    assert_eq!((int(&t, "rollout.n"), int(&t, "actor.ppo_mini_batch_size")), (5, 51));
    // do_search=false keeps them off whatever else is given; true alone turns them on.
    let t = verl(&["do_search=false", "max_turns=4", "retriever.topk=5"]);
    assert!(!boolean(&t, "tools.search.enable"));
    assert!(boolean(&verl(&["do_search=true"]), "tools.search.enable"));
    // Search-R1 itself stops on no_think_rl=true.
    assert!(refusal(&verl(&["algorithm.no_think_rl=true"])).contains("algorithm.no_think_rl"));
}

#[test]
fn token_budget_micro_batches_map_from_both_tools() {
    // verl: per role, as verl names them; the log-prob passes follow the actor's budget.
    let t = verl(&["actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000", "critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=48000", "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=72000"]);
    assert_eq!(refusal(&t), "");
    assert!(boolean(&t, "actor.use_dynamic_bsz") && boolean(&t, "critic.use_dynamic_bsz"));
    assert_eq!((int(&t, "actor.ppo_max_token_len_per_gpu"), int(&t, "critic.ppo_max_token_len_per_gpu")), (24000, 48000));
    // OpenRLHF: one switch and one budget for both trained roles, 16192 tokens unless given.
    let t = orlhf(&["--use_dynamic_batch"]);
    assert!(boolean(&t, "actor.use_dynamic_bsz") && boolean(&t, "critic.use_dynamic_bsz"));
    assert_eq!((int(&t, "actor.ppo_max_token_len_per_gpu"), int(&t, "critic.ppo_max_token_len_per_gpu")), (16192, 16192));
    let t = orlhf(&["--train_max_tokens_per_gpu", "8192", "--use_dynamic_batch"]);
    assert_eq!((int(&t, "actor.ppo_max_token_len_per_gpu"), int(&t, "critic.ppo_max_token_len_per_gpu")), (8192, 8192));
    let t = orlhf(&[]);
    assert!(!resolved(&t).get("actor.use_dynamic_bsz").and_then(toml::Value::as_bool).unwrap_or(false));
}

#[test]
fn verl_nccl_timeout_bounds_the_communicator_join() {
    // verl's seconds (default 600) are ours: how long GPU ranks wait for each other.
    let t = verl(&["actor_rollout_ref.nccl_timeout=1200"]);
    assert_eq!(refusal(&t), "");
    assert_eq!(float(&t, "cluster.nccl_timeout_s"), 1200.0);
}

#[test]
fn hydra_config_flags_are_answered_like_keys() {
    let flag = |name: &str, value: &str| Given { raw: format!("--{name}={value}"), key: format!("--{name}"), op: reinforge_compat::hydra::Op::Set, value: reinforge_compat::hydra::HValue::Str(value.into()) };
    let answer = |name: &str, value: &str| translate(Source::Verl, &[flag(name, value)], &ours).lines.remove(0).verdict;
    assert!(matches!(answer("config-name", "ppo_trainer"), Verdict::NotApplicable(_)));
    assert!(matches!(answer("config-name", "ppo_megatron_trainer.yaml"), Verdict::NotApplicable(w) if w.contains("Megatron")));
    assert!(matches!(answer("config-path", "config"), Verdict::NotApplicable(w) if w.contains("config directory")));
    assert!(matches!(answer("config-name", "gsm8k_multiturn_grpo"), Verdict::NotApplicable(w) if w.contains("values apply as defaults") && w.contains("max_assistant_turns=5")));
    assert!(matches!(answer("config-name", "geo3k_multiturn_grpo"), Verdict::Refused(w) if w.contains("multimodal")));
    assert!(matches!(answer("config-name", "my_own"), Verdict::Refused(w) if w.contains("not a verl config Reinforge translates")));
    // The profiler sections are verl's though its generated key list leaves them out.
    let t = verl(&["actor_rollout_ref.actor.profiler.enable=True", "global_profiler.tool=nsys", "critic.model.enable_gradient_checkpointing=True"]);
    assert!(t.lines.iter().all(|l| matches!(&l.verdict, Verdict::NotApplicable(_))), "{}", t.report(Source::Verl));
    assert_eq!(reinforge_compat::hydra::hydra_flag("--config-name", Some("x")), Some(("config-name", Some("x".to_string()), true)));
    assert_eq!(reinforge_compat::hydra::hydra_flag("-cp=dir", None), Some(("config-path", Some("dir".to_string()), false)));
    assert_eq!(reinforge_compat::hydra::hydra_flag("--config-path", Some("--dry-run")), Some(("config-path", None, false)));
    assert_eq!(reinforge_compat::hydra::hydra_flag("--config-name", None), Some(("config-name", None, false)));
    assert_eq!(reinforge_compat::hydra::hydra_flag("--config-names=x", None), None);
}

/// OpenRLHF's README command as v0.10.1 spells it, and as v0.10.2+ does (dotted flags, same
/// values: `--pretrain` is `--actor.model_name_or_path`, `--colocate_all_models` is
/// `--train.colocate_all`, ...).
const OPENRLHF_V0101: &str = "--ref_num_nodes 1 --ref_num_gpus_per_node 8 --reward_num_nodes 1 --reward_num_gpus_per_node 8 \
    --critic_num_nodes 1 --critic_num_gpus_per_node 8 --actor_num_nodes 1 --actor_num_gpus_per_node 8 --vllm_num_engines 4 \
    --vllm_tensor_parallel_size 2 --colocate_all_models --vllm_gpu_memory_utilization 0.5 --pretrain /m/sft --reward_pretrain /m/rm \
    --save_path /s --ckpt_path /c --save_hf_ckpt --micro_train_batch_size 8 --train_batch_size 128 --micro_rollout_batch_size 16 \
    --rollout_batch_size 1024 --n_samples_per_prompt 1 --max_epochs 1 --max_len 2048 --max_new_tokens 1024 --max_samples 100000 \
    --zero_stage 3 --param_dtype bf16 --actor_learning_rate 5e-7 --critic_learning_rate 9e-6 --init_kl_coef 0.01 \
    --prompt_data /d/p.parquet --input_key context_messages --apply_chat_template --normalize_reward --gradient_checkpointing \
    --packing_samples --vllm_sync_backend nccl --enforce_eager --vllm_enable_sleep --deepspeed_enable_sleep --use_wandb True \
    --max_norm 1.0 --l2 0.01 --adam_betas 0.9 0.95 --lr_scheduler cosine_with_min_lr --lr_warmup_ratio 0.05";
const OPENRLHF_V011: &str = "--ref.num_nodes 1 --ref.num_gpus_per_node 8 --reward.num_nodes 1 --reward.num_gpus_per_node 8 \
    --critic.num_nodes 1 --critic.num_gpus_per_node 8 --actor.num_nodes 1 --actor.num_gpus_per_node 8 --vllm.num_engines 4 \
    --vllm.tensor_parallel_size 2 --train.colocate_all --vllm.gpu_memory_utilization 0.5 --actor.model_name_or_path /m/sft \
    --reward.model_name_or_path /m/rm --ckpt.output_dir /s --ckpt.path /c --ckpt.save_hf --train.micro_batch_size 8 \
    --train.batch_size 128 --rollout.micro_batch_size 16 --rollout.batch_size 1024 --rollout.n_samples_per_prompt 1 \
    --train.max_epochs 1 --data.max_len 2048 --rollout.max_new_tokens 1024 --data.max_samples 100000 --ds.zero_stage 3 \
    --ds.param_dtype bf16 --actor.adam.lr 5e-7 --critic.adam.lr 9e-6 --algo.kl.init_coef 0.01 --data.prompt_dataset /d/p.parquet \
    --data.input_key context_messages --data.apply_chat_template --reward.normalize_enable --actor.gradient_checkpointing_enable \
    --ds.packing_samples --vllm.sync_backend nccl --vllm.enforce_eager --vllm.enable_sleep --ds.enable_sleep --logger.wandb.key True \
    --actor.max_norm 1.0 --critic.max_norm 1.0 --actor.adam.weight_decay 0.01 --critic.adam.weight_decay 0.01 \
    --actor.adam.betas 0.9 0.95 --critic.adam.betas 0.9 0.95 --actor.lr_scheduler cosine_with_min_lr --critic.lr_scheduler cosine_with_min_lr \
    --actor.lr_warmup_ratio 0.05 --critic.lr_warmup_ratio 0.05";

#[test]
fn an_openrlhf_command_resolves_the_same_in_v0_10_1_and_in_v0_11_flag_names() {
    let split = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let translated = |s: &str| {
        let (given, own) = openrlhf::parse(&split(s)).unwrap();
        let mut t = translate(Source::OpenRlhf, &given, &ours);
        t.own = own;
        t
    };
    let (old, new) = (translated(OPENRLHF_V0101), translated(OPENRLHF_V011));
    assert!(old.lines.iter().all(|l| !matches!(l.verdict, Verdict::Refused(_))), "{}", old.report(Source::OpenRlhf));
    assert!(new.lines.iter().all(|l| !matches!(l.verdict, Verdict::Refused(_))), "{}", new.report(Source::OpenRlhf));
    assert_eq!(resolved(&new), resolved(&old), "same config from either spelling");
    assert_eq!(new.wandb_key, old.wandb_key);
    // vLLM's 4 engines × 2 GPUs: 8 generation ranks of one GPU each.
    assert_eq!((int(&new, "cluster.rollout.nnodes"), int(&new, "cluster.rollout.gpus_per_node")), (1, 8));
    // The report shows the flags as typed.
    let report = new.report(Source::OpenRlhf);
    assert!(report.contains("--actor.model_name_or_path /m/sft") && report.contains("--train.colocate_all"), "{report}");
    // Prefixes work as argparse's do, within the dotted names.
    assert_eq!(openrlhf::canonical("actor.model_name"), "pretrain");
    // Per-model flags that Reinforge shares between the models are refused when they differ,
    // also when only one is typed (the other keeps OpenRLHF's default), unless no critic trains.
    let t = orlhf(&["--actor.adam.betas", "0.9", "0.95", "--critic.adam.betas", "0.9", "0.999"]);
    assert!(refusal(&t).contains("Adam betas"), "{}", refusal(&t));
    let t = orlhf(&["--actor.adam.betas", "0.9", "0.999"]);
    assert!(refusal(&t).contains("the actor's Adam betas"), "{}", refusal(&t));
    let t = orlhf(&["--actor.adam.betas", "0.9", "0.999", "--algo.advantage.estimator", "group_norm"]);
    assert_eq!(resolved(&t)["actor.betas"], toml::Value::Array(vec![toml::Value::Float(0.9), toml::Value::Float(0.999)]));
    // argparse's prefixes reach the flags of a family row too.
    assert_eq!(openrlhf::canonical("actor.muon.no"), "actor.muon.no_nesterov");
    let t = orlhf(&["--actor.optim", "muon"]);
    assert!(refusal(&t).contains("optimizer `muon` is not supported"), "{}", refusal(&t));
    let t = orlhf(&["--actor.min_lr_ratio", "0.2"]);
    assert_eq!(float(&t, "actor.min_lr_ratio"), 0.2, "the cosine_with_min_lr floor");
    // A misspelt dotted flag is answered with the nearest dotted one.
    let t = orlhf(&["--train.batch_sise", "64"]);
    assert!(refusal(&t).contains("did you mean `--train.batch_size`"), "{}", refusal(&t));
    // A misspelt switch before another flag (v0.10.1's own DAPO script has this one) is an
    // unknown flag, not a missing value.
    let t = orlhf(&["--vllm_enable_is_correction", "--bf16"]);
    assert!(refusal(&t).contains("did you mean `--enable_vllm_is_correction`"), "{}", refusal(&t));
}

#[test]
fn verl_policy_losses_map_with_their_settings() {
    // core_algos.py registers these names; each is ours under the same name.
    for mode in reinforge_compat::verl::LOSS_MODES {
        let t = verl(&[&format!("actor_rollout_ref.actor.policy_loss.loss_mode={mode}")]);
        assert_eq!(refusal(&t), "", "{mode}");
        assert_eq!(string(&t, "actor.policy_loss.loss_mode"), *mode);
    }
    let t = verl(&[
        "actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov",
        "actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.002",
        "actor_rollout_ref.actor.policy_loss.ppo_kl_coef=1",
        "actor_rollout_ref.actor.policy_loss.clip_cov_lb=2",
        "actor_rollout_ref.actor.policy_loss.dro_beta=0.3",
        "actor_rollout_ref.actor.tau_neg=2.0",
    ]);
    assert_eq!(refusal(&t), "");
    assert_eq!(float(&t, "actor.policy_loss.kl_cov_ratio"), 0.002);
    assert_eq!(float(&t, "actor.policy_loss.ppo_kl_coef"), 1.0);
    assert_eq!(float(&t, "actor.policy_loss.clip_cov_lb"), 2.0);
    assert_eq!(float(&t, "actor.policy_loss.dro_beta"), 0.3);
    assert_eq!(float(&t, "actor.tau_neg"), 2.0);
    let t = verl(&["actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"]);
    assert!(refusal(&t).contains("use `vanilla`"), "{}", refusal(&t));
    let t = verl(&["actor_rollout_ref.actor.policy_loss.loss_mode=gspoo"]);
    assert!(refusal(&t).contains("geo_mean"), "{}", refusal(&t));
}

#[test]
fn verl_clip_bounds_stay_at_their_own_default_when_only_clip_ratio_is_given() {
    // ActorConfig: clip_ratio_low = clip_ratio_high = 0.2, and compute_policy_loss_vanilla
    // falls back to clip_ratio only when they are None: clip_ratio alone changes nothing.
    let t = verl(&["actor_rollout_ref.actor.clip_ratio=0.1"]);
    assert_eq!((float(&t, "actor.clip_ratio_low"), float(&t, "actor.clip_ratio_high")), (0.2, 0.2));
    let t = verl(&["actor_rollout_ref.actor.clip_ratio_high=0.28"]);
    assert_eq!((float(&t, "actor.clip_ratio_low"), float(&t, "actor.clip_ratio_high")), (0.2, 0.28));
}

#[test]
fn openrlhf_gspo_is_a_sequence_mean_gspo() {
    // loss.py: policy_loss_type == "gspo" sets token_level_loss = False (per-sample means).
    let t = orlhf(&["--policy_loss_type", "gspo", "--advantage_estimator", "group_norm"]);
    assert_eq!(refusal(&t), "");
    assert_eq!(string(&t, "actor.policy_loss.loss_mode"), "gspo");
    assert_eq!(string(&t, "actor.loss_agg_mode"), "seq-mean-token-mean");
    let t = orlhf(&["--actor.policy_loss_type", "gspo", "--advantage_estimator", "rloo", "--dual_clip", "3"]);
    assert!(refusal(&t).contains("--dual_clip"), "{}", refusal(&t));
    // GAE (OpenRLHF's default estimator) gives per-token advantages, where OpenRLHF's GSPO
    // gradient and verl's part.
    let t = orlhf(&["--policy_loss_type", "gspo"]);
    assert!(refusal(&t).contains("sequence-level --advantage_estimator"), "{}", refusal(&t));
}

#[test]
fn verl_dapo_reward_manager_brings_its_overlong_penalty() {
    // examples/gspo_trainer/test_gspo_3b_math.sh's reward settings.
    let t = verl(&[
        "reward_model.reward_manager=dapo",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4096",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=false",
        "+reward_model.reward_kwargs.max_resp_len=8192",
    ]);
    assert_eq!(refusal(&t), "");
    assert!(boolean(&t, "reward.overlong_buffer.enable"));
    assert_eq!(int(&t, "reward.overlong_buffer.len"), 4096);
    assert_eq!(float(&t, "reward.overlong_buffer.penalty_factor"), 1.0);
    assert_eq!(int(&t, "reward.overlong_buffer.max_resp_len"), 8192);
    // verl 0.9.1's reward loop reads them from reward.reward_kwargs.
    let t = verl(&["reward.reward_manager.name=dapo", "+reward.reward_kwargs.overlong_buffer_cfg.enable=true", "+reward.reward_kwargs.overlong_buffer_cfg.len=64"]);
    assert_eq!(refusal(&t), "");
    assert_eq!(int(&t, "reward.overlong_buffer.len"), 64);
    // The naive manager takes no overlong_buffer_cfg (its constructor would fail on it).
    let t = verl(&["+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true"]);
    assert!(refusal(&t).contains("reward_model.reward_manager=dapo"), "{}", refusal(&t));
    let t = verl(&["reward_model.reward_manager=prime"]);
    assert!(refusal(&t).contains("`naive` or `dapo`"), "{}", refusal(&t));
}

#[test]
fn verl_dynamic_sampling_converts_with_its_generation_batch() {
    // tests/special_e2e/run_dapo.sh's settings.
    let t = verl(&[
        "data.train_batch_size=32",
        "data.gen_batch_size=96",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=acc",
        "algorithm.filter_groups.max_num_gen_batches=10",
    ]);
    assert_eq!(refusal(&t), "");
    assert!(boolean(&t, "algorithm.filter_groups.enable"));
    assert_eq!(string(&t, "algorithm.filter_groups.metric"), "acc");
    assert_eq!(int(&t, "algorithm.filter_groups.max_num_gen_batches"), 10);
    assert_eq!(int(&t, "data.gen_batch_size"), 96);
    // Without the filter, verl's loader would make the step gen_batch_size prompts.
    let t = verl(&["data.train_batch_size=32", "data.gen_batch_size=96"]);
    assert!(refusal(&t).contains("data.train_batch_size=96"), "{}", refusal(&t));
    let t = verl(&["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=pass_rate"]);
    assert!(refusal(&t).contains("seq_final_reward"), "{}", refusal(&t));
    // verl: `gen_batch_size or train_batch_size`, and any cap ≤ 0 is none; a metric without
    // the filter does nothing.
    let t = verl(&["algorithm.filter_groups.enable=true", "data.gen_batch_size=0", "algorithm.filter_groups.max_num_gen_batches=-1"]);
    assert_eq!(refusal(&t), "");
    assert_eq!(int(&t, "algorithm.filter_groups.max_num_gen_batches"), 0);
    let t = verl(&["algorithm.filter_groups.metric=pass_rate"]);
    assert_eq!(refusal(&t), "");
}

#[test]
fn sequence_parallelism_is_a_layout_not_a_refusal() {
    let t = verl(&["actor_rollout_ref.actor.ulysses_sequence_parallel_size=4", "actor_rollout_ref.ref.ulysses_sequence_parallel_size=4"]);
    assert_eq!(refusal(&t), "");
    assert!(t.lines.iter().all(|l| matches!(&l.verdict, Verdict::NotApplicable(why) if why.contains("whole sequences"))));
    let t = verl(&["critic.ulysses_sequence_parallel_size=0"]);
    assert!(refusal(&t).contains("≥ 1"), "{}", refusal(&t));
    let t = orlhf(&["--ring_attn_size", "2"]);
    assert_eq!(refusal(&t), "");
}

#[test]
fn openrlhf_dynamic_filtering_keeps_prompts_by_their_mean_reward() {
    // samples_generator.py: a prompt is kept when min_r < mean reward < max_r, (0, 1) unless set.
    let t = orlhf(&["--dynamic_filtering"]);
    assert_eq!(refusal(&t), "");
    assert!(boolean(&t, "algorithm.filter_groups.enable"));
    assert_eq!(string(&t, "algorithm.filter_groups.metric"), "score");
    let range = resolved(&t)["algorithm.filter_groups.reward_range"].clone();
    assert_eq!(range, toml::Value::Array(vec![toml::Value::Float(0.0), toml::Value::Float(1.0)]));
    let t = orlhf(&["--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0.1", "0.9"]);
    assert_eq!(resolved(&t)["algorithm.filter_groups.reward_range"], toml::Value::Array(vec![toml::Value::Float(0.1), toml::Value::Float(0.9)]));
    let t = orlhf(&["--dynamic_filtering", "--dynamic_filtering_reward_range", "1", "0"]);
    assert!(refusal(&t).contains("low end"), "{}", refusal(&t));
}

#[test]
fn search_r1_format_scores_route_its_qa_sources_to_qa_em_with_them() {
    // Search-R1's scripts/nq_hotpotqa/v0.3/train_grpo_format.sh's reward settings.
    let t = verl(&["reward_model.structure_format_score=0.2", "reward_model.final_format_score=0.1", "reward_model.retrieval_score=0"]);
    assert_eq!(refusal(&t), "");
    let r = resolved(&t);
    let routes = r.get("reward.params.routes").and_then(toml::Value::as_array).expect("routes set");
    assert_eq!(routes.len(), 1);
    // Build the reward the converted config describes, as the trainer does, and score.
    let kind = r.get("reward.kind").and_then(toml::Value::as_str).unwrap_or("router");
    let spec = reinforge_reward::RewardSpec::with_params(kind, serde_json::json!({ "routes": serde_json::to_value(routes).unwrap() }));
    let reward = reinforge_reward::build(&spec).unwrap();
    let score = |ds: &str, resp: &str| reward.score(&reinforge_reward::RewardInput::new(ds, resp, serde_json::json!({"target": ["Paris"]}))).unwrap().score;
    let valid_wrong = "<think>a</think><search>q</search><information>Lyon.</information><think>b</think><answer>Lyon</answer>";
    assert_eq!(score("nq", valid_wrong), 0.2);
    assert_eq!(score("strategyqa", "<answer>Lyon</answer>"), 0.1);
    assert_eq!(score("hotpotqa", "<answer>Paris</answer>"), 0.8);
    assert_eq!(score("musique", "<think>a</think><answer>Paris</answer>"), 1.0);
    // main_ppo_format validates with the format scores at 0: plain EM, over the same sources
    // (web_questions and strategyqa among them, which the built-in routes lack).
    assert_eq!(r.get("reward.val.kind").and_then(toml::Value::as_str), Some("router"));
    let val_routes = r.get("reward.val.params.routes").and_then(toml::Value::as_array).expect("validation routes");
    let val = reinforge_reward::build(&reinforge_reward::RewardSpec::with_params("router", serde_json::json!({ "routes": serde_json::to_value(val_routes).unwrap() }))).unwrap();
    let em = |ds: &str, resp: &str| val.score(&reinforge_reward::RewardInput::new(ds, resp, serde_json::json!({"target": ["Paris"]}))).unwrap().score;
    assert_eq!((em("web_questions", valid_wrong), em("strategyqa", "<answer>Paris</answer>"), em("nq", "<answer>Lyon</answer>")), (0.0, 1.0, 0.0));
    // One key alone, and all three zero (Search-R1's main_ppo defaults): plain qa_em.
    let t = verl(&["reward_model.retrieval_score=0.1"]);
    assert_eq!(refusal(&t), "");
    assert!(resolved(&t).contains_key("reward.params.routes"));
    let t = verl(&["reward_model.structure_format_score=0", "reward_model.final_format_score=0.0"]);
    assert_eq!(refusal(&t), "");
    assert!(!resolved(&t).contains_key("reward.params.routes"));
    let t = verl(&["reward_model.structure_format_score=high"]);
    assert!(refusal(&t).contains("expected a number"), "{}", refusal(&t));
}

#[test]
fn verl_val_only_validates_once_as_verl_does() {
    // Search-R1's scripts/nq_hotpotqa/evaluate.sh.
    let t = verl(&["+trainer.val_only=true", "+trainer.val_before_train=true"]);
    assert_eq!(refusal(&t), "");
    assert!(boolean(&t, "trainer.val_only"));
    // verl's default val_before_train is True.
    assert!(boolean(&verl(&["+trainer.val_only=true"]), "trainer.val_only"));
    // verl reads val_only inside the validation before training: without it, it trains.
    let t = verl(&["+trainer.val_only=true", "trainer.val_before_train=false"]);
    assert_eq!(refusal(&t), "");
    assert!(!resolved(&t).get("trainer.val_only").and_then(toml::Value::as_bool).unwrap_or(false));
}

#[test]
fn openrlhf_length_penalties_convert() {
    // examples/scripts/train_prorlv2_math_hybrid_engine.sh's reward settings (v0.11 names).
    let t = orlhf(&["--rollout.max_new_tokens", "8192", "--reward.overlong_buffer_len", "1024", "--reward.overlong_penalty_factor", "0.5", "--reward.stop_properly_penalty_coef", "0.0"]);
    assert_eq!(refusal(&t), "");
    assert!(boolean(&t, "reward.overlong_buffer.enable"));
    assert_eq!(int(&t, "reward.overlong_buffer.len"), 1024);
    assert_eq!(float(&t, "reward.overlong_buffer.penalty_factor"), 0.5);
    assert!(!resolved(&t).contains_key("reward.overlong_buffer.max_resp_len"), "the ramp ends at data.max_response_length = --max_new_tokens");
    assert_eq!(int(&t, "data.max_response_length"), 8192);
    assert_eq!(float(&t, "reward.stop_properly_penalty_coef"), 0.0);
    // OpenRLHF's default factor is 1; without --max_new_tokens its ramp ends at --max_len.
    let t = orlhf(&["--data.max_len", "4096", "--reward.overlong_buffer_len", "512"]);
    assert_eq!(refusal(&t), "");
    assert_eq!(float(&t, "reward.overlong_buffer.penalty_factor"), 1.0);
    assert_eq!(int(&t, "reward.overlong_buffer.max_resp_len"), 4096);
    // The factor alone changes nothing, as in OpenRLHF.
    let t = orlhf(&["--overlong_penalty_factor", "2"]);
    assert_eq!(refusal(&t), "");
    assert!(!resolved(&t).contains_key("reward.overlong_buffer.enable"));
    let t = orlhf(&["--overlong_buffer_len", "12.5"]);
    assert!(refusal(&t).contains("whole number"), "{}", refusal(&t));
}

#[test]
fn verl_chat_template_kwargs_pass_to_the_template() {
    // examples/grpo_trainer/run_gptoss_20b.sh: one by one.
    let t = verl(&["+data.apply_chat_template_kwargs.reasoning_effort=medium", "+data.apply_chat_template_kwargs.enable_thinking=False"]);
    assert_eq!(refusal(&t), "");
    let kw = resolved(&t).get("data.apply_chat_template_kwargs").cloned().expect("kwargs set");
    assert_eq!(kw.get("reasoning_effort").and_then(toml::Value::as_str), Some("medium"));
    assert_eq!(kw.get("enable_thinking").and_then(toml::Value::as_bool), Some(false));
    // Whole, as a dict.
    let t = verl(&["data.apply_chat_template_kwargs={enable_thinking:False}"]);
    assert_eq!(refusal(&t), "");
    assert_eq!(resolved(&t).get("data.apply_chat_template_kwargs").and_then(|k| k.get("enable_thinking")).and_then(toml::Value::as_bool), Some(false));
    assert_eq!(refusal(&verl(&["data.apply_chat_template_kwargs={}"])), "");
    let t = verl(&["+data.apply_chat_template_kwargs.a.b=1"]);
    assert!(refusal(&t).contains("one name"), "{}", refusal(&t));
}

#[test]
fn python_reward_functions_convert_from_verl_and_openrlhf() {
    // verl: the function, its name and its reward_kwargs.
    let t = verl(&["custom_reward_function.path=rewards/my_reward.py", "custom_reward_function.name=score_fn", "+custom_reward_function.reward_kwargs.scale=2.0", "+custom_reward_function.reward_kwargs.mode=strict"]);
    assert_eq!(refusal(&t), "");
    assert_eq!((string(&t, "reward.kind"), string(&t, "reward.params.path"), string(&t, "reward.params.function")), ("python".into(), "rewards/my_reward.py".into(), "score_fn".into()));
    let kw = resolved(&t).get("reward.params.kwargs").cloned().expect("kwargs");
    assert_eq!((kw.get("scale").and_then(toml::Value::as_float), kw.get("mode").and_then(toml::Value::as_str)), (Some(2.0), Some("strict")));
    // verl 0.9.1's place for it, and its default name.
    let t = verl(&["reward.custom_reward_function.path=pkg://my_pkg.rewards"]);
    assert_eq!(refusal(&t), "");
    assert_eq!((string(&t, "reward.params.path"), string(&t, "reward.params.function")), ("pkg://my_pkg.rewards".into(), "compute_score".into()));
    assert!(refusal(&verl(&["custom_reward_function.path=r.py", "reward_model.enable=True", "reward_model.model.path=/m"])).contains("drop one"));

    // OpenRLHF: a reward_func file, or a reward server; --label_key is the ground truth.
    let t = orlhf(&["--reward.remote_url", "/openrlhf/examples/python/reward_func.py", "--data.label_key", "answer"]);
    assert_eq!(refusal(&t), "");
    assert_eq!((string(&t, "reward.kind"), string(&t, "reward.params.style"), string(&t, "data.label_key")), ("python".into(), "openrlhf".into(), "answer".into()));
    assert!(!resolved(&t).contains_key("data.require_ground_truth"), "labels are required when a label column is named");
    let t = orlhf(&["--remote_rm_url", "http://10.0.0.5:5000/get_reward"]);
    assert_eq!(refusal(&t), "");
    assert_eq!((string(&t, "reward.kind"), string(&t, "reward.params.protocol"), string(&t, "reward.params.url")), ("remote".into(), "openrlhf".into(), "http://10.0.0.5:5000/get_reward".into()));
    assert!(!boolean(&t, "data.require_ground_truth"));
    assert!(refusal(&orlhf(&["--remote_rm_url", "http://a:1/r,http://b:1/r"])).contains("load balancer"));
    assert!(refusal(&orlhf(&["--remote_rm_url", "reward.txt"])).contains("neither"));
}

#[test]
fn openrlhf_local_dataset_directories_give_their_splits_files() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let touch = |rel: &str| {
        let p = d.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "").unwrap();
    };
    // A Hub dataset downloaded with --local-dir: data files named by split, metadata beside.
    for f in ["hub/data/train-00000-of-00002.parquet", "hub/data/train-00001-of-00002.parquet", "hub/data/test-00000-of-00001.parquet", "hub/README.md", "hub/.cache/huggingface/x.json"] {
        touch(f);
    }
    let files = |t: &Translation, k: &str| resolved(t).get(k).and_then(toml::Value::as_array).unwrap().iter().map(|v| v.as_str().unwrap().strip_prefix(&format!("{}/", d.display())).unwrap().to_string()).collect::<Vec<_>>();
    let hub = d.join("hub").display().to_string();
    let t = orlhf(&["--prompt_data", &hub, "--eval_dataset", &hub, "--eval_split", "test"]);
    assert_eq!(refusal(&t), "");
    assert_eq!(files(&t, "data.train_files"), ["hub/data/train-00000-of-00002.parquet", "hub/data/train-00001-of-00002.parquet"]);
    assert_eq!(files(&t, "data.val_files"), ["hub/data/test-00000-of-00001.parquet"]);
    // No split in any name: every file is train; name@data_dir reads the sub-directory.
    touch("plain/a.jsonl");
    touch("plain/b.jsonl");
    touch("multi/math/prompts.jsonl");
    touch("multi/code/prompts.jsonl");
    let t = orlhf(&["--prompt_data", &format!("{},{}@math", d.join("plain").display(), d.join("multi").display())]);
    assert_eq!(refusal(&t), "");
    assert_eq!(files(&t, "data.train_files"), ["plain/a.jsonl", "plain/b.jsonl", "multi/math/prompts.jsonl"]);
    // What cannot be read says why.
    assert!(refusal(&orlhf(&["--prompt_data", &d.join("plain").display().to_string(), "--prompt_split", "test"])).contains("no `test` files"));
    touch("mixed/train.parquet");
    touch("mixed/train.jsonl");
    assert!(refusal(&orlhf(&["--prompt_data", &d.join("mixed").display().to_string()])).contains("several formats"));
    // save_to_disk's layout: Arrow data beside JSON metadata that must not be read as data.
    for f in ["arrow/dataset_dict.json", "arrow/train/dataset_info.json", "arrow/train/state.json", "arrow/train/data-00000-of-00001.arrow"] {
        touch(f);
    }
    assert!(refusal(&orlhf(&["--prompt_data", &d.join("arrow").display().to_string()])).contains("save_to_disk"));
    touch("empty/README.md");
    assert!(refusal(&orlhf(&["--prompt_data", &d.join("empty").display().to_string()])).contains("no .parquet/.jsonl/.json"));
    assert!(refusal(&orlhf(&["--prompt_data", "OpenRLHF/prompt-collection-v0.1"])).contains("hf download --repo-type dataset OpenRLHF/prompt-collection-v0.1"));

    // A Hub dataset id the resolver finds (the CLI looks in the Hugging Face cache) reads as
    // its snapshot directory, `@data_dir` included; one it cannot read says why.
    let words: Vec<String> = ["--prompt_data", "OpenRLHF/prompt-collection-v0.1", "--eval_dataset", "org/evals@math", "--eval_split", "test"].map(String::from).to_vec();
    let (given, _) = openrlhf::parse(&words).unwrap();
    touch("snap/data/train-00000-of-00001.parquet");
    touch("snap/dataset_infos.json");
    touch("evals/math/test.jsonl");
    touch("evals/code/test.jsonl");
    let hub_dir = |id: &str| -> Result<Option<std::path::PathBuf>, String> {
        Ok(match id {
            "OpenRLHF/prompt-collection-v0.1" => Some(d.join("snap")),
            "org/evals" => Some(d.join("evals")),
            _ => None,
        })
    };
    let t = reinforge_compat::translate_with(Source::OpenRlhf, &given, &ours, &hub_dir);
    assert_eq!(refusal(&t), "");
    assert_eq!(files(&t, "data.train_files"), ["snap/data/train-00000-of-00001.parquet"]);
    assert_eq!(files(&t, "data.val_files"), ["evals/math/test.jsonl"]);
    let t = reinforge_compat::translate_with(Source::OpenRlhf, &given, &ours, &|_| Err("two snapshots".into()));
    assert!(refusal(&t).contains("OpenRLHF/prompt-collection-v0.1`: two snapshots"), "{}", refusal(&t));
}

#[test]
fn verl_tool_agent_keys_map_to_tools_calls() {
    let t = verl(&[
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=cfg/tools.yaml",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=512",
        "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=left",
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path=cfg/interaction.yaml",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=disable",
    ]);
    assert_eq!(refusal(&t), "");
    let given: std::collections::BTreeMap<&str, String> = t.given.iter().map(|(k, v)| (k.as_str(), v.to_string())).collect();
    assert_eq!(given["tools.calls.enable"], "true");
    assert_eq!(given["tools.calls.tool_config_path"], "\"cfg/tools.yaml\"");
    assert_eq!(given["tools.calls.max_assistant_turns"], "3");
    assert_eq!(given["tools.calls.max_parallel_calls"], "2");
    assert_eq!(given["tools.calls.max_tool_response_length"], "512");
    assert_eq!(given["tools.calls.tool_response_truncate_side"], "\"left\"");
    assert_eq!(given["tools.calls.interaction_config_path"], "\"cfg/interaction.yaml\"");
    assert_eq!(given["tools.calls.format"], "\"hermes\"");
    // verl's own switch for the loop, and the dataset's tool key beside it.
    let t = verl(&["actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent", "data.tool_config_path=cfg/tools.yaml"]);
    assert_eq!(refusal(&t), "");
    assert!(t.given.iter().any(|(k, v)| k == "tools.calls.enable" && v.as_bool() == Some(true)));
    assert!(refusal(&verl(&["data.tool_config_path=cfg/tools.yaml"])).contains("single-turn prompts"));
    assert!(refusal(&verl(&["actor_rollout_ref.rollout.agent.default_agent_loop=my_agent"])).contains("single_turn_agent and tool_agent"));
    // verl has no `qwen` parser (its search example's config names one): refused with the fix.
    let t = verl(&["actor_rollout_ref.rollout.multi_turn.format=qwen"]);
    assert!(refusal(&t).contains("multi_turn.format=hermes"), "{}", refusal(&t));
    // The config file's values are defaults: a typed key wins, whichever comes first.
    let flag = Given { raw: "--config-name=search_multiturn_grpo".into(), key: "--config-name".into(), op: reinforge_compat::hydra::Op::Set, value: reinforge_compat::hydra::HValue::Str("search_multiturn_grpo".into()) };
    let typed = verl(&["actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4"]).lines.remove(0);
    let typed = Given { raw: typed.arg.clone(), key: "actor_rollout_ref.rollout.multi_turn.max_assistant_turns".into(), op: reinforge_compat::hydra::Op::Set, value: reinforge_compat::hydra::HValue::Int(4) };
    let alone = translate(Source::Verl, std::slice::from_ref(&flag), &ours);
    assert!(alone.defaults.iter().any(|(k, v)| k == "tools.calls.max_assistant_turns" && v.as_integer() == Some(2)), "{:?}", alone.defaults);
    assert!(alone.defaults.iter().any(|(k, v)| k == "data.max_response_length" && v.as_integer() == Some(1024)));
    let t = translate(Source::Verl, &[typed, flag], &ours);
    assert_eq!(refusal(&t), "");
    assert!(t.given.iter().any(|(k, v)| k == "tools.calls.max_assistant_turns" && v.as_integer() == Some(4)), "{:?}", t.given);
    // The config's `format: qwen` (no verl parser has that name) is a default, so it is not
    // refused: the calls are read as hermes, which is what Qwen writes.
    assert!(!t.defaults.iter().any(|(k, _)| k == "tools.calls.format"));
}

#[test]
fn lora_settings_map_to_the_actors_and_what_cannot_run_is_refused() {
    // verl's names (its defaults: alpha 16, all-linear).
    let t = verl(&["actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.model.lora_alpha=64", "actor_rollout_ref.model.target_modules=[q_proj,v_proj]"]);
    assert_eq!(int(&t, "actor.lora_rank"), 32);
    assert_eq!(float(&t, "actor.lora_alpha"), 64.0);
    assert_eq!(resolved(&t)["actor.target_modules"], toml::Value::Array(vec!["q_proj".into(), "v_proj".into()]));
    let t = verl(&["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_adapter_path=/ckpt/lora_adapter"]);
    // verl's defaults (alpha 16, all-linear) are ours: nothing to write.
    assert!(!resolved(&t).contains_key("actor.lora_alpha"));
    assert_eq!(string(&t, "actor.lora_adapter_path"), "/ckpt/lora_adapter");
    assert!(refusal(&verl(&["critic.model.lora_rank=8"])).contains("LoRA on the critic"));
    assert!(refusal(&verl(&["actor_rollout_ref.model.exclude_modules=[o_proj]"])).contains("target_modules"));
    // OpenRLHF's, in both spellings; its critic (gae) would get the same LoRA: refused.
    for args in [
        ["--advantage_estimator", "group_norm", "--lora_rank", "16", "--lora_alpha", "32", "--target_modules", "q_proj", "k_proj"],
        ["--advantage_estimator", "group_norm", "--ds.lora.rank", "16", "--ds.lora.alpha", "32", "--ds.lora.target_modules", "q_proj", "k_proj"],
    ] {
        let t = orlhf(&args);
        assert_eq!((int(&t, "actor.lora_rank"), float(&t, "actor.lora_alpha")), (16, 32.0), "{args:?}");
        assert_eq!(resolved(&t)["actor.target_modules"], toml::Value::Array(vec!["q_proj".into(), "k_proj".into()]), "{args:?}");
    }
    assert!(refusal(&orlhf(&["--advantage_estimator", "rloo", "--lora_rank", "16", "--lora_dropout", "0.05"])).contains("lora_dropout"));
    assert!(refusal(&orlhf(&["--lora_rank", "16"])).contains("LoRA on the critic"));
}
