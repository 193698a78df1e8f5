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
//! Search-R1's `compute_score_em` (`qa_em.py`).
//!
//! With any of `structure_format_score`, `final_format_score` or `retrieval_score`
//! set, the score is Search-R1's `qa_em_format.py` instead: the response's structure
//! (think → search → information → … → answer, nothing but whitespace between blocks)
//! and whether a retrieved passage holds the answer earn part of the reward
//! ([`QaReward::score`] has the table).

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
    /// Search-R1's `retrieval_score` (`qa_em_format.py`): added to
    /// `structure_format_score` when the answer is wrong but the structure is valid and a
    /// gold answer appears in one of the response's `<information>…</information>` blocks
    /// (the search found it).
    pub retrieval_score: f64,
    /// Search-R1's `structure_format_score`: the reward of a well-structured response
    /// whose answer is wrong, and what a right answer loses when the structure is broken.
    pub structure_format_score: f64,
    /// Search-R1's `final_format_score`: the reward of a wrong answer in a broken structure.
    pub final_format_score: f64,
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
            structure_format_score: 0.0,
            final_format_score: 0.0,
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
        let numbers = [cfg.score, cfg.format_score, cfg.retrieval_score, cfg.structure_format_score, cfg.final_format_score];
        if !numbers.iter().all(|x| x.is_finite()) {
            return Err(RewardError::config(
                "qa",
                "score, format_score, retrieval_score, structure_format_score and final_format_score must be finite",
            ));
        }
        if cfg.search_r1_format() {
            if !matches!(cfg.metric, QaMetric::Em | QaMetric::Subem) {
                return Err(RewardError::config(
                    "qa",
                    "Search-R1's format scores (structure_format_score, final_format_score, retrieval_score) grade a right-or-wrong answer: use metric em or subem",
                ));
            }
            if cfg.format_score != 0.0 {
                return Err(RewardError::config(
                    "qa",
                    "format_score does not apply with Search-R1's format scores (its qa_em_format ignores it): a wrong answer earns structure_format_score or final_format_score",
                ));
            }
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

impl QaConfig {
    /// Whether Search-R1's `qa_em_format` scoring applies (any of its three scores set).
    pub fn search_r1_format(&self) -> bool {
        self.structure_format_score != 0.0 || self.final_format_score != 0.0 || self.retrieval_score != 0.0
    }
}

impl QaReward {
    /// Search-R1's `qa_em_format.compute_score_em`, with `right` the metric's verdict.
    /// `s`, `f`, `r`: the structure, final and retrieval scores.
    ///
    /// | answer | structure valid | structure broken |
    /// |---|---|---|
    /// | right | `score` | `score - s` |
    /// | wrong, passage found | `s + r` | `f` |
    /// | wrong, not found | `s` | `f` |
    ///
    /// A response without an answer block is a wrong answer: Search-R1 scores prompt and
    /// response together, and its prompt's own example (`<answer> Beijing </answer>`) is
    /// the last answer it finds then (its "no answer" branch never runs with its prompt).
    fn search_r1_format_score(&self, right: bool, valid: bool, retrieved: bool) -> f64 {
        let c = &self.cfg;
        match (right, valid) {
            (true, true) => c.score,
            (true, false) => c.score - c.structure_format_score,
            (false, true) => c.structure_format_score + if retrieved { c.retrieval_score } else { 0.0 },
            (false, false) => c.final_format_score,
        }
    }
}

impl RewardFn for QaReward {
    fn name(&self) -> &str {
        self.name
    }

    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError> {
        let golds = qa_ground_truths(&sample.ground_truth)
            .map_err(|m| RewardError::ground_truth(self.name, &sample.data_source, m))?;
        let format_mode = self.cfg.search_r1_format();
        // Search-R1 checks retrieval only in a valid structure.
        let valid = format_mode && valid_search_sequence(&sample.response);
        let wanted = (format_mode && valid) || self.cfg.metric == QaMetric::Retrieved;
        let retrieved = if wanted { f64::from(u8::from(retrieval_correct(&sample.response, &golds))) } else { 0.0 };
        if self.cfg.metric == QaMetric::Retrieved {
            let score = self.cfg.format_score + (self.cfg.score - self.cfg.format_score) * retrieved;
            return Ok(RewardOutput::new(score).with("retrieved", retrieved));
        }
        let with_structure = |out: RewardOutput| if format_mode { out.with("structure", f64::from(u8::from(valid))) } else { out };
        let Some(pred) = self.cfg.extract.extract(&sample.response) else {
            let score = if format_mode { self.search_r1_format_score(false, valid, retrieved > 0.0) } else { 0.0 };
            return Ok(with_structure(RewardOutput::new(score)
                .with("format", 0.0)
                .with("em", 0.0)
                .with("f1", 0.0)
                .with("subem", 0.0)
                .with("retrieved", retrieved)));
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
        let score = if format_mode {
            self.search_r1_format_score(m >= 1.0, valid, retrieved > 0.0)
        } else {
            self.cfg.format_score + (self.cfg.score - self.cfg.format_score) * m
        };
        Ok(with_structure(RewardOutput::new(score)
            .with("format", 1.0)
            .with("em", em)
            .with("f1", f1)
            .with("subem", subem)
            .with("retrieved", retrieved)))
    }
}

fn search_tags_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"</?(?:think|search|information|answer)>").expect("static regex"))
}

/// Search-R1's `is_valid_sequence` on a response (the text after the assistant marker
/// there): the think/search/information/answer tags are balanced and come in the order
/// `<think>` → (`<search>` → `<information>` → `<think>`)* → `<answer>`, the response ends
/// with `</answer>`, and only whitespace lies between the blocks.
pub fn valid_search_sequence(response: &str) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum At {
        Start,
        InThink,
        AfterThink,
        InSearch,
        AfterSearch,
        InInformation,
        Information,
        InAnswer,
        End,
    }
    for tag in ["think", "search", "information", "answer"] {
        if response.matches(&format!("<{tag}>")).count() != response.matches(&format!("</{tag}>")).count() {
            return false;
        }
    }
    let inside = |at: At| matches!(at, At::InThink | At::InSearch | At::InInformation | At::InAnswer);
    let (mut at, mut from) = (At::Start, 0);
    for m in search_tags_re().find_iter(response) {
        if !inside(at) && !response[from..m.start()].trim().is_empty() {
            return false;
        }
        at = match (m.as_str(), at) {
            ("<think>", At::Start | At::Information) => At::InThink,
            ("</think>", At::InThink) => At::AfterThink,
            ("<search>", At::AfterThink) => At::InSearch,
            ("</search>", At::InSearch) => At::AfterSearch,
            ("<information>", At::AfterSearch) => At::InInformation,
            ("</information>", At::InInformation) => At::Information,
            ("<answer>", At::AfterThink) => At::InAnswer,
            ("</answer>", At::InAnswer) => At::End,
            _ => return false,
        };
        from = m.end();
    }
    at == At::End && response[from..].trim().is_empty()
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
        let found = "<think> look it up </think>\n<search> quenul </search>\n\n<information>Doc 1(Title: \"Quenul\") The quenul is Blue.</information>\n\n<think> so </think>\n";
        assert_eq!(run(&r, &format!("{found}<answer> red </answer>"), gt.clone()).score, 0.3);
        assert_eq!(run(&r, &format!("{found}<answer> blue </answer>"), gt.clone()).score, 1.0);
        assert_eq!(run(&r, found, gt.clone()).score, 0.0, "no answer: the structure is not finished");
        let missed = "<think>x</think><search>q</search><information>The velkov is green.</information><think>y</think><answer> red </answer>";
        assert_eq!(run(&r, missed, gt.clone()).score, 0.0);
        // A broken structure earns nothing for the passage (Search-R1 checks retrieval only
        // in a valid sequence): here the search has no think before it.
        let broken = "<search> quenul </search><information>The quenul is blue.</information><think>so</think><answer> red </answer>";
        assert_eq!(run(&r, broken, gt.clone()).score, 0.0);
        let out = run(&r, &format!("{found}<answer> red </answer>"), gt.clone());
        assert_eq!((out.detail("structure"), out.detail("retrieved")), (Some(1.0), Some(1.0)));
        assert_eq!(run(&qa(QaMetric::Em), &format!("{found}<answer> red </answer>"), gt.clone()).score, 0.0, "off by default");
        // As a metric of its own: the evidence was retrieved, whatever the answer or structure.
        let r = qa(QaMetric::Retrieved);
        assert_eq!(run(&r, &format!("{found}<answer> red </answer>"), gt.clone()).score, 1.0);
        assert_eq!(run(&r, found, gt.clone()).score, 1.0);
        assert_eq!(run(&r, broken, gt.clone()).score, 1.0);
        assert_eq!(run(&r, missed, gt).score, 0.0);
    }

    #[test]
    fn search_r1_structure() {
        for ok in [
            "<think>a</think><answer>b</answer>",
            "  <think>a</think>\n<search>q</search>\n\n<information>i</information>\n\n<think>b</think>\n<answer>c</answer>\n ",
            "<think></think><search></search><information></information><think></think><search>q</search><information>j</information><think>t</think><answer></answer>",
        ] {
            assert!(valid_search_sequence(ok), "{ok}");
        }
        for bad in [
            "",
            "<answer>b</answer>",
            "<think>a</think>",
            "<think>a</think> so <answer>b</answer>",
            "<think>a</think><answer>b</answer> more",
            "<think>a</think><answer>b</answer><answer>c</answer>",
            "<think>a</think><search>q</search><think>b</think><answer>c</answer>",
            "<think>a<think>b</think></think><answer>c</answer>",
            "<think>a</think><answer>b",
            "<think>a</think><search>q</search><information>i</information><answer>c</answer>",
        ] {
            assert!(!valid_search_sequence(bad), "{bad}");
        }
    }

    #[test]
    fn search_r1_format_scores_need_a_binary_metric_and_no_format_score() {
        let with = |metric, format_score| QaReward::new(QaConfig { metric, format_score, structure_format_score: 0.2, ..QaConfig::default() });
        assert!(with(QaMetric::Em, 0.0).is_ok());
        assert!(with(QaMetric::Subem, 0.0).is_ok());
        assert!(with(QaMetric::F1, 0.0).is_err());
        assert!(with(QaMetric::Em, 0.1).is_err());
        assert!(QaReward::new(QaConfig { final_format_score: f64::NAN, ..QaConfig::default() }).is_err());
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
