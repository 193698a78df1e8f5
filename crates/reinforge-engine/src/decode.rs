//! The rollout engine's forward pass: the same transformer as [`crate::model`], run on host
//! buffers with weights packed once for [`reinforge_kernels`] matmuls.
//!
//! Why a second forward: training needs burn's autodiff graph, generation needs none of it and
//! is dominated by multiplying a few live rows by every weight at every step. Packing the
//! weights once per update (q/k/v fused, gate/up fused) and running unpadded, ragged batches
//! makes a decode step several times cheaper than the burn graph. The trainer calls
//! [`Decoder::load_weights`] after each update: an in-place repack, no disk.
//!
//! Sequences are not padded: each row keeps its own positions and cache slots, so a row's
//! logits do not depend on the other rows in the batch.

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::model::{host_vec, CausalLm, Linear};
use rayon::prelude::*;
use reinforge_kernels::{ops, PackedMatrix};

/// One transformer block's packed weights.
#[derive(Debug, Clone, Default)]
struct Layer {
    ln1: Vec<f32>,
    qkv: PackedMatrix,
    o: PackedMatrix,
    ln2: Vec<f32>,
    gate_up: PackedMatrix,
    down: PackedMatrix,
}

/// A model's weights laid out for generation on the CPU.
#[derive(Debug, Clone)]
pub struct Decoder {
    config: ModelConfig,
    layers: Vec<Layer>,
    /// `[vocab, hidden]` lookups when the head is untied; empty when tied (rows come from the
    /// packed head's columns).
    embed: Vec<f32>,
    norm: Vec<f32>,
    lm_head: PackedMatrix,
}

/// A LoRA adapter is merged in: generation runs the plain packed matmuls.
fn weight(l: &Linear) -> Result<Vec<f32>> {
    host_vec(l.effective_weight())
}

fn bias(l: &Linear) -> Result<Option<Vec<f32>>> {
    l.bias.as_ref().map(|b| host_vec(b.val())).transpose()
}

/// Packs linears that read the same input side by side (fused q/k/v, fused gate/up).
fn pack(dst: &mut PackedMatrix, k: usize, parts: &[&Linear]) -> Result<()> {
    let ws: Vec<Vec<f32>> = parts.iter().map(|l| weight(l)).collect::<Result<_>>()?;
    let widths: Vec<usize> = ws.iter().map(|w| w.len() / k).collect();
    let biases: Vec<Option<Vec<f32>>> = parts.iter().map(|l| bias(l)).collect::<Result<_>>()?;
    let bias = if biases.iter().any(Option::is_some) {
        Some(biases.iter().zip(&widths).flat_map(|(b, &w)| b.clone().unwrap_or_else(|| vec![0.0; w])).collect::<Vec<f32>>())
    } else {
        None
    };
    let blocks: Vec<(&[f32], usize)> = ws.iter().map(Vec::as_slice).zip(widths).collect();
    dst.repack_in_out(k, &blocks, bias.as_deref());
    Ok(())
}

impl Decoder {
    /// Packs a model's current weights.
    pub fn new(model: &CausalLm) -> Result<Self> {
        let mut d = Self {
            config: model.config.clone(),
            layers: vec![Layer::default(); model.net.layers.len()],
            embed: Vec::new(),
            norm: Vec::new(),
            lm_head: PackedMatrix::default(),
        };
        d.load_weights(model)?;
        Ok(d)
    }

    /// Replaces the weights with `model`'s in place (same architecture), reusing the buffers.
    pub fn load_weights(&mut self, model: &CausalLm) -> Result<()> {
        let (cfg, net) = (&model.config, &model.net);
        if net.layers.len() != self.layers.len() || cfg.hidden_size != self.config.hidden_size {
            return Err(EngineError::Request(format!(
                "rollout engine: new weights have {} layers of width {}, the engine holds {} of width {}; \
                 weight updates must come from the same model (build a new Decoder for another one)",
                net.layers.len(),
                cfg.hidden_size,
                self.layers.len(),
                self.config.hidden_size
            )));
        }
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        for (dst, b) in self.layers.iter_mut().zip(&net.layers) {
            dst.ln1 = host_vec(b.input_layernorm.weight.val())?;
            dst.ln2 = host_vec(b.post_attention_layernorm.weight.val())?;
            pack(&mut dst.qkv, h, &[&b.q_proj, &b.k_proj, &b.v_proj])?;
            pack(&mut dst.o, cfg.num_heads * cfg.head_dim, &[&b.o_proj])?;
            pack(&mut dst.gate_up, h, &[&b.gate_proj, &b.up_proj])?;
            pack(&mut dst.down, i, &[&b.down_proj])?;
        }
        self.norm = host_vec(net.norm.weight.val())?;
        match &net.lm_head {
            Some(head) => {
                pack(&mut self.lm_head, h, &[head])?;
                self.embed = host_vec(net.embed_tokens.val())?;
            }
            None => {
                // Tied: embed_tokens is kept `[hidden, vocab]`, i.e. already the head's layout.
                let e = host_vec(net.embed_tokens.val())?;
                self.lm_head.repack_in_out(h, &[(&e, cfg.vocab_size)], None);
                self.embed = Vec::new();
            }
        }
        self.config = cfg.clone();
        Ok(())
    }

    /// The model's shapes.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn embed_row(&self, id: u32, out: &mut [f32]) {
        let h = self.config.hidden_size;
        if self.embed.is_empty() {
            self.lm_head.column(id as usize, out);
        } else {
            out.copy_from_slice(&self.embed[id as usize * h..(id as usize + 1) * h]);
        }
    }

    /// Runs `tokens` through the model, writing their keys and values into `cache`, and
    /// returns the logits (`[n, vocab]` into `scratch.logits`) of the tokens flagged in `emit`.
    ///
    /// A row's tokens must arrive in position order, and a token may attend only to its own
    /// row's slots `0..=pos`, all of which are written by this call or an earlier one.
    pub(crate) fn forward(&self, tokens: &[Token], emit: &[bool], cache: &mut DecodeCache, scratch: &mut Scratch) -> Result<()> {
        let cfg = &self.config;
        let (h, inter, vocab) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let (nh, kvh, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let (qd, kvd) = (nh * hd, kvh * hd);
        let g = nh / kvh;
        let m = tokens.len();
        for t in tokens {
            if t.id as usize >= vocab {
                return Err(EngineError::Request(format!("token id {} is outside the vocabulary (size {vocab})", t.id)));
            }
            if t.row >= cache.rows || t.pos >= cache.capacity {
                return Err(EngineError::Request(format!(
                    "KV cache overflow: position {} of row {} requested, capacity {} × {} rows",
                    t.pos, t.row, cache.capacity, cache.rows
                )));
            }
        }
        cache.ensure_rope(t_max(tokens) + 1, hd, cfg.rope_theta);
        let s = scratch;
        s.x.resize(m * h, 0.0);
        for (t, row) in tokens.iter().zip(s.x.chunks_exact_mut(h)) {
            self.embed_row(t.id, row);
        }
        s.h.resize(m * h, 0.0);
        s.qkv.resize(m * (qd + 2 * kvd), 0.0);
        s.att.resize(m * qd, 0.0);
        s.gu.resize(m * 2 * inter, 0.0);
        s.act.resize(m * inter, 0.0);
        let scale = 1.0 / (hd as f32).sqrt();
        let half = hd / 2;
        for (l, layer) in self.layers.iter().enumerate() {
            for (x, o) in s.x.chunks_exact(h).zip(s.h.chunks_exact_mut(h)) {
                ops::rms_norm(x, &layer.ln1, cfg.rms_norm_eps, o);
            }
            layer.qkv.matmul(&s.h, m, &mut s.qkv, false);
            for (t, row) in tokens.iter().zip(s.qkv.chunks_exact_mut(qd + 2 * kvd)) {
                let (cos, sin) = (&cache.cos[t.pos * half..(t.pos + 1) * half], &cache.sin[t.pos * half..(t.pos + 1) * half]);
                let (q, kv) = row.split_at_mut(qd);
                for head in q.chunks_exact_mut(hd) {
                    ops::apply_rope(head, cos, sin);
                }
                let (k, v) = kv.split_at_mut(kvd);
                for (kh, (kv_k, kv_v)) in k.chunks_exact_mut(hd).zip(v.chunks_exact(hd)).enumerate() {
                    ops::apply_rope(kv_k, cos, sin);
                    let base = cache.base(l, t.row, kh);
                    let cap = cache.capacity;
                    for (dd, &kv) in kv_k.iter().enumerate() {
                        cache.k[base + dd * cap + t.pos] = kv;
                    }
                    cache.v[base + t.pos * hd..base + (t.pos + 1) * hd].copy_from_slice(kv_v);
                }
            }
            {
                let cache = &*cache;
                let qkv = &s.qkv;
                let work = |(i, out): (usize, &mut [f32]), scores: &mut Vec<f32>| {
                    let t = tokens[i];
                    let q = &qkv[i * (qd + 2 * kvd)..i * (qd + 2 * kvd) + qd];
                    for kh in 0..kvh {
                        let base = cache.base(l, t.row, kh);
                        let len = t.pos + 1;
                        ops::attend(
                            &q[kh * g * hd..(kh + 1) * g * hd],
                            &cache.k[base..base + hd * cache.capacity],
                            cache.capacity,
                            &cache.v[base..base + len * hd],
                            len,
                            hd,
                            scale,
                            scores,
                            &mut out[kh * g * hd..(kh + 1) * g * hd],
                        );
                    }
                };
                if m > 1 {
                    s.att.par_chunks_mut(qd).enumerate().for_each_init(Vec::new, |sc, item| work(item, sc));
                } else {
                    s.att.chunks_mut(qd).enumerate().for_each(|item| work(item, &mut s.scores));
                }
            }
            layer.o.matmul(&s.att, m, &mut s.x, true);
            for (x, o) in s.x.chunks_exact(h).zip(s.h.chunks_exact_mut(h)) {
                ops::rms_norm(x, &layer.ln2, cfg.rms_norm_eps, o);
            }
            layer.gate_up.matmul(&s.h, m, &mut s.gu, false);
            for (gu, a) in s.gu.chunks_exact(2 * inter).zip(s.act.chunks_exact_mut(inter)) {
                let (gate, up) = gu.split_at(inter);
                ops::silu_mul(gate, up, a);
            }
            layer.down.matmul(&s.act, m, &mut s.x, true);
        }
        let picked: Vec<usize> = (0..m).filter(|&i| emit.get(i).copied().unwrap_or(false)).collect();
        s.h.resize(picked.len() * h, 0.0);
        for (&i, o) in picked.iter().zip(s.h.chunks_exact_mut(h)) {
            ops::rms_norm(&s.x[i * h..(i + 1) * h], &self.norm, cfg.rms_norm_eps, o);
        }
        s.logits.resize(picked.len() * vocab, 0.0);
        self.lm_head.matmul(&s.h, picked.len(), &mut s.logits, false);
        Ok(())
    }
}

fn t_max(tokens: &[Token]) -> usize {
    tokens.iter().map(|t| t.pos).max().unwrap_or(0)
}

/// One token of a ragged batch: which row it extends and at which position.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Token {
    pub id: u32,
    pub row: usize,
    pub pos: usize,
}

/// Keys and values of every row, a block per (layer, row, KV head) (layout at
/// [`DecodeCache::base`]), allocated once per generation call; plus the RoPE tables.
pub(crate) struct DecodeCache {
    k: Vec<f32>,
    v: Vec<f32>,
    layers: usize,
    rows: usize,
    capacity: usize,
    kv_heads: usize,
    head_dim: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
    rope_len: usize,
}

impl DecodeCache {
    /// Room for `rows` sequences of up to `capacity` tokens each.
    pub fn new(cfg: &ModelConfig, rows: usize, capacity: usize) -> Self {
        let len = cfg.num_layers * rows * cfg.num_kv_heads * capacity * cfg.head_dim;
        Self {
            k: vec![0.0; len],
            v: vec![0.0; len],
            layers: cfg.num_layers,
            rows,
            capacity,
            kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            cos: Vec::new(),
            sin: Vec::new(),
            rope_len: 0,
        }
    }

    /// Copies the first `len` positions of row `from` to row `to` in every layer.
    pub fn copy_prefix(&mut self, from: usize, to: usize, len: usize) {
        for layer in 0..self.layers {
            for head in 0..self.kv_heads {
                let (src, dst) = (self.base(layer, from, head), self.base(layer, to, head));
                for dd in 0..self.head_dim {
                    let off = dd * self.capacity;
                    self.k.copy_within(src + off..src + off + len, dst + off);
                }
                self.v.copy_within(src..src + len * self.head_dim, dst);
            }
        }
    }

    /// Start of one (layer, row, KV head) block: keys `[head_dim, capacity]` (transposed, so
    /// attention scores vectorise across positions), values `[capacity, head_dim]`.
    fn base(&self, layer: usize, row: usize, head: usize) -> usize {
        ((layer * self.rows + row) * self.kv_heads + head) * self.capacity * self.head_dim
    }

    fn ensure_rope(&mut self, len: usize, head_dim: usize, theta: f64) {
        if len > self.rope_len {
            // Tables for the whole capacity at once: positions only grow.
            let len = len.max(self.capacity);
            (self.cos, self.sin) = ops::rope_tables(len, head_dim, theta);
            self.rope_len = len;
        }
    }
}

/// Activation buffers reused across steps (a step allocates nothing once they have grown).
#[derive(Default)]
pub(crate) struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    att: Vec<f32>,
    gu: Vec<f32>,
    act: Vec<f32>,
    scores: Vec<f32>,
    /// `[emitted tokens, vocab]` after [`Decoder::forward`].
    pub logits: Vec<f32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ForwardInput;
    use crate::weights::HostTensor;
    use burn::tensor::{Device, Tensor};

    fn model(tied: bool) -> CausalLm {
        let json = format!(
            r#"{{"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 70, "rms_norm_eps": 1e-6,
                "rope_theta": 10000.0, "max_position_embeddings": 64, "tie_word_embeddings": {tied}}}"#
        );
        let cfg = ModelConfig::from_json_str(&json, std::path::Path::new("config.json")).expect("config");
        let mut m = CausalLm::random(cfg, 3, &Device::flex()).expect("model");
        // Random init leaves biases at zero; give them values so a dropped bias shows.
        for b in &mut m.net.layers {
            for lin in [&mut b.q_proj, &mut b.k_proj, &mut b.v_proj] {
                if let Some(bias) = lin.bias.take() {
                    let n = bias.val().dims()[0];
                    let vals: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 0.1).collect();
                    lin.bias = Some(bias.map(|_| Tensor::from_data(burn::tensor::TensorData::new(vals, [n]), &Device::flex())));
                }
            }
        }
        m
    }

    /// Every position of a ragged batch, fed in two calls (prompt, then continuation), gives
    /// the training forward's logits (left-padded batch, burn graph).
    #[test]
    fn ragged_decode_matches_the_training_forward() {
        for tied in [true, false] {
            let m = model(tied);
            let dec = Decoder::new(&m).expect("pack");
            let rows: Vec<Vec<u32>> = vec![(0..9).map(|i| (i * 7 + 3) % 70).collect(), vec![5, 9, 11, 40], (0..13).map(|i| (i * 5 + 1) % 70).collect()];
            let t = rows.iter().map(Vec::len).max().unwrap_or(0);
            let ids: Vec<Vec<u32>> = rows.iter().map(|r| [vec![0; t - r.len()], r.clone()].concat()).collect();
            let mask: Vec<Vec<bool>> = rows.iter().map(|r| [vec![false; t - r.len()], vec![true; r.len()]].concat()).collect();
            let want: Vec<f32> = m.forward(&ForwardInput::from_mask(ids, mask)).expect("forward").into_data().try_into_vec().expect("host");

            let v = m.config.vocab_size;
            let mut cache = DecodeCache::new(&m.config, rows.len(), t);
            let mut scratch = Scratch::default();
            let mut worst = 0f32;
            for part in [0..3usize, 3..t] {
                let tokens: Vec<Token> = rows
                    .iter()
                    .enumerate()
                    .flat_map(|(r, ids)| part.clone().filter(|&p| p < ids.len()).map(move |pos| Token { id: ids[pos], row: r, pos }))
                    .collect();
                dec.forward(&tokens, &vec![true; tokens.len()], &mut cache, &mut scratch).expect("decode");
                for (i, tk) in tokens.iter().enumerate() {
                    let padded = t - rows[tk.row].len() + tk.pos;
                    let exp = &want[(tk.row * t + padded) * v..(tk.row * t + padded + 1) * v];
                    for (a, b) in scratch.logits[i * v..(i + 1) * v].iter().zip(exp) {
                        worst = worst.max((a - b).abs());
                    }
                }
            }
            assert!(worst < 1e-4, "tied={tied}: max |logit diff| {worst}");
        }
    }

    /// The rollout engine runs a LoRA model with its adapter merged in: its logits are the
    /// training forward's (adapter applied as `x·W + s·(x·A)·B`).
    #[test]
    fn a_lora_model_decodes_as_its_training_forward() {
        use rand::{Rng, SeedableRng};
        let base = model(false);
        let cfg = crate::lora::LoraConfig::new(3, 9.0, &["q_proj".into(), "o_proj".into(), "up_proj".into(), "down_proj".into()]).expect("cfg");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let mut tensors = std::collections::BTreeMap::new();
        for (l, block) in base.net.layers.iter().enumerate() {
            for (path, lin) in block.linears() {
                if !cfg.adapts(path) {
                    continue;
                }
                let [i, o] = lin.weight.val().dims();
                let mut draw = |n: usize| (0..n).map(|_| rng.random_range(-0.2f32..0.2)).collect::<Vec<_>>();
                tensors.insert(format!("model.layers.{l}.{path}.lora_A.weight"), HostTensor { shape: vec![3, i], data: draw(3 * i) });
                tensors.insert(format!("model.layers.{l}.{path}.lora_B.weight"), HostTensor { shape: vec![o, 3], data: draw(3 * o) });
            }
        }
        let m = base.with_lora(&crate::lora::Adapter { config: cfg, tensors }).expect("adapter");
        let rows: Vec<u32> = (0..11).map(|i| (i * 7 + 3) % 70).collect();
        let want: Vec<f32> = m.forward(&ForwardInput::from_mask(vec![rows.clone()], vec![vec![true; rows.len()]])).expect("forward").into_data().try_into_vec().expect("host");
        let plain: Vec<f32> = model(false).forward(&ForwardInput::from_mask(vec![rows.clone()], vec![vec![true; rows.len()]])).expect("forward").into_data().try_into_vec().expect("host");
        assert!(want.iter().zip(&plain).any(|(a, b)| (a - b).abs() > 1e-2), "the adapter changes nothing");
        let dec = Decoder::new(&m).expect("pack");
        let mut cache = DecodeCache::new(&m.config, 1, rows.len());
        let mut scratch = Scratch::default();
        let tokens: Vec<Token> = rows.iter().enumerate().map(|(pos, &id)| Token { id, row: 0, pos }).collect();
        dec.forward(&tokens, &vec![true; tokens.len()], &mut cache, &mut scratch).expect("decode");
        let worst = scratch.logits.iter().zip(&want).fold(0f32, |w, (a, b)| w.max((a - b).abs()));
        assert!(worst < 1e-4, "max |logit diff| {worst}");
    }

    #[test]
    fn weights_of_another_shape_are_refused_with_both_shapes() {
        let mut dec = Decoder::new(&model(true)).expect("pack");
        let json = r#"{"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 70, "max_position_embeddings": 64}"#;
        let cfg = ModelConfig::from_json_str(json, std::path::Path::new("config.json")).expect("config");
        let other = CausalLm::random(cfg, 1, &Device::flex()).expect("model");
        let e = dec.load_weights(&other).unwrap_err().to_string();
        assert!(e.contains("3 layers of width 32") && e.contains("holds 2 of width 64"), "{e}");
    }
}
