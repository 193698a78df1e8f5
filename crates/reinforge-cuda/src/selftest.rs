//! `reinforge selftest --device cuda`: the CUDA engine against the CPU engine (itself checked
//! against transformers) on the same weights — logits, greedy continuations, the gradients of
//! a log-prob + entropy loss, one AdamW step, paged decode against a full forward pass, and a
//! packed batch against its sequences one at a time; in bf16, decode_linear.cu's kernels against
//! the norm kernel + cuBLASLt at the model's layer shapes; the sampler's draw against its replay
//! on the host; on a GPU also NCCL's collectives over a world of one rank. Runs on a GPU, or on
//! the emulator (`cuda-emu`) where CI runs it on the tiny fixtures.
//!
//! Tolerances, and why:
//! - f32 storage: the two engines add in different orders (cuBLASLt's split-K, the fused
//!   attention's online softmax), so results agree to f32 rounding accumulated over the layers:
//!   relative error ≤ 1e-4 on logits, log-probs and per-tensor gradients.
//! - bf16 storage (f32 accumulation): bf16 keeps 8 significant bits, so each rounding of a weight
//!   or a stored activation is off by up to 2⁻⁹ ≈ 0.2 %; a few roundings per layer add up like a
//!   random walk to a few percent over a deep model: logits within 5 % (relative L2), gradients
//!   within 10 % overall with every tensor's direction kept (cosine ≥ 0.95).
//! - Greedy continuations must be equal token for token, except that they may part at a step
//!   where the CPU's two best logits are closer than twice the logit error measured for this
//!   model and type (a near tie, which any rounding may break either way).

use crate::error::{CudaError, Result};
use crate::gpu::{DType, Gpu};
use crate::model::{DeviceModel, Head, Packed, RowGrads};
use crate::ops::DecodeLaunch;
use crate::rollout::Rollout;
use crate::train::TrainState;
use rand::{Rng, SeedableRng};
use reinforge_engine::weights::WeightSet;
use reinforge_engine::{reference_gradients, reference_step, CausalLm, DeviceSpec, HostTensor, ModelConfig, OptimConfig, SamplingParams};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One check's outcome.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    /// `model/dtype/check`.
    pub name: String,
    /// Whether it met its tolerance.
    pub passed: bool,
    /// What was measured, against what bound.
    pub detail: String,
}

/// What to test.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Model directories: HF directories with weights, or with only `config.json` (weights
    /// then drawn at random, seed 0, the same on both engines).
    pub models: Vec<PathBuf>,
    /// Storage types to test each model in.
    pub dtypes: Vec<DType>,
    /// Tokens per test sequence, longest first (others are cut from it), at most the model's context.
    pub seq_len: usize,
    /// New tokens for the greedy and paged-decode checks.
    pub new_tokens: usize,
    /// Whether a GPU run also checks NCCL over a world of one rank.
    pub nccl: bool,
}

/// One model's weights and the engines' views of them.
struct Subject {
    label: String,
    cfg: ModelConfig,
    tensors: HashMap<String, HostTensor>,
}

impl Subject {
    fn load(dir: &Path) -> Result<Subject> {
        let cfg = ModelConfig::from_dir(dir)?;
        let (tensors, random) = reinforge_engine::model::weights_or_random(dir, &cfg, 0)?;
        let name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        let label = if random { format!("{name} (random init)") } else { name };
        Ok(Subject { label, cfg, tensors })
    }

    fn weights(&self) -> WeightSet {
        WeightSet::from_map(&self.label, self.tensors.clone())
    }

    fn cpu(&self, autodiff: bool) -> Result<CausalLm> {
        let dev = if autodiff { DeviceSpec::Cpu.training_device(false)? } else { DeviceSpec::Cpu.inference_device()? };
        Ok(CausalLm::from_hf_tensors(self.cfg.clone(), self.tensors.clone().into_iter().collect(), &dev)?)
    }
}

/// Relative L2 error of `a` against `b`.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt();
    num / den.max(1e-30)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt();
    if na == 0.0 && nb == 0.0 {
        1.0
    } else {
        dot / (na * nb).max(1e-30)
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Test sequences: seeded random ids of three lengths (one crossing a 16-row attention tile
/// and a 32-key chunk, one short), avoiding the model's special ids at the top of the vocabulary.
fn sequences(cfg: &ModelConfig, longest: usize) -> Vec<Vec<u32>> {
    let longest = longest.clamp(4, cfg.max_position_embeddings.max(4));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
    let top = cfg.vocab_size.saturating_sub(16).max(2) as u32;
    [longest, 3, longest / 2 + 1].iter().map(|&n| (0..n).map(|_| rng.random_range(1..top)).collect()).collect()
}

/// Loss coefficients (one per position after the first).
fn coefficients(seqs: &[Vec<u32>], seed: u64, scale: f32) -> Vec<Vec<f32>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    seqs.iter().map(|s| (1..s.len()).map(|_| rng.random_range(-scale..scale)).collect()).collect()
}

fn pack(seqs: &[Vec<u32>], cfg: &ModelConfig) -> Result<Packed> {
    let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    Packed::new(&refs, cfg.vocab_size, cfg.max_position_embeddings)
}

/// Per-parameter tensors by name.
type Tensors = BTreeMap<String, HostTensor>;

/// A figure and the tensor it comes from.
type Extreme = (f64, String);

/// The gradients of Σ a·lp + Σ b·entropy over `seqs` on the CUDA engine (one micro-batch per
/// entry of `batches`, accumulated), with the log-probs and entropies of the last one.
fn cuda_gradients(st: &mut TrainState, batches: &[Vec<Vec<u32>>], a: &[Vec<f32>], b: &[Vec<f32>], temperature: f64) -> Result<(Vec<f32>, Vec<f32>, Tensors)> {
    st.zero_grads()?;
    let mut lp = Vec::new();
    let mut ent = Vec::new();
    let mut at = 0;
    for seqs in batches {
        let packed = pack(seqs, &st.model.cfg)?;
        let (rows, targets) = packed.next_token_rows();
        let ga: Vec<f32> = a[at..at + seqs.len()].concat();
        let gb: Vec<f32> = b[at..at + seqs.len()].concat();
        at += seqs.len();
        let out = st.micro(&packed, &rows, Head::Lm { targets: &targets, temperature }, |_| Ok::<_, CudaError>(RowGrads { value: ga, entropy: gb }))?;
        lp = out.value;
        ent = out.entropy;
    }
    Ok((lp, ent, st.gradients()?))
}

/// Compares per-tensor gradients: (overall relative error, worst tensor's relative error and
/// name, lowest cosine and its tensor).
fn compare_tensors(got: &Tensors, want: &Tensors) -> Result<(f64, Extreme, Extreme)> {
    if got.len() != want.len() {
        return Err(CudaError::Request(format!("{} tensors against the reference's {}", got.len(), want.len())));
    }
    let mut worst = (0.0, String::new());
    let mut low_cos = (1.0, String::new());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (k, w) in want {
        let g = got.get(k).ok_or_else(|| CudaError::Request(format!("no tensor `{k}` from the CUDA engine")))?;
        if g.shape != w.shape {
            return Err(CudaError::Request(format!("`{k}`: shape {:?} against the reference's {:?}", g.shape, w.shape)));
        }
        num += g.data.iter().zip(&w.data).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>();
        den += w.data.iter().map(|y| (*y as f64).powi(2)).sum::<f64>();
        let e = rel_err(&g.data, &w.data);
        if e > worst.0 {
            worst = (e, k.clone());
        }
        let c = cosine(&g.data, &w.data);
        if c < low_cos.0 {
            low_cos = (c, k.clone());
        }
    }
    Ok(((num / den.max(1e-30)).sqrt(), worst, low_cos))
}

/// Runs every check of `plan` on `gpu`, calling `report` as each one ends.
pub fn run(gpu: &Arc<Gpu>, plan: &Plan, report: &mut dyn FnMut(&Check)) -> Result<Vec<Check>> {
    let mut checks = Vec::new();
    // The sampler's draw, exactly: vocabularies read in 16-byte loads (131 072) and one by one
    // (262 147, two groups of four per lane and step), peaks on the edges of warps' parts.
    let mut draws = Vec::new();
    let mut passed = true;
    for (v, peaks) in [(131_072usize, vec![4095, 0, 4096, 131_071]), (262_147, vec![8447, 8448, 8448 + 255, 262_146])] {
        match exact_draws(gpu, v, &peaks, 16) {
            Ok(()) => draws.push(format!("{v}")),
            Err(e) => {
                passed = false;
                draws.push(e);
            }
        }
    }
    let c = Check { name: "sampling/exact-draws".into(), passed, detail: format!("greedy and sampled tokens equal the draw replayed on the host, log-probs within 1e-5, for vocabularies {}", draws.join(", ")) };
    report(&c);
    checks.push(c);
    for dir in &plan.models {
        let subject = Subject::load(dir)?;
        for &dt in &plan.dtypes {
            let mut out = |name: &str, passed: bool, detail: String| {
                let c = Check { name: format!("{}/{}/{name}", subject.label, dt.suffix()), passed, detail };
                report(&c);
                checks.push(c);
            };
            // An error inside one model/type fails that group's remaining checks, not the run.
            if let Err(e) = model_checks(gpu, &subject, dt, plan, &mut out) {
                out("error", false, e.to_string());
            }
        }
    }
    // Last, so that an NCCL that cannot set up here (it may stall until its deadline) costs
    // none of the engine's checks.
    if !gpu.info.emulated && plan.nccl {
        let (passed, detail) = match nccl_check(gpu) {
            Ok(detail) => (true, detail),
            Err(e) => (false, e.to_string()),
        };
        let c = Check { name: "nccl/world-of-1".into(), passed, detail };
        report(&c);
        checks.push(c);
    }
    Ok(checks)
}

/// A rank-4 all-linear LoRA adapter with non-zero `B` (PEFT's fresh `A`; a fresh `B` would be
/// zero and give `B` alone a gradient): log-probs, entropies and every factor's gradient
/// against the CPU engine's, and the merged copy's log-probs against the adapted model's.
#[allow(clippy::too_many_arguments)]
fn lora_check(gpu: &Arc<Gpu>, s: &Subject, dt: DType, seqs: &[Vec<u32>], (a, b): (&[Vec<f32>], &[Vec<f32>]), temperature: f64, out: &mut dyn FnMut(&str, bool, String)) -> Result<()> {
    let bf16 = dt == DType::Bf16;
    let lora = reinforge_engine::LoraConfig::new(4, 8.0, &["all-linear".into()]).map_err(CudaError::Request)?;
    let mut adapter = reinforge_engine::Adapter::fresh(&s.cfg, &lora, 3);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    for (k, t) in adapter.tensors.iter_mut() {
        if k.ends_with(".lora_B.weight") {
            t.data.iter_mut().for_each(|x| *x = rng.random_range(-0.05..0.05));
        }
    }
    let cpu = s.cpu(true)?.with_lora(&adapter)?;
    let (lp_ref, ent_ref, mut g_ref) = reference_gradients(&cpu, seqs, temperature, a, b)?;
    g_ref.retain(|k, _| reinforge_engine::lora::is_lora_name(k));
    let mut tensors = s.tensors.clone();
    tensors.extend(adapter.tensors);
    let mut st = TrainState::with_lora(gpu, s.cfg.clone(), &lora, &mut WeightSet::from_map(&s.label, tensors), dt, OptimConfig::default(), false)?;
    let (lp, ent, grads) = cuda_gradients(&mut st, &[seqs.to_vec()], a, b, temperature)?;
    let (e_lp, e_ent) = (rel_err(&lp, &lp_ref.concat()), rel_err(&ent, &ent_ref.concat()));
    let (overall, worst, low_cos) = compare_tensors(&grads, &g_ref)?;
    let merged = st.model.merged()?;
    let packed = pack(seqs, &s.cfg)?;
    let (rows, targets) = packed.next_token_rows();
    let head = Head::Lm { targets: &targets, temperature };
    let e_merged = rel_err(&merged.score(&packed, &rows, head)?.value, &st.model.score(&packed, &rows, head)?.value);
    let passed = if bf16 {
        e_lp <= 5e-2 && e_ent <= 5e-2 && overall <= 0.1 && low_cos.0 >= 0.95 && e_merged <= 5e-2
    } else {
        e_lp <= 1e-4 && e_ent <= 1e-4 && worst.0 <= 1e-4 && e_merged <= 1e-5
    };
    out(
        "lora",
        passed,
        format!(
            "rank 4, all-linear: log-probs {e_lp:.1e}, entropies {e_ent:.1e}; {} factors: overall {overall:.1e}, worst {:.1e} ({}), lowest cosine {:.5}; merged model's log-probs {e_merged:.1e}",
            grads.len(),
            worst.0,
            worst.1,
            low_cos.0
        ),
    );
    Ok(())
}

/// The sampling kernel's generator (sample.cu), for exact expectations.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Samples `rows` rows of `v` logits that are −30 except 0 at `peaks`, and checks each token
/// against the draw replayed on the host: every peak's mass is exactly 2⁴⁰ (e⁰ in the
/// sampler's fixed point) and the tail's is 0 (e⁻³⁰ is below one unit), so the pick is peak
/// number ⌊target / 2⁴⁰⌋ in index order for target = ⌊bits · total / 2⁶⁴⌋, greedy's is the
/// first peak, and every log-prob is −ln Σ e^u. An error says which row went wrong.
pub fn exact_draws(gpu: &Arc<Gpu>, v: usize, peaks: &[usize], rows: usize) -> std::result::Result<(), String> {
    let ops = crate::ops::Ops::new(gpu, DType::F32);
    let mut peaks = peaks.to_vec();
    peaks.sort_unstable();
    let mut z = vec![-30f32; v];
    for &i in &peaks {
        z[i] = 0.0;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(v as u64);
    let keys: Vec<u64> = (0..rows).map(|_| rng.random()).collect();
    /// Whether greedy, then each row's token and log-prob.
    type Picks = Vec<(bool, Vec<i32>, Vec<f32>)>;
    let run = || -> Result<Picks> {
        let zs: Vec<f32> = (0..rows).flat_map(|_| z.iter().copied()).collect();
        let (z_d, keys_d) = (gpu.upload_new(&zs, "logits")?, gpu.upload_new(&keys, "keys")?);
        let (tok_d, lp_d) = (gpu.alloc(rows * 4, "tokens", "")?, gpu.alloc(rows * 4, "log-probs", "")?);
        let mut out = Vec::new();
        for greedy in [false, true] {
            ops.sample(tok_d.ptr, lp_d.ptr, z_d.ptr, keys_d.ptr, rows, v, 1.0, greedy, 0, 1.0)?;
            out.push((greedy, gpu.to_vec(tok_d.ptr, rows)?, gpu.to_vec(lp_d.ptr, rows)?));
        }
        Ok(out)
    };
    let lse = (peaks.len() as f64 + (v - peaks.len()) as f64 * (-30f64).exp()).ln();
    let total = peaks.len() as u128 * (1u128 << 40);
    for (greedy, toks, lps) in run().map_err(|e| e.to_string())? {
        for (r, (&t, &lp)) in toks.iter().zip(&lps).enumerate() {
            let target = (splitmix64(keys[r]) as u128 * total) >> 64;
            let want = if greedy { peaks[0] } else { peaks[(target >> 40) as usize] };
            if t as usize != want || (lp as f64 + lse).abs() >= 1e-5 {
                return Err(format!("vocabulary {v}, row {r}{}: token {t} (log-prob {lp}), want {want} ({:.6})", if greedy { " greedy" } else { "" }, -lse));
            }
        }
    }
    Ok(())
}

/// NCCL loads, makes a communicator, and its all-reduce (f32 and bf16) and broadcast over a
/// world of one rank leave the data as it was: the calls data-parallel ranks make, on the one
/// GPU a test machine has (NCCL refuses two ranks on one GPU).
fn nccl_check(gpu: &Arc<Gpu>) -> Result<String> {
    let (version, path) = crate::nccl::version()?;
    let comm = crate::nccl::Comm::init(gpu, &crate::nccl::unique_id()?, 0, 1, std::time::Duration::from_secs(60))?;
    let data: Vec<f32> = (0..4099).map(|i| (i as f32 * 0.37).sin()).collect();
    let buf = gpu.upload_new(&data, "NCCL check")?;
    comm.all_reduce_sum(buf.ptr, data.len(), DType::F32)?;
    comm.broadcast(buf.ptr, data.len(), DType::F32, 0)?;
    let bf: Vec<half::bf16> = data.iter().map(|&x| half::bf16::from_f32(x)).collect();
    let bbuf = gpu.upload_new(&bf, "NCCL check")?;
    comm.all_reduce_sum(bbuf.ptr, bf.len(), DType::Bf16)?;
    let (got, gotb) = (gpu.to_vec::<f32>(buf.ptr, data.len())?, gpu.to_vec::<half::bf16>(bbuf.ptr, bf.len())?);
    if got != data || gotb != bf {
        return Err(CudaError::Request("NCCL changed the data of a world of one rank".into()));
    }
    let join = if comm.has_deadline() { "non-blocking join with a deadline" } else { "blocking join (NCCL before 2.14)" };
    Ok(format!("NCCL {}.{}.{} ({path}, {join}): all-reduce (f32, bf16) and broadcast of {} values over a world of 1 leave them unchanged", version / 10000, version / 100 % 100, version % 100, data.len()))
}

/// A rollout engine's graphs, kept from one call to the next across an in-place weight update,
/// against eager decoding of the updated weights.
fn graphs_kept(gpu: &Arc<Gpu>, s: &Subject, dt: DType, prompts: &[Vec<u32>], new: usize, out: &mut dyn FnMut(&str, bool, String)) -> Result<()> {
    let sampled = SamplingParams { n: 2, temperature: 0.9, top_p: 0.95, top_k: 20, max_new_tokens: new, seed: 3, ..Default::default() };
    let mut synced = DeviceModel::from_weights(gpu, s.cfg.clone(), &mut s.weights(), dt, false)?;
    let mut engine = Rollout::new(0.5);
    // The first call records a graph per bucket it stays in for two steps or more.
    engine.generate(&synced, prompts, &sampled, None)?;
    let scaled: std::collections::BTreeMap<_, _> = s
        .tensors
        .iter()
        .map(|(k, t)| (k.clone(), reinforge_engine::HostTensor { shape: t.shape.clone(), data: t.data.iter().map(|x| x * 0.95).collect() }))
        .collect();
    synced.load_tensors(scaled)?;
    let (kept, st) = engine.generate(&synced, prompts, &sampled, None)?;
    let (replayed, recorded) = (engine.graph_steps, engine.graphs_recorded);
    let (eager, _) = Rollout::new(0.5).eager(true).generate(&synced, prompts, &sampled, None)?;
    // Same kernels, GEMM plans and row counts either way: the same bits are expected (cuBLASLt
    // is deterministic for a plan); log-probs get a rounding's slack all the same.
    let same = kept.iter().zip(&eager).filter(|(k, e)| k.token_ids == e.token_ids).count();
    let lp_diff = kept.iter().zip(&eager).flat_map(|(k, e)| k.logprobs.iter().zip(&e.logprobs).map(|(a, b)| (a - b).abs())).fold(0f32, f32::max);
    out(
        "graphs-kept",
        same == eager.len() && lp_diff <= 1e-4 && st.decode_steps > 0 && replayed == st.decode_steps && recorded == 0,
        format!(
            "after an in-place weight update, {replayed} of {} decode steps replayed from the last call's graphs ({recorded} recorded anew); {same} of {} samples with eager decoding's tokens, log-probs within {lp_diff:.1e} (≤ 1e-4)",
            st.decode_steps,
            eager.len()
        ),
    );
    Ok(())
}

/// Decoding with the layer kernels as programmatic dependent launches
/// (`REINFORGE_CUDA_DECODE_LAUNCH=dependent`), graphs and all, against plain launches: only
/// when each kernel starts changes, so the bits must not (a kernel that read its inputs
/// before its grid_wait() would show here, where a GPU has such launches).
fn dependent_launches(gpu: &Arc<Gpu>, s: &Subject, dt: DType, prompts: &[Vec<u32>], new: usize, out: &mut dyn FnMut(&str, bool, String)) -> Result<()> {
    let sampled = SamplingParams { n: 2, temperature: 0.9, top_p: 0.95, top_k: 20, max_new_tokens: new, seed: 4, ..Default::default() };
    let mut model = DeviceModel::from_weights(gpu, s.cfg.clone(), &mut s.weights(), dt, false)?;
    let mut runs = Vec::new();
    for launch in [DecodeLaunch::Serial, DecodeLaunch::Dependent] {
        model.decode_launch = launch;
        runs.push(Rollout::new(0.5).generate(&model, prompts, &sampled, None)?.0);
    }
    let bits = |c: &reinforge_engine::Completion| -> Vec<u32> { c.logprobs.iter().map(|x| x.to_bits()).collect() };
    let same = runs[0].iter().zip(&runs[1]).filter(|(a, b)| a.token_ids == b.token_ids && bits(a) == bits(b)).count();
    let how = if gpu.info.dependent_launches() { "programmatic dependent launches" } else { "plain launches (no programmatic dependent launch on this device)" };
    out("dependent-launches", same == runs[0].len(), format!("{same} of {} samples decoded as {how} equal plain launches' tokens and log-probs, bit for bit", runs[0].len()));
    Ok(())
}

/// A launch of one of a decode layer's linear calls, on the given kernels into the given output.
type LayerCall = dyn Fn(&crate::ops::Ops, crate::gpu::DevPtr) -> Result<()>;

/// One of a decode layer's linear calls, for [`decode_linear_kernels`].
struct LayerCase {
    /// Which projection, and its m × n × k.
    label: String,
    /// Its outputs per row.
    n: usize,
    /// Launches it on the given kernels into the given output.
    call: Box<LayerCall>,
    /// `linear_rows`' split counters and their count, which every launch must leave at zero.
    counters: Option<(crate::gpu::DevPtr, usize)>,
}

/// decode_linear.cu's kernels at this model's layer shapes (QKV and gate/up with their norms,
/// o_proj and down with the residual), at a full batch of 64 rows and a partial one, against
/// the separate route (norm kernel, cuBLASLt, SwiGLU kernel) on this device: element by element
/// within an ulp of bf16 (two with SwiGLU, whose gate and up each round), which is what their
/// different orders of summation allow. Each fused call is then launched again, back to back
/// as dependent launches where the device takes them, and must give the same bits with its
/// split counters back at zero: on a GPU, where blocks race for real, that is the check of the
/// last-block sums and of the launches' ordering. A decode step's end-to-end difference is
/// not a sharp check of these kernels: over a deep model at random init, an ulp here and there
/// grows to ~1e-2 in log-probs (SmolLM2's shape on the emulator).
fn decode_linear_kernels(gpu: &Arc<Gpu>, cfg: &ModelConfig, out: &mut dyn FnMut(&str, bool, String)) -> Result<()> {
    use crate::gpu::DevPtr;
    use crate::ops::{DecodeLinear, Ops};
    let repeats = if gpu.info.emulated { 2 } else { 20 };
    let (h, q, kv, inter) = (cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size);
    let fused = Ops { decode_linear: DecodeLinear::Fused, ..Ops::new(gpu, DType::Bf16) };
    let again = Ops { decode_launch: DecodeLaunch::Dependent, ..fused };
    let separate = Ops::new(gpu, DType::Bf16);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(23);
    let mut upload = |n: usize, scale: f32| -> Result<crate::gpu::Buf> {
        let v: Vec<u16> = (0..n).map(|_| half::bf16::from_f32(rng.random_range(-scale..scale)).to_bits()).collect();
        gpu.upload_new(&v, "decode_linear check")
    };
    let floats = |bits: &[u16]| -> Vec<f32> { bits.iter().map(|&b| half::bf16::from_bits(b).to_f32()).collect() };
    let (mut ok, mut fused_shapes, mut kept) = (true, Vec::new(), Vec::new());
    let mut worst = 0f32; // in ulps of the larger of the two
    for m in [64usize, 23] {
        // (name, n, k, bias, SwiGLU) for the norm + linear kernels; (name, n, k) for o_proj and down.
        let normed = [("qkv", q + 2 * kv, h, cfg.qkv_bias, false), ("gate/up", inter, h, cfg.mlp_bias, true)];
        let rows = [("o_proj", h, q), ("down", h, inter)];
        let gamma = upload(h, 1.5)?;
        let x = upload(m * h.max(q).max(inter), 1.0)?;
        let res = upload(m * h, 2.0)?;
        // The closures take the buffers' addresses; `held` keeps the buffers alive.
        let mut held = Vec::new();
        let mut cases: Vec<LayerCase> = Vec::new();
        for (name, n, k, bias, swiglu) in normed {
            let w = upload((1 + swiglu as usize) * n * k, 1.0 / (k as f32).sqrt())?;
            let b = upload((1 + swiglu as usize) * n, 0.5)?;
            let (hn, rstd, gu) = (gpu.alloc(2 * m * k, "decode_linear check", "")?, gpu.alloc(4 * m, "decode_linear check", "")?, gpu.alloc(4 * m * n, "decode_linear check", "")?);
            let (xp, gp, wp, bp, hp, rp, up) = (x.ptr, gamma.ptr, w.ptr, b.ptr, hn.ptr, rstd.ptr, gu.ptr);
            held.extend([w, b, hn, rstd, gu]);
            let eps = cfg.rms_norm_eps;
            let call = move |ops: &Ops, y: DevPtr| ops.norm_linear(y, xp, (gp, eps), wp, bias.then_some(bp), (m, n, k), swiglu.then_some(up), (hp, rp));
            cases.push(LayerCase { label: format!("{name} {m}×{n}×{k}"), n, call: Box::new(call), counters: None });
        }
        for (name, n, k) in rows {
            let w = upload(n * k, 1.0 / (k as f32).sqrt())?;
            let part = gpu.alloc(fused.linear_rows_scratch(m, &[(n, k)]), "decode_linear check", "")?;
            let done = gpu.alloc(4 * n.div_ceil(16), "decode_linear check", "")?;
            let (xp, rp, wp, pp, dp) = (x.ptr, res.ptr, w.ptr, part.ptr, done.ptr);
            held.extend([w, part, done]);
            let call = move |ops: &Ops, y: DevPtr| ops.linear_rows(y, xp, wp, None, Some(rp), (m, n, k), (pp, dp));
            cases.push(LayerCase { label: format!("{name} {m}×{n}×{k}"), n, call: Box::new(call), counters: Some((dp, n.div_ceil(16))) });
        }
        for LayerCase { label, n, call, counters } in &cases {
            let (y_f, y_s) = (gpu.alloc(2 * m * n, "decode_linear check", "")?, gpu.alloc(2 * m * n, "decode_linear check", "")?);
            let ((), prof) = gpu.profile(|| call(&fused, y_f.ptr))?;
            if !prof.ops.iter().any(|o| o.op.starts_with("norm_linear") || o.op == "linear_rows_bf16") {
                kept.push(label.clone());
                continue;
            }
            call(&separate, y_s.ptr)?;
            let bits = gpu.to_vec::<u16>(y_f.ptr, m * n)?;
            let (a, b) = (floats(&bits), floats(&gpu.to_vec::<u16>(y_s.ptr, m * n)?));
            let ulps = if label.starts_with("gate") { 2.0 } else { 1.0 };
            let mut far = 0f32;
            for (x, y) in a.iter().zip(&b) {
                let ulp = x.abs().max(y.abs()) / 128.0 + 1e-6;
                let d = (x - y).abs() / ulp;
                // A NaN on either side is as far as can be (f32::max would pass over it).
                far = if d.is_nan() { f32::INFINITY } else { far.max(d) };
            }
            worst = worst.max(far);
            // Back to back, each into its own output, nothing read in between.
            let ys = (0..repeats).map(|_| gpu.alloc(2 * m * n, "decode_linear check", "")).collect::<Result<Vec<_>>>()?;
            for y in &ys {
                call(&again, y.ptr)?;
            }
            let mut differ = 0;
            for y in &ys {
                differ += (gpu.to_vec::<u16>(y.ptr, m * n)? != bits) as usize;
            }
            let left = match counters {
                Some((p, c)) => gpu.to_vec::<u32>(*p, *c)?.iter().filter(|&&d| d != 0).count(),
                None => 0,
            };
            ok &= far <= ulps && differ == 0 && left == 0;
            let mut note = format!("{label} {far:.1} ulp");
            if differ > 0 {
                note += &format!(", {differ} of {repeats} launches DIFFERENT");
            }
            if left > 0 {
                note += &format!(", {left} split counters LEFT SET");
            }
            fused_shapes.push(note);
        }
    }
    if fused_shapes.is_empty() {
        // A model this wide decodes on the separate kernels only: nothing to compare.
        out("decode-linear", true, format!("skipped: no layer shape takes the fused kernels ({})", kept.join(", ")));
        return Ok(());
    }
    let kept = if kept.is_empty() { String::new() } else { format!("; on the separate route (shapes the fused kernels do not take): {}", kept.join(", ")) };
    let how = if gpu.info.dependent_launches() { "dependent launches" } else { "launches" };
    out(
        "decode-linear",
        ok,
        format!("fused kernels against norm + cuBLASLt + SwiGLU (≤ 1 ulp, 2 for gate/up; worst {worst:.1}), then {repeats} back-to-back {how} with the same bits: {}{kept}", fused_shapes.join(", ")),
    );
    Ok(())
}

fn model_checks(gpu: &Arc<Gpu>, s: &Subject, dt: DType, plan: &Plan, out: &mut dyn FnMut(&str, bool, String)) -> Result<()> {
    let bf16 = dt == DType::Bf16;
    let cfg = &s.cfg;
    let seqs = sequences(cfg, plan.seq_len);
    let cpu = s.cpu(false)?;
    let model = DeviceModel::from_weights(gpu, cfg.clone(), &mut s.weights(), dt, false)?;

    // 1. Logits of every position.
    let want = cpu.logits_of(&seqs)?;
    let packed = pack(&seqs, cfg)?;
    let rows: Vec<usize> = (0..packed.len()).collect();
    let got = model.logits(&packed, &rows)?;
    let want_all = want.concat();
    let (e, worst) = (rel_err(&got, &want_all), max_abs_diff(&got, &want_all));
    let bound = if bf16 { 5e-2 } else { 1e-4 };
    out("logits", e <= bound, format!("relative error {e:.2e} (≤ {bound:.0e}), max |diff| {worst:.2e} over {} positions", packed.len()));
    let tie = 2.0 * worst.max(1e-6);

    // 2. Greedy continuations of two prompts.
    let prompts: Vec<Vec<u32>> = vec![seqs[0][..seqs[0].len().min(12)].to_vec(), seqs[1].clone()];
    let room = cfg.max_position_embeddings.saturating_sub(prompts.iter().map(Vec::len).max().unwrap_or(0));
    let new = plan.new_tokens.min(room).max(1);
    let params = SamplingParams::greedy(new);
    let (cpu_out, _) = reinforge_engine::generate(&cpu, &prompts, &params, None)?;
    let mut engine = Rollout::new(0.5);
    let (gpu_out, _) = engine.generate(&model, &prompts, &params, None)?;
    let mut verdicts = Vec::new();
    let mut ok = true;
    for (c, g) in cpu_out.iter().zip(&gpu_out) {
        match c.token_ids.iter().zip(&g.token_ids).position(|(x, y)| x != y) {
            None if c.token_ids.len() == g.token_ids.len() => verdicts.push(format!("{} equal", c.token_ids.len())),
            None => {
                ok = false;
                verdicts.push(format!("lengths {} vs {}", c.token_ids.len(), g.token_ids.len()));
            }
            Some(step) => {
                let ctx: Vec<u32> = prompts[c.prompt_index].iter().chain(&c.token_ids[..step]).copied().collect();
                let z = cpu.logits_of(std::slice::from_ref(&ctx))?.remove(0);
                let last = &z[z.len() - cfg.vocab_size..];
                let mut sorted: Vec<f32> = last.to_vec();
                sorted.sort_by(|a, b| b.total_cmp(a));
                let gap = sorted[0] - sorted[1];
                let near_tie = gap <= tie;
                ok &= near_tie;
                verdicts.push(format!("part at step {step} where the top-2 gap is {gap:.2e} ({})", if near_tie { "a near tie" } else { "not a tie" }));
            }
        }
    }
    out("greedy", ok, format!("{} new tokens per prompt: {}", new, verdicts.join("; ")));

    // 2b. A rollout rank's engine keeps its decode graphs between calls while its weights
    // change in place: replayed steps must read the new weights, as eager launches do. A
    // bucket's graph is recorded at its second decode step: three new tokens at least.
    if new >= 3 {
        graphs_kept(gpu, s, dt, &prompts, new, out)?;
    }
    // 2c. The decode layer kernels as dependent launches, and 2d. decode_linear.cu's kernels
    // at this model's shapes: only bf16 has such kernels.
    if bf16 {
        dependent_launches(gpu, s, dt, &prompts, new, out)?;
        decode_linear_kernels(gpu, cfg, out)?;
    }


    // 3. Gradients of Σ a·lp + Σ b·entropy, against the CPU engine's autodiff (padded batch).
    let temperature = 0.7;
    let a = coefficients(&seqs, 7, 1.0);
    let b = coefficients(&seqs, 8, 0.5);
    let cpu_ad = s.cpu(true)?;
    let (lp_ref, ent_ref, g_ref) = reference_gradients(&cpu_ad, &seqs, temperature, &a, &b)?;
    let mut st = TrainState::from_weights(gpu, cfg.clone(), &mut s.weights(), dt, false, OptimConfig::default(), false)?;
    let (lp, ent, grads) = cuda_gradients(&mut st, std::slice::from_ref(&seqs), &a, &b, temperature)?;
    let e_lp = rel_err(&lp, &lp_ref.concat());
    let e_ent = rel_err(&ent, &ent_ref.concat());
    let (overall, worst, low_cos) = compare_tensors(&grads, &g_ref)?;
    let passed = if bf16 { e_lp <= 5e-2 && e_ent <= 5e-2 && overall <= 0.1 && low_cos.0 >= 0.95 } else { e_lp <= 1e-4 && e_ent <= 1e-4 && worst.0 <= 1e-4 };
    out(
        "gradients",
        passed,
        format!(
            "log-probs {e_lp:.1e}, entropies {e_ent:.1e}; {} tensors: overall {overall:.1e}, worst {:.1e} ({}), lowest cosine {:.5} ({})",
            grads.len(),
            worst.0,
            worst.1,
            low_cos.0,
            low_cos.1
        ),
    );

    // 3b. The same under a LoRA adapter (rank 4 on every linear, `B` non-zero): the factors'
    //     gradients, and the merged model rollout decodes with.
    lora_check(gpu, s, dt, &seqs, (&a, &b), temperature, out)?;

    // 4. Gradient checkpointing (recompute per layer) changes nothing.
    let mut st_ck = TrainState::from_weights(gpu, cfg.clone(), &mut s.weights(), dt, false, OptimConfig::default(), true)?;
    let (_, _, grads_ck) = cuda_gradients(&mut st_ck, std::slice::from_ref(&seqs), &a, &b, temperature)?;
    drop(st_ck);
    let (_, worst_ck, _) = compare_tensors(&grads_ck, &grads)?;
    let detail = if worst_ck.0 == 0.0 {
        "recomputed activations give the stored-activation gradients bit for bit".to_string()
    } else {
        format!("recomputed activations: worst tensor {:.1e} ({}) from the stored-activation gradients", worst_ck.0, worst_ck.1)
    };
    out("checkpointing", worst_ck.0 <= 1e-6, detail);

    // 5. A packed batch equals its sequences one micro-batch each.
    let singles: Vec<Vec<Vec<u32>>> = seqs.iter().map(|x| vec![x.clone()]).collect();
    let (_, _, grads_one) = cuda_gradients(&mut st, &singles, &a, &b, temperature)?;
    let (overall_p, worst_p, _) = compare_tensors(&grads_one, &grads)?;
    let bound = if bf16 { 1e-2 } else { 1e-5 };
    out("packed", overall_p <= bound, format!("3 sequences packed vs one at a time: overall {overall_p:.1e} (≤ {bound:.0e}), worst {:.1e} ({})", worst_p.0, worst_p.1));

    // 6. One AdamW step (clip at 1.0, lr 1e-3) against the CPU engine's (f32 only: in bf16 the
    //    gradients it starts from already differ by the bf16 error checked above).
    if !bf16 {
        let lr = 1e-3;
        let (_, _, _) = cuda_gradients(&mut st, std::slice::from_ref(&seqs), &a, &b, temperature)?;
        let stats = st.finish(lr, 1, None)?;
        let (ref_stats, w_ref, opt_ref) = reference_step(s.cpu(true)?, OptimConfig::default(), lr, &seqs, temperature, &a, &b)?;
        let before: BTreeMap<String, HostTensor> = s.tensors.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let delta = |w: &BTreeMap<String, HostTensor>| -> BTreeMap<String, HostTensor> {
            w.iter()
                .filter_map(|(k, t)| before.get(k).map(|b| (k.clone(), HostTensor { shape: t.shape.clone(), data: t.data.iter().zip(&b.data).map(|(x, y)| x - y).collect() })))
                .collect()
        };
        let (dw, _, _) = compare_tensors(&delta(&st.to_hf_tensors()?), &delta(&w_ref))?;
        let opt = st.optimizer_state()?;
        let (em, _, _) = compare_tensors(&opt.exp_avg, &opt_ref.exp_avg)?;
        let (ev, _, _) = compare_tensors(&opt.exp_avg_sq, &opt_ref.exp_avg_sq)?;
        let e_norm = (stats.grad_norm - ref_stats.grad_norm).abs() / ref_stats.grad_norm.max(1e-30);
        let passed = dw <= 1e-3 && em <= 1e-4 && ev <= 2e-4 && e_norm <= 1e-4 && stats.applied && opt.steps == opt_ref.steps;
        out(
            "adamw",
            passed,
            format!("grad norm {:.4e} vs {:.4e}; weight updates {dw:.1e}, exp_avg {em:.1e}, exp_avg_sq {ev:.1e} (relative)", stats.grad_norm, ref_stats.grad_norm),
        );
    }
    drop(st);

    // 7. Paged decode (samples sharing their prompt's blocks, crossing block boundaries)
    //    against a full forward pass over the same tokens. Both passes use the CUDA-core
    //    attention kernels, which compute in f32 as the decode kernel does: this check is about
    //    paging, and the tensor-core kernels' bf16 rounding of p (checked against the CPU
    //    engine above) would hide a small paging error in bf16. (Decode on tensor cores is in
    //    the greedy and graphs-kept checks above; both passes on tensor cores differ by up to
    //    7.5e-2 here on the tiny models, each kernel rounding p at its own running max, which is
    //    the bf16 noise of these models' large logits, not a bound that could find a paging
    //    error. tests/decode_attention.rs checks that kernel against f64.)
    let mut model = model;
    model.attention = crate::ops::AttentionKernels::CudaCores;
    // The GEMMs too: a decode step on decode_linear.cu's kernels sums in another order than
    // the full pass's cuBLASLt, which over a deep model at random init grows to ~1e-2 (2d
    // checks those kernels directly).
    model.decode_linear = crate::ops::DecodeLinear::Cublas;
    let params = SamplingParams { n: 3, temperature: 0.9, top_p: 0.95, top_k: 50, max_new_tokens: new, seed: 11, ..Default::default() };
    let (samples, _) = engine.generate(&model, &prompts, &params, None)?;
    let mut worst = 0f32;
    for c in &samples {
        if c.token_ids.is_empty() {
            continue;
        }
        let seq: Vec<u32> = prompts[c.prompt_index].iter().chain(&c.token_ids).copied().collect();
        let p = pack(std::slice::from_ref(&seq), cfg)?;
        let start = prompts[c.prompt_index].len() - 1;
        let rows: Vec<usize> = (start..seq.len() - 1).collect();
        let full = model.score(&p, &rows, Head::Lm { targets: &c.token_ids, temperature: 0.9 })?.value;
        worst = worst.max(max_abs_diff(&c.logprobs, &full));
    }
    let bound = if bf16 { 2e-2 } else { 1e-4 };
    out("paged-decode", worst <= bound, format!("{} samples (3 per prompt): max |log-prob diff| {worst:.1e} (≤ {bound:.0e}) against a full forward pass", samples.len()));
    Ok(())
}
