//! Combinators: a weighted sum of rewards, and a router by `data_source`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::types::check_batch_len;
use crate::{
    CountdownReward, MathReward, QaReward, RewardError, RewardFn, RewardInput, RewardOutput,
};

/// `score = Σ weight_i * score_i`; details hold each part's score under its
/// label and the part's own details as `label/key`.
///
/// Labels are the parts' names, suffixed `#i` when a name repeats, so two
/// format rewards do not overwrite each other in metrics.
pub struct WeightedSum {
    parts: Vec<(f64, String, Box<dyn RewardFn>)>,
}

impl WeightedSum {
    /// Builds from `(weight, reward)` pairs; weights must be finite and the list non-empty.
    pub fn new(parts: Vec<(f64, Box<dyn RewardFn>)>) -> Result<Self, RewardError> {
        if parts.is_empty() {
            return Err(RewardError::config(
                "combined",
                "needs at least one component",
            ));
        }
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for (_, r) in &parts {
            *seen.entry(r.name().to_string()).or_default() += 1;
        }
        let mut labelled = Vec::with_capacity(parts.len());
        for (i, (w, r)) in parts.into_iter().enumerate() {
            if !w.is_finite() {
                return Err(RewardError::config(
                    "combined",
                    format!("weight of component {i} is not finite"),
                ));
            }
            let name = r.name().to_string();
            let label = if seen[&name] > 1 {
                format!("{name}#{i}")
            } else {
                name
            };
            labelled.push((w, label, r));
        }
        Ok(WeightedSum { parts: labelled })
    }

    fn merge(&self, per_part: &[Vec<RewardOutput>], n: usize) -> Vec<RewardOutput> {
        (0..n)
            .map(|j| {
                let mut out = RewardOutput::new(0.0);
                for ((w, label, _), outs) in self.parts.iter().zip(per_part) {
                    let o = &outs[j];
                    out.score += w * o.score;
                    out.details.insert(label.clone(), o.score);
                    for (k, v) in &o.details {
                        out.details.insert(format!("{label}/{k}"), *v);
                    }
                }
                out
            })
            .collect()
    }
}

impl RewardFn for WeightedSum {
    fn name(&self) -> &str {
        "combined"
    }

    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError> {
        let per_part = self
            .parts
            .iter()
            .map(|(_, _, r)| r.score(sample).map(|o| vec![o]))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self.merge(&per_part, 1).remove(0))
    }

    fn score_batch(&self, samples: &[RewardInput]) -> Result<Vec<RewardOutput>, RewardError> {
        // Each part sees the whole batch so a remote part makes one request, not one per sample.
        let mut per_part = Vec::with_capacity(self.parts.len());
        for (_, _, r) in &self.parts {
            let outs = r.score_batch(samples)?;
            check_batch_len(r.name(), samples.len(), &outs)?;
            per_part.push(outs);
        }
        Ok(self.merge(&per_part, samples.len()))
    }
}

/// Picks a reward per sample from its `data_source`.
///
/// Lookup order: exact name, then the longest matching prefix, then the
/// default. Adding a route for an existing name or prefix replaces it, so
/// user routes can be layered over [`Router::with_builtin_routes`].
#[derive(Clone, Default)]
pub struct Router {
    exact: BTreeMap<String, Arc<dyn RewardFn>>,
    prefixes: Vec<(String, Arc<dyn RewardFn>)>,
    default: Option<Arc<dyn RewardFn>>,
}

/// verl / TinyZero / Search-R1 data_source names routed to math by default.
pub const BUILTIN_MATH_SOURCES: &[&str] = &[
    "openai/gsm8k",
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
];
/// Prefixes routed to math by default (verl's `numina_*` sources are boxed-answer math).
pub const BUILTIN_MATH_PREFIXES: &[&str] = &["numina_"];
/// Names routed to countdown by default.
pub const BUILTIN_COUNTDOWN_SOURCES: &[&str] = &["countdown"];
/// Prefixes routed to countdown by default (TinyZero variants such as `countdown_3to4`).
pub const BUILTIN_COUNTDOWN_PREFIXES: &[&str] = &["countdown"];
/// Search-R1's QA dataset names routed to `qa_em` by default.
pub const BUILTIN_QA_SOURCES: &[&str] = &[
    "nq",
    "triviaqa",
    "popqa",
    "hotpotqa",
    "2wikimultihopqa",
    "musique",
    "bamboogle",
    // `reinforge data gen search`'s synthetic task.
    "synthetic_search",
];
/// Prefixes routed to `qa_em` by default (verl's `searchR1_nq`, ...).
pub const BUILTIN_QA_PREFIXES: &[&str] = &["searchR1_"];

impl Router {
    /// An empty router: every sample fails until routes or a default are added.
    pub fn new() -> Self {
        Router::default()
    }

    /// Routes the common verl data sources with default configs: GSM8K/MATH
    /// to `math` (auto extraction), `countdown*` to `countdown`, Search-R1
    /// QA sets to `qa_em`. No default route.
    ///
    /// Not covered: code sandboxes, `math_dapo`/`aime*` (DAPO's `Answer:` line
    /// format), geometry3k; route those explicitly.
    pub fn with_builtin_routes() -> Self {
        let math: Arc<dyn RewardFn> = Arc::new(MathReward::default());
        let countdown: Arc<dyn RewardFn> = Arc::new(CountdownReward::default());
        let qa: Arc<dyn RewardFn> = Arc::new(QaReward::default());
        let mut r = Router::new();
        for (names, prefixes, reward) in [
            (BUILTIN_MATH_SOURCES, BUILTIN_MATH_PREFIXES, &math),
            (
                BUILTIN_COUNTDOWN_SOURCES,
                BUILTIN_COUNTDOWN_PREFIXES,
                &countdown,
            ),
            (BUILTIN_QA_SOURCES, BUILTIN_QA_PREFIXES, &qa),
        ] {
            for n in names {
                r = r.route(*n, reward.clone());
            }
            for p in prefixes {
                r = r.route_prefix(*p, reward.clone());
            }
        }
        r
    }

    /// Routes one exact data_source name.
    pub fn route(mut self, data_source: impl Into<String>, reward: Arc<dyn RewardFn>) -> Self {
        self.exact.insert(data_source.into(), reward);
        self
    }

    /// Routes every data_source starting with `prefix`.
    pub fn route_prefix(mut self, prefix: impl Into<String>, reward: Arc<dyn RewardFn>) -> Self {
        let prefix = prefix.into();
        self.prefixes.retain(|(p, _)| *p != prefix);
        self.prefixes.push((prefix, reward));
        // Longest first, so the first hit in `resolve` is the most specific.
        self.prefixes
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        self
    }

    /// Sets the reward for data sources no route matches.
    pub fn default_route(mut self, reward: Arc<dyn RewardFn>) -> Self {
        self.default = Some(reward);
        self
    }

    /// Exact names and `prefix*` patterns, for error messages and logs.
    pub fn known(&self) -> Vec<String> {
        self.exact
            .keys()
            .cloned()
            .chain(self.prefixes.iter().map(|(p, _)| format!("{p}*")))
            .collect()
    }

    /// The reward for a data_source, or a [`RewardError::UnknownDataSource`] naming it.
    pub fn resolve(&self, data_source: &str) -> Result<&Arc<dyn RewardFn>, RewardError> {
        self.exact
            .get(data_source)
            .or_else(|| {
                self.prefixes
                    .iter()
                    .find(|(p, _)| data_source.starts_with(p.as_str()))
                    .map(|(_, r)| r)
            })
            .or(self.default.as_ref())
            .ok_or_else(|| RewardError::UnknownDataSource {
                data_source: data_source.to_string(),
                known: self.known(),
            })
    }
}

impl RewardFn for Router {
    fn name(&self) -> &str {
        "router"
    }

    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError> {
        self.resolve(&sample.data_source)?.score(sample)
    }

    fn score_batch(&self, samples: &[RewardInput]) -> Result<Vec<RewardOutput>, RewardError> {
        // Group by target reward so batched (remote) rewards get one call per group.
        let mut groups: Vec<(&Arc<dyn RewardFn>, Vec<usize>)> = Vec::new();
        for (i, s) in samples.iter().enumerate() {
            let r = self.resolve(&s.data_source)?;
            match groups.iter_mut().find(|(g, _)| Arc::ptr_eq(g, r)) {
                Some((_, idx)) => idx.push(i),
                None => groups.push((r, vec![i])),
            }
        }
        if let [(r, _)] = groups.as_slice() {
            let outs = r.score_batch(samples)?;
            check_batch_len(r.name(), samples.len(), &outs)?;
            return Ok(outs);
        }
        let mut result = vec![RewardOutput::default(); samples.len()];
        for (r, idx) in groups {
            let subset: Vec<RewardInput> = idx.iter().map(|&i| samples[i].clone()).collect();
            let outs = r.score_batch(&subset)?;
            check_batch_len(r.name(), subset.len(), &outs)?;
            for (i, o) in idx.into_iter().zip(outs) {
                result[i] = o;
            }
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FormatConfig, FormatReward, MathConfig};
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Returns a fixed score and counts batch calls.
    struct Fixed(&'static str, f64, AtomicUsize);
    impl RewardFn for Fixed {
        fn name(&self) -> &str {
            self.0
        }
        fn score(&self, _: &RewardInput) -> Result<RewardOutput, RewardError> {
            Ok(RewardOutput::new(self.1).with("k", self.1))
        }
        fn score_batch(&self, s: &[RewardInput]) -> Result<Vec<RewardOutput>, RewardError> {
            self.2.fetch_add(1, Ordering::SeqCst);
            s.iter().map(|x| self.score(x)).collect()
        }
    }

    fn fixed(name: &'static str, v: f64) -> Arc<Fixed> {
        Arc::new(Fixed(name, v, AtomicUsize::new(0)))
    }

    /// Breaks the one-output-per-input contract.
    struct Short;
    impl RewardFn for Short {
        fn name(&self) -> &str {
            "short"
        }
        fn score(&self, _: &RewardInput) -> Result<RewardOutput, RewardError> {
            Ok(RewardOutput::new(0.0))
        }
        fn score_batch(&self, _: &[RewardInput]) -> Result<Vec<RewardOutput>, RewardError> {
            Ok(vec![])
        }
    }

    #[test]
    fn weighted_sum_and_labels() {
        let w = WeightedSum::new(vec![
            (0.5, Box::new(fixed("a", 1.0)) as Box<dyn RewardFn>),
            (2.0, Box::new(fixed("b", 0.25))),
            (1.0, Box::new(fixed("b", 1.0))),
        ])
        .unwrap();
        let inp = RewardInput::new("x", "r", json!(null));
        let out = w.score(&inp).unwrap();
        assert_eq!(out.score, 0.5 + 0.5 + 1.0);
        assert_eq!(out.detail("a"), Some(1.0));
        assert_eq!(out.detail("b#1"), Some(0.25));
        assert_eq!(out.detail("b#2/k"), Some(1.0));
        let batch = w.score_batch(&[inp.clone(), inp]).unwrap();
        assert_eq!(batch.len(), 2);
        assert_eq!(batch[1].score, 2.0);
        assert!(WeightedSum::new(vec![]).is_err());
        assert!(WeightedSum::new(vec![(
            f64::NAN,
            Box::new(fixed("a", 1.0)) as Box<dyn RewardFn>
        )])
        .is_err());
        let bad = WeightedSum::new(vec![(1.0, Box::new(Short) as Box<dyn RewardFn>)]).unwrap();
        assert!(matches!(
            bad.score_batch(&[RewardInput::default()]),
            Err(RewardError::BatchLength { .. })
        ));
    }

    #[test]
    fn format_plus_math_realistic() {
        let w = WeightedSum::new(vec![
            (
                1.0,
                Box::new(MathReward::new(MathConfig::default()).unwrap()) as Box<dyn RewardFn>,
            ),
            (
                0.1,
                Box::new(FormatReward::new(FormatConfig::default()).unwrap()),
            ),
        ])
        .unwrap();
        let out = w
            .score(&RewardInput::new(
                "m",
                "<think>x</think><answer>\\boxed{2}</answer>",
                json!(2),
            ))
            .unwrap();
        assert!((out.score - 1.1).abs() < 1e-12);
        assert_eq!(out.detail("format/format"), Some(1.0));
        assert_eq!(out.detail("math/correct"), Some(1.0));
    }

    #[test]
    fn routing_order_and_errors() {
        let a = fixed("a", 1.0);
        let b = fixed("b", 2.0);
        let c = fixed("c", 3.0);
        let r = Router::new()
            .route("searchR1_nq", a.clone())
            .route_prefix("search", b.clone())
            .route_prefix("searchR1_", c.clone());
        let s = |ds: &str| {
            r.score(&RewardInput::new(ds, "", json!(null)))
                .map(|o| o.score)
        };
        assert_eq!(s("searchR1_nq").unwrap(), 1.0);
        assert_eq!(s("searchR1_hotpotqa").unwrap(), 3.0);
        assert_eq!(s("searchX").unwrap(), 2.0);
        let err = s("mystery").unwrap_err().to_string();
        assert!(
            err.contains("`mystery`") && err.contains("searchR1_nq") && err.contains("searchR1_*"),
            "{err}"
        );
        let with_default = r.clone().default_route(a.clone());
        assert_eq!(
            with_default
                .score(&RewardInput::new("mystery", "", json!(null)))
                .unwrap()
                .score,
            1.0
        );
        // Re-adding a route replaces it.
        let r2 = r.route_prefix("search", c.clone());
        assert_eq!(
            r2.score(&RewardInput::new("searchX", "", json!(null)))
                .unwrap()
                .score,
            3.0
        );
    }

    #[test]
    fn batch_groups_per_reward_and_keeps_order() {
        let a = fixed("a", 1.0);
        let b = fixed("b", 2.0);
        let r = Router::new().route("x", a.clone()).route("y", b.clone());
        let inputs: Vec<_> = ["x", "y", "x", "y", "y"]
            .iter()
            .map(|ds| RewardInput::new(*ds, "", json!(null)))
            .collect();
        let scores: Vec<f64> = r
            .score_batch(&inputs)
            .unwrap()
            .iter()
            .map(|o| o.score)
            .collect();
        assert_eq!(scores, vec![1.0, 2.0, 1.0, 2.0, 2.0]);
        assert_eq!(a.2.load(Ordering::SeqCst), 1);
        assert_eq!(b.2.load(Ordering::SeqCst), 1);
        // An unroutable sample fails the batch before any scoring.
        let mut bad = inputs.clone();
        bad.push(RewardInput::new("z", "", json!(null)));
        assert!(matches!(
            r.score_batch(&bad),
            Err(RewardError::UnknownDataSource { .. })
        ));
        assert_eq!(a.2.load(Ordering::SeqCst), 1);
        assert!(r.score_batch(&[]).unwrap().is_empty());
    }

    #[test]
    fn builtin_routes_score_real_samples() {
        let r = Router::with_builtin_routes();
        let cases = [
            ("openai/gsm8k", "so\n#### 72", json!("72")),
            ("lighteval/MATH", "\\boxed{\\frac{1}{2}}", json!("\\frac12")),
            (
                "DigitalLearningGmbH/MATH-lighteval",
                "\\boxed{3}",
                json!("3"),
            ),
            ("numina_olympiads", "\\boxed{3}", json!("3")),
            (
                "countdown",
                "<answer>1+2</answer>",
                json!({"target": 3, "numbers": [1, 2]}),
            ),
            (
                "countdown_3to4",
                "<answer>1+2</answer>",
                json!({"target": 3, "numbers": [1, 2]}),
            ),
            ("nq", "<answer>Paris</answer>", json!({"target": ["paris"]})),
            ("hotpotqa", "<answer>Paris</answer>", json!(["paris"])),
            ("triviaqa", "<answer>Paris</answer>", json!("paris")),
            (
                "searchR1_musique",
                "<answer>Paris</answer>",
                json!({"target": ["paris"]}),
            ),
        ];
        for (ds, resp, gt) in cases {
            let out = r.score(&RewardInput::new(ds, resp, gt)).unwrap();
            assert_eq!(out.score, 1.0, "{ds}");
        }
        let err = r
            .score(&RewardInput::new("math_dapo", "", json!(1)))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("math_dapo") && err.contains("openai/gsm8k") && err.contains("searchR1_*"),
            "{err}"
        );
    }
}
