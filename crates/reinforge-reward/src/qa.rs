//! Open-domain QA reward (SQuAD normalisation; Search-R1's `qa_em`).
//!
//! The answer is the last `<answer>...</answer>` block. Search-R1 skips the
//! first match because it scores prompt+response and its prompt contains an
//! example `<answer>`; here only the response is scored, so the last block of
//! the response is used directly.
//!
//! Score = `format_score + (score - format_score) * m` where `m` is the chosen
//! metric (EM/SubEM are 0 or 1, F1 in [0, 1]), maxed over all gold answers;
//! no answer block scores 0. With the defaults (1.0 / 0.0) that is exactly
//! Search-R1's `compute_score_em`.

use std::collections::HashMap;
use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{AnswerExtract, RewardError, RewardFn, RewardInput, RewardOutput};

/// Which match metric drives the score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QaMetric {
    /// Normalised exact match.
    #[default]
    Em,
    /// SQuAD token-level F1.
    F1,
    /// Some normalised gold answer is a substring of the normalised prediction (Search-R1 `subem`).
    Subem,
    /// Some normalised gold answer is inside one of the response's `<information>` blocks
    /// (Search-R1's `is_retrieval_correct`): the search found the evidence, whatever the answer.
    Retrieved,
}

/// Parameters of [`QaReward`] (`kind = "qa"`, `"qa_em"`, `"qa_f1"` or `"qa_subem"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QaConfig {
    /// Metric; fixed by the `qa_em`/`qa_f1`/`qa_subem` kinds, free with `qa`.
    pub metric: QaMetric,
    /// Where the answer is read from.
    pub extract: AnswerExtract,
    /// Reward at metric 1.
    pub score: f64,
    /// Reward at metric 0 with an answer present.
    pub format_score: f64,
    /// Longer answers score as metric 0 (stops SubEM being gamed by dumping text).
    pub max_answer_chars: usize,
    /// Search-R1's `retrieval_score` (`qa_em_format.py`): when the answer is wrong or
    /// missing, at least this much if a gold answer appears in one of the response's
    /// `<information>…</information>` blocks (the search found it). 0 turns it off.
    pub retrieval_score: f64,
}

impl Default for QaConfig {
    fn default() -> Self {
        QaConfig {
            metric: QaMetric::Em,
            extract: AnswerExtract::default(),
            score: 1.0,
            format_score: 0.0,
            max_answer_chars: 2000,
            retrieval_score: 0.0,
        }
    }
}

/// QA reward; details: `format`, `em`, `f1`, `subem`.
#[derive(Debug, Clone)]
pub struct QaReward {
    name: &'static str,
    cfg: QaConfig,
}

impl Default for QaReward {
    /// The default config (always valid).
    fn default() -> Self {
        QaReward {
            name: "qa_em",
            cfg: QaConfig::default(),
        }
    }
}

impl QaReward {
    /// Validates the config.
    pub fn new(cfg: QaConfig) -> Result<Self, RewardError> {
        if !cfg.score.is_finite() || !cfg.format_score.is_finite() || !cfg.retrieval_score.is_finite() {
            return Err(RewardError::config(
                "qa",
                "score, format_score and retrieval_score must be finite",
            ));
        }
        cfg.extract.validate("qa")?;
        let name = match cfg.metric {
            QaMetric::Em => "qa_em",
            QaMetric::F1 => "qa_f1",
            QaMetric::Subem => "qa_subem",
            QaMetric::Retrieved => "qa_retrieved",
        };
        Ok(QaReward { name, cfg })
    }
}

impl RewardFn for QaReward {
    fn name(&self) -> &str {
        self.name
    }

    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError> {
        let golds = qa_ground_truths(&sample.ground_truth)
            .map_err(|m| RewardError::ground_truth(self.name, &sample.data_source, m))?;
        let wanted = self.cfg.retrieval_score != 0.0 || self.cfg.metric == QaMetric::Retrieved;
        let retrieved = if wanted { f64::from(u8::from(retrieval_correct(&sample.response, &golds))) } else { 0.0 };
        if self.cfg.metric == QaMetric::Retrieved {
            let score = self.cfg.format_score + (self.cfg.score - self.cfg.format_score) * retrieved;
            return Ok(RewardOutput::new(score).with("retrieved", retrieved));
        }
        let floor = |score: f64| if retrieved > 0.0 { score.max(self.cfg.retrieval_score) } else { score };
        let Some(pred) = self.cfg.extract.extract(&sample.response) else {
            return Ok(RewardOutput::new(floor(0.0))
                .with("format", 0.0)
                .with("em", 0.0)
                .with("f1", 0.0)
                .with("subem", 0.0)
                .with("retrieved", retrieved));
        };
        let (mut em, mut f1, mut subem) = (0.0f64, 0.0f64, 0.0f64);
        if pred.chars().count() <= self.cfg.max_answer_chars {
            let p = normalize_answer(pred);
            for g in &golds {
                let g = normalize_answer(g);
                em = em.max(f64::from(u8::from(p == g)));
                subem = subem.max(f64::from(u8::from(p.contains(g.as_str()))));
                f1 = f1.max(f1_normalized(&p, &g));
            }
        }
        let m = match self.cfg.metric {
            QaMetric::Em => em,
            QaMetric::F1 => f1,
            QaMetric::Subem => subem,
            QaMetric::Retrieved => retrieved,
        };
        let mut score = self.cfg.format_score + (self.cfg.score - self.cfg.format_score) * m;
        if m < 1.0 {
            score = floor(score);
        }
        Ok(RewardOutput::new(score)
            .with("format", 1.0)
            .with("em", em)
            .with("f1", f1)
            .with("subem", subem)
            .with("retrieved", retrieved))
    }
}

/// Whether a gold answer (normalised) is inside one of the `<information>…</information>`
/// blocks of `response` (normalised): Search-R1's `is_retrieval_correct`.
pub fn retrieval_correct(response: &str, golds: &[String]) -> bool {
    let mut rest = response;
    while let Some(start) = rest.find("<information>") {
        let after = &rest[start + "<information>".len()..];
        let Some(end) = after.find("</information>") else { break };
        let block = normalize_answer(&after[..end]);
        if golds.iter().map(|g| normalize_answer(g)).any(|g| !g.is_empty() && block.contains(&g)) {
            return true;
        }
        rest = &after[end..];
    }
    false
}

/// Gold answers: a string, number, list of those, or an object holding one
/// under `target` (Search-R1), `answers`, `answer` or `text` (SQuAD).
fn qa_ground_truths(gt: &Value) -> Result<Vec<String>, String> {
    fn one(v: &Value) -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
    let v = match gt {
        Value::Object(o) => ["target", "answers", "answer", "text"]
            .iter()
            .find_map(|k| o.get(*k))
            .ok_or("object ground_truth needs a `target`, `answers`, `answer` or `text` key")?,
        v => v,
    };
    let golds: Vec<String> = match v {
        Value::Array(items) => items
            .iter()
            .map(|i| one(i).ok_or("gold answers must be strings or numbers"))
            .collect::<Result<_, _>>()?,
        v => vec![one(v).ok_or("expected a string, number, list or {\"target\": [...]}")?],
    };
    if golds.is_empty() {
        return Err("empty list of gold answers".into());
    }
    Ok(golds)
}

fn articles_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"\b(a|an|the)\b").expect("static regex"))
}

/// SQuAD's `normalize_answer`: lowercase, drop ASCII punctuation, drop the
/// articles a/an/the (whole words), collapse whitespace.
pub fn normalize_answer(s: &str) -> String {
    let lower = s.to_lowercase();
    let no_punct: String = lower
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    let no_articles = articles_re().replace_all(&no_punct, " ");
    no_articles.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Normalised exact match.
pub fn exact_match(prediction: &str, gold: &str) -> bool {
    normalize_answer(prediction) == normalize_answer(gold)
}

/// SQuAD token F1 between a prediction and one gold answer.
///
/// As in the HotpotQA evaluator, `yes`/`no`/`noanswer` must match exactly
/// (otherwise "yes" would earn partial credit against "yes it is").
pub fn f1_score(prediction: &str, gold: &str) -> f64 {
    f1_normalized(&normalize_answer(prediction), &normalize_answer(gold))
}

fn f1_normalized(p: &str, g: &str) -> f64 {
    const SPECIAL: [&str; 3] = ["yes", "no", "noanswer"];
    if (SPECIAL.contains(&p) || SPECIAL.contains(&g)) && p != g {
        return 0.0;
    }
    let pt: Vec<&str> = p.split_whitespace().collect();
    let gt: Vec<&str> = g.split_whitespace().collect();
    if pt.is_empty() || gt.is_empty() {
        // SQuAD v2 convention: two empty answers agree.
        return f64::from(u8::from(pt.is_empty() && gt.is_empty()));
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for t in &gt {
        *counts.entry(t).or_default() += 1;
    }
    let mut same = 0usize;
    for t in &pt {
        if let Some(c) = counts.get_mut(t) {
            if *c > 0 {
                *c -= 1;
                same += 1;
            }
        }
    }
    if same == 0 {
        return 0.0;
    }
    let precision = same as f64 / pt.len() as f64;
    let recall = same as f64 / gt.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qa(metric: QaMetric) -> QaReward {
        QaReward::new(QaConfig {
            metric,
            ..QaConfig::default()
        })
        .unwrap()
    }

    fn run(r: &QaReward, resp: &str, gt: Value) -> RewardOutput {
        r.score(&RewardInput::new("nq", resp, gt)).unwrap()
    }

    #[test]
    fn retrieval_score_credits_a_search_that_found_the_answer() {
        let r = QaReward::new(QaConfig { retrieval_score: 0.3, ..QaConfig::default() }).unwrap();
        let gt = json!({"target": ["blue"]});
        let found = "<search> quenul </search>\n\n<information>Doc 1(Title: \"Quenul\") The quenul is Blue.</information>\n\n";
        assert_eq!(run(&r, &format!("{found}<answer> red </answer>"), gt.clone()).score, 0.3);
        assert_eq!(run(&r, found, gt.clone()).score, 0.3, "no answer yet, but the passage is found");
        assert_eq!(run(&r, &format!("{found}<answer> blue </answer>"), gt.clone()).score, 1.0);
        let missed = "<information>The velkov is green.</information><answer> red </answer>";
        assert_eq!(run(&r, missed, gt.clone()).score, 0.0);
        assert_eq!(run(&r, "<information>bluebird</information>", gt.clone()).score, 0.3, "substring, as Search-R1's");
        assert_eq!(run(&qa(QaMetric::Em), &format!("{found}<answer> red </answer>"), gt.clone()).score, 0.0, "off by default");
        // As a metric of its own: the evidence was retrieved, whatever the answer.
        let r = qa(QaMetric::Retrieved);
        assert_eq!(run(&r, &format!("{found}<answer> red </answer>"), gt.clone()).score, 1.0);
        assert_eq!(run(&r, found, gt.clone()).score, 1.0);
        assert_eq!(run(&r, missed, gt).score, 0.0);
    }

    #[test]
    fn squad_normalisation() {
        assert_eq!(normalize_answer("The  Eiffel-Tower!"), "eiffeltower");
        assert_eq!(
            normalize_answer("A cat, an apple; the end."),
            "cat apple end"
        );
        assert_eq!(normalize_answer("theater Anna"), "theater anna");
        assert_eq!(normalize_answer("  "), "");
        assert_eq!(
            normalize_answer("ÉCOLE Ünïcode — 日本"),
            "école ünïcode — 日本"
        );
        assert!(exact_match("the Beatles", "Beatles."));
    }

    #[test]
    fn f1_values() {
        assert_eq!(f1_score("Barack Obama", "barack obama"), 1.0);
        assert!((f1_score("president Barack Obama", "Barack Obama") - 0.8).abs() < 1e-12);
        assert_eq!(f1_score("John", "Paul"), 0.0);
        assert_eq!(f1_score("yes", "yes it is"), 0.0);
        assert_eq!(f1_score("the", ""), 1.0);
        assert_eq!(f1_score("x", ""), 0.0);
        // Repeated tokens only count as often as they appear in the gold answer.
        assert!((f1_score("x b b b", "b c") - (2.0 * 0.25 * 0.5 / 0.75)).abs() < 1e-12);
    }

    #[test]
    fn search_r1_em() {
        let r = qa(QaMetric::Em);
        let gt = json!({"target": ["Paris", "Paris, France"]});
        let out = run(&r, "<think>..</think><search>q</search><information>x</information><answer> paris </answer>", gt.clone());
        assert_eq!((out.score, out.detail("em")), (1.0, Some(1.0)));
        assert_eq!(
            run(&r, "<answer>Paris France</answer>", gt.clone()).score,
            1.0
        );
        assert_eq!(run(&r, "<answer>Lyon</answer>", gt.clone()).score, 0.0);
        assert_eq!(run(&r, "Paris", gt.clone()).detail("format"), Some(0.0));
        // Last answer counts.
        assert_eq!(
            run(
                &r,
                "<answer>Paris</answer><answer>Lyon</answer>",
                gt.clone()
            )
            .score,
            0.0
        );
        assert_eq!(run(&r, "<answer>Paris", gt).score, 0.0);
        assert_eq!(run(&r, "<answer>1969</answer>", json!(1969)).score, 1.0);
        assert_eq!(run(&r, "<answer>b</answer>", json!(["a", "b"])).score, 1.0);
        assert_eq!(run(&r, "<answer>b</answer>", json!("b")).score, 1.0);
    }

    #[test]
    fn f1_and_subem_scoring() {
        let f1 = QaReward::new(QaConfig {
            metric: QaMetric::F1,
            format_score: 0.2,
            ..QaConfig::default()
        })
        .unwrap();
        let out = run(
            &f1,
            "<answer>president Barack Obama</answer>",
            json!(["Barack Obama"]),
        );
        assert!((out.score - (0.2 + 0.8 * 0.8)).abs() < 1e-12);
        assert_eq!(
            run(&f1, "<answer>nobody</answer>", json!(["Barack Obama"])).score,
            0.2
        );
        assert_eq!(run(&f1, "nobody", json!(["Barack Obama"])).score, 0.0);
        let sub = qa(QaMetric::Subem);
        assert_eq!(
            run(
                &sub,
                "<answer>it was Barack Obama.</answer>",
                json!("Barack Obama")
            )
            .score,
            1.0
        );
        // Dumping a huge blob into the answer cannot game substring match.
        let blob = format!("<answer>{} Barack Obama</answer>", "word ".repeat(1000));
        assert_eq!(run(&sub, &blob, json!("Barack Obama")).score, 0.0);
    }

    #[test]
    fn adversarial() {
        let r = qa(QaMetric::F1);
        let mb = "ä ".repeat(1 << 19);
        for resp in [
            String::new(),
            mb.clone(),
            format!("<answer>{mb}</answer>"),
            "<answer>".repeat(100_000),
            "</answer>".repeat(100_000),
            "<answer>🎉 the</answer>".to_string(),
            "<answer>\u{0}</answer>".to_string(),
        ] {
            let out = run(&r, &resp, json!(["x"]));
            assert!((0.0..=1.0).contains(&out.score));
        }
    }

    #[test]
    fn bad_ground_truth() {
        let r = qa(QaMetric::Em);
        for gt in [
            Value::Null,
            json!([]),
            json!({"foo": 1}),
            json!([null]),
            json!(true),
        ] {
            assert!(matches!(
                r.score(&RewardInput::new("nq", "<answer>x</answer>", gt)),
                Err(RewardError::InvalidGroundTruth { .. })
            ));
        }
    }

    #[test]
    fn names_follow_metric() {
        assert_eq!(qa(QaMetric::Em).name(), "qa_em");
        assert_eq!(qa(QaMetric::F1).name(), "qa_f1");
        assert_eq!(qa(QaMetric::Subem).name(), "qa_subem");
    }
}
