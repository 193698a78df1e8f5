//! Integration tests: the public test-vector file, the runner's robustness, the burn losses'
//! values against the f64 references, and burn gradients against finite differences.

use std::path::PathBuf;

use burn::tensor::{Device, Tensor};
use reinforge_algos::burn_ops;
use reinforge_algos::vectors::run_vector_str;
use reinforge_algos::*;
use serde_json::{json, Value};

fn vectors_path() -> PathBuf {
    match std::env::var_os("REINFORGE_TESTVECTORS") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/testvectors/rl_algorithms.json"),
    }
}

fn load_vectors() -> Value {
    let path = vectors_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("test-vector file is valid JSON")
}

#[test]
fn public_test_vectors_all_pass() {
    let path = vectors_path();
    let report = run_vector_file(&path).expect("test-vector file loads");
    let failing: Vec<String> = report
        .failures()
        .map(|c| format!("{} ({}): {}", c.id, c.function, c.detail))
        .collect();
    assert!(
        failing.is_empty(),
        "{} of {} cases failed:\n{}",
        report.failed,
        report.cases.len(),
        failing.join("\n")
    );
    assert!(report.passed > 0 && report.passed == report.cases.len());
    println!("{report}");
}

// ---------------------------------------------------------------------------------------------
// Runner robustness: cases shaped like a hidden second file.

fn doc(cases: Vec<Value>) -> String {
    json!({
        "format": "rl-algorithms-testvectors",
        "version": 1,
        "tolerance": {"rtol": 1e-6, "atol": 1e-8},
        "cases": cases,
    })
    .to_string()
}

fn case(id: &str, function: &str, inputs: Value, params: Value, expected: Value) -> Value {
    json!({"id": id, "function": function, "inputs": inputs, "params": params, "expected": expected})
}

#[test]
fn runner_handles_defaults_aliases_and_failures() {
    let lm = json!([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]);
    // GRPO group {3: [1, 0]}: mean 0.5, unbiased std sqrt(0.5); singleton 9 keeps 5/(1+eps).
    let sd = 0.5_f64.sqrt();
    let mask = json!([[1, 1, 0], [1, 0, 0]]);
    let cases = vec![
        // Missing params fall back to verl's defaults (token-mean, dp_size 1).
        case(
            "agg-default",
            "agg_loss",
            json!({"loss_mat": lm, "loss_mask": mask}),
            json!({}),
            json!({"loss": 7.0 / 3.0}),
        ),
        case(
            "agg-seq-sum",
            "agg_loss",
            json!({"loss_mat": lm, "loss_mask": mask}),
            json!({"loss_agg_mode": "seq-mean-token-sum"}),
            json!({"loss": 3.5}),
        ),
        case(
            "agg-seq-mean",
            "agg_loss",
            json!({"loss_mat": lm, "loss_mask": mask}),
            json!({"loss_agg_mode": "seq-mean-token-mean", "loss_scale_factor": null}),
            json!({"loss": (3.0 / (2.0 + 1e-8) + 4.0 / (1.0 + 1e-8)) / 2.0}),
        ),
        case(
            "agg-dp-missing",
            "agg_loss",
            json!({"loss_mat": lm, "loss_mask": mask}),
            json!({"loss_agg_mode": "seq-mean-token-sum", "dp_size": 2}),
            json!({}),
        ),
        // Integer group ids, GRPO defaults (epsilon 1e-6, std normalisation on).
        case(
            "grpo-int",
            "compute_grpo_outcome_advantage",
            json!({"token_level_rewards": [[1.0], [0.0], [5.0]], "response_mask": [[1], [1], [1]],
                    "index": [3, 3, 9]}),
            json!({}),
            json!({"advantages": [[0.5 / (sd + 1e-6)], [-0.5 / (sd + 1e-6)], [5.0 / (1.0 + 1e-6)]]}),
        ),
        // Policy loss: everything but the inputs defaulted, and global_batch_info as a dict.
        case(
            "pg-defaults",
            "compute_policy_loss",
            json!({"old_log_prob": [[-1.0, -1.0]], "log_prob": [[-1.0, -1.0]],
                    "advantages": [[1.0, -1.0]], "response_mask": [[1, 1]]}),
            json!({"global_batch_info": {"dp_size": 2, "batch_num_tokens": 4}}),
            json!({"pg_loss": 0.0, "pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0, "ppo_kl": 0.0,
                    "pg_losses": [[-1.0, 1.0]]}),
        ),
        // Non-finite encodings in inputs and outputs.
        case(
            "mm-nan",
            "masked_mean",
            json!({"values": ["NaN", 1.0], "mask": [1, 1]}),
            json!({}),
            json!({"mean": "NaN"}),
        ),
        // verl's masked_mean takes an optional axis (apply_kl_penalty uses axis=-1).
        case(
            "mm-axis",
            "masked_mean",
            json!({"values": [[1.0, 2.0], [3.0, 4.0]], "mask": [[1, 0], [1, 1]]}),
            json!({"axis": -1}),
            json!({"mean": [1.0 / (1.0 + 1e-8), 7.0 / (2.0 + 1e-8)]}),
        ),
        // Failures that must be reported, not panic.
        case(
            "unknown",
            "compute_gpg_outcome_advantage",
            json!({}),
            json!({}),
            json!({}),
        ),
        case(
            "wrong",
            "masked_mean",
            json!({"values": [1.0, 3.0], "mask": [1, 1]}),
            json!({}),
            json!({"mean": 2.5}),
        ),
        case(
            "missing-input",
            "masked_mean",
            json!({"values": [1.0]}),
            json!({}),
            json!({"mean": 1.0}),
        ),
        case(
            "shape-mismatch",
            "kl_penalty",
            json!({"logprob": [[1.0, 2.0]], "ref_logprob": [[1.0]]}),
            json!({"kl_penalty": "k1"}),
            json!({"kl": [[0.0, 0.0]]}),
        ),
        json!({"id": "err-but-ok", "function": "masked_mean", "inputs": {"values": [1.0], "mask": [1]},
               "params": {}, "expected": {}, "expect_error": "ValueError"}),
        json!({"id": "err-ok", "function": "masked_var", "inputs": {"values": [1.0, 2.0], "mask": [0, 1]},
               "params": {}, "expected": {}, "expect_error": "ValueError"}),
        json!({"id": "unknown-mode", "function": "compute_value_loss",
               "inputs": {"vpreds": [[1.0]], "returns": [[1.0]], "values": [[1.0]], "response_mask": [[1]]},
               "params": {"loss_agg_mode": "seq-sum"}, "expected": {}, "expect_error": "ValueError"}),
    ];

    let report = run_vector_str(&doc(cases)).expect("document loads");
    let status: Vec<(String, bool)> = report
        .cases
        .iter()
        .map(|c| (c.id.clone(), c.passed))
        .collect();
    let expect_pass = [
        "agg-default",
        "agg-seq-sum",
        "agg-seq-mean",
        "grpo-int",
        "pg-defaults",
        "mm-nan",
        "mm-axis",
        "err-ok",
        "unknown-mode",
    ];
    for (id, passed) in &status {
        let want = expect_pass.contains(&id.as_str());
        let detail = &report.cases.iter().find(|c| &c.id == id).unwrap().detail;
        assert_eq!(
            *passed, want,
            "case {id}: passed={passed}, detail: {detail}"
        );
    }
    assert_eq!(report.passed, expect_pass.len());
    assert_eq!(report.failed, status.len() - expect_pass.len());
    let unknown = report.cases.iter().find(|c| c.id == "unknown").unwrap();
    assert!(
        unknown.detail.contains("unknown function"),
        "{}",
        unknown.detail
    );
}

#[test]
fn runner_rejects_foreign_files() {
    assert!(run_vector_str("{\"format\": \"something-else\", \"cases\": []}").is_err());
    assert!(run_vector_str("not json").is_err());
    assert!(run_vector_file(std::path::Path::new("/nonexistent/vectors.json")).is_err());
}

#[test]
fn names_parse_with_helpful_errors() {
    assert_eq!(
        "seq-mean-token-sum-norm".parse::<LossAggMode>().unwrap(),
        LossAggMode::SeqMeanTokenSumNorm
    );
    let e = "seq-sum".parse::<LossAggMode>().unwrap_err().to_string();
    assert!(
        e.contains("token-mean") && e.contains("seq-mean-token-mean"),
        "{e}"
    );
    assert_eq!(
        "grpo".parse::<AdvantageEstimator>().unwrap(),
        AdvantageEstimator::Grpo
    );
    let e = "ppo".parse::<AdvantageEstimator>().unwrap_err().to_string();
    assert!(e.contains("reinforce_plus_plus_baseline"), "{e}");
    let p: KlPenalty = "low_var_kl+".parse().unwrap();
    assert_eq!(
        p,
        KlPenalty {
            estimator: KlEstimator::K3,
            straight_through: true
        }
    );
    assert!(matches!(
        "full".parse::<KlPenalty>(),
        Err(AlgoError::NotImplemented { .. })
    ));
    assert!(matches!(
        "k4".parse::<KlPenalty>(),
        Err(AlgoError::UnknownName { .. })
    ));
    assert_eq!("mse".parse::<KlEstimator>().unwrap(), KlEstimator::K2);
}

#[test]
fn kl_controller_round_trips_through_json() {
    let cfg = KlControllerConfig {
        kind: KlControllerKind::Adaptive,
        kl_coef: 0.1,
        target_kl: 6.0,
        horizon: 10000.0,
    };
    let mut c = KlController::from_config(&cfg).unwrap();
    c.update(12.0, 256.0);
    let s = serde_json::to_string(&c).unwrap();
    let back: KlController = serde_json::from_str(&s).unwrap();
    assert_eq!(back, c);
    assert!((c.value() - 0.100512).abs() < 1e-15);
    let bad = KlControllerConfig {
        horizon: 0.0,
        ..cfg
    };
    assert!(KlController::from_config(&bad).is_err());
}

#[test]
fn compute_advantage_dispatch_checks_required_inputs() {
    let r = Mat::from_rows(&[[0.0, 1.0], [0.0, 0.0]]).unwrap();
    let m = Mat::full(2, 2, 1.0);
    let inputs = AdvantageInputs {
        token_level_rewards: &r,
        response_mask: &m,
        values: None,
        index: None,
        reward_baselines: None,
    };
    let cfg = AdvantageConfig::default();
    assert!(compute_advantage(AdvantageEstimator::Gae, &inputs, &cfg).is_err());
    assert!(compute_advantage(AdvantageEstimator::Grpo, &inputs, &cfg).is_err());
    let out = compute_advantage(AdvantageEstimator::ReinforcePlusPlus, &inputs, &cfg).unwrap();
    assert_eq!(out.returns.data(), &[1.0, 1.0, 0.0, 0.0]);
    let idx: Vec<GroupId> = vec!["a".into(), "a".into()];
    let inputs = AdvantageInputs {
        index: Some(&idx),
        ..inputs
    };
    let out = compute_advantage(AdvantageEstimator::Rloo, &inputs, &cfg).unwrap();
    assert_eq!(out.advantages.data(), &[1.0, 1.0, -1.0, -1.0]);
    // A wrong-length index is an error, not a panic.
    let short: Vec<GroupId> = vec![1.into()];
    assert!(compute_grpo_outcome_advantage(&r, &m, &short, 1e-6, true).is_err());
}

// ---------------------------------------------------------------------------------------------
// burn versions against the f64 references, on the test-vector inputs.

fn decode(v: &Value) -> (Vec<usize>, Vec<f64>) {
    match v {
        Value::Array(items) => {
            let parts: Vec<_> = items.iter().map(decode).collect();
            let mut shape = vec![items.len()];
            if let Some((s, _)) = parts.first() {
                shape.extend(s);
            }
            (shape, parts.into_iter().flat_map(|(_, d)| d).collect())
        }
        Value::String(s) => (
            vec![],
            vec![match s.as_str() {
                "NaN" => f64::NAN,
                "Infinity" => f64::INFINITY,
                "-Infinity" => f64::NEG_INFINITY,
                other => panic!("bad number {other}"),
            }],
        ),
        other => (
            vec![],
            vec![other
                .as_f64()
                .unwrap_or_else(|| panic!("not a number: {other}"))],
        ),
    }
}

fn mat_of(v: &Value) -> Mat {
    let (shape, data) = decode(v);
    let cols = *shape.last().unwrap_or(&1);
    Mat::new(data.len() / cols.max(1), cols, data).unwrap()
}

fn close32(a: f64, e: f64) -> bool {
    (a.is_nan() && e.is_nan()) || a == e || (a - e).abs() <= 1e-5 + 1e-4 * e.abs()
}

fn assert_close_all(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(close32(g, w), "{what}[{i}]: burn {g} vs f64 {w}");
    }
}

fn agg_opts(params: &Value) -> AggOptions {
    let f = |k: &str| params.get(k).and_then(Value::as_f64);
    AggOptions {
        dp_size: f("dp_size").map_or(1, |x| x as usize),
        batch_num_tokens: f("batch_num_tokens"),
        global_batch_size: f("global_batch_size"),
        loss_scale_factor: f("loss_scale_factor"),
        global_rows: None,
    }
}

#[test]
fn burn_values_match_f64_on_test_vectors() {
    let doc = load_vectors();
    let dev = Device::flex();
    let t = |m: &Mat| burn_ops::mat_to_tensor(m, &dev);
    let mut checked = 0;
    for c in doc["cases"].as_array().unwrap() {
        if c.get("expect_error").is_some_and(|e| !e.is_null()) {
            continue;
        }
        let id = c["id"].as_str().unwrap();
        let inp = &c["inputs"];
        let p = &c["params"];
        let mode = || {
            p.get("loss_agg_mode")
                .and_then(Value::as_str)
                .unwrap_or("token-mean")
                .parse::<LossAggMode>()
                .unwrap()
        };
        match c["function"].as_str().unwrap() {
            "masked_mean" => {
                let (v, m) = (mat_of(&inp["values"]), mat_of(&inp["mask"]));
                let got =
                    burn_ops::scalar(burn_ops::masked_mean(t(&v), t(&m)).unwrap(), "t").unwrap();
                assert_close_all(id, &[got], &[masked_mean(&v, &m).unwrap()]);
            }
            "agg_loss" => {
                let (l, m) = (mat_of(&inp["loss_mat"]), mat_of(&inp["loss_mask"]));
                let opts = agg_opts(p);
                let want = agg_loss(&l, &m, mode(), &opts).unwrap();
                let got = burn_ops::agg_loss(t(&l), t(&m), mode(), &opts).unwrap();
                assert_close_all(id, &[burn_ops::scalar(got, "t").unwrap()], &[want]);
            }
            "kl_penalty" => {
                let (lp, rf) = (mat_of(&inp["logprob"]), mat_of(&inp["ref_logprob"]));
                let pen: KlPenalty = p["kl_penalty"].as_str().unwrap().parse().unwrap();
                let want = kl_penalty(&lp, &rf, pen).unwrap();
                let got =
                    burn_ops::tensor_to_mat(burn_ops::kl_penalty(t(&lp), t(&rf), pen).unwrap())
                        .unwrap();
                assert_close_all(id, got.data(), want.data());
            }
            "compute_policy_loss" => {
                let old = mat_of(&inp["old_log_prob"]);
                let lp = mat_of(&inp["log_prob"]);
                let adv = mat_of(&inp["advantages"]);
                let m = mat_of(&inp["response_mask"]);
                let w = inp
                    .get("rollout_is_weights")
                    .filter(|v| !v.is_null())
                    .map(mat_of);
                let cfg = PolicyLossConfig {
                    clip_ratio: p["clip_ratio"].as_f64().unwrap(),
                    clip_ratio_low: p.get("clip_ratio_low").and_then(Value::as_f64),
                    clip_ratio_high: p.get("clip_ratio_high").and_then(Value::as_f64),
                    clip_ratio_c: p.get("clip_ratio_c").and_then(Value::as_f64).unwrap_or(3.0),
                    loss_agg_mode: mode(),
                    agg: agg_opts(p),
                    ..PolicyLossConfig::default()
                };
                let want = compute_policy_loss(&old, &lp, &adv, &m, w.as_ref(), &cfg).unwrap();
                let got =
                    burn_ops::policy_loss(t(&old), t(&lp), t(&adv), t(&m), w.as_ref().map(t), &cfg)
                        .unwrap();
                assert_close_all(
                    id,
                    &[burn_ops::scalar(got.loss, "t").unwrap()],
                    &[want.pg_loss],
                );
                let gm = got.metrics;
                assert_close_all(
                    id,
                    &[gm.pg_clipfrac.unwrap(), gm.ppo_kl.unwrap(), gm.pg_clipfrac_lower.unwrap()],
                    &[want.pg_clipfrac, want.ppo_kl, want.pg_clipfrac_lower],
                );
                let pl = burn_ops::tensor_to_mat(got.pg_losses).unwrap();
                assert_close_all(id, pl.data(), want.pg_losses.data());
            }
            "compute_value_loss" => {
                let vp = mat_of(&inp["vpreds"]);
                let r = mat_of(&inp["returns"]);
                let v = mat_of(&inp["values"]);
                let m = mat_of(&inp["response_mask"]);
                let cfg = ValueLossConfig {
                    cliprange_value: p["cliprange_value"].as_f64().unwrap(),
                    loss_agg_mode: mode(),
                    agg: agg_opts(p),
                };
                let want = compute_value_loss(&vp, &r, &v, &m, &cfg).unwrap();
                let got = burn_ops::value_loss(t(&vp), t(&r), t(&v), t(&m), &cfg).unwrap();
                assert_close_all(
                    id,
                    &[
                        burn_ops::scalar(got.loss, "t").unwrap(),
                        got.metrics.vf_clipfrac,
                    ],
                    &[want.vf_loss, want.vf_clipfrac],
                );
            }
            f @ ("entropy_from_logits" | "logprobs_from_logits") => {
                let (shape, data) = decode(&inp["logits"]);
                let logits = Logits::new(shape[0], shape[1], shape[2], data).unwrap();
                let lt = burn_ops::logits_to_tensor(&logits, &dev);
                let (want, got) = if f == "entropy_from_logits" {
                    (
                        entropy_from_logits(&logits),
                        burn_ops::entropy_from_logits(lt),
                    )
                } else {
                    let (ls, ld) = decode(&inp["labels"]);
                    let labels =
                        Labels::new(ls[0], ls[1], ld.iter().map(|&x| x as i64).collect()).unwrap();
                    let lbt = burn_ops::labels_to_tensor(&labels, &dev);
                    (
                        logprobs_from_logits(&logits, &labels).unwrap(),
                        burn_ops::logprobs_from_logits(lt, lbt).unwrap(),
                    )
                };
                assert_close_all(
                    id,
                    burn_ops::tensor_to_mat(got).unwrap().data(),
                    want.data(),
                );
            }
            _ => continue,
        }
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} cases compared");
}

#[test]
fn burn_rejects_bad_shapes_and_labels() {
    let dev = Device::flex();
    let a = burn_ops::mat_to_tensor(&Mat::zeros(2, 3), &dev);
    let b = burn_ops::mat_to_tensor(&Mat::zeros(2, 2), &dev);
    let cfg = PolicyLossConfig::default();
    assert!(burn_ops::policy_loss(a.clone(), a.clone(), a.clone(), b.clone(), None, &cfg).is_err());
    assert!(burn_ops::value_loss(
        a.clone(),
        a.clone(),
        b.clone(),
        a.clone(),
        &ValueLossConfig::default()
    )
    .is_err());
    assert!(
        burn_ops::agg_loss(a.clone(), b, LossAggMode::TokenMean, &AggOptions::default()).is_err()
    );
    let bad_c = PolicyLossConfig {
        clip_ratio_c: 1.0,
        ..cfg
    };
    assert!(burn_ops::policy_loss(a.clone(), a.clone(), a.clone(), a, None, &bad_c).is_err());
    let logits = burn_ops::logits_to_tensor(&Logits::new(1, 2, 3, vec![0.0; 6]).unwrap(), &dev);
    let labels = burn_ops::labels_to_tensor(&Labels::new(1, 2, vec![0, 3]).unwrap(), &dev);
    assert!(burn_ops::logprobs_from_logits(logits, labels).is_err());
}

// ---------------------------------------------------------------------------------------------
// Gradients: burn autodiff (f32) against central finite differences of the f64 reference.

/// Deterministic pseudo-random numbers (no `rand` dependency needed for tests).
struct Lcg(u64);
impl Lcg {
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        lo + (hi - lo) * ((self.0 >> 11) as f64 / (1u64 << 53) as f64)
    }
}

const FD_EPS: f64 = 1e-3;

fn fd_grad(x: &Mat, f: impl Fn(&Mat) -> f64) -> Vec<f64> {
    (0..x.len())
        .map(|k| {
            let mut plus = x.data().to_vec();
            let mut minus = x.data().to_vec();
            plus[k] += FD_EPS;
            minus[k] -= FD_EPS;
            let p = Mat::new(x.rows(), x.cols(), plus).unwrap();
            let m = Mat::new(x.rows(), x.cols(), minus).unwrap();
            (f(&p) - f(&m)) / (2.0 * FD_EPS)
        })
        .collect()
}

fn assert_grad_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-2 * w.abs() + 2e-4,
            "{what}: d/dx[{i}] burn {g} vs finite-difference {w}"
        );
    }
}

fn autodiff_device() -> Device {
    Device::flex().autodiff()
}

fn burn_grad(x: &Mat, dev: &Device, f: impl FnOnce(Tensor<2>) -> Tensor<1>) -> Vec<f64> {
    let leaf = burn_ops::mat_to_tensor(x, dev).require_grad();
    let loss = f(leaf.clone());
    let grads = loss.backward();
    let g = leaf.grad(&grads).expect("leaf has a gradient");
    burn_ops::tensor_to_mat(g).unwrap().into_data()
}

fn agg_variants() -> Vec<(LossAggMode, AggOptions)> {
    let d = AggOptions::default();
    vec![
        (LossAggMode::TokenMean, d),
        (
            LossAggMode::TokenMean,
            AggOptions {
                dp_size: 2,
                batch_num_tokens: Some(20.0),
                ..d
            },
        ),
        (LossAggMode::TokenSum, AggOptions { dp_size: 4, ..d }),
        (LossAggMode::SeqMeanTokenSum, d),
        (LossAggMode::SeqMeanTokenSumNorm, d),
        (
            LossAggMode::SeqMeanTokenSumNorm,
            AggOptions {
                loss_scale_factor: Some(3.0),
                ..d
            },
        ),
        (LossAggMode::SeqMeanTokenMean, d),
        (
            LossAggMode::SeqMeanTokenMean,
            AggOptions {
                dp_size: 2,
                global_batch_size: Some(8.0),
                ..d
            },
        ),
    ]
}

/// Mask with a padded tail, a middle gap and one all-masked row.
fn test_mask() -> Mat {
    Mat::from_rows(&[
        [1.0, 1.0, 1.0, 1.0, 0.0],
        [1.0, 0.0, 1.0, 1.0, 1.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [1.0, 1.0, 1.0, 0.0, 0.0],
    ])
    .unwrap()
}

#[test]
fn agg_loss_gradients_match_finite_differences() {
    let dev = autodiff_device();
    let mut rng = Lcg(7);
    let mask = test_mask();
    let loss = Mat::new(4, 5, (0..20).map(|_| rng.uniform(-2.0, 2.0)).collect()).unwrap();
    for (mode, opts) in agg_variants() {
        let want = fd_grad(&loss, |l| agg_loss(l, &mask, mode, &opts).unwrap());
        let mt = burn_ops::mat_to_tensor(&mask, &dev);
        let got = burn_grad(&loss, &dev, |l| {
            burn_ops::agg_loss(l, mt, mode, &opts).unwrap()
        });
        assert_grad_close(&format!("agg_loss {mode} {opts:?}"), &got, &want);
    }
}

#[test]
fn policy_loss_gradients_match_finite_differences() {
    let dev = autodiff_device();
    let mask = test_mask();
    let mut cfgs = Vec::new();
    for (mode, agg) in agg_variants() {
        cfgs.push(PolicyLossConfig {
            loss_agg_mode: mode,
            agg,
            ..PolicyLossConfig::default()
        });
    }
    cfgs.push(PolicyLossConfig {
        clip_ratio_low: Some(0.1),
        clip_ratio_high: Some(0.28),
        clip_ratio_c: 2.0,
        ..PolicyLossConfig::default()
    });
    for (ci, cfg) in cfgs.iter().enumerate() {
        let (low, high) = cfg.clip_range();
        let kinks = [(1.0 - low).ln(), (1.0 + high).ln(), cfg.clip_ratio_c.ln()];
        let mut rng = Lcg(100 + ci as u64);
        let n = mask.len();
        let old: Vec<f64> = (0..n).map(|_| rng.uniform(-2.5, -0.1)).collect();
        let lp: Vec<f64> = old
            .iter()
            .map(|&o| loop {
                let r = rng.uniform(-1.2, 1.5);
                if kinks.iter().all(|k| (r - k).abs() > 0.02) {
                    break o + r;
                }
            })
            .collect();
        let adv: Vec<f64> = (0..n)
            .map(|_| {
                let a = rng.uniform(0.2, 2.0);
                if rng.uniform(0.0, 1.0) < 0.5 {
                    -a
                } else {
                    a
                }
            })
            .collect();
        let weights: Vec<f64> = (0..n).map(|_| rng.uniform(0.5, 1.5)).collect();
        let (old, lp, adv, w) = (
            Mat::new(4, 5, old).unwrap(),
            Mat::new(4, 5, lp).unwrap(),
            Mat::new(4, 5, adv).unwrap(),
            Mat::new(4, 5, weights).unwrap(),
        );
        for weighted in [false, true] {
            let wr = weighted.then_some(&w);
            let f64_out = compute_policy_loss(&old, &lp, &adv, &mask, wr, cfg).unwrap();
            assert!(f64_out.pg_clipfrac > 0.0, "inputs should exercise the clip");
            let want = fd_grad(&lp, |x| {
                compute_policy_loss(&old, x, &adv, &mask, wr, cfg)
                    .unwrap()
                    .pg_loss
            });
            let t = |m: &Mat| burn_ops::mat_to_tensor(m, &dev);
            let got = burn_grad(&lp, &dev, |x| {
                burn_ops::policy_loss(t(&old), x, t(&adv), t(&mask), wr.map(t), cfg)
                    .unwrap()
                    .loss
            });
            assert_grad_close(
                &format!("policy loss cfg {ci} weighted={weighted}"),
                &got,
                &want,
            );
        }
    }
}

#[test]
fn value_loss_gradients_match_finite_differences() {
    let dev = autodiff_device();
    let mask = test_mask();
    for (ci, (mode, agg)) in agg_variants().into_iter().enumerate() {
        let cfg = ValueLossConfig {
            cliprange_value: 0.3,
            loss_agg_mode: mode,
            agg,
        };
        let mut rng = Lcg(500 + ci as u64);
        let n = mask.len();
        let (mut vp, mut ret, mut old) = (Vec::new(), Vec::new(), Vec::new());
        while vp.len() < n {
            let o = rng.uniform(-1.0, 1.0);
            let v = o + rng.uniform(-0.8, 0.8);
            let r = rng.uniform(-1.5, 1.5);
            let vclip = v.min(o + 0.3).max(o - 0.3);
            // Keep clear of the clip boundary and of the max() switch point.
            if ((v - o).abs() - 0.3).abs() < 0.02
                || ((v - r).abs() - (vclip - r).abs()).abs() < 0.02 && vclip != v
            {
                continue;
            }
            vp.push(v);
            ret.push(r);
            old.push(o);
        }
        let (vp, ret, old) = (
            Mat::new(4, 5, vp).unwrap(),
            Mat::new(4, 5, ret).unwrap(),
            Mat::new(4, 5, old).unwrap(),
        );
        let want = fd_grad(&vp, |x| {
            compute_value_loss(x, &ret, &old, &mask, &cfg)
                .unwrap()
                .vf_loss
        });
        let t = |m: &Mat| burn_ops::mat_to_tensor(m, &dev);
        let got = burn_grad(&vp, &dev, |x| {
            burn_ops::value_loss(x, t(&ret), t(&old), t(&mask), &cfg)
                .unwrap()
                .loss
        });
        assert_grad_close(&format!("value loss {mode} {agg:?}"), &got, &want);
    }
}

#[test]
fn kl_gradients_match_finite_differences_and_straight_through() {
    let dev = autodiff_device();
    let mut rng = Lcg(42);
    let lp = Mat::new(3, 4, (0..12).map(|_| rng.uniform(-3.0, -0.2)).collect()).unwrap();
    let rf = Mat::new(3, 4, (0..12).map(|_| rng.uniform(-3.0, -0.2)).collect()).unwrap();
    let wts = Mat::new(3, 4, (0..12).map(|_| rng.uniform(0.5, 1.5)).collect()).unwrap();
    let weighted_sum = |k: &Mat| {
        k.data()
            .iter()
            .zip(wts.data())
            .map(|(a, b)| a * b)
            .sum::<f64>()
    };
    for est in [
        KlEstimator::K1,
        KlEstimator::Abs,
        KlEstimator::K2,
        KlEstimator::K3,
    ] {
        for st in [false, true] {
            let pen = KlPenalty {
                estimator: est,
                straight_through: st,
            };
            // Straight-through: the gradient is k2's whatever the named estimator.
            let grad_est = if st { KlEstimator::K2 } else { est };
            let want = fd_grad(&lp, |x| {
                weighted_sum(&kl_penalty(x, &rf, grad_est.into()).unwrap())
            });
            let t = |m: &Mat| burn_ops::mat_to_tensor(m, &dev);
            let got = burn_grad(&lp, &dev, |x| {
                (burn_ops::kl_penalty(x, t(&rf), pen).unwrap() * t(&wts)).sum()
            });
            assert_grad_close(&format!("kl {pen}"), &got, &want);
            // ...while the forward value stays the named estimator's.
            let val = burn_ops::tensor_to_mat(burn_ops::kl_penalty(t(&lp), t(&rf), pen).unwrap())
                .unwrap();
            assert_close_all(
                &format!("kl value {pen}"),
                val.data(),
                kl_penalty(&lp, &rf, pen).unwrap().data(),
            );
        }
    }
}

#[test]
fn entropy_and_logprob_gradients_match_finite_differences() {
    let dev = autodiff_device();
    let mut rng = Lcg(9);
    let (b, t, v) = (2, 3, 4);
    let z: Vec<f64> = (0..b * t * v).map(|_| rng.uniform(-3.0, 3.0)).collect();
    let labels = Labels::new(b, t, (0..b * t).map(|i| (i % v) as i64).collect()).unwrap();
    let wts: Vec<f64> = (0..b * t).map(|_| rng.uniform(0.5, 1.5)).collect();
    // Logits flattened to a (b*t, v) Mat so the finite-difference helper can perturb them.
    let zm = Mat::new(b * t, v, z).unwrap();
    let as_logits = |m: &Mat| Logits::new(b, t, v, m.data().to_vec()).unwrap();
    let wsum = |m: &Mat| m.data().iter().zip(&wts).map(|(a, w)| a * w).sum::<f64>();
    let wt = burn_ops::mat_to_tensor(&Mat::new(b, t, wts.clone()).unwrap(), &dev);

    let want = fd_grad(&zm, |m| wsum(&entropy_from_logits(&as_logits(m))));
    let got = burn_grad(&zm, &dev, |x| {
        (burn_ops::entropy_from_logits(x.reshape([b, t, v])) * wt.clone()).sum()
    });
    assert_grad_close("entropy", &got, &want);

    let want = fd_grad(&zm, |m| {
        wsum(&logprobs_from_logits(&as_logits(m), &labels).unwrap())
    });
    let lt = burn_ops::labels_to_tensor(&labels, &dev);
    let got = burn_grad(&zm, &dev, |x| {
        (burn_ops::logprobs_from_logits(x.reshape([b, t, v]), lt).unwrap() * wt.clone()).sum()
    });
    assert_grad_close("logprobs", &got, &want);
}
