//! The reward-model scorer: a sequence-classification head (`score.weight`) on the engine's
//! transformer, read at the last token of prompt + response (transformers'
//! `*ForSequenceClassification` convention). Registered as reward kind `reward_model`.

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

/// Scores `prompt + response` with a value head.
pub struct RewardModelScorer {
    // The model is not Sync-shareable mid-forward by contract of RewardFn users; a mutex keeps
    // one forward at a time without requiring that of burn's tensors.
    model: Mutex<ValueModel>,
    tok: Tokenizer,
    batch_size: usize,
    name: String,
}

impl RewardModelScorer {
    /// Loads the scorer; fails if the directory has no `score.weight`.
    pub fn load(params: &RewardModelParams) -> Result<Self, RewardError> {
        let cfg_err = |m: String| RewardError::config("reward_model", m);
        let dir: PathBuf = reinforge_assets::resolve_model(&params.path).map_err(|e| cfg_err(e.to_string()))?;
        let device = DeviceSpec::Cpu.inference_device().map_err(|e| cfg_err(e.to_string()))?;
        let has_head = std::fs::read(dir.join("model.safetensors"))
            .ok()
            .and_then(|b| safetensors::SafeTensors::deserialize(&b).ok().map(|st| st.names().iter().any(|n| *n == "score.weight")))
            .unwrap_or(false);
        if !has_head {
            return Err(cfg_err(format!(
                "{}: no `score.weight` in model.safetensors; a reward model needs a trained value head",
                dir.display()
            )));
        }
        let model = ValueModel::load(&dir, &device).map_err(|e| cfg_err(e.to_string()))?;
        let tok = Tokenizer::from_dir(&dir).map_err(|e| cfg_err(e.to_string()))?;
        Ok(Self { model: Mutex::new(model), tok, batch_size: params.batch_size.max(1), name: "reward_model".into() })
    }

    fn score_texts(&self, texts: &[String]) -> Result<Vec<f64>, RewardError> {
        let model = self.model.lock().map_err(|_| RewardError::config("reward_model", "model lock poisoned"))?;
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(self.batch_size) {
            let ids = chunk
                .iter()
                .map(|t| self.tok.encode(t, false).map_err(|e| RewardError::config("reward_model", e.to_string())))
                .collect::<Result<Vec<_>, _>>()?;
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
            let v = model
                .values(&ForwardInput::from_mask(rows, mask))
                .map_err(|e| RewardError::config("reward_model", e.to_string()))?;
            let [b, t] = v.dims();
            let last: Vec<f32> = v
                .slice([0..b, t - 1..t])
                .into_data()
                .try_into_vec()
                .map_err(|e| RewardError::config("reward_model", format!("{e:?}")))?;
            out.extend(last.into_iter().map(f64::from));
        }
        Ok(out)
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
        let texts: Vec<String> = samples.iter().map(|s| format!("{}{}", s.prompt, s.response)).collect();
        Ok(self.score_texts(&texts)?.into_iter().map(|s| RewardOutput::new(s)).collect())
    }
}

/// The built-in reward kinds plus `reward_model`.
pub fn registry() -> reinforge_reward::Registry {
    let mut r = reinforge_reward::Registry::builtin();
    r.register("reward_model", |p, _| {
        let params: RewardModelParams = reinforge_reward::parse_params("reward_model", p)?;
        Ok(Box::new(RewardModelScorer::load(&params)?))
    });
    r
}
