//! What a run needs from the machines, from its config: the worker groups it will place and a
//! host-memory estimate per rank, the checkpoint size, and whether it wants GPUs. `reinforge
//! doctor` and the preflight of `reinforge train --ray` judge the nodes against this.
//!
//! The memory estimate follows what the CPU engine keeps (f32 everywhere): weights, gradients
//! and AdamW moments for the roles that train, a packed copy for generation, the KV cache of
//! the sequences a rollout rank decodes at once, and one micro-batch's activations. It is an
//! estimate: the README's "Preflight" section shows it next to measured peaks.

use crate::config::TrainConfig;
use crate::remote::plan;
use crate::roles::MicroBatching;
use crate::worker::RoleKind;
use reinforge_cluster::doctor::checks::{GroupDemand, Requirements};
use reinforge_engine::ModelConfig;

/// What one process needs regardless of the model: the binary, tokenizer, datasets, buffers.
const PROCESS_BASE: u64 = 256 << 20;
const F32: u64 = 4;

/// Parameters of a decoder-only transformer with this shape.
pub fn param_count(m: &ModelConfig) -> u64 {
    let (h, i, v, l) = (m.hidden_size as u64, m.intermediate_size as u64, m.vocab_size as u64, m.num_layers as u64);
    let (q, kv) = ((m.num_heads * m.head_dim) as u64, (m.num_kv_heads * m.head_dim) as u64);
    let attn = h * q + 2 * h * kv + q * h + if m.qkv_bias { q + 2 * kv } else { 0 };
    let mlp = 3 * h * i;
    let embed = v * h * if m.tie_word_embeddings { 1 } else { 2 };
    embed + l * (attn + mlp + 2 * h) + h
}

/// The model's size and shape.
struct Sizes {
    params: u64,
    model: ModelConfig,
}

impl Sizes {
    /// One micro-batch's activations kept for the backward pass (or a forward's, `grad` false):
    /// per token and layer the residual-stream and MLP tensors and the attention scores; per
    /// token one row of logits (the LM head and its loss are fused, row by row).
    fn activations(&self, tokens: u64, seq: usize, grad: bool, checkpointing: bool) -> u64 {
        let m = &self.model;
        let per_layer = 6 * m.hidden_size as u64 + 2 * m.intermediate_size as u64 + (m.num_heads * seq) as u64;
        let (layers, logits) = match (grad, checkpointing) {
            (false, _) => (1, 2),
            (true, true) => (2, 1),
            (true, false) => (m.num_layers as u64, 1),
        };
        tokens * (layers * per_layer + logits * m.vocab_size as u64) * F32
    }

    /// The KV cache of `seqs` sequences of `seq` tokens.
    fn kv_cache(&self, seqs: usize, seq: usize) -> u64 {
        let m = &self.model;
        (seqs * seq) as u64 * (m.num_layers * 2 * m.num_kv_heads * m.head_dim) as u64 * F32
    }
}

/// A role's memory in one process: what it keeps across phases, and the most it adds while its
/// own phase runs (phases run one after the other, so a process peaks at the sum of the kept
/// parts plus the largest transient part).
#[derive(Clone, Copy)]
struct RoleMemory {
    kept: u64,
    transient: u64,
}

fn role_memory(cfg: &TrainConfig, role: RoleKind, s: &Sizes, rollout_world: usize) -> RoleMemory {
    let seq = cfg.data.max_prompt_length + cfg.data.max_response_length;
    // The most tokens of one micro-batch: a token budget holds no more than a mini-batch.
    let micro_tokens = |m: MicroBatching| match m {
        MicroBatching::Seqs(n) => (n * seq) as u64,
        MicroBatching::Tokens { max: t, .. } => t.min(cfg.mini_batch_seqs() * seq) as u64,
    };
    let micro = micro_tokens(cfg.actor_micro());
    let ckpt = cfg.actor.gradient_checkpointing;
    let weights = s.params * F32;
    match role {
        // Weights, gradients and AdamW's two moments.
        RoleKind::Actor => RoleMemory { kept: 4 * weights, transient: s.activations(micro, seq, true, ckpt) },
        RoleKind::Critic => RoleMemory { kept: 4 * weights, transient: s.activations(micro_tokens(cfg.critic_micro()), seq, true, ckpt) },
        RoleKind::Rollout => {
            let seqs = (cfg.generation_batch() * cfg.rollout.n).div_ceil(rollout_world.max(1));
            RoleMemory { kept: weights, transient: s.kv_cache(seqs, seq) + seqs as u64 * s.model.vocab_size as u64 * F32 }
        }
        RoleKind::Ref | RoleKind::Reward => RoleMemory { kept: weights, transient: s.activations(micro, seq, false, false) },
    }
}

/// Peak host memory of one process holding `roles`.
fn process_bytes(cfg: &TrainConfig, roles: &[RoleKind], s: &Sizes, rollout_world: usize) -> u64 {
    let parts: Vec<RoleMemory> = roles.iter().map(|&r| role_memory(cfg, r, s, rollout_world)).collect();
    PROCESS_BASE + parts.iter().map(|p| p.kept).sum::<u64>() + parts.iter().map(|p| p.transient).max().unwrap_or(0)
}

/// What `cfg` needs; a model that cannot be read here leaves the memory and checkpoint
/// estimates out (with the reason in `ram_note`) instead of failing.
pub fn requirements(cfg: &TrainConfig) -> Requirements {
    let sizes = reinforge_assets::resolve_model(&cfg.actor.model)
        .map_err(|e| e.to_string())
        .and_then(|dir| ModelConfig::from_dir(&dir).map_err(|e| e.to_string()))
        .map(|model| Sizes { params: param_count(&model), model });
    let (sizes, ram_note) = match sizes {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(format!("cannot read actor.model here: {e}"))),
    };
    let ray = cfg.cluster.backend == "ray";
    let groups = if ray { plan(cfg) } else { Vec::new() };
    let rollout_world = groups.iter().find(|g| g.roles.contains(&RoleKind::Rollout)).map_or(1, |g| g.spec.world());
    let demand = groups
        .iter()
        .map(|g| GroupDemand {
            spec: g.spec.clone(),
            roles: g.roles.iter().map(|r| format!("{r:?}").to_lowercase()).collect(),
            ram_per_rank: sizes.as_ref().map(|s| process_bytes(cfg, &g.roles, s, rollout_world)),
        })
        .collect();
    let local_ram = sizes.as_ref().filter(|_| !ray).map(|s| {
        let mut roles = vec![RoleKind::Actor, RoleKind::Rollout];
        if cfg.ref_enabled() {
            roles.push(RoleKind::Ref);
        }
        if cfg.critic_enabled() {
            roles.push(RoleKind::Critic);
        }
        if cfg.reward_uses_model() {
            roles.push(RoleKind::Reward);
        }
        process_bytes(cfg, &roles, s, 1)
    });
    // A checkpoint holds the policy's weights and AdamW moments, and the critic's when it trains.
    let checkpoint_bytes = sizes.as_ref().map(|s| {
        let one = 3 * s.params * F32;
        if cfg.critic_enabled() {
            2 * one
        } else {
            one
        }
    });
    Requirements {
        groups: demand,
        local_ram,
        ram_note,
        run_dir: std::path::absolute(cfg.out_dir()).unwrap_or_else(|_| cfg.out_dir()),
        checkpoint_bytes,
        checkpoints_kept: cfg.trainer.max_ckpt_to_keep,
        // The emulator runs on CPUs.
        wants_gpus: matches!(cfg.trainer.device.parse(), Ok(reinforge_engine::DeviceSpec::Cuda(_))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm2_135m_has_135m_parameters() {
        // SmolLM2-135M's config.json shape; transformers counts 134,515,008 parameters.
        let m = ModelConfig::from_json_str(
            r#"{"model_type":"llama","vocab_size":49152,"hidden_size":576,"intermediate_size":1536,"num_hidden_layers":30,
                "num_attention_heads":9,"num_key_value_heads":3,"tie_word_embeddings":true,"rms_norm_eps":1e-5}"#,
            std::path::Path::new("config.json"),
        )
        .unwrap();
        assert_eq!(param_count(&m), 134_515_008);
    }
}
