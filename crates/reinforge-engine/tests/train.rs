//! The training primitive: gradients reach every parameter, micro-batch accumulation equals
//! one big batch, and steps lower the loss; rollouts see updated weights without a reload.

mod common;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use common::*;
use reinforge_engine::{token_logprobs, token_logprobs_at, token_logprobs_from, CausalLm, SharedPrompt, ForwardInput, OptimConfig, Trainer};

fn batch() -> ForwardInput {
    // Left padding in row 1 exercises the mask path in backward too.
    let ids = vec![b"hello world!".iter().map(|&c| c as u32).collect::<Vec<_>>(), {
        let mut r = vec![0u32; 4];
        r.extend(b"rust rl!".iter().map(|&c| c as u32));
        r
    }];
    let mask = vec![vec![true; 12], (0..12).map(|j| j >= 4).collect()];
    ForwardInput::from_mask(ids, mask)
}

fn nll(lp: Tensor<2>, input: &ForwardInput) -> Tensor<1> {
    // Mean NLL over predicted real tokens (column 0 predicts nothing).
    let [b, t] = lp.dims();
    let m: Vec<f32> = input.key_valid.iter().flat_map(|r| r.iter().enumerate().map(|(j, &v)| if v && j > 0 { 1.0 } else { 0.0 })).collect();
    let n: f32 = m.iter().sum();
    let mask = Tensor::<2>::from_data(TensorData::new(m, [b, t]), &lp.device());
    (lp * mask).sum().neg().div_scalar(n)
}

struct GradCheck<'a> {
    grads: &'a GradientsParams,
    missing: Vec<String>,
    zero: Vec<String>,
    seen: usize,
}

impl ModuleVisitor for GradCheck<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.seen += 1;
        match self.grads.get::<D>(param.id) {
            None => self.missing.push(format!("{:?}", param.val().dims())),
            Some(g) => {
                if g.abs().sum().into_scalar::<f32>() == 0.0 {
                    self.zero.push(format!("{:?}", param.val().dims()));
                }
            }
        }
    }
}

/// Every parameter's gradient, flattened in visiting order.
struct CollectGrads<'a> {
    grads: &'a GradientsParams,
    values: Vec<f32>,
}

impl ModuleVisitor for CollectGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let g = self.grads.get::<D>(param.id).expect("every parameter has a gradient");
        self.values.extend(g.into_data().try_into_vec::<f32>().unwrap());
    }
}

fn every_param_has_grad(name: &str) {
    let dir = fixtures().join("models").join(name);
    let model = CausalLm::load(&dir, &Device::flex().autodiff()).unwrap();
    let input = batch();
    let lp = token_logprobs(&model, &input, 1.0, true).unwrap();
    let ent = lp.entropy.unwrap();
    let loss = nll(lp.logprobs, &input) - ent.mean().mul_scalar(0.01);
    let grads = GradientsParams::from_grads(loss.backward(), &model.net);
    let mut check = GradCheck { grads: &grads, missing: vec![], zero: vec![], seen: 0 };
    model.net.visit(&mut check);
    let expected = 9 * model.config.num_layers + 2 + usize::from(!model.config.tie_word_embeddings)
        + if model.config.qkv_bias { 3 * model.config.num_layers } else { 0 };
    assert_eq!(check.seen, expected, "{name}: parameter count");
    assert!(check.missing.is_empty(), "{name}: parameters without gradient: {:?}", check.missing);
    assert!(check.zero.is_empty(), "{name}: parameters with all-zero gradient: {:?}", check.zero);
}

#[test]
fn every_parameter_receives_a_gradient_llama() {
    every_param_has_grad("tiny-llama");
}

#[test]
fn every_parameter_receives_a_gradient_qwen2() {
    every_param_has_grad("tiny-qwen2");
}

#[test]
fn token_logprobs_match_log_softmax_of_forward() {
    let dir = fixtures().join("models/tiny-qwen2");
    let model = CausalLm::load(&dir, &Device::flex()).unwrap();
    let input = batch();
    let lp: Vec<f32> = token_logprobs(&model, &input, 1.0, false).unwrap().logprobs.into_data().try_into_vec().unwrap();
    let logits: Vec<f32> = model.forward(&input).unwrap().into_data().try_into_vec().unwrap();
    let (t, v) = (12, model.config.vocab_size);
    for b in 0..2 {
        for j in 1..t {
            let row = &logits[(b * t + j - 1) * v..(b * t + j) * v];
            let m = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let lse = m + row.iter().map(|&z| (z as f64 - m).exp()).sum::<f64>().ln();
            let want = row[input.ids[b][j] as usize] as f64 - lse;
            assert!((lp[b * t + j] as f64 - want).abs() < 1e-4, "row {b} pos {j}");
        }
        assert_eq!(lp[b * t], 0.0);
    }
}

#[test]
fn logprobs_from_a_column_equal_the_full_ones_there_in_value_and_gradient() {
    // The RL losses ask for the response's columns only; the head then skips the prompt's
    // rows. Same values there, zeros before, and the same gradient for a loss on those columns.
    let dir = fixtures().join("models/tiny-qwen2");
    let input = batch();
    let first = 7;
    let keep: Vec<f32> = (0..2).flat_map(|_| (0..12).map(|j| if j >= first { 1.0 } else { 0.0 })).collect();
    let run = |from: Option<usize>| {
        let model = CausalLm::load(&dir, &Device::flex().autodiff()).unwrap();
        let out = match from {
            Some(f) => token_logprobs_from(&model, &input, f, 1.0, true),
            None => token_logprobs(&model, &input, 1.0, true),
        }
        .unwrap();
        let mask = Tensor::<2>::from_data(TensorData::new(keep.clone(), [2, 12]), &out.logprobs.device());
        let lp = out.logprobs * mask.clone();
        let ent = out.entropy.unwrap() * mask;
        let loss = lp.clone().sum() + ent.clone().sum().mul_scalar(0.3);
        let grads = GradientsParams::from_grads(loss.backward(), &model.net);
        let mut collect = CollectGrads { grads: &grads, values: vec![] };
        model.net.visit(&mut collect);
        let g = collect.values;
        let lp: Vec<f32> = lp.into_data().try_into_vec().unwrap();
        let ent: Vec<f32> = ent.into_data().try_into_vec().unwrap();
        (lp, ent, g)
    };
    let (lp_full, ent_full, g_full) = run(None);
    let (lp, ent, g) = run(Some(first));
    assert!(!g.is_empty());
    for (name, a, b) in [("log-prob", &lp_full, &lp), ("entropy", &ent_full, &ent), ("gradient", &g_full, &g)] {
        assert_eq!(a.len(), b.len(), "{name}");
        for (i, (x, y)) in a.iter().zip(b.iter()).enumerate() {
            assert!((x - y).abs() <= 1e-5 * (1.0 + x.abs()), "{name} {i}: {x} vs {y}");
        }
    }
    // Before `first`, nothing was computed.
    let model = CausalLm::load(&dir, &Device::flex()).unwrap();
    let raw: Vec<f32> = token_logprobs_from(&model, &input, first, 1.0, false).unwrap().logprobs.into_data().try_into_vec().unwrap();
    assert!((0..2).all(|b| raw[b * 12..b * 12 + first].iter().all(|&x| x == 0.0)));
    assert!(raw[first..12].iter().all(|&x| x < 0.0));
}

/// Log-probs, entropies and every parameter's gradient of `Σ wᵢ·lpᵢ + Σ vᵢ·entᵢ` over the
/// continuations' tokens: each continuation after its prompt as its own sequence (`shared` false)
/// or each prompt once with its continuations in one row (`shared` true).
fn scored(name: &str, groups: &[(Vec<u32>, Vec<Vec<u32>>)], shared: bool) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let model = CausalLm::load(&fixtures().join("models").join(name), &Device::flex().autodiff()).unwrap();
    let device = model.device();
    let (lp, ent) = if shared {
        let rows: Vec<SharedPrompt> = groups.iter().map(|(p, cs)| SharedPrompt { prompt: p, continuations: cs.iter().map(Vec::as_slice).collect() }).collect();
        let (input, picks) = reinforge_engine::ForwardInput::shared_prompts(&rows, 0).unwrap();
        let out = token_logprobs_at(&model, &input, &picks, 0.8, true).unwrap();
        (out.logprobs, out.entropy.unwrap())
    } else {
        let seqs: Vec<(usize, Vec<u32>)> = groups.iter().flat_map(|(p, cs)| cs.iter().map(move |c| (p.len(), [p.clone(), c.clone()].concat()))).collect();
        let t = seqs.iter().map(|(_, s)| s.len()).max().unwrap();
        let ids = seqs.iter().map(|(_, s)| s.iter().copied().chain(std::iter::repeat(0)).take(t).collect()).collect();
        let mask = seqs.iter().map(|(_, s)| (0..t).map(|j| j < s.len()).collect()).collect();
        let out = token_logprobs(&model, &ForwardInput::from_mask(ids, mask), 0.8, true).unwrap();
        // Each continuation's columns, in the same order as the shared layout's picks.
        let idx: Vec<i64> = seqs.iter().enumerate().flat_map(|(r, (p, s))| (*p..s.len()).map(move |j| (r * t + j) as i64)).collect();
        let n = idx.len();
        let idx = Tensor::<1, burn::tensor::Int>::from_data(TensorData::new(idx, [n]), &device);
        let flat = |x: Tensor<2>| x.reshape([seqs.len() * t]).select(0, idx.clone());
        (flat(out.logprobs), flat(out.entropy.unwrap()))
    };
    let n = lp.dims()[0];
    let w: Vec<f32> = (0..n).map(|i| ((i * 7 % 5) as f32 - 2.0) * 0.3).collect();
    let v: Vec<f32> = (0..n).map(|i| ((i * 3 % 4) as f32 - 1.5) * 0.2).collect();
    let loss = (lp.clone() * Tensor::<1>::from_data(TensorData::new(w, [n]), &device)).sum()
        + (ent.clone() * Tensor::<1>::from_data(TensorData::new(v, [n]), &device)).sum();
    let grads = GradientsParams::from_grads(loss.backward(), &model.net);
    let mut collect = CollectGrads { grads: &grads, values: vec![] };
    model.net.visit(&mut collect);
    (lp.into_data().try_into_vec().unwrap(), ent.into_data().try_into_vec().unwrap(), collect.values)
}

#[test]
fn a_prompt_shared_by_its_continuations_scores_them_as_separate_sequences_do() {
    // Two prompts of different lengths; the first with three continuations (one empty, one of
    // a single token), the second with one: ragged rows, padding, every branch case.
    let groups = vec![
        (vec![5, 9, 13, 2, 7], vec![vec![11, 4, 8, 30], vec![], vec![6], vec![17, 17, 3]]),
        (vec![21, 3, 44], vec![vec![9, 10, 12, 1, 2]]),
    ];
    for name in ["tiny-qwen2", "tiny-llama"] {
        let (lp_a, ent_a, g_a) = scored(name, &groups, false);
        let (lp_b, ent_b, g_b) = scored(name, &groups, true);
        assert_eq!(lp_a.len(), 13, "{name}: one log-prob per continuation token");
        for (what, a, b) in [("log-prob", &lp_a, &lp_b), ("entropy", &ent_a, &ent_b), ("gradient", &g_a, &g_b)] {
            assert_eq!(a.len(), b.len(), "{name} {what}");
            let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!((x - y).abs() <= 2e-5 * scale.max(1.0), "{name} {what} {i}: separate {x}, shared {y}");
            }
        }
    }
}

#[test]
fn shared_prompt_rows_are_refused_without_a_prompt() {
    let empty: Vec<u32> = vec![];
    let rows = [SharedPrompt { prompt: &empty, continuations: vec![&[1, 2][..]] }];
    let err = ForwardInput::shared_prompts(&rows, 0).err().expect("refused").to_string();
    assert!(err.contains("prompt of at least one token"), "{err}");
}

fn weights(m: &CausalLm) -> Vec<f32> {
    m.to_hf_tensors().unwrap().into_values().flat_map(|t| t.data).collect()
}

#[test]
fn micro_batch_accumulation_equals_one_batch() {
    let dir = fixtures().join("models/tiny-llama");
    let dev = Device::flex().autodiff();
    // A large Adam eps keeps the first step proportional to the gradient; with eps = 1e-8 the
    // update is ~lr·sign(g) and float noise in near-zero gradients would dominate the comparison.
    let cfg = OptimConfig { grad_clip: Some(0.5), eps: 1e-2, ..Default::default() };
    let full = batch();
    let halves: Vec<ForwardInput> = (0..2)
        .map(|b| ForwardInput::from_mask(vec![full.ids[b].clone()], vec![full.key_valid[b].clone()]))
        .collect();
    let n_total: f32 = full.key_valid.iter().map(|r| r.iter().skip(1).filter(|&&v| v).count() as f32).sum();
    let loss_sum = |lp: Tensor<2>, input: &ForwardInput| {
        let [b, t] = lp.dims();
        let m: Vec<f32> = input.key_valid.iter().flat_map(|r| r.iter().enumerate().map(|(j, &v)| if v && j > 0 { 1.0 } else { 0.0 })).collect();
        let mask = Tensor::<2>::from_data(TensorData::new(m, [b, t]), &lp.device());
        (lp * mask).sum().neg().div_scalar(n_total)
    };
    let mut one = Trainer::new(CausalLm::load(&dir, &dev).unwrap(), cfg.clone()).unwrap();
    let s1 = one.step(1, 1e-2, |_, m| Ok::<_, reinforge_engine::EngineError>(loss_sum(token_logprobs(m, &full, 1.0, false)?.logprobs, &full))).unwrap();
    let mut two = Trainer::new(CausalLm::load(&dir, &dev).unwrap(), cfg).unwrap();
    let s2 = two.step(2, 1e-2, |i, m| Ok::<_, reinforge_engine::EngineError>(loss_sum(token_logprobs(m, &halves[i], 1.0, false)?.logprobs, &halves[i]))).unwrap();
    assert!((s1.loss - s2.loss).abs() < 1e-4, "loss {} vs {}", s1.loss, s2.loss);
    assert!((s1.grad_norm - s2.grad_norm).abs() < 1e-3 * s1.grad_norm, "norm {} vs {}", s1.grad_norm, s2.grad_norm);
    assert!(s1.grad_norm > 0.5, "the test must exercise clipping (norm {})", s1.grad_norm);
    let (a, b) = (weights(&one.model), weights(&two.model));
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-5, "weights differ by {worst}");
    let before = weights(&CausalLm::load(&dir, &Device::flex()).unwrap());
    assert!(a.iter().zip(&before).any(|(x, y)| x != y), "the step changed nothing");
}

#[test]
fn steps_lower_the_loss_and_rollout_sees_new_weights() {
    let dir = fixtures().join("models/tiny-qwen2");
    let mut tr = Trainer::new(CausalLm::load(&dir, &Device::flex().autodiff()).unwrap(), OptimConfig::default()).unwrap();
    let input = batch();
    let mut losses = vec![];
    for _ in 0..8 {
        let s = tr.step(1, 3e-3, |_, m| Ok::<_, reinforge_engine::EngineError>(nll(token_logprobs(m, &input, 1.0, false)?.logprobs, &input))).unwrap();
        losses.push(s.loss);
    }
    assert!(losses[7] < losses[0] * 0.8, "loss did not fall: {losses:?}");
    // Hybrid engine: the inference view shares the updated tensors.
    let inf = tr.inference_model();
    assert!(!inf.device().is_autodiff());
    let a: Vec<f32> = inf.forward(&input).unwrap().into_data().try_into_vec().unwrap();
    let b: Vec<f32> = tr.model.forward(&input).unwrap().into_data().try_into_vec().unwrap();
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-5));
    let fresh: Vec<f32> = CausalLm::load(&dir, &Device::flex()).unwrap().forward(&input).unwrap().into_data().try_into_vec().unwrap();
    assert!(a.iter().zip(&fresh).any(|(x, y)| (x - y).abs() > 1e-3), "inference view still has the old weights");
}

#[test]
fn optimizer_state_survives_a_reload() {
    // Two steps straight vs. one step, save (weights + AdamW moments), rebuild, one more step.
    let dir = fixtures().join("models/tiny-llama");
    let dev = Device::flex().autodiff();
    let input = batch();
    let loss = |m: &CausalLm| Ok::<_, reinforge_engine::EngineError>(nll(token_logprobs(m, &input, 1.0, false)?.logprobs, &input));
    let mut straight = Trainer::new(CausalLm::load(&dir, &dev).unwrap(), OptimConfig::default()).unwrap();
    straight.step(1, 1e-2, |_, m| loss(m)).unwrap();
    straight.step(1, 1e-2, |_, m| loss(m)).unwrap();

    let mut first = Trainer::new(CausalLm::load(&dir, &dev).unwrap(), OptimConfig::default()).unwrap();
    first.step(1, 1e-2, |_, m| loss(m)).unwrap();
    let tensors = first.model.to_hf_tensors().unwrap();
    // Through the checkpoint file format.
    let file = tempfile::tempdir().unwrap();
    let path = file.path().join("optimizer.safetensors");
    first.optimizer_state().unwrap().write(&path).unwrap();
    let opt = reinforge_engine::OptimizerState::read(&std::fs::read(&path).unwrap(), &path).unwrap();
    assert_eq!(opt.steps, 1);
    let config = first.model.config.clone();
    drop(first);
    let mut resumed = Trainer::new(CausalLm::from_hf_tensors(config, tensors, &dev).unwrap(), OptimConfig::default()).unwrap();
    resumed.load_optimizer_state(&opt).unwrap();
    resumed.step(1, 1e-2, |_, m| loss(m)).unwrap();
    let (a, b) = (weights(&straight.model), weights(&resumed.model));
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-6, "resumed weights differ by {worst}");
}

#[test]
fn value_model_trains_every_parameter() {
    let dir = fixtures().join("models/tiny-qwen2");
    let critic = reinforge_engine::ValueModel::load(&dir, &Device::flex().autodiff()).unwrap();
    let input = batch();
    // Zero-initialised head: values start at 0.
    let v0: Vec<f32> = critic.values(&input).unwrap().into_data().try_into_vec().unwrap();
    assert!(v0.iter().all(|&x| x == 0.0));
    let mut tr = Trainer::new(critic, OptimConfig::default()).unwrap();
    let target = Tensor::<2>::ones([2, 12], &Device::flex().autodiff());
    let mut losses = vec![];
    for _ in 0..5 {
        let s = tr.step(1, 1e-2, |_, m| Ok::<_, reinforge_engine::EngineError>((m.values(&input)? - target.clone()).square().mean())).unwrap();
        losses.push(s.loss);
    }
    assert!(losses[4] < losses[0] * 0.5, "value loss did not fall: {losses:?}");
}

#[test]
fn random_init_is_deterministic_and_loadable() {
    let cfg = CausalLm::load(&fixtures().join("models/tiny-llama"), &Device::flex()).unwrap().config;
    let a = CausalLm::random(cfg.clone(), 7, &Device::flex()).unwrap();
    let b = CausalLm::random(cfg.clone(), 7, &Device::flex()).unwrap();
    let c = CausalLm::random(cfg, 8, &Device::flex()).unwrap();
    assert_eq!(weights(&a), weights(&b));
    assert_ne!(weights(&a), weights(&c));
}

#[test]
fn adamw_matches_burns_own_optimizer_bit_for_bit() {
    // The trainer's AdamW is hand-written (its state must be exportable by name); two steps of
    // it must give exactly the weights burn's AdamW gives from the same gradients.
    use burn::optim::{AdamWConfig, GradientsParams};
    let dir = fixtures().join("models/tiny-qwen2");
    let dev = Device::flex().autodiff();
    let input = batch();
    let cfg = OptimConfig { grad_clip: None, weight_decay: 0.1, ..Default::default() };
    let mut ours = Trainer::new(CausalLm::load(&dir, &dev).unwrap(), cfg.clone()).unwrap();
    let mut theirs = CausalLm::load(&dir, &dev).unwrap();
    let mut optim = AdamWConfig::new().with_beta_1(cfg.beta1).with_beta_2(cfg.beta2).with_epsilon(cfg.eps).with_weight_decay(cfg.weight_decay).init();
    for _ in 0..2 {
        ours.step(1, 1e-2, |_, m| Ok::<_, reinforge_engine::EngineError>(nll(token_logprobs(m, &input, 1.0, false)?.logprobs, &input))).unwrap();
        let loss = nll(token_logprobs(&theirs, &input, 1.0, false).unwrap().logprobs, &input);
        let grads = GradientsParams::from_grads(loss.backward(), &theirs);
        theirs = optim.step(1e-2, theirs, grads);
    }
    assert_eq!(weights(&ours.model), weights(&theirs));
}
