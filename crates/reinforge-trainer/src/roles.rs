//! The roles of DESIGN.md §2 as worker groups, and their local (single-process) backend.
//!
//! Every call takes and returns plain host data ([`SeqBatch`], [`Mat`]) so that a remote
//! backend (Ray) can ship the same messages to worker processes. The local backend runs each
//! role in this process; actor and rollout share weights (the hybrid engine).

use crate::error::TrainError;
use crate::multi_turn::{Agent, MultiTurnRollout};
use reinforge_algos::burn_ops;
use reinforge_algos::{AggOptions, KlEstimator, KlPenalty, LossAggMode, Mat, PolicyLossConfig, ValueLossConfig};
use reinforge_engine::{
    generate_with, token_logprobs_at, token_logprobs_from, CausalLm, Completion, Decoder, ForwardInput, ModelConfig, OptimConfig, Pick, SamplingParams, SharedPrompt, Trainer,
    ValueModel,
};
use reinforge_metrics::Metrics;
use reinforge_tokenizer::Tokenizer;
use burn::tensor::{Device, Int, Tensor, TensorData};
use reinforge_cluster::collective::StarGroup;
use reinforge_engine::HostTensor;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Prompt + response sequences laid out for scoring and training: prompts left-padded to
/// `prompt_len`, responses right-padded to `response_len`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeqBatch {
    /// `[N, prompt_len + response_len]` token ids.
    pub ids: Vec<Vec<u32>>,
    /// Same shape: true on real tokens.
    pub attention: Vec<Vec<bool>>,
    /// `[N, response_len]`: 1 on response tokens.
    pub response_mask: Mat,
    /// Width of the prompt part.
    pub prompt_len: usize,
    /// Width of the response part.
    pub response_len: usize,
}

impl SeqBatch {
    /// Lays out prompts and their completions.
    pub fn build(prompts: &[&[u32]], responses: &[&[u32]], pad_id: u32) -> Self {
        Self::build_masked(prompts, responses, pad_id, None)
    }

    /// Lays out prompts and their completions; `loss_masks` (one per response, a flag per
    /// token) leaves the tokens marked false out of every loss while the model still sees
    /// them (a multi-turn rollout's observations).
    pub fn build_masked(prompts: &[&[u32]], responses: &[&[u32]], pad_id: u32, loss_masks: Option<&[Vec<bool>]>) -> Self {
        let p = prompts.iter().map(|x| x.len()).max().unwrap_or(0);
        let r = responses.iter().map(|x| x.len()).max().unwrap_or(0).max(1);
        let mut ids = Vec::with_capacity(prompts.len());
        let mut attention = Vec::with_capacity(prompts.len());
        let mut rmask = Vec::with_capacity(prompts.len() * r);
        for (pr, re) in prompts.iter().zip(responses) {
            let mut row = vec![pad_id; p - pr.len()];
            let mut att = vec![false; p - pr.len()];
            row.extend_from_slice(pr);
            att.extend(std::iter::repeat_n(true, pr.len()));
            row.extend_from_slice(re);
            att.extend(std::iter::repeat_n(true, re.len()));
            row.extend(std::iter::repeat_n(pad_id, r - re.len()));
            att.extend(std::iter::repeat_n(false, r - re.len()));
            let i = ids.len();
            let trained = |j: usize| loss_masks.is_none_or(|m| m[i].get(j).copied().unwrap_or(false));
            rmask.extend((0..r).map(|j| if j < re.len() && trained(j) { 1.0 } else { 0.0 }));
            ids.push(row);
            attention.push(att);
        }
        let n = ids.len();
        Self { ids, attention, response_mask: Mat::new(n, r, rmask).expect("shape by construction"), prompt_len: p, response_len: r }
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The rows `rows` as a batch of their own (same widths, so log-probs line up).
    pub fn select(&self, rows: &[usize]) -> SeqBatch {
        SeqBatch {
            ids: rows.iter().map(|&i| self.ids[i].clone()).collect(),
            attention: rows.iter().map(|&i| self.attention[i].clone()).collect(),
            response_mask: rows_of(&self.response_mask, rows),
            prompt_len: self.prompt_len,
            response_len: self.response_len,
        }
    }

    /// The model input for rows `rows`, without the columns that are padding in every one of
    /// them: a micro-batch costs what its own sequences need, not the whole batch's longest
    /// prompt and response. (Positions come from the mask, so they do not change; the
    /// outputs go back to the batch's layout through [`Window`].)
    pub fn input(&self, rows: &[usize]) -> (ForwardInput, Window) {
        let leading = |i: usize| self.attention[i].iter().take_while(|&&a| !a).count();
        let trailing = |i: usize| self.attention[i].iter().rev().take_while(|&&a| !a).count();
        // Keep the last prompt column (it predicts the first response token) and one response
        // column, so the response part of the output always exists.
        let lead = rows.iter().map(|&i| leading(i)).min().unwrap_or(0).min(self.prompt_len.saturating_sub(1));
        let tail = rows.iter().map(|&i| trailing(i)).min().unwrap_or(0).min(self.response_len.saturating_sub(1));
        let width = self.prompt_len + self.response_len - lead - tail;
        let cols = lead..lead + width;
        let input = ForwardInput::from_mask(
            rows.iter().map(|&i| self.ids[i][cols.clone()].to_vec()).collect(),
            rows.iter().map(|&i| self.attention[i][cols.clone()].to_vec()).collect(),
        );
        (input, Window { lead, tail, prompt_len: self.prompt_len })
    }
}

/// Where a micro-batch's trimmed input sits in its batch's columns.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Columns dropped on the left (padding of every row's prompt).
    lead: usize,
    /// Columns dropped on the right (padding after every row's response).
    tail: usize,
    /// The batch's prompt width.
    prompt_len: usize,
}

impl Window {
    /// The input column of the first response token: log-probs before it are never read.
    pub fn response_start(&self) -> usize {
        self.prompt_len - self.lead
    }

    /// The batch's response columns `[n, response_len]` of a per-position output `[n, width]`
    /// whose column `c` belongs to batch position `c + shift` (`shift` 0 for log-probs and
    /// entropies, 1 for values, read at the position that predicts the token); the dropped
    /// tail reads as 0.
    pub fn response(&self, t: Tensor<2>, shift: usize) -> Tensor<2> {
        let [n, width] = t.dims();
        let start = self.prompt_len - self.lead - shift;
        let part = t.clone().slice([0..n, start..width - shift]);
        if self.tail == 0 {
            return part;
        }
        let zeros = Tensor::<2>::zeros([n, self.tail], &t.device());
        Tensor::cat(vec![part, zeros], 1)
    }
}

/// How a micro-batch goes through the model.
enum Layout {
    /// One row per sequence, without the columns that are padding in all of them.
    Rows(ForwardInput, Window),
    /// Sequences with the same prompt packed after one copy of it
    /// ([`ForwardInput::shared_prompts`]); `index[r * response_len + k]` is the pick scoring
    /// response token `k` of micro-batch row `r`, or `picks.len()` past its response (a 0).
    Shared { input: ForwardInput, picks: Vec<Pick>, index: Vec<i64> },
}

impl SeqBatch {
    /// Row `i`'s prompt and response tokens without padding, when it has the layout
    /// [`SeqBatch::build`] gives (a left-padded prompt, a right-padded response).
    fn parts(&self, i: usize) -> Option<(&[u32], &[u32])> {
        let (ids, att, p) = (&self.ids[i], &self.attention[i], self.prompt_len);
        let lead = att[..p].iter().take_while(|&&a| !a).count();
        let len = att[p..].iter().take_while(|&&a| a).count();
        let holes = att[lead..p].iter().any(|&a| !a) || att[p + len..].iter().any(|&a| a);
        (!holes && lead < p).then(|| (&ids[lead..p], &ids[p..p + len]))
    }

    /// The cheapest layout of micro-batch `rows` for `config`'s model: rows of their own, or —
    /// when `share` and some rows have the same prompt (GRPO's n samples) — each prompt once
    /// with up to k of its responses after it, k chosen by [`ModelConfig::layer_macs`] (one
    /// long row costs attention quadratic in its width, so k stays small for long responses).
    fn layout(&self, rows: &[usize], share: bool, config: &ModelConfig) -> Layout {
        let (input, window) = self.input(rows);
        let width = input.ids.first().map_or(0, Vec::len);
        let unshared = config.layer_macs(rows.len(), width);
        let Some(parts) = share.then(|| rows.iter().map(|&i| self.parts(i)).collect::<Option<Vec<_>>>()).flatten() else {
            return Layout::Rows(input, window);
        };
        let prompts: Vec<&[u32]> = parts.iter().map(|(p, _)| *p).collect();
        let groups: Vec<(&[u32], Vec<usize>)> = same_prompt_groups(&prompts).into_iter().map(|g| (prompts[g[0]], g)).collect();
        let largest = groups.iter().map(|(_, m)| m.len()).max().unwrap_or(1);
        let packed = |k: usize| -> Vec<(&[u32], &[usize])> { groups.iter().flat_map(|(p, m)| m.chunks(k).map(move |c| (*p, c))).collect() };
        let cost = |k: usize| {
            let rows = packed(k);
            let width = rows.iter().map(|(p, c)| p.len() + c.iter().map(|&m| parts[m].1.len()).sum::<usize>()).max().unwrap_or(0);
            config.layer_macs(rows.len(), width)
        };
        let Some((k, _)) = (2..=largest).map(|k| (k, cost(k))).filter(|&(_, c)| c < unshared).min_by(|a, b| a.1.total_cmp(&b.1)) else {
            return Layout::Rows(input, window);
        };
        let rows_k = packed(k);
        let shared: Vec<SharedPrompt<'_>> = rows_k.iter().map(|(p, c)| SharedPrompt { prompt: p, continuations: c.iter().map(|&m| parts[m].1).collect() }).collect();
        let Ok((input, picks)) = ForwardInput::shared_prompts(&shared, 0) else {
            // Unreachable: `parts` only returns non-empty prompts.
            return Layout::Rows(input, window);
        };
        // Picks come packed row by packed row, response by response: where each row's start.
        let mut first = vec![0usize; rows.len()];
        let mut next = 0;
        for (_, c) in &rows_k {
            for &m in *c {
                first[m] = next;
                next += parts[m].1.len();
            }
        }
        let r = self.response_len;
        let index = (0..rows.len()).flat_map(|m| (0..r).map(move |k| (m, k))).map(|(m, k)| if k < parts[m].1.len() { first[m] + k } else { next } as i64).collect();
        Layout::Shared { input, picks, index }
    }

    /// Log-probs (and entropies when asked) of the response tokens of micro-batch `rows` under
    /// `model`, `[rows, response_len]`, in the cheapest [`SeqBatch::layout`].
    pub fn score(&self, model: &CausalLm, rows: &[usize], temperature: f64, with_entropy: bool, share: bool) -> Result<(Tensor<2>, Option<Tensor<2>>), TrainError> {
        match self.layout(rows, share, &model.config) {
            Layout::Rows(input, window) => {
                let out = token_logprobs_from(model, &input, window.response_start(), temperature, with_entropy)?;
                Ok((window.response(out.logprobs, 0), out.entropy.map(|e| window.response(e, 0))))
            }
            Layout::Shared { input, picks, index } => {
                let out = token_logprobs_at(model, &input, &picks, temperature, with_entropy)?;
                let device = out.logprobs.device();
                let (n, r) = (rows.len(), self.response_len);
                let index = Tensor::<1, Int>::from_data(TensorData::new(index, [n * r]), &device);
                // Past each response: the zero appended after the picks.
                let lay = |x: Tensor<1>| Tensor::cat(vec![x, Tensor::zeros([1], &device)], 0).select(0, index.clone()).reshape([n, r]);
                Ok((lay(out.logprobs), out.entropy.map(lay)))
            }
        }
    }
}

/// Selected rows of a `[N, T]` matrix.
pub fn rows_of(m: &Mat, rows: &[usize]) -> Mat {
    let c = m.cols();
    let data = rows.iter().flat_map(|&r| m.data()[r * c..(r + 1) * c].iter().copied()).collect();
    Mat::new(rows.len(), c, data).expect("shape by construction")
}

pub(crate) fn to_tensor(m: &Mat, device: &Device) -> Tensor<2> {
    burn_ops::mat_to_tensor(m, device)
}

/// Row-major `[n, r]` host matrix from a tensor.
pub(crate) fn to_mat(t: Tensor<2>) -> Result<Mat, TrainError> {
    Ok(burn_ops::tensor_to_mat(t)?)
}

/// How a batch's sequences are grouped into micro-batches (one forward, and backward when
/// training, each; gradients accumulate over them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum MicroBatching {
    /// This many sequences each (`ppo_micro_batch_size`).
    Seqs(usize),
    /// In batch order, as many sequences as fit `max` tokens, prompt and response (verl's
    /// `use_dynamic_bsz` with `ppo_max_token_len_per_gpu`); a longer one goes alone. With
    /// `shared_prompts` (`actor.share_prompts`) the tokens counted are those [`SharedPacking`]
    /// packs: a prompt its samples share counts once, as it is computed once.
    Tokens { max: usize, shared_prompts: bool },
}

/// Positions of `prompts` grouped by equal prompt, groups in order of first appearance: the
/// samples that can share one copy of their prompt (both engines' shared layouts).
pub(crate) fn same_prompt_groups<P: PartialEq>(prompts: &[P]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        match groups.iter_mut().find(|g| prompts[g[0]] == *p) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

/// How a micro-batch's shared prompts are packed (`actor.share_prompts`), built row by row so
/// that a token budget counts what packing really costs. The rows with one prompt follow one
/// copy of it (all but its last token: each row holds that token and its response), and the
/// prompt gets another copy whenever its rows' queries would pass twice a whole sequence's
/// worth, `2 · (prompt + response_len)`: on a GPU one thread block sums a prompt key tile's
/// dk/dv over every row after that copy, and more rows than that would make those blocks the
/// step's long tail. A one-token prompt has nothing to share: its rows pack alone.
pub struct SharedPacking<'a> {
    response_len: usize,
    /// The copy each prompt's next row joins, while it has room.
    open: std::collections::HashMap<&'a [u32], usize>,
    copies: Vec<PromptCopy>,
    tokens: usize,
}

/// One copy of a prompt and the rows after it.
struct PromptCopy {
    /// The order of the prompt's first row, so that a prompt's copies pack together.
    prompt_order: usize,
    rows: Vec<usize>,
    queries: usize,
}

impl<'a> SharedPacking<'a> {
    /// Nothing packed yet, for a batch whose responses are at most `response_len` long.
    pub fn new(response_len: usize) -> Self {
        SharedPacking { response_len, open: std::collections::HashMap::new(), copies: Vec::new(), tokens: 0 }
    }

    /// The copy a row with `prompt` and `response` tokens would join, if any.
    fn joins(&self, prompt: &[u32], response: usize) -> Option<usize> {
        let budget = 2 * (prompt.len() + self.response_len);
        self.open.get(prompt).copied().filter(|&c| self.copies[c].queries + 1 + response <= budget)
    }

    /// The tokens a row would add: its last prompt token and its response after a copy of its
    /// prompt, or the whole prompt and response when it starts a copy.
    pub fn cost(&self, prompt: &[u32], response: usize) -> usize {
        Self::added(self.joins(prompt, response), prompt, response)
    }

    /// [`Self::cost`] of a row that joins copy `join` (`None`: starts one).
    fn added(join: Option<usize>, prompt: &[u32], response: usize) -> usize {
        match join {
            Some(_) => 1 + response,
            None => prompt.len() + response,
        }
    }

    /// Adds row `row`.
    pub fn push(&mut self, row: usize, prompt: &'a [u32], response: usize) {
        let join = self.joins(prompt, response);
        self.tokens += Self::added(join, prompt, response);
        match join {
            Some(c) => {
                self.copies[c].rows.push(row);
                self.copies[c].queries += 1 + response;
            }
            None => {
                let prompt_order = self.open.get(prompt).map_or(self.copies.len(), |&c| self.copies[c].prompt_order);
                if prompt.len() > 1 {
                    self.open.insert(prompt, self.copies.len());
                }
                self.copies.push(PromptCopy { prompt_order, rows: vec![row], queries: 1 + response });
            }
        }
    }

    /// Tokens packed so far.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// The rows after each copy, a prompt's copies together, prompts in order of first row.
    pub fn groups(mut self) -> Vec<Vec<usize>> {
        self.copies.sort_by_key(|c| c.prompt_order);
        self.copies.into_iter().map(|c| c.rows).collect()
    }
}

impl MicroBatching {
    /// By tokens (`max_tokens` each) when `by_tokens`, else `seqs` sequences each: a role's
    /// `use_dynamic_bsz`, `ppo_max_token_len_per_gpu` and `ppo_micro_batch_size`, with
    /// `actor.share_prompts`.
    pub fn new(by_tokens: bool, max_tokens: usize, seqs: usize, shared_prompts: bool) -> Self {
        if by_tokens {
            MicroBatching::Tokens { max: max_tokens, shared_prompts }
        } else {
            MicroBatching::Seqs(seqs)
        }
    }

    /// The fixed number of sequences per micro-batch, if there is one (a mini-batch must then
    /// split into whole micro-batches).
    pub fn fixed_seqs(self) -> Option<usize> {
        match self {
            MicroBatching::Seqs(n) => Some(n),
            MicroBatching::Tokens { .. } => None,
        }
    }

    /// Splits `rows` (in order) into micro-batches, `cost(packing, r)` being the tokens row
    /// `r` adds to a micro-batch packed so far as `packing`, and `push` adding it.
    ///
    /// Token budgets fill in order rather than balancing lengths across micro-batches (verl's
    /// Karmarkar–Karp): the samples of one prompt sit next to each other in a batch, and
    /// keeping them together lets `actor.share_prompts` compute their prompt once.
    fn split<P>(self, rows: &[usize], fresh: impl Fn() -> P, cost: impl Fn(&P, usize) -> usize, push: impl Fn(&mut P, usize)) -> Vec<Vec<usize>> {
        let max = match self {
            MicroBatching::Seqs(n) => return rows.chunks(n.max(1)).map(<[usize]>::to_vec).collect(),
            MicroBatching::Tokens { max, .. } => max,
        };
        let (mut out, mut cur, mut used, mut packing) = (Vec::new(), Vec::new(), 0usize, fresh());
        for &r in rows {
            let mut c = cost(&packing, r);
            if !cur.is_empty() && used + c > max {
                out.push(std::mem::take(&mut cur));
                (used, packing) = (0, fresh());
                c = cost(&packing, r);
            }
            used += c;
            push(&mut packing, r);
            cur.push(r);
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        out
    }
}

impl SeqBatch {
    /// Row `i`'s length in tokens, prompt and response, without padding.
    pub fn tokens(&self, i: usize) -> usize {
        self.attention[i].iter().filter(|&&a| a).count()
    }

    /// Row `i`'s prompt tokens and its response's length, without padding.
    pub fn prompt_and_response(&self, i: usize) -> (Vec<u32>, usize) {
        let (ids, att, p) = (&self.ids[i], &self.attention[i], self.prompt_len);
        let prompt = (0..p).filter(|&j| att[j]).map(|j| ids[j]).collect();
        (prompt, att[p..].iter().take_while(|&&a| a).count())
    }

    /// `rows` grouped into micro-batches by `m`.
    pub fn micro_batches(&self, rows: &[usize], m: MicroBatching) -> Vec<Vec<usize>> {
        if !matches!(m, MicroBatching::Tokens { shared_prompts: true, .. }) {
            return m.split(rows, || (), |_, r| self.tokens(r), |_, _| ());
        }
        let parts: std::collections::HashMap<usize, (Vec<u32>, usize)> = rows.iter().map(|&r| (r, self.prompt_and_response(r))).collect();
        m.split(
            rows,
            || SharedPacking::new(self.response_len),
            |pack, r| pack.cost(&parts[&r].0, parts[&r].1),
            |pack, r| pack.push(r, &parts[&r].0, parts[&r].1),
        )
    }

    /// Every row, grouped into micro-batches by `m`.
    pub fn all_micro_batches(&self, m: MicroBatching) -> Vec<Vec<usize>> {
        self.micro_batches(&(0..self.len()).collect::<Vec<_>>(), m)
    }
}

/// Generates responses (the rollout role).
pub trait RolloutGroup {
    /// `params.n` completions per prompt.
    fn generate(&mut self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Completion>, TrainError>;

    /// `params.n` multi-turn trajectories per prompt with `agent`'s loop (Search-R1's search
    /// or verl's tool agent); `agent_kwargs` per prompt (see [`Agent::rollout`]). By default the turns run here, each a
    /// [`RolloutGroup::generate`] call; remote groups send the whole loop to their ranks,
    /// which call their own node's tool servers.
    fn generate_turns(&mut self, prompts: &[Vec<u32>], agent_kwargs: &[serde_json::Value], params: &SamplingParams, agent: &Agent) -> Result<MultiTurnRollout, TrainError> {
        agent.rollout(&mut |c: &[Vec<u32>], p: &SamplingParams| self.generate(c, p), prompts, agent_kwargs, params)
    }
}

/// The trained policy (the actor role).
pub trait ActorGroup {
    /// Per-token log-probs of the responses, no gradient.
    fn logprobs(&mut self, batch: &SeqBatch, micro: MicroBatching) -> Result<Mat, TrainError>;
    /// One optimizer step over a mini-batch, with gradient accumulation over micro-batches.
    fn update(&mut self, batch: &SeqBatch, mini: &ActorMiniBatch<'_>, lr: f64) -> Result<Metrics, TrainError>;
}

/// Actor and rollout together: generation, log-probs, updates, and weight sync between them.
pub trait PolicyGroup: RolloutGroup + ActorGroup {
    /// Makes the rollout engines use the actor's current weights.
    fn sync_rollout(&mut self) -> Result<(), TrainError>;
    /// The actor's weights and optimizer state, for a checkpoint.
    fn state(&mut self) -> Result<ModelState, TrainError>;
}

/// A policy an engine holds in this process (not a remote group): what a worker rank needs
/// from it besides the [`PolicyGroup`] calls.
pub trait HostedPolicy: PolicyGroup {
    /// The actor's weights by HF name with its `config.json`, for rollout engines elsewhere.
    fn weights(&mut self) -> Result<(BTreeMap<String, HostTensor>, serde_json::Value), TrainError>;
    /// Puts `g` in as the data-parallel group the next update all-reduces over, returning the
    /// one it had (a rank hosting actor and critic lends one group to whichever trains).
    fn swap_collective(&mut self, g: Option<StarGroup>) -> Option<StarGroup>;
    /// The weights rollout engines read, where they are one flat GPU buffer (an NCCL broadcast
    /// sends them from here); `None` on the CPU engine.
    fn device_weights(&self) -> Option<DeviceWeights> {
        None
    }
}

/// A policy's weights as one flat buffer on a GPU: what an NCCL broadcast moves from the actor
/// to rollout engines (every engine lays the same model out the same way).
pub struct DeviceWeights {
    /// The GPU.
    pub gpu: std::sync::Arc<reinforge_cuda::Gpu>,
    /// The buffer.
    pub ptr: reinforge_cuda::DevPtr,
    /// Its elements.
    pub elems: usize,
    /// Their type.
    pub dt: reinforge_cuda::DType,
}

impl DeviceWeights {
    /// All of `m`'s weights (its compute copy, in its layout).
    pub fn of(m: &reinforge_cuda::DeviceModel) -> DeviceWeights {
        DeviceWeights { gpu: std::sync::Arc::clone(&m.gpu), ptr: m.params.ptr, elems: m.layout.total, dt: m.dt }
    }
}

/// A critic an engine holds in this process.
pub trait HostedCritic: CriticGroup {
    /// As [`HostedPolicy::swap_collective`].
    fn swap_collective(&mut self, g: Option<StarGroup>) -> Option<StarGroup>;
}

/// A rollout engine with weights of its own (not colocated with the actor): it generates, and
/// takes the actor's weights after each update.
pub trait RolloutEngine: RolloutGroup {
    /// Replaces the weights (HF names, the actor's layout).
    fn set_weights(&mut self, tensors: BTreeMap<String, HostTensor>) -> Result<(), TrainError>;
    /// Where an NCCL broadcast writes the weights (as [`HostedPolicy::device_weights`]).
    fn device_weights(&self) -> Option<DeviceWeights> {
        None
    }
}

/// The CPU engine's rollout with its own packed weights.
pub struct LocalRollout {
    /// The packed weights and decode buffers.
    pub decoder: Decoder,
    /// Decodes text for stop strings.
    pub tokenizer: Tokenizer,
}

impl RolloutGroup for LocalRollout {
    fn generate(&mut self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Completion>, TrainError> {
        Ok(generate_with(&self.decoder, prompts, params, Some(&self.tokenizer))?.0)
    }
}

impl RolloutEngine for LocalRollout {
    fn set_weights(&mut self, tensors: BTreeMap<String, HostTensor>) -> Result<(), TrainError> {
        let cfg = self.decoder.config().clone();
        let device = reinforge_engine::DeviceSpec::Cpu.inference_device()?;
        // `_with(None)`: unmerged LoRA factors here are an error, not silently the base model.
        self.decoder.load_weights(&CausalLm::from_hf_tensors_with(cfg, None, tensors, &device)?)?;
        Ok(())
    }
}

/// A trained model's state as host data: what a checkpoint stores.
pub struct ModelState {
    /// Weights by HF name.
    pub tensors: BTreeMap<String, HostTensor>,
    /// The HF `config.json` contents.
    pub config_json: serde_json::Value,
    /// AdamW's moments by parameter name (the same on every engine).
    pub optimizer: reinforge_engine::OptimizerState,
    /// The LoRA adapter's shape, when `tensors` hold one's factors.
    pub lora: Option<reinforge_engine::LoraConfig>,
}

/// Loss normalisers of a whole mini-batch, for a rank that trains on part of it: data-parallel
/// ranks then add up to exactly the single-process loss.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct MiniNorm {
    /// Response tokens in the whole mini-batch.
    pub tokens: f64,
    /// Sequences with at least one response token in it.
    pub seqs: f64,
    /// Rows in it.
    pub rows: usize,
}

impl MiniNorm {
    /// The normalisers of `rows` of `mask`.
    pub fn of(mask: &Mat, rows: &[usize]) -> Self {
        let m = rows_of(mask, rows);
        let c = m.cols().max(1);
        Self {
            tokens: m.data().iter().sum(),
            seqs: m.data().chunks(c).filter(|r| r.iter().any(|&x| x > 0.0)).count() as f64,
            rows: rows.len(),
        }
    }
}

/// What an actor update needs besides the sequences.
pub struct ActorMiniBatch<'a> {
    /// Rows of the batch in this mini-batch.
    pub rows: &'a [usize],
    /// `[N, R]` log-probs at rollout time; `None` when the batch is used once, on-policy: the
    /// old policy is the one being updated, so the update takes its own log-probs (detached,
    /// ratio exactly 1) and no separate pass computes them.
    pub old_log_probs: Option<&'a Mat>,
    /// `[N, R]` advantages.
    pub advantages: &'a Mat,
    /// `[N, R]` reference log-probs (KL loss).
    pub ref_log_probs: Option<&'a Mat>,
    /// Normalisers of the whole mini-batch when `rows` is one rank's share of it.
    pub norm: Option<MiniNorm>,
}

/// The frozen reference policy.
pub trait RefGroup {
    /// Per-token log-probs of the responses.
    fn logprobs(&mut self, batch: &SeqBatch, micro: MicroBatching) -> Result<Mat, TrainError>;
}

/// The value model.
pub trait CriticGroup {
    /// Per-token values of the responses.
    fn values(&mut self, batch: &SeqBatch, micro: MicroBatching) -> Result<Mat, TrainError>;
    /// One optimizer step regressing values to returns; `norm` as in [`ActorMiniBatch::norm`].
    fn update(&mut self, batch: &SeqBatch, rows: &[usize], values: &Mat, returns: &Mat, lr: f64, norm: Option<MiniNorm>) -> Result<Metrics, TrainError>;
    /// The value model's weights and optimizer state, for a checkpoint.
    fn state(&mut self) -> Result<ModelState, TrainError>;
}

/// Policy-update settings resolved from the config.
#[derive(Clone)]
pub struct ActorSettings {
    /// Sampling temperature (log-probs are taken under `logits / temperature`).
    pub temperature: f64,
    /// How the update's sequences form micro-batches.
    pub micro: MicroBatching,
    /// PPO loss settings.
    pub policy: PolicyLossConfig,
    /// Entropy bonus.
    pub entropy_coeff: f64,
    /// KL-loss estimator and coefficient, when on.
    pub kl_loss: Option<(KlPenalty, f64)>,
    /// Each prompt computed once for all its samples in a micro-batch (`actor.share_prompts`).
    pub share_prompts: bool,
}

/// What the policy loss of a micro-batch needs besides its log-probs: shared by the engines,
/// so a micro-batch's loss is the same code on the CPU (log-probs from the model's graph) and
/// on a GPU (log-probs as leaves whose gradients go back to the device).
pub(crate) struct PolicyLossCtx<'a> {
    pub batch: &'a SeqBatch,
    pub mini: &'a ActorMiniBatch<'a>,
    pub settings: &'a ActorSettings,
    pub policy: &'a PolicyLossConfig,
    pub agg: &'a AggOptions,
    pub norm: MiniNorm,
    pub device: &'a Device,
}

impl PolicyLossCtx<'_> {
    /// The loss of micro-batch `rows` (PPO clip, entropy bonus, KL loss), its metrics added to
    /// `sums`; `lp` and `ent` are `[rows, response_len]`.
    pub fn micro_loss(&self, rows: &[usize], lp: Tensor<2>, ent: Option<Tensor<2>>, sums: &mut Metrics) -> Result<Tensor<1>, TrainError> {
        let (s, batch, mini, device) = (self.settings, self.batch, self.mini, self.device);
        let mode = s.policy.loss_agg_mode;
        let mask = to_tensor(&rows_of(&batch.response_mask, rows), device);
        let old = match mini.old_log_probs {
            Some(o) => to_tensor(&rows_of(o, rows), device),
            None => lp.clone().detach(),
        };
        let adv = to_tensor(&rows_of(mini.advantages, rows), device);
        // Without an old-log-prob pass the step's KL to the reference (a token mean over the
        // whole mini-batch, which is then the whole batch) is measured here.
        if let (None, Some(r)) = (mini.old_log_probs, mini.ref_log_probs) {
            let kl = burn_ops::kl_penalty(old.clone(), to_tensor(&rows_of(r, rows), device), KlEstimator::K1.into())?;
            let masked = burn_ops::scalar((kl * mask.clone()).sum(), "kl_ref")?;
            sums.accumulate("actor/kl_ref", masked / self.norm.tokens.max(1.0));
        }
        let pl = burn_ops::policy_loss(old, lp.clone(), adv, mask.clone(), None, self.policy)?;
        let share = rows.len() as f64 / self.norm.rows as f64;
        let pg_loss = burn_ops::scalar(pl.loss.clone(), "pg_loss")?;
        let mut loss = pl.loss;
        if let Some(ent) = ent {
            let ent_loss = burn_ops::agg_loss(ent, mask.clone(), mode, self.agg)?;
            sums.accumulate("actor/entropy", burn_ops::scalar(ent_loss.clone(), "entropy")?);
            if s.entropy_coeff != 0.0 {
                loss = loss - ent_loss.mul_scalar(s.entropy_coeff);
            }
        }
        if let (Some((pen, coef)), Some(r)) = (s.kl_loss, mini.ref_log_probs) {
            let ref_lp = to_tensor(&rows_of(r, rows), device);
            let kl = burn_ops::kl_penalty(lp, ref_lp, pen)?;
            let kl_loss = burn_ops::agg_loss(kl, mask, mode, self.agg)?;
            sums.accumulate("actor/kl_loss", burn_ops::scalar(kl_loss.clone(), "kl_loss")?);
            loss = loss + kl_loss.mul_scalar(coef);
        }
        sums.accumulate("actor/pg_loss", pg_loss);
        // Each mode logs the metrics verl's logs (GPG none, KL-Cov only ppo_kl).
        for (k, v) in [
            ("actor/pg_clipfrac", pl.metrics.pg_clipfrac),
            ("actor/ppo_kl", pl.metrics.ppo_kl),
            ("actor/pg_clipfrac_lower", pl.metrics.pg_clipfrac_lower),
        ] {
            if let Some(v) = v {
                sums.accumulate(k, v * share);
            }
        }
        Ok(loss)
    }
}

/// Loss aggregation over the whole mini-batch `norm`, so micro-batch losses (and ranks) add
/// up to its loss.
pub(crate) fn policy_agg(s: &ActorSettings, norm: MiniNorm) -> (AggOptions, PolicyLossConfig) {
    let agg = AggOptions { dp_size: 1, batch_num_tokens: Some(norm.tokens), global_batch_size: Some(norm.seqs), loss_scale_factor: None, global_rows: Some(norm.rows as f64) };
    let policy = PolicyLossConfig { agg, ..s.policy };
    (agg, policy)
}

/// The value loss of critic micro-batch `r` from its predicted values `[r, response_len]`,
/// metrics added to `m`: shared by the engines like [`PolicyLossCtx`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn value_micro_loss(
    vpred: Tensor<2>,
    batch: &SeqBatch,
    r: &[usize],
    values: &Mat,
    returns: &Mat,
    cfg: &ValueLossConfig,
    norm: MiniNorm,
    device: &Device,
    m: &mut Metrics,
) -> Result<Tensor<1>, TrainError> {
    let out = burn_ops::value_loss(
        vpred,
        to_tensor(&rows_of(returns, r), device),
        to_tensor(&rows_of(values, r), device),
        to_tensor(&rows_of(&batch.response_mask, r), device),
        cfg,
    )?;
    let share = r.len() as f64 / norm.rows as f64;
    m.accumulate("critic/vf_clipfrac", out.metrics.vf_clipfrac * share);
    m.accumulate("critic/vf_loss", burn_ops::scalar(out.loss.clone(), "vf_loss")?);
    Ok(out.loss)
}

/// The loss settings of a critic update over `norm` (all ranks' rows of the mini-batch).
pub(crate) fn value_loss_config(base: &ValueLossConfig, norm: MiniNorm) -> ValueLossConfig {
    ValueLossConfig {
        agg: AggOptions { dp_size: 1, batch_num_tokens: Some(norm.tokens), global_batch_size: Some(norm.rows as f64), loss_scale_factor: None, global_rows: None },
        ..*base
    }
}

/// Actor and rollout in one process, sharing weights.
pub struct LocalActorRollout {
    /// The trainable policy.
    pub trainer: Trainer<CausalLm>,
    /// The no-autodiff view of the same weights (log-probabilities without a graph).
    pub rollout_model: CausalLm,
    /// The rollout engine's packed copy of the weights, refreshed in place by `sync_rollout`.
    pub decoder: Decoder,
    /// Decodes text for stop strings.
    pub tokenizer: Tokenizer,
    /// Update settings.
    pub settings: ActorSettings,
    /// The data-parallel group this rank trains in (`None`: a single process).
    pub collective: Option<StarGroup>,
}

/// Runs one optimizer step, all-reducing gradients over `collective` when there is one.
fn dp_step<M: burn::module::Module, F>(
    trainer: &mut Trainer<M>,
    collective: Option<&mut StarGroup>,
    micro: usize,
    lr: f64,
    loss_fn: F,
) -> Result<reinforge_engine::StepStats, TrainError>
where
    F: FnMut(usize, &M) -> Result<Tensor<1>, TrainError>,
{
    match collective {
        Some(g) => {
            let mut reduce = |buf: &mut [f32]| g.all_reduce_sum(buf).map_err(|e| e.to_string());
            trainer.step_reduced(micro, lr, loss_fn, Some(&mut reduce))
        }
        None => trainer.step(micro, lr, loss_fn),
    }
}

fn state_of<M: reinforge_engine::HfModule>(
    trainer: &Trainer<M>,
    tensors: BTreeMap<String, HostTensor>,
    config_json: serde_json::Value,
) -> Result<ModelState, TrainError> {
    Ok(ModelState { tensors, config_json, optimizer: trainer.optimizer_state()?, lora: None })
}

impl PolicyGroup for LocalActorRollout {
    /// A pointer swap for the no-autodiff view (the tensors are shared) and an in-place repack
    /// of the rollout engine's weights.
    fn sync_rollout(&mut self) -> Result<(), TrainError> {
        self.rollout_model = self.trainer.inference_model();
        self.decoder.load_weights(&self.rollout_model)?;
        Ok(())
    }

    fn state(&mut self) -> Result<ModelState, TrainError> {
        let m = &self.trainer.model;
        Ok(ModelState { lora: m.lora.clone(), ..state_of(&self.trainer, m.to_hf_tensors()?, m.config.to_hf_json())? })
    }
}

impl HostedPolicy for LocalActorRollout {
    /// A LoRA adapter comes merged in: rollout engines run plain weights.
    fn weights(&mut self) -> Result<(BTreeMap<String, HostTensor>, serde_json::Value), TrainError> {
        let m = &self.trainer.model;
        Ok((m.merged_hf_tensors()?, m.config.to_hf_json()))
    }

    fn swap_collective(&mut self, g: Option<StarGroup>) -> Option<StarGroup> {
        std::mem::replace(&mut self.collective, g)
    }
}

impl RolloutGroup for LocalActorRollout {
    fn generate(&mut self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Completion>, TrainError> {
        Ok(generate_with(&self.decoder, prompts, params, Some(&self.tokenizer))?.0)
    }
}

fn logprobs_of(model: &CausalLm, batch: &SeqBatch, micro: MicroBatching, temperature: f64, share: bool) -> Result<Mat, TrainError> {
    let mut data = Vec::with_capacity(batch.len() * batch.response_len);
    for mb in batch.all_micro_batches(micro) {
        let (lp, _) = batch.score(model, &mb, temperature, false, share)?;
        data.extend_from_slice(to_mat(lp)?.data());
    }
    Ok(Mat::new(batch.len(), batch.response_len, data)?)
}

impl ActorGroup for LocalActorRollout {
    fn logprobs(&mut self, batch: &SeqBatch, micro: MicroBatching) -> Result<Mat, TrainError> {
        // The rollout view has no autodiff: no graph is recorded for this pass.
        logprobs_of(&self.rollout_model, batch, micro, self.settings.temperature, self.settings.share_prompts)
    }

    fn update(&mut self, batch: &SeqBatch, mini: &ActorMiniBatch<'_>, lr: f64) -> Result<Metrics, TrainError> {
        let s = self.settings.clone();
        let device = self.trainer.model.device();
        let micro_rows = batch.micro_batches(mini.rows, s.micro);
        // Normalise by the whole mini-batch so micro-batch losses (and ranks) add up to its loss.
        let norm = mini.norm.unwrap_or_else(|| MiniNorm::of(&batch.response_mask, mini.rows));
        let (agg, policy_cfg) = policy_agg(&s, norm);
        let mut sums = Metrics::new();
        let stats = dp_step(&mut self.trainer, self.collective.as_mut(), micro_rows.len(), lr, |i, model| {
            let rows = &micro_rows[i];
            let (lp, ent) = batch.score(model, rows, s.temperature, true, s.share_prompts)?;
            let ctx = PolicyLossCtx { batch, mini, settings: &s, policy: &policy_cfg, agg: &agg, norm, device: &device };
            ctx.micro_loss(rows, lp, ent, &mut sums)
        })?;
        sums.insert("actor/grad_norm", stats.grad_norm);
        sums.insert("actor/lr", lr);
        Ok(sums)
    }
}

/// The reference policy in this process.
pub struct LocalRef {
    /// Frozen weights (no autodiff).
    pub model: CausalLm,
    /// Temperature the actor uses, so log-probs are comparable.
    pub temperature: f64,
    /// Each prompt computed once for all its samples (`actor.share_prompts`).
    pub share_prompts: bool,
}

impl RefGroup for LocalRef {
    fn logprobs(&mut self, batch: &SeqBatch, micro: MicroBatching) -> Result<Mat, TrainError> {
        logprobs_of(&self.model, batch, micro, self.temperature, self.share_prompts)
    }
}

/// The critic in this process.
pub struct LocalCritic {
    /// The value model and its optimizer.
    pub trainer: Trainer<ValueModel>,
    /// How the update's sequences form micro-batches.
    pub micro: MicroBatching,
    /// Value-loss settings.
    pub loss: ValueLossConfig,
    /// The data-parallel group this rank trains in.
    pub collective: Option<StarGroup>,
}

impl CriticGroup for LocalCritic {
    fn values(&mut self, batch: &SeqBatch, micro: MicroBatching) -> Result<Mat, TrainError> {
        let model = burn::module::Module::valid(&self.trainer.model);
        let mut data = Vec::with_capacity(batch.len() * batch.response_len);
        for mb in batch.all_micro_batches(micro) {
            // The value of a response token is read at the position that predicts it.
            let (input, window) = batch.input(&mb);
            let shifted = window.response(model.values(&input)?, 1);
            data.extend_from_slice(to_mat(shifted)?.data());
        }
        Ok(Mat::new(batch.len(), batch.response_len, data)?)
    }

    fn update(&mut self, batch: &SeqBatch, rows: &[usize], values: &Mat, returns: &Mat, lr: f64, norm: Option<MiniNorm>) -> Result<Metrics, TrainError> {
        let device = self.trainer.model.net.embed_tokens.val().device();
        let micro_rows = batch.micro_batches(rows, self.micro);
        let norm = norm.unwrap_or_else(|| MiniNorm::of(&batch.response_mask, rows));
        let cfg = value_loss_config(&self.loss, norm);
        let mut m = Metrics::new();
        let stats = dp_step(&mut self.trainer, self.collective.as_mut(), micro_rows.len(), lr, |i, model| {
            let r = &micro_rows[i];
            let (input, window) = batch.input(r);
            let vpred = window.response(model.values(&input)?, 1);
            value_micro_loss(vpred, batch, r, values, returns, &cfg, norm, &device, &mut m)
        })?;
        m.insert("critic/grad_norm", stats.grad_norm);
        m.insert("critic/lr", lr);
        Ok(m)
    }

    fn state(&mut self) -> Result<ModelState, TrainError> {
        let m = &self.trainer.model;
        state_of(&self.trainer, m.to_hf_tensors()?, m.config.to_hf_json())
    }
}

impl HostedCritic for LocalCritic {
    fn swap_collective(&mut self, g: Option<StarGroup>) -> Option<StarGroup> {
        std::mem::replace(&mut self.collective, g)
    }
}

/// AdamW settings for a role.
pub fn optim(weight_decay: f32, betas: [f32; 2], grad_clip: f64) -> OptimConfig {
    OptimConfig {
        beta1: betas[0],
        beta2: betas[1],
        eps: 1e-8,
        weight_decay,
        grad_clip: (grad_clip > 0.0).then_some(grad_clip),
    }
}

/// A `[n, r]` matrix of zeros.
pub fn zeros(n: usize, r: usize) -> Mat {
    Mat::new(n, r, vec![0.0; n * r]).expect("shape")
}

/// Loss aggregation mode from its config name (validated earlier).
pub fn agg_mode(name: &str) -> Result<LossAggMode, TrainError> {
    Ok(name.parse()?)
}

/// Every role of a run, whatever backend holds them.
pub struct Roles {
    /// Actor and rollout.
    pub policy: Box<dyn PolicyGroup>,
    /// The reference policy, when a KL term needs it.
    pub reference: Option<Box<dyn RefGroup>>,
    /// The critic (GAE).
    pub critic: Option<Box<dyn CriticGroup>>,
    /// A reward function the backend provides (otherwise the controller builds `[reward]`).
    pub reward: Option<Box<dyn reinforge_reward::RewardFn>>,
    /// What must stay alive while the roles are used (the Ray launcher and its ranks).
    pub _keep: Option<Box<dyn std::any::Any>>,
    /// What each worker rank is doing (cluster runs), for the stall watchdog.
    pub monitor: Option<std::sync::Arc<dyn RankMonitor>>,
}

/// One worker rank as its last heartbeat described it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RankView {
    /// `group:rank`.
    pub rank: String,
    /// The node it runs on.
    pub node: String,
    /// What it is doing (`generate`, `update`, `all-reduce`, `idle`, ...).
    pub activity: String,
    /// Seconds it has been doing it.
    pub activity_s: f64,
    /// Seconds since its last heartbeat.
    pub beat_age_s: f64,
}

/// The stall watchdog's view of the worker ranks.
pub trait RankMonitor: Send + Sync {
    /// Every rank, in group and rank order.
    fn ranks(&self) -> Vec<RankView>;
    /// Asks the ranks named in `which` for their threads' stacks, to be written to
    /// `dir/<group>-<rank>.txt` when they arrive.
    fn request_stacks(&self, dir: &std::path::Path, reason: &str, which: &[String]);
    /// Ends every pending call with `why` as a lost worker (the run then restarts).
    fn fail(&self, why: String);
}

#[cfg(test)]
mod tests {
    use super::*;
    use reinforge_engine::ModelConfig;

    fn batch() -> SeqBatch {
        // Prompts of 2, 5 and 3 tokens, responses of 1, 4 and 2: left-padded to 5, right to 4.
        let prompts: [&[u32]; 3] = [&[5, 6], &[7, 8, 9, 10, 11], &[12, 13, 14]];
        let responses: [&[u32]; 3] = [&[20], &[21, 22, 23, 24], &[25, 26]];
        SeqBatch::build(&prompts, &responses, 0)
    }

    #[test]
    fn a_micro_batch_drops_only_the_columns_all_its_rows_pad() {
        let b = batch();
        let (input, w) = b.input(&[0]);
        assert_eq!(input.ids, vec![vec![5, 6, 20]]);
        assert_eq!((w.lead, w.tail), (3, 3));
        let (input, w) = b.input(&[0, 2]);
        assert_eq!(input.ids, vec![vec![0, 5, 6, 20, 0], vec![12, 13, 14, 25, 26]]);
        assert_eq!(input.positions[0], vec![0, 0, 1, 2, 2]);
        assert_eq!((w.lead, w.tail), (2, 2));
        // The widest rows keep every column.
        let (input, w) = b.input(&[0, 1, 2]);
        assert_eq!((input.ids[0].len(), w.lead, w.tail), (9, 0, 0));
        // A per-position output maps back to the batch's response columns, zeros past the cut.
        let out = Tensor::<2>::from_data(burn::tensor::TensorData::new((0..10).map(|v| v as f32).collect::<Vec<f32>>(), [2, 5]), &Device::flex());
        let (_, w) = b.input(&[0, 2]);
        let lp: Vec<f32> = w.response(out.clone(), 0).into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(lp, vec![3.0, 4.0, 0.0, 0.0, 8.0, 9.0, 0.0, 0.0]);
        let v: Vec<f32> = w.response(out, 1).into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(v, vec![2.0, 3.0, 0.0, 0.0, 7.0, 8.0, 0.0, 0.0]);
    }

    fn tiny_model() -> CausalLm {
        let json = r#"{"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 40, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "max_position_embeddings": 128, "tie_word_embeddings": true}"#;
        let cfg = ModelConfig::from_json_str(json, std::path::Path::new("config.json")).unwrap();
        CausalLm::random(cfg, 11, &Device::flex()).unwrap()
    }

    /// Both layouts' log-probs agree on real response tokens; past a response both read 0.
    fn same_logprobs(b: &SeqBatch, shared: &Mat, rows: &Mat) {
        for (i, (x, y)) in shared.data().iter().zip(rows.data()).enumerate() {
            if b.response_mask.data()[i] > 0.0 {
                assert!((x - y).abs() < 1e-5, "[{i}]: shared prompts {x} vs rows {y}");
            } else if i % b.response_len >= b.parts(i / b.response_len).unwrap().1.len() {
                assert_eq!(*x, 0.0, "[{i}] past the response");
            }
        }
    }

    #[test]
    fn samples_of_one_prompt_share_its_forward_when_that_costs_less() {
        let model = tiny_model();
        // Two prompts, three samples each (GRPO's groups), responses shorter than the prompts,
        // interleaved with a row whose prompt no other row has.
        let (p1, p2, p3): (&[u32], &[u32], &[u32]) = (&[1, 2, 3, 4, 5, 6, 7, 8], &[9, 10, 11, 12, 13, 14], &[15, 16]);
        let prompts = [p1, p1, p3, p1, p2, p2, p2];
        let responses: [&[u32]; 7] = [&[20, 21], &[22], &[23, 24, 25], &[26, 27, 28], &[29], &[], &[30, 31]];
        let b = SeqBatch::build(&prompts, &responses, 0);
        let all: Vec<usize> = (0..b.len()).collect();
        match b.layout(&all, true, &model.config) {
            Layout::Shared { input, .. } => {
                // p1 with its three samples, p3 alone, p2 with its three: three rows.
                assert_eq!(input.ids.len(), 3);
                assert_eq!(&input.ids[0][..14], &[1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22, 26, 27, 28]);
                assert_eq!(&input.positions[0][..14], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 8, 8, 9, 10]);
            }
            Layout::Rows(..) => panic!("short responses after a shared prompt should be packed"),
        }
        assert!(matches!(b.layout(&all, false, &model.config), Layout::Rows(..)), "actor.share_prompts = false");
        let shared = logprobs_of(&model, &b, MicroBatching::Seqs(7), 1.0, true).unwrap();
        let rows = logprobs_of(&model, &b, MicroBatching::Seqs(7), 1.0, false).unwrap();
        same_logprobs(&b, &shared, &rows);
        // Micro-batches of 2 split the groups; still the same numbers.
        same_logprobs(&b, &logprobs_of(&model, &b, MicroBatching::Seqs(2), 1.0, true).unwrap(), &rows);
        // With entropies, as the update asks.
        let (lp, ent) = b.score(&model, &all, 1.0, true, true).unwrap();
        let (lp2, ent2) = b.score(&model, &all, 1.0, true, false).unwrap();
        same_logprobs(&b, &to_mat(lp).unwrap(), &to_mat(lp2).unwrap());
        same_logprobs(&b, &to_mat(ent.unwrap()).unwrap(), &to_mat(ent2.unwrap()).unwrap());
    }

    #[test]
    fn long_responses_after_a_short_prompt_keep_a_row_each() {
        // Packing 3 × 30 tokens behind one token costs more attention than it saves.
        let model = tiny_model();
        let long: Vec<Vec<u32>> = (0..3).map(|i| (0..30).map(|j| (i + j) % 30 + 1).collect()).collect();
        let responses: Vec<&[u32]> = long.iter().map(Vec::as_slice).collect();
        let b = SeqBatch::build(&[&[7][..]; 3], &responses, 0);
        assert!(matches!(b.layout(&[0, 1, 2], true, &model.config), Layout::Rows(..)));
    }

    #[test]
    fn token_budgets_fill_micro_batches_in_order() {
        let lens = [30usize, 31, 10, 25, 40, 5, 90, 3];
        let rows: Vec<usize> = (0..lens.len()).collect();
        let budget = MicroBatching::Tokens { max: 67, shared_prompts: false };
        let split = |m: MicroBatching, rows: &[usize]| m.split(rows, || (), |_, r| lens[r], |_, _| ());
        let mbs = split(budget, &rows);
        assert_eq!(mbs, vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6], vec![7]]);
        // Every row once, in order; within the budget unless alone; and the next row would not
        // have fitted (greedy in order).
        assert_eq!(mbs.concat(), rows);
        for (i, mb) in mbs.iter().enumerate() {
            let used: usize = mb.iter().map(|&r| lens[r]).sum();
            assert!(used <= 67 || mb.len() == 1, "{mb:?}: {used} tokens");
            if let Some(next) = mbs.get(i + 1) {
                assert!(used + lens[next[0]] > 67, "{mb:?} had room for row {}", next[0]);
            }
        }
        // Only some rows (a rank's share, a mini-batch): the same rule over them.
        assert_eq!(split(budget, &[1, 4, 7]), vec![vec![1], vec![4, 7]]);
        assert_eq!(split(MicroBatching::Seqs(3), &rows), vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7]]);
        assert!(split(budget, &[]).is_empty());
        // A batch's lengths leave out padding.
        let p: Vec<&[u32]> = vec![&[5, 6, 7], &[8]];
        let r: Vec<&[u32]> = vec![&[20], &[21, 22, 23]];
        let b = SeqBatch::build(&p, &r, 0);
        assert_eq!((b.tokens(0), b.tokens(1)), (4, 4));
        assert_eq!(b.all_micro_batches(MicroBatching::Tokens { max: 7, shared_prompts: false }), vec![vec![0], vec![1]]);
        assert_eq!(b.all_micro_batches(MicroBatching::Tokens { max: 8, shared_prompts: false }), vec![vec![0, 1]]);
    }

    #[test]
    fn shared_prompts_count_once_in_a_token_budget() {
        // Four samples of a 10-token prompt (responses of 3, 5, 2, 4) and one of a 6-token
        // prompt (response 3). Shared, the first sample costs 13 tokens and each further one
        // its last prompt token and response: 13 + 6 + 3 + 5 = 27 for the four, 9 for the last.
        let long: Vec<u32> = (10..20).collect();
        let short: Vec<u32> = (40..46).collect();
        let responses: Vec<Vec<u32>> = [3u32, 5, 2, 4, 3].iter().map(|&n| (0..n).map(|j| 60 + j).collect()).collect();
        let p: Vec<&[u32]> = vec![&long, &long, &long, &long, &short];
        let r: Vec<&[u32]> = responses.iter().map(Vec::as_slice).collect();
        let b = SeqBatch::build(&p, &r, 0);
        let by = |max, shared_prompts| b.all_micro_batches(MicroBatching::Tokens { max, shared_prompts });
        assert_eq!(by(36, true), vec![vec![0, 1, 2, 3, 4]]);
        assert_eq!(by(35, true), vec![vec![0, 1, 2, 3], vec![4]]);
        assert_eq!(by(26, true), vec![vec![0, 1, 2], vec![3, 4]]);
        // Unshared, every sample counts its whole prompt: 13 + 15 + 12 + 14 + 9.
        assert_eq!(by(36, false), vec![vec![0, 1], vec![2, 3, 4]]);
        assert_eq!(by(63, false), vec![vec![0, 1, 2, 3, 4]]);
        // The packing's count is what the CUDA engine packs: a copy of the prompt without its
        // last token, then each sample's last prompt token and response.
        let parts: Vec<(Vec<u32>, usize)> = (0..5).map(|i| b.prompt_and_response(i)).collect();
        let mut pack = SharedPacking::new(b.response_len);
        for (i, (prompt, len)) in parts.iter().enumerate() {
            pack.push(i, prompt, *len);
        }
        assert_eq!(pack.tokens(), 9 + (4 + 6 + 3 + 5) + 9);
        assert_eq!(pack.groups(), vec![vec![0, 1, 2, 3], vec![4]]);
    }

    #[test]
    fn a_prompt_gets_another_copy_when_its_samples_pass_twice_a_sequence() {
        // A 4-token prompt in a batch of 5-token responses: 2 · (4 + 5) = 18 queries a copy,
        // 6 per sample here, so three samples per copy; a one-token prompt never shares.
        let prompt = [1u32, 2, 3, 4];
        let mut pack = SharedPacking::new(5);
        for row in 0..7 {
            assert_eq!(pack.cost(&prompt, 5), if row % 3 == 0 { 9 } else { 6 }, "row {row}");
            pack.push(row, &prompt, 5);
        }
        pack.push(7, &[9], 2);
        pack.push(8, &[9], 2);
        pack.push(9, &prompt, 1);
        assert_eq!(pack.tokens(), 3 * 9 + 4 * 6 + 2 * 3 + 2);
        // The prompt's copies stay together, before the prompt that came later.
        assert_eq!(pack.groups(), vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 9], vec![7], vec![8]]);
    }

    #[test]
    fn trimmed_micro_batches_give_the_full_width_log_probs() {
        let model = tiny_model();
        let b = batch();
        // One micro-batch of all rows is the untrimmed computation; one row each trims most.
        let whole = logprobs_of(&model, &b, MicroBatching::Seqs(3), 1.0, false).unwrap();
        let single = logprobs_of(&model, &b, MicroBatching::Seqs(1), 1.0, false).unwrap();
        for (i, (x, y)) in single.data().iter().zip(whole.data()).enumerate() {
            let real = b.response_mask.data()[i] > 0.0;
            if real {
                assert!((x - y).abs() < 1e-5, "[{i}]: trimmed {x} vs full {y}");
            } else {
                assert_eq!(*x, 0.0, "[{i}] past the response");
            }
        }
    }
}
