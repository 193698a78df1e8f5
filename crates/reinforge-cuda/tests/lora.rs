//! LoRA on the CUDA engine (on the emulator) against the CPU engine's, which is itself checked
//! against PEFT on these adapters (`reinforge-engine/tests/lora.rs`): adapters PEFT wrote on
//! both tiny fixtures (tiny-llama: r 4, all-linear; tiny-qwen2: r 2 on q, v, down, with biases
//! and a tied head), `B` non-zero. Log-probs, entropies and every factor's gradient of a loss
//! Σ a·lp + Σ b·entropy, with and without gradient checkpointing; one clipped AdamW step that
//! leaves the base bit-identical; and the merged model that rollout decodes with.

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use reinforge_cuda::{DType, Gpu, GpuKind, Head, Packed, RowGrads, Rollout, TrainState};
use reinforge_engine::weights::WeightSet;
use reinforge_engine::{reference_gradients, reference_step, Adapter, CausalLm, DeviceSpec, HostTensor, ModelConfig, OptimConfig, SamplingParams};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt();
    num / den.max(1e-12)
}

/// The base fixture and the adapter PEFT wrote for it.
fn fixture(name: &str) -> (PathBuf, Adapter) {
    let adapter = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../reinforge-engine/tests/data/lora").join(name);
    (fixtures().join("models").join(name), Adapter::read(&adapter).expect("PEFT adapter"))
}

struct Case {
    seqs: Vec<Vec<u32>>,
    a: Vec<Vec<f32>>,
    b: Vec<Vec<f32>>,
    temperature: f64,
}

fn case() -> Case {
    let text = ["Hello, world! The quick brown fox jumps over the lazy dog again.", "abc", "LoRA trains on GPUs."];
    let seqs: Vec<Vec<u32>> = text.iter().map(|s| s.bytes().map(u32::from).collect()).collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let a = seqs.iter().map(|s| (1..s.len()).map(|_| rng.random_range(-1.0..1.0)).collect()).collect();
    let b = seqs.iter().map(|s| (1..s.len()).map(|_| rng.random_range(-0.5..0.5)).collect()).collect();
    Case { seqs, a, b, temperature: 1.3 }
}

/// The CUDA engine's trainer for the fixture under its adapter.
fn device_state(gpu: &std::sync::Arc<Gpu>, dir: &std::path::Path, adapter: &Adapter, dt: DType, optim: OptimConfig, checkpointing: bool) -> TrainState {
    let cfg = ModelConfig::from_dir(dir).unwrap();
    let mut tensors = WeightSet::load_dir(dir).unwrap().into_map();
    tensors.extend(adapter.tensors.clone());
    let mut w = WeightSet::from_map("base + adapter", tensors);
    TrainState::with_lora(gpu, cfg, &adapter.config, &mut w, dt, optim, checkpointing).unwrap()
}

/// One micro-batch of the case's loss on the device; its outputs.
fn micro(st: &mut TrainState, c: &Case) -> reinforge_cuda::RowOut {
    let refs: Vec<&[u32]> = c.seqs.iter().map(Vec::as_slice).collect();
    let packed = Packed::new(&refs, st.model.cfg.vocab_size, st.model.cfg.max_position_embeddings).unwrap();
    let (rows, targets) = packed.next_token_rows();
    st.zero_grads().unwrap();
    let head = Head::Lm { targets: &targets, temperature: c.temperature };
    st.micro(&packed, &rows, head, |_| Ok::<_, reinforge_cuda::CudaError>(RowGrads { value: c.a.concat(), entropy: c.b.concat() })).unwrap()
}

fn gradients_match(name: &str, checkpointing: bool) {
    let (dir, adapter) = fixture(name);
    let c = case();
    let cpu = CausalLm::load(&dir, &DeviceSpec::Cpu.training_device(false).unwrap()).unwrap().with_lora(&adapter).unwrap();
    let (lp_ref, ent_ref, g_ref) = reference_gradients(&cpu, &c.seqs, c.temperature, &c.a, &c.b).unwrap();
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let mut st = device_state(&gpu, &dir, &adapter, DType::F32, OptimConfig::default(), checkpointing);
    let out = micro(&mut st, &c);
    let (e_lp, e_ent) = (rel_err(&out.value, &lp_ref.concat()), rel_err(&out.entropy, &ent_ref.concat()));
    assert!(e_lp < 1e-5 && e_ent < 1e-5, "{name}: log-prob rel err {e_lp:.2e}, entropy {e_ent:.2e}");
    let grads = st.gradients().unwrap();
    let factors: Vec<&String> = g_ref.keys().filter(|k| reinforge_engine::lora::is_lora_name(k)).collect();
    assert_eq!(grads.keys().collect::<Vec<_>>(), factors, "{name}: the device keeps gradients for the factors alone");
    let mut worst = (0.0, String::new());
    for k in factors {
        let e = rel_err(&grads[k].data, &g_ref[k].data);
        if e > worst.0 {
            worst = (e, k.clone());
        }
    }
    eprintln!("{name} (checkpointing {checkpointing}): lp {e_lp:.1e}, entropy {e_ent:.1e}, worst factor gradient {:.1e} ({})", worst.0, worst.1);
    assert!(worst.0 < 1e-4, "{name}: worst factor gradient rel err {:.2e} at {}", worst.0, worst.1);
}

#[test]
fn tiny_llama_factor_gradients_equal_the_cpu_engine() {
    gradients_match("tiny-llama", false);
}

#[test]
fn tiny_qwen2_factor_gradients_equal_the_cpu_engine_with_checkpointing() {
    gradients_match("tiny-qwen2", false);
    gradients_match("tiny-qwen2", true);
}

/// One clipped AdamW step: the factors as the CPU engine's step leaves them, the base weights
/// bit for bit as they were, and AdamW's state for the factors alone.
#[test]
fn one_adamw_step_moves_the_factors_only() {
    let (dir, adapter) = fixture("tiny-llama");
    let c = case();
    let optim = OptimConfig { grad_clip: Some(1.0), weight_decay: 0.01, ..OptimConfig::default() };
    let lr = 1e-2;
    let cpu = CausalLm::load(&dir, &DeviceSpec::Cpu.training_device(false).unwrap()).unwrap().with_lora(&adapter).unwrap();
    let (stats, want, want_opt) = reference_step(cpu, optim.clone(), lr, &c.seqs, c.temperature, &c.a, &c.b).unwrap();
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let mut st = device_state(&gpu, &dir, &adapter, DType::F32, optim, false);
    micro(&mut st, &c);
    let got_stats = st.finish(lr, 1, None).unwrap();
    assert!(got_stats.applied && (got_stats.grad_norm - stats.grad_norm).abs() < 1e-4 * stats.grad_norm, "grad norm {} vs {}", got_stats.grad_norm, stats.grad_norm);
    let got = st.to_hf_tensors().unwrap();
    let base = WeightSet::load_dir(&dir).unwrap().into_map();
    assert_eq!(got.len(), base.len() + adapter.tensors.len(), "every weight and factor, once");
    for (k, t) in &got {
        if let Some(b) = base.get(k) {
            assert_eq!(t.data, b.data, "{k}: a frozen weight moved");
        } else {
            let worst = t.data.iter().zip(&want[k].data).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst < 2e-6, "{k}: {worst} from the CPU engine's step");
            assert_ne!(t.data, adapter.tensors[k].data, "{k} did not move");
        }
    }
    let opt = st.optimizer_state().unwrap();
    assert_eq!(opt.exp_avg.keys().collect::<Vec<_>>(), want_opt.exp_avg.keys().collect::<Vec<_>>());
    assert!(opt.exp_avg.keys().all(|k| reinforge_engine::lora::is_lora_name(k)));
}

/// The merged model (one GEMM per adapted linear) holds PEFT's `merge_and_unload` weights as
/// the CPU engine computes them, scores as the adapted model does, follows the factors after
/// an update, and is what rollout decodes with (the adapted model itself is refused there).
#[test]
fn the_merged_model_scores_as_the_adapter_and_decodes() {
    let (dir, adapter) = fixture("tiny-qwen2");
    let c = case();
    let cpu = CausalLm::load(&dir, &DeviceSpec::Cpu.inference_device().unwrap()).unwrap().with_lora(&adapter).unwrap();
    let want: BTreeMap<String, HostTensor> = cpu.merged_hf_tensors().unwrap();
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let mut st = device_state(&gpu, &dir, &adapter, DType::F32, OptimConfig::default(), false);
    let merged = st.model.merged().unwrap();
    let got = merged.to_hf_tensors().unwrap();
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    for (k, t) in &got {
        let worst = t.data.iter().zip(&want[k].data).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-6, "{k}: merged differs by {worst}");
    }
    let refs: Vec<&[u32]> = c.seqs.iter().map(Vec::as_slice).collect();
    let packed = Packed::new(&refs, st.model.cfg.vocab_size, st.model.cfg.max_position_embeddings).unwrap();
    let (rows, targets) = packed.next_token_rows();
    let head = Head::Lm { targets: &targets, temperature: 1.0 };
    let (adapted, plain) = (st.model.score(&packed, &rows, head).unwrap(), merged.score(&packed, &rows, head).unwrap());
    assert!(rel_err(&plain.value, &adapted.value) < 1e-5, "merged log-probs differ: {:.2e}", rel_err(&plain.value, &adapted.value));

    // After an update the merged copy follows the new factors.
    micro(&mut st, &c);
    st.finish(1e-2, 1, None).unwrap();
    st.model.merge_into(&merged).unwrap();
    let (adapted, plain) = (st.model.score(&packed, &rows, head).unwrap(), merged.score(&packed, &rows, head).unwrap());
    assert!(rel_err(&plain.value, &adapted.value) < 1e-5, "after an update: {:.2e}", rel_err(&plain.value, &adapted.value));

    let mut engine = Rollout::new(0.5);
    let prompts = vec![c.seqs[2][..6].to_vec()];
    let e = engine.generate(&st.model, &prompts, &SamplingParams::greedy(4), None).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("merged"), "{e}");
    let (outs, _) = engine.generate(&merged, &prompts, &SamplingParams::greedy(4), None).unwrap();
    assert_eq!(outs[0].token_ids.len(), 4);
}
