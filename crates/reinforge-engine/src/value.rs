//! The critic / reward-model shape: the transformer backbone with a scalar head on top
//! (`score.weight`, as transformers' `*ForSequenceClassification` and OpenRLHF critics name it).

use crate::config::ModelConfig;
use crate::error::Result;
use crate::model::{ForwardInput, Linear, Transformer};
use crate::weights::{HostTensor, WeightSet};
use burn::module::{Module, Param, ParamId};
use burn::tensor::{Device, Tensor, TensorData};
use std::collections::BTreeMap;
use std::path::Path;

/// Salt for the critic's parameter ids, so they never collide with the actor's.
const CRITIC_SALT: u64 = 1;

/// A transformer whose output is one value per position.
#[derive(Module, Debug)]
pub struct ValueModel {
    /// Shapes and numerics.
    #[module(skip)]
    pub config: ModelConfig,
    /// The backbone (its LM head, if any, is unused).
    pub net: Transformer,
    /// `[hidden, 1]` value head.
    pub head: Linear,
}

impl ValueModel {
    /// Loads a backbone from an HF directory; the head comes from `score.weight` when the
    /// directory has one (a trained critic or reward model), else it starts at zero so initial
    /// values are 0 and GAE starts from plain returns.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let mut w = WeightSet::load_dir(dir)?;
        Self::from_weight_set(config, &mut w, device)
    }

    /// Builds from HF-named tensors (checkpoints).
    pub fn from_hf_tensors(config: ModelConfig, tensors: BTreeMap<String, HostTensor>, device: &Device) -> Result<Self> {
        let mut w = WeightSet::from_map("<tensors>", tensors.into_iter().collect());
        Self::from_weight_set(config, &mut w, device)
    }

    fn from_weight_set(config: ModelConfig, w: &mut WeightSet, device: &Device) -> Result<Self> {
        let h = config.hidden_size;
        let score = w.take_opt("score.weight", &[1, h])?.map(|t| t.data).unwrap_or_else(|| vec![0.0; h]);
        let net = Transformer::from_weights(&config, w, device, CRITIC_SALT)?;
        let mut weight = Param::from_tensor(Tensor::from_data(TensorData::new(score, [h, 1]), device));
        weight.id = ParamId::from(0x5C0E_u64 ^ CRITIC_SALT);
        Ok(Self { config, net, head: Linear { weight, bias: None, lora: None } })
    }

    /// Values `[B, T]`.
    pub fn values(&self, input: &ForwardInput) -> Result<Tensor<2>> {
        let hidden = self.net.hidden_states(&self.config, input)?;
        let [b, t, h] = hidden.dims();
        Ok(burn::tensor::module::linear(hidden.reshape([b * t, h]), self.head.weight.val(), None).reshape([b, t]))
    }

    /// HF-named tensors including `score.weight` (`[1, hidden]`).
    pub fn to_hf_tensors(&self) -> Result<BTreeMap<String, HostTensor>> {
        let mut out = self.net.to_hf_tensors(&self.config)?;
        let data = crate::model::host_vec(self.head.weight.val())?;
        out.insert("score.weight".into(), HostTensor { shape: vec![1, self.config.hidden_size], data });
        Ok(out)
    }
}
