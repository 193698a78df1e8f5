//! Where every weight lives in the model's one flat parameter buffer (llm.c's layout): each
//! tensor keeps its Hugging Face shape and row-major order, so it uploads and downloads as
//! is; the projections that run as one GEMM sit side by side — q, k, v as one `[qd + 2·kvd, H]`
//! matrix, gate and up as one `[2·I, H]` — and gradients and optimizer moments mirror the
//! same offsets. One buffer per model is what ZeRO/FSDP will later shard.

use reinforge_engine::{LoraConfig, ModelConfig};
use std::collections::BTreeMap;

/// Offsets are rounded up to this many elements (256 bytes in f32), so every tensor starts
/// aligned for vector loads and cuBLASLt.
const ALIGN: usize = 64;

/// One tensor: HF name, shape, element offset in the flat buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    /// HF name (`model.layers.3.self_attn.q_proj.weight`).
    pub name: String,
    /// HF shape.
    pub shape: Vec<usize>,
    /// First element.
    pub offset: usize,
}

impl Slot {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The offsets one transformer block's kernels use.
#[derive(Debug, Clone, Copy)]
pub struct LayerOffsets {
    /// `[qd + 2·kvd, H]`: q, k, v projection weights stacked.
    pub w_qkv: usize,
    /// `[qd + 2·kvd]` stacked biases, when the architecture has them.
    pub b_qkv: Option<usize>,
    /// `[H, qd]`.
    pub w_o: usize,
    /// `[H]`.
    pub b_o: Option<usize>,
    /// `[2·I, H]`: gate and up stacked.
    pub w_gu: usize,
    /// `[2·I]`.
    pub b_gu: Option<usize>,
    /// `[H, I]`.
    pub w_down: usize,
    /// `[H]`.
    pub b_down: Option<usize>,
    /// `[H]` input RMSNorm weight.
    pub ln1: usize,
    /// `[H]` post-attention RMSNorm weight.
    pub ln2: usize,
}

/// The whole model's layout.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Every tensor, in buffer order.
    pub slots: Vec<Slot>,
    /// Per block.
    pub layers: Vec<LayerOffsets>,
    /// `[V, H]` embeddings (also the LM head when tied).
    pub embed: usize,
    /// `[H]` final norm.
    pub norm: usize,
    /// `[V, H]` untied LM head (a critic carries its backbone's untouched, so that its
    /// checkpoints have every tensor the CPU engine's do).
    pub lm_head: Option<usize>,
    /// `[1, H]` value head (`score.weight`) of a critic or reward model.
    pub score: Option<usize>,
    /// Elements in the buffer (with alignment padding).
    pub total: usize,
    /// Elements the optimizer updates: `[0, trainable)`. A critic's LM head lies beyond it
    /// (it has no gradient, and the CPU engine's AdamW leaves such tensors alone); under LoRA
    /// only the factors, which come first, are in it.
    pub trainable: usize,
    /// A LoRA adapter's factors, when the model has one (then every other weight is frozen).
    pub lora: Option<LoraLayout>,
}

/// Where a LoRA adapter's factors are: per block, per fused GEMM of the block (q/k/v, o,
/// gate/up, down), the adapted members' `A` stacked so that one GEMM computes every member's
/// `x·Aᵀ`, and each member's `B`.
#[derive(Debug, Clone)]
pub struct LoraLayout {
    /// `alpha / r`.
    pub scale: f32,
    /// `r`.
    pub rank: usize,
    /// Per block: the groups in [`Group`] order.
    pub layers: Vec<[Option<LoraGroup>; 4]>,
    /// Where the base model's own layout starts (the factors fill `[0, base)`).
    pub base: usize,
}

/// The fused GEMMs of a block, in the order [`LoraLayout::layers`] holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// q, k, v from the input norm's output.
    Qkv = 0,
    /// o from attention's output.
    O = 1,
    /// gate, up from the post-attention norm's output.
    GateUp = 2,
    /// down from SwiGLU's output.
    Down = 3,
}

impl Group {
    /// Every group, in block order.
    pub const ALL: [Group; 4] = [Group::Qkv, Group::O, Group::GateUp, Group::Down];

    /// The fused weight this group multiplies by, in a block's offsets.
    pub fn weight(self, o: &LayerOffsets) -> usize {
        match self {
            Group::Qkv => o.w_qkv,
            Group::O => o.w_o,
            Group::GateUp => o.w_gu,
            Group::Down => o.w_down,
        }
    }
}

/// One fused GEMM's adapter.
#[derive(Debug, Clone)]
pub struct LoraGroup {
    /// `[members · r, in]`: the adapted members' `A`, stacked.
    pub a: usize,
    /// The GEMM's input width.
    pub input: usize,
    /// Its output's row stride (the fused output's width).
    pub ld_out: usize,
    /// The adapted members.
    pub members: Vec<LoraMember>,
}

impl LoraGroup {
    /// Columns of `x·Aᵀ` (members · r).
    pub fn width(&self, rank: usize) -> usize {
        self.members.len() * rank
    }
}

/// One adapted linear of a fused GEMM.
#[derive(Debug, Clone)]
pub struct LoraMember {
    /// Its first column in the fused output (row in the fused weight).
    pub col: usize,
    /// Its output width.
    pub width: usize,
    /// `[width, r]`: its `B`.
    pub b: usize,
}

struct Builder {
    slots: Vec<Slot>,
    next: usize,
}

impl Builder {
    fn put(&mut self, name: String, shape: Vec<usize>) -> usize {
        let offset = self.next;
        self.next += shape.iter().product::<usize>();
        self.slots.push(Slot { name, shape, offset });
        offset
    }
    fn align(&mut self) {
        self.next = self.next.div_ceil(ALIGN) * ALIGN;
    }
    /// Puts tensors back to back (no padding between them) and returns the first offset.
    fn stacked(&mut self, parts: Vec<(String, Vec<usize>)>) -> usize {
        self.align();
        let first = self.next;
        for (n, s) in parts {
            self.put(n, s);
        }
        first
    }
}

impl Layout {
    /// The layout of a causal LM (`value_head`: a critic / reward model, with `score.weight`
    /// and without an LM head).
    pub fn new(cfg: &ModelConfig, value_head: bool) -> Layout {
        let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
        let mut b = Builder { slots: Vec::new(), next: 0 };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = format!("model.layers.{l}");
            let att = |x: &str, s: &str| format!("{p}.self_attn.{x}_proj.{s}");
            let mlp = |x: &str, s: &str| format!("{p}.mlp.{x}_proj.{s}");
            let w_qkv = b.stacked(vec![(att("q", "weight"), vec![qd, h]), (att("k", "weight"), vec![kvd, h]), (att("v", "weight"), vec![kvd, h])]);
            let b_qkv = cfg.qkv_bias.then(|| b.stacked(vec![(att("q", "bias"), vec![qd]), (att("k", "bias"), vec![kvd]), (att("v", "bias"), vec![kvd])]));
            let w_o = b.stacked(vec![(att("o", "weight"), vec![h, qd])]);
            let b_o = cfg.o_bias.then(|| b.stacked(vec![(att("o", "bias"), vec![h])]));
            let w_gu = b.stacked(vec![(mlp("gate", "weight"), vec![i, h]), (mlp("up", "weight"), vec![i, h])]);
            let b_gu = cfg.mlp_bias.then(|| b.stacked(vec![(mlp("gate", "bias"), vec![i]), (mlp("up", "bias"), vec![i])]));
            let w_down = b.stacked(vec![(mlp("down", "weight"), vec![h, i])]);
            let b_down = cfg.mlp_bias.then(|| b.stacked(vec![(mlp("down", "bias"), vec![h])]));
            let ln1 = b.stacked(vec![(format!("{p}.input_layernorm.weight"), vec![h])]);
            let ln2 = b.stacked(vec![(format!("{p}.post_attention_layernorm.weight"), vec![h])]);
            layers.push(LayerOffsets { w_qkv, b_qkv, w_o, b_o, w_gu, b_gu, w_down, b_down, ln1, ln2 });
        }
        let embed = b.stacked(vec![("model.embed_tokens.weight".into(), vec![v, h])]);
        let norm = b.stacked(vec![("model.norm.weight".into(), vec![h])]);
        let score = value_head.then(|| b.stacked(vec![("score.weight".into(), vec![1, h])]));
        b.align();
        let trainable = if value_head { b.next } else { usize::MAX };
        let lm_head = (!cfg.tie_word_embeddings).then(|| b.stacked(vec![("lm_head.weight".into(), vec![v, h])]));
        b.align();
        Layout { slots: b.slots, layers, embed, norm, lm_head, score, total: b.next, trainable: trainable.min(b.next), lora: None }
    }

    /// The layout of a causal LM under a LoRA adapter: the factors first (PEFT's names and
    /// shapes: `A` `[r, in]`, `B` `[out, r]`), which alone train, then the base model's layout
    /// as [`Layout::new`] makes it, shifted — so the merged model of a rollout is one copy of
    /// `[base, total)` with each member's product added.
    pub fn with_lora(cfg: &ModelConfig, lora: &LoraConfig) -> Layout {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
        let r = lora.rank;
        let ldq = qd + 2 * kvd;
        // Each group's input width, output stride, and members as (path, first output column,
        // width).
        type Members<'a> = &'a [(&'a str, usize, usize)];
        let groups: [(Group, usize, usize, Members); 4] = [
            (Group::Qkv, h, ldq, &[("self_attn.q_proj", 0, qd), ("self_attn.k_proj", qd, kvd), ("self_attn.v_proj", qd + kvd, kvd)]),
            (Group::O, qd, h, &[("self_attn.o_proj", 0, h)]),
            (Group::GateUp, h, 2 * i, &[("mlp.gate_proj", 0, i), ("mlp.up_proj", i, i)]),
            (Group::Down, i, h, &[("mlp.down_proj", 0, h)]),
        ];
        let mut b = Builder { slots: Vec::new(), next: 0 };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let mut per: [Option<LoraGroup>; 4] = [None, None, None, None];
            for (g, input, ld_out, members) in groups {
                let adapted: Vec<_> = members.iter().filter(|(p, ..)| lora.adapts(p)).collect();
                if adapted.is_empty() {
                    continue;
                }
                let name = |p: &str, f: &str| format!("model.layers.{l}.{p}.lora_{f}.weight");
                let a = b.stacked(adapted.iter().map(|(p, ..)| (name(p, "A"), vec![r, input])).collect());
                let members = adapted.iter().map(|&&(p, col, width)| LoraMember { col, width, b: b.stacked(vec![(name(p, "B"), vec![width, r])]) }).collect();
                per[g as usize] = Some(LoraGroup { a, input, ld_out, members });
            }
            layers.push(per);
        }
        b.align();
        let base = b.next;
        let mut plain = Layout::new(cfg, false).shifted(base);
        b.slots.append(&mut plain.slots);
        plain.slots = b.slots;
        plain.trainable = base;
        plain.lora = Some(LoraLayout { scale: lora.scale() as f32, rank: r, layers, base });
        plain
    }

    /// This layout `by` elements further into the buffer.
    fn shifted(mut self, by: usize) -> Layout {
        for s in &mut self.slots {
            s.offset += by;
        }
        for o in &mut self.layers {
            for off in [&mut o.w_qkv, &mut o.w_o, &mut o.w_gu, &mut o.w_down, &mut o.ln1, &mut o.ln2] {
                *off += by;
            }
            for off in [&mut o.b_qkv, &mut o.b_o, &mut o.b_gu, &mut o.b_down].into_iter().flatten() {
                *off += by;
            }
        }
        for off in [&mut self.embed, &mut self.norm] {
            *off += by;
        }
        for off in [&mut self.lm_head, &mut self.score].into_iter().flatten() {
            *off += by;
        }
        self.total += by;
        self.trainable = self.trainable.saturating_add(by).min(self.total);
        self
    }

    /// Whether the base weights are frozen (a LoRA adapter trains instead).
    pub fn frozen_base(&self) -> bool {
        self.lora.is_some()
    }

    /// The adapter of block `l`'s fused GEMM `g`, if any.
    pub fn lora_group(&self, l: usize, g: Group) -> Option<(&LoraGroup, usize, f32)> {
        let lora = self.lora.as_ref()?;
        lora.layers[l][g as usize].as_ref().map(|grp| (grp, lora.rank, lora.scale))
    }

    /// The LM head's weight `[V, H]`: its own, or the embeddings when tied (not meaningful for
    /// a value model).
    pub fn head(&self) -> usize {
        self.lm_head.unwrap_or(self.embed)
    }

    /// Parameters, padding excluded.
    pub fn num_params(&self) -> usize {
        self.slots.iter().map(Slot::len).sum()
    }

    /// Slots by name.
    pub fn by_name(&self) -> BTreeMap<&str, &Slot> {
        self.slots.iter().map(|s| (s.name.as_str(), s)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ModelConfig {
        let text = r#"{"model_type":"qwen2","vocab_size":256,"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
            "num_attention_heads":4,"num_key_value_heads":2,"tie_word_embeddings":true}"#;
        ModelConfig::from_json_str(text, std::path::Path::new("config.json")).expect("valid config")
    }

    #[test]
    fn stacked_projections_are_contiguous_and_tensors_do_not_overlap() {
        let l = Layout::new(&cfg(), false);
        let names = l.by_name();
        let q = names["model.layers.0.self_attn.q_proj.weight"];
        let k = names["model.layers.0.self_attn.k_proj.weight"];
        let v = names["model.layers.0.self_attn.v_proj.weight"];
        assert_eq!(k.offset, q.offset + q.len());
        assert_eq!(v.offset, k.offset + k.len());
        assert_eq!(l.layers[0].w_qkv, q.offset);
        let gate = names["model.layers.1.mlp.gate_proj.weight"];
        assert_eq!(names["model.layers.1.mlp.up_proj.weight"].offset, gate.offset + gate.len());
        let mut spans: Vec<(usize, usize)> = l.slots.iter().map(|s| (s.offset, s.offset + s.len())).collect();
        spans.sort();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
        assert!(spans.last().is_some_and(|s| s.1 <= l.total));
        // Tied: no lm_head slot, the head reads the embeddings; q/k/v biases, no o bias.
        assert!(l.lm_head.is_none() && l.head() == l.embed);
        assert!(l.layers[0].b_qkv.is_some() && l.layers[0].b_o.is_none());
        let critic = Layout::new(&cfg(), true);
        assert!(critic.score.is_some() && critic.by_name().contains_key("score.weight"));
        assert_eq!(l.trainable, l.total);
        let mut untied = cfg();
        untied.tie_word_embeddings = false;
        let critic = Layout::new(&untied, true);
        assert!(critic.lm_head.is_some_and(|o| o >= critic.trainable), "a critic's LM head is carried, not trained");
    }

    #[test]
    fn lora_factors_come_first_and_the_base_layout_follows_shifted() {
        let lora = LoraConfig::new(4, 8.0, &["q_proj".into(), "v_proj".into(), "down_proj".into()]).expect("targets");
        let l = Layout::with_lora(&cfg(), &lora);
        let plain = Layout::new(&cfg(), false);
        let base = l.lora.as_ref().map(|x| x.base).expect("lora");
        assert_eq!(l.trainable, base);
        assert_eq!(l.total, base + plain.total);
        let names = l.by_name();
        for s in &plain.slots {
            assert_eq!(names[s.name.as_str()].offset, s.offset + base, "{}", s.name);
        }
        assert_eq!(l.layers[1].w_down, plain.layers[1].w_down + base);
        assert_eq!(l.embed, plain.embed + base);
        let factors: Vec<&Slot> = l.slots.iter().filter(|s| s.offset < base).collect();
        assert_eq!(factors.len(), 2 * 3 * 2, "A and B of 3 linears in 2 layers");
        assert!(factors.iter().all(|s| s.name.contains(".lora_")));
        // q and v share one stacked A ([2r, H]); q's B, then v's (its columns after q's and k's).
        let (qkv, r, scale) = l.lora_group(0, Group::Qkv).expect("qkv adapted");
        assert_eq!((r, scale), (4, 2.0));
        assert_eq!(qkv.a, names["model.layers.0.self_attn.q_proj.lora_A.weight"].offset);
        assert_eq!(names["model.layers.0.self_attn.v_proj.lora_A.weight"].offset, qkv.a + 4 * 64);
        assert_eq!(qkv.members.iter().map(|m| (m.col, m.width)).collect::<Vec<_>>(), vec![(0, 64), (64 + 32, 32)]);
        assert_eq!(qkv.members[1].b, names["model.layers.0.self_attn.v_proj.lora_B.weight"].offset);
        assert_eq!((qkv.input, qkv.ld_out, qkv.width(r)), (64, 128, 8));
        assert!(l.lora_group(0, Group::O).is_none() && l.lora_group(1, Group::GateUp).is_none());
        let (down, ..) = l.lora_group(1, Group::Down).expect("down adapted");
        assert_eq!((down.input, down.ld_out), (128, 64));
        let mut spans: Vec<(usize, usize)> = l.slots.iter().map(|s| (s.offset, s.offset + s.len())).collect();
        spans.sort();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
    }
}
