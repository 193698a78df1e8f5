//! The trainer on the CUDA engine (`trainer.device = "cuda-emu"`: its kernels emulated on the
//! CPU, so this runs without a GPU): a PPO run with a critic, a reference and a KL loss gives
//! the CPU engine's metrics step for step, and checkpoints move between the engines — a run
//! checkpointed on one resumes on the other and goes on as if it had never switched.
//!
//! Rollouts use top-k 1 so that both engines pick the same tokens (their samplers draw from
//! different random streams); every other number (log-probs, values, losses, gradient norms,
//! the AdamW update) is computed independently by each engine and compared.

use reinforge_checkpoint::Resume;
use reinforge_trainer::{train, TrainConfig};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn config(dir: &Path, device: &str, extra: &[&str]) -> TrainConfig {
    try_config(dir, device, extra).expect("valid test config")
}

fn try_config(dir: &Path, device: &str, extra: &[&str]) -> Result<TrainConfig, reinforge_trainer::config::ConfigError> {
    let model = repo().join("examples/tiny-arith");
    let text = format!(
        r#"
[data]
generate = {{ kind = "arith", n = 32, seed = 3, params = {{ max_operand = 4 }} }}
val_generate = {{ kind = "arith", n = 4, seed = 4, params = {{ max_operand = 4 }} }}
max_prompt_length = 64
max_response_length = 3
train_batch_size = 4
[actor]
model = "{model}"
init = "random"
init_seed = 5
lr = 5e-3
ppo_mini_batch_size = 2
ppo_micro_batch_size = 2
ppo_epochs = 2
use_kl_loss = true
entropy_coeff = 0.01
[rollout]
n = 2
top_k = 1
[reward]
kind = "qa_em"
params = {{ extract = "whole" }}
[critic]
ppo_micro_batch_size = 2
[algorithm]
adv_estimator = "gae"
[trainer]
default_local_dir = "{dir}"
device = "{device}"
dtype = "f32"
total_steps = 2
save_freq = 1
test_freq = 2
logger = ["jsonl"]
"#,
        model = model.display(),
        dir = dir.display()
    );
    let overrides: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    TrainConfig::from_str_with(&text, "test", &overrides)
}

fn no_stop() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

/// Asserts that two steps' metrics agree (timings and throughput aside) to f32 rounding
/// accumulated through a step.
fn assert_close(what: &str, a: &reinforge_metrics::Metrics, b: &reinforge_metrics::Metrics) {
    let keys = |m: &reinforge_metrics::Metrics| -> Vec<String> {
        m.iter().map(|(k, _)| k.to_string()).filter(|k| !k.starts_with("timing_s/") && !k.starts_with("perf/")).collect()
    };
    assert_eq!(keys(a), keys(b), "{what}: the engines report different metrics");
    for k in keys(a) {
        let (x, y) = (a.get(&k).unwrap(), b.get(&k).unwrap());
        assert!((x - y).abs() <= 1e-4 + 1e-3 * y.abs(), "{what}: {k} = {x} on one engine, {y} on the other");
    }
}

#[test]
fn cuda_engine_run_equals_cpu_run_and_checkpoints_cross_engines() {
    let tmp = tempfile::tempdir().unwrap();
    let cpu = train(&config(&tmp.path().join("cpu"), "cpu", &[]), &Resume::None, no_stop()).unwrap();
    let emu = train(&config(&tmp.path().join("emu"), "cuda-emu", &[]), &Resume::None, no_stop()).unwrap();
    assert_eq!((cpu.steps, emu.steps), (2, 2));
    for step in 0..2 {
        assert_close(&format!("step {}", step + 1), &emu.history[step], &cpu.history[step]);
    }
    for k in ["critic/vf_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "critic/grad_norm", "val/reward/mean"] {
        assert!(emu.history[1].get(k).is_some_and(f64::is_finite), "missing or non-finite {k}");
    }
    assert!(emu.history[1].get("actor/grad_norm").unwrap() > 0.0, "the update must have a gradient");

    // Step 1 on one engine, step 2 on the other, from the step-1 checkpoint.
    for (first, second, reference) in [("cuda-emu", "cpu", &cpu), ("cpu", "cuda-emu", &emu)] {
        let dir = tmp.path().join(format!("{first}-then-{second}"));
        let one = train(&config(&dir, first, &["trainer.total_steps=1"]), &Resume::None, no_stop()).unwrap();
        assert_eq!(one.steps, 1);
        assert!(dir.join("checkpoints/global_step_1/actor/optimizer.safetensors").is_file());
        assert!(dir.join("checkpoints/global_step_1/critic/optimizer.safetensors").is_file());
        let rest = train(&config(&dir, second, &[]), &Resume::Auto, no_stop()).unwrap();
        assert_eq!(rest.steps, 2);
        assert_close(&format!("step 2 on {second} after step 1 on {first}"), &rest.history[0], &reference.history[1]);
    }
}

#[test]
fn token_budget_micro_batches_on_the_cuda_engine_equal_fixed_ones_on_the_cpu() {
    // The CPU run in micro-batches of 2 sequences; the CUDA engine's by a 120-token budget,
    // for the actor's and the critic's updates and the log-prob and value passes. These
    // sequences are 58 tokens, and a mini-batch is two prompts' two samples; the second sample
    // of a prompt adds 4 (its last prompt token and response), so 120 holds 3 + 1 of them.
    let tmp = tempfile::tempdir().unwrap();
    let quiet = ["trainer.save_freq=0", "trainer.test_freq=0"];
    let cpu = train(&config(&tmp.path().join("cpu"), "cpu", &quiet), &Resume::None, no_stop()).unwrap();
    let budget = ["actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=120", "critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=120"];
    let emu = train(&config(&tmp.path().join("emu"), "cuda-emu", &[&quiet[..], &budget[..]].concat()), &Resume::None, no_stop()).unwrap();
    assert_eq!((cpu.steps, emu.steps), (2, 2));
    for step in 0..2 {
        assert_close(&format!("step {}", step + 1), &emu.history[step], &cpu.history[step]);
    }
}

#[test]
fn cuda_engine_bf16_run_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(&tmp.path().join("bf16"), "cuda-emu", &["trainer.dtype=\"bf16\"", "trainer.save_freq=0", "trainer.test_freq=0"]);
    let s = train(&cfg, &Resume::None, no_stop()).unwrap();
    assert_eq!(s.steps, 2);
    for k in ["actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "actor/kl_loss"] {
        assert!(s.history[1].get(k).is_some_and(f64::is_finite), "missing or non-finite {k}");
    }
    // The final checkpoint holds f32 master weights, loadable by the CPU engine.
    let ck = tmp.path().join("bf16/checkpoints/global_step_2/actor");
    reinforge_engine::CausalLm::load(&ck, &reinforge_engine::DeviceSpec::Cpu.inference_device().unwrap()).unwrap();
}

/// LoRA on the CUDA engine: a GRPO run trains the adapter as the CPU engine does, step for
/// step; its checkpoint (PEFT files, factors-only optimizer state) resumes on the other engine;
/// and a bf16 run trains.
#[test]
fn lora_on_the_cuda_engine_equals_the_cpu_run_and_resumes_across_engines() {
    let tmp = tempfile::tempdir().unwrap();
    let lora = ["algorithm.adv_estimator=\"grpo\"", "actor.lora_rank=4", "actor.lora_alpha=8", "actor.lr=2e-2", "trainer.test_freq=0"];
    let cpu = train(&config(&tmp.path().join("cpu"), "cpu", &lora), &Resume::None, no_stop()).unwrap();
    let emu = train(&config(&tmp.path().join("emu"), "cuda-emu", &lora), &Resume::None, no_stop()).unwrap();
    assert_eq!((cpu.steps, emu.steps), (2, 2));
    for step in 0..2 {
        assert_close(&format!("LoRA step {}", step + 1), &emu.history[step], &cpu.history[step]);
    }
    assert!(emu.history[1].get("actor/grad_norm").unwrap() > 0.0, "the adapter must have a gradient");
    let ck = tmp.path().join("emu/checkpoints/global_step_2/actor");
    let adapter = reinforge_engine::Adapter::read(&ck).unwrap();
    assert!(adapter.tensors.iter().any(|(k, t)| k.ends_with("lora_B.weight") && t.data.iter().any(|&x| x != 0.0)), "the adapter did not train");
    let theirs = reinforge_engine::Adapter::read(&tmp.path().join("cpu/checkpoints/global_step_2/actor")).unwrap();
    for (k, t) in &adapter.tensors {
        let worst = t.data.iter().zip(&theirs.tensors[k].data).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-4, "{k}: the engines' adapters differ by {worst}");
    }
    let opt = reinforge_engine::OptimizerState::read(&std::fs::read(ck.join("optimizer.safetensors")).unwrap(), &ck).unwrap();
    assert!(!opt.exp_avg.is_empty() && opt.exp_avg.keys().all(|k| reinforge_engine::lora::is_lora_name(k)), "optimizer state beyond the adapter");

    for (first, second, reference) in [("cuda-emu", "cpu", &cpu), ("cpu", "cuda-emu", &emu)] {
        let dir = tmp.path().join(format!("lora-{first}-then-{second}"));
        train(&config(&dir, first, &[&lora[..], &["trainer.total_steps=1"]].concat()), &Resume::None, no_stop()).unwrap();
        let rest = train(&config(&dir, second, &lora), &Resume::Auto, no_stop()).unwrap();
        assert_eq!(rest.steps, 2);
        assert_close(&format!("LoRA step 2 on {second} after step 1 on {first}"), &rest.history[0], &reference.history[1]);
    }

    // A rollout engine with weights of its own (a Ray rank apart from the actor) starts from the
    // checkpoint's adapter merged on the host; the actor sends its merged copy (device GEMMs):
    // the same plain model, and the same greedy tokens.
    use reinforge_trainer::roles::{HostedPolicy, RolloutGroup};
    let ckpt = reinforge_checkpoint::open(tmp.path().join("emu/checkpoints/global_step_2"), &Default::default()).unwrap();
    let cfg = config(&tmp.path().join("emu"), "cuda-emu", &lora);
    let gpu = reinforge_trainer::cuda::open_gpu(&cfg).unwrap();
    let model_dir = repo().join("examples/tiny-arith");
    let mut actor = reinforge_trainer::cuda::CudaActorRollout::build(&gpu, &cfg, &model_dir, Some(&ckpt)).unwrap();
    let mut apart = reinforge_trainer::cuda::CudaRollout::build(&gpu, &cfg, &model_dir, Some(&ckpt)).unwrap();
    let (sent, _) = actor.weights().unwrap();
    let held = apart.model.to_hf_tensors().unwrap();
    let base = reinforge_engine::weights::WeightSet::load_base_dir(&ck).unwrap().into_map();
    assert_eq!(sent.keys().collect::<Vec<_>>(), held.keys().collect::<Vec<_>>(), "a plain model's tensors");
    let mut moved = 0;
    for (k, t) in &sent {
        let worst = t.data.iter().zip(&held[k].data).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "{k}: merged on the device and on the host differ by {worst}");
        moved += usize::from(t.data != base[k].data);
    }
    assert!(moved > 0, "the merged weights are the base's");
    let prompts = vec![vec![5, 6, 7, 8, 9]];
    let params = reinforge_engine::SamplingParams::greedy(3);
    let (a, b) = (actor.generate(&prompts, &params).unwrap(), apart.generate(&prompts, &params).unwrap());
    assert_eq!(a[0].token_ids, b[0].token_ids);

    let bf16 = train(&config(&tmp.path().join("bf16"), "cuda-emu", &[&lora[..], &["trainer.dtype=\"bf16\""]].concat()), &Resume::None, no_stop()).unwrap();
    for k in ["actor/pg_loss", "actor/grad_norm", "actor/kl_loss"] {
        assert!(bf16.history[1].get(k).is_some_and(f64::is_finite), "bf16 LoRA: missing or non-finite {k}");
    }
    // The frozen base (an f32 random init here) is checkpointed as given, not as bf16 holds it.
    let bf16_base = reinforge_engine::weights::WeightSet::load_base_dir(&tmp.path().join("bf16/checkpoints/global_step_2/actor")).unwrap().into_map();
    for (k, t) in &base {
        assert_eq!(t.data, bf16_base[k].data, "{k}: the bf16 run's checkpoint rounded a frozen weight");
    }
}

#[test]
fn cuda_settings_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let err = |device: &str, extra: &str| try_config(tmp.path(), device, &[extra]).unwrap_err().to_string();
    let e = err("cpu", "trainer.dtype=\"bf16\"");
    assert!(e.contains("needs trainer.device = cuda"), "{e}");
    let e = err("cuda", "trainer.dtype=\"f16\"");
    assert!(e.contains("use `auto`, `bf16` or `f32`"), "{e}");
    let e = err("tpu", "trainer.dtype=\"auto\"");
    assert!(e.contains("known devices"), "{e}");
    let e = err("cuda", "rollout.gpu_memory_utilization=1.5");
    assert!(e.contains("rollout.gpu_memory_utilization = 1.5"), "{e}");
}
