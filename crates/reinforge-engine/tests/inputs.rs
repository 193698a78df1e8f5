//! Loading variants (sharded, bf16) and bad input: each failure is an error naming the file or
//! key and the fix, never a panic. Plus rollout behaviours: n samples, seeds, stops, finished
//! rows leaving the batch.

mod common;
use burn::tensor::Device;
use common::*;
use reinforge_engine::weights::{write_safetensors, HostTensor, WeightSet};
use reinforge_engine::{generate, CausalLm, DeviceSpec, FinishReason, ForwardInput, SamplingParams};
use std::collections::BTreeMap;
use std::path::Path;

fn tiny() -> std::path::PathBuf {
    fixtures().join("models/tiny-llama")
}

fn copy_config(dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    std::fs::copy(tiny().join("config.json"), dst.join("config.json")).unwrap();
}

fn logits(m: &CausalLm) -> Vec<f32> {
    let input = ForwardInput::from_mask(vec![b"hello".iter().map(|&c| c as u32).collect()], vec![vec![true; 5]]);
    m.forward(&input).unwrap().into_data().try_into_vec().unwrap()
}

fn err(dir: &Path) -> String {
    CausalLm::load(dir, &Device::flex()).unwrap_err().to_string()
}

#[test]
fn sharded_and_bf16_weights_load() {
    let tmp = tempfile::tempdir().unwrap();
    let base = CausalLm::load(&tiny(), &Device::flex()).unwrap();
    let all = base.to_hf_tensors().unwrap();
    // Two shards and an index, as transformers writes them.
    let dir = tmp.path().join("sharded");
    copy_config(&dir);
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    let mut map = serde_json::Map::new();
    for (i, (k, v)) in all.iter().enumerate() {
        let shard = if i % 2 == 0 { "model-00001-of-00002.safetensors" } else { "model-00002-of-00002.safetensors" };
        map.insert(k.clone(), shard.into());
        if i % 2 == 0 { a.insert(k.clone(), v.clone()) } else { b.insert(k.clone(), v.clone()) };
    }
    write_safetensors(&dir.join("model-00001-of-00002.safetensors"), &a, None).unwrap();
    write_safetensors(&dir.join("model-00002-of-00002.safetensors"), &b, None).unwrap();
    std::fs::write(dir.join("model.safetensors.index.json"), serde_json::json!({"metadata": {}, "weight_map": map}).to_string()).unwrap();
    assert_eq!(logits(&CausalLm::load(&dir, &Device::flex()).unwrap()), logits(&base));

    // bf16 storage: loads, and matches the f32 model within bf16 rounding.
    let dir = tmp.path().join("bf16");
    copy_config(&dir);
    use safetensors::tensor::TensorView;
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = all
        .iter()
        .map(|(k, t)| (k.clone(), t.data.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(), t.shape.clone()))
        .collect();
    let views: Vec<(String, TensorView)> =
        bytes.iter().map(|(k, b, s)| (k.clone(), TensorView::new(safetensors::Dtype::BF16, s.clone(), b).unwrap())).collect();
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    let lb = logits(&CausalLm::load(&dir, &Device::flex()).unwrap());
    let worst = lb.iter().zip(logits(&base)).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst > 0.0 && worst < 0.5, "bf16 logits off by {worst}");
}

#[test]
fn bad_inputs_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    // No weights at all.
    let d = tmp.path().join("noweights");
    copy_config(&d);
    let e = err(&d);
    assert!(e.contains("no model.safetensors") && e.contains("noweights"), "{e}");
    // Corrupt weights.
    std::fs::write(d.join("model.safetensors"), b"not a safetensors file").unwrap();
    let e = err(&d);
    assert!(e.contains("corrupt safetensors") && e.contains("model.safetensors"), "{e}");
    // Missing config.
    let e = err(&tmp.path().join("nothing"));
    assert!(e.contains("config.json"), "{e}");
    // Unknown model_type, rope_scaling, non-silu.
    for (patch, want) in [
        (r#""model_type": "gpt_neox""#, "model_type `gpt_neox` is not supported"),
        (r#""rope_scaling": {"type": "linear", "factor": 2.0}"#, "rope_scaling"),
        (r#""hidden_act": "gelu""#, "hidden_act `gelu`"),
    ] {
        let d = tmp.path().join(format!("cfg{}", want.len()));
        std::fs::create_dir_all(&d).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(tiny().join("config.json")).unwrap()).unwrap();
        let p: serde_json::Value = serde_json::from_str(&format!("{{{patch}}}")).unwrap();
        for (k, x) in p.as_object().unwrap() {
            v[k] = x.clone();
        }
        std::fs::write(d.join("config.json"), v.to_string()).unwrap();
        let e = err(&d);
        assert!(e.contains(want) && e.contains("config.json"), "{e}");
    }
    // Shape mismatch: config says hidden 64, a tensor is 32 wide.
    let d = tmp.path().join("shape");
    copy_config(&d);
    let mut w = CausalLm::load(&tiny(), &Device::flex()).unwrap().to_hf_tensors().unwrap();
    w.insert("model.norm.weight".into(), HostTensor { shape: vec![32], data: vec![1.0; 32] });
    write_safetensors(&d.join("model.safetensors"), &w, None).unwrap();
    let e = err(&d);
    assert!(e.contains("model.norm.weight") && e.contains("[32]") && e.contains("[64]"), "{e}");
    // Missing tensor.
    w.remove("model.norm.weight");
    write_safetensors(&d.join("model.safetensors"), &w, None).unwrap();
    let e = err(&d);
    assert!(e.contains("missing tensor `model.norm.weight`"), "{e}");
    let _ = WeightSet::from_map("x", Default::default());
}

#[test]
fn gpu_request_and_overlong_prompt_are_refused() {
    let e = DeviceSpec::Cuda(0).inference_device().unwrap_err().to_string();
    assert!(e.contains("cuda:0") && e.contains("CUDA engine"), "{e}");
    assert_eq!("cuda-emu".parse::<DeviceSpec>().unwrap(), DeviceSpec::CudaEmulated);
    assert!("tpu".parse::<DeviceSpec>().unwrap_err().to_string().contains("known devices"));
    let m = CausalLm::load(&tiny(), &Device::flex()).unwrap();
    let long = vec![vec![65u32; 120]];
    let e = generate(&m, &long, &SamplingParams::greedy(16), None).unwrap_err().to_string();
    assert!(e.contains("exceeds the model context of 128"), "{e}");
    let e = generate(&m, &[vec![300u32]], &SamplingParams::greedy(2), None).unwrap_err().to_string();
    assert!(e.contains("outside the vocabulary"), "{e}");
}

struct Bytes;
impl reinforge_engine::Detokenize for Bytes {
    fn detokenize(&self, ids: &[u32]) -> String {
        ids.iter().map(|&i| char::from_u32(i).unwrap_or('?')).collect()
    }
}

#[test]
fn rollout_samples_stops_and_shrinks_the_batch() {
    let m = CausalLm::load(&tiny(), &Device::flex()).unwrap();
    let prompts: Vec<Vec<u32>> = ["hi", "hello there", "x"].iter().map(|s| s.bytes().map(u32::from).collect()).collect();
    let p = SamplingParams { n: 3, temperature: 1.0, max_new_tokens: 12, seed: 9, ..Default::default() };
    let (a, _) = generate(&m, &prompts, &p, None).unwrap();
    assert_eq!(a.len(), 9);
    let (b, _) = generate(&m, &prompts, &p, None).unwrap();
    assert_eq!(a.iter().map(|c| &c.token_ids).collect::<Vec<_>>(), b.iter().map(|c| &c.token_ids).collect::<Vec<_>>(), "same seed, same samples");
    // A row's samples depend on its (prompt index, sample index), not on which other rows
    // share the batch (padding and batch size differ here).
    let (fewer, _) = generate(&m, &prompts[..2], &p, None).unwrap();
    for r in 0..6 {
        assert_eq!(fewer[r].token_ids, a[r].token_ids, "row {r}");
    }
    // Log-probs are those of the sampled tokens under the model.
    assert!(a.iter().all(|c| c.logprobs.len() == c.token_ids.len() && c.logprobs.iter().all(|&l| l <= 0.0 && l.is_finite())));

    // Greedy with a stop id: the stopping rows leave the batch; the others run to the end.
    let greedy = SamplingParams::greedy(8);
    let (g, _) = generate(&m, &prompts, &greedy, None).unwrap();
    let stop = g[0].token_ids[2];
    let (s, stats) = generate(&m, &prompts, &SamplingParams { stop_token_ids: vec![stop], ..greedy.clone() }, None).unwrap();
    assert_eq!(s[0].finish_reason, FinishReason::StopToken(stop));
    assert_eq!(s[0].token_ids, g[0].token_ids[..3].to_vec());
    let total: usize = s.iter().map(|c| c.token_ids.len()).sum();
    assert_eq!(stats.new_tokens, total);
    // Row-steps count only live rows: a finished row costs nothing afterwards.
    assert!(stats.row_steps < 3 * stats.decode_steps, "finished rows still in the batch: {stats:?}");
    for (x, y) in s.iter().zip(&g) {
        assert_eq!(x.token_ids[..], y.token_ids[..x.token_ids.len()]);
    }
    // Stop strings need text.
    let text: String = g[1].token_ids[1..3].iter().map(|&i| char::from_u32(i).unwrap()).collect();
    let sp = SamplingParams { stop_strings: vec![text.clone()], ..greedy.clone() };
    let (t, _) = generate(&m, &prompts[1..2], &sp, Some(&Bytes)).unwrap();
    assert_eq!(t[0].finish_reason, FinishReason::StopString(text));
    assert_eq!(t[0].token_ids.len(), 3);
    assert!(generate(&m, &prompts, &sp, None).unwrap_err().to_string().contains("need a tokenizer"));
}

#[test]
fn per_prompt_caps_end_each_prompts_rows_at_its_own_length() {
    // Multi-turn rollouts share a call between trajectories with different budgets left.
    let m = CausalLm::load(&tiny(), &Device::flex()).unwrap();
    let prompts: Vec<Vec<u32>> = ["hi", "hello there", "x"].iter().map(|s| s.bytes().map(u32::from).collect()).collect();
    let p = SamplingParams { n: 2, temperature: 1.0, max_new_tokens: 10, seed: 5, ..Default::default() };
    let (full, _) = generate(&m, &prompts, &p, None).unwrap();
    let capped = SamplingParams { max_new_tokens_per_prompt: vec![3, 10, 1], ..p.clone() };
    let (c, stats) = generate(&m, &prompts, &capped, None).unwrap();
    for (x, y) in c.iter().zip(&full) {
        let cap = [3, 10, 1][x.prompt_index];
        assert_eq!(x.token_ids, y.token_ids[..cap].to_vec(), "prompt {}: the same draws, cut at its cap", x.prompt_index);
        assert_eq!(x.finish_reason, FinishReason::Length);
    }
    assert_eq!(stats.new_tokens, 2 * (3 + 10 + 1));
    assert!(generate(&m, &prompts, &SamplingParams { max_new_tokens_per_prompt: vec![3, 10], ..p.clone() }, None).unwrap_err().to_string().contains("2 per-prompt token caps for 3 prompts"));
    assert!(generate(&m, &prompts, &SamplingParams { max_new_tokens_per_prompt: vec![3, 0, 1], ..p }, None).unwrap_err().to_string().contains("at least 1"));
}

/// The rollout engine samples from the policy the trainer scores: every sampled token's
/// log-probability equals the training forward's (prompt + completion, burn graph), also for
/// the later samples of a prompt (their cache is copied from the first) and after the decoder
/// took new weights in place.
#[test]
fn rollout_logprobs_equal_the_training_forward() {
    use reinforge_engine::{generate_with, token_logprobs, Decoder};
    let m = CausalLm::load(&tiny(), &Device::flex()).unwrap();
    let mut dec = Decoder::new(&CausalLm::random(m.config.clone(), 5, &Device::flex()).unwrap()).unwrap();
    dec.load_weights(&m).unwrap();
    let prompts: Vec<Vec<u32>> = ["hi", "hello there", "x"].iter().map(|s| s.bytes().map(u32::from).collect()).collect();
    let p = SamplingParams { n: 3, temperature: 0.7, max_new_tokens: 9, seed: 4, ..Default::default() };
    let (outs, _) = generate_with(&dec, &prompts, &p, None).unwrap();
    let mut worst = 0f64;
    for c in &outs {
        let full: Vec<u32> = prompts[c.prompt_index].iter().chain(&c.token_ids).copied().collect();
        let n = full.len();
        let lp: Vec<f32> = token_logprobs(&m, &ForwardInput::from_mask(vec![full], vec![vec![true; n]]), 0.7, false)
            .unwrap()
            .logprobs
            .into_data()
            .try_into_vec()
            .unwrap();
        let start = prompts[c.prompt_index].len();
        for (i, &got) in c.logprobs.iter().enumerate() {
            worst = worst.max((got as f64 - lp[start + i] as f64).abs());
        }
    }
    assert!(worst < 1e-4, "rollout vs training log-prob: max diff {worst}");
}
