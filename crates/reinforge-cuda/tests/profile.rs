//! The op profile (`Gpu::profile`, what `reinforge bench … --profile` prints) on a training
//! micro-batch, on the emulator. The GEMMs of a step are known in closed form — every layer
//! weight multiplies each token once forward, once for the input gradient and once for its
//! own gradient, and with gradient checkpointing each layer's forward runs once more; the LM
//! head does the same for the rows with a target, plus its logits once more in the backward
//! (the fused head never keeps [rows, vocab] logits) — so the profile's GEMM FLOPs must equal
//! that count: a check of the profile's accounting, and that the step does no GEMM twice.

mod common;
use common::*;
use reinforge_cuda::{DType, Gpu, GpuKind, Head, Packed, RowGrads, TrainState};
use reinforge_engine::weights::WeightSet;
use reinforge_engine::{ModelConfig, OptimConfig};

fn check(name: &str, checkpointing: bool) {
    let dir = fixtures().join("models").join(name);
    let cfg = ModelConfig::from_dir(&dir).unwrap();
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let mut w = WeightSet::load_dir(&dir).unwrap();
    let mut st = TrainState::from_weights(&gpu, cfg.clone(), &mut w, DType::F32, false, OptimConfig::default(), checkpointing).unwrap();
    let text = ["Profiles count every GEMM of the step once.", "ab", "Reinforge trains on GPUs."];
    let seqs: Vec<Vec<u32>> = text.iter().map(|s| s.bytes().map(u32::from).collect()).collect();
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let packed = Packed::new(&refs, cfg.vocab_size, cfg.max_position_embeddings).unwrap();
    let (rows, targets) = packed.next_token_rows();
    let n = rows.len();
    let ((), prof) = gpu
        .profile(|| {
            st.zero_grads()?;
            st.micro(&packed, &rows, Head::Lm { targets: &targets, temperature: 1.0 }, |_| {
                Ok::<_, reinforge_cuda::CudaError>(RowGrads { value: vec![1.0; n], entropy: vec![0.5; n] })
            })?;
            st.finish(1e-3, 1, None).map(|_| ())
        })
        .unwrap();

    let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let (nh, kvh, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let layer = h * (nh + 2 * kvh) * hd + nh * hd * h + h * 2 * i + i * h;
    let tokens: usize = seqs.iter().map(Vec::len).sum();
    let passes = if checkpointing { 8 } else { 6 };
    let want = (passes * cfg.num_layers * layer * tokens + 8 * v * h * n) as f64;
    let got: f64 = prof.ops.iter().filter(|o| o.op.starts_with("gemm ")).map(|o| o.flops).sum();
    assert_eq!(got, want, "{name} (checkpointing {checkpointing}): GEMM FLOPs of one step\n{}", prof.table(60));

    assert_eq!(prof.launches, prof.ops.iter().map(|o| o.calls).sum::<usize>());
    assert!(prof.busy_seconds > 0.0 && prof.idle_seconds >= 0.0, "{}", prof.table(5));
    // Either forward kernel (a warp or a block per row).
    let norms: usize = prof.ops.iter().filter(|o| o.op == "rmsnorm_fwd_f32" || o.op == "rmsnorm_fwd_rows_f32").map(|o| o.calls).sum();
    let layers_fwd = if checkpointing { 2 } else { 1 };
    assert_eq!(norms, 2 * cfg.num_layers * layers_fwd + 1, "{name}: RMSNorm forwards\n{}", prof.table(60));
    // Profiling is off again: the next op is not timed, and a second profile may start.
    let ((), again) = gpu.profile(|| st.zero_grads()).unwrap();
    assert_eq!(again.launches, again.ops.iter().map(|o| o.calls).sum::<usize>());
    assert!(again.launches < prof.launches);
}

#[test]
fn a_training_step_runs_each_gemm_once_per_pass() {
    check("tiny-llama", false);
    check("tiny-qwen2", false);
}

#[test]
fn gradient_checkpointing_recomputes_each_layer_forward_once() {
    check("tiny-llama", true);
}

#[test]
fn a_long_profile_is_folded_in_batches_and_loses_no_op() {
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let buf = gpu.alloc(256, "a test buffer", "").unwrap();
    let data = [7u32; 64];
    let ((), prof) = gpu
        .profile(|| {
            for _ in 0..5000 {
                gpu.zero(buf.ptr, 256)?;
            }
            gpu.upload(buf.ptr, &data)
        })
        .unwrap();
    assert_eq!(prof.launches, 5001);
    let memset = prof.ops.iter().find(|o| o.op == "memset").expect("memsets timed");
    assert_eq!((memset.calls, memset.bytes), (5000, 5000.0 * 256.0));
    assert_eq!(gpu.to_vec::<u32>(buf.ptr, 64).unwrap(), data);
}

#[test]
fn a_failed_or_panicking_profile_ends_and_the_next_one_starts_clean() {
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let buf = gpu.alloc(256, "a test buffer", "").unwrap();
    let failed = gpu.profile(|| {
        gpu.zero(buf.ptr, 256)?;
        Err::<(), _>(reinforge_cuda::CudaError::Request("the closure failed".into()))
    });
    assert!(matches!(failed, Err(reinforge_cuda::CudaError::Request(m)) if m == "the closure failed"));
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = gpu.profile(|| {
            gpu.zero(buf.ptr, 256)?;
            panic!("inside a profile");
            #[allow(unreachable_code)]
            Ok::<(), reinforge_cuda::CudaError>(())
        });
    }));
    assert!(panicked.is_err());
    // Neither left profiling on nor its ops behind.
    let ((), prof) = gpu.profile(|| gpu.zero(buf.ptr, 128)).unwrap();
    assert_eq!(prof.launches, 1);
    assert_eq!(prof.ops[0].bytes, 128.0);
}
