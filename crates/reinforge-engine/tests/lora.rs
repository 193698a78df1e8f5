//! LoRA against PEFT (`tests/data/make_lora_golden.py`: peft 0.21 on the two tiny fixtures,
//! an adapter PEFT wrote with random non-zero `B`): the adapter files read as PEFT wrote them;
//! log-probs, entropies and the factors' gradients of a log-prob + entropy loss; one clipped
//! AdamW step that moves the factors only; the merged weights and their logits.

mod common;
use common::*;
use reinforge_engine::{reference_gradients, reference_step, Adapter, CausalLm, DeviceSpec, OptimConfig};
use std::path::PathBuf;

fn data(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/lora").join(model)
}

fn rows(v: &serde_json::Value) -> Vec<Vec<f32>> {
    v.as_array().expect("rows").iter().map(f32s).collect()
}

/// max |a − b| / max |b|, for tensors of one shape.
fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, &x| m.max(x.abs() as f64)).max(1e-12);
    got.iter().zip(want).fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs())) / scale
}

fn max_abs(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()))
}

fn with_adapter(model: &str, training: bool) -> (CausalLm, Adapter) {
    let spec = DeviceSpec::Cpu;
    let device = if training { spec.training_device(false) } else { spec.inference_device() }.expect("device");
    let base = CausalLm::load(&fixtures().join("models").join(model), &device).expect("base");
    let adapter = Adapter::read(&data(model)).expect("PEFT adapter");
    (base.with_lora(&adapter).expect("adapter fits"), adapter)
}

#[test]
fn log_probs_and_factor_gradients_match_peft() {
    for model in ["tiny-llama", "tiny-qwen2"] {
        let g = read_json(&data(model).join("golden.json"));
        let (lm, adapter) = with_adapter(model, true);
        assert_eq!(adapter.config.scale(), g["scaling"].as_f64().expect("scaling"), "{model}");
        let seqs: Vec<Vec<u32>> = g["seqs"].as_array().expect("seqs").iter().map(u32s).collect();
        let (a, b) = (rows(&g["a"]), rows(&g["b"]));
        let t = g["temperature"].as_f64().expect("temperature");
        let (lp, ent, grads) = reference_gradients(&lm, &seqs, t, &a, &b).expect("gradients");
        for (i, (want_lp, want_ent)) in rows(&g["logprobs"]).iter().zip(rows(&g["entropy"])).enumerate() {
            assert!(max_abs(&lp[i], want_lp) < 2e-5, "{model} seq {i} log-probs off by {}", max_abs(&lp[i], want_lp));
            assert!(max_abs(&ent[i], &want_ent) < 2e-5, "{model} seq {i} entropy off by {}", max_abs(&ent[i], &want_ent));
        }
        // Without the adapter the log-probs differ: the test sees the factors.
        assert!(max_abs(&lp[0], &f32s(&g["base_logprobs_seq0"])) > 1e-2, "{model}: the adapter changes nothing");
        let want = g["grads"].as_object().expect("grads");
        assert_eq!(want.len(), adapter.tensors.len(), "{model}");
        for (name, w) in want {
            let got = grads.get(name).unwrap_or_else(|| panic!("{model}: no gradient for {name}"));
            assert_eq!(got.shape, u32s(&w["shape"]).iter().map(|&d| d as usize).collect::<Vec<_>>(), "{model} {name}");
            let e = rel_err(&got.data, &f32s(&w["data"]));
            assert!(e < 1e-4, "{model} {name}: relative error {e}");
        }
        // The base weights are frozen: no gradient reaches them.
        for (name, t) in &grads {
            if !reinforge_engine::lora::is_lora_name(name) {
                assert!(t.data.iter().all(|&x| x == 0.0), "{model}: {name} got a gradient");
            }
        }
    }
}

#[test]
fn one_clipped_adamw_step_moves_the_factors_as_torch_does_and_nothing_else() {
    for model in ["tiny-llama", "tiny-qwen2"] {
        let g = read_json(&data(model).join("golden.json"));
        let (lm, _) = with_adapter(model, true);
        let before = lm.to_hf_tensors().expect("weights");
        let seqs: Vec<Vec<u32>> = g["seqs"].as_array().expect("seqs").iter().map(u32s).collect();
        let s = &g["step"];
        let optim = OptimConfig {
            weight_decay: s["weight_decay"].as_f64().expect("wd") as f32,
            grad_clip: s["max_norm"].as_f64(),
            ..OptimConfig::default()
        };
        let lr = s["lr"].as_f64().expect("lr");
        let t = g["temperature"].as_f64().expect("temperature");
        let (stats, after, opt) = reference_step(lm, optim, lr, &seqs, t, &rows(&g["a"]), &rows(&g["b"])).expect("step");
        let want_norm = s["grad_norm"].as_f64().expect("norm");
        assert!((stats.grad_norm - want_norm).abs() / want_norm < 1e-4, "{model}: grad norm {} vs torch {want_norm}", stats.grad_norm);
        for (name, w) in s["updated"].as_object().expect("updated") {
            let e = max_abs(&after[name].data, &f32s(&w["data"]));
            assert!(e < 2e-6, "{model} {name}: off by {e} after the step");
        }
        for (name, t) in &before {
            if !reinforge_engine::lora::is_lora_name(name) {
                assert_eq!(t.data, after[name].data, "{model}: frozen {name} moved");
            }
        }
        // The optimizer state holds the factors' moments only.
        assert_eq!(opt.exp_avg.len(), s["updated"].as_object().expect("updated").len(), "{model}");
        assert!(opt.exp_avg.keys().all(|k| reinforge_engine::lora::is_lora_name(k)), "{model}");
    }
}

#[test]
fn merged_weights_and_their_logits_match_peft_merge_and_unload() {
    for model in ["tiny-llama", "tiny-qwen2"] {
        let g = read_json(&data(model).join("golden.json"));
        let (lm, adapter) = with_adapter(model, false);
        let merged = lm.merged_hf_tensors().expect("merged");
        assert!(merged.keys().all(|k| !reinforge_engine::lora::is_lora_name(k)), "{model}");
        for (name, w) in g["merged"].as_object().expect("merged") {
            let e = max_abs(&merged[name].data, &f32s(&w["data"]));
            assert!(e < 1e-6, "{model} {name}: merged weight off by {e}");
        }
        let plain = CausalLm::from_hf_tensors(lm.config.clone(), merged, &lm.device()).expect("merged model");
        let seq0: Vec<u32> = u32s(&g["seqs"][0]);
        let want = f32s(&g["merged_logits_seq0"]["data"]);
        for (what, m) in [("merged", &plain), ("adapter", &lm)] {
            let got = &m.logits_of(std::slice::from_ref(&seq0)).expect("logits")[0];
            assert!(max_abs(got, &want) < 5e-5, "{model} {what}: logits off by {}", max_abs(got, &want));
        }
        // Written back as PEFT writes it, the adapter reads back the same.
        let dir = tempfile::tempdir().expect("tmp");
        let mine = lm.adapter().expect("adapter").expect("has one");
        mine.write(dir.path(), "base").expect("write");
        let back = Adapter::read(dir.path()).expect("read back");
        assert_eq!(back.config, adapter.config, "{model}");
        for (k, t) in &adapter.tensors {
            assert_eq!(back.tensors[k].data, t.data, "{model} {k}");
        }
        assert!(safetensors::SafeTensors::deserialize(&std::fs::read(dir.path().join("adapter_model.safetensors")).expect("file"))
            .expect("safetensors")
            .names()
            .iter()
            .all(|n| n.starts_with("base_model.model.model.layers.")));
    }
}

#[test]
fn adapters_that_do_not_fit_the_model_are_refused_with_the_tensor_named() {
    let device = DeviceSpec::Cpu.inference_device().expect("device");
    let base = || CausalLm::load(&fixtures().join("models/tiny-qwen2"), &device).expect("base");
    let adapter = Adapter::read(&data("tiny-qwen2")).expect("adapter");
    let mut missing = adapter.clone();
    missing.tensors.remove("model.layers.1.mlp.down_proj.lora_B.weight");
    let e = base().with_lora(&missing).expect_err("missing").to_string();
    assert!(e.contains("model.layers.1.mlp.down_proj.lora_B.weight"), "{e}");
    let mut other_rank = adapter.clone();
    other_rank.config.rank = 3;
    let e = base().with_lora(&other_rank).expect_err("rank").to_string();
    assert!(e.contains("rank 3"), "{e}");
    let mut narrower = adapter.clone();
    narrower.config.targets.retain(|t| t != "down_proj");
    let e = base().with_lora(&narrower).expect_err("extra").to_string();
    assert!(e.contains("down_proj.lora_A.weight") && e.contains("adapts no linear"), "{e}");
    // A fresh adapter starts as the base model (B = 0), A as PEFT draws it: uniform in ±1/√in
    // (Kaiming-uniform, a = √5), so its variance is 1/(3·in).
    let cfg = adapter.config.clone();
    let fresh = base().with_fresh_lora(&cfg, 7).expect("fresh");
    let factors = fresh.adapter().expect("adapter").expect("has one");
    for (name, t) in &factors.tensors {
        if name.ends_with("lora_B.weight") {
            assert!(t.data.iter().all(|&x| x == 0.0), "{name}");
            continue;
        }
        let inp = t.shape[1] as f64;
        let bound = 1.0 / inp.sqrt();
        let var = t.data.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / t.data.len() as f64;
        assert!(t.data.iter().all(|&x| (x as f64).abs() <= bound), "{name} beyond ±1/√{inp}");
        assert!((var * 3.0 * inp - 1.0).abs() < 0.25, "{name}: variance {var} vs 1/(3·{inp})");
    }
    let seq = vec![5u32, 9, 77, 3];
    assert_eq!(fresh.logits_of(std::slice::from_ref(&seq)).expect("l"), base().logits_of(&[seq]).expect("l"));
}
