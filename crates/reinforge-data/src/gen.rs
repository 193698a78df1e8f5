//! Deterministic synthetic tasks for small, CPU-sized RL runs.
//!
//! Each generator draws from one ChaCha stream seeded with `seed`, so the same
//! `(n, seed, config)` always yields the same rows, and a shorter run is a prefix of a
//! longer one. Write them out with [`crate::write_jsonl`] / [`crate::write_parquet`], or
//! feed them straight to [`crate::Dataset::from_records`].

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::loader::below;
use crate::{DataError, PromptRecord, Result};

/// A uniform integer in `lo..=hi`.
fn range(rng: &mut ChaCha8Rng, lo: u64, hi: u64) -> u64 {
    lo + below(rng, hi - lo + 1)
}

fn chat(system: &Option<String>, user: String) -> Vec<Value> {
    let mut m = Vec::new();
    if let Some(s) = system {
        m.push(json!({"role": "system", "content": s}));
    }
    m.push(json!({"role": "user", "content": user}));
    m
}

/// Settings for [`countdown`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CountdownConfig {
    /// Fewest numbers per puzzle (at least 2).
    pub min_numbers: usize,
    /// Most numbers per puzzle (at most 6).
    pub max_numbers: usize,
    /// Smallest number drawn (at least 1).
    pub min_number: u64,
    /// Largest number drawn (at most 1000).
    pub max_number: u64,
    /// Smallest target.
    pub min_target: u64,
    /// Largest target.
    pub max_target: u64,
    /// Optional system message before the user turn.
    pub system_prompt: Option<String>,
}

impl Default for CountdownConfig {
    fn default() -> Self {
        // Smaller numbers than TinyZero's 1..=100 so that tiny models on CPU can learn it.
        CountdownConfig {
            min_numbers: 3,
            max_numbers: 4,
            min_number: 1,
            max_number: 20,
            min_target: 1,
            max_target: 100,
            system_prompt: None,
        }
    }
}

/// The TinyZero countdown prompt.
pub fn countdown_prompt(numbers: &[u64], target: u64) -> String {
    format!(
        "Using the numbers {numbers:?}, create an equation that equals {target}. You can use basic \
         arithmetic operations (+, -, *, /) and each number can only be used once. Show your work \
         in <think> </think> tags. And return the final answer in <answer> </answer> tags, for \
         example <answer> (1 + 2) / 3 </answer>."
    )
}

struct Node {
    value: u64,
    text: String,
    atom: bool,
}

impl Node {
    fn operand(&self) -> String {
        if self.atom {
            self.text.clone()
        } else {
            format!("({})", self.text)
        }
    }
}

/// Combines all numbers with random operations into one expression; every intermediate
/// result is a positive integer, so the target is reachable with exact integer steps.
/// `None` on overflow.
fn random_expression(rng: &mut ChaCha8Rng, numbers: &[u64]) -> Option<Node> {
    let mut pool: Vec<Node> =
        numbers.iter().map(|&n| Node { value: n, text: n.to_string(), atom: true }).collect();
    while pool.len() > 1 {
        let i = below(rng, pool.len() as u64) as usize;
        let x = pool.swap_remove(i);
        let j = below(rng, pool.len() as u64) as usize;
        let y = pool.swap_remove(j);
        let (a, b) = (x.value, y.value);
        let (value, text) = match below(rng, 4) {
            1 if a != b => {
                let (big, small) = if a > b { (&x, &y) } else { (&y, &x) };
                (big.value - small.value, format!("{} - {}", big.operand(), small.operand()))
            }
            2 => (a.checked_mul(b)?, format!("{} * {}", x.operand(), y.operand())),
            3 if a % b == 0 => (a / b, format!("{} / {}", x.operand(), y.operand())),
            3 if b % a == 0 => (b / a, format!("{} / {}", y.operand(), x.operand())),
            // '+', and the fallback when '-' would give 0 or '/' would not divide exactly.
            _ => (a.checked_add(b)?, format!("{} + {}", x.operand(), y.operand())),
        };
        pool.push(Node { value, text, atom: false });
    }
    pool.pop()
}

/// TinyZero-style countdown: reach a target from 3–4 numbers with `+ - * /`, each number once.
///
/// `ground_truth = {"target": T, "numbers": [...]}`; `extra_info` holds the row `index`
/// and one `solution` expression (every number used exactly once).
pub fn countdown(n: usize, seed: u64, cfg: &CountdownConfig) -> Result<Vec<PromptRecord>> {
    let bad = |m: &str| Err(DataError::Config(format!("countdown config: {m}")));
    if cfg.min_numbers < 2 || cfg.min_numbers > cfg.max_numbers || cfg.max_numbers > 6 {
        return bad("need 2 <= min_numbers <= max_numbers <= 6");
    }
    if cfg.min_number < 1 || cfg.min_number > cfg.max_number || cfg.max_number > 1000 {
        return bad("need 1 <= min_number <= max_number <= 1000");
    }
    if cfg.min_target > cfg.max_target {
        return bad("need min_target <= max_target");
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n);
    for index in 0..n {
        let mut found = None;
        // Random expressions rarely miss the target range by default; the bound only
        // turns an impossible config (e.g. max_target below every reachable value) into an error.
        for _ in 0..10_000 {
            let k = range(&mut rng, cfg.min_numbers as u64, cfg.max_numbers as u64) as usize;
            let numbers: Vec<u64> =
                (0..k).map(|_| range(&mut rng, cfg.min_number, cfg.max_number)).collect();
            let Some(expr) = random_expression(&mut rng, &numbers) else { continue };
            if (cfg.min_target..=cfg.max_target).contains(&expr.value) {
                found = Some((numbers, expr));
                break;
            }
        }
        let Some((numbers, expr)) = found else {
            return bad(&format!(
                "no target in {}..={} found after 10000 tries; widen the target or number range",
                cfg.min_target, cfg.max_target
            ));
        };
        out.push(PromptRecord {
            row: index,
            data_source: "countdown".into(),
            messages: chat(&cfg.system_prompt, countdown_prompt(&numbers, expr.value)),
            ground_truth: json!({"target": expr.value, "numbers": numbers}),
            extra_info: json!({"index": index, "solution": expr.text}),
            ability: Some("math".into()),
        });
    }
    Ok(out)
}

/// An arithmetic operation for [`arith`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArithOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/` (exact integer division only; two-term expressions only)
    Div,
}

impl ArithOp {
    /// The operator as written in prompts.
    pub fn symbol(self) -> &'static str {
        match self {
            ArithOp::Add => "+",
            ArithOp::Sub => "-",
            ArithOp::Mul => "*",
            ArithOp::Div => "/",
        }
    }
}

/// Settings for [`arith`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArithConfig {
    /// Operands per expression (1..=6; 1 gives an echo task).
    pub terms: usize,
    /// Smallest operand.
    pub min_operand: u64,
    /// Largest operand (e.g. 99 for two-digit numbers).
    pub max_operand: u64,
    /// Operations to draw from.
    pub ops: Vec<ArithOp>,
    /// Allow negative answers (otherwise such expressions are redrawn).
    pub allow_negative: bool,
    /// Optional system message before the user turn.
    pub system_prompt: Option<String>,
}

impl Default for ArithConfig {
    fn default() -> Self {
        ArithConfig {
            terms: 2,
            min_operand: 0,
            max_operand: 99,
            ops: vec![ArithOp::Add],
            allow_negative: false,
            system_prompt: None,
        }
    }
}

/// Evaluates `operands[0] ops[0] operands[1] ...` with `*` before `+`/`-`; `None` on overflow.
fn eval_no_div(operands: &[i64], ops: &[ArithOp]) -> Option<i64> {
    // Fold products into terms, then sum the signed terms left to right.
    let mut total = 0i64;
    let mut term = operands[0];
    let mut sign = 1i64;
    for (op, &x) in ops.iter().zip(&operands[1..]) {
        match op {
            ArithOp::Mul => term = term.checked_mul(x)?,
            ArithOp::Add | ArithOp::Sub => {
                total = total.checked_add(sign.checked_mul(term)?)?;
                sign = if *op == ArithOp::Add { 1 } else { -1 };
                term = x;
            }
            ArithOp::Div => unreachable!("division is limited to two-term expressions"),
        }
    }
    total.checked_add(sign.checked_mul(term)?)
}

/// Small arithmetic (`a + b` by default): the answer is an integer given as a string.
///
/// `data_source = "arith"`, `ground_truth = "<answer>"`, `extra_info = {index, expression}`.
pub fn arith(n: usize, seed: u64, cfg: &ArithConfig) -> Result<Vec<PromptRecord>> {
    let bad = |m: &str| Err(DataError::Config(format!("arith config: {m}")));
    // terms = 1 ("What is 7?") is an echo task: the quickstart's warm-up for tiny random models.
    if !(1..=6).contains(&cfg.terms) {
        return bad("terms must be in 1..=6");
    }
    if cfg.ops.is_empty() {
        return bad("ops must not be empty");
    }
    if cfg.ops.contains(&ArithOp::Div) && cfg.terms != 2 {
        return bad("div is only supported with terms = 2 (exact integer division)");
    }
    if cfg.min_operand > cfg.max_operand || cfg.max_operand > 1_000_000_000 {
        return bad("need min_operand <= max_operand <= 1000000000");
    }
    if cfg.ops == [ArithOp::Div] && cfg.max_operand == 0 {
        return bad("div needs max_operand >= 1");
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n);
    for index in 0..n {
        let mut found = None;
        for _ in 0..10_000 {
            let ops: Vec<ArithOp> = (1..cfg.terms)
                .map(|_| cfg.ops[below(&mut rng, cfg.ops.len() as u64) as usize])
                .collect();
            let (operands, value) = if ops.first() == Some(&ArithOp::Div) {
                // Draw divisor and quotient so the division is exact and the dividend in range.
                let lo = cfg.min_operand.max(1);
                if lo > cfg.max_operand {
                    continue;
                }
                let b = range(&mut rng, lo, cfg.max_operand);
                let (q_lo, q_hi) = (cfg.min_operand.div_ceil(b), cfg.max_operand / b);
                if q_lo > q_hi {
                    continue;
                }
                let q = range(&mut rng, q_lo, q_hi);
                (vec![(b * q) as i64, b as i64], Some(q as i64))
            } else {
                let operands: Vec<i64> = (0..cfg.terms)
                    .map(|_| range(&mut rng, cfg.min_operand, cfg.max_operand) as i64)
                    .collect();
                let value = eval_no_div(&operands, &ops);
                (operands, value)
            };
            match value {
                Some(v) if v >= 0 || cfg.allow_negative => {
                    found = Some((operands, ops, v));
                    break;
                }
                _ => continue,
            }
        }
        let Some((operands, ops, value)) = found else {
            return bad("could not draw a valid expression after 10000 tries; check the operand range");
        };
        let mut expression = operands[0].to_string();
        for (op, x) in ops.iter().zip(&operands[1..]) {
            expression.push_str(&format!(" {} {x}", op.symbol()));
        }
        let prompt = format!("What is {expression}? Respond with only the resulting number.");
        out.push(PromptRecord {
            row: index,
            data_source: "arith".into(),
            messages: chat(&cfg.system_prompt, prompt),
            ground_truth: Value::String(value.to_string()),
            extra_info: json!({"index": index, "expression": expression}),
            ability: Some("math".into()),
        });
    }
    Ok(out)
}
