//! Every policy-loss mode (`policy_loss.loss_mode`) against verl 0.9.1's own torch code:
//! the loss, the metrics verl logs and the gradient in `log_prob` (torch autograd, float64),
//! from `tests/data/policy_loss_modes.json` (written by `make_policy_loss_golden.py`). Then the
//! invariants training relies on: micro-batches with the mini-batch's normalisers add up to the
//! whole loss, and Clip-Cov's random pick is reproducible.

use burn::tensor::{Device, Tensor};
use reinforge_algos::burn_ops;
use reinforge_algos::*;
use serde_json::Value;

fn golden() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/policy_loss_modes.json");
    let text = std::fs::read_to_string(path).expect("golden file is in the repository");
    serde_json::from_str(&text).expect("golden file is JSON")
}

fn mat(v: &Value) -> Mat {
    let rows: Vec<Vec<f64>> = v
        .as_array()
        .expect("a matrix")
        .iter()
        .map(|r| r.as_array().expect("a row").iter().map(|x| x.as_f64().expect("a number")).collect())
        .collect();
    Mat::from_rows(&rows).expect("rectangular")
}

fn config(mode: &str, p: &Value) -> PolicyLossConfig {
    let f = |k: &str| p.get(k).and_then(Value::as_f64);
    let d = PolicyLossConfig::default();
    PolicyLossConfig {
        loss_mode: mode.parse().expect("a mode Reinforge has"),
        clip_ratio: f("clip_ratio").unwrap_or(d.clip_ratio),
        clip_ratio_low: f("clip_ratio_low"),
        clip_ratio_high: f("clip_ratio_high"),
        clip_ratio_c: f("clip_ratio_c").unwrap_or(d.clip_ratio_c),
        loss_agg_mode: p["loss_agg_mode"].as_str().expect("agg mode").parse().expect("known agg mode"),
        agg: AggOptions {
            dp_size: f("dp_size").map_or(1, |x| x as usize),
            batch_num_tokens: f("batch_num_tokens"),
            global_batch_size: f("global_batch_size"),
            loss_scale_factor: None,
            global_rows: None,
        },
        clip_cov_ratio: f("clip_cov_ratio").unwrap_or(d.clip_cov_ratio),
        clip_cov_lb: f("clip_cov_lb").unwrap_or(d.clip_cov_lb),
        clip_cov_ub: f("clip_cov_ub").unwrap_or(d.clip_cov_ub),
        kl_cov_ratio: f("kl_cov_ratio").unwrap_or(d.kl_cov_ratio),
        ppo_kl_coef: f("ppo_kl_coef").unwrap_or(d.ppo_kl_coef),
        tau_pos: f("tau_pos").unwrap_or(d.tau_pos),
        tau_neg: f("tau_neg").unwrap_or(d.tau_neg),
        dro_beta: f("dro_beta"),
    }
}

struct Inputs {
    old: Mat,
    lp: Mat,
    adv: Mat,
    mask: Mat,
    weights: Option<Mat>,
}

impl Inputs {
    fn of(v: &Value) -> Self {
        Self {
            old: mat(&v["old_log_prob"]),
            lp: mat(&v["log_prob"]),
            adv: mat(&v["advantages"]),
            mask: mat(&v["response_mask"]),
            weights: v.get("rollout_is_weights").filter(|w| !w.is_null()).map(mat),
        }
    }

    fn rows(&self, r: &[usize]) -> Self {
        let pick = |m: &Mat| Mat::from_rows(&r.iter().map(|&i| m.row(i).unwrap().to_vec()).collect::<Vec<_>>()).unwrap();
        Self {
            old: pick(&self.old),
            lp: pick(&self.lp),
            adv: pick(&self.adv),
            mask: pick(&self.mask),
            weights: self.weights.as_ref().map(pick),
        }
    }
}

/// The loss, its metrics and d loss / d log_prob, from burn autodiff (f32).
fn run(x: &Inputs, cfg: &PolicyLossConfig) -> (f64, burn_ops::PolicyLossMetrics, Vec<f64>) {
    let dev = Device::flex().autodiff();
    let t = |m: &Mat| burn_ops::mat_to_tensor(m, &dev);
    let leaf: Tensor<2> = t(&x.lp).require_grad();
    let out = burn_ops::policy_loss(t(&x.old), leaf.clone(), t(&x.adv), t(&x.mask), x.weights.as_ref().map(t), cfg)
        .expect("the loss computes");
    let value = burn_ops::scalar(out.loss.clone(), "loss").unwrap();
    let grads = out.loss.backward();
    let grad = match leaf.grad(&grads) {
        Some(g) => burn_ops::tensor_to_mat(g).unwrap().into_data(),
        None => vec![0.0; x.lp.len()],
    };
    (value, out.metrics, grad)
}

/// f32 against float64: relative 2e-4 of the value, absolute 2e-5 (the inputs are O(1)).
fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 2e-4 * want.abs() + 2e-5
}

#[test]
fn every_mode_matches_verl() {
    let doc = golden();
    let cases = doc["cases"].as_array().expect("cases");
    let mut per_mode = std::collections::BTreeMap::<String, usize>::new();
    for case in cases {
        let id = case["id"].as_str().unwrap();
        let mode = case["loss_mode"].as_str().unwrap();
        let cfg = config(mode, &case["params"]);
        let x = Inputs::of(&case["inputs"]);
        let want = &case["expected"];
        let (loss, metrics, grad) = run(&x, &cfg);
        let want_loss = want["loss"].as_f64().unwrap();
        assert!(close(loss, want_loss), "{id}: loss {loss} vs verl {want_loss}");
        let got_metrics = [
            ("pg_clipfrac", metrics.pg_clipfrac),
            ("ppo_kl", metrics.ppo_kl),
            ("pg_clipfrac_lower", metrics.pg_clipfrac_lower),
        ];
        for (name, got) in got_metrics {
            let w = want["metrics"].get(name).and_then(Value::as_f64);
            match (got, w) {
                (Some(g), Some(w)) => assert!(close(g, w), "{id}: {name} {g} vs verl {w}"),
                (None, None) => {}
                (g, w) => panic!("{id}: {name} is {g:?} here but verl logs {w:?}"),
            }
        }
        let want_grad = mat(&want["grad"]);
        for (k, (&g, &w)) in grad.iter().zip(want_grad.data()).enumerate() {
            assert!(close(g, w), "{id}: d loss/d log_prob[{k}] {g} vs torch {w}");
        }
        *per_mode.entry(mode.to_string()).or_default() += 1;
    }
    let modes: Vec<&str> = PolicyLossMode::ALL.iter().map(|m| m.as_str()).collect();
    for m in &modes {
        assert!(per_mode.get(*m).copied().unwrap_or(0) >= 6, "mode {m} has too few golden cases: {per_mode:?}");
    }
    assert_eq!(per_mode.len(), modes.len(), "golden modes {per_mode:?}");
}

/// Training splits a mini-batch into micro-batches (and ranks) and adds their losses up, each
/// normalised by the mini-batch's counts: the sum must be the whole batch's loss and gradient.
#[test]
fn micro_batches_add_up_to_the_whole_batch() {
    let doc = golden();
    let mut checked = 0;
    for case in doc["cases"].as_array().unwrap() {
        let mode: PolicyLossMode = case["loss_mode"].as_str().unwrap().parse().unwrap();
        let p = &case["params"];
        // The covariance modes pick tokens by statistics of the micro-batch, as verl's do.
        if matches!(mode, PolicyLossMode::ClipCov | PolicyLossMode::KlCov) || p.get("dp_size").is_some() {
            continue;
        }
        let x = Inputs::of(&case["inputs"]);
        let mut cfg = config(case["loss_mode"].as_str().unwrap(), p);
        let seqs = x.mask.iter_rows().filter(|r| r.iter().any(|&m| m > 0.0)).count() as f64;
        cfg.agg = AggOptions {
            batch_num_tokens: Some(x.mask.data().iter().sum()),
            global_batch_size: Some(seqs),
            global_rows: Some(x.mask.rows() as f64),
            ..AggOptions::default()
        };
        if cfg.loss_agg_mode == LossAggMode::SeqMeanTokenSumNorm {
            cfg.agg.loss_scale_factor = Some(x.mask.cols() as f64);
        }
        let (whole, _, whole_grad) = run(&x, &cfg);
        let (a, b) = ([0usize, 3], [1usize, 2]);
        let (la, _, ga) = run(&x.rows(&a), &cfg);
        let (lb, _, gb) = run(&x.rows(&b), &cfg);
        let id = case["id"].as_str().unwrap();
        assert!(close(la + lb, whole), "{id}: micro-batches {la} + {lb} vs {whole}");
        let cols = x.mask.cols();
        for (part, grad) in [(a, ga), (b, gb)] {
            for (i, &row) in part.iter().enumerate() {
                for c in 0..cols {
                    let (g, w) = (grad[i * cols + c], whole_grad[row * cols + c]);
                    assert!(close(g, w), "{id}: row {row} col {c}: micro {g} vs whole {w}");
                }
            }
        }
        checked += 1;
    }
    assert!(checked >= 50, "only {checked} cases split");
}

/// Clip-Cov with more candidates than `clip_cov_ratio` allows drops the gradient of exactly
/// that many of them, picked at random but the same for the same batch.
#[test]
fn clip_cov_picks_a_reproducible_share_of_the_candidates() {
    let (b, t) = (8, 16);
    let mut seed = 11u64;
    let mut next = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let old = Mat::new(b, t, (0..b * t).map(|_| -0.1 - 2.0 * next()).collect()).unwrap();
    // On policy: nothing is clipped, so every token with a covariance in range is a candidate.
    let lp = old.clone();
    let adv = Mat::new(b, t, (0..b * t).map(|_| 4.0 * next() - 2.0).collect()).unwrap();
    let mask = Mat::full(b, t, 1.0);
    let x = Inputs { old, lp, adv, mask, weights: None };
    let cfg = PolicyLossConfig {
        loss_mode: PolicyLossMode::ClipCov,
        clip_cov_ratio: 0.05,
        clip_cov_lb: -10.0,
        clip_cov_ub: 10.0,
        ..PolicyLossConfig::default()
    };
    let (_, metrics, grad) = run(&x, &cfg);
    let want = (0.05 * (b * t) as f64) as usize;
    let dropped: Vec<usize> = (0..b * t).filter(|&k| grad[k] == 0.0).collect();
    assert_eq!(dropped.len(), want, "dropped {dropped:?}");
    assert!(close(metrics.pg_clipfrac.unwrap(), want as f64 / (b * t) as f64));
    let (_, _, again) = run(&x, &cfg);
    assert_eq!(grad, again, "the same batch picks the same tokens");
    let shifted = Inputs { adv: x.adv.map(|a| a * 1.01), ..x };
    let (_, _, other) = run(&shifted, &cfg);
    let other_dropped: Vec<usize> = (0..b * t).filter(|&k| other[k] == 0.0).collect();
    assert_eq!(other_dropped.len(), want);
    assert_ne!(dropped, other_dropped, "another batch picks other tokens");
}

#[test]
fn modes_parse_by_verl_name_and_bad_settings_are_refused() {
    for m in PolicyLossMode::ALL {
        assert_eq!(m.as_str().parse::<PolicyLossMode>().unwrap(), m);
    }
    assert_eq!("clip-cov".parse::<PolicyLossMode>().unwrap(), PolicyLossMode::ClipCov);
    let err = "bypass_mode".parse::<PolicyLossMode>().unwrap_err().to_string();
    assert!(err.contains("gspo") && err.contains("bypass_mode"), "{err}");
    let bad = [
        PolicyLossConfig { loss_mode: PolicyLossMode::Dro, ..Default::default() },
        PolicyLossConfig { loss_mode: PolicyLossMode::KlCov, kl_cov_ratio: 0.0, ..Default::default() },
        PolicyLossConfig { loss_mode: PolicyLossMode::ClipCov, clip_cov_lb: 5.0, clip_cov_ub: 1.0, ..Default::default() },
        PolicyLossConfig { loss_mode: PolicyLossMode::Sapo, tau_neg: 0.0, ..Default::default() },
    ];
    for cfg in bad {
        assert!(cfg.validate().is_err(), "{:?} accepted", cfg.loss_mode);
    }
}
