//! `reinforge bench rollout|train`: throughput and peak memory as one JSON object, with the
//! same settings as `bench/compare_hf.py` so the ratio against PyTorch is reproducible.

use super::{load_model, peak_rss_mb};
use anyhow::{bail, Context, Result};
use burn::tensor::Tensor;
use clap::{Args, Subcommand};
use rand::{Rng, SeedableRng};
use reinforge_engine::{generate_with, token_logprobs, CausalLm, Decoder, ForwardInput, OptimConfig, SamplingParams, Trainer};
use reinforge_tokenizer::RenderOptions;
use reinforge_kernels::Isa;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Batched sampling: `batch` prompts × `max_new_tokens`, no early stop.
    Rollout(RolloutArgs),
    /// One training step (forward, backward, AdamW) on `batch` × `seq_len` tokens.
    Train(TrainArgs),
    /// A retrieval server's queries/s and p50/p99 latency at 1, 16 and 256 clients.
    Retrieval(super::bench_retrieval::RetrievalArgs),
}

#[derive(Args)]
pub struct RolloutArgs {
    #[arg(long)]
    model: String,
    #[arg(long, default_value_t = 16)]
    batch: usize,
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// JSON list of user messages (defaults to bench/prompts.json's built-in twin).
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// `cpu`, or `cuda[:N]` / `cuda-emu` for the CUDA engine.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Storage type on the CUDA engine (`bf16` or `f32`).
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Fraction of GPU memory the rollout may fill (CUDA engine).
    #[arg(long, default_value_t = 0.9)]
    gpu_memory_utilization: f64,
    /// Decode kernel by kernel instead of replaying each step as a CUDA graph (CUDA engine).
    #[arg(long)]
    enforce_eager: bool,
    /// Read each decode step's tokens before queuing the next, instead of queuing it first
    /// (CUDA engine; `rollout.async_scheduling = false`).
    #[arg(long)]
    no_async_scheduling: bool,
    /// Nucleus sampling (1 = the full distribution, as the PyTorch side samples).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Top-k sampling (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// After the timed runs, one more, eager, with every kernel, GEMM and copy timed: the
    /// table to stderr, the whole profile as JSON to this file (CUDA engine).
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// After the timed runs, what each op of a decode step costs as the step runs (graphs,
    /// dependent launches and all): the timed runs again with that op launched twice, the
    /// extra time per call; one more JSON line (CUDA engine).
    #[arg(long)]
    decode_breakdown: bool,
}

impl RolloutArgs {
    /// The benchmark's sampling: temperature 1, this top-p and top-k, no stop ids (every row
    /// generates exactly `max_new_tokens`, like the PyTorch side); the engines check them.
    fn sampling(&self) -> SamplingParams {
        SamplingParams { temperature: 1.0, top_p: self.top_p, top_k: self.top_k, max_new_tokens: self.max_new_tokens, seed: 1, ..Default::default() }
    }
}

#[derive(Args)]
pub struct TrainArgs {
    #[arg(long)]
    model: String,
    #[arg(long, default_value_t = 8)]
    batch: usize,
    #[arg(long, default_value_t = 256)]
    seq_len: usize,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// `cpu`, or `cuda[:N]` / `cuda-emu` for the CUDA engine.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Storage type on the CUDA engine (`bf16` or `f32`).
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Recompute each layer's activations in the backward (CUDA engine).
    #[arg(long)]
    gradient_checkpointing: bool,
    /// After the timed steps, one more with every kernel, GEMM and copy timed: the table to
    /// stderr, the whole profile as JSON to this file (CUDA engine).
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// Train a fresh LoRA adapter of this rank on every linear (alpha = 2 × rank) instead of
    /// every weight.
    #[arg(long, value_name = "R")]
    lora_rank: Option<usize>,
}

/// bench/prompts.json, compiled in so the bench runs anywhere and stays identical to the
/// list `bench/compare_hf.py` uses.
const DEFAULT_PROMPTS_JSON: &str = include_str!("../../../../bench/prompts.json");

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(cmd: BenchCmd) -> Result<ExitCode> {
    match cmd {
        BenchCmd::Rollout(a) => rollout(a),
        BenchCmd::Train(a) => train(a),
        BenchCmd::Retrieval(a) => super::bench_retrieval::run(a),
    }
}

fn rollout(a: RolloutArgs) -> Result<ExitCode> {
    if a.repeats == 0 || a.batch == 0 {
        bail!("--repeats and --batch must be at least 1");
    }
    let questions: Vec<String> = match &a.prompts {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_str(&text).with_context(|| format!("{}: expected a JSON list of strings", p.display()))?
        }
        None => serde_json::from_str(DEFAULT_PROMPTS_JSON).context("bench/prompts.json (compiled in) is not a list of strings")?,
    };
    if questions.is_empty() {
        bail!("no prompts");
    }
    if super::bench_cuda::is_cuda(&a.device) {
        let c = super::bench_cuda::Common { model: &a.model, device: &a.device, dtype: &a.dtype, repeats: a.repeats, profile: a.profile.as_deref() };
        let opts = super::bench_cuda::RolloutOpts {
            gpu_memory_utilization: a.gpu_memory_utilization,
            enforce_eager: a.enforce_eager,
            async_scheduling: !a.no_async_scheduling,
            decode_breakdown: a.decode_breakdown,
        };
        return super::bench_cuda::rollout(&c, a.batch, &a.sampling(), &questions, &opts);
    }
    if a.profile.is_some() {
        bail!("--profile times the CUDA engine's kernels: use it with --device cuda (or cuda-emu)");
    }
    if a.decode_breakdown {
        bail!("--decode-breakdown times the CUDA engine's decode step: use it with --device cuda (or cuda-emu)");
    }
    let loaded = load_model(&a.model, &a.device, false)?;
    let prompts = (0..a.batch)
        .map(|i| {
            let msgs = [json!({"role": "user", "content": questions[i % questions.len()]})];
            loaded.tok.encode_chat(&msgs, &RenderOptions::generation(true))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // No stop ids: every row generates exactly max_new_tokens, like the PyTorch side.
    let params = a.sampling();
    // Packing the weights for the rollout engine is paid at load (like loading the model for
    // PyTorch's generate), and the in-place repack once per training step's weight sync:
    // both reported apart, not in tokens/s.
    let t0 = Instant::now();
    let mut decoder = Decoder::new(&loaded.model)?;
    let pack_secs = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    decoder.load_weights(&loaded.model)?;
    let sync_secs = t0.elapsed().as_secs_f64();
    generate_with(&decoder, &prompts, &SamplingParams { max_new_tokens: 4, ..params.clone() }, None)?;
    let mut times = Vec::new();
    let mut new_tokens = 0;
    for _ in 0..a.repeats {
        let t0 = Instant::now();
        let (_, stats) = generate_with(&decoder, &prompts, &params, None)?;
        times.push(t0.elapsed().as_secs_f64());
        new_tokens = stats.new_tokens;
    }
    let secs = median(times);
    println!(
        "{}",
        json!({"bench": "rollout", "impl": "reinforge", "model": loaded.dir, "device": a.device, "batch": a.batch,
            "prompt_tokens": prompts.iter().map(Vec::len).sum::<usize>(), "new_tokens": a.max_new_tokens,
            "generated_tokens": new_tokens, "seconds": secs, "tokens_per_s": new_tokens as f64 / secs,
            "pack_seconds": pack_secs, "weight_sync_seconds": sync_secs, "peak_rss_mb": peak_rss_mb(), "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1), "top_p": a.top_p, "top_k": a.top_k,
            "repeats": a.repeats, "isa": Isa::active().name(), "cpu": cpu_model()})
    );
    Ok(ExitCode::SUCCESS)
}

fn train(a: TrainArgs) -> Result<ExitCode> {
    if a.repeats == 0 || a.batch == 0 || a.seq_len < 2 {
        bail!("--repeats and --batch must be at least 1, --seq-len at least 2");
    }
    if super::bench_cuda::is_cuda(&a.device) {
        let c = super::bench_cuda::Common { model: &a.model, device: &a.device, dtype: &a.dtype, repeats: a.repeats, profile: a.profile.as_deref() };
        return super::bench_cuda::train(&c, a.batch, a.seq_len, a.gradient_checkpointing, a.lora_rank);
    }
    if a.profile.is_some() {
        bail!("--profile times the CUDA engine's kernels: use it with --device cuda (or cuda-emu)");
    }
    let loaded = load_model(&a.model, &a.device, true)?;
    let vocab = loaded.model.config.vocab_size as u32;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let ids: Vec<Vec<u32>> = (0..a.batch).map(|_| (0..a.seq_len).map(|_| rng.random_range(0..vocab)).collect()).collect();
    let input = ForwardInput::from_mask(ids, vec![vec![true; a.seq_len]; a.batch]);
    let n = (a.batch * (a.seq_len - 1)) as f64;
    let model = match a.lora_rank {
        Some(r) => loaded.model.with_fresh_lora(&reinforge_engine::LoraConfig::new(r, 2.0 * r as f64, &["all-linear".into()]).map_err(anyhow::Error::msg)?, 0)?,
        None => loaded.model,
    };
    // The factors' count without copying the model to the host.
    let trained = if model.lora.is_some() { model.lora_params() } else { burn::module::Module::num_params(&model) };
    let mut trainer = Trainer::new(model, OptimConfig { weight_decay: 0.01, grad_clip: None, ..Default::default() })?;
    let step = |trainer: &mut Trainer<CausalLm>| -> Result<f64> {
        let t0 = Instant::now();
        trainer.step(1, 1e-5, |_, m| {
            let lp: Tensor<2> = token_logprobs(m, &input, 1.0, false)?.logprobs;
            Ok::<_, reinforge_engine::EngineError>(lp.sum().neg().div_scalar(n))
        })?;
        Ok(t0.elapsed().as_secs_f64())
    };
    step(&mut trainer)?;
    let times = (0..a.repeats).map(|_| step(&mut trainer)).collect::<Result<Vec<_>>>()?;
    let secs = median(times);
    println!(
        "{}",
        json!({"bench": "train", "impl": "reinforge", "model": loaded.dir, "device": a.device, "batch": a.batch,
            "seq_len": a.seq_len, "seconds": secs, "tokens_per_s": (a.batch * a.seq_len) as f64 / secs,
            "lora_rank": a.lora_rank, "trained_params": trained,
            "peak_rss_mb": peak_rss_mb(), "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "repeats": a.repeats, "isa": Isa::active().name(), "cpu": cpu_model(),
            "note": "isa is the path of the linears' and LM head's matmuls and Reinforge's own kernels; attention and burn's elementwise ops pick their own"})
    );
    Ok(ExitCode::SUCCESS)
}

/// The CPU's model name (`/proc/cpuinfo`), for benchmark records.
pub(super) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}
