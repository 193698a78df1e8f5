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
            .and_then(|b| safetensors::SafeTensors::deserialize(&b).ok().map(|st| st.names().iter().any(|n| *n == "score.weight")))
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

    fn score_texts(&self, texts: &[String]) -> Result<Vec<f64>, RewardError> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(self.batch_size) {
            let ids = chunk
                .iter()
                .map(|t| self.tok.encode(t, false).map_err(|e| RewardError::config("reward_model", e.to_string())))
                .collect::<Result<Vec<_>, _>>()?;
            out.extend(match &self.model {
                Backend::Cpu(m) => Self::cpu_values(m, &ids)?,
                Backend::Cuda(m) => Self::cuda_values(m, &ids)?,
            });
        }
        Ok(out)
    }

    /// The value at each sequence's last token, on the GPU: sequences packed end to end.
    fn cuda_values(model: &Mutex<reinforge_cuda::DeviceModel>, ids: &[Vec<u32>]) -> Result<Vec<f64>, RewardError> {
        let err = |e: String| RewardError::config("reward_model", e);
        let model = model.lock().map_err(|_| err("model lock poisoned".into()))?;
        // An empty text is scored as one padding token, as on the CPU.
        let seqs: Vec<&[u32]> = ids.iter().map(|r| if r.is_empty() { &[0u32][..] } else { r.as_slice() }).collect();
        let packed = reinforge_cuda::Packed::new(&seqs, model.cfg.vocab_size, model.cfg.max_position_embeddings).map_err(|e| err(e.to_string()))?;
        let rows: Vec<usize> = packed.seqs.iter().map(|&(start, len)| start + len - 1).collect();
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
        let texts: Vec<String> = samples.iter().map(|s| format!("{}{}", s.prompt, s.response)).collect();
        Ok(self.score_texts(&texts)?.into_iter().map(|s| RewardOutput::new(s)).collect())
    }
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
