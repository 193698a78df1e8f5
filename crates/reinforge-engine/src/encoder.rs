//! A BERT-family text encoder for dense retrieval (sentence-transformers models such as
//! all-MiniLM-L6-v2, e5, bge): token, position and type embeddings, post-norm encoder layers
//! with bidirectional attention over the non-padding tokens, then mean (or CLS) pooling and
//! L2 normalisation as the model directory's sentence-transformers modules say.
//!
//! Inference only, on burn's CPU backend. Weights are the HF `BertModel` names, with or
//! without a `bert.` prefix; `1_Pooling/config.json`, `modules.json` (a `Normalize` module)
//! and `sentence_bert_config.json` (`max_seq_length`) are read when present.

use crate::error::{EngineError, Result};
use crate::weights::{HostTensor, WeightSet};
use burn::tensor::activation::{gelu, softmax};
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use reinforge_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};

/// How token vectors become one text vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Mean over the non-padding tokens (sentence-transformers' default, e5's).
    Mean,
    /// The first token (`[CLS]`; bge's).
    Cls,
}

/// `config.json` of a BERT-family model: what the encoder needs of it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct EncoderConfig {
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Feed-forward width.
    pub intermediate_size: usize,
    /// Vocabulary rows of the token embedding.
    pub vocab_size: usize,
    /// Position embedding rows.
    pub max_position_embeddings: usize,
    /// Token-type embedding rows.
    #[serde(default = "two")]
    pub type_vocab_size: usize,
    /// Layer-norm epsilon.
    #[serde(default = "bert_eps")]
    pub layer_norm_eps: f64,
    /// `gelu` (erf) is the only activation BERT-family encoders use here.
    #[serde(default = "gelu_name")]
    pub hidden_act: String,
    /// Model type (`bert`, `xlm-roberta`, …), for the error on an unsupported one.
    #[serde(default)]
    pub model_type: String,
}

fn two() -> usize {
    2
}
fn bert_eps() -> f64 {
    1e-12
}
fn gelu_name() -> String {
    "gelu".into()
}

struct Norm {
    weight: Tensor<1>,
    bias: Tensor<1>,
    eps: f64,
}

impl Norm {
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let mean = x.clone().mean_dim(2);
        let centred = x - mean;
        let var = centred.clone().square().mean_dim(2);
        centred * var.add_scalar(self.eps).sqrt().recip() * self.weight.clone().unsqueeze::<3>() + self.bias.clone().unsqueeze::<3>()
    }
}

/// `x · Wᵀ + b` with `W` kept transposed (`[in, out]`).
struct Dense {
    weight: Tensor<2>,
    bias: Tensor<1>,
}

impl Dense {
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let [b, t, i] = x.dims();
        let y = x.reshape([b * t, i]).matmul(self.weight.clone()) + self.bias.clone().unsqueeze::<2>();
        let [_, o] = y.dims();
        y.reshape([b, t, o])
    }
}

struct Layer {
    query: Dense,
    key: Dense,
    value: Dense,
    attn_out: Dense,
    attn_norm: Norm,
    intermediate: Dense,
    output: Dense,
    out_norm: Norm,
}

/// A loaded encoder with its tokenizer.
pub struct TextEncoder {
    cfg: EncoderConfig,
    tok: Tokenizer,
    word: Tensor<2>,
    position: Tensor<2>,
    token_type: Tensor<2>,
    emb_norm: Norm,
    layers: Vec<Layer>,
    pooling: Pooling,
    normalize: bool,
    max_len: usize,
    pad_id: u32,
    device: Device,
    dir: PathBuf,
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    match std::fs::read_to_string(path) {
        Ok(t) => serde_json::from_str(&t)
            .map(Some)
            .map_err(|e| EngineError::Weights { path: path.to_path_buf(), msg: format!("not valid JSON: {e}") }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(EngineError::Io { path: path.to_path_buf(), source }),
    }
}

impl TextEncoder {
    /// Loads a BERT-family model directory (`config.json`, `model.safetensors`,
    /// `tokenizer.json`, and sentence-transformers' module configs when present).
    pub fn load(dir: &Path) -> Result<Self> {
        let device = Device::default();
        let cfg_path = dir.join("config.json");
        let cfg_json = read_json(&cfg_path)?.ok_or_else(|| EngineError::Weights {
            path: cfg_path.clone(),
            msg: "missing: point at a BERT-family model directory (config.json, model.safetensors, tokenizer.json)".into(),
        })?;
        let cfg: EncoderConfig = serde_json::from_value(cfg_json)
            .map_err(|e| EngineError::Weights { path: cfg_path.clone(), msg: format!("not a BERT-family config: {e}") })?;
        if !matches!(cfg.model_type.as_str(), "" | "bert") || cfg.hidden_act != "gelu" {
            return Err(EngineError::Weights {
                path: cfg_path,
                msg: format!(
                    "model_type `{}` with hidden_act `{}`: the encoder runs BERT models (model_type bert, gelu), e.g. all-MiniLM-L6-v2, e5, bge",
                    cfg.model_type, cfg.hidden_act
                ),
            });
        }
        if cfg.num_attention_heads == 0 || !cfg.hidden_size.is_multiple_of(cfg.num_attention_heads) {
            return Err(EngineError::Weights { path: cfg_path, msg: "hidden_size must be a multiple of num_attention_heads".into() });
        }
        let tok = Tokenizer::from_dir(dir).map_err(|e| EngineError::Weights { path: dir.join("tokenizer.json"), msg: e.to_string() })?;
        let tok = tok.without_padding_or_truncation();
        let pad_id = tok.pad_id().or_else(|| tok.token_to_id("[PAD]")).unwrap_or(0);

        // sentence-transformers' modules: pooling, normalisation, the length it truncates to.
        let pooling = match read_json(&dir.join("1_Pooling/config.json"))? {
            Some(p) if p["pooling_mode_cls_token"].as_bool() == Some(true) => Pooling::Cls,
            _ => Pooling::Mean,
        };
        let normalize = match read_json(&dir.join("modules.json"))? {
            Some(m) => m.as_array().is_some_and(|a| a.iter().any(|x| x["type"].as_str().is_some_and(|t| t.ends_with("Normalize")))),
            // A bare HF directory: normalised embeddings, as Search-R1's encoder makes them.
            None => true,
        };
        let max_len = read_json(&dir.join("sentence_bert_config.json"))?
            .and_then(|s| s["max_seq_length"].as_u64())
            .map_or(cfg.max_position_embeddings, |n| n as usize)
            .min(cfg.max_position_embeddings);

        let mut w = WeightSet::load_dir(dir)?;
        let prefix = if w.contains("bert.embeddings.word_embeddings.weight") { "bert." } else { "" };
        let (h, f) = (cfg.hidden_size, cfg.intermediate_size);
        let mut take = |name: &str, shape: &[usize]| w.take(&format!("{prefix}{name}"), shape);
        let t1 = |t: HostTensor| Tensor::<1>::from_data(TensorData::new(t.data, [t.shape[0]]), &device);
        let t2 = |t: HostTensor| Tensor::<2>::from_data(TensorData::new(t.data, [t.shape[0], t.shape[1]]), &device);
        // HF linears are `[out, in]`: kept transposed for `x · W`.
        let dense = |take: &mut dyn FnMut(&str, &[usize]) -> Result<HostTensor>, name: &str, out: usize, inp: usize| -> Result<Dense> {
            let weight = t2(take(&format!("{name}.weight"), &[out, inp])?).transpose();
            let bias = t1(take(&format!("{name}.bias"), &[out])?);
            Ok(Dense { weight, bias })
        };
        let norm = |take: &mut dyn FnMut(&str, &[usize]) -> Result<HostTensor>, name: &str| -> Result<Norm> {
            Ok(Norm { weight: t1(take(&format!("{name}.weight"), &[h])?), bias: t1(take(&format!("{name}.bias"), &[h])?), eps: cfg.layer_norm_eps })
        };
        let word = t2(take("embeddings.word_embeddings.weight", &[cfg.vocab_size, h])?);
        let position = t2(take("embeddings.position_embeddings.weight", &[cfg.max_position_embeddings, h])?);
        let token_type = t2(take("embeddings.token_type_embeddings.weight", &[cfg.type_vocab_size, h])?);
        let emb_norm = norm(&mut take, "embeddings.LayerNorm")?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            layers.push(Layer {
                query: dense(&mut take, &format!("{p}.attention.self.query"), h, h)?,
                key: dense(&mut take, &format!("{p}.attention.self.key"), h, h)?,
                value: dense(&mut take, &format!("{p}.attention.self.value"), h, h)?,
                attn_out: dense(&mut take, &format!("{p}.attention.output.dense"), h, h)?,
                attn_norm: norm(&mut take, &format!("{p}.attention.output.LayerNorm"))?,
                intermediate: dense(&mut take, &format!("{p}.intermediate.dense"), f, h)?,
                output: dense(&mut take, &format!("{p}.output.dense"), h, f)?,
                out_norm: norm(&mut take, &format!("{p}.output.LayerNorm"))?,
            });
        }
        Ok(Self { cfg, tok, word, position, token_type, emb_norm, layers, pooling, normalize, max_len, pad_id, device, dir: dir.to_path_buf() })
    }

    /// Width of the embeddings.
    pub fn dim(&self) -> usize {
        self.cfg.hidden_size
    }

    /// Tokens kept per text (`max_seq_length`, or the model's position limit).
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Truncates to `max_len` tokens (the default).
    pub fn set_max_len(&mut self, n: usize) {
        self.max_len = n.clamp(2, self.cfg.max_position_embeddings);
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Token ids of `text` with `[CLS]`/`[SEP]`, truncated to `max_len` keeping the final
    /// separator (what transformers' `truncation=True` gives for one text).
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.tok.encode(text, true).map_err(|e| EngineError::Request(e.to_string()))?;
        if ids.len() > self.max_len {
            let last = ids[ids.len() - 1];
            ids.truncate(self.max_len - 1);
            ids.push(last);
        }
        Ok(ids)
    }

    /// One embedding per text (pooled, normalised per the model's modules), in order.
    pub fn encode(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let ids: Vec<Vec<u32>> = texts.iter().map(|t| self.token_ids(t)).collect::<Result<_>>()?;
        self.encode_ids(&ids)
    }

    /// Embeddings of already tokenised texts (each with its special tokens).
    pub fn encode_ids(&self, ids: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let (b, t) = (ids.len(), ids.iter().map(Vec::len).max().unwrap_or(0).max(1));
        if let Some(&bad) = ids.iter().flatten().find(|&&id| id as usize >= self.cfg.vocab_size) {
            return Err(EngineError::Request(format!("token id {bad} is outside the vocabulary ({})", self.cfg.vocab_size)));
        }
        let (h, nh) = (self.cfg.hidden_size, self.cfg.num_attention_heads);
        let hd = h / nh;
        let flat: Vec<i64> = ids.iter().flat_map(|r| r.iter().map(|&x| x as i64).chain(std::iter::repeat_n(self.pad_id as i64, t - r.len()))).collect();
        let valid: Vec<bool> = ids.iter().flat_map(|r| (0..t).map(move |j| j < r.len())).collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(flat, [b * t]), &self.device);
        let words = self.word.clone().select(0, idx).reshape([b, t, h]);
        let pos = self.position.clone().slice([0..t, 0..h]).unsqueeze::<3>();
        let typ = self.token_type.clone().slice([0..1, 0..h]).unsqueeze::<3>();
        let mut x = self.emb_norm.forward(words + pos + typ);
        // Padded keys are masked; a padded query still attends to real keys (its output is
        // never pooled), so no row is fully masked.
        let mask = Tensor::<2, Bool>::from_data(TensorData::new(valid.iter().map(|v| !v).collect::<Vec<_>>(), [b, t]), &self.device)
            .reshape([b, 1, 1, t])
            .expand([b, nh, t, t]);
        let scale = 1.0 / (hd as f64).sqrt();
        for l in &self.layers {
            let heads = |d: &Dense, x: Tensor<3>| d.forward(x).reshape([b, t, nh, hd]).swap_dims(1, 2);
            let (q, k, v) = (heads(&l.query, x.clone()), heads(&l.key, x.clone()), heads(&l.value, x.clone()));
            let scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(scale).mask_fill(mask.clone(), f32::NEG_INFINITY);
            let a = softmax(scores, 3).matmul(v).swap_dims(1, 2).reshape([b, t, h]);
            x = l.attn_norm.forward(x + l.attn_out.forward(a));
            let ff = l.output.forward(gelu(l.intermediate.forward(x.clone())));
            x = l.out_norm.forward(x + ff);
        }
        let hidden = crate::model::host_vec(x)?;
        let mut out = Vec::with_capacity(b);
        for (i, row) in ids.iter().enumerate() {
            let at = |j: usize| &hidden[(i * t + j) * h..(i * t + j + 1) * h];
            let mut e = vec![0f32; h];
            match self.pooling {
                Pooling::Cls => e.copy_from_slice(at(0)),
                Pooling::Mean => {
                    // Summed in f64: the mean of a long text's tokens keeps its last digits.
                    let mut acc = vec![0f64; h];
                    for j in 0..row.len() {
                        acc.iter_mut().zip(at(j)).for_each(|(a, &x)| *a += x as f64);
                    }
                    let n = row.len().max(1) as f64;
                    e.iter_mut().zip(&acc).for_each(|(o, a)| *o = (a / n) as f32);
                }
            }
            if self.normalize {
                let norm = e.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt().max(1e-12);
                e.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
            }
            out.push(e);
        }
        Ok(out)
    }

}
