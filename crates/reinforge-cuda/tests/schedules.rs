//! Races inside a block, caught without a GPU. The emulator runs a block's threads one after
//! another between barriers; a kernel missing a `__syncthreads()` reads stale or unwritten
//! shared memory only when the reader happens to run before the writer. Even blocks run their
//! threads first-to-last and odd blocks last-to-first, and the mirrored schedule swaps them,
//! so every block of every launch below runs in both orders across the two passes: a race-free
//! kernel (our only atomics are integer adds, whose sums do not depend on order) gives the same
//! bits, a racy one does not. Shared memory
//! starts as NaN bytes, so reading what was never written shows up too.
//!
//! It runs every kernel family: the training step (forward, backward with recomputation,
//! AdamW) in f32 and bf16 — the tiny models' head dim 16 takes the tensor-core attention in
//! bf16 — the value head, both attention families at head dims 64 and 128 (with a prompt
//! shared by three samples), and sampled
//! rollouts (prefill, paged flash-decoding, sampling, block copies), eager and from graphs.
//!
//! Checked to fail: with the `__syncthreads()` after the key/value tile loads of the
//! tensor-core forward removed, the two passes differ (and produce NaN).

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use reinforge_cuda::gpu::set_emulator_schedule_mirrored;
use reinforge_cuda::ops::{AttentionKernels, Ops};
use reinforge_cuda::{DType, DeviceModel, Gpu, GpuKind, Head, Packed, RowGrads, Rollout, TrainState};
use reinforge_engine::weights::WeightSet;
use reinforge_engine::{ModelConfig, OptimConfig, SamplingParams};
use std::sync::Arc;

/// Named results as raw bits, in the order they were produced.
#[derive(Default)]
struct Bits(Vec<(String, Vec<u32>)>);

impl Bits {
    fn f32s(&mut self, name: impl Into<String>, v: &[f32]) {
        self.0.push((name.into(), v.iter().map(|x| x.to_bits()).collect()));
    }
}

fn texts() -> Vec<Vec<u32>> {
    ["Hello, world! The quick brown fox jumps over the lazy dog again and again.", "abc", "Reinforge trains on GPUs."]
        .iter()
        .map(|s| s.bytes().map(u32::from).collect())
        .collect()
}

fn train_step(gpu: &Arc<Gpu>, name: &str, dt: DType, value_head: bool, out: &mut Bits) {
    let dir = fixtures().join("models").join(name);
    let cfg = ModelConfig::from_dir(&dir).unwrap();
    let mut w = WeightSet::load_dir(&dir).unwrap();
    let mut st = TrainState::from_weights(gpu, cfg.clone(), &mut w, dt, value_head, OptimConfig::default(), true).unwrap();
    let seqs = texts();
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let packed = Packed::new(&refs, cfg.vocab_size, cfg.max_position_embeddings).unwrap();
    let (rows, targets) = packed.next_token_rows();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let a: Vec<f32> = rows.iter().map(|_| rng.random_range(-1.0..1.0)).collect();
    let b: Vec<f32> = rows.iter().map(|_| rng.random_range(-0.5..0.5)).collect();
    st.zero_grads().unwrap();
    let head = if value_head { Head::Value } else { Head::Lm { targets: &targets, temperature: 0.7 } };
    let entropy = if value_head { vec![] } else { b };
    let row_out = st.micro(&packed, &rows, head, |_| Ok::<_, reinforge_cuda::CudaError>(RowGrads { value: a, entropy })).unwrap();
    let tag = format!("{name} {dt:?} value_head={value_head}");
    out.f32s(format!("{tag}: head values"), &row_out.value);
    out.f32s(format!("{tag}: entropies"), &row_out.entropy);
    for (k, g) in st.gradients().unwrap() {
        out.f32s(format!("{tag}: gradient of {k}"), &g.data);
    }
    let stats = st.finish(1e-3, 1, None).unwrap();
    assert!(stats.applied, "{tag}: the update was skipped (grad norm {})", stats.grad_norm);
    for (k, t) in st.to_hf_tensors().unwrap() {
        out.f32s(format!("{tag}: {k} after AdamW"), &t.data);
    }
}

fn attention(gpu: &Arc<Gpu>, hd: usize, dt: DType, kernels: AttentionKernels, out: &mut Bits) {
    let (nh, kvh) = (4, 2);
    // Plain sequences, and a 70-token prompt continued by three samples (shared prefix).
    let seqs: Vec<Vec<u32>> = [1usize, 37, 150, 70, 1, 37, 65].iter().map(|&l| vec![1; l]).collect();
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let packed = Packed::with_prefixes(&refs, &[None, None, None, None, Some(3), Some(3), Some(3)], 2, 256).unwrap();
    let n = packed.len();
    let ld = (nh + 2 * kvh) * hd;
    let ops = Ops { attention: kernels, ..Ops::new(gpu, dt) };
    let tiles = packed.tiles(ops.attention_tile(hd));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(hd as u64);
    let mut fill = |len: usize, r: f32| {
        let v: Vec<f32> = (0..len).map(|_| rng.random_range(-r..r)).collect();
        match dt {
            DType::F32 => gpu.upload_new(&v, "test").unwrap(),
            DType::Bf16 => gpu.upload_new(&v.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect::<Vec<u16>>(), "test").unwrap(),
        }
    };
    let (qkv, dout) = (fill(n * ld, 2.0), fill(n * nh * hd, 1.0));
    let tiles_d = gpu.upload_new(&tiles.data, "tiles").unwrap();
    let es = dt.size();
    let o = gpu.alloc(n * nh * hd * es, "out", "").unwrap();
    let lse = gpu.alloc(n * nh * 4, "lse", "").unwrap();
    let dqkv = gpu.alloc(n * ld * es, "dqkv", "").unwrap();
    let delta = gpu.alloc(n * nh * 4, "delta", "").unwrap();
    let n_tiles = tiles.count;
    ops.attention(o.ptr, lse.ptr, qkv.ptr, tiles_d.ptr, n_tiles, n, nh, kvh, hd, ld).unwrap();
    ops.attention_bwd(dqkv.ptr, delta.ptr, qkv.ptr, o.ptr, dout.ptr, lse.ptr, tiles_d.ptr, n_tiles, n, nh, kvh, hd, ld).unwrap();
    let tag = format!("attention hd {hd} {dt:?} {kernels:?}");
    let get = |p, len| match dt {
        DType::F32 => gpu.to_vec::<f32>(p, len).unwrap(),
        DType::Bf16 => gpu.to_vec::<u16>(p, len).unwrap().into_iter().map(|b| half::bf16::from_bits(b).to_f32()).collect(),
    };
    out.f32s(format!("{tag}: out"), &get(o.ptr, n * nh * hd));
    out.f32s(format!("{tag}: lse"), &gpu.to_vec::<f32>(lse.ptr, n * nh).unwrap());
    out.f32s(format!("{tag}: dqkv"), &get(dqkv.ptr, n * ld));
}

fn rollouts(gpu: &Arc<Gpu>, name: &str, dt: DType, out: &mut Bits) {
    // Longer positions than the fixture's 128 (RoPE has no table to outgrow), so a 300-token
    // prompt gives decode splits of several key chunks each.
    let dir = fixtures().join("models").join(name);
    let cfg = ModelConfig { max_position_embeddings: 512, ..ModelConfig::from_dir(&dir).unwrap() };
    let m = DeviceModel::from_weights(gpu, cfg, &mut WeightSet::load_dir(&dir).unwrap(), dt, false).unwrap();
    let mut prompts = texts();
    prompts.push(prompts.concat().into_iter().cycle().take(300).collect());
    // f32 decodes eagerly with top-k and top-p (their radix passes); bf16 from graphs at a
    // plain temperature (the sampling kernel reads f32 logits whatever the model's storage).
    let (eager, params) = match dt {
        DType::F32 => (true, SamplingParams { n: 2, temperature: 0.9, top_p: 0.9, top_k: 50, max_new_tokens: 24, seed: 9, ..Default::default() }),
        DType::Bf16 => (false, SamplingParams { n: 3, temperature: 0.9, max_new_tokens: 40, seed: 9, ..Default::default() }),
    };
    let mut engine = Rollout::new(0.02);
    engine.enforce_eager = eager;
    let (outs, _) = engine.generate(&m, &prompts, &params, None).unwrap();
    for c in outs {
        let tag = format!("rollout {name} {dt:?} eager={eager} prompt {} sample {}", c.prompt_index, c.sample_index);
        out.0.push((format!("{tag}: tokens"), c.token_ids.clone()));
        out.f32s(format!("{tag}: log-probs"), &c.logprobs);
    }
}

fn everything(mirrored: bool) -> Bits {
    set_emulator_schedule_mirrored(mirrored);
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let mut out = Bits::default();
    let t = std::time::Instant::now();
    let lap = |what: &str| eprintln!("{what}: {:.1} s", t.elapsed().as_secs_f64());
    for dt in [DType::F32, DType::Bf16] {
        train_step(&gpu, "tiny-qwen2", dt, false, &mut out);
        lap("train");
        rollouts(&gpu, "tiny-llama", dt, &mut out);
        lap("rollout");
    }
    train_step(&gpu, "tiny-llama", DType::Bf16, true, &mut out);
    lap("value");
    for hd in [64, 128] {
        attention(&gpu, hd, DType::Bf16, AttentionKernels::TensorCores, &mut out);
        lap("tc");
        attention(&gpu, hd, DType::Bf16, AttentionKernels::CudaCores, &mut out);
        lap("cc");
    }
    attention(&gpu, 64, DType::F32, AttentionKernels::CudaCores, &mut out);
    lap("f32");
    out
}

#[test]
fn every_kernel_gives_the_same_bits_under_both_thread_schedules() {
    let a = everything(false);
    let b = everything(true);
    set_emulator_schedule_mirrored(false);
    assert_eq!(a.0.len(), b.0.len());
    let mut values = 0;
    for ((name, x), (name_b, y)) in a.0.iter().zip(&b.0) {
        assert_eq!(name, name_b);
        assert_eq!(x.len(), y.len(), "{name}: lengths differ between the schedules");
        if let Some(i) = x.iter().zip(y).position(|(p, q)| p != q) {
            panic!("{name}: element {i} differs between the two thread schedules ({:#x} vs {:#x}): a race inside a block (missing barrier)", x[i], y[i]);
        }
        // Token ids are integers; everything else is f32 bits, which must be finite (NaN
        // would be shared memory read before it was written, in both schedules alike).
        if !name.ends_with("tokens") {
            if let Some(i) = x.iter().position(|&v| !f32::from_bits(v).is_finite()) {
                panic!("{name}: element {i} is {} under both schedules", f32::from_bits(x[i]));
            }
        }
        values += x.len();
    }
    eprintln!("{} results, {values} values: identical under both thread schedules", a.0.len());
}
