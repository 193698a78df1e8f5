//! Hydra's override grammar, as verl's `main_ppo` reads its command line: `key=value`,
//! `+key=value` (add), `++key=value` (add or override), `~key` / `~key=value` (delete), and
//! values that are `null`, booleans in any case, numbers such as `1e-6`, quoted strings,
//! lists `[a,'b']` and dicts `{a: 1}`.
//!
//! Written by hand: the grammar is small and no Rust crate implements Hydra's; what a shell
//! leaves of `trainer.logger=['console','wandb']` (the quotes removed: `[console,wandb]`) must
//! parse the same as the quoted form.

use crate::CompatError;

/// A value as Hydra types it.
#[derive(Debug, Clone, PartialEq)]
pub enum HValue {
    /// `null`.
    Null,
    /// `true` / `False` / `TRUE`...
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float (`1e-6`, `0.5`, `inf`).
    Float(f64),
    /// Anything else, or a quoted string.
    Str(String),
    /// `[a, b]`.
    List(Vec<HValue>),
    /// `{k: v}`.
    Dict(Vec<(String, HValue)>),
}

impl HValue {
    /// The value as a float, for numeric keys.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            HValue::Int(i) => Some(*i as f64),
            HValue::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The value as a non-negative integer.
    pub fn as_usize(&self) -> Option<usize> {
        match self {
            HValue::Int(i) => usize::try_from(*i).ok(),
            HValue::Float(f) if f.fract() == 0.0 && *f >= 0.0 => Some(*f as usize),
            _ => None,
        }
    }

    /// The value as a signed integer.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            HValue::Int(i) => Some(*i),
            HValue::Float(f) if f.fract() == 0.0 => Some(*f as i64),
            _ => None,
        }
    }

    /// The value as a boolean (Hydra's, or 0/1).
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            HValue::Bool(b) => Some(*b),
            HValue::Int(0) => Some(false),
            HValue::Int(1) => Some(true),
            _ => None,
        }
    }

    /// The value as text: strings as they are, numbers and booleans written out.
    pub fn as_text(&self) -> Option<String> {
        match self {
            HValue::Str(s) => Some(s.clone()),
            HValue::Int(i) => Some(i.to_string()),
            HValue::Float(f) => Some(f.to_string()),
            HValue::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }

    /// Whether this is `null`.
    pub fn is_null(&self) -> bool {
        matches!(self, HValue::Null)
    }
}

impl std::fmt::Display for HValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HValue::Null => write!(f, "null"),
            HValue::Bool(b) => write!(f, "{b}"),
            HValue::Int(i) => write!(f, "{i}"),
            HValue::Float(x) => write!(f, "{x:?}"),
            HValue::Str(s) if s.is_empty() || s.contains([',', ' ', '[', ']', '{', '}', '\'', '"', '=']) => write!(f, "'{s}'"),
            HValue::Str(s) => write!(f, "{s}"),
            HValue::List(v) => {
                write!(f, "[")?;
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        write!(f, ",")?;
                    }
                    write!(f, "{x}")?;
                }
                write!(f, "]")
            }
            HValue::Dict(v) => {
                write!(f, "{{")?;
                for (i, (k, x)) in v.iter().enumerate() {
                    if i > 0 {
                        write!(f, ",")?;
                    }
                    write!(f, "{k}:{x}")?;
                }
                write!(f, "}}")
            }
        }
    }
}

/// What an override does to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `key=value`: the key must exist.
    Set,
    /// `+key=value`: the key must not exist yet.
    Add,
    /// `++key=value`: set whether or not it exists.
    Force,
    /// `~key`: back to the default (removed).
    Delete,
}

/// One parsed command-line override.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// As typed (for the report).
    pub raw: String,
    /// Set, add, force or delete.
    pub op: Op,
    /// Dotted key.
    pub key: String,
    /// The value (`Null` for a delete without one).
    pub value: HValue,
}

/// Parses one override as Hydra does.
pub fn parse_override(raw: &str) -> Result<Override, CompatError> {
    let bad = |why: &str| CompatError::Syntax { arg: raw.to_string(), why: why.to_string() };
    let (op, rest) = if let Some(r) = raw.strip_prefix("++") {
        (Op::Force, r)
    } else if let Some(r) = raw.strip_prefix('+') {
        (Op::Add, r)
    } else if let Some(r) = raw.strip_prefix('~') {
        (Op::Delete, r)
    } else {
        (Op::Set, raw)
    };
    let (key, value) = match rest.split_once('=') {
        Some((k, v)) => (k.trim(), Some(v)),
        None if op == Op::Delete => (rest.trim(), None),
        None => return Err(bad("expected key=value (e.g. actor_rollout_ref.actor.optim.lr=1e-6)")),
    };
    if key.is_empty() || key.split('.').any(|p| p.is_empty() || p.contains(char::is_whitespace)) {
        return Err(bad("the key must be dotted names, e.g. data.train_batch_size"));
    }
    let value = match value {
        Some(v) => parse_value(v).map_err(|w| bad(&w))?,
        None => HValue::Null,
    };
    Ok(Override { raw: raw.to_string(), op, key: key.to_string(), value })
}

/// Parses a Hydra value.
pub fn parse_value(text: &str) -> Result<HValue, String> {
    let mut p = Parser { s: text.as_bytes(), i: 0, text };
    let v = p.value(true)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("unexpected `{}` after the value", &text[p.i..]));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    text: &'a str,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    /// `top`: the whole right-hand side, where unquoted text may hold spaces and commas.
    fn value(&mut self, top: bool) -> Result<HValue, String> {
        self.ws();
        match self.s.get(self.i) {
            None => Ok(HValue::Str(String::new())),
            Some(b'[') => self.list(),
            Some(b'{') => self.dict(),
            Some(b'\'') | Some(b'"') => self.quoted(),
            Some(_) => {
                let start = self.i;
                if top {
                    self.i = self.s.len();
                } else {
                    while self.i < self.s.len() && !matches!(self.s[self.i], b',' | b']' | b'}') {
                        self.i += 1;
                    }
                }
                Ok(primitive(self.text[start..self.i].trim()))
            }
        }
    }

    fn quoted(&mut self) -> Result<HValue, String> {
        let q = self.s[self.i];
        self.i += 1;
        let mut out = String::new();
        let start = self.i;
        let mut chars = self.text[start..].char_indices();
        while let Some((off, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        out.push(n);
                    }
                }
                c if c as u32 == q as u32 => {
                    self.i = start + off + 1;
                    return Ok(HValue::Str(out));
                }
                c => out.push(c),
            }
        }
        Err("a quoted string is not closed".into())
    }

    fn list(&mut self) -> Result<HValue, String> {
        self.i += 1;
        let mut items = Vec::new();
        loop {
            self.ws();
            match self.s.get(self.i) {
                Some(b']') => {
                    self.i += 1;
                    return Ok(HValue::List(items));
                }
                None => return Err("a list `[` is not closed".into()),
                _ => {}
            }
            items.push(self.value(false)?);
            self.ws();
            match self.s.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b']') => {}
                None => return Err("a list `[` is not closed".into()),
                _ => return Err("expected `,` or `]` in a list".into()),
            }
        }
    }

    fn dict(&mut self) -> Result<HValue, String> {
        self.i += 1;
        let mut items = Vec::new();
        loop {
            self.ws();
            match self.s.get(self.i) {
                Some(b'}') => {
                    self.i += 1;
                    return Ok(HValue::Dict(items));
                }
                None => return Err("a dict `{` is not closed".into()),
                _ => {}
            }
            let start = self.i;
            while self.i < self.s.len() && self.s[self.i] != b':' {
                self.i += 1;
            }
            if self.i == self.s.len() {
                return Err("expected `key: value` in a dict".into());
            }
            let key = self.text[start..self.i].trim().trim_matches(['\'', '"']).to_string();
            self.i += 1;
            let v = self.value(false)?;
            items.push((key, v));
            self.ws();
            match self.s.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b'}') => {}
                None => return Err("a dict `{` is not closed".into()),
                _ => return Err("expected `,` or `}` in a dict".into()),
            }
        }
    }
}

/// An unquoted word typed as Hydra types it.
fn primitive(w: &str) -> HValue {
    let lower = w.to_ascii_lowercase();
    match lower.as_str() {
        "null" => return HValue::Null,
        "true" => return HValue::Bool(true),
        "false" => return HValue::Bool(false),
        "inf" | "+inf" => return HValue::Float(f64::INFINITY),
        "-inf" => return HValue::Float(f64::NEG_INFINITY),
        "nan" => return HValue::Float(f64::NAN),
        _ => {}
    }
    let digits = w.replace('_', "");
    if let Ok(i) = digits.parse::<i64>() {
        return HValue::Int(i);
    }
    let numeric = w.chars().any(|c| c.is_ascii_digit()) && w.chars().all(|c| c.is_ascii_digit() || "+-.eE_".contains(c));
    if numeric {
        if let Ok(f) = digits.parse::<f64>() {
            return HValue::Float(f);
        }
    }
    HValue::Str(w.to_string())
}

/// Hydra's own flags on verl's command line (`--config-path DIR`, `--config-name NAME`,
/// `--config-dir DIR`, or `-cp`/`-cn`/`-cd`, each also as `flag=value`), which come before or
/// among the overrides: the long flag's name (`config-name`), its value (`None`: missing), and
/// whether `next` (the following word, for the spaced form) was taken as the value; `None` for
/// anything else.
pub fn hydra_flag(word: &str, next: Option<&str>) -> Option<(&'static str, Option<String>, bool)> {
    const FLAGS: [(&str, &str, &str); 3] = [("--config-path", "-cp", "config-path"), ("--config-name", "-cn", "config-name"), ("--config-dir", "-cd", "config-dir")];
    for (long, short, name) in FLAGS {
        for f in [long, short] {
            if word == f {
                // A following flag is not a value (Hydra's parser says the same).
                return Some(match next.filter(|n| !n.starts_with('-')) {
                    Some(v) => (name, Some(v.to_string()), true),
                    None => (name, None, false),
                });
            }
            if let Some(v) = word.strip_prefix(f).and_then(|r| r.strip_prefix('=')) {
                return Some((name, (!v.is_empty()).then(|| v.to_string()), false));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> HValue {
        parse_value(s).unwrap()
    }

    #[test]
    fn values_are_typed_as_hydra_types_them() {
        assert_eq!(v("1e-6"), HValue::Float(1e-6));
        assert_eq!(v("256"), HValue::Int(256));
        assert_eq!(v("-1"), HValue::Int(-1));
        assert_eq!(v("False"), HValue::Bool(false));
        assert_eq!(v("TRUE"), HValue::Bool(true));
        assert_eq!(v("null"), HValue::Null);
        assert_eq!(v("vllm"), HValue::Str("vllm".into()));
        assert_eq!(v("/data/gsm8k/train.parquet"), HValue::Str("/data/gsm8k/train.parquet".into()));
        assert_eq!(v("'1e-6'"), HValue::Str("1e-6".into()));
        assert_eq!(v("\"a b\""), HValue::Str("a b".into()));
        assert_eq!(v("Qwen/Qwen2.5-0.5B-Instruct"), HValue::Str("Qwen/Qwen2.5-0.5B-Instruct".into()));
        assert_eq!(v("1.5.0"), HValue::Str("1.5.0".into()));
    }

    #[test]
    fn lists_parse_with_or_without_the_quotes_a_shell_removes() {
        let want = HValue::List(vec![HValue::Str("console".into()), HValue::Str("wandb".into())]);
        assert_eq!(v("['console','wandb']"), want);
        assert_eq!(v("[console,wandb]"), want);
        assert_eq!(v("[ console , \"wandb\" ]"), want);
        assert_eq!(v("[]"), HValue::List(vec![]));
        assert_eq!(v("[1, 2.5]"), HValue::List(vec![HValue::Int(1), HValue::Float(2.5)]));
        assert_eq!(v("{a: 1, b: x}"), HValue::Dict(vec![("a".into(), HValue::Int(1)), ("b".into(), HValue::Str("x".into()))]));
        assert!(parse_value("[a,b").is_err());
        assert!(parse_value("'open").is_err());
    }

    #[test]
    fn overrides_carry_their_operation() {
        let o = parse_override("+trainer.val_only=True").unwrap();
        assert_eq!((o.op, o.key.as_str(), o.value), (Op::Add, "trainer.val_only", HValue::Bool(true)));
        assert_eq!(parse_override("++a.b=1").unwrap().op, Op::Force);
        let d = parse_override("~actor_rollout_ref.rollout.val_kwargs").unwrap();
        assert_eq!((d.op, d.value), (Op::Delete, HValue::Null));
        assert_eq!(parse_override("data.train_files=[a.parquet,b.parquet]").unwrap().value.to_string(), "[a.parquet,b.parquet]");
        assert!(parse_override("data.train_files").is_err());
        assert!(parse_override("a..b=1").is_err());
    }
}
