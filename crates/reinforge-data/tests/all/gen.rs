//! Generators: determinism, countdown reachability (brute force), arithmetic correctness.

use reinforge_data::gen::{arith, countdown, ArithConfig, ArithOp, CountdownConfig};
use serde_json::Value;

/// Exact rational: (numerator, denominator), denominator > 0.
type Q = (i128, i128);

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 { a.abs() } else { gcd(b, a % b) }
}

fn norm((n, d): Q) -> Q {
    let g = gcd(n, d).max(1);
    let s = if d < 0 { -1 } else { 1 };
    (s * n / g, s * d / g)
}

/// Whether some expression over all of `nums`, each once, with + - * / equals `target`
/// (any intermediate values allowed, fractions included).
fn reachable(nums: &[Q], target: i128) -> bool {
    if nums.len() == 1 {
        return nums[0] == (target, 1);
    }
    for i in 0..nums.len() {
        for j in 0..nums.len() {
            if i == j {
                continue;
            }
            let rest: Vec<Q> = (0..nums.len()).filter(|&k| k != i && k != j).map(|k| nums[k]).collect();
            let ((a, b), (c, d)) = (nums[i], nums[j]);
            let mut options = vec![(a * d + c * b, b * d), (a * d - c * b, b * d), (a * c, b * d)];
            if c != 0 {
                options.push((a * d, b * c));
            }
            for q in options {
                let mut next = rest.clone();
                next.push(norm(q));
                if reachable(&next, target) {
                    return true;
                }
            }
        }
    }
    false
}

/// A tiny recursive-descent evaluator for `+ - * / ( )` over integers, exact rationals;
/// returns the value and the numbers used.
struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    used: Vec<i128>,
}

impl Parser<'_> {
    fn skip(&mut self) {
        while self.i < self.s.len() && self.s[self.i] == b' ' {
            self.i += 1;
        }
    }
    fn peek(&mut self) -> Option<u8> {
        self.skip();
        self.s.get(self.i).copied()
    }
    fn expr(&mut self) -> Q {
        let mut v = self.term();
        while let Some(op @ (b'+' | b'-')) = self.peek() {
            self.i += 1;
            let (c, d) = self.term();
            let s = if op == b'+' { 1 } else { -1 };
            v = norm((v.0 * d + s * c * v.1, v.1 * d));
        }
        v
    }
    fn term(&mut self) -> Q {
        let mut v = self.atom();
        while let Some(op @ (b'*' | b'/')) = self.peek() {
            self.i += 1;
            let (c, d) = self.atom();
            v = if op == b'*' { norm((v.0 * c, v.1 * d)) } else { norm((v.0 * d, v.1 * c)) };
        }
        v
    }
    fn atom(&mut self) -> Q {
        if self.peek() == Some(b'(') {
            self.i += 1;
            let v = self.expr();
            assert_eq!(self.peek(), Some(b')'));
            self.i += 1;
            return v;
        }
        let start = self.i;
        while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
            self.i += 1;
        }
        let n: i128 = std::str::from_utf8(&self.s[start..self.i]).unwrap().parse().expect("number");
        self.used.push(n);
        (n, 1)
    }
}

fn eval(expr: &str) -> (Q, Vec<i128>) {
    let mut p = Parser { s: expr.as_bytes(), i: 0, used: Vec::new() };
    let v = p.expr();
    assert_eq!(p.peek(), None, "trailing input in {expr:?}");
    (v, p.used)
}

#[test]
fn countdown_targets_are_reachable_and_solutions_check_out() {
    let cfg = CountdownConfig::default();
    let rows = countdown(60, 2024, &cfg).unwrap();
    assert_eq!(rows.len(), 60);
    let mut sizes = std::collections::BTreeSet::new();
    for (i, r) in rows.iter().enumerate() {
        assert_eq!((r.row, r.data_source.as_str(), r.ability.as_deref()), (i, "countdown", Some("math")));
        let target = r.ground_truth["target"].as_i64().unwrap() as i128;
        let numbers: Vec<i128> =
            r.ground_truth["numbers"].as_array().unwrap().iter().map(|n| n.as_i64().unwrap() as i128).collect();
        sizes.insert(numbers.len());
        assert!((3..=4).contains(&numbers.len()));
        assert!(numbers.iter().all(|n| (1..=20).contains(n)));
        assert!((1..=100).contains(&target));
        assert!(reachable(&numbers.iter().map(|&n| (n, 1)).collect::<Vec<_>>(), target), "{numbers:?} -> {target}");

        let solution = r.extra_info["solution"].as_str().unwrap();
        let (value, mut used) = eval(solution);
        assert_eq!(value, (target, 1), "{solution}");
        let mut expected = numbers.clone();
        used.sort();
        expected.sort();
        assert_eq!(used, expected, "{solution} must use each number once");

        let prompt = r.messages[0]["content"].as_str().unwrap();
        assert_eq!(r.messages[0]["role"], "user");
        assert!(prompt.contains(&format!("equals {target}")));
        assert!(prompt.contains("<think> </think>") && prompt.contains("<answer> (1 + 2) / 3 </answer>"));
    }
    assert_eq!(sizes.into_iter().collect::<Vec<_>>(), [3, 4], "both sizes occur");
}

#[test]
fn generators_are_deterministic_and_prefix_stable() {
    let cd = CountdownConfig::default();
    assert_eq!(countdown(20, 5, &cd).unwrap(), countdown(20, 5, &cd).unwrap());
    assert_eq!(countdown(8, 5, &cd).unwrap(), countdown(20, 5, &cd).unwrap()[..8]);
    assert_ne!(countdown(20, 5, &cd).unwrap(), countdown(20, 6, &cd).unwrap());
    let ar = ArithConfig::default();
    assert_eq!(arith(20, 5, &ar).unwrap(), arith(20, 5, &ar).unwrap());
    assert_ne!(arith(20, 5, &ar).unwrap(), arith(20, 6, &ar).unwrap());
}

#[test]
fn countdown_respects_config_and_rejects_impossible_ones() {
    let cfg = CountdownConfig {
        min_numbers: 4,
        max_numbers: 4,
        min_number: 5,
        max_number: 9,
        min_target: 50,
        max_target: 60,
        system_prompt: Some("Think carefully.".into()),
    };
    for r in countdown(10, 1, &cfg).unwrap() {
        let t = r.ground_truth["target"].as_u64().unwrap();
        assert!((50..=60).contains(&t));
        let nums = r.ground_truth["numbers"].as_array().unwrap();
        assert_eq!(nums.len(), 4);
        assert!(nums.iter().all(|n| (5..=9).contains(&n.as_u64().unwrap())));
        assert_eq!(r.messages[0], serde_json::json!({"role": "system", "content": "Think carefully."}));
        assert_eq!(r.messages[1]["role"], "user");
    }
    let bad = CountdownConfig { min_numbers: 1, ..CountdownConfig::default() };
    assert!(countdown(1, 1, &bad).is_err());
    // Targets above anything 2 numbers <= 2 can make: an error, not a hang.
    let impossible = CountdownConfig {
        min_numbers: 2,
        max_numbers: 2,
        max_number: 2,
        min_target: 1000,
        max_target: 2000,
        ..CountdownConfig::default()
    };
    let msg = countdown(1, 1, &impossible).unwrap_err().to_string();
    assert!(msg.contains("widen the target"), "{msg}");
}

fn check_arith(cfg: &ArithConfig, n: usize) -> Vec<Value> {
    let rows = arith(n, 11, cfg).unwrap();
    for r in &rows {
        assert_eq!(r.data_source, "arith");
        let expr = r.extra_info["expression"].as_str().unwrap();
        let prompt = r.messages.last().unwrap()["content"].as_str().unwrap();
        assert_eq!(prompt, format!("What is {expr}? Respond with only the resulting number."));
        // The parser reads non-negative literals; a leading operand is never negative.
        let ((num, den), used) = eval(expr);
        assert_eq!(den, 1, "{expr} must be an exact integer");
        assert_eq!(used.len(), cfg.terms);
        assert!(used.iter().all(|&x| x >= cfg.min_operand as i128 && x <= cfg.max_operand as i128), "{expr}");
        assert_eq!(r.ground_truth, Value::String(num.to_string()), "{expr}");
        if !cfg.allow_negative {
            assert!(num >= 0);
        }
    }
    rows.into_iter().map(|r| r.ground_truth).collect()
}

#[test]
fn arith_answers_are_correct() {
    check_arith(&ArithConfig::default(), 50);
    let all_ops = ArithConfig {
        terms: 3,
        min_operand: 1,
        max_operand: 12,
        ops: vec![ArithOp::Add, ArithOp::Sub, ArithOp::Mul],
        ..ArithConfig::default()
    };
    check_arith(&all_ops, 100);
    let signed = ArithConfig { allow_negative: true, ops: vec![ArithOp::Sub], ..ArithConfig::default() };
    let answers = check_arith(&signed, 100);
    assert!(answers.iter().any(|a| a.as_str().unwrap().starts_with('-')), "some negative answers");
    let div = ArithConfig { ops: vec![ArithOp::Div], min_operand: 1, max_operand: 999, ..ArithConfig::default() };
    check_arith(&div, 100);
    let digits = ArithConfig { max_operand: 9, ..ArithConfig::default() };
    for r in arith(30, 1, &digits).unwrap() {
        assert!(r.extra_info["expression"].as_str().unwrap().len() == 5, "single digits: d + d");
    }
}

#[test]
fn arith_rejects_bad_configs() {
    let div3 = ArithConfig { terms: 3, ops: vec![ArithOp::Div], ..ArithConfig::default() };
    assert!(arith(1, 1, &div3).unwrap_err().to_string().contains("div is only supported with terms = 2"));
    assert!(arith(1, 1, &ArithConfig { ops: vec![], ..ArithConfig::default() }).is_err());
    assert!(arith(1, 1, &ArithConfig { min_operand: 5, max_operand: 4, ..ArithConfig::default() }).is_err());
    let cfg: ArithConfig = serde_json::from_value(serde_json::json!({"ops": ["add", "mul"], "max_operand": 9})).unwrap();
    assert_eq!(cfg.ops, [ArithOp::Add, ArithOp::Mul]);
}
