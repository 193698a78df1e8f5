//! Shape rewards that look only at the response text: format (regex) and length.

use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};

use crate::{RewardError, RewardFn, RewardInput, RewardOutput};

/// Parameters of [`FormatReward`] (`kind = "format"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FormatConfig {
    /// Regex searched in the response (Rust `regex` syntax; anchor with `^…$` for a full match).
    pub pattern: String,
    /// `.` also matches newlines (Python's `re.DOTALL`); on by default since responses span lines.
    pub dotall: bool,
    /// Trim surrounding whitespace first: Rust's `$` does not match before a
    /// trailing newline as Python's does, and responses often end in one.
    pub trim: bool,
    /// Reward when the pattern matches.
    pub match_score: f64,
    /// Reward when it does not.
    pub mismatch_score: f64,
}

impl Default for FormatConfig {
    fn default() -> Self {
        FormatConfig {
            pattern: r"^<think>.*</think>\s*<answer>.*</answer>$".to_string(),
            dotall: true,
            trim: true,
            match_score: 1.0,
            mismatch_score: 0.0,
        }
    }
}

/// Regex format reward; details: `format` (1 when matched).
///
/// The `regex` crate matches in linear time, so hostile responses cannot
/// trigger catastrophic backtracking.
#[derive(Debug, Clone)]
pub struct FormatReward {
    re: Regex,
    cfg: FormatConfig,
}

/// Caps compiled-regex memory so a config typo like `(a{1000}){1000}` fails fast.
const REGEX_SIZE_LIMIT: usize = 8 << 20;

impl FormatReward {
    /// Compiles the pattern.
    pub fn new(cfg: FormatConfig) -> Result<Self, RewardError> {
        if !cfg.match_score.is_finite() || !cfg.mismatch_score.is_finite() {
            return Err(RewardError::config(
                "format",
                "match_score and mismatch_score must be finite",
            ));
        }
        let re = RegexBuilder::new(&cfg.pattern)
            .dot_matches_new_line(cfg.dotall)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| RewardError::config("format", format!("bad pattern: {e}")))?;
        Ok(FormatReward { re, cfg })
    }
}

impl RewardFn for FormatReward {
    fn name(&self) -> &str {
        "format"
    }

    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError> {
        let text = if self.cfg.trim {
            sample.response.trim()
        } else {
            sample.response.as_str()
        };
        let ok = self.re.is_match(text);
        let score = if ok {
            self.cfg.match_score
        } else {
            self.cfg.mismatch_score
        };
        Ok(RewardOutput::new(score).with("format", f64::from(u8::from(ok))))
    }
}

/// What a length counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LengthUnit {
    /// Unicode scalar values.
    #[default]
    Chars,
    /// Whitespace-separated words (a rough token proxy; no tokenizer here).
    Words,
    /// UTF-8 bytes.
    Bytes,
}

/// Which side of the target is penalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LengthMode {
    /// Only longer than target (a length penalty).
    #[default]
    Over,
    /// Only shorter than target (rewards reaching a length).
    Under,
    /// Both sides (stay close to the target).
    Distance,
}

/// Parameters of [`LengthReward`] (`kind = "length"`).
///
/// With `n` the response length and `T = target`:
/// `d = max(0, n - T) / T` (over), `max(0, T - n) / T` (under) or `|n - T| / T` (distance);
/// `score = max(min_score, bonus - scale * d)`.
/// With the defaults a response at or under target scores 0, one twice the
/// target scores -1, and nothing goes below -1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthConfig {
    /// Target length `T` (> 0), in `unit`s.
    pub target: usize,
    /// What is counted.
    #[serde(default)]
    pub unit: LengthUnit,
    /// Which deviations count.
    #[serde(default)]
    pub mode: LengthMode,
    /// Penalty per unit of relative deviation (>= 0).
    #[serde(default = "one")]
    pub scale: f64,
    /// Score at zero deviation.
    #[serde(default)]
    pub bonus: f64,
    /// Floor of the score.
    #[serde(default = "minus_one")]
    pub min_score: f64,
}

fn one() -> f64 {
    1.0
}

fn minus_one() -> f64 {
    -1.0
}

impl LengthConfig {
    /// A config with the given target and all other fields at their defaults.
    pub fn with_target(target: usize) -> Self {
        LengthConfig {
            target,
            unit: LengthUnit::Chars,
            mode: LengthMode::Over,
            scale: 1.0,
            bonus: 0.0,
            min_score: -1.0,
        }
    }
}

/// Length-shaping reward; details: `length`, `deviation`.
#[derive(Debug, Clone)]
pub struct LengthReward {
    cfg: LengthConfig,
}

impl LengthReward {
    /// Validates the config.
    pub fn new(cfg: LengthConfig) -> Result<Self, RewardError> {
        if cfg.target == 0 {
            return Err(RewardError::config("length", "target must be > 0"));
        }
        if !(cfg.scale.is_finite() && cfg.scale >= 0.0) {
            return Err(RewardError::config(
                "length",
                "scale must be a finite number >= 0",
            ));
        }
        if !cfg.bonus.is_finite() || !cfg.min_score.is_finite() || cfg.min_score > cfg.bonus {
            return Err(RewardError::config(
                "length",
                "bonus and min_score must be finite with min_score <= bonus",
            ));
        }
        Ok(LengthReward { cfg })
    }
}

impl RewardFn for LengthReward {
    fn name(&self) -> &str {
        "length"
    }

    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError> {
        let r = &sample.response;
        let n = match self.cfg.unit {
            LengthUnit::Chars => r.chars().count(),
            LengthUnit::Words => r.split_whitespace().count(),
            LengthUnit::Bytes => r.len(),
        } as f64;
        let t = self.cfg.target as f64;
        let d = match self.cfg.mode {
            LengthMode::Over => (n - t).max(0.0),
            LengthMode::Under => (t - n).max(0.0),
            LengthMode::Distance => (n - t).abs(),
        } / t;
        let score = (self.cfg.bonus - self.cfg.scale * d).max(self.cfg.min_score);
        Ok(RewardOutput::new(score)
            .with("length", n)
            .with("deviation", d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn input(resp: &str) -> RewardInput {
        RewardInput::new("x", resp, Value::Null)
    }

    #[test]
    fn default_format_pattern() {
        let f = FormatReward::new(FormatConfig::default()).unwrap();
        let s = |r: &str| f.score(&input(r)).unwrap().score;
        assert_eq!(s("<think>a\nb</think>\n<answer>42</answer>\n"), 1.0);
        assert_eq!(s("<think></think><answer></answer>"), 1.0);
        assert_eq!(s("<answer>42</answer>"), 0.0);
        assert_eq!(s("<think>a</think><answer>42</answer> trailing"), 0.0);
        assert_eq!(s("preamble <think>a</think><answer>42</answer>"), 0.0);
        assert_eq!(s(""), 0.0);
        assert_eq!(s("<think>日本🎉</think><answer>é</answer>"), 1.0);
        let mb = "x".repeat(1 << 20);
        assert_eq!(s(&format!("<think>{mb}</think><answer>1</answer>")), 1.0);
        assert_eq!(s(&"<think>".repeat(200_000)), 0.0);
    }

    #[test]
    fn format_options() {
        let f = FormatReward::new(FormatConfig {
            pattern: r"^<answer>.*</answer>$".into(),
            dotall: false,
            trim: false,
            match_score: 0.5,
            mismatch_score: -0.5,
        })
        .unwrap();
        assert_eq!(f.score(&input("<answer>1</answer>")).unwrap().score, 0.5);
        assert_eq!(
            f.score(&input("<answer>1\n2</answer>")).unwrap().score,
            -0.5
        );
        assert_eq!(f.score(&input("<answer>1</answer>\n")).unwrap().score, -0.5);
        let err = FormatReward::new(FormatConfig {
            pattern: "(unclosed".into(),
            ..FormatConfig::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("bad pattern"), "{err}");
        assert!(FormatReward::new(FormatConfig {
            pattern: "(((a{1000}){1000}){1000})".into(),
            ..FormatConfig::default()
        })
        .is_err());
    }

    #[test]
    fn length_formula() {
        let over = LengthReward::new(LengthConfig::with_target(10)).unwrap();
        let s = |r: &LengthReward, t: &str| r.score(&input(t)).unwrap().score;
        assert_eq!(s(&over, "short"), 0.0);
        assert_eq!(s(&over, &"x".repeat(15)), -0.5);
        assert_eq!(s(&over, &"x".repeat(1 << 20)), -1.0);
        assert_eq!(s(&over, &"é".repeat(10)), 0.0);
        let under = LengthReward::new(LengthConfig {
            mode: LengthMode::Under,
            unit: LengthUnit::Words,
            ..LengthConfig::with_target(4)
        })
        .unwrap();
        assert_eq!(s(&under, "a b"), -0.5);
        assert_eq!(s(&under, ""), -1.0);
        assert_eq!(s(&under, "a b c d e f"), 0.0);
        let dist = LengthReward::new(LengthConfig {
            mode: LengthMode::Distance,
            unit: LengthUnit::Bytes,
            bonus: 1.0,
            scale: 2.0,
            min_score: 0.0,
            ..LengthConfig::with_target(4)
        })
        .unwrap();
        assert_eq!(s(&dist, "abcd"), 1.0);
        assert_eq!(s(&dist, "abc"), 0.5);
        assert_eq!(s(&dist, "é"), 0.0);
        let out = dist.score(&input("abcdef")).unwrap();
        assert_eq!(
            (out.detail("length"), out.detail("deviation")),
            (Some(6.0), Some(0.5))
        );
    }

    #[test]
    fn length_config() {
        assert!(LengthReward::new(LengthConfig::with_target(0)).is_err());
        assert!(LengthReward::new(LengthConfig {
            scale: -1.0,
            ..LengthConfig::with_target(1)
        })
        .is_err());
        assert!(LengthReward::new(LengthConfig {
            min_score: 1.0,
            ..LengthConfig::with_target(1)
        })
        .is_err());
        let c: LengthConfig =
            serde_json::from_value(json!({"target": 100, "mode": "distance"})).unwrap();
        assert_eq!(
            (c.scale, c.min_score, c.mode),
            (1.0, -1.0, LengthMode::Distance)
        );
        assert!(serde_json::from_value::<LengthConfig>(json!({"mode": "over"})).is_err());
        assert!(serde_json::from_value::<LengthConfig>(json!({"target": 1, "taget": 2})).is_err());
    }
}
