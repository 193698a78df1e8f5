//! GPG's advantage against verl 0.9.1's `compute_gpg_outcome_advantage` (float64), from
//! `tests/data/gpg_advantage.json` (written by `make_gpg_golden.py`).

use reinforge_algos::*;
use serde_json::Value;

fn mat(v: &Value) -> Mat {
    let rows: Vec<Vec<f64>> = v
        .as_array()
        .expect("a matrix")
        .iter()
        .map(|r| r.as_array().expect("a row").iter().map(|x| x.as_f64().expect("a number")).collect())
        .collect();
    Mat::from_rows(&rows).expect("rectangular")
}

#[test]
fn gpg_matches_verl() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/gpg_advantage.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let id = case["id"].as_str().unwrap();
        let inp = &case["inputs"];
        let index: Vec<GroupId> = inp["index"].as_array().unwrap().iter().map(|s| GroupId::Str(s.as_str().unwrap().into())).collect();
        let (r, m) = (mat(&inp["token_level_rewards"]), mat(&inp["response_mask"]));
        let inputs = AdvantageInputs { token_level_rewards: &r, response_mask: &m, values: None, index: Some(&index), reward_baselines: None };
        let out = compute_advantage(AdvantageEstimator::Gpg, &inputs, &AdvantageConfig::default()).unwrap();
        for (name, got, want) in [("advantages", &out.advantages, mat(&case["expected"]["advantages"])), ("returns", &out.returns, mat(&case["expected"]["returns"]))] {
            for (k, (&g, &w)) in got.data().iter().zip(want.data()).enumerate() {
                assert!((g - w).abs() <= 1e-12 + 1e-9 * w.abs(), "{id} {name}[{k}]: {g} vs verl {w}");
            }
        }
    }
    assert_eq!("gpg".parse::<AdvantageEstimator>().unwrap(), AdvantageEstimator::Gpg);
}
