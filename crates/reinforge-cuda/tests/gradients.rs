//! The CUDA engine's backward (on the emulator) against the CPU engine's autodiff, which is
//! itself checked against transformers: log-probs, entropies and the gradient of every weight
//! for a loss Σ a·lp + Σ b·entropy with random coefficients; then one AdamW step.

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use reinforge_cuda::{DType, Gpu, GpuKind, Head, Packed, RowGrads, TrainState};
use reinforge_engine::weights::WeightSet;
use reinforge_engine::{reference_gradients, CausalLm, DeviceSpec, ModelConfig, OptimConfig};

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt();
    num / den.max(1e-12)
}

/// Sequences of different lengths (one crossing a 16-row attention tile and a 32-key chunk).
fn batch() -> Vec<Vec<u32>> {
    let text = ["Hello, world! The quick brown fox jumps over the lazy dog again.", "abc", "Reinforge trains on GPUs."];
    text.iter().map(|s| s.bytes().map(u32::from).collect()).collect()
}

fn check(name: &str, checkpointing: bool) {
    let dir = fixtures().join("models").join(name);
    let seqs = batch();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let a: Vec<Vec<f32>> = seqs.iter().map(|s| (1..s.len()).map(|_| rng.random_range(-1.0..1.0)).collect()).collect();
    let b: Vec<Vec<f32>> = seqs.iter().map(|s| (1..s.len()).map(|_| rng.random_range(-0.5..0.5)).collect()).collect();
    let temperature = 0.7;

    let cpu = CausalLm::load(&dir, &DeviceSpec::Cpu.training_device(false).unwrap()).unwrap();
    let (lp_ref, ent_ref, g_ref) = reference_gradients(&cpu, &seqs, temperature, &a, &b).unwrap();

    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let cfg = ModelConfig::from_dir(&dir).unwrap();
    let mut w = WeightSet::load_dir(&dir).unwrap();
    let mut st = TrainState::from_weights(&gpu, cfg.clone(), &mut w, DType::F32, false, OptimConfig::default(), checkpointing).unwrap();
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let packed = Packed::new(&refs, cfg.vocab_size, cfg.max_position_embeddings).unwrap();
    let (rows, targets) = packed.next_token_rows();
    st.zero_grads().unwrap();
    let head = Head::Lm { targets: &targets, temperature };
    let out = st
        .micro(&packed, &rows, head, |_| Ok::<_, reinforge_cuda::CudaError>(RowGrads { value: a.concat(), entropy: b.concat() }))
        .unwrap();
    let e_lp = rel_err(&out.value, &lp_ref.concat());
    let e_ent = rel_err(&out.entropy, &ent_ref.concat());
    assert!(e_lp < 1e-5 && e_ent < 1e-5, "{name}: log-prob rel err {e_lp:.2e}, entropy {e_ent:.2e}");
    let grads = st.gradients().unwrap();
    let mut worst = (0.0, String::new());
    for (k, want) in &g_ref {
        let got = grads.get(k).unwrap_or_else(|| panic!("{name}: no CUDA gradient for {k}"));
        assert_eq!(got.shape, want.shape, "{k}");
        let e = rel_err(&got.data, &want.data);
        if e > worst.0 {
            worst = (e, k.clone());
        }
    }
    assert_eq!(grads.len(), g_ref.len(), "{name}: same tensors");
    assert!(worst.0 < 1e-4, "{name}: worst gradient rel err {:.2e} at {}", worst.0, worst.1);
    eprintln!("{name} (checkpointing {checkpointing}): lp {e_lp:.1e}, entropy {e_ent:.1e}, worst gradient {:.1e} ({})", worst.0, worst.1);
}

#[test]
fn tiny_llama_gradients_equal_the_cpu_engine() {
    check("tiny-llama", false);
}

#[test]
fn tiny_qwen2_gradients_equal_the_cpu_engine_with_biases_and_tied_head() {
    check("tiny-qwen2", false);
}

#[test]
fn gradient_checkpointing_gives_the_same_gradients() {
    check("tiny-qwen2", true);
}
