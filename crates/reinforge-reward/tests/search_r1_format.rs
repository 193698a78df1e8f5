//! Search-R1's format reward (`qa_em_format.py`) against goldens its own code computed
//! (`data/make_search_r1_format_golden.py`): structure, final and retrieval scores over
//! valid and broken trajectories, right, wrong and missing answers.

use reinforge_reward::{valid_search_sequence, QaConfig, QaReward, RewardFn, RewardInput};
use serde_json::Value;

#[test]
fn qa_em_with_format_scores_matches_search_r1() {
    let golden: Value = serde_json::from_str(include_str!("data/search_r1_format.json")).unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 200);
    let mut failures = Vec::new();
    for c in cases {
        let response = c["response"].as_str().unwrap();
        let num = |k: &str| c[k].as_f64().unwrap();
        let reward = QaReward::new(QaConfig {
            structure_format_score: num("structure_format_score"),
            final_format_score: num("final_format_score"),
            retrieval_score: num("retrieval_score"),
            ..QaConfig::default()
        })
        .unwrap();
        let got = reward.score(&RewardInput::new("nq", response, c["ground_truth"].clone())).unwrap();
        let valid = c["valid_structure"].as_bool().unwrap();
        if (got.score - num("score")).abs() > 1e-12 || valid_search_sequence(response) != valid {
            failures.push(format!("{response:?} {}: got {} (structure {}), Search-R1 {} (structure {valid})", c["ground_truth"], got.score, valid_search_sequence(response), num("score")));
        }
    }
    assert!(failures.is_empty(), "{} of {} differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
