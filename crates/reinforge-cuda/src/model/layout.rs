//! Where every weight lives in the model's one flat parameter buffer (llm.c's layout): each
//! tensor keeps its Hugging Face shape and row-major order, so it uploads and downloads as
//! is; the projections that run as one GEMM sit side by side — q, k, v as one `[qd + 2·kvd, H]`
//! matrix, gate and up as one `[2·I, H]` — and gradients and optimizer moments mirror the
//! same offsets. One buffer per model is what ZeRO/FSDP will later shard.

use reinforge_engine::ModelConfig;
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
    /// (it has no gradient, and the CPU engine's AdamW leaves such tensors alone).
    pub trainable: usize,
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
        Layout { slots: b.slots, layers, embed, norm, lm_head, score, total: b.next, trainable: trainable.min(b.next) }
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
}
