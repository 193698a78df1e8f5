//! Math answer reward (MATH / GSM8K style): extract, normalise, compare.
//!
//! Extraction follows verl: the last `\boxed{}` (Hendrycks MATH) or GSM8K's
//! `#### N` (strict) / last number (flexible). Comparison is numeric when
//! both sides parse as numbers (decimal, `a/b`, `\frac{a}{b}`), else exact
//! string match after normalisation. See [`normalize_math_answer`] for the
//! exact rules, including the deliberate choices on units and percentages.

use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::extract::{gsm8k_strict, last_boxed, last_number, last_tag_block};
use crate::{RewardError, RewardFn, RewardInput, RewardOutput};

/// How the predicted answer is found in the response.
///
/// JSON: `"auto"`, `"boxed"`, `"gsm8k_strict"`, `"gsm8k_flexible"` or `{"tag": "answer"}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum MathExtract {
    /// Last `\boxed{}`/`\fbox{}`, else GSM8K `#### N`; nothing else counts.
    #[default]
    Auto,
    /// Last `\boxed{}`/`\fbox{}` only (verl's MATH reward).
    Boxed,
    /// Last `#### N` only (verl's gsm8k `method="strict"`).
    Gsm8kStrict,
    /// Last number anywhere (verl's gsm8k `method="flexible"`); lenient, so no format signal.
    Gsm8kFlexible,
    /// Last `<tag>...</tag>` block; a `\boxed{}` inside it is unwrapped.
    Tag(String),
}

/// Parameters of [`MathReward`] (`kind = "math"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MathConfig {
    /// Where the answer is read from.
    pub extract: MathExtract,
    /// Reward for a correct answer.
    pub score: f64,
    /// Reward for an extracted but wrong answer (verl default 0.0).
    pub format_score: f64,
    /// Relative tolerance for numeric comparison.
    pub rel_tol: f64,
    /// Longer extracted answers are judged wrong without normalising (bounds the work).
    pub max_answer_chars: usize,
}

impl Default for MathConfig {
    fn default() -> Self {
        MathConfig {
            extract: MathExtract::Auto,
            score: 1.0,
            format_score: 0.0,
            rel_tol: 1e-6,
            max_answer_chars: 1000,
        }
    }
}

/// Rule reward for math answers; details: `format` (answer found), `correct`.
#[derive(Debug, Clone)]
pub struct MathReward {
    cfg: MathConfig,
}

impl Default for MathReward {
    /// The default config (always valid).
    fn default() -> Self {
        MathReward {
            cfg: MathConfig::default(),
        }
    }
}

impl MathReward {
    /// Validates the config.
    pub fn new(cfg: MathConfig) -> Result<Self, RewardError> {
        if !cfg.score.is_finite() || !cfg.format_score.is_finite() {
            return Err(RewardError::config(
                "math",
                "score and format_score must be finite",
            ));
        }
        if !(cfg.rel_tol.is_finite() && cfg.rel_tol >= 0.0) {
            return Err(RewardError::config(
                "math",
                "rel_tol must be a finite number >= 0",
            ));
        }
        if let MathExtract::Tag(t) = &cfg.extract {
            crate::AnswerExtract::Tag(t.clone()).validate("math")?;
        }
        Ok(MathReward { cfg })
    }

    /// The predicted answer per the configured extraction, before normalisation.
    pub fn extract(&self, response: &str) -> Option<String> {
        let found = match &self.cfg.extract {
            MathExtract::Auto => last_boxed(response)
                .map(str::to_string)
                .or_else(|| gsm8k_strict(response)),
            MathExtract::Boxed => last_boxed(response).map(str::to_string),
            MathExtract::Gsm8kStrict => gsm8k_strict(response),
            MathExtract::Gsm8kFlexible => last_number(response),
            MathExtract::Tag(tag) => {
                let block = last_tag_block(response, tag)?;
                Some(last_boxed(block).unwrap_or(block).to_string())
            }
        }?;
        (!found.trim().is_empty()).then_some(found)
    }
}

impl RewardFn for MathReward {
    fn name(&self) -> &str {
        "math"
    }

    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError> {
        let truths = math_ground_truths(&sample.ground_truth)
            .map_err(|m| RewardError::ground_truth("math", &sample.data_source, m))?;
        let Some(pred) = self.extract(&sample.response) else {
            return Ok(RewardOutput::new(0.0)
                .with("format", 0.0)
                .with("correct", 0.0));
        };
        let correct = pred.chars().count() <= self.cfg.max_answer_chars
            && truths
                .iter()
                .any(|t| math_equiv(&pred, t, self.cfg.rel_tol));
        let score = if correct {
            self.cfg.score
        } else {
            self.cfg.format_score
        };
        Ok(RewardOutput::new(score)
            .with("format", 1.0)
            .with("correct", f64::from(u8::from(correct))))
    }
}

/// Reference answers from `ground_truth`: a string, a number, a list of
/// those (any may match), or an object with `target`/`answer`.
///
/// A string holding a full solution is reduced the same way a response is
/// (last `\boxed{}`, else `#### N`), so raw MATH/GSM8K solutions also work.
fn math_ground_truths(gt: &Value) -> Result<Vec<String>, String> {
    fn one(v: &Value) -> Option<String> {
        match v {
            Value::String(s) => Some(
                last_boxed(s)
                    .map(str::to_string)
                    .or_else(|| gsm8k_strict(s))
                    .unwrap_or_else(|| s.clone()),
            ),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
    let v = match gt {
        Value::Object(o) => o
            .get("target")
            .or_else(|| o.get("answer"))
            .ok_or("object ground_truth needs a `target` or `answer` key")?,
        v => v,
    };
    let out: Vec<String> = match v {
        Value::Array(items) => items
            .iter()
            .map(|i| one(i).ok_or("list items must be strings or numbers"))
            .collect::<Result<_, _>>()?,
        v => vec![one(v).ok_or("expected a string, number, list or {\"target\": ...}")?],
    };
    if out.is_empty() {
        return Err("empty list of answers".into());
    }
    Ok(out)
}

/// True when two answers are the same after [`normalize_math_answer`]:
/// numerically within `rel_tol` if both parse as numbers, else string-equal.
pub fn math_equiv(pred: &str, truth: &str, rel_tol: f64) -> bool {
    let p = normalize_math_answer(pred);
    let t = normalize_math_answer(truth);
    if p.is_empty() {
        return false;
    }
    match (parse_numeric(&p), parse_numeric(&t)) {
        (Some(x), Some(y)) => {
            let diff = (x - y).abs();
            diff <= rel_tol * x.abs().max(y.abs()) || diff < 1e-12
        }
        _ => p == t,
    }
}

/// Normalises a LaTeX-ish answer (Hendrycks' `strip_string`, plus a few additions).
///
/// In order: drop newlines, `\!`; `\\`→`\`; `\tfrac`/`\dfrac`→`\frac`; drop
/// `\left`/`\right`, degree marks, `$`; cut a trailing unit written as
/// `\text{ unit}` (leading space, Hendrycks' rule); unwrap `\text{}`,
/// `\textbf{}`, `\mathrm{}`, `\mathbf{}`, `\mbox{}`; drop `%`/`\%` (so `50\%`
/// equals `50`, *not* `0.5`); drop thin spaces `\,` `\;` `\:` `\ ` and `{,}`;
/// `.5`→`0.5`; `x = 5`→`5` when the left side is at most 2 chars; `\sqrt2`→
/// `\sqrt{2}`; remove whitespace; `\frac12`→`\frac{1}{2}`; remove thousands
/// commas (`1,234.5` only when grouped by threes, so tuples like `1,2` stay);
/// drop trailing `.`.
/// Bare words as units (`5 cm`) are *not* stripped: guessing units would
/// accept wrong answers like `5 cm` for `5 m`.
pub fn normalize_math_answer(s: &str) -> String {
    let mut s = s.trim().replace('\n', "").replace(r"\!", "");
    s = s.replace(r"\\", r"\");
    s = s.replace("tfrac", "frac").replace("dfrac", "frac");
    s = s.replace(r"\left", "").replace(r"\right", "");
    s = s.replace(r"^{\circ}", "").replace(r"^\circ", "");
    s = s.replace(r"\$", "").replace('$', "");
    if let Some(i) = s.find(r"\text{ ") {
        s.truncate(i);
    }
    for cmd in [r"\textbf", r"\text", r"\mathrm", r"\mathbf", r"\mbox"] {
        s = unwrap_command(&s, cmd);
    }
    s = s.replace(r"\%", "").replace('%', "");
    for thin in [r"\,", r"\;", r"\:", r"\ ", "{,}"] {
        s = s.replace(thin, "");
    }
    s = s.replace(" .", " 0.").replace("{.", "{0.");
    if s.starts_with('.') {
        s.insert(0, '0');
    }
    if let Some((lhs, rhs)) = s.split_once('=') {
        if !rhs.contains('=') && lhs.trim().chars().count() <= 2 {
            s = rhs.to_string();
        }
    }
    s = fix_sqrt(&s);
    s.retain(|c| !c.is_whitespace());
    s = fix_fracs(&s);
    if thousands_re().is_match(&s) {
        s.retain(|c| c != ',');
    }
    while s.ends_with('.') {
        s.pop();
    }
    s
}

fn thousands_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"^[-+]?\d{1,3}(,\d{3})+(\.\d+)?$").expect("static regex"))
}

/// Byte index of the `}` matching the `{` at index 0, if balanced.
fn matching_brace(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, b) in s.bytes().enumerate() {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Replaces `\cmd{X}` with `X`; occurrences without a balanced `{}` argument stay as they are.
fn unwrap_command(s: &str, cmd: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(cmd) {
        let after = &rest[i + cmd.len()..];
        if after.starts_with('{') {
            if let Some(close) = matching_brace(after) {
                out.push_str(&rest[..i]);
                out.push_str(&after[1..close]);
                rest = &after[close + 1..];
                continue;
            }
        }
        out.push_str(&rest[..i + cmd.len()]);
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `\sqrt2` → `\sqrt{2}` (one-char argument), as Hendrycks' `_fix_sqrt`.
fn fix_sqrt(s: &str) -> String {
    let mut parts = s.split(r"\sqrt");
    let mut out = parts.next().unwrap_or_default().to_string();
    for p in parts {
        out.push_str(r"\sqrt");
        let mut chars = p.chars();
        match chars.next() {
            Some(c) if c != '{' => {
                out.push('{');
                out.push(c);
                out.push('}');
                out.push_str(chars.as_str());
            }
            _ => out.push_str(p),
        }
    }
    out
}

/// `\frac12` → `\frac{1}{2}`, `\frac1{2}` → `\frac{1}{2}`, as Hendrycks' `_fix_fracs`.
fn fix_fracs(s: &str) -> String {
    let mut parts = s.split(r"\frac");
    let mut out = parts.next().unwrap_or_default().to_string();
    for p in parts {
        out.push_str(r"\frac");
        let mut chars = p.chars();
        match (chars.next(), chars.next()) {
            (Some('{'), _) => out.push_str(p),
            (Some(a), Some('{')) => {
                out.push('{');
                out.push(a);
                out.push('}');
                out.push('{');
                out.push_str(chars.as_str());
            }
            (Some(a), Some(b)) => {
                out.push('{');
                out.push(a);
                out.push_str("}{");
                out.push(b);
                out.push('}');
                out.push_str(chars.as_str());
            }
            // Too short to be a fraction: Hendrycks returns the input unchanged.
            _ => return s.to_string(),
        }
    }
    out
}

/// A plain decimal: optional sign, digits with at most one `.`; no exponents, `inf` or `nan`.
fn parse_plain(s: &str) -> Option<f64> {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    let digits = body.bytes().filter(u8::is_ascii_digit).count();
    let dots = body.bytes().filter(|b| *b == b'.').count();
    if digits == 0 || dots > 1 || digits + dots != body.len() {
        return None;
    }
    s.parse::<f64>().ok().filter(|x| x.is_finite())
}

/// Numeric value of a normalised answer: decimal, `a/b`, `\frac{a}{b}`, each optionally negated.
fn parse_numeric(s: &str) -> Option<f64> {
    if let Some(x) = parse_plain(s) {
        return Some(x);
    }
    let (sign, body) = match s.strip_prefix('-') {
        Some(b) => (-1.0, b),
        None => (1.0, s),
    };
    let (a, b) = if let Some(inner) = body
        .strip_prefix(r"\frac{")
        .and_then(|r| r.strip_suffix('}'))
    {
        inner.split_once("}{")?
    } else {
        body.split_once('/')?
    };
    let (a, b) = (parse_plain(a)?, parse_plain(b)?);
    let v = sign * a / b;
    (b != 0.0 && v.is_finite()).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reward(extract: MathExtract) -> MathReward {
        MathReward::new(MathConfig {
            extract,
            ..MathConfig::default()
        })
        .unwrap()
    }

    fn score(r: &MathReward, resp: &str, gt: Value) -> f64 {
        r.score(&RewardInput::new("lighteval/MATH", resp, gt))
            .unwrap()
            .score
    }

    #[test]
    fn normalisation_rules() {
        let n = normalize_math_answer;
        assert_eq!(n(r"\left( 1, 2 \right)"), "(1,2)");
        assert_eq!(n(r"\dfrac{1}{2}"), r"\frac{1}{2}");
        assert_eq!(n(r"\frac12"), r"\frac{1}{2}");
        assert_eq!(n(r"\frac1{2}"), r"\frac{1}{2}");
        assert_eq!(n(r"\sqrt2"), r"\sqrt{2}");
        assert_eq!(n(r"$x = 5$"), "5");
        assert_eq!(n(r"10\text{ cm}"), "10");
        assert_eq!(n(r"\text{Monday}"), "Monday");
        assert_eq!(n(r"\textbf{B}"), "B");
        assert_eq!(n(r"50\%"), "50");
        assert_eq!(n(r"90^\circ"), "90");
        assert_eq!(n("1,234,567.5"), "1234567.5");
        assert_eq!(n("1,2"), "1,2");
        assert_eq!(n(".5"), "0.5");
        assert_eq!(n("42."), "42");
        assert_eq!(n(r"1\!000"), "1000");
        assert_eq!(n(r"1{,}000"), "1000");
        assert_eq!(n(r"\frac"), r"\frac");
        assert_eq!(n(r"\text{unclosed"), r"\text{unclosed");
        assert_eq!(n(""), "");
    }

    #[test]
    fn numeric_parsing() {
        assert_eq!(parse_numeric(r"\frac{1}{2}"), Some(0.5));
        assert_eq!(parse_numeric(r"-\frac{3}{4}"), Some(-0.75));
        assert_eq!(parse_numeric("3/4"), Some(0.75));
        assert_eq!(parse_numeric("1/0"), None);
        assert_eq!(parse_numeric("inf"), None);
        assert_eq!(parse_numeric("NaN"), None);
        assert_eq!(parse_numeric("1e5"), None);
        assert_eq!(parse_numeric("1.2.3"), None);
        assert_eq!(parse_numeric(&"9".repeat(400)), None);
        assert_eq!(parse_numeric(r"\frac{1}{2}{3}"), None);
    }

    #[test]
    fn equivalence() {
        assert!(math_equiv(r"\frac{1}{2}", "0.5", 1e-6));
        assert!(math_equiv("1/2", r"\dfrac12", 1e-6));
        assert!(math_equiv("18.00", "18", 1e-6));
        assert!(math_equiv("1,000", "1000", 1e-6));
        assert!(math_equiv(r"\$18", "18", 1e-6));
        assert!(math_equiv(r"(1, 2)", r"\left(1,2\right)", 1e-6));
        assert!(!math_equiv("0.333", r"\frac13", 1e-6));
        assert!(!math_equiv("", "", 1e-6));
        assert!(!math_equiv("$", "", 1e-6));
        assert!(math_equiv("0", "0.0", 1e-6));
        assert!(!math_equiv("0", "1e-7", 1e-6));
    }

    #[test]
    fn boxed_scoring() {
        let r = reward(MathExtract::Boxed);
        assert_eq!(
            score(&r, r"so $\boxed{\dfrac{1}{2}}$", json!("\\frac{1}{2}")),
            1.0
        );
        assert_eq!(score(&r, r"\boxed{1/2}", json!(0.5)), 1.0);
        // Several boxes: only the last one counts.
        assert_eq!(score(&r, r"\boxed{3} no wait \boxed{4}", json!("4")), 1.0);
        assert_eq!(score(&r, r"\boxed{4} no wait \boxed{3}", json!("4")), 0.0);
        assert_eq!(score(&r, r"\fbox{7}", json!(7)), 1.0);
        assert_eq!(score(&r, r"$\boxed 7$", json!(7)), 1.0);
        assert_eq!(score(&r, "the answer is 7", json!(7)), 0.0);
        // Ground truth given as a full solution.
        assert_eq!(
            score(&r, r"\boxed{7}", json!("so it is $\\boxed{7}$.")),
            1.0
        );
        // List of acceptable answers.
        assert_eq!(score(&r, r"\boxed{b}", json!(["a", "b"])), 1.0);
    }

    #[test]
    fn gsm8k_modes() {
        let strict = reward(MathExtract::Gsm8kStrict);
        let flex = reward(MathExtract::Gsm8kFlexible);
        let auto = reward(MathExtract::Auto);
        let resp = "She pays 3 * 6 = 18 dollars.\n#### 18";
        assert_eq!(score(&strict, resp, json!("18")), 1.0);
        assert_eq!(score(&strict, "so 18", json!("18")), 0.0);
        assert_eq!(score(&flex, "so 18.", json!("18")), 1.0);
        assert_eq!(score(&flex, "18 then 19", json!("18")), 0.0);
        assert_eq!(score(&auto, resp, json!(18)), 1.0);
        assert_eq!(score(&auto, r"\boxed{18}", json!(18)), 1.0);
        assert_eq!(score(&auto, "18", json!(18)), 0.0);
        assert_eq!(score(&strict, "#### 1,800", json!(1800)), 1.0);
        assert_eq!(score(&auto, "#### 18", json!({"target": "18"})), 1.0);
    }

    #[test]
    fn tag_mode_and_format_score() {
        let r = MathReward::new(MathConfig {
            extract: MathExtract::Tag("answer".into()),
            format_score: 0.1,
            ..MathConfig::default()
        })
        .unwrap();
        let out = r
            .score(&RewardInput::new(
                "x",
                r"<answer>\boxed{5}</answer>",
                json!(5),
            ))
            .unwrap();
        assert_eq!(
            (out.score, out.detail("format"), out.detail("correct")),
            (1.0, Some(1.0), Some(1.0))
        );
        assert_eq!(score(&r, "<answer>6</answer>", json!(5)), 0.1);
        assert_eq!(score(&r, "5", json!(5)), 0.0);
    }

    #[test]
    fn adversarial_responses() {
        let r = reward(MathExtract::Auto);
        let flex = reward(MathExtract::Gsm8kFlexible);
        for resp in [
            String::new(),
            "\u{0}\u{FFFF}日本語 🎉 \\boxed{🎉}".to_string(),
            "\\boxed{".repeat(100_000),
            "}".repeat(1_000_000),
            format!("\\boxed{{{}}}", "1".repeat(1_000_000)),
            format!("\\boxed{{{}1{}}}", "{".repeat(50_000), "}".repeat(50_000)),
            "#### ".repeat(200_000),
            "\\frac".repeat(10_000),
            "\\text{".repeat(10_000),
            "9".repeat(1_000_000),
        ] {
            let out = r
                .score(&RewardInput::new("m", resp.as_str(), json!("1")))
                .unwrap();
            assert!(out.score == 0.0 || out.score == 1.0);
            flex.score(&RewardInput::new("m", resp.as_str(), json!("1")))
                .unwrap();
        }
        // Over-long answers are not normalised, just wrong.
        let long = format!("\\boxed{{{}}}", "1".repeat(2000));
        assert_eq!(score(&r, &long, json!("1".repeat(2000))), 0.0);
    }

    #[test]
    fn bad_ground_truth_is_an_error() {
        let r = reward(MathExtract::Auto);
        for gt in [
            Value::Null,
            json!(true),
            json!([]),
            json!({"x": 1}),
            json!([{}]),
        ] {
            let err = r
                .score(&RewardInput::new("ds1", r"\boxed{1}", gt))
                .unwrap_err();
            assert!(err.to_string().contains("ds1"), "{err}");
        }
    }

    #[test]
    fn config_validation() {
        assert!(MathReward::new(MathConfig {
            rel_tol: f64::NAN,
            ..MathConfig::default()
        })
        .is_err());
        assert!(MathReward::new(MathConfig {
            extract: MathExtract::Tag("<a>".into()),
            ..MathConfig::default()
        })
        .is_err());
        let cfg: MathConfig = serde_json::from_value(json!({"extract": "gsm8k_strict"})).unwrap();
        assert_eq!(cfg.extract, MathExtract::Gsm8kStrict);
        let cfg: MathConfig =
            serde_json::from_value(json!({"extract": {"tag": "answer"}})).unwrap();
        assert_eq!(cfg.extract, MathExtract::Tag("answer".into()));
        assert!(serde_json::from_value::<MathConfig>(json!({"extrct": "boxed"})).is_err());
    }
}
