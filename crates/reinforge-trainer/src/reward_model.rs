//! The reward-model scorer: a sequence-classification head (`score.weight`) on the engine's
//! transformer, read at the last token of prompt + response (transformers'
//! `*ForSequenceClassification` convention). Registered as reward kind `reward_model`; it
//! scores on the CUDA engine when `trainer.device` is a GPU ([`registry_on`]), else on the CPU.

use reinforge_engine::{DeviceSpec, ForwardInput, ValueModel};
use reinforge_reward::{RewardError, RewardFn, RewardInput, RewardOutput};
use reinforge_tokenizer::Tokenizer;
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Mutex;

/// `[reward] kind = "reward_model"` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardModelParams {
    /// HF directory (or known model name) with `score.weight` and a tokenizer.
    pub path: String,
    /// Sequences per forward pass.
    #[serde(default = "default_batch")]
    pub batch_size: usize,
}

fn default_batch() -> usize {
    8
}

/// The engine a reward model runs on.
// One per scorer: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Backend {
    // The model is not Sync-shareable mid-forward by contract of RewardFn users; a mutex keeps
    // one forward at a time without requiring that of burn's tensors.
    Cpu(Mutex<ValueModel>),
    /// On the GPU (bf16 or f32, as `trainer.dtype`), sequences packed without padding.
    Cuda(Mutex<reinforge_cuda::DeviceModel>),
}

/// Scores `prompt + response` with a value head.
pub struct RewardModelScorer {
    model: Backend,
    tok: Tokenizer,
    batch_size: usize,
    name: String,
}

impl RewardModelScorer {
    /// Loads the scorer on the CPU; fails if the directory has no `score.weight`.
    pub fn load(params: &RewardModelParams) -> Result<Self, RewardError> {
        Self::load_on(params, None)
    }

    /// Loads the scorer on the CPU, or on the CUDA engine of `cuda`'s `trainer.device`.
    pub fn load_on(params: &RewardModelParams, cuda: Option<&crate::config::TrainConfig>) -> Result<Self, RewardError> {
        let cfg_err = |m: String| RewardError::config("reward_model", m);
        let dir: PathBuf = reinforge_assets::resolve_model(&params.path).map_err(|e| cfg_err(e.to_string()))?;
        let has_head = std::fs::read(dir.join("model.safetensors"))
            .ok()
            .and_then(|b| safetensors::SafeTensors::deserialize(&b).ok().map(|st| st.names().contains(&"score.weight")))
            .unwrap_or(false);
        if !has_head {
            return Err(cfg_err(format!(
                "{}: no `score.weight` in model.safetensors; a reward model needs a trained value head",
                dir.display()
            )));
        }
        let model = match cuda {
            Some(cfg) => {
                let gpu = crate::cuda::open_gpu(cfg).map_err(|e| cfg_err(e.to_string()))?;
                let dt = crate::cuda::dtype(cfg).map_err(|e| cfg_err(e.to_string()))?;
                Backend::Cuda(Mutex::new(reinforge_cuda::DeviceModel::load(&gpu, &dir, dt, true).map_err(|e| cfg_err(e.to_string()))?))
            }
            None => {
                let device = DeviceSpec::Cpu.inference_device().map_err(|e| cfg_err(e.to_string()))?;
                Backend::Cpu(Mutex::new(ValueModel::load(&dir, &device).map_err(|e| cfg_err(e.to_string()))?))
            }
        };
        let tok = Tokenizer::from_dir(&dir).map_err(|e| cfg_err(e.to_string()))?;
        Ok(Self { model, tok, batch_size: params.batch_size.max(1), name: "reward_model".into() })
    }

    /// Scores each `(prompt, text)`, `text` being the prompt and its response.
    fn score_texts(&self, texts: &[(&str, String)]) -> Result<Vec<f64>, RewardError> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(self.batch_size) {
            let ids = chunk
                .iter()
                .map(|(_, t)| self.tok.encode(t, false).map_err(|e| RewardError::config("reward_model", e.to_string())))
                .collect::<Result<Vec<_>, _>>()?;
            out.extend(match &self.model {
                Backend::Cpu(m) => Self::cpu_values(m, &ids)?,
                Backend::Cuda(m) => {
                    let prompts: Vec<&str> = chunk.iter().map(|(p, _)| *p).collect();
                    Self::cuda_values(m, &ids, &prompts)?
                }
            });
        }
        Ok(out)
    }

    /// The value at each sequence's last token, on the GPU: sequences packed end to end, the
    /// samples of one prompt after one copy of the tokens they share ([`pack_for_scoring`]).
    fn cuda_values(model: &Mutex<reinforge_cuda::DeviceModel>, ids: &[Vec<u32>], prompts: &[&str]) -> Result<Vec<f64>, RewardError> {
        let err = |e: String| RewardError::config("reward_model", e);
        let model = model.lock().map_err(|_| err("model lock poisoned".into()))?;
        let (packed, rows) = pack_for_scoring(ids, prompts, &model.cfg).map_err(|e| err(e.to_string()))?;
        let out = model.score(&packed, &rows, reinforge_cuda::Head::Value).map_err(|e| err(e.to_string()))?;
        Ok(out.value.into_iter().map(f64::from).collect())
    }

    /// The value at each sequence's last token, on the CPU: left-padded rows.
    fn cpu_values(model: &Mutex<ValueModel>, ids: &[Vec<u32>]) -> Result<Vec<f64>, RewardError> {
        let model = model.lock().map_err(|_| RewardError::config("reward_model", "model lock poisoned"))?;
        let longest = ids.iter().map(Vec::len).max().unwrap_or(1).max(1);
        // Left padding puts every sequence's last token in the last column.
        let (rows, mask): (Vec<Vec<u32>>, Vec<Vec<bool>>) = ids
            .iter()
            .map(|r| {
                let pad = longest - r.len().max(1);
                let mut row = vec![0u32; pad];
                let mut m = vec![false; pad];
                if r.is_empty() {
                    row.push(0);
                    m.push(true);
                } else {
                    row.extend_from_slice(r);
                    m.extend(std::iter::repeat_n(true, r.len()));
                }
                (row, m)
            })
            .unzip();
        let v = model.values(&ForwardInput::from_mask(rows, mask)).map_err(|e| RewardError::config("reward_model", e.to_string()))?;
        let [b, t] = v.dims();
        let last: Vec<f32> = v.slice([0..b, t - 1..t]).into_data().try_into_vec().map_err(|e| RewardError::config("reward_model", format!("{e:?}")))?;
        Ok(last.into_iter().map(f64::from).collect())
    }
}

impl RewardFn for RewardModelScorer {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError> {
        Ok(self.score_batch(std::slice::from_ref(sample))?.remove(0))
    }

    fn score_batch(&self, samples: &[RewardInput]) -> Result<Vec<RewardOutput>, RewardError> {
        let texts: Vec<(&str, String)> = samples.iter().map(|s| (s.prompt.as_str(), format!("{}{}", s.prompt, s.response))).collect();
        Ok(self.score_texts(&texts)?.into_iter().map(RewardOutput::new).collect())
    }
}

/// Sequences `ids` packed for the CUDA engine, with the row of each one's last token (in the
/// order of `ids`). The texts of one prompt (GRPO's n samples) share the tokens their ids
/// begin with, so those are packed once and each text continues them with its own: the
/// reward model is a forward pass, whose values at a continuation's rows are those of the
/// whole text. The reward model's tokenizer may join a prompt's last characters with the
/// response's first, so what is shared is the ids' common beginning, not the prompt's ids,
/// and at least one token stays each text's own. An empty text is scored as one padding
/// token, as on the CPU.
fn pack_for_scoring(ids: &[Vec<u32>], prompts: &[&str], cfg: &reinforge_engine::ModelConfig) -> Result<(reinforge_cuda::Packed, Vec<usize>), reinforge_cuda::CudaError> {
    let seq = |i: usize| if ids[i].is_empty() { &[0u32][..] } else { ids[i].as_slice() };
    let mut seqs: Vec<&[u32]> = Vec::new();
    let mut prefix = Vec::new();
    // Which packed sequence ends at each text's last token.
    let mut own = vec![0usize; ids.len()];
    for group in crate::roles::same_prompt_groups(prompts) {
        let first = seq(group[0]);
        let common = group.iter().map(|&i| first.iter().zip(seq(i)).take_while(|(a, b)| a == b).count().min(seq(i).len() - 1)).min().unwrap_or(0);
        let shared = group.len() > 1 && common > 0;
        if shared {
            prefix.push(None);
            seqs.push(&first[..common]);
        }
        let p = seqs.len() - usize::from(shared);
        for &i in &group {
            own[i] = seqs.len();
            seqs.push(&seq(i)[if shared { common } else { 0 }..]);
            prefix.push(shared.then_some(p));
        }
    }
    let packed = reinforge_cuda::Packed::with_prefixes(&seqs, &prefix, cfg.vocab_size, cfg.max_position_embeddings)?;
    let rows = own.iter().map(|&k| packed.seqs[k].0 + packed.seqs[k].1 - 1).collect();
    Ok((packed, rows))
}

/// The built-in reward kinds plus `reward_model` (on the CPU).
pub fn registry() -> reinforge_reward::Registry {
    let mut r = reinforge_reward::Registry::builtin();
    r.register("reward_model", |p, _| {
        let params: RewardModelParams = reinforge_reward::parse_params("reward_model", p)?;
        Ok(Box::new(RewardModelScorer::load(&params)?))
    });
    r
}

/// [`registry`], with `reward_model` on the CUDA engine when `cfg`'s `trainer.device` is a GPU
/// (or its emulator): a reward model of a real size needs one.
pub fn registry_on(cfg: &crate::config::TrainConfig) -> reinforge_reward::Registry {
    let mut r = registry();
    if matches!(cfg.trainer.device.parse::<DeviceSpec>(), Ok(DeviceSpec::Cuda(_) | DeviceSpec::CudaEmulated)) {
        let cfg = cfg.clone();
        r.register("reward_model", move |p, _| {
            let params: RewardModelParams = reinforge_reward::parse_params("reward_model", p)?;
            Ok(Box::new(RewardModelScorer::load_on(&params, Some(&cfg))?))
        });
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_of_one_prompt_share_their_common_ids() {
        let cfg = reinforge_engine::ModelConfig::from_dir(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/tiny-arith")).unwrap();
        // Two samples of prompt a whose ids agree on 4 tokens (the tokenizer joined the
        // prompt's end with one response), one of prompt b, and a sample of a that is all
        // prompt: each keeps at least its last token.
        let ids: Vec<Vec<u32>> = vec![vec![1, 2, 3, 4, 5, 6], vec![9, 9], vec![1, 2, 3, 4, 7], vec![1, 2, 3, 4, 5]];
        let (packed, rows) = pack_for_scoring(&ids, &["a", "b", "a", "a"], &cfg).unwrap();
        assert_eq!(packed.seqs, vec![(0, 4), (4, 2), (6, 1), (7, 1), (8, 2)]);
        assert_eq!(packed.prefix, vec![None, Some(0), Some(0), Some(0), None]);
        assert_eq!(rows, vec![5, 9, 6, 7]);
        // One text of a prompt, or texts with nothing in common: no prefix.
        let (packed, rows) = pack_for_scoring(&[vec![1, 2], vec![3], vec![]], &["a", "b", "b"], &cfg).unwrap();
        assert_eq!(packed.prefix, vec![None; 3]);
        assert_eq!(rows, vec![1, 2, 3]);
    }
}
