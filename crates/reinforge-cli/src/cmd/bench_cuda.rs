//! `reinforge bench rollout|train --device cuda`: the CUDA engine's throughput with the figures
//! that say how close it is to the hardware — the decode step's fraction of the HBM roofline,
//! the train step's model FLOPs utilisation — and peak device memory. One JSON object, like
//! the CPU benches, so `bench/compare_hf.py --device cuda` can put PyTorch's beside it.

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use reinforge_cuda::{DType, DecodeOp, DeviceModel, Gpu, Head, Packed, RowGrads, Rollout, TrainState};
use reinforge_engine::weights::WeightSet;
use reinforge_engine::{ModelConfig, OptimConfig, SamplingParams};
use reinforge_tokenizer::{ChatTokenizer, RenderOptions};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;
use super::bench::median;

/// What the rollout and train benches share.
pub struct Common<'a> {
    pub model: &'a str,
    pub device: &'a str,
    pub dtype: &'a str,
    pub repeats: usize,
    /// Where to write a profile of one more run (`--profile`).
    pub profile: Option<&'a Path>,
}

struct Subject {
    dir: PathBuf,
    cfg: ModelConfig,
    weights: WeightSet,
    random: bool,
    gpu: Arc<Gpu>,
    dt: DType,
}

fn open(c: &Common<'_>) -> Result<Subject> {
    let kind = super::cuda::gpu_kind(c.device)?;
    let dt: DType = c.dtype.parse().map_err(|e| anyhow::anyhow!("--dtype {}: {e}", c.dtype))?;
    let dir = reinforge_assets::resolve_model(c.model)?;
    let cfg = ModelConfig::from_dir(&dir)?;
    // Before the weights, which take seconds (a random 1.5B: 15 s on 2 cores): a machine
    // without a GPU says so at once.
    let gpu = Gpu::open(kind)?;
    // A directory with only config.json is benched with random weights (the shape is what
    // costs time), as `actor.init = "random"` would train it.
    let (tensors, random) = reinforge_engine::model::weights_or_random(&dir, &cfg, 0).with_context(|| format!("loading {}", dir.display()))?;
    let weights = WeightSet::from_map(if random { "random init" } else { "model weights" }, tensors);
    Ok(Subject { dir, cfg, weights, random, gpu, dt })
}

/// Prompts: the bench's questions through the chat template when the model has a tokenizer,
/// else `prompt_len` random ids.
fn prompts(dir: &Path, cfg: &ModelConfig, batch: usize, questions: &[String], prompt_len: usize) -> Result<Vec<Vec<u32>>> {
    if let Ok(tok) = ChatTokenizer::load_from_dir(dir) {
        return (0..batch)
            .map(|i| {
                let msgs = [json!({"role": "user", "content": questions[i % questions.len()]})];
                Ok(tok.encode_chat(&msgs, &RenderOptions::generation(true))?)
            })
            .collect();
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let top = cfg.vocab_size.saturating_sub(256).max(2) as u32;
    Ok((0..batch).map(|_| (0..prompt_len).map(|_| rng.random_range(1..top)).collect()).collect())
}

/// How `bench rollout` runs the CUDA engine.
pub struct RolloutOpts {
    /// Fraction of the GPU's memory the rollout may fill.
    pub gpu_memory_utilization: f64,
    /// Decode kernel by kernel, without graphs.
    pub enforce_eager: bool,
    /// Queue each decode step before reading the last one's tokens.
    pub async_scheduling: bool,
    /// After the timed runs, each decode op's cost in a step (`--decode-breakdown`).
    pub decode_breakdown: bool,
}

/// Medians over the timed runs of a rollout and of its prefill alone, and what the last run did.
struct Timed {
    secs: f64,
    prefill_secs: f64,
    new_tokens: usize,
    graph_steps: usize,
    decode_steps: usize,
    tokens: Vec<Vec<u32>>,
}

impl Timed {
    /// Seconds of decoding per decode step it ran (the whole rollout's less its prefill's).
    fn step_secs(&self) -> f64 {
        (self.secs - self.prefill_secs).max(1e-9) / self.decode_steps.max(1) as f64
    }
}

/// `repeats` timed rollouts, each after a one-token rollout that times the prefill alone.
fn timed_runs(engine: &mut Rollout, model: &DeviceModel, prompts: &[Vec<u32>], params: &SamplingParams, repeats: usize) -> Result<Timed> {
    let first = SamplingParams { max_new_tokens: 1, ..params.clone() };
    let (mut times, mut prefill) = (Vec::new(), Vec::new());
    let mut last = Timed { secs: 0.0, prefill_secs: 0.0, new_tokens: 0, graph_steps: 0, decode_steps: 0, tokens: Vec::new() };
    for _ in 0..repeats {
        let t = Instant::now();
        engine.generate(model, prompts, &first, None)?;
        prefill.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let (out, st) = engine.generate(model, prompts, params, None)?;
        times.push(t.elapsed().as_secs_f64());
        last = Timed { new_tokens: st.new_tokens, graph_steps: engine.graph_steps, decode_steps: st.decode_steps, tokens: out.into_iter().map(|c| c.token_ids).collect(), ..last };
    }
    Ok(Timed { secs: median(times), prefill_secs: median(prefill), ..last })
}

/// `bench rollout` on the CUDA engine.
pub fn rollout(c: &Common<'_>, batch: usize, params: &SamplingParams, questions: &[String], o: &RolloutOpts) -> Result<ExitCode> {
    let max_new_tokens = params.max_new_tokens;
    if o.decode_breakdown && max_new_tokens < 3 {
        bail!("--decode-breakdown times decode steps: use --max-new-tokens 3 or more");
    }
    let (enforce_eager, async_scheduling) = (o.enforce_eager, o.async_scheduling);
    let mut s = open(c)?;
    let t0 = Instant::now();
    let model = DeviceModel::from_weights(&s.gpu, s.cfg.clone(), &mut s.weights, s.dt, false)?;
    let load_secs = t0.elapsed().as_secs_f64();
    let prompts = prompts(&s.dir, &s.cfg, batch, questions, 32)?;
    let mut engine = Rollout::new(o.gpu_memory_utilization).eager(enforce_eager).overlapped(async_scheduling);
    let params = params.clone();
    // A warm-up as long as the timed runs: their KV cache, decode buffers and graphs are then
    // the ones it made (a shorter one's would be too small, and the first timed run would
    // make them again).
    engine.generate(&model, &prompts, &params, None)?;
    s.gpu.reset_peak();
    let base = timed_runs(&mut engine, &model, &prompts, &params, c.repeats)?;
    let (new_tokens, graph_steps, decode_steps) = (base.new_tokens, base.graph_steps, base.decode_steps);
    // What our allocator held at most (weights, KV cache, buffers, prefill activations), as
    // torch.cuda.max_memory_allocated counts PyTorch's: not the CUDA context.
    let peak = s.gpu.peak_allocated();
    let (secs, prefill_secs) = (base.secs, base.prefill_secs);
    let decode_secs = (secs - prefill_secs).max(1e-9);
    // Bytes a decode step must read: every weight the step multiplies with (the embedding
    // table only as the tied LM head: its lookup reads a row per sequence), and each live
    // row's keys and values so far.
    let cfg = &s.cfg;
    let size = s.dt.size() as f64;
    let weight_bytes = reinforge_cuda::model::multiplying_params(cfg, &model.layout) as f64 * size;
    let kv_per_token = (2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim) as f64 * size;
    let steps = max_new_tokens.saturating_sub(1);
    let ctx_sum: f64 = prompts.iter().map(|p| (1..=steps).map(|s| (p.len() + s) as f64).sum::<f64>()).sum();
    let decode_bytes = steps as f64 * weight_bytes + ctx_sum * kv_per_token;
    let bw = decode_bytes / decode_secs;
    let pk = s.gpu.info.peaks();
    println!(
        "{}",
        json!({"bench": "rollout", "impl": "reinforge", "engine": "cuda", "model": s.dir, "init": if s.random { "random" } else { "weights" },
            "device": s.gpu.info.name, "dtype": s.dt.suffix(), "batch": batch, "prompt_tokens": prompts.iter().map(Vec::len).sum::<usize>(),
            "new_tokens": max_new_tokens, "generated_tokens": new_tokens, "seconds": secs, "tokens_per_s": new_tokens as f64 / secs,
            "prefill_seconds": prefill_secs, "decode_step_ms": decode_secs / steps.max(1) as f64 * 1e3,
            "decode_bytes_per_s": bw, "hbm_roofline_fraction": pk.map(|(b, _)| bw / b), "hbm_peak_bytes_per_s": pk.map(|(b, _)| b),
            "hbm_roofline_fraction_3tbs": (!s.gpu.info.emulated).then_some(bw / ISSUE_ROOFLINE_BYTES_PER_S),
            "weight_load_seconds": load_secs, "peak_device_memory_gb": peak as f64 / 1e9, "repeats": c.repeats,
            "cuda_graphs": graph_steps > 0, "async_scheduling": async_scheduling, "graph_steps": graph_steps, "decode_steps": decode_steps, "top_p": params.top_p, "top_k": params.top_k})
    );
    // After the results are out, so a failed breakdown or profile loses none of them.
    if o.decode_breakdown {
        decode_breakdown(&mut engine, &model, &prompts, &params, c.repeats, &base)?;
    }
    if let Some(path) = c.profile {
        // Eager, so the profile shows each kernel (a graph replay is one op); then, unless the
        // timed runs were eager too, as they ran: graph replays and copies, the idle time
        // between them being the host's work between decode steps.
        engine.enforce_eager = true;
        let (_, prof) = s.gpu.profile(|| engine.generate(&model, &prompts, &params, None))?;
        engine.enforce_eager = enforce_eager;
        let as_run = if enforce_eager { None } else { Some(s.gpu.profile(|| engine.generate(&model, &prompts, &params, None))?.1) };
        let what = json!({"bench": "rollout", "model": s.dir, "dtype": s.dt.suffix(), "batch": batch, "new_tokens": max_new_tokens, "eager": true});
        write_profile(path, &prof, as_run.as_ref(), what)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Each decode op's cost in a step as it runs: the timed runs again with the op launched twice
/// ([`Rollout::repeat_op`]), less the plain runs' step (timed before and after, averaged, and
/// both printed: their difference is the noise floor). One JSON line, and a table to stderr.
fn decode_breakdown(engine: &mut Rollout, model: &DeviceModel, prompts: &[Vec<u32>], params: &SamplingParams, repeats: usize, before: &Timed) -> Result<()> {
    // Three tokens record each op's graph for the bucket the timed runs use.
    let warm = SamplingParams { max_new_tokens: 3, ..params.clone() };
    let mut ops = Vec::new();
    for op in DecodeOp::ALL {
        engine.repeat_op = Some(op);
        engine.generate(model, prompts, &warm, None)?;
        ops.push((op, timed_runs(engine, model, prompts, params, repeats)?));
    }
    engine.repeat_op = None;
    engine.generate(model, prompts, &warm, None)?;
    let after = timed_runs(engine, model, prompts, params, repeats)?;
    let base_us = (before.step_secs() + after.step_secs()) / 2.0 * 1e6;
    let layers = model.cfg.num_layers;
    let mut rows = Vec::new();
    let mut table = format!("decode step {base_us:.1} µs (plain runs before and after: {:.1}, {:.1})\n", before.step_secs() * 1e6, after.step_secs() * 1e6);
    table += &format!("{:<12} {:>8} {:>12} {:>10}\n", "op", "calls", "µs per call", "µs a step");
    let mut accounted = 0.0;
    for (op, t) in &ops {
        let calls = if op.per_layer() { layers } else { 1 };
        let extra = t.step_secs() * 1e6 - base_us;
        accounted += extra;
        let same = t.tokens == before.tokens;
        table += &format!("{:<12} {calls:>8} {:>12.2} {extra:>10.1}{}\n", op.name(), extra / calls as f64, if same { "" } else { "  (tokens changed)" });
        rows.push(json!({"op": op.name(), "calls_per_step": calls, "us_per_call": extra / calls as f64, "us_per_step": extra, "same_tokens": same}));
    }
    table += &format!("{:<12} {:>8} {:>12} {accounted:>10.1} of {base_us:.1} µs\n", "sum", "", "");
    eprint!("{table}");
    let kernels = format!("attention {:?}, decode_rope {:?}, decode_linear {:?}, decode_launch {:?}", model.attention, model.decode_rope, model.decode_linear, model.decode_launch).to_lowercase();
    println!(
        "{}",
        json!({"bench": "rollout-breakdown", "device": model.gpu.info.name, "layers": layers, "kernels": kernels, "cuda_graphs": before.graph_steps > 0,
            "decode_step_us": base_us, "decode_step_us_before": before.step_secs() * 1e6, "decode_step_us_after": after.step_secs() * 1e6,
            "accounted_us": accounted, "ops": rows})
    );
    Ok(())
}

/// The bandwidth our rollout target is stated against (an H100's HBM3, rounded down): the
/// fraction over it reads the same on any GPU, beside the one over this GPU's datasheet peak.
const ISSUE_ROOFLINE_BYTES_PER_S: f64 = 3e12;

/// `bench train` on the CUDA engine: `batch` sequences of `seq_len` random ids, packed, one
/// optimizer step (forward, backward, global-norm clip, AdamW) per repeat.
pub fn train(c: &Common<'_>, batch: usize, seq_len: usize, checkpointing: bool, lora_rank: Option<usize>) -> Result<ExitCode> {
    if seq_len < 2 || batch == 0 {
        bail!("--batch must be at least 1, --seq-len at least 2");
    }
    let mut s = open(c)?;
    let cfg = s.cfg.clone();
    let optim = OptimConfig { weight_decay: 0.01, grad_clip: None, ..Default::default() };
    // With --lora-rank, a fresh all-linear adapter (alpha 2r), as the CPU bench puts on.
    let mut state = match lora_rank {
        Some(r) => {
            let lora = reinforge_engine::LoraConfig::new(r, 2.0 * r as f64, &["all-linear".into()]).map_err(anyhow::Error::msg)?;
            let adapter = reinforge_engine::Adapter::fresh(&cfg, &lora, 0);
            let mut tensors = std::mem::replace(&mut s.weights, WeightSet::from_map("empty", Default::default())).into_map();
            tensors.extend(adapter.tensors);
            TrainState::with_lora(&s.gpu, cfg.clone(), &lora, &mut WeightSet::from_map("base + adapter", tensors), s.dt, optim, checkpointing)?
        }
        None => TrainState::from_weights(&s.gpu, cfg.clone(), &mut s.weights, s.dt, false, optim, checkpointing)?,
    };
    let trained = state.model.layout.slots.iter().filter(|x| x.offset < state.model.layout.trainable).map(|x| x.len()).sum::<usize>();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let seqs: Vec<Vec<u32>> = (0..batch).map(|_| (0..seq_len).map(|_| rng.random_range(0..cfg.vocab_size as u32)).collect()).collect();
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    let packed = Packed::new(&refs, cfg.vocab_size, cfg.max_position_embeddings)?;
    let (rows, targets) = packed.next_token_rows();
    let n = rows.len();
    let step = |state: &mut TrainState| -> Result<f64> {
        let t = Instant::now();
        state.zero_grads()?;
        state.micro(&packed, &rows, Head::Lm { targets: &targets, temperature: 1.0 }, |_| {
            Ok::<_, reinforge_cuda::CudaError>(RowGrads { value: vec![-1.0 / n as f32; n], entropy: vec![0.0; n] })
        })?;
        state.finish(1e-5, 1, None)?;
        Ok(t.elapsed().as_secs_f64())
    };
    step(&mut state)?;
    // The timed steps' high-water mark (forward, backward, optimizer), as
    // torch.cuda.max_memory_allocated counts PyTorch's.
    s.gpu.reset_peak();
    let times = (0..c.repeats).map(|_| step(&mut state)).collect::<Result<Vec<_>>>()?;
    let secs = median(times);
    let tokens = (batch * seq_len) as f64;
    let flops = reinforge_cuda::model::train_flops(&cfg, &state.model.layout, std::iter::repeat_n((seq_len, seq_len), batch));
    let pk = s.gpu.info.peaks().filter(|_| s.dt == DType::Bf16);
    println!(
        "{}",
        json!({"bench": "train", "impl": "reinforge", "engine": "cuda", "model": s.dir, "init": if s.random { "random" } else { "weights" },
            "device": s.gpu.info.name, "dtype": s.dt.suffix(), "batch": batch, "seq_len": seq_len, "gradient_checkpointing": checkpointing,
            "seconds": secs, "tokens_per_s": tokens / secs, "model_tflops_per_s": flops / secs / 1e12,
            "mfu": pk.map(|(_, f)| flops / secs / f), "peak_bf16_flops": pk.map(|(_, f)| f),
            "peak_device_memory_gb": s.gpu.peak_allocated() as f64 / 1e9, "optimizer_state_gb": state.state_bytes() as f64 / 1e9,
            "lora_rank": lora_rank, "trained_params": trained, "repeats": c.repeats})
    );
    // After the results are out, so a failed profile loses none of them.
    if let Some(path) = c.profile {
        let gpu = Arc::clone(&s.gpu);
        let (_, prof) = gpu.profile(|| step(&mut state))?;
        write_profile(path, &prof, None, json!({"bench": "train", "model": s.dir, "dtype": s.dt.suffix(), "batch": batch, "seq_len": seq_len, "gradient_checkpointing": checkpointing}))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints `prof`'s costliest ops to stderr and writes it whole, with `what` (the bench's
/// settings) and `graphs` (the same run with CUDA graphs, where profiled), as JSON to `path`
/// (through a temporary file, so a failed write leaves none).
fn write_profile(path: &Path, prof: &reinforge_cuda::gpu::Profile, graphs: Option<&reinforge_cuda::gpu::Profile>, what: serde_json::Value) -> Result<()> {
    eprintln!("profile of one {} run:\n{}", what["bench"].as_str().unwrap_or("bench"), prof.table(25));
    if let Some(g) = graphs {
        eprintln!("the same run with CUDA graphs:\n{}", g.table(6));
    }
    let doc = json!({"of": what, "profile": prof, "graphs": graphs});
    let tmp = path.with_extension("json.partial");
    let text = serde_json::to_string_pretty(&doc)?;
    let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        bail!("writing the profile to {}: {e}", path.display());
    }
    eprintln!("profile written to {}", path.display());
    Ok(())
}

/// Whether `--device` names the CUDA engine.
pub fn is_cuda(device: &str) -> bool {
    device.parse::<reinforge_engine::DeviceSpec>().map(|d| d.is_cuda()).unwrap_or(false)
}
