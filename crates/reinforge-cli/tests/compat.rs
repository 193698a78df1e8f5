//! Coming from verl and OpenRLHF: their command lines as their guides print them resolve to
//! the config their users expect (each value asserted), scaled-down copies train two steps on
//! the CPU, and a refused argument stops the run before anything is written.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use reinforge_data::PromptRecord;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_reinforge");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn run(args: &[String], dir: &Path) -> Output {
    // An empty Hugging Face cache: what a Hub id resolves to must not depend on this machine's.
    Command::new(BIN).current_dir(dir).args(args).env_remove("WANDB_API_KEY").env("HF_HUB_CACHE", dir.join("no-hf-cache")).output().unwrap()
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

/// GSM8K rows in verl's schema (as verl's examples/data_preprocess/gsm8k.py writes them), as
/// parquet files `train.parquet` and `test.parquet` in `dir`.
fn gsm8k(dir: &Path) {
    // Short enough for the tiny test model's 128-token context (one token per character).
    let questions = [
        ("Tom has 3 apples, buys 4. How many?", "7"),
        ("2 boxes of 6 pens. How many pens?", "12"),
        ("10 coins, 3 spent. How many left?", "7"),
        ("5 birds, 4 more come. How many?", "9"),
        ("2 pages a day for 4 days. Pages?", "8"),
        ("9 balls, 5 red. How many not red?", "4"),
        ("8 cards and 8 more. How many?", "16"),
        ("3 kids with 3 toys each. Toys?", "9"),
    ];
    let rows: Vec<PromptRecord> = questions
        .iter()
        .enumerate()
        .map(|(i, (q, a))| PromptRecord {
            row: i,
            data_source: "openai/gsm8k".into(),
            messages: vec![json!({"role": "user", "content": format!("{q} Answer after \"####\".")})],
            ground_truth: json!(a),
            extra_info: json!({"split": "train", "index": i}),
            ability: Some("math".into()),
        })
        .collect();
    reinforge_data::write_parquet(dir.join("train.parquet"), &rows).unwrap();
    reinforge_data::write_parquet(dir.join("test.parquet"), &rows[..4]).unwrap();
}

/// The quickstart's tiny architecture with random weights, as an HF directory.
fn tiny_model(dir: &Path) -> PathBuf {
    use reinforge_engine::{CausalLm, ModelConfig};
    let src = repo().join("examples/tiny-arith");
    let model = CausalLm::random(ModelConfig::from_dir(&src).unwrap(), 3, &burn::tensor::Device::flex()).unwrap();
    let out = dir.join("tiny");
    std::fs::create_dir_all(&out).unwrap();
    reinforge_engine::weights::write_safetensors(&out.join("model.safetensors"), &model.to_hf_tensors().unwrap(), None).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), out.join(f)).unwrap();
    }
    out
}

/// `reinforge config convert` of a command line, read back as TOML.
fn convert(dir: &Path, mode: &str, args: &[String]) -> (toml::Table, String) {
    let out = dir.join("converted.toml");
    let mut all = words(&format!("config convert --out {}", out.display()));
    all.push(mode.into());
    all.extend(args.iter().cloned());
    let o = run(&all, dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    (text.parse().unwrap(), text)
}

fn get<'a>(t: &'a toml::Table, key: &str) -> &'a toml::Value {
    let mut parts = key.split('.');
    let mut v = t.get(parts.next().unwrap()).unwrap_or_else(|| panic!("{key} missing"));
    for p in parts {
        v = v.get(p).unwrap_or_else(|| panic!("{key} missing"));
    }
    v
}

/// verl's multi-node guide example (docs/start/multinode.rst), paths aside.
fn verl_guide(data: &Path, model: &str) -> String {
    format!(
        "data.train_files={d}/train.parquet data.val_files={d}/test.parquet data.train_batch_size=256 data.max_prompt_length=512 \
         data.max_response_length=256 actor_rollout_ref.model.path={model} actor_rollout_ref.actor.optim.lr=1e-6 \
         actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
         actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
         actor_rollout_ref.rollout.gpu_memory_utilization=0.4 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
         critic.optim.lr=1e-5 critic.model.path={model} critic.ppo_micro_batch_size_per_gpu=4 algorithm.kl_ctrl.kl_coef=0.001 \
         trainer.logger=['console'] trainer.val_before_train=False trainer.n_gpus_per_node=8 trainer.nnodes=2 \
         trainer.save_freq=10 trainer.test_freq=10 trainer.total_epochs=15",
        d = data.display()
    )
}

#[test]
fn verl_multinode_guide_command_resolves_to_what_verl_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (c, text) = convert(tmp.path(), "--verl", &words(&verl_guide(Path::new("/data/gsm8k"), "Qwen/Qwen2.5-0.5B-Instruct")));
    let s = |k: &str| get(&c, k).as_str().unwrap().to_string();
    let i = |k: &str| get(&c, k).as_integer().unwrap();
    let f = |k: &str| get(&c, k).as_float().unwrap();
    let b = |k: &str| get(&c, k).as_bool().unwrap();
    // What the command says.
    assert_eq!(get(&c, "data.train_files").as_array().unwrap()[0].as_str(), Some("/data/gsm8k/train.parquet"));
    assert_eq!(get(&c, "data.val_files").as_array().unwrap()[0].as_str(), Some("/data/gsm8k/test.parquet"));
    assert_eq!((i("data.train_batch_size"), i("data.max_prompt_length"), i("data.max_response_length")), (256, 512, 256));
    assert_eq!(s("actor.model"), "Qwen/Qwen2.5-0.5B-Instruct");
    assert_eq!(f("actor.lr"), 1e-6);
    // 64 prompts per mini-batch (verl multiplies by rollout.n itself), 4 sequences per GPU.
    assert_eq!((i("actor.ppo_mini_batch_size"), i("actor.ppo_micro_batch_size")), (64, 4));
    assert_eq!(f("rollout.gpu_memory_utilization"), 0.4);
    assert_eq!((f("critic.lr"), s("critic.model"), i("critic.ppo_micro_batch_size")), (1e-5, "Qwen/Qwen2.5-0.5B-Instruct".into(), 4));
    assert_eq!(f("algorithm.kl_ctrl.kl_coef"), 0.001);
    let loggers: Vec<&str> = get(&c, "trainer.logger").as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(loggers.contains(&"console") && !loggers.contains(&"wandb"), "{loggers:?}");
    assert!(!b("trainer.val_before_train"));
    assert_eq!((i("trainer.save_freq"), i("trainer.test_freq"), i("trainer.total_epochs")), (10, 10, 15));
    // 2 nodes × 8 GPUs, every role on all of them (verl's hybrid engine).
    assert_eq!(s("cluster.backend"), "ray");
    assert!(b("cluster.colocate_all"));
    assert_eq!((i("cluster.actor.nnodes"), i("cluster.actor.gpus_per_node")), (2, 8));
    assert_eq!((i("cluster.critic.nnodes"), i("cluster.critic.gpus_per_node")), (2, 8));
    // What verl's defaults make of the rest.
    assert_eq!(s("algorithm.adv_estimator"), "gae");
    assert_eq!((i("rollout.n"), f("rollout.temperature"), i("rollout.top_k")), (1, 1.0, 0));
    assert_eq!((f("actor.clip_ratio"), s("actor.loss_agg_mode"), f("actor.entropy_coeff")), (0.2, "token-mean".into(), 0.0));
    assert!(!b("actor.use_kl_loss") && !b("algorithm.use_kl_in_reward"));
    assert!(b("actor.gradient_checkpointing"));
    assert_eq!((s("trainer.project_name"), s("trainer.experiment_name")), ("verl_examples".into(), "gsm8k".into()));
    assert_eq!(s("trainer.default_local_dir"), "checkpoints/verl_examples/gsm8k");
    assert_eq!((s("trainer.device"), i("trainer.max_ckpt_to_keep")), ("cuda".into(), 0));
    // The report rides along as comments, every argument answered.
    assert!(text.starts_with("# Converted by `reinforge config convert`"), "{text}");
    assert!(text.contains("# verl command line → Reinforge: 21 mapped, 3 not applicable, 0 refused"), "{text}");
    assert!(text.contains("n/a     actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"), "{text}");
}

#[test]
fn a_scaled_down_verl_command_trains_two_steps_on_the_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    gsm8k(tmp.path());
    let model = tiny_model(tmp.path());
    // The guide's command with small numbers, one "GPU", and the CPU engine.
    let line = verl_guide(tmp.path(), model.to_str().unwrap())
        .replace("data.train_batch_size=256", "data.train_batch_size=4")
        .replace("data.max_prompt_length=512", "data.max_prompt_length=96")
        .replace("data.max_response_length=256", "data.max_response_length=8")
        .replace("ppo_mini_batch_size=64", "ppo_mini_batch_size=2")
        .replace("ppo_micro_batch_size_per_gpu=4", "ppo_micro_batch_size_per_gpu=2")
        .replace("trainer.n_gpus_per_node=8 trainer.nnodes=2", "trainer.n_gpus_per_node=1 trainer.nnodes=1");
    let mut args = vec!["train".to_string(), "--verl".into()];
    args.extend(words(&line));
    args.extend(words(&format!("trainer.total_training_steps=2 trainer.device=cpu trainer.default_local_dir={}/run", tmp.path().display())));
    let o = run(&args, tmp.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("verl command line → Reinforge: 24 mapped, 3 not applicable, 0 refused"), "{err}");
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(tmp.path().join("run/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.iter().map(|r| r["step"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2]);
    for r in &rows {
        // GAE with a critic, as verl's default estimator: values and returns are logged.
        assert!(r["critic/score/mean"].is_number() && r["critic/vf_loss"].is_number() && r["critic/values/mean"].is_number(), "{r}");
    }
    assert!(tmp.path().join("run/checkpoints/global_step_2").is_dir());
}

/// OpenRLHF's README example (v0.8.5, "PPO with Ray and vLLM", 8 GPUs, colocated), its
/// placeholders filled.
const OPENRLHF_README: &str = "--ref_num_nodes 1 --ref_num_gpus_per_node 8 --reward_num_nodes 1 --reward_num_gpus_per_node 8 \
    --critic_num_nodes 1 --critic_num_gpus_per_node 8 --actor_num_nodes 1 --actor_num_gpus_per_node 8 --vllm_num_engines 4 \
    --vllm_tensor_parallel_size 2 --colocate_all_models --vllm_gpu_memory_utilization 0.5 --pretrain OpenRLHF/Llama-3-8b-sft-mixture \
    --reward_pretrain OpenRLHF/Llama-3-8b-rm-700k --save_path /openrlhf/examples/test_scripts/final/llama3-8b-rlhf \
    --ckpt_path /openrlhf/examples/test_scripts/ckpt/llama3-8b-rlhf --save_hf_ckpt --micro_train_batch_size 8 --train_batch_size 128 \
    --micro_rollout_batch_size 16 --rollout_batch_size 1024 --n_samples_per_prompt 1 --max_epochs 1 --prompt_max_len 1024 \
    --max_samples 100000 --generate_max_len 1024 --zero_stage 3 --bf16 --actor_learning_rate 5e-7 --critic_learning_rate 9e-6 \
    --init_kl_coef 0.01 --prompt_data OpenRLHF/prompt-collection-v0.1 --input_key context_messages --apply_chat_template \
    --normalize_reward --gradient_checkpointing --packing_samples --vllm_sync_backend nccl --enforce_eager --vllm_enable_sleep \
    --deepspeed_enable_sleep --use_wandb True";

#[test]
fn openrlhf_readme_command_is_refused_only_for_its_hub_dataset_then_resolves() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = words("train --openrlhf");
    args.extend(words(OPENRLHF_README));
    let o = run(&args, tmp.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "exit code; stderr: {err}");
    let refused: Vec<&str> = err.lines().filter(|l| l.trim_start().starts_with("REFUSED")).collect();
    assert_eq!(refused.len(), 1, "{err}");
    assert!(refused[0].contains("--prompt_data OpenRLHF/prompt-collection-v0.1") && refused[0].contains("hf download --repo-type dataset"), "{err}");
    assert!(err.lines().last().unwrap().starts_with("error: 1 argument(s) of the OpenRLHF command line refused"), "{err}");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "a refused command writes nothing");

    // The one change: the prompts downloaded to a local file.
    let (c, _) = convert(tmp.path(), "--openrlhf", &words(&OPENRLHF_README.replace("OpenRLHF/prompt-collection-v0.1", "/data/prompts.parquet")));
    let s = |k: &str| get(&c, k).as_str().unwrap().to_string();
    let i = |k: &str| get(&c, k).as_integer().unwrap();
    let f = |k: &str| get(&c, k).as_float().unwrap();
    let b = |k: &str| get(&c, k).as_bool().unwrap();
    assert_eq!((s("actor.model"), s("reward.kind"), s("reward.params.path")), ("OpenRLHF/Llama-3-8b-sft-mixture".into(), "reward_model".into(), "OpenRLHF/Llama-3-8b-rm-700k".into()));
    // gae without --critic_pretrain: OpenRLHF's critic starts from the reward model.
    assert_eq!((s("algorithm.adv_estimator"), s("critic.model")), ("gae".into(), "OpenRLHF/Llama-3-8b-rm-700k".into()));
    // 1024 prompts × 1 sample; 128 sequences per optimizer step = 128 prompts; 8 per GPU.
    assert_eq!((i("data.train_batch_size"), i("rollout.n"), i("actor.ppo_mini_batch_size")), (1024, 1, 128));
    assert_eq!((i("actor.ppo_micro_batch_size"), i("critic.ppo_micro_batch_size"), i("actor.ppo_epochs")), (8, 8, 1));
    assert_eq!((i("data.max_prompt_length"), i("data.max_response_length"), i("data.max_samples")), (1024, 1024, 100000));
    assert_eq!((f("actor.lr"), f("critic.lr")), (5e-7, 9e-6));
    // KL in the reward (no --use_kl_loss), k1, 0.01.
    assert!(b("algorithm.use_kl_in_reward") && !b("actor.use_kl_loss"));
    assert_eq!((f("algorithm.kl_ctrl.kl_coef"), s("algorithm.kl_penalty")), (0.01, "kl".into()));
    assert_eq!((s("data.prompt_key"), b("data.apply_chat_template")), ("context_messages".into(), true));
    assert_eq!(get(&c, "data.train_files").as_array().unwrap()[0].as_str(), Some("/data/prompts.parquet"));
    // vLLM's 4 engines of 2 GPUs: 8 generation ranks of one GPU; the prompt rows need no
    // data_source or answer for the reward model.
    assert_eq!((i("cluster.rollout.nnodes"), i("cluster.rollout.gpus_per_node")), (1, 8));
    assert_eq!((s("data.default_data_source"), b("data.require_ground_truth")), ("openrlhf".into(), false));
    assert_eq!(s("trainer.default_local_dir"), "/openrlhf/examples/test_scripts/ckpt/llama3-8b-rlhf");
    assert_eq!((s("trainer.dtype"), s("trainer.device")), ("bf16".into(), "cuda".into()));
    assert!(b("actor.gradient_checkpointing"));
    assert_eq!(f("rollout.gpu_memory_utilization"), 0.5);
    let loggers: Vec<&str> = get(&c, "trainer.logger").as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(loggers.contains(&"wandb"), "{loggers:?}");
    assert_eq!((s("cluster.backend"), b("cluster.colocate_all")), ("ray".into(), true));
    assert_eq!((i("cluster.actor.nnodes"), i("cluster.actor.gpus_per_node")), (1, 8));
    // OpenRLHF's schedule: cosine to 0.1 × lr after 3 % warm-up; Adam betas (0.9, 0.95).
    assert_eq!((s("actor.lr_scheduler"), f("actor.min_lr_ratio"), f("actor.lr_warmup_ratio")), ("cosine".into(), 0.1, 0.03));
    assert_eq!(get(&c, "actor.betas").as_array().unwrap().iter().map(|v| v.as_float().unwrap()).collect::<Vec<_>>(), [0.9, 0.95]);
}

#[test]
fn a_scaled_down_openrlhf_command_trains_two_steps_on_the_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    gsm8k(tmp.path());
    let model = tiny_model(tmp.path());
    let line = format!(
        "train --openrlhf --colocate_all_models --actor_num_nodes 1 --actor_num_gpus_per_node 1 --vllm_num_engines 1 \
         --vllm_tensor_parallel_size 1 --pretrain {m} --prompt_data {d}/train.parquet --input_key prompt --apply_chat_template \
         --rollout_batch_size 4 --n_samples_per_prompt 2 --train_batch_size 8 --micro_train_batch_size 4 --max_epochs 1 \
         --num_episodes 1 --prompt_max_len 96 --generate_max_len 8 --advantage_estimator group_norm --init_kl_coef 0.001 \
         --use_kl_loss --kl_estimator k3 --actor_learning_rate 1e-6 --ckpt_path {d}/run --save_steps -1 --zero_stage 3 --bf16 \
         trainer.device=cpu trainer.dtype=auto trainer.total_steps=2",
        m = model.display(),
        d = tmp.path().display()
    );
    let o = run(&words(&line), tmp.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("0 refused, 3 Reinforge key(s)"), "{err}");
    let metrics = |run: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(tmp.path().join(run).join("metrics.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let rows = metrics("run");
    assert_eq!(rows.iter().map(|r| r["step"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2]);
    for r in &rows {
        // GRPO (group_norm) with the KL as a k3 loss term against the reference.
        assert!(r["actor/kl_loss"].is_number() && r["critic/score/mean"].is_number(), "{r}");
        assert!(r.get("critic/vf_loss").is_none(), "no critic for group_norm: {r}");
    }

    // The same command as OpenRLHF v0.10.2+ spells it (v0.9.8 replaced the prompt and
    // generation lengths with --max_len and --max_new_tokens) trains the same two steps.
    let dotted = format!(
        "train --openrlhf --train.colocate_all --actor.num_nodes 1 --actor.num_gpus_per_node 1 --vllm.num_engines 1 \
         --vllm.tensor_parallel_size 1 --actor.model_name_or_path {m} --data.prompt_dataset {d}/train.parquet --data.input_key prompt \
         --data.apply_chat_template --rollout.batch_size 4 --rollout.n_samples_per_prompt 2 --train.batch_size 8 \
         --train.micro_batch_size 4 --train.max_epochs 1 --train.num_episodes 1 --data.max_len 104 --rollout.max_new_tokens 8 \
         --algo.advantage.estimator group_norm --algo.kl.init_coef 0.001 --algo.kl.use_loss --algo.kl.estimator k3 \
         --actor.adam.lr 1e-6 --ckpt.path {d}/run-dotted --ckpt.save_steps -1 --ds.zero_stage 3 --ds.param_dtype bf16 \
         data.max_prompt_length=96 trainer.device=cpu trainer.dtype=auto trainer.total_steps=2",
        m = model.display(),
        d = tmp.path().display()
    );
    let o = run(&words(&dotted), tmp.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("0 refused, 4 Reinforge key(s)"), "{err}");
    let same = |r: &serde_json::Value| ["critic/score/mean", "actor/kl_loss", "actor/pg_loss", "response_length/mean"].map(|k| r[k].clone());
    assert_eq!(metrics("run-dotted").iter().map(same).collect::<Vec<_>>(), rows.iter().map(same).collect::<Vec<_>>());
}

#[test]
fn foreign_command_lines_fail_in_one_line_without_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let fails = |args: &str, expect: &str| {
        let o = run(&words(args), tmp.path());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args}: {err}");
        let (last, why) = expect.split_once(" | ").unwrap_or((expect, ""));
        assert!(err.lines().last().unwrap().contains(last) && err.contains(why), "{args}: {err}");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "{args}: wrote something");
    };
    fails("train --verl data.train_batch_size", "expected key=value");
    fails("train --verl data.train_files=['a.parquet'", "a list `[` is not closed");
    fails("train --verl actor_rollout_ref.model.path=/m data.train_files=x.parquet data.train_batch_size=abc", "refused | REFUSED data.train_batch_size=abc        expected a whole number ≥ 0, got `abc`");
    fails("train --verl actor_rollout_ref.actor.optim.lrr=1e-6", "1 argument(s) of the verl command line refused | did you mean `actor_rollout_ref.actor.optim.lr`?");
    fails("train --openrlhf --pretrain", "`--pretrain`: expects a value");
    fails("train", "no config: give a TOML file");
    fails("config convert --verl", "actor.model is empty");
}

#[test]
fn verl_hydra_flags_are_answered_instead_of_stopping_the_parser() {
    let tmp = tempfile::tempdir().unwrap();
    let guide = words(&verl_guide(Path::new("/data/gsm8k"), "Qwen/Qwen2.5-0.5B-Instruct"));
    let (plain, _) = convert(tmp.path(), "--verl", &guide);
    // verl's Megatron examples name their config before the overrides, spaced or with `=`.
    let mut megatron = words("--config-path=config --config-name ppo_megatron_trainer.yaml");
    megatron.extend(guide.iter().cloned());
    let (c, text) = convert(tmp.path(), "--verl", &megatron);
    assert_eq!(c, plain, "the same keys, with ppo_trainer's defaults");
    assert!(text.contains("--config-name=ppo_megatron_trainer.yaml") && text.contains("verl's Megatron config"), "{text}");
    // verl's multi-turn tool config: its values become the defaults (typed keys still win), its
    // tool config is read and checked at conversion.
    let yaml = tmp.path().join("gsm8k_tool_config.yaml");
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("../reinforge-trainer/tests/data/gsm8k_tool_config.yaml"), &yaml).unwrap();
    let mut multiturn = words("--config-path /verl/examples/sglang_multiturn/config --config-name=gsm8k_multiturn_grpo");
    multiturn.extend(guide.iter().filter(|w| !w.starts_with("data.max_response_length")).cloned());
    multiturn.push(format!("actor_rollout_ref.rollout.multi_turn.tool_config_path={}", yaml.display()));
    let (c, text) = convert(tmp.path(), "--verl", &multiturn);
    assert_eq!(get(&c, "tools.calls.enable").as_bool(), Some(true), "{text}");
    assert_eq!(get(&c, "tools.calls.tool_config_path").as_str(), Some(yaml.to_str().unwrap()));
    assert_eq!(get(&c, "tools.calls.max_assistant_turns").as_integer(), Some(5), "the config file's value");
    assert_eq!(get(&c, "data.max_response_length").as_integer(), Some(1024), "the config file's value");
    assert_eq!(get(&c, "data.max_prompt_length").as_integer(), Some(512), "typed wins");
    // Without the tool config file, nothing is written and the error names the file.
    let mut missing = words("train --verl --config-name=gsm8k_multiturn_grpo actor_rollout_ref.rollout.multi_turn.tool_config_path=/no/tools.yaml");
    missing.extend(guide.iter().cloned());
    let o = run(&missing, tmp.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.lines().last().unwrap().contains("tools.calls.tool_config_path: /no/tools.yaml"), "{err}");
    // A multimodal multi-turn config is refused by name.
    let mut geo = words("train --verl --config-name=geo3k_multiturn_grpo");
    geo.extend(guide);
    let o = run(&geo, tmp.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let refused: Vec<&str> = err.lines().filter(|l| l.trim_start().starts_with("REFUSED")).collect();
    assert_eq!(refused.len(), 1, "{err}");
    assert!(refused[0].contains("--config-name=geo3k_multiturn_grpo") && refused[0].contains("multimodal"), "{err}");
    // A bare --ray before a spaced flag is still the default address, not the flag's name.
    let mut ray = words("train --verl --dry-run --ray --config-name ppo_trainer");
    ray.extend(words(&verl_guide(Path::new("/data/gsm8k"), "Qwen/Qwen2.5-0.5B-Instruct")));
    let o = run(&ray, tmp.path());
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert!(out.contains("address = \"auto\"") && err.contains("--config-name=ppo_trainer"), "{out}\n{err}");
    // A flag without its value is a one-line syntax error.
    let o = run(&words("train --verl --dry-run data.train_batch_size=8 --config-name"), tmp.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.lines().last().unwrap_or_default().contains("`--config-name`: expects a value"), "{err}");
}

#[test]
fn python_reward_functions_from_verl_and_openrlhf_commands_train() {
    let tmp = tempfile::tempdir().unwrap();
    gsm8k(tmp.path());
    let model = tiny_model(tmp.path());
    let log = tmp.path().join("calls.jsonl");
    // Trains with `line`, then reads (and clears) what the reward function recorded.
    let train_and_read_calls = |line: &str| -> Vec<serde_json::Value> {
        let o = run(&words(line), tmp.path());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let calls = std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        std::fs::remove_file(&log).unwrap();
        calls
    };
    // verl's custom reward function, with a reward_kwargs entry; it records what it is given.
    let verl_fn = tmp.path().join("verl_reward.py");
    std::fs::write(&verl_fn, format!(r#"
import json
def my_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    with open({log:?}, "a") as f:
        f.write(json.dumps({{"style": "verl", "ds": data_source, "gt": ground_truth, "index": extra_info["index"], "bonus": bonus}}) + "\n")
    return {{"score": float(ground_truth in solution_str) + bonus, "has_answer": len(solution_str) > 0}}
"#, log = log.display().to_string())).unwrap();
    let line = format!(
        "train --verl -- data.train_files={d}/train.parquet data.val_files={d}/test.parquet data.train_batch_size=4 \
         data.max_prompt_length=96 data.max_response_length=8 actor_rollout_ref.model.path={m} actor_rollout_ref.rollout.n=2 \
         actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 algorithm.adv_estimator=grpo \
         custom_reward_function.path={f} custom_reward_function.name=my_score +custom_reward_function.reward_kwargs.bonus=0.25 \
         trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.logger=['console'] trainer.val_before_train=False trainer.test_freq=0 \
         trainer.default_local_dir={d}/verl-run trainer.total_training_steps=1 trainer.device=cpu",
        m = model.display(),
        d = tmp.path().display(),
        f = verl_fn.display()
    );
    let calls = train_and_read_calls(&line);
    assert_eq!(calls.len(), 8, "4 prompts × 2 samples");
    assert!(calls.iter().all(|c| c["ds"] == "openai/gsm8k" && c["bonus"] == 0.25 && c["gt"].is_string() && c["index"].is_u64()), "{calls:?}");
    let row: serde_json::Value = serde_json::from_str(std::fs::read_to_string(tmp.path().join("verl-run/metrics.jsonl")).unwrap().lines().next().unwrap()).unwrap();
    assert!(row["critic/score/min"].as_f64().unwrap() >= 0.25, "the kwarg reached the function: {row}");

    // OpenRLHF's reward_func file over `{input, answer}` rows, the answer named by --label_key.
    let rows = ["{\"input\": \"3 apples and 4 more. How many?\", \"answer\": \"7\"}", "{\"input\": \"2 boxes of 6 pens. Pens?\", \"answer\": \"12\"}"];
    std::fs::write(tmp.path().join("prompts.jsonl"), rows.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
    let rf = tmp.path().join("reward_func.py");
    std::fs::write(&rf, format!(r#"
import json
def reward_func(queries, prompts, labels, **kwargs):
    with open({log:?}, "a") as f:
        f.write(json.dumps({{"style": "openrlhf", "starts": queries[0].startswith(prompts[0]), "label": labels[0]}}) + "\n")
    r = [float(labels[0] in queries[0][len(prompts[0]):])]
    return {{"rewards": r, "scores": r, "extra_logs": {{"seen": [1.0]}}}}
"#, log = log.display().to_string())).unwrap();
    let line = format!(
        "train --openrlhf --colocate_all_models --actor_num_nodes 1 --actor_num_gpus_per_node 1 --vllm_num_engines 1 \
         --vllm_tensor_parallel_size 1 --pretrain {m} --prompt_data {d}/prompts.jsonl --input_key input --label_key answer --apply_chat_template \
         --remote_rm_url {f} --rollout_batch_size 2 --n_samples_per_prompt 2 --train_batch_size 4 --micro_train_batch_size 4 \
         --prompt_max_len 96 --generate_max_len 8 --advantage_estimator group_norm --ckpt_path {d}/orlhf-run \
         trainer.device=cpu trainer.total_steps=1",
        m = model.display(),
        d = tmp.path().display(),
        f = rf.display()
    );
    let calls = train_and_read_calls(&line);
    assert_eq!(calls.len(), 4);
    let mut labels: Vec<&str> = calls.iter().map(|c| c["label"].as_str().unwrap()).collect();
    labels.sort();
    assert_eq!(labels, ["12", "12", "7", "7"]);
    assert!(calls.iter().all(|c| c["starts"] == true), "the query is the prompt and the response: {calls:?}");
}
