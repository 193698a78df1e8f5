//! Batched generation for RL rollouts.
//!
//! Runs on the [`Decoder`] (packed weights, unpadded ragged batches). Each prompt is prefilled
//! once and its cache copied to its `n` samples; then every live row decodes one token per
//! step against a preallocated cache. Rows that finish leave the batch, so later steps spend
//! no compute on them. Sampling runs on the host with one RNG per (prompt, sample) pair, so a
//! row's tokens do not depend on which other rows share its batch.

use crate::config::ModelConfig;
use crate::decode::{DecodeCache, Decoder, Scratch, Token};
use crate::error::{EngineError, Result};
use crate::model::CausalLm;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// How to pick tokens and when to stop.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingParams {
    /// Samples per prompt.
    pub n: usize,
    /// Softmax temperature; `0` means greedy.
    pub temperature: f32,
    /// Nucleus mass kept (1 = off).
    pub top_p: f32,
    /// Most likely tokens kept (0 = off).
    pub top_k: usize,
    /// New tokens at most.
    pub max_new_tokens: usize,
    /// Token ids that end a sequence (kept in the output).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end a sequence once the decoded text contains them.
    pub stop_strings: Vec<String>,
    /// Seed for the per-row RNGs.
    pub seed: u64,
    /// Index of the first prompt within the caller's whole batch: seeds use the global index,
    /// so a batch split across rollout ranks samples what one engine would have sampled.
    pub first_prompt: usize,
    /// When not empty, prompt `p`'s seed key instead of `first_prompt + p` (one per prompt):
    /// multi-turn rollouts key each turn's rows by trajectory, whichever rows are still live.
    pub prompt_keys: Vec<u64>,
    /// When not empty, prompt `p`'s own cap on new tokens (one per prompt, each at most
    /// `max_new_tokens`): multi-turn rollouts give each trajectory what is left of its budget
    /// while its turn shares a batch with the others.
    #[serde(default)]
    pub max_new_tokens_per_prompt: Vec<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 128,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            seed: 0,
            first_prompt: 0,
            prompt_keys: Vec::new(),
            max_new_tokens_per_prompt: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding for `max_new_tokens`, no stop.
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self { temperature: 0.0, max_new_tokens, ..Self::default() }
    }

    /// Whether `t` is a temperature the samplers take: 0 (greedy) or positive, finite.
    pub fn temperature_ok(t: f32) -> bool {
        t >= 0.0 && t.is_finite()
    }

    /// Whether `p` is a nucleus mass the samplers take: in (0, 1] (NaN is not).
    pub fn top_p_ok(p: f32) -> bool {
        p > 0.0 && p <= 1.0
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::Request(m));
        if self.n == 0 {
            return bad("sampling: n must be at least 1".into());
        }
        if !Self::temperature_ok(self.temperature) {
            return bad(format!("sampling: temperature must be >= 0, got {}", self.temperature));
        }
        if !Self::top_p_ok(self.top_p) {
            return bad(format!("sampling: top_p must be in (0, 1], got {}", self.top_p));
        }
        if self.max_new_tokens == 0 {
            return bad("sampling: max_new_tokens must be at least 1".into());
        }
        if self.max_new_tokens_per_prompt.contains(&0) {
            return bad("sampling: max_new_tokens_per_prompt must be at least 1 each".into());
        }
        Ok(())
    }

    /// Prompt `p`'s cap on new tokens.
    pub fn max_new_for(&self, p: usize) -> usize {
        self.max_new_tokens_per_prompt.get(p).map_or(self.max_new_tokens, |&m| m.min(self.max_new_tokens))
    }
}

/// Why a sequence stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token id was generated (it is the last token).
    StopToken(u32),
    /// The decoded text reached a stop string.
    StopString(String),
    /// `max_new_tokens` was reached.
    Length,
}

/// One generated sequence.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Completion {
    /// Which prompt it answers.
    pub prompt_index: usize,
    /// Which of the `n` samples.
    pub sample_index: usize,
    /// New token ids.
    pub token_ids: Vec<u32>,
    /// Log-probability of each new token under `softmax(logits / temperature)` (the raw
    /// distribution when greedy): the policy the actor recomputes, before top-k/top-p.
    pub logprobs: Vec<f32>,
    /// Why it stopped.
    pub finish_reason: FinishReason,
}

/// Turns token ids into text, for stop strings.
pub trait Detokenize {
    /// Decodes ids (special tokens included as text or not, as the implementor decides).
    fn detokenize(&self, ids: &[u32]) -> String;
}

impl Detokenize for reinforge_tokenizer::Tokenizer {
    fn detokenize(&self, ids: &[u32]) -> String {
        // Stop strings match what the user would read, so special tokens are kept as text.
        self.decode(ids, false).unwrap_or_default()
    }
}

/// Token ids that end a completion: the tokenizer's stop ids (EOS, generation_config) and the
/// model config's `eos_token_id`s, sorted and deduplicated.
pub fn stop_token_ids(tok: &reinforge_tokenizer::Tokenizer, cfg: &crate::ModelConfig) -> Vec<u32> {
    let mut ids: Vec<u32> = tok.stop_ids().iter().chain(&cfg.eos_token_ids).copied().collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Counters from one generation call.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GenerationStats {
    /// Prompt tokens prefilled (padding excluded).
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub new_tokens: usize,
    /// Decode steps run.
    pub decode_steps: usize,
    /// Sum over steps of rows in the batch (what finished rows saved shows here).
    pub row_steps: usize,
    /// Most rows in one decode step.
    pub max_step_rows: usize,
    /// Prefill passes run (prompts go through in several when their tokens exceed a pass's
    /// budget).
    pub prefills: usize,
}

/// Generates `params.n` completions for each prompt (packs the model's weights first; a caller
/// that generates repeatedly with the same weights keeps a [`Decoder`] and calls
/// [`generate_with`]).
pub fn generate(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    detok: Option<&dyn Detokenize>,
) -> Result<(Vec<Completion>, GenerationStats)> {
    // Checked before packing, so a bad request fails without that cost.
    if !admit(&model.config, prompts, params, detok)? {
        return Ok(Default::default());
    }
    run(&Decoder::new(model)?, prompts, params, detok)
}

/// Checks a request (sampling settings, prompts against the vocabulary and context, stop
/// strings' tokenizer); `false` when there is nothing to generate (no prompts). Every engine
/// (CPU, CUDA) admits requests through this one check.
pub fn admit(cfg: &ModelConfig, prompts: &[Vec<u32>], params: &SamplingParams, detok: Option<&dyn Detokenize>) -> Result<bool> {
    params.validate()?;
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(EngineError::Request(format!("prompt {i} is empty")));
    }
    if !params.stop_strings.is_empty() && detok.is_none() {
        return Err(EngineError::Request("stop strings need a tokenizer to decode text".into()));
    }
    if !params.max_new_tokens_per_prompt.is_empty() && params.max_new_tokens_per_prompt.len() != prompts.len() {
        return Err(EngineError::Request(format!("{} per-prompt token caps for {} prompts", params.max_new_tokens_per_prompt.len(), prompts.len())));
    }
    let max_pos = cfg.max_position_embeddings;
    if let Some((i, p)) = prompts.iter().enumerate().find(|(i, p)| p.len() + params.max_new_for(*i) > max_pos) {
        return Err(EngineError::Request(format!(
            "prompt {i} has {} tokens; with max_new_tokens {} it exceeds the model context of {max_pos} \
             (shorten the prompt, lower max_new_tokens, or filter with data.max_prompt_length)",
            p.len(),
            params.max_new_for(i)
        )));
    }
    if let Some(&bad) = prompts.iter().flatten().find(|&&id| id as usize >= cfg.vocab_size) {
        return Err(EngineError::Request(format!("token id {bad} is outside the vocabulary (size {})", cfg.vocab_size)));
    }
    Ok(!prompts.is_empty())
}

/// Most prompt tokens prefilled in one forward call: bounds the activation buffers
/// (`tokens × 2·intermediate` floats) when a rollout batch holds hundreds of prompts.
const PREFILL_CHUNK_TOKENS: usize = 4096;

/// [`generate`] with weights already packed.
pub fn generate_with(
    decoder: &Decoder,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    detok: Option<&dyn Detokenize>,
) -> Result<(Vec<Completion>, GenerationStats)> {
    if !admit(decoder.config(), prompts, params, detok)? {
        return Ok(Default::default());
    }
    run(decoder, prompts, params, detok)
}

/// The generation loop, for a request [`admit`] accepted.
fn run(
    decoder: &Decoder,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    detok: Option<&dyn Detokenize>,
) -> Result<(Vec<Completion>, GenerationStats)> {
    let cfg = decoder.config();
    let vocab = cfg.vocab_size;
    let n = params.n;
    // Row r answers prompt r / n, sample r % n.
    let rows: Vec<(usize, usize)> = (0..prompts.len()).flat_map(|p| (0..n).map(move |s| (p, s))).collect();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut cache = DecodeCache::new(cfg, rows.len(), longest + params.max_new_tokens);
    let mut scratch = Scratch::default();

    // Prefill each prompt once (into its first sample's row), then copy its cache rows to the
    // other samples: n samples cost one prefill.
    let mut prompt_logits = vec![0f32; prompts.len() * vocab];
    let mut first = 0;
    let mut prefills = 0;
    while first < prompts.len() {
        prefills += 1;
        let mut last = first + 1;
        let mut count = prompts[first].len();
        while last < prompts.len() && count + prompts[last].len() <= PREFILL_CHUNK_TOKENS {
            count += prompts[last].len();
            last += 1;
        }
        let mut tokens = Vec::with_capacity(count);
        let mut emit = Vec::with_capacity(count);
        for (p, prompt) in prompts.iter().enumerate().take(last).skip(first) {
            for (pos, &id) in prompt.iter().enumerate() {
                tokens.push(Token { id, row: p * n, pos });
                emit.push(pos + 1 == prompt.len());
            }
        }
        decoder.forward(&tokens, &emit, &mut cache, &mut scratch)?;
        prompt_logits[first * vocab..last * vocab].copy_from_slice(&scratch.logits[..(last - first) * vocab]);
        first = last;
    }
    for (p, prompt) in prompts.iter().enumerate() {
        for s in 1..n {
            cache.copy_prefix(p * n, p * n + s, prompt.len());
        }
    }

    let mut out: Vec<Completion> = rows
        .iter()
        .map(|&(p, s)| Completion {
            prompt_index: p,
            sample_index: s,
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            finish_reason: FinishReason::Length,
        })
        .collect();
    // The live rows, with their RNGs and next positions kept in the same order.
    let mut active: Vec<usize> = (0..rows.len()).collect();
    let mut rngs: Vec<ChaCha8Rng> = rows
        .iter()
        .map(|&(p, s)| ChaCha8Rng::seed_from_u64(row_seed(params, p, s)))
        .collect();
    let mut next_pos: Vec<usize> = rows.iter().map(|&(p, _)| prompts[p].len()).collect();
    let mut stats = GenerationStats { prompt_tokens: prompts.iter().map(Vec::len).sum::<usize>() * n, prefills, ..Default::default() };
    let longest_stop = params.stop_strings.iter().map(|s| s.len()).max().unwrap_or(0);

    for step in 0..params.max_new_tokens {
        let logits_of = |slot: usize| -> &[f32] {
            if step == 0 {
                let p = rows[active[slot]].0;
                &prompt_logits[p * vocab..(p + 1) * vocab]
            } else {
                &scratch.logits[slot * vocab..(slot + 1) * vocab]
            }
        };
        // Rows sample independently (each has its own RNG), so in parallel.
        let picks: Vec<(u32, f32)> = rngs
            .par_iter_mut()
            .enumerate()
            .map_init(Vec::new, |buf, (slot, rng)| sample(logits_of(slot), params, rng, buf))
            .collect();
        let mut keep = Vec::with_capacity(active.len());
        for (&r, &(tok, lp)) in active.iter().zip(&picks) {
            let c = &mut out[r];
            c.token_ids.push(tok);
            c.logprobs.push(lp);
            stats.new_tokens += 1;
            let mut done = None;
            if params.stop_token_ids.contains(&tok) {
                done = Some(FinishReason::StopToken(tok));
            } else if let (Some(d), false) = (detok, params.stop_strings.is_empty()) {
                // Decode only a tail long enough to contain any stop string (plus slack for
                // multi-byte tokens), not the whole completion each step.
                let tail = &c.token_ids[c.token_ids.len().saturating_sub(longest_stop + 8)..];
                let text = d.detokenize(tail);
                if let Some(s) = params.stop_strings.iter().find(|s| text.contains(s.as_str())) {
                    done = Some(FinishReason::StopString(s.clone()));
                }
            }
            // A prompt's own cap ends its rows as Length, like max_new_tokens.
            let capped = c.token_ids.len() >= params.max_new_for(rows[r].0);
            keep.push(done.is_none() && !capped);
            if let Some(reason) = done {
                c.finish_reason = reason;
            }
        }
        if step + 1 == params.max_new_tokens || !keep.contains(&true) {
            break;
        }
        // Finished rows leave the batch: later steps run only the live ones.
        retain_slots(&mut active, &keep);
        retain_slots(&mut next_pos, &keep);
        retain_slots(&mut rngs, &keep);
        let tokens: Vec<Token> = active
            .iter()
            .zip(&next_pos)
            .map(|(&r, &pos)| Token { id: *out[r].token_ids.last().unwrap_or(&0), row: r, pos })
            .collect();
        for p in &mut next_pos {
            *p += 1;
        }
        stats.decode_steps += 1;
        stats.row_steps += active.len();
        stats.max_step_rows = stats.max_step_rows.max(active.len());
        decoder.forward(&tokens, &vec![true; tokens.len()], &mut cache, &mut scratch)?;
    }
    Ok((out, stats))
}

/// The seed of prompt `p`'s sample `s` (by the prompt's index in the caller's whole batch,
/// so a batch split across engines samples what one engine would).
pub fn row_seed(params: &SamplingParams, p: usize, s: usize) -> u64 {
    let key = params.prompt_keys.get(p).copied().unwrap_or((p + params.first_prompt) as u64);
    params.seed ^ (key << 20 | s as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Keeps the elements whose slot in `keep` is true (the live rows' per-row state).
fn retain_slots<T>(v: &mut Vec<T>, keep: &[bool]) {
    let mut slot = 0;
    v.retain(|_| {
        slot += 1;
        keep[slot - 1]
    });
}

/// Picks one token from a row of logits and returns it with its log-probability. `buf` is
/// scratch space for the unnormalised probabilities.
fn sample(logits: &[f32], params: &SamplingParams, rng: &mut ChaCha8Rng, buf: &mut Vec<f64>) -> (u32, f32) {
    let greedy = params.temperature == 0.0;
    let inv_t = if greedy { 1.0 } else { 1.0 / params.temperature as f64 };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    buf.clear();
    buf.extend(logits.iter().map(|&z| ((z as f64 - max) * inv_t).exp()));
    let total: f64 = buf.iter().sum();
    // log p(z) = (z - max)·inv_t - log Σ exp((z' - max)·inv_t)
    let norm = total.ln();
    let logprob = |z: f32| ((z as f64 - max) * inv_t - norm) as f32;
    if greedy {
        let (i, &z) = logits
            .iter()
            .enumerate()
            .fold((0, &f32::NEG_INFINITY), |best, cur| if cur.1 > best.1 { cur } else { best });
        return (i as u32, logprob(z));
    }
    if params.top_k == 0 && params.top_p >= 1.0 {
        let mut u = rng.random::<f64>() * total;
        let mut chosen = logits.len() - 1;
        for (i, &w) in buf.iter().enumerate() {
            if u < w {
                chosen = i;
                break;
            }
            u -= w;
        }
        return (chosen as u32, logprob(logits[chosen]));
    }
    let mut cand: Vec<(u32, f64)> = buf.iter().enumerate().map(|(i, &w)| (i as u32, w)).collect();
    if params.top_k > 0 && params.top_k < cand.len() {
        cand.select_nth_unstable_by(params.top_k - 1, |a, b| b.1.total_cmp(&a.1));
        cand.truncate(params.top_k);
    }
    if params.top_p < 1.0 {
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        let total: f64 = cand.iter().map(|c| c.1).sum();
        let mut acc = 0.0;
        let mut cut = cand.len();
        for (i, c) in cand.iter().enumerate() {
            acc += c.1 / total;
            if acc >= params.top_p as f64 {
                cut = i + 1;
                break;
            }
        }
        cand.truncate(cut);
    }
    let total: f64 = cand.iter().map(|c| c.1).sum();
    let mut u = rng.random::<f64>() * total;
    let mut chosen = cand[cand.len() - 1].0;
    for &(i, w) in &cand {
        if u < w {
            chosen = i;
            break;
        }
        u -= w;
    }
    (chosen, logprob(logits[chosen as usize]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_argmax_and_logprob_is_normalised() {
        let logits = [0.5f32, 2.0, -1.0, 1.0];
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let (tok, lp) = sample(&logits, &SamplingParams::greedy(1), &mut rng, &mut Vec::new());
        assert_eq!(tok, 1);
        let lse = logits.iter().map(|&z| (z as f64).exp()).sum::<f64>().ln();
        assert!((lp as f64 - (2.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn top_k_one_is_greedy_and_sampling_follows_probabilities() {
        let logits = [0.0f32, 1.0, 3.0, 2.0];
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let p = SamplingParams { top_k: 1, ..Default::default() };
        for _ in 0..20 {
            assert_eq!(sample(&logits, &p, &mut rng, &mut Vec::new()).0, 2);
        }
        let p = SamplingParams::default();
        let mut counts = [0usize; 4];
        for _ in 0..20000 {
            counts[sample(&logits, &p, &mut rng, &mut Vec::new()).0 as usize] += 1;
        }
        let z: f64 = logits.iter().map(|&x| (x as f64).exp()).sum();
        for (i, &c) in counts.iter().enumerate() {
            let expect = (logits[i] as f64).exp() / z;
            assert!((c as f64 / 20000.0 - expect).abs() < 0.015, "token {i}: {c} vs {expect}");
        }
    }

    #[test]
    fn top_p_keeps_the_nucleus_only() {
        // probabilities ≈ [0.032, 0.087, 0.644, 0.237]: top_p 0.7 keeps tokens 2 and 3.
        let logits = [0.0f32, 1.0, 3.0, 2.0];
        let p = SamplingParams { top_p: 0.7, ..Default::default() };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..2000 {
            let t = sample(&logits, &p, &mut rng, &mut Vec::new()).0;
            assert!(t == 2 || t == 3, "sampled {t} outside the nucleus");
        }
    }
}
