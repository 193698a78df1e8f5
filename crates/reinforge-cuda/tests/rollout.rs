//! The CUDA rollout engine on the emulator: greedy continuations equal the reference's, the
//! paged KV cache gives the log-probs of a full forward pass over the same tokens (samples
//! sharing a prompt's blocks, sequences crossing block boundaries), and sampling is seeded
//! per (prompt, sample).

mod common;
use common::*;
use reinforge_cuda::{DType, DeviceModel, Gpu, GpuKind, Head, Packed, Rollout};
use reinforge_engine::{FinishReason, SamplingParams};

fn model(name: &str, dt: DType) -> DeviceModel {
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    DeviceModel::load(&gpu, &fixtures().join("models").join(name), dt, false).unwrap()
}

#[test]
fn greedy_continuations_equal_the_reference() {
    for name in ["tiny-llama", "tiny-qwen2"] {
        let m = model(name, DType::F32);
        let golden = read_json(&fixtures().join("models").join(name).join("golden.json"));
        let mut engine = Rollout::new(0.5);
        for case in golden["cases"].as_array().unwrap() {
            let ids: Vec<Vec<u32>> = case["input_ids"].as_array().unwrap().iter().map(u32s).collect();
            let mask: Vec<Vec<u32>> = case["attention_mask"].as_array().unwrap().iter().map(u32s).collect();
            let prompts: Vec<Vec<u32>> = ids.iter().zip(&mask).map(|(r, m)| r.iter().zip(m).filter(|(_, &m)| m == 1).map(|(&x, _)| x).collect()).collect();
            let new: Vec<Vec<u32>> = case["greedy_new_ids"].as_array().unwrap().iter().map(u32s).collect();
            let (outs, stats) = engine.generate(&m, &prompts, &SamplingParams::greedy(new[0].len()), None).unwrap();
            for (b, c) in outs.iter().enumerate() {
                assert_eq!(c.token_ids, new[b], "{name}/{}: row {b}", case["id"]);
                assert_eq!(c.finish_reason, FinishReason::Length);
                let steps = case["greedy_step_logits"][b].as_array().unwrap();
                for (s, (&tok, &lp)) in c.token_ids.iter().zip(&c.logprobs).enumerate() {
                    let z = f32s(&steps[s]);
                    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                    let lse = max + z.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
                    assert!((lp as f64 - (z[tok as usize] as f64 - lse)).abs() < 2e-4, "{name}: row {b} step {s}");
                }
            }
            assert_eq!(stats.new_tokens, new.len() * new[0].len());
        }
    }
}

/// Log-probs of `tokens` after `prompt` from a full forward pass (no cache).
fn full_pass_logprobs(m: &DeviceModel, prompt: &[u32], tokens: &[u32], temperature: f64) -> Vec<f32> {
    let seq: Vec<u32> = prompt.iter().chain(tokens).copied().collect();
    let batch = Packed::new(&[&seq], m.cfg.vocab_size, m.cfg.max_position_embeddings).unwrap();
    let rows: Vec<usize> = (prompt.len() - 1..seq.len() - 1).collect();
    m.score(&batch, &rows, Head::Lm { targets: tokens, temperature }).unwrap().value
}

#[test]
fn paged_decode_equals_a_full_forward_pass_for_shared_prompts_and_block_crossings() {
    let m = model("tiny-qwen2", DType::F32);
    let mut engine = Rollout::new(0.5);
    // 21 and 3 tokens: one prompt ends inside its second block, both cross blocks while generating.
    let prompts = vec!["The quick brown fox j".bytes().map(u32::from).collect::<Vec<_>>(), b"abc".iter().map(|&b| b as u32).collect()];
    let params = SamplingParams { n: 3, temperature: 0.9, top_p: 0.95, top_k: 50, max_new_tokens: 30, seed: 11, ..Default::default() };
    let (outs, _) = engine.generate(&m, &prompts, &params, None).unwrap();
    assert_eq!(outs.len(), 6);
    let mut distinct = std::collections::HashSet::new();
    for c in &outs {
        assert_eq!(c.token_ids.len(), 30);
        let want = full_pass_logprobs(&m, &prompts[c.prompt_index], &c.token_ids, 0.9);
        for (s, (a, b)) in c.logprobs.iter().zip(&want).enumerate() {
            assert!((a - b).abs() < 1e-4, "prompt {} sample {} step {s}: cache {a} vs full {b}", c.prompt_index, c.sample_index);
        }
        distinct.insert(c.token_ids.clone());
    }
    assert!(distinct.len() >= 5, "samples of one prompt should differ at temperature 0.9");
    // Seeded per (prompt, sample): the same request gives the same tokens, and a prompt's
    // samples do not depend on the other prompts in the batch.
    let (again, _) = engine.generate(&m, &prompts, &params, None).unwrap();
    assert!(outs.iter().zip(&again).all(|(a, b)| a.token_ids == b.token_ids));
    let (alone, _) = engine.generate(&m, &prompts[1..], &SamplingParams { first_prompt: 1, ..params.clone() }, None).unwrap();
    assert!(alone.iter().zip(&outs[3..]).all(|(a, b)| a.token_ids == b.token_ids));
}

#[test]
fn decode_linear_kernels_decode_as_the_separate_kernels_do() {
    // REINFORGE_CUDA_DECODE_LINEAR=fused's decode step (the norms inside QKV and gate/up, o_proj
    // and down on linear_rows, split over k: the emulator reports an H100's 132 SMs), in bf16,
    // replayed as graphs, against the default's (norm kernel, cuBLASLt, SwiGLU kernel). The
    // two differ only in the GEMMs' order of summation: log-probs within 2e-2 (the self-test's
    // bf16 bound; 1.4e-2 seen) up to a sample's first different token, and most samples the
    // same all through. Then the fused kernels must be the ones that ran.
    use reinforge_cuda::ops::{DecodeLinear, Ops};
    for name in ["tiny-llama", "tiny-qwen2"] {
        let mut m = model(name, DType::Bf16);
        let (h, i) = (m.cfg.hidden_size, m.cfg.intermediate_size);
        let fused_ops = Ops { decode_linear: DecodeLinear::Fused, ..Ops::new(&m.gpu, DType::Bf16) };
        assert!(fused_ops.linear_rows_splits(8, h, i).is_some_and(|s| s > 1), "{name}: down should split over k");
        let prompts = vec!["The quick brown fox j".bytes().map(u32::from).collect::<Vec<_>>(), b"abc".iter().map(|&b| b as u32).collect()];
        let params = SamplingParams { n: 4, temperature: 0.9, max_new_tokens: 24, seed: 5, ..Default::default() };
        // One engine for both: its buffers and graphs from the first route must not serve the
        // second (linear_rows' partials have no room in the default route's buffers).
        let mut engine = Rollout::new(0.5);
        let mut runs = Vec::new();
        for route in [DecodeLinear::Cublas, DecodeLinear::Fused] {
            m.decode_linear = route;
            runs.push(engine.generate(&m, &prompts, &params, None).unwrap().0);
        }
        let mut same = 0;
        for (a, b) in runs[0].iter().zip(&runs[1]) {
            let agree = a.token_ids.iter().zip(&b.token_ids).take_while(|(x, y)| x == y).count();
            for s in 0..(agree + 1).min(a.logprobs.len()) {
                let (x, y) = (a.logprobs[s], b.logprobs[s]);
                assert!((x - y).abs() <= 2e-2, "{name}: prompt {} sample {} step {s}: separate {x} vs fused {y}", a.prompt_index, a.sample_index);
            }
            same += (a.token_ids == b.token_ids) as usize;
        }
        assert!(same * 4 >= 3 * runs[0].len(), "{name}: only {same} of {} samples decode the same tokens", runs[0].len());
        // The orders of summation differ, so some log-prob's bits must: equal bits all through
        // would mean the engine kept decoding with the first route's graphs.
        let bits = |r: &[reinforge_engine::Completion]| -> Vec<u32> { r.iter().flat_map(|c| c.logprobs.iter().map(|x| x.to_bits())).collect() };
        assert!(bits(&runs[0]) != bits(&runs[1]), "{name}: the fused route decoded with the default route's kernels");
        let ((), prof) = m.gpu.profile(|| Rollout::new(0.5).generate(&m, &prompts, &params, None).map(|_| ())).unwrap();
        for kernel in ["norm_linear_bf16", "norm_linear_swiglu_bf16", "linear_rows_bf16"] {
            assert!(prof.ops.iter().any(|o| o.op == kernel), "{name}: {kernel} did not run: {:?}", prof.ops.iter().map(|o| &o.op).collect::<Vec<_>>());
        }
    }
}

#[test]
fn a_decode_op_launched_twice_changes_no_token() {
    // `bench rollout --decode-breakdown` times each op of a decode step by launching it twice
    // (Rollout::repeat_op): that must run the op twice (the profile's launches grow by a whole
    // number of the op's calls per step) and change nothing else, graphs included, on both
    // linear routes, and with the new tokens rotated in place before attention.
    use reinforge_cuda::ops::{DecodeLinear, DecodeRope};
    use reinforge_cuda::DecodeOp;
    let mut m = model("tiny-llama", DType::Bf16);
    let prompts = vec!["The quick brown fox j".bytes().map(u32::from).collect::<Vec<_>>(), b"abc".iter().map(|&b| b as u32).collect()];
    let params = SamplingParams { n: 2, temperature: 0.9, top_p: 0.9, max_new_tokens: 8, seed: 9, ..Default::default() };
    let bits = |r: &[reinforge_engine::Completion]| -> Vec<(Vec<u32>, Vec<u32>)> { r.iter().map(|c| (c.token_ids.clone(), c.logprobs.iter().map(|x| x.to_bits()).collect())).collect() };
    for route in [(DecodeLinear::Cublas, DecodeRope::Fused), (DecodeLinear::Fused, DecodeRope::Fused), (DecodeLinear::Cublas, DecodeRope::Separate)] {
        (m.decode_linear, m.decode_rope) = route;
        let mut engine = Rollout::new(0.5);
        let (base, st) = engine.generate(&m, &prompts, &params, None).unwrap();
        assert!(engine.graph_steps > 0, "{route:?}: expected graph replays");
        let launches = |engine: Rollout| -> usize {
            let mut e = engine.eager(true);
            m.gpu.profile(|| e.generate(&m, &prompts, &params, None).map(|_| ())).unwrap().1.launches
        };
        let plain = launches(Rollout::new(0.5));
        for op in DecodeOp::ALL {
            engine.repeat_op = Some(op);
            let (twice, _) = engine.generate(&m, &prompts, &params, None).unwrap();
            assert!(engine.graphs_recorded > 0, "{route:?} {}: the graphs of the plain step were replayed", op.name());
            assert!(bits(&twice) == bits(&base), "{route:?} {}: launched twice, it changed the tokens or log-probs", op.name());
            let mut eager = Rollout::new(0.5);
            eager.repeat_op = Some(op);
            let more = launches(eager) - plain;
            let calls = st.decode_steps * if op.per_layer() { m.cfg.num_layers } else { 1 };
            assert!(more > 0 && more % calls == 0, "{route:?} {}: {more} more launches for {calls} calls", op.name());
        }
    }
}

#[test]
fn per_prompt_caps_end_each_prompts_rows_at_its_own_length() {
    let m = model("tiny-qwen2", DType::F32);
    let mut engine = Rollout::new(0.5);
    let prompts = vec!["The quick brown fox j".bytes().map(u32::from).collect::<Vec<_>>(), b"abc".iter().map(|&b| b as u32).collect(), b"xy".iter().map(|&b| b as u32).collect()];
    let p = SamplingParams { n: 2, temperature: 0.9, max_new_tokens: 20, seed: 7, ..Default::default() };
    let (full, _) = engine.generate(&m, &prompts, &p, None).unwrap();
    let caps = [5, 20, 1];
    let (c, stats) = engine.generate(&m, &prompts, &SamplingParams { max_new_tokens_per_prompt: caps.to_vec(), ..p }, None).unwrap();
    for (x, y) in c.iter().zip(&full) {
        assert_eq!(x.token_ids, y.token_ids[..caps[x.prompt_index]].to_vec(), "prompt {}", x.prompt_index);
        assert_eq!(x.finish_reason, FinishReason::Length);
    }
    assert_eq!(stats.new_tokens, 2 * caps.iter().sum::<usize>());
}

#[test]
fn stop_tokens_end_a_sequence_and_top_k_one_is_greedy() {
    let m = model("tiny-llama", DType::F32);
    let mut engine = Rollout::new(0.5);
    let prompt = vec!["Hello".bytes().map(u32::from).collect::<Vec<_>>()];
    let (greedy, _) = engine.generate(&m, &prompt, &SamplingParams::greedy(12), None).unwrap();
    let k1 = SamplingParams { top_k: 1, temperature: 1.3, max_new_tokens: 12, ..Default::default() };
    let (top1, _) = engine.generate(&m, &prompt, &k1, None).unwrap();
    assert_eq!(greedy[0].token_ids, top1[0].token_ids);
    let stop = greedy[0].token_ids[4];
    let first = greedy[0].token_ids.iter().position(|&t| t == stop).unwrap();
    let (stopped, _) = engine.generate(&m, &prompt, &SamplingParams { stop_token_ids: vec![stop], ..SamplingParams::greedy(12) }, None).unwrap();
    assert_eq!(stopped[0].token_ids, greedy[0].token_ids[..=first]);
    assert_eq!(stopped[0].finish_reason, FinishReason::StopToken(stop));
}

#[test]
fn decode_steps_replayed_as_graphs_equal_eager_decoding() {
    // Rows finish at different steps (stop strings of a sampled run would too; here lengths
    // come from a stop token), so the live count crosses buckets and padding rows are used.
    let m = model("tiny-llama", DType::Bf16);
    let prompts: Vec<Vec<u32>> = ["Hello there", "abc", "The quick brown fox"].iter().map(|s| s.bytes().map(u32::from).collect()).collect();
    let params = SamplingParams { n: 3, temperature: 0.8, top_p: 0.9, top_k: 40, max_new_tokens: 24, seed: 5, ..Default::default() };
    let mut eager = Rollout::new(0.5);
    eager.enforce_eager = true;
    let (want, _) = eager.generate(&m, &prompts, &params, None).unwrap();
    assert_eq!(eager.graph_steps, 0);
    // A stop token that ends some rows early and leaves others running — among them the first
    // prompt's, which owns block 0, where a padding row recorded with a stale bucket's
    // inputs would write.
    let stop = want[8].token_ids[3];
    let params = SamplingParams { stop_token_ids: vec![stop], ..params };
    let (want, stats) = eager.generate(&m, &prompts, &params, None).unwrap();
    let lens: std::collections::BTreeSet<usize> = want.iter().map(|c| c.token_ids.len()).collect();
    assert!(lens.len() > 1, "rows should end at different steps: {lens:?}");
    let mut graphs = Rollout::new(0.5);
    let (got, _) = graphs.generate(&m, &prompts, &params, None).unwrap();
    assert!(graphs.graph_steps > stats.decode_steps / 2, "{} of {} decode steps replayed from graphs", graphs.graph_steps, stats.decode_steps);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.token_ids, w.token_ids, "prompt {} sample {}", w.prompt_index, w.sample_index);
        assert_eq!(g.logprobs, w.logprobs, "prompt {} sample {}", w.prompt_index, w.sample_index);
        assert_eq!(g.finish_reason, w.finish_reason);
    }
}

/// The bf16 tiny Llama on an emulated GPU of its own (whose memory then holds only what the
/// test makes), with the bytes of one KV block and the device's memory.
fn on_its_own_gpu() -> (std::sync::Arc<Gpu>, DeviceModel, u64, f64) {
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let m = DeviceModel::load(&gpu, &fixtures().join("models").join("tiny-llama"), DType::Bf16, false).unwrap();
    let block_bytes = 2 * m.cfg.num_layers * 16 * m.cfg.num_kv_heads * m.cfg.head_dim * 2;
    let total = gpu.mem_info().unwrap().1 as f64;
    (gpu, m, block_bytes as u64, total)
}

/// The decode buffers' bytes for a call of `engine_at(utilization)`: they are allocated before
/// the cache is sized and come out of the budget, so a budget with no room left for a block is
/// refused after they exist (and freed), which measures them.
fn decode_buffer_bytes(gpu: &Gpu, m: &DeviceModel, engine_at: impl Fn(f64) -> Rollout, prompts: &[Vec<u32>], params: &SamplingParams) -> u64 {
    let base = gpu.allocated();
    gpu.reset_peak();
    let e = engine_at(base as f64 / gpu.mem_info().unwrap().1 as f64).generate(m, prompts, params, None).err().unwrap().to_string();
    assert!(e.contains("the rollout's KV cache") && e.contains("raise rollout.gpu_memory_utilization"), "{e}");
    assert!(e.contains("rollout.max_num_batched_tokens") && e.contains("prefill passes"), "{e}");
    let bytes = gpu.peak_allocated() - base;
    assert!(bytes > 0 && gpu.allocated() == base, "decode buffers {bytes} B, left {} B", gpu.allocated() - base);
    bytes
}

#[test]
fn steps_queued_before_the_last_is_read_give_the_same_tokens() {
    // With async scheduling a step is queued before the host has read the last one's tokens:
    // rows take their token from the device, a row a stop token ends gets one more row-step
    // (its token dropped), and groups admitted as blocks free up join while a step is in
    // flight. With a cache of 24 blocks (two or three groups of 3 samples at a time), six
    // prompts are admitted in turns.
    let (gpu, m, block_bytes, total) = on_its_own_gpu();
    let prompts: Vec<Vec<u32>> = ["Hello there", "abc", "The quick brown fox", "x", "Lorem ipsum dolor sit amet", "0123456789"]
        .iter()
        .map(|s| s.bytes().map(u32::from).collect())
        .collect();
    let params = SamplingParams { n: 3, temperature: 0.8, top_p: 0.9, top_k: 40, max_new_tokens: 20, seed: 7, ..Default::default() };
    let base = gpu.allocated();
    let decode_bufs = decode_buffer_bytes(&gpu, &m, Rollout::new, &prompts, &params);
    // The budget also leaves room for a prefill pass's activations.
    let reserve = Rollout::new(0.5).prefill_reserve(&m, &prompts);
    let utilization = (base as f64 + decode_bufs as f64 + reserve as f64 + 25.5 * block_bytes as f64) / total;
    let engine = |async_scheduling: bool, eager: bool| {
        let mut e = Rollout::new(utilization).eager(eager);
        e.async_scheduling = async_scheduling;
        e
    };
    let (plain, _) = engine(false, true).generate(&m, &prompts, &params, None).unwrap();
    // The most common token past the first few: ends some rows early and leaves others running.
    let mut counts = std::collections::HashMap::new();
    for c in &plain {
        for &t in &c.token_ids[3..] {
            *counts.entry(t).or_insert(0) += 1;
        }
    }
    let stop = counts.into_iter().max_by_key(|&(t, n)| (n, t)).unwrap().0;
    let params = SamplingParams { stop_token_ids: vec![stop], ..params };
    let (want, ws) = engine(false, true).generate(&m, &prompts, &params, None).unwrap();
    let stopped = want.iter().filter(|c| matches!(c.finish_reason, FinishReason::StopToken(_))).count();
    assert!(stopped > 2 && stopped < want.len(), "{stopped} of {} rows end on the stop token", want.len());
    // More steps than one wave of groups could take: some waited for blocks.
    assert!(ws.decode_steps > params.max_new_tokens, "groups should wait for blocks: {ws:?}");
    for eager in [true, false] {
        let mut e = engine(true, eager);
        let (got, gs) = e.generate(&m, &prompts, &params, None).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.token_ids, w.token_ids, "eager={eager}: prompt {} sample {}", w.prompt_index, w.sample_index);
            assert_eq!(g.logprobs, w.logprobs, "eager={eager}: prompt {} sample {}", w.prompt_index, w.sample_index);
            assert_eq!(g.finish_reason, w.finish_reason);
        }
        assert_eq!(gs.new_tokens, ws.new_tokens);
        // Each row a stop token ended decoded once more, unless the step after was its last.
        assert!(gs.row_steps > ws.row_steps && gs.row_steps <= ws.row_steps + stopped, "eager={eager}: {gs:?} against {ws:?}");
        assert_eq!(e.graph_steps > 0, !eager);
    }
}

#[test]
fn a_rollout_stays_within_its_memory_budget_prefill_passes_included() {
    // The KV cache is sized with a prefill pass's activations left out of the budget, and a
    // prefill samples through the decode buffers' logits: with a budget so tight that groups
    // wait for blocks and are prefilled in turns between decode steps, the most memory the
    // process holds at once stays within gpu_memory_utilization, and every token is a roomy
    // run's.
    let (gpu, m, block_bytes, total) = on_its_own_gpu();
    let prompts: Vec<Vec<u32>> = (0..16).map(|i| format!("prompt {i}: {}", "ab".repeat(2 * i)).bytes().map(u32::from).collect()).collect();
    let params = SamplingParams { n: 3, temperature: 0.8, top_p: 0.9, top_k: 40, max_new_tokens: 16, seed: 11, ..Default::default() };
    let (want, roomy) = Rollout::new(0.5).generate(&m, &prompts, &params, None).unwrap();
    let limited = |u: f64| Rollout::new(u).limited(1024, 48);
    let base = gpu.allocated();
    let decode_bufs = decode_buffer_bytes(&gpu, &m, limited, &prompts, &params);
    let reserve = limited(0.5).prefill_reserve(&m, &prompts) as u64;
    // A prefill pass of 48 tokens needs more than a few blocks: left out, it would not fit.
    assert!(reserve > 20 * block_bytes, "reserve {reserve} B, a block {block_bytes} B");
    // Room for three or four groups' blocks at a time.
    let budget = (base + decode_bufs + reserve + 48 * block_bytes) as f64;
    gpu.reset_peak();
    let mut e = limited(budget / total);
    let (got, gs) = e.generate(&m, &prompts, &params, None).unwrap();
    let peak = gpu.peak_allocated() as f64;
    assert!(peak <= budget, "peak {peak} B above the budget {budget} B ({} B over)", peak - budget);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((&g.token_ids, &g.logprobs), (&w.token_ids, &w.logprobs), "prompt {} sample {}", w.prompt_index, w.sample_index);
    }
    // Groups waited for blocks and were prefilled in several passes.
    assert!(gs.prefills > 3 && gs.decode_steps > 2 * params.max_new_tokens, "{gs:?} (roomy: {roomy:?})");
    // A prompt longer than a pass's tokens is prefilled alone and needs a larger reserve: the
    // cache kept from the last call no longer fits beside it and is sized again.
    let long = vec![(0..110u32).map(|t| 40 + t % 60).collect::<Vec<u32>>(), prompts[3].clone()];
    // (by more than the slack of the few integers per sequence it also counts)
    assert!(e.prefill_reserve(&m, &long) as u64 > reserve + 32 * 1024 + 8 * block_bytes);
    let (want, _) = Rollout::new(0.5).generate(&m, &long, &params, None).unwrap();
    gpu.reset_peak();
    let (got, _) = e.generate(&m, &long, &params, None).unwrap();
    let peak = gpu.peak_allocated() as f64;
    assert!(peak <= budget, "with a longer prompt: peak {peak} B above the budget {budget} B ({} B over)", peak - budget);
    assert_eq!(got.iter().map(|c| &c.token_ids).collect::<Vec<_>>(), want.iter().map(|c| &c.token_ids).collect::<Vec<_>>());
}

#[test]
fn recording_a_graph_refuses_what_a_replay_cannot_repeat() {
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let a = gpu.upload_new(&[1f32, 2.0, 3.0], "test").unwrap();
    let b = gpu.alloc(12, "test", "").unwrap();
    // A copy records, runs only when replayed, and runs again on every replay.
    let g = gpu.capture(|| gpu.copy(b.ptr, a.ptr, 12)).unwrap();
    assert_eq!(g.recorded_ops(), 1);
    assert_eq!(gpu.to_vec::<f32>(b.ptr, 3).unwrap(), vec![0.0; 3], "recording does not run the work");
    gpu.replay(&g).unwrap();
    assert_eq!(gpu.to_vec::<f32>(b.ptr, 3).unwrap(), vec![1.0, 2.0, 3.0]);
    gpu.upload(a.ptr, &[4f32, 5.0, 6.0]).unwrap();
    gpu.replay(&g).unwrap();
    assert_eq!(gpu.to_vec::<f32>(b.ptr, 3).unwrap(), vec![4.0, 5.0, 6.0]);
    for (what, e) in [
        ("allocating", gpu.capture(|| gpu.alloc(4, "test", "").map(drop)).err()),
        ("host copy", gpu.capture(|| gpu.upload(a.ptr, &[0f32])).err()),
        ("download", gpu.capture(|| gpu.to_vec::<f32>(a.ptr, 1).map(drop)).err()),
        ("sync", gpu.capture(|| gpu.sync()).err()),
        ("nested", gpu.capture(|| gpu.capture(|| Ok(())).map(drop)).err()),
    ] {
        let e = e.unwrap_or_else(|| panic!("{what} while recording was accepted")).to_string();
        assert!(e.contains("while recording a CUDA graph") || e.contains("already being recorded"), "{what}: {e}");
    }
    // A buffer freed while recording is refused too (its memory is released afterwards).
    let before = gpu.allocated();
    let tmp = gpu.alloc(64, "test", "").unwrap();
    let e = gpu.capture(move || {
        drop(tmp);
        Ok(())
    });
    assert!(e.err().is_some_and(|e| e.to_string().contains("freeing device memory")));
    assert_eq!(gpu.allocated(), before);
    // So is staging memory (on a GPU, freeing it would first wait for the stream being
    // captured); it is freed once the recording ends.
    let mut staged = gpu.staging(12).unwrap();
    gpu.download_staged(a.ptr, &mut staged, 12).unwrap();
    let e = gpu.capture(move || {
        drop(staged);
        Ok(())
    });
    assert!(e.err().is_some_and(|e| e.to_string().contains("freeing staging memory")));
    // A panic while recording leaves the device usable.
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| gpu.capture(|| panic!("inside a recording"))));
    assert!(caught.is_err());
    // The device works normally afterwards.
    gpu.alloc(4, "test", "").unwrap();
    gpu.replay(&g).unwrap();
}

#[test]
fn a_recording_has_the_device_to_itself_while_other_threads_wait() {
    // One device shared by two threads (as roles of one process share it): one records graphs
    // while the other allocates, copies and waits. Neither is refused, and each graph holds only
    // its own thread's work.
    let gpu = Gpu::open(GpuKind::Emulated).unwrap();
    let a = gpu.upload_new(&[1f32, 2.0, 3.0], "test").unwrap();
    let b = gpu.alloc(12, "test", "").unwrap();
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    let (stop, rounds) = (AtomicBool::new(false), AtomicUsize::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Relaxed) {
                let r = rounds.load(Relaxed) as f32;
                let t = gpu.upload_new(&[r; 64], "other thread").unwrap();
                let u = gpu.alloc(256, "other thread", "").unwrap();
                gpu.copy(u.ptr, t.ptr, 256).unwrap();
                assert_eq!(gpu.to_vec::<f32>(u.ptr, 64).unwrap(), vec![r; 64]);
                rounds.fetch_add(1, Relaxed);
            }
        });
        // Record until the other thread has done a good deal of work in between.
        let started = std::time::Instant::now();
        let mut graphs = 0;
        while graphs < 50 || rounds.load(Relaxed) < 50 {
            assert!(started.elapsed().as_secs() < 60, "{graphs} graphs, {} rounds of the other thread in a minute", rounds.load(Relaxed));
            // A recording long enough for the other thread to try its luck during it.
            let g = gpu
                .capture(|| {
                    for _ in 0..100 {
                        gpu.copy(b.ptr, a.ptr, 12)?;
                        std::thread::yield_now();
                    }
                    Ok(())
                })
                .unwrap();
            assert_eq!(g.recorded_ops(), 100, "the other thread's work went into the recording");
            gpu.replay(&g).unwrap();
            graphs += 1;
        }
        stop.store(true, Relaxed);
    });
    assert_eq!(gpu.to_vec::<f32>(b.ptr, 3).unwrap(), vec![1.0, 2.0, 3.0]);
}

#[test]
fn max_num_seqs_and_the_prefill_token_budget_admit_in_turns_and_change_no_token() {
    // vLLM's two limits: with at most 4 sequences at once (two groups of 2 samples) and 12
    // prompt tokens per prefill pass, six prompts go through in turns, each admitted as
    // running rows finish; every row still gets the tokens it gets with all admitted at once
    // (on the emulator a GEMM row does not depend on the row count).
    let m = model("tiny-llama", DType::Bf16);
    let prompts: Vec<Vec<u32>> = ["Hello there", "abc", "The quick brown fox", "x", "Lorem ipsum dolor sit amet", "0123456789"]
        .iter()
        .map(|s| s.bytes().map(u32::from).collect())
        .collect();
    let params = SamplingParams { n: 2, temperature: 0.8, top_p: 0.9, top_k: 40, max_new_tokens: 12, seed: 5, ..Default::default() };
    let (want, ws) = Rollout::new(0.5).generate(&m, &prompts, &params, None).unwrap();
    assert_eq!((ws.prefills, ws.max_step_rows), (1, 12), "all at once by default: {ws:?}");
    for (limits, eager) in [((4, 12), false), ((4, 12), true), ((64, 5), false)] {
        let mut e = Rollout::new(0.5).eager(eager).limited(limits.0, limits.1);
        let (got, gs) = e.generate(&m, &prompts, &params, None).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert_eq!((&g.token_ids, &g.logprobs, &g.finish_reason), (&w.token_ids, &w.logprobs, &w.finish_reason), "{limits:?}: prompt {} sample {}", w.prompt_index, w.sample_index);
        }
        assert_eq!(gs.new_tokens, ws.new_tokens);
        assert!(gs.max_step_rows <= limits.0, "{limits:?}: {gs:?}");
        if limits.1 == 5 {
            // Each prompt fills the budget alone or with a short one that cannot follow it.
            assert_eq!(gs.prefills, prompts.len(), "{gs:?}");
        } else {
            // Groups wait for running ones: more prefills and more decode steps.
            assert!(gs.prefills >= 3 && gs.decode_steps > 2 * params.max_new_tokens, "{gs:?}");
        }
    }
    // Rows that all end on their first token leave no live row while groups still wait.
    let one = SamplingParams { max_new_tokens: 1, ..params.clone() };
    let (want1, _) = Rollout::new(0.5).generate(&m, &prompts, &one, None).unwrap();
    let (got1, gs1) = Rollout::new(0.5).limited(4, 12).generate(&m, &prompts, &one, None).unwrap();
    assert_eq!(got1.iter().map(|c| &c.token_ids).collect::<Vec<_>>(), want1.iter().map(|c| &c.token_ids).collect::<Vec<_>>());
    assert!(gs1.prefills >= 3 && gs1.decode_steps == 0, "{gs1:?}");
    let e = Rollout::new(0.5).limited(1, 8192).generate(&m, &prompts, &params, None).err().unwrap().to_string();
    assert!(e.contains("rollout.n = 2 is above the 1 sequences decoded at once"), "{e}");
    let e = Rollout::new(0.5).limited(0, 8192).generate(&m, &prompts, &params, None).err().unwrap().to_string();
    assert!(e.contains("both must be at least 1"), "{e}");
    // Above the engine's 1024, 1024.
    let (got, _) = Rollout::new(0.5).limited(5000, 8192).generate(&m, &prompts, &params, None).unwrap();
    assert_eq!(got.iter().map(|c| &c.token_ids).collect::<Vec<_>>(), want.iter().map(|c| &c.token_ids).collect::<Vec<_>>());
}

#[test]
fn decode_graphs_are_kept_between_calls_while_model_cache_and_sampling_stay() {
    // A rollout engine with a cache of its own (a rollout rank, the bench) records each
    // bucket's graph once: later calls replay every decode step. Other sampling settings get
    // graphs of their own, and another model, or the cache given back, new buffers and graphs
    // (the f32 model also needs a cache of twice the bytes per block).
    let bf16 = model("tiny-llama", DType::Bf16);
    let f32_model = model("tiny-llama", DType::F32);
    let prompts: Vec<Vec<u32>> = ["Hello there", "abc", "The quick brown fox"].iter().map(|s| s.bytes().map(u32::from).collect()).collect();
    let sampled = SamplingParams { n: 2, temperature: 0.8, top_p: 0.9, top_k: 40, max_new_tokens: 10, seed: 3, ..Default::default() };
    let greedy = SamplingParams { n: 2, ..SamplingParams::greedy(10) };
    let mut e = Rollout::new(0.5);
    let call = |e: &mut Rollout, m: &DeviceModel, p: &SamplingParams, all_replayed: bool, what: &str| {
        let (want, _) = Rollout::new(0.5).eager(true).generate(m, &prompts, p, None).unwrap();
        let (got, st) = e.generate(m, &prompts, p, None).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert_eq!((&g.token_ids, &g.logprobs), (&w.token_ids, &w.logprobs), "{what}: prompt {} sample {}", w.prompt_index, w.sample_index);
        }
        match all_replayed {
            true => assert_eq!((e.graph_steps, e.graphs_recorded), (st.decode_steps, 0), "{what}: every step replayed, nothing recorded"),
            false => assert!(e.graph_steps > 0 && e.graph_steps < st.decode_steps, "{what}: recorded anew ({} of {} replayed)", e.graph_steps, st.decode_steps),
        }
    };
    call(&mut e, &bf16, &sampled, false, "first call");
    call(&mut e, &bf16, &sampled, true, "second call");
    call(&mut e, &bf16, &greedy, false, "greedy, first time");
    call(&mut e, &bf16, &greedy, true, "greedy again");
    call(&mut e, &bf16, &sampled, true, "sampled again");
    call(&mut e, &f32_model, &sampled, false, "another model");
    call(&mut e, &f32_model, &sampled, true, "that model again");
    e.release_cache();
    call(&mut e, &f32_model, &sampled, false, "after the cache was given back");
    // More prompts, same buffers (8 rows either way): the cache grows, so the graphs that
    // wrote the old one are recorded anew.
    let more: Vec<Vec<u32>> = prompts.iter().cloned().chain([b"Lorem ipsum".iter().map(|&b| b as u32).collect()]).collect();
    let (want, _) = Rollout::new(0.5).eager(true).generate(&f32_model, &more, &sampled, None).unwrap();
    let (got, st) = e.generate(&f32_model, &more, &sampled, None).unwrap();
    assert_eq!(got.iter().map(|c| &c.token_ids).collect::<Vec<_>>(), want.iter().map(|c| &c.token_ids).collect::<Vec<_>>());
    assert!(e.graph_steps > 0 && e.graph_steps < st.decode_steps, "a grown cache: {} of {} replayed", e.graph_steps, st.decode_steps);
    // Eager from now on: the graphs kept are not replayed.
    e.enforce_eager = true;
    e.generate(&f32_model, &more, &sampled, None).unwrap();
    assert_eq!(e.graph_steps, 0);
}
