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

/// Search-R1's prompt (`scripts/data_process/nq_search.py`, template `base`), verbatim — its
/// "as your want" included — with `{question}` to fill.
pub const SEARCH_R1_TEMPLATE: &str = "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> and it will return the top searched results between <information> and </information>. You can search as many times as your want. If you find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n";

/// Search-R1's prompt for one question: stripped, `?` added when missing, as its
/// preprocessing does.
pub fn search_r1_prompt(question: &str) -> String {
    let mut q = question.trim().to_string();
    if !q.ends_with('?') {
        q.push('?');
    }
    SEARCH_R1_TEMPLATE.replace("{question}", &q)
}

/// Settings for [`search_task`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchTaskConfig {
    /// Invented entities in the corpus (each has one passage).
    pub entities: usize,
    /// The colours an entity can have (the answers).
    pub colors: Vec<String>,
    /// Held-out questions (the test split) besides the `n` training ones.
    pub test: usize,
    /// Search-R1's prompt template (`{question}` is replaced); by default Search-R1's own.
    pub template: Option<String>,
}

impl Default for SearchTaskConfig {
    fn default() -> Self {
        SearchTaskConfig {
            entities: 16,
            // As many colours as entities by default: each answer names one entity, so only the
            // right search finds the passage holding it.
            colors: [
                "red", "blue", "green", "yellow", "purple", "orange", "white", "black", "pink", "brown", "grey", "gold", "silver",
                "violet", "cyan", "teal",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            test: 64,
            template: None,
        }
    }
}

/// Syllables of the invented names: pronounceable, and no English word among them.
const SYLLABLES: [&str; 16] = ["zor", "blax", "quen", "taro", "vel", "mira", "drak", "tho", "ul", "ix", "brem", "pha", "kov", "yun", "sel", "gar"];

/// The invented entity names of a search task (distinct, lowercase, seeded).
pub fn entity_names(n: usize, seed: u64) -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5EA2_C4E5);
    let mut names: Vec<String> = Vec::with_capacity(n);
    while names.len() < n {
        let s = SYLLABLES.len() as u64;
        let name = format!("{}{}", SYLLABLES[below(&mut rng, s) as usize], SYLLABLES[below(&mut rng, s) as usize]);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// A search task: facts about invented entities, findable only by searching.
pub struct SearchTask {
    /// Training questions.
    pub train: Vec<PromptRecord>,
    /// Held-out questions.
    pub test: Vec<PromptRecord>,
    /// The corpus, Search-R1's way: `(id, contents)` with contents `"Name"\nThe name is colour.`
    pub corpus: Vec<(String, String)>,
}

/// A self-contained search task: every entity gets a colour at random, each colour as often
/// as the others (so it cannot be known, nor guessed better than chance, without looking it
/// up), one passage says so, and each question asks for one entity's
/// colour in Search-R1's prompt. Rows are Search-R1's (`data_source = "synthetic_search"`,
/// `ability = "fact-reasoning"`, `reward_model.ground_truth = {"target": [colour]}`,
/// `extra_info = {split, index}`), scored by `qa_em`.
pub fn search_task(n: usize, seed: u64, cfg: &SearchTaskConfig) -> Result<SearchTask> {
    let bad = |m: &str| Err(DataError::Config(format!("search task: {m}")));
    if !(1..=SYLLABLES.len() * SYLLABLES.len() / 2).contains(&cfg.entities) {
        return bad(&format!("entities must be in 1..={}", SYLLABLES.len() * SYLLABLES.len() / 2));
    }
    if cfg.colors.len() < 2 || cfg.colors.iter().any(|c| c.trim().is_empty() || c.contains(char::is_whitespace)) {
        return bad("colors needs at least two one-word colours");
    }
    let template = cfg.template.clone().unwrap_or_else(|| SEARCH_R1_TEMPLATE.to_string());
    if !template.contains("{question}") {
        return bad("the template must contain {question}");
    }
    let names = entity_names(cfg.entities, seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Balanced answers: every colour goes to as many entities as the others (± 1), in a
    // seeded order, so no colour is a better guess than another without the corpus.
    let mut order: Vec<usize> = (0..names.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, below(&mut rng, i as u64 + 1) as usize);
    }
    let mut colors: Vec<&String> = vec![&cfg.colors[0]; names.len()];
    for (k, &e) in order.iter().enumerate() {
        colors[e] = &cfg.colors[k % cfg.colors.len()];
    }
    let corpus = names
        .iter()
        .zip(&colors)
        .enumerate()
        .map(|(i, (name, color))| {
            let title = format!("{}{}", name[..1].to_uppercase(), &name[1..]);
            (i.to_string(), format!("\"{title}\"\nThe {name} is {color}."))
        })
        .collect();
    let mut make = |count: usize, split: &str| -> Vec<PromptRecord> {
        (0..count)
            .map(|index| {
                let e = below(&mut rng, names.len() as u64) as usize;
                let question = format!("What color is the {}?", names[e]);
                let mut q = question.trim().to_string();
                if !q.ends_with('?') {
                    q.push('?');
                }
                PromptRecord {
                    row: index,
                    data_source: "synthetic_search".into(),
                    messages: chat(&None, template.replace("{question}", &q)),
                    ground_truth: json!({"target": [colors[e]]}),
                    extra_info: json!({"split": split, "index": index}),
                    ability: Some("fact-reasoning".into()),
                }
            })
            .collect()
    };
    let train = make(n, "train");
    let test = make(cfg.test, "test");
    Ok(SearchTask { train, test, corpus })
}

#[cfg(test)]
mod search_task_tests {
    use super::*;

    #[test]
    fn the_prompt_is_search_r1s_and_the_answer_is_in_the_corpus_only() {
        assert!(search_r1_prompt(" who won ").ends_with("Question: who won?\n"));
        assert!(SEARCH_R1_TEMPLATE.contains("as your want") && SEARCH_R1_TEMPLATE.contains("For example, <answer> Beijing </answer>."));
        let t = search_task(50, 7, &SearchTaskConfig::default()).unwrap();
        assert_eq!((t.train.len(), t.test.len(), t.corpus.len()), (50, 64, 16));
        for r in t.train.iter().chain(&t.test) {
            let prompt = r.messages[0]["content"].as_str().unwrap();
            let color = r.ground_truth["target"][0].as_str().unwrap();
            let name = prompt.rsplit("the ").next().unwrap().trim_end_matches("?\n");
            assert!(!prompt.contains(&format!(" {color} ")) || prompt.contains("Beijing"), "the prompt does not give the answer away");
            let passage = t.corpus.iter().find(|(_, c)| c.contains(&format!("The {name} is"))).expect("a passage per entity");
            assert!(passage.1.ends_with(&format!("is {color}.")), "{passage:?} vs {color}");
            assert_eq!(r.data_source, "synthetic_search");
        }
        let mut per_color = std::collections::BTreeMap::new();
        for (_, c) in &t.corpus {
            *per_color.entry(c.rsplit(' ').next().unwrap().to_string()).or_insert(0) += 1;
        }
        assert_eq!(per_color.values().copied().collect::<Vec<_>>(), [1; 16], "one colour each: {per_color:?}");
        let many = search_task(5, 7, &SearchTaskConfig { entities: 40, ..Default::default() }).unwrap();
        let mut per_color = std::collections::BTreeMap::new();
        for (_, c) in &many.corpus {
            *per_color.entry(c.rsplit(' ').next().unwrap().to_string()).or_insert(0) += 1;
        }
        assert!(per_color.values().all(|&n| n == 2 || n == 3), "balanced: {per_color:?}");
        // Same seed, same task; a shorter run is a prefix of a longer one.
        let again = search_task(10, 7, &SearchTaskConfig::default()).unwrap();
        assert_eq!(again.corpus, t.corpus);
        assert_eq!(again.train[..], t.train[..10]);
    }
}
