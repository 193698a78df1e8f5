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
    check_with(name, checkpointing, None)
}

/// `head_chunk_rows`: the LM head's rows per chunk (None: the engine's choice, one chunk here).
fn check_with(name: &str, checkpointing: bool, head_chunk_rows: Option<usize>) {
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
    st.model.head_chunk_rows = head_chunk_rows;
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

/// The LM head in chunks of 7 rows (the last one short): each chunk's weight gradient adds to
/// the last, the rows' log-probs, entropies and input gradients land at their own offsets.
#[test]
fn the_lm_head_in_chunks_gives_the_same_gradients() {
    check_with("tiny-qwen2", false, Some(7));
}

#[test]
fn gradient_checkpointing_gives_the_same_gradients() {
    check("tiny-qwen2", true);
}

/// Samples packed after one copy of their prompt (`Packed::with_prefixes`) against each packed
/// with its own copy: the same log-probs, entropies and weight gradients, up to the order of
/// additions — in f32 (CUDA-core attention) and bf16 (tensor cores, head dim 16).
fn shared_vs_separate(dt: DType, tol_out: f64, tol_grad: f64) {
    let dir = fixtures().join("models").join("tiny-qwen2");
    let cfg = ModelConfig::from_dir(&dir).unwrap();
    let prompt: Vec<u32> = "Reinforge shares prompts.".bytes().map(u32::from).collect();
    let responses: Vec<Vec<u32>> = ["Yes, it does!", "ok", "Twenty tokens or so, longer than the others."].iter().map(|s| s.bytes().map(u32::from).collect()).collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let n_tok: usize = responses.iter().map(Vec::len).sum();
    let a: Vec<f32> = (0..n_tok).map(|_| rng.random_range(-1.0..1.0)).collect();
    let b: Vec<f32> = (0..n_tok).map(|_| rng.random_range(-0.5..0.5)).collect();
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let run = |shared: bool| {
        let (mut seqs, mut prefix, mut rows, mut targets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut start = 0;
        let head = if shared { prompt.len() - 1 } else { 0 };
        if shared {
            seqs.push(prompt[..head].to_vec());
            prefix.push(None);
            start = head;
        }
        for r in &responses {
            let own = &prompt[head..];
            for (j, &t) in r.iter().enumerate() {
                rows.push(start + own.len() + j - 1);
                targets.push(t);
            }
            start += own.len() + r.len();
            seqs.push([own, r.as_slice()].concat());
            prefix.push(shared.then_some(0));
        }
        let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
        let packed = Packed::with_prefixes(&refs, &prefix, cfg.vocab_size, cfg.max_position_embeddings).unwrap();
        let mut w = WeightSet::load_dir(&dir).unwrap();
        let mut st = TrainState::from_weights(&gpu, cfg.clone(), &mut w, dt, false, OptimConfig::default(), false).unwrap();
        st.zero_grads().unwrap();
        let head = Head::Lm { targets: &targets, temperature: 0.9 };
        let out = st
            .micro(&packed, &rows, head, |_| Ok::<_, reinforge_cuda::CudaError>(RowGrads { value: a.clone(), entropy: b.clone() }))
            .unwrap();
        (packed.len(), out, st.gradients().unwrap())
    };
    let (n_sep, sep, g_sep) = run(false);
    let (n_sh, sh, g_sh) = run(true);
    assert_eq!(n_sh + 2 * (prompt.len() - 1), n_sep, "the prompt is packed once instead of three times");
    let (e_lp, e_ent) = (rel_err(&sh.value, &sep.value), rel_err(&sh.entropy, &sep.entropy));
    assert!(e_lp < tol_out && e_ent < tol_out, "{dt:?}: log-probs {e_lp:.2e}, entropies {e_ent:.2e}");
    let mut worst = (0.0, String::new());
    for (k, want) in &g_sep {
        let e = rel_err(&g_sh[k].data, &want.data);
        if e > worst.0 {
            worst = (e, k.clone());
        }
    }
    eprintln!("{dt:?}: shared prompt vs separate copies: log-probs {e_lp:.1e}, entropies {e_ent:.1e}, worst gradient {:.1e} ({})", worst.0, worst.1);
    assert!(worst.0 < tol_grad, "{dt:?}: worst gradient rel err {:.2e} at {}", worst.0, worst.1);
}

#[test]
fn a_prompt_packed_once_for_its_samples_gives_the_same_gradients() {
    shared_vs_separate(DType::F32, 1e-6, 1e-5);
    shared_vs_separate(DType::Bf16, 1e-3, 1e-2);
}
