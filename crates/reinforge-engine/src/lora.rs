//! LoRA adapters, as PEFT defines them: `y = x·W + (alpha / r)·(x·A)·B` on chosen linears, the
//! base weights frozen, `A` Kaiming-uniform and `B` zero at the start (so step 0 is the base
//! model), and PEFT's files (`adapter_config.json`, `adapter_model.safetensors`), so an adapter
//! trained here loads with `PeftModel.from_pretrained` and one trained with PEFT (verl's
//! `lora_adapter_path`) starts a run here.
//!
//! The maths lives on [`crate::model::Linear`]; this module holds the settings, the names and
//! the file format.

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::weights::HostTensor;
use std::collections::BTreeMap;
use std::path::Path;

/// The linears PEFT's `all-linear` picks in a Llama or Qwen2 decoder: every one but the LM head,
/// with the submodule each sits in.
pub const TARGETS: [(&str, &str); 7] = [
    ("self_attn", "q_proj"),
    ("self_attn", "k_proj"),
    ("self_attn", "v_proj"),
    ("self_attn", "o_proj"),
    ("mlp", "gate_proj"),
    ("mlp", "up_proj"),
    ("mlp", "down_proj"),
];

/// What PEFT writes before the base model's own names in `adapter_model.safetensors`.
const PEFT_PREFIX: &str = "base_model.model.";

/// The adapter file names PEFT reads and writes.
pub const CONFIG_FILE: &str = "adapter_config.json";
/// See [`CONFIG_FILE`].
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// An adapter's shape: rank, scaling and which linears it adapts.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoraConfig {
    /// `r`.
    pub rank: usize,
    /// `lora_alpha`; the update is scaled by `alpha / rank`.
    pub alpha: f64,
    /// Short names (`q_proj`, …) of the adapted linears, in [`TARGETS`] order.
    pub targets: Vec<String>,
}

impl LoraConfig {
    /// `target_modules` as verl, OpenRLHF and PEFT take them: `["all-linear"]`, or linear names
    /// (`q_proj`, or a dotted suffix such as `self_attn.q_proj`, as PEFT matches them).
    pub fn new(rank: usize, alpha: f64, target_modules: &[String]) -> std::result::Result<Self, String> {
        if rank == 0 {
            return Err("LoRA rank must be at least 1".into());
        }
        if !(alpha.is_finite() && alpha > 0.0) {
            return Err(format!("lora_alpha must be a positive number, not {alpha}"));
        }
        let valid = || TARGETS.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(", ");
        let mut want = std::collections::BTreeSet::new();
        if target_modules.is_empty() {
            return Err(format!("target_modules is empty: name the linears to adapt ({}) or all-linear", valid()));
        }
        for m in target_modules {
            if m.contains(|c: char| "*()[]|^$\\+?{}".contains(c)) {
                return Err(format!("target_modules: `{m}` is a regular expression; list the linears by name ({}) or all-linear", valid()));
            }
            if m == "all-linear" {
                want.extend(TARGETS.iter().map(|(_, n)| *n));
                continue;
            }
            let short = m.rsplit('.').next().unwrap_or(m);
            let Some((sub, n)) = TARGETS.iter().find(|(_, n)| *n == short) else {
                return Err(format!("target_modules: `{m}` is not a linear LoRA can adapt here; use all-linear or some of {}", valid()));
            };
            // A dotted name ends with the linear's path (`self_attn.q_proj`; PEFT writes
            // `model.layers.3.self_attn.q_proj` for each linear `all-linear` picked). Which
            // layers carry factors is then the adapter file's to say.
            let parent = m.rsplit('.').nth(1);
            if parent.is_some_and(|p| p != *sub) {
                return Err(format!("target_modules: `{m}` matches no linear (the {n} is `{sub}.{n}`)"));
            }
            want.insert(n);
        }
        let targets = TARGETS.iter().filter(|(_, n)| want.contains(n)).map(|(_, n)| n.to_string()).collect();
        Ok(Self { rank, alpha, targets })
    }

    /// The factor on `(x·A)·B`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Whether the linear at this path (`self_attn.q_proj`, or its short name) is adapted.
    pub fn adapts(&self, path: &str) -> bool {
        let short = path.rsplit('.').next().unwrap_or(path);
        self.targets.iter().any(|t| t == short)
    }

    /// PEFT's `adapter_config.json` for this adapter on `base_model`.
    pub fn peft_json(&self, base_model: &str) -> serde_json::Value {
        serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": 0.0,
            "target_modules": self.targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "modules_to_save": null,
            "layers_to_transform": null,
            "rank_pattern": {},
            "alpha_pattern": {},
        })
    }

    /// Reads PEFT's `adapter_config.json`, refusing what this engine would compute differently.
    pub fn from_peft_json(text: &str, path: &Path) -> Result<Self> {
        let bad = |msg: String| EngineError::Config { path: path.to_path_buf(), msg };
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let get = |k: &str| v.get(k).filter(|x| !x.is_null());
        if let Some(t) = get("peft_type").and_then(|t| t.as_str()) {
            if t != "LORA" {
                return Err(bad(format!("peft_type is {t}; only LoRA adapters are supported")));
            }
        }
        let rank = get("r").and_then(|r| r.as_u64()).ok_or_else(|| bad("no integer `r` (the LoRA rank)".into()))? as usize;
        let alpha = get("lora_alpha").and_then(|a| a.as_f64()).ok_or_else(|| bad("no number `lora_alpha`".into()))?;
        // An allow-list: PEFT keeps adding variants (DoRA, rsLoRA, aLoRA, QALoRA, PiSSA
        // inits that rewrite the base weights, …), each switched on by a key of its own. Keys
        // that only describe the file may hold anything; any other must hold its plain-LoRA
        // value (or be unset, false, or empty), else the adapter would compute otherwise here.
        const DESCRIPTIVE: [&str; 11] =
            ["peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode", "peft_version", "r", "lora_alpha", "target_modules", "auto_mapping", "megatron_core"];
        let obj = v.as_object().ok_or_else(|| bad("not a JSON object".into()))?;
        for (k, got) in obj {
            if DESCRIPTIVE.contains(&k.as_str()) {
                continue;
            }
            let plain = match k.as_str() {
                "bias" => got == "none",
                "lora_dropout" => got.as_f64() == Some(0.0),
                // Only how a fresh adapter starts: these weights are loaded, not drawn. (The
                // PiSSA/OLoRA/CorDA inits also rewrite the base weights: refused below.)
                "init_lora_weights" => got.is_boolean() || got == "gaussian",
                // Used only with use_qalora (itself checked).
                "qalora_group_size" => true,
                _ => match got {
                    serde_json::Value::Null => true,
                    serde_json::Value::Bool(b) => !b,
                    serde_json::Value::Object(o) => o.is_empty(),
                    serde_json::Value::Array(a) => a.is_empty(),
                    _ => false,
                },
            };
            if !plain {
                return Err(bad(format!(
                    "`{k}` = {got}: this engine runs plain LoRA only (no rsLoRA, DoRA, dropout, bias training, modules_to_save, per-module ranks or other variants); an adapter trained so cannot be loaded"
                )));
            }
        }
        let targets: Vec<String> = match get("target_modules") {
            Some(serde_json::Value::String(s)) => vec![s.clone()],
            Some(serde_json::Value::Array(a)) => a.iter().map(|x| x.as_str().map(str::to_owned).ok_or_else(|| bad("target_modules holds a non-string".into()))).collect::<Result<_>>()?,
            _ => return Err(bad("no `target_modules`".into())),
        };
        Self::new(rank, alpha, &targets).map_err(bad)
    }
}

/// Whether an HF-style tensor name is a LoRA factor (`….lora_A.weight` / `….lora_B.weight`).
pub fn is_lora_name(name: &str) -> bool {
    name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight")
}

/// Moves the LoRA factors out of `tensors`.
pub fn split_off(tensors: &mut BTreeMap<String, HostTensor>) -> BTreeMap<String, HostTensor> {
    let names: Vec<String> = tensors.keys().filter(|k| is_lora_name(k)).cloned().collect();
    names.into_iter().filter_map(|k| tensors.remove(&k).map(|t| (k, t))).collect()
}

/// An adapter on disk or in memory: its settings and factors, by the base model's names
/// (`model.layers.0.self_attn.q_proj.lora_A.weight`, `[r, in]`; `lora_B`: `[out, r]`).
#[derive(Debug, Clone)]
pub struct Adapter {
    /// Rank, scaling, targets.
    pub config: LoraConfig,
    /// The factors in PEFT's layout.
    pub tensors: BTreeMap<String, HostTensor>,
}

impl Adapter {
    /// Whether `dir` holds a PEFT adapter.
    pub fn present(dir: &Path) -> bool {
        dir.join(CONFIG_FILE).is_file()
    }

    /// Reads a PEFT adapter directory.
    pub fn read(dir: &Path) -> Result<Self> {
        let cfg_path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&cfg_path).map_err(|source| EngineError::Io { path: cfg_path.clone(), source })?;
        let config = LoraConfig::from_peft_json(&text, &cfg_path)?;
        let file = dir.join(WEIGHTS_FILE);
        if !file.is_file() {
            let hint = if dir.join("adapter_model.bin").is_file() { " (adapter_model.bin is PyTorch pickle; save the adapter with safe_serialization=True)" } else { "" };
            return Err(EngineError::Weights { path: file, msg: format!("missing: a PEFT adapter needs its weights next to {CONFIG_FILE}{hint}") });
        }
        let bytes = std::fs::read(&file).map_err(|source| EngineError::Io { path: file.clone(), source })?;
        let mut tensors = BTreeMap::new();
        for (name, t) in crate::weights::decode_all(&bytes, &file)? {
            // PEFT names carry its wrapper's prefix and, in files written by some versions, the
            // adapter's name (`.lora_A.default.weight`).
            let plain = name.strip_prefix(PEFT_PREFIX).unwrap_or(&name).replace(".default.weight", ".weight");
            if !is_lora_name(&plain) {
                return Err(EngineError::Weights { path: file, msg: format!("`{name}` is not a LoRA factor (lora_A / lora_B); only LoRA adapters are supported") });
            }
            tensors.insert(plain, t);
        }
        Ok(Self { config, tensors })
    }

    /// Writes the adapter as PEFT does (`base_model` goes into its config), each file whole.
    pub fn write(&self, dir: &Path, base_model: &str) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| EngineError::Io { path: dir.to_path_buf(), source })?;
        crate::weights::write_atomic(&dir.join(CONFIG_FILE), &self.config_bytes(base_model)?)?;
        crate::weights::write_safetensors(&dir.join(WEIGHTS_FILE), &self.peft_named(), None)
    }

    /// The bytes of its `adapter_config.json` for `base_model` (pretty JSON, as PEFT writes it).
    pub fn config_bytes(&self, base_model: &str) -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(&self.config.peft_json(base_model)).map_err(|e| EngineError::Tensor(e.to_string()))
    }

    /// The factors under PEFT's file names.
    pub fn peft_named(&self) -> BTreeMap<String, HostTensor> {
        self.tensors.iter().map(|(k, t)| (format!("{PEFT_PREFIX}{k}"), t.clone())).collect()
    }

    /// A fresh adapter as PEFT initialises one: `A` uniform in ±1/√in (Kaiming-uniform with
    /// a = √5), `B` zero, so the model starts as the base model. `A` is drawn from `seed`,
    /// linear after linear in layer order: both engines, and every data-parallel rank, draw the
    /// same.
    pub fn fresh(model: &ModelConfig, cfg: &LoraConfig, seed: u64) -> Self {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut tensors = BTreeMap::new();
        for l in 0..model.num_layers {
            for (path, inp, out) in linear_shapes(model) {
                if !cfg.adapts(path) {
                    continue;
                }
                let bound = 1.0 / (inp as f32).sqrt();
                let a: Vec<f32> = (0..cfg.rank * inp).map(|_| rng.random_range(-bound..bound)).collect();
                tensors.insert(format!("model.layers.{l}.{path}.lora_A.weight"), HostTensor { shape: vec![cfg.rank, inp], data: a });
                tensors.insert(format!("model.layers.{l}.{path}.lora_B.weight"), HostTensor { shape: vec![out, cfg.rank], data: vec![0.0; out * cfg.rank] });
            }
        }
        Self { config: cfg.clone(), tensors }
    }

    /// Checks that the factors fit `model`: both factors of every adapted linear in every layer,
    /// of this rank and the linear's shape, and nothing else.
    pub fn check(&self, model: &ModelConfig) -> Result<()> {
        let cfg = &self.config;
        let mut expected = std::collections::BTreeSet::new();
        for l in 0..model.num_layers {
            for (path, inp, out) in linear_shapes(model) {
                if !cfg.adapts(path) {
                    continue;
                }
                for (n, shape) in [(format!("model.layers.{l}.{path}.lora_A.weight"), [cfg.rank, inp]), (format!("model.layers.{l}.{path}.lora_B.weight"), [out, cfg.rank])] {
                    let t = self.tensors.get(&n).ok_or_else(|| {
                        EngineError::Request(format!("the LoRA adapter has no `{n}`: its target_modules adapt {path}, and an adapter must cover that linear in every layer (per-layer adapters are not supported)"))
                    })?;
                    if t.shape != shape {
                        return Err(EngineError::Request(format!("LoRA factor `{n}` has shape {:?}; rank {} on this model needs {shape:?}", t.shape, cfg.rank)));
                    }
                    expected.insert(n);
                }
            }
        }
        if let Some(extra) = self.tensors.keys().find(|k| !expected.contains(*k)) {
            return Err(EngineError::Request(format!("LoRA factor `{extra}` adapts no linear of this model (target_modules {:?}, {} layers)", cfg.targets, model.num_layers)));
        }
        Ok(())
    }

    /// Adds `scale·B·A` to each adapted linear's weight in `tensors` (HF names and shapes): the
    /// plain model that a rollout engine without LoRA serves. The adapter must fit
    /// ([`Adapter::check`]).
    pub fn merge_into<S: std::hash::BuildHasher>(&self, tensors: &mut std::collections::HashMap<String, HostTensor, S>) -> Result<()> {
        let s = self.config.scale() as f32;
        let r = self.config.rank;
        for (name, a) in &self.tensors {
            let Some(base) = name.strip_suffix(".lora_A.weight") else { continue };
            let b = self.tensors.get(&format!("{base}.lora_B.weight")).ok_or_else(|| EngineError::Request(format!("the LoRA adapter has no `{base}.lora_B.weight`")))?;
            let w = tensors.get_mut(&format!("{base}.weight")).ok_or_else(|| EngineError::Request(format!("the model has no `{base}.weight` for its LoRA adapter")))?;
            let (out, inp) = (b.shape[0], a.shape[1]);
            if w.shape != [out, inp] {
                return Err(EngineError::Request(format!("`{base}.weight` has shape {:?}, its LoRA factors make [{out}, {inp}]", w.shape)));
            }
            // Row o of W gains Σ_k s·B[o, k]·A[k, :]; B = 0 (a fresh adapter) adds nothing.
            for (o, row) in w.data.chunks_exact_mut(inp).enumerate() {
                for k in 0..r {
                    let f = s * b.data[o * r + k];
                    if f != 0.0 {
                        for (x, &y) in row.iter_mut().zip(&a.data[k * inp..(k + 1) * inp]) {
                            *x += f * y;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Each linear LoRA can adapt in a block, as `(path, in, out)`, in [`TARGETS`] order.
pub fn linear_shapes(model: &ModelConfig) -> [(&'static str, usize, usize); 7] {
    let (h, i) = (model.hidden_size, model.intermediate_size);
    let (qd, kvd) = (model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim);
    [
        ("self_attn.q_proj", h, qd),
        ("self_attn.k_proj", h, kvd),
        ("self_attn.v_proj", h, kvd),
        ("self_attn.o_proj", qd, h),
        ("mlp.gate_proj", h, i),
        ("mlp.up_proj", h, i),
        ("mlp.down_proj", i, h),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn target_modules_resolve_as_peft_matches_them() {
        let all = LoraConfig::new(8, 16.0, &names(&["all-linear"])).expect("all");
        assert_eq!(all.targets, names(&["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]));
        assert_eq!(all.scale(), 2.0);
        let some = LoraConfig::new(4, 8.0, &names(&["down_proj", "self_attn.q_proj", "v_proj"])).expect("some");
        assert_eq!(some.targets, names(&["q_proj", "v_proj", "down_proj"]));
        // What PEFT saves for all-linear: every linear's full path, in set order.
        let saved = LoraConfig::new(4, 8.0, &names(&["model.layers.1.mlp.up_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.mlp.up_proj"])).expect("paths");
        assert_eq!(saved.targets, names(&["k_proj", "up_proj"]));
        for (bad, says) in [
            (names(&["lm_head"]), "`lm_head` is not a linear"),
            (names(&["mlp.q_proj"]), "matches no linear"),
            (names(&[]), "is empty"),
            (names(&[".*(q_proj|v_proj)"]), "regular expression"),
        ] {
            let e = LoraConfig::new(4, 8.0, &bad).expect_err("refused");
            assert!(e.contains(says), "{e}");
        }
        assert!(LoraConfig::new(0, 8.0, &names(&["all-linear"])).is_err());
        assert!(LoraConfig::new(4, 0.0, &names(&["all-linear"])).is_err());
    }

    #[test]
    fn peft_configs_round_trip_and_unsupported_options_are_refused() {
        let c = LoraConfig::new(4, 8.0, &names(&["q_proj", "up_proj"])).expect("cfg");
        let p = Path::new("adapter_config.json");
        let back = LoraConfig::from_peft_json(&c.peft_json("base").to_string(), p).expect("read back");
        assert_eq!(back, c);
        for (key, val, says) in [
            ("use_rslora", serde_json::json!(true), "use_rslora"),
            ("lora_dropout", serde_json::json!(0.05), "lora_dropout"),
            ("bias", serde_json::json!("all"), "bias"),
            ("modules_to_save", serde_json::json!(["lm_head"]), "modules_to_save"),
            ("rank_pattern", serde_json::json!({"q_proj": 8}), "rank_pattern"),
            ("peft_type", serde_json::json!("IA3"), "IA3"),
            // Keys of later PEFT variants, unknown here: refused unless neutral.
            ("use_qalora", serde_json::json!(true), "use_qalora"),
            ("alora_invocation_tokens", serde_json::json!([1, 2]), "alora_invocation_tokens"),
            ("init_lora_weights", serde_json::json!("pissa"), "init_lora_weights"),
            ("some_future_option", serde_json::json!(3), "some_future_option"),
        ] {
            let mut j = c.peft_json("base");
            j[key] = val;
            let e = LoraConfig::from_peft_json(&j.to_string(), p).expect_err(key).to_string();
            assert!(e.contains(says) && e.contains("adapter_config.json"), "{e}");
        }
        // Neutral values of those keys, as PEFT 0.21 writes them, load.
        let mut j = c.peft_json("base");
        for (k, v) in [("use_qalora", serde_json::json!(false)), ("qalora_group_size", serde_json::json!(16)), ("loftq_config", serde_json::json!({})), ("init_lora_weights", serde_json::json!("gaussian")), ("peft_version", serde_json::json!("0.21.2"))] {
            j[k] = v;
        }
        assert_eq!(LoraConfig::from_peft_json(&j.to_string(), p).expect("neutral"), c);
    }
}
