//! The tiny Llama and Qwen2 fixtures: full logits (batched, left-padded) of the training
//! forward, and greedy continuations with their per-step log-probabilities from the rollout
//! engine, must match the independent NumPy reference.

mod common;
use burn::tensor::Device;
use common::*;
use reinforge_engine::{generate, CausalLm, ForwardInput, SamplingParams};

const TOL: f32 = 1e-4;

fn check_model(name: &str) {
    let dir = fixtures().join("models").join(name);
    let golden = read_json(&dir.join("golden.json"));
    let model = CausalLm::load(&dir, &Device::flex()).expect("load tiny model");
    let vocab = model.config.vocab_size;
    for case in golden["cases"].as_array().expect("cases") {
        let id = case["id"].as_str().unwrap_or("?");
        let ids: Vec<Vec<u32>> = case["input_ids"].as_array().unwrap().iter().map(u32s).collect();
        let mask: Vec<Vec<bool>> =
            case["attention_mask"].as_array().unwrap().iter().map(|r| u32s(r).into_iter().map(|m| m == 1).collect()).collect();
        let input = ForwardInput::from_mask(ids.clone(), mask.clone());
        let expected_pos: Vec<Vec<u32>> = case["position_ids"].as_array().unwrap().iter().map(u32s).collect();
        for (b, row) in input.positions.iter().enumerate() {
            let got: Vec<u32> = row.iter().map(|&p| p as u32).collect();
            assert_eq!(got, expected_pos[b], "{name}/{id}: positions row {b}");
        }
        let t = ids[0].len();
        let logits: Vec<f32> = model.forward(&input).unwrap().into_data().try_into_vec().unwrap();
        let mut worst = 0f32;
        for (b, rows) in case["logits"].as_array().unwrap().iter().enumerate() {
            let valid: Vec<usize> = (0..t).filter(|&j| mask[b][j]).collect();
            let rows = rows.as_array().unwrap();
            assert_eq!(rows.len(), valid.len(), "{name}/{id}: row {b} length");
            for (k, &j) in valid.iter().enumerate() {
                let exp = f32s(&rows[k]);
                let got = &logits[(b * t + j) * vocab..(b * t + j + 1) * vocab];
                for v in 0..vocab {
                    worst = worst.max((got[v] - exp[v]).abs());
                }
            }
        }
        assert!(worst <= TOL, "{name}/{id}: max |logit diff| {worst} > {TOL}");

        // Greedy continuation through the KV cache, with the batch's own padding.
        let prompts: Vec<Vec<u32>> =
            ids.iter().zip(&mask).map(|(r, m)| r.iter().zip(m).filter(|(_, &m)| m).map(|(&x, _)| x).collect()).collect();
        let new: Vec<Vec<u32>> = case["greedy_new_ids"].as_array().unwrap().iter().map(u32s).collect();
        let (outs, _) = generate(&model, &prompts, &SamplingParams::greedy(new[0].len()), None).unwrap();
        // The rollout engine's log-probabilities are log_softmax of the reference's step logits.
        let steps = case["greedy_step_logits"].as_array().unwrap();
        for (b, c) in outs.iter().enumerate() {
            assert_eq!(c.token_ids, new[b], "{name}/{id}: greedy ids of row {b}");
            for (s, (exp, (&tok, &lp))) in steps[b].as_array().unwrap().iter().zip(c.token_ids.iter().zip(&c.logprobs)).enumerate() {
                let z = f32s(exp);
                let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let lse = max + z.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
                let want = z[tok as usize] as f64 - lse;
                assert!((lp as f64 - want).abs() <= 2.0 * TOL as f64, "{name}/{id}: row {b} step {s}: logprob {lp} vs {want}");
            }
        }
    }
}

#[test]
fn tiny_llama_matches_reference() {
    check_model("tiny-llama");
}

#[test]
fn tiny_qwen2_matches_reference() {
    check_model("tiny-qwen2");
}

#[test]
fn kv_cache_decode_equals_full_forward() {
    // Greedy step logits from the cache path must equal a full pass over prompt + tokens.
    let dir = fixtures().join("models/tiny-llama");
    let golden = read_json(&dir.join("golden.json"));
    let model = CausalLm::load(&dir, &Device::flex()).unwrap();
    let case = &golden["cases"].as_array().unwrap()[2];
    let prompt = u32s(&case["input_ids"][0]);
    let new = u32s(&case["greedy_new_ids"][0]);
    let steps = case["greedy_step_logits"][0].as_array().unwrap();
    let mut full = prompt.clone();
    full.extend_from_slice(&new[..new.len() - 1]);
    let n = full.len();
    let input = ForwardInput::from_mask(vec![full], vec![vec![true; n]]);
    let logits: Vec<f32> = model.forward(&input).unwrap().into_data().try_into_vec().unwrap();
    let v = model.config.vocab_size;
    for (s, exp) in steps.iter().enumerate() {
        let pos = prompt.len() - 1 + s;
        let exp = f32s(exp);
        for k in 0..v {
            assert!((logits[pos * v + k] - exp[k]).abs() <= TOL, "step {s} vocab {k}");
        }
    }
}
