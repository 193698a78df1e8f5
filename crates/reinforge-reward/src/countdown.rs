//! Countdown reward (TinyZero / verl `countdown.py` semantics, without `eval`).
//!
//! The response must end with an equation in `<answer>...</answer>` that uses
//! each given number exactly once and evaluates to the target. Scoring:
//!
//! | situation | score |
//! |---|---|
//! | no answer block | 0 |
//! | answer present but not a valid equation (bad chars, syntax, too long/deep, division by zero) | `malformed_score` (defaults to `format_score`) |
//! | valid equation, numbers not exactly the given multiset | `format_score` (0.1) |
//! | valid equation, right numbers, wrong value | `format_score` |
//! | correct | `score` (1.0) |
//!
//! TinyZero gives `format_score` to any present answer, so `malformed_score`
//! defaults to it; set it to 0 to stop rewarding unparsable text in tags.
//!
//! Grammar (the only characters allowed are digits, `.`, `+ - * /`, parentheses
//! and whitespace, as TinyZero's `^[\d+\-*/().\s]+$` check):
//!
//! ```text
//! expr   := term (('+' | '-') term)*
//! term   := factor (('*' | '/') factor)*
//! factor := number | '(' expr ')' | '-' factor   (the last only if allow_unary_minus)
//! number := digits ['.' digits] | '.' digits | digits '.'
//! ```
//!
//! **Unary minus is rejected by default**: Countdown's rules only have the four
//! binary operators, and negation never helps reach a positive target with
//! positive numbers; rejecting it also keeps `-(-(-…))` chains out.
//! Python's `eval` would accept it; set `allow_unary_minus = true` for that.
//!
//! Arithmetic is exact (i128 rationals), falling back to f64 only if a
//! rational overflows; the result matches when `|result - target| < tolerance`
//! (1e-5, as TinyZero). Number usage compares the *values* of the literals as a
//! multiset with the given numbers (`3.0` counts as 3; TinyZero's `\d+` scan
//! would read it as 3 and 0).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{AnswerExtract, RewardError, RewardFn, RewardInput, RewardOutput};

/// Parameters of [`CountdownReward`] (`kind = "countdown"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CountdownConfig {
    /// Where the equation is read from (default: last `<answer>` block).
    pub extract: AnswerExtract,
    /// Reward for a correct equation.
    pub score: f64,
    /// Reward for a well-formed but wrong answer.
    pub format_score: f64,
    /// Reward for an answer that is not a valid equation; `None` = `format_score` (TinyZero).
    pub malformed_score: Option<f64>,
    /// Accepted `|result - target|`.
    pub tolerance: f64,
    /// Accept `-x` as negation.
    pub allow_unary_minus: bool,
    /// Longer equations are malformed (bounds parsing work).
    pub max_equation_chars: usize,
    /// Deeper parenthesis/negation nesting is malformed (bounds recursion).
    pub max_depth: usize,
}

impl Default for CountdownConfig {
    fn default() -> Self {
        CountdownConfig {
            extract: AnswerExtract::default(),
            score: 1.0,
            format_score: 0.1,
            malformed_score: None,
            tolerance: 1e-5,
            allow_unary_minus: false,
            max_equation_chars: 512,
            max_depth: 32,
        }
    }
}

/// Rule reward for the Countdown game; details: `format`, `valid`, `numbers_ok`, `correct`.
#[derive(Debug, Clone)]
pub struct CountdownReward {
    cfg: CountdownConfig,
}

/// Why an equation was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EquationError {
    /// Longer than `max_equation_chars`.
    TooLong,
    /// A character outside digits, `.`, `+-*/()` and whitespace.
    BadChar(char),
    /// A number literal that is malformed or too large.
    BadNumber,
    /// Grammar violation (e.g. `3+`, `()`, `)(`, unary minus when disallowed).
    Syntax,
    /// Nesting deeper than `max_depth`.
    TooDeep,
    /// Division by zero somewhere in the expression.
    DivisionByZero,
    /// The value is not finite even in f64.
    Overflow,
}

/// A parsed and evaluated equation.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluated {
    /// The value (exact when possible, converted to f64).
    pub value: f64,
    /// The number literals, in order of appearance.
    pub literals: Vec<Rat>,
}

impl Default for CountdownReward {
    /// The default config (always valid).
    fn default() -> Self {
        CountdownReward {
            cfg: CountdownConfig::default(),
        }
    }
}

impl CountdownReward {
    /// Validates the config.
    pub fn new(cfg: CountdownConfig) -> Result<Self, RewardError> {
        let scores = [
            cfg.score,
            cfg.format_score,
            cfg.malformed_score.unwrap_or(0.0),
        ];
        if scores.iter().any(|s| !s.is_finite()) {
            return Err(RewardError::config("countdown", "scores must be finite"));
        }
        if !(cfg.tolerance.is_finite() && cfg.tolerance >= 0.0) {
            return Err(RewardError::config(
                "countdown",
                "tolerance must be a finite number >= 0",
            ));
        }
        if cfg.max_depth == 0 || cfg.max_depth > 256 {
            return Err(RewardError::config(
                "countdown",
                "max_depth must be in 1..=256",
            ));
        }
        cfg.extract.validate("countdown")?;
        Ok(CountdownReward { cfg })
    }

    /// Parses and evaluates an equation under this reward's limits.
    pub fn evaluate(&self, equation: &str) -> Result<Evaluated, EquationError> {
        if equation.chars().count() > self.cfg.max_equation_chars {
            return Err(EquationError::TooLong);
        }
        let toks = tokenize(equation)?;
        let mut p = Parser {
            toks: &toks,
            pos: 0,
            depth: 0,
            max_depth: self.cfg.max_depth,
            allow_unary: self.cfg.allow_unary_minus,
            literals: Vec::new(),
        };
        let v = p.expr()?;
        if p.pos != toks.len() {
            return Err(EquationError::Syntax);
        }
        let value = v.exact.map(Rat::to_f64).unwrap_or(v.approx);
        if !value.is_finite() {
            return Err(EquationError::Overflow);
        }
        Ok(Evaluated {
            value,
            literals: p.literals,
        })
    }
}

impl RewardFn for CountdownReward {
    fn name(&self) -> &str {
        "countdown"
    }

    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError> {
        let (target, mut numbers) = countdown_ground_truth(&sample.ground_truth)
            .map_err(|m| RewardError::ground_truth("countdown", &sample.data_source, m))?;
        let out = |score: f64, valid: bool, numbers_ok: bool, correct: bool| {
            RewardOutput::new(score)
                .with("format", 1.0)
                .with("valid", f64::from(u8::from(valid)))
                .with("numbers_ok", f64::from(u8::from(numbers_ok)))
                .with("correct", f64::from(u8::from(correct)))
        };
        let Some(equation) = self.cfg.extract.extract(&sample.response) else {
            return Ok(RewardOutput::new(0.0)
                .with("format", 0.0)
                .with("valid", 0.0)
                .with("numbers_ok", 0.0)
                .with("correct", 0.0));
        };
        let Ok(ev) = self.evaluate(equation) else {
            let s = self.cfg.malformed_score.unwrap_or(self.cfg.format_score);
            return Ok(out(s, false, false, false));
        };
        let mut used = ev.literals;
        used.sort_unstable();
        numbers.sort_unstable();
        if used != numbers {
            return Ok(out(self.cfg.format_score, true, false, false));
        }
        if (ev.value - target).abs() < self.cfg.tolerance {
            Ok(out(self.cfg.score, true, true, true))
        } else {
            Ok(out(self.cfg.format_score, true, true, false))
        }
    }
}

/// `(target, numbers)` from `{"target": t, "numbers": [..]}` (or `nums`, TinyZero's column name).
///
/// A JSON-encoded string of that object is accepted too, since some
/// pipelines stringify structured ground truth when writing parquet.
fn countdown_ground_truth(gt: &Value) -> Result<(f64, Vec<Rat>), String> {
    let parsed;
    let obj = match gt {
        Value::Object(o) => o,
        Value::String(s) => {
            parsed = serde_json::from_str::<Value>(s)
                .map_err(|_| "expected an object {\"target\", \"numbers\"}")?;
            parsed
                .as_object()
                .ok_or("expected an object {\"target\", \"numbers\"}")?
        }
        _ => return Err("expected an object {\"target\", \"numbers\"}".into()),
    };
    let target = obj.get("target").ok_or("missing `target`")?;
    let target = match target {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => parse_literal(s.trim()).ok().map(Rat::to_f64),
        _ => None,
    }
    .filter(|t| t.is_finite())
    .ok_or("`target` must be a number")?;
    let nums = obj
        .get("numbers")
        .or_else(|| obj.get("nums"))
        .and_then(Value::as_array)
        .ok_or("missing `numbers` list")?;
    let numbers = nums
        .iter()
        .map(|v| match v {
            Value::Number(n) => n
                .as_i64()
                .map(|i| Rat::int(i128::from(i)))
                .or_else(|| parse_literal(&n.to_string()).ok())
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 1e30)
                        .map(|f| Rat::int(f as i128))
                }),
            Value::String(s) => parse_literal(s.trim()).ok(),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or("`numbers` must hold numbers")?;
    Ok((target, numbers))
}

/// An exact rational `n/d` in lowest terms with `d > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rat {
    n: i128,
    d: i128,
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Rat {
    fn int(n: i128) -> Rat {
        Rat { n, d: 1 }
    }

    /// `None` on zero denominator or values at `i128::MIN` (whose negation overflows).
    fn new(n: i128, d: i128) -> Option<Rat> {
        if d == 0 || n == i128::MIN || d == i128::MIN {
            return None;
        }
        // Both magnitudes are below 2^127, so the gcd fits in i128.
        let g = gcd(n.unsigned_abs(), d.unsigned_abs()) as i128;
        let (n, d) = (n / g, d / g);
        Some(if d < 0 {
            Rat { n: -n, d: -d }
        } else {
            Rat { n, d }
        })
    }

    fn add(self, o: Rat) -> Option<Rat> {
        let n = self
            .n
            .checked_mul(o.d)?
            .checked_add(o.n.checked_mul(self.d)?)?;
        Rat::new(n, self.d.checked_mul(o.d)?)
    }

    fn sub(self, o: Rat) -> Option<Rat> {
        self.add(Rat {
            n: o.n.checked_neg()?,
            d: o.d,
        })
    }

    fn mul(self, o: Rat) -> Option<Rat> {
        Rat::new(self.n.checked_mul(o.n)?, self.d.checked_mul(o.d)?)
    }

    fn div(self, o: Rat) -> Option<Rat> {
        Rat::new(self.n.checked_mul(o.d)?, self.d.checked_mul(o.n)?)
    }

    /// The nearest f64.
    pub fn to_f64(self) -> f64 {
        self.n as f64 / self.d as f64
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Tok {
    Num(Rat),
    Plus,
    Minus,
    Star,
    Slash,
    LParen,
    RParen,
}

/// At most this many digits per literal keeps `10^k` and the mantissa inside i128.
const MAX_LITERAL_DIGITS: usize = 30;

/// Exact value of a decimal literal (`12`, `1.5`, `.5`, `3.`; optional leading `-` for ground truth).
fn parse_literal(s: &str) -> Result<Rat, EquationError> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    let all_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if int.len() + frac.len() == 0
        || int.len() + frac.len() > MAX_LITERAL_DIGITS
        || !all_digits(int)
        || !all_digits(frac)
    {
        return Err(EquationError::BadNumber);
    }
    let mut n: i128 = 0;
    for b in int.bytes().chain(frac.bytes()) {
        n = n * 10 + i128::from(b - b'0');
    }
    let d = 10i128.pow(frac.len() as u32);
    Rat::new(if neg { -n } else { n }, d).ok_or(EquationError::BadNumber)
}

fn tokenize(s: &str) -> Result<Vec<Tok>, EquationError> {
    let mut toks = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let t = match c {
            b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c' => {
                i += 1;
                continue;
            }
            b'+' => Tok::Plus,
            b'-' => Tok::Minus,
            b'*' => Tok::Star,
            b'/' => Tok::Slash,
            b'(' => Tok::LParen,
            b')' => Tok::RParen,
            b'0'..=b'9' | b'.' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
                    i += 1;
                }
                // `..` or `1.2.3` fail in parse_literal (split_once leaves a `.` in frac).
                toks.push(Tok::Num(parse_literal(&s[start..i])?));
                continue;
            }
            _ => {
                // Report the whole (possibly multi-byte) char, not a byte.
                let ch = s[i..].chars().next().unwrap_or('\u{fffd}');
                return Err(EquationError::BadChar(ch));
            }
        };
        toks.push(t);
        i += 1;
    }
    Ok(toks)
}

/// A value carried both exactly (until a rational overflows) and as f64.
#[derive(Debug, Clone, Copy)]
struct Val {
    exact: Option<Rat>,
    approx: f64,
}

impl Val {
    fn binop(self, op: Tok, o: Val) -> Result<Val, EquationError> {
        if op == Tok::Slash {
            let zero = match o.exact {
                Some(r) => r.n == 0,
                None => o.approx == 0.0,
            };
            if zero {
                return Err(EquationError::DivisionByZero);
            }
        }
        let (exact, approx) = match (self.exact, o.exact) {
            (Some(a), Some(b)) => match op {
                Tok::Plus => (a.add(b), self.approx + o.approx),
                Tok::Minus => (a.sub(b), self.approx - o.approx),
                Tok::Star => (a.mul(b), self.approx * o.approx),
                _ => (a.div(b), self.approx / o.approx),
            },
            _ => (
                None,
                match op {
                    Tok::Plus => self.approx + o.approx,
                    Tok::Minus => self.approx - o.approx,
                    Tok::Star => self.approx * o.approx,
                    _ => self.approx / o.approx,
                },
            ),
        };
        if exact.is_none() && !approx.is_finite() {
            return Err(EquationError::Overflow);
        }
        Ok(Val { exact, approx })
    }
}

/// Recursive descent over tokens; recursion depth is bounded by `max_depth`
/// because only `(` and unary `-` recurse, and both count against it.
struct Parser<'a> {
    toks: &'a [Tok],
    pos: usize,
    depth: usize,
    max_depth: usize,
    allow_unary: bool,
    literals: Vec<Rat>,
}

impl Parser<'_> {
    fn peek(&self) -> Option<Tok> {
        self.toks.get(self.pos).copied()
    }

    fn expr(&mut self) -> Result<Val, EquationError> {
        let mut v = self.term()?;
        while let Some(op @ (Tok::Plus | Tok::Minus)) = self.peek() {
            self.pos += 1;
            let r = self.term()?;
            v = v.binop(op, r)?;
        }
        Ok(v)
    }

    fn term(&mut self) -> Result<Val, EquationError> {
        let mut v = self.factor()?;
        while let Some(op @ (Tok::Star | Tok::Slash)) = self.peek() {
            self.pos += 1;
            let r = self.factor()?;
            v = v.binop(op, r)?;
        }
        Ok(v)
    }

    fn enter(&mut self) -> Result<(), EquationError> {
        self.depth += 1;
        if self.depth > self.max_depth {
            Err(EquationError::TooDeep)
        } else {
            Ok(())
        }
    }

    fn factor(&mut self) -> Result<Val, EquationError> {
        let tok = self.peek().ok_or(EquationError::Syntax)?;
        self.pos += 1;
        match tok {
            Tok::Num(r) => {
                self.literals.push(r);
                Ok(Val {
                    exact: Some(r),
                    approx: r.to_f64(),
                })
            }
            Tok::LParen => {
                self.enter()?;
                let v = self.expr()?;
                if self.peek() != Some(Tok::RParen) {
                    return Err(EquationError::Syntax);
                }
                self.pos += 1;
                self.depth -= 1;
                Ok(v)
            }
            Tok::Minus if self.allow_unary => {
                self.enter()?;
                let v = self.factor()?;
                self.depth -= 1;
                Ok(Val {
                    exact: v.exact.and_then(|r| Rat::new(r.n.checked_neg()?, r.d)),
                    approx: -v.approx,
                })
            }
            _ => Err(EquationError::Syntax),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gt() -> Value {
        json!({"target": 24, "numbers": [3, 5, 8, 1]})
    }

    fn default_reward() -> CountdownReward {
        CountdownReward::new(CountdownConfig::default()).unwrap()
    }

    fn run(r: &CountdownReward, resp: &str) -> RewardOutput {
        r.score(&RewardInput::new("countdown", resp, gt())).unwrap()
    }

    #[test]
    fn correct_equation() {
        let r = default_reward();
        // Evaluates to 8 and reuses 3 and 1: a well-formed wrong answer.
        let out = run(
            &r,
            "<think>hmm</think><answer>(5 - 3 + 1) * 8 / 3 * 1</answer>",
        );
        assert_eq!(out.score, 0.1);
        let out = run(&r, "<think>hmm</think>\n<answer> (5 - 3 + 1) * 8 </answer>");
        assert_eq!(out.score, 1.0);
        assert_eq!(out.detail("correct"), Some(1.0));
        assert_eq!(run(&r, "<answer>8*3*(5-1)/4</answer>").score, 0.1);
        assert_eq!(run(&r, "<answer>8 * (1 - 3 + 5)</answer>").score, 1.0);
        // Exact rational arithmetic: 8/(3-8/3) = 24 exactly.
        let r2 = r
            .score(&RewardInput::new(
                "countdown",
                "<answer>8/(3-8/3)</answer>",
                json!({"target": 24, "numbers": [8, 3, 8, 3]}),
            ))
            .unwrap();
        assert_eq!(r2.score, 1.0);
    }

    #[test]
    fn wrong_and_missing() {
        let r = default_reward();
        // No answer tag at all.
        let out = run(&r, "(5 - 3 + 1) * 8");
        assert_eq!((out.score, out.detail("format")), (0.0, Some(0.0)));
        assert_eq!(run(&r, "").score, 0.0);
        assert_eq!(run(&r, "<answer>(5-3+1)*8").score, 0.0);
        assert_eq!(run(&r, "<answer></answer>").score, 0.0);
        // Right numbers, wrong value.
        let out = run(&r, "<answer>3+5+8+1</answer>");
        assert_eq!(
            (out.score, out.detail("numbers_ok"), out.detail("correct")),
            (0.1, Some(1.0), Some(0.0))
        );
        // Number reused / missing / extra.
        let out = run(&r, "<answer>8*3*1*1</answer>");
        assert_eq!((out.score, out.detail("numbers_ok")), (0.1, Some(0.0)));
        assert_eq!(run(&r, "<answer>8*3</answer>").score, 0.1);
        assert_eq!(run(&r, "<answer>(5-3+1)*8*1*1</answer>").score, 0.1);
        // Last block wins.
        assert_eq!(
            run(&r, "<answer>(5-3+1)*8</answer><answer>1</answer>").score,
            0.1
        );
        assert_eq!(
            run(&r, "<answer>1</answer> <answer>(5-3+1)*8</answer>").score,
            1.0
        );
    }

    #[test]
    fn malformed_equations() {
        let r = default_reward();
        for bad in [
            "(5-3+1)*8 = 24",
            "5 - 3 + 1) * 8",
            "((5 - 3 + 1) * 8",
            "(5 - 3 + 1) ** 8",
            "(5 - 3 + 1)8",
            "()",
            "8 / (5 - 5) + 3 + 1",
            "1..2 + 3",
            "1.2.3",
            "٣ + 5",
            "five",
            "__import__('os')",
            "(5 − 3 + 1) × 8",
            "+3",
            "-3 + 5 + 8 + 1",
        ] {
            let out = run(&r, &format!("<answer>{bad}</answer>"));
            assert_eq!(out.score, 0.1, "{bad}");
            assert_eq!(out.detail("valid"), Some(0.0), "{bad}");
        }
        let strict = CountdownReward::new(CountdownConfig {
            malformed_score: Some(0.0),
            ..CountdownConfig::default()
        })
        .unwrap();
        assert_eq!(run(&strict, "<answer>oops</answer>").score, 0.0);
        assert_eq!(run(&strict, "<answer>3+5+8+1</answer>").score, 0.1);
    }

    #[test]
    fn unary_minus_option() {
        let r = CountdownReward::new(CountdownConfig {
            allow_unary_minus: true,
            ..CountdownConfig::default()
        })
        .unwrap();
        assert_eq!(r.evaluate("-3 + 5").unwrap().value, 2.0);
        assert_eq!(r.evaluate("--3").unwrap().value, 3.0);
        assert_eq!(r.evaluate(&"-".repeat(100)), Err(EquationError::TooDeep));
        assert_eq!(default_reward().evaluate("-3"), Err(EquationError::Syntax));
    }

    #[test]
    fn deep_long_and_huge() {
        let r = default_reward();
        let deep = format!("{}1{}", "(".repeat(33), ")".repeat(33));
        assert_eq!(r.evaluate(&deep), Err(EquationError::TooDeep));
        let ok = format!("{}1{}", "(".repeat(32), ")".repeat(32));
        assert_eq!(r.evaluate(&ok).unwrap().value, 1.0);
        // Deep nesting beyond the length cap is rejected before parsing.
        let very_deep = format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000));
        assert_eq!(r.evaluate(&very_deep), Err(EquationError::TooLong));
        let big = CountdownReward::new(CountdownConfig {
            max_equation_chars: usize::MAX,
            ..CountdownConfig::default()
        })
        .unwrap();
        assert_eq!(big.evaluate(&very_deep), Err(EquationError::TooDeep));
        assert!(big.evaluate(&"1+".repeat(500_000)).is_err());
        assert_eq!(
            big.evaluate("1+".repeat(500_000).trim_end_matches('+'))
                .unwrap()
                .value,
            500_000.0
        );
        // 1 MB responses in every position.
        let mb = "x".repeat(1 << 20);
        assert_eq!(run(&r, &mb).score, 0.0);
        assert_eq!(run(&r, &format!("<answer>{mb}</answer>")).score, 0.1);
        assert_eq!(
            run(&r, &format!("{mb}<answer>(5-3+1)*8</answer>")).score,
            1.0
        );
        assert_eq!(run(&r, &"<answer>".repeat(100_000)).score, 0.0);
        // Overlong literals and overflow.
        assert_eq!(r.evaluate(&"9".repeat(31)), Err(EquationError::BadNumber));
        let e = r
            .evaluate(&format!("{0}*{0}*{0}*{0}", "9".repeat(30)))
            .unwrap();
        assert!(e.value > 1e119);
        assert_eq!(
            r.evaluate(&format!(
                "{0}*{0}*{0}*{0}/({0}*{0}*{0}*{0}-{0}*{0}*{0}*{0})",
                "9".repeat(30)
            )),
            Err(EquationError::DivisionByZero)
        );
        let huge_chain = vec!["9".repeat(30); 15].join("*");
        assert_eq!(r.evaluate(&huge_chain), Err(EquationError::Overflow));
    }

    #[test]
    fn tolerance_and_decimals() {
        let r = default_reward();
        let s = |resp: &str, gt: Value| {
            r.score(&RewardInput::new("countdown", resp, gt))
                .unwrap()
                .score
        };
        assert_eq!(
            s(
                "<answer>1/3*3</answer>",
                json!({"target": 1, "numbers": [1, 3, 3]})
            ),
            1.0
        );
        assert_eq!(
            s(
                "<answer>10/4</answer>",
                json!({"target": 2.5, "nums": [10, 4]})
            ),
            1.0
        );
        assert_eq!(
            s(
                "<answer>3.0*8</answer>",
                json!({"target": 24, "numbers": [3, 8]})
            ),
            1.0
        );
        assert_eq!(
            s(
                "<answer>3*8</answer>",
                json!({"target": "24", "numbers": ["3", 8.0]})
            ),
            1.0
        );
        assert_eq!(
            s(
                "<answer>3*8</answer>",
                json!("{\"target\": 24, \"numbers\": [3, 8]}")
            ),
            1.0
        );
        assert_eq!(
            s(
                "<answer>2.5*2</answer>",
                json!({"target": 5, "numbers": [2, 5, 2]})
            ),
            0.1
        );
    }

    #[test]
    fn unicode_and_whole_extract() {
        let r = default_reward();
        assert_eq!(run(&r, "日本語 🎉 <answer>（5-3+1)*8</answer>").score, 0.1);
        assert_eq!(
            run(&r, "日本語 🎉 <answer>(5-3+1)*8</answer> 🎉").score,
            1.0
        );
        assert_eq!(r.evaluate("1 + é"), Err(EquationError::BadChar('é')));
        let whole = CountdownReward::new(CountdownConfig {
            extract: AnswerExtract::Whole,
            ..CountdownConfig::default()
        })
        .unwrap();
        assert_eq!(run(&whole, " (5-3+1)*8 \n").score, 1.0);
    }

    #[test]
    fn bad_ground_truth() {
        let r = default_reward();
        for g in [
            json!(24),
            json!({"target": 24}),
            json!({"numbers": [1]}),
            json!({"target": "x", "numbers": [1]}),
            json!({"target": 1, "numbers": [[1]]}),
            json!("not json"),
        ] {
            let e = r
                .score(&RewardInput::new(
                    "countdown",
                    "<answer>1</answer>",
                    g.clone(),
                ))
                .unwrap_err();
            assert!(matches!(e, RewardError::InvalidGroundTruth { .. }), "{g}");
        }
    }

    #[test]
    fn config_checks() {
        assert!(CountdownReward::new(CountdownConfig {
            max_depth: 0,
            ..CountdownConfig::default()
        })
        .is_err());
        assert!(CountdownReward::new(CountdownConfig {
            score: f64::INFINITY,
            ..CountdownConfig::default()
        })
        .is_err());
        assert!(CountdownReward::new(CountdownConfig {
            tolerance: -1.0,
            ..CountdownConfig::default()
        })
        .is_err());
        let c: CountdownConfig =
            serde_json::from_value(json!({"format_score": 0.0, "extract": "whole"})).unwrap();
        assert_eq!((c.format_score, c.extract), (0.0, AnswerExtract::Whole));
        assert!(serde_json::from_value::<CountdownConfig>(json!({"formatscore": 0.0})).is_err());
    }
}
