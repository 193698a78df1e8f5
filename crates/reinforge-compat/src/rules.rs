//! The machinery every foreign command line goes through: a table of [`Rule`]s (one per foreign
//! key: mapped, not applicable, refused, or converted by a function that sees the whole
//! command), applied to the foreign tool's defaults and then to what was typed.

use std::collections::BTreeMap;

use crate::hydra::HValue;

/// How a value is converted into ours by a plain mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conv {
    /// As typed: numbers, booleans, strings, lists.
    Same,
    /// A non-negative integer.
    Count,
    /// A number.
    Float,
    /// A boolean.
    Bool,
    /// Text (numbers written out).
    Text,
    /// A list of strings (a single string becomes a one-element list).
    TextList,
    /// A frequency where a negative number means "never" (0 for us).
    Never,
    /// Top-k where -1 (or 0) means off (0 for us).
    TopK,
}

/// What the table says about one foreign key.
#[derive(Clone, Copy)]
pub enum Act {
    /// The same setting in Reinforge, under this key.
    To(&'static str, Conv),
    /// Accepted, with the reason it does not apply to Reinforge.
    Na(&'static str),
    /// Refused, with the reason and the nearest supported setting.
    Refuse(&'static str),
    /// Converted by a function that sees the whole command (batch sizes, placement, values
    /// that decide between the other three); the text says what it does, for the table.
    Fn(Convert, &'static str),
}

/// A conversion that sees the whole command.
pub type Convert = fn(&mut Ctx<'_>, &HValue) -> Result<Outcome, String>;

/// What a [`Convert`] decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// It set keys of ours (through [`Ctx::set`]).
    Mapped,
    /// It set nothing: the reason.
    NotApplicable(String),
}

/// One row of a foreign tool's table: a dotted key (or flag), or a family ending in `.*`.
#[derive(Clone, Copy)]
pub struct Rule {
    /// verl's dotted key, or OpenRLHF's flag without its dashes; `prefix.*` covers a family.
    pub key: &'static str,
    /// What happens to it.
    pub act: Act,
}

/// Shorthand constructors, so the tables read as tables.
pub const fn to(key: &'static str, ours: &'static str, conv: Conv) -> Rule {
    Rule { key, act: Act::To(ours, conv) }
}
/// A key accepted as not applicable.
pub const fn na(key: &'static str, why: &'static str) -> Rule {
    Rule { key, act: Act::Na(why) }
}
/// A key refused.
pub const fn refuse(key: &'static str, why: &'static str) -> Rule {
    Rule { key, act: Act::Refuse(why) }
}
/// A key converted by a function.
pub const fn conv(key: &'static str, f: Convert, doc: &'static str) -> Rule {
    Rule { key, act: Act::Fn(f, doc) }
}

/// Finds the rule for `key`: an exact row first, then the longest matching family.
pub fn lookup<'t>(table: &'t [Rule], key: &str) -> Option<&'t Rule> {
    table.iter().find(|r| r.key == key).or_else(|| {
        table
            .iter()
            .filter(|r| r.key.strip_suffix(".*").is_some_and(|p| key.starts_with(p) && key[p.len()..].starts_with('.')))
            .max_by_key(|r| r.key.len())
    })
}

/// What a conversion sees: every foreign value in effect (defaults and what was typed), and
/// where it writes ours.
pub struct Ctx<'a> {
    all: &'a BTreeMap<String, HValue>,
    out: Vec<(String, toml::Value)>,
    hub: crate::HubDatasets<'a>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(all: &'a BTreeMap<String, HValue>, hub: crate::HubDatasets<'a>) -> Self {
        Ctx { all, out: Vec::new(), hub }
    }

    /// The local snapshot of a Hub dataset id, if this machine has it (see
    /// [`crate::translate_with`]).
    pub fn hub_dataset(&self, id: &str) -> Result<Option<std::path::PathBuf>, String> {
        (self.hub)(id)
    }

    /// The foreign value in effect for `key` (typed, or the tool's default).
    pub fn get(&self, key: &str) -> Option<&HValue> {
        self.all.get(key).filter(|v| !v.is_null())
    }

    /// `key`'s value as a count, or `default`.
    pub fn count(&self, key: &str, default: usize) -> usize {
        self.get(key).and_then(HValue::as_usize).unwrap_or(default)
    }

    /// `key`'s value as a boolean, or `default`.
    pub fn flag(&self, key: &str, default: bool) -> bool {
        self.get(key).and_then(HValue::as_bool).unwrap_or(default)
    }

    /// The foreign values in effect under `prefix.` (typed, or the tool's defaults), by the
    /// rest of their key.
    pub fn family(&self, prefix: &str) -> Vec<(&'a str, &'a HValue)> {
        let p = format!("{prefix}.");
        self.all.iter().filter_map(|(k, v)| k.strip_prefix(p.as_str()).map(|rest| (rest, v))).collect()
    }

    /// Sets one of our keys.
    pub fn set(&mut self, ours: &str, v: impl Into<toml::Value>) {
        self.out.push((ours.to_string(), v.into()));
    }

    pub(crate) fn take(&mut self) -> Vec<(String, toml::Value)> {
        std::mem::take(&mut self.out)
    }
}

/// Converts `v` for a plain mapping; `None` for `null` (our default then applies).
pub fn convert(v: &HValue, c: Conv) -> Result<Option<toml::Value>, String> {
    if v.is_null() {
        return Ok(None);
    }
    let want = |what: &str| format!("expected {what}, got `{v}`");
    Ok(Some(match c {
        Conv::Same => generic(v),
        Conv::Count => toml::Value::Integer(v.as_usize().ok_or_else(|| want("a whole number ≥ 0"))? as i64),
        Conv::Float => toml::Value::Float(v.as_f64().ok_or_else(|| want("a number"))?),
        Conv::Bool => toml::Value::Boolean(v.as_bool().ok_or_else(|| want("true or false"))?),
        Conv::Text => toml::Value::String(v.as_text().ok_or_else(|| want("a string"))?),
        Conv::TextList => match v {
            HValue::List(items) => toml::Value::Array(
                items.iter().map(|i| i.as_text().map(toml::Value::String).ok_or_else(|| want("a list of strings"))).collect::<Result<_, _>>()?,
            ),
            other => toml::Value::Array(vec![toml::Value::String(other.as_text().ok_or_else(|| want("a list of strings"))?)]),
        },
        Conv::Never => toml::Value::Integer(v.as_i64().ok_or_else(|| want("a whole number (-1 = never)"))?.max(0)),
        Conv::TopK => toml::Value::Integer(v.as_i64().ok_or_else(|| want("a whole number (-1 = off)"))?.max(0)),
    }))
}

/// A Hydra value as TOML, structure kept.
pub fn generic(v: &HValue) -> toml::Value {
    match v {
        HValue::Null => toml::Value::String(String::new()),
        HValue::Bool(b) => toml::Value::Boolean(*b),
        HValue::Int(i) => toml::Value::Integer(*i),
        HValue::Float(f) => toml::Value::Float(*f),
        HValue::Str(s) => toml::Value::String(s.clone()),
        HValue::List(items) => toml::Value::Array(items.iter().map(generic).collect()),
        HValue::Dict(items) => toml::Value::Table(items.iter().map(|(k, v)| (k.clone(), generic(v))).collect()),
    }
}

/// What a rule makes of a value: our `key = value` settings, and a note for the report.
pub(crate) type Applied = (Vec<(String, toml::Value)>, Option<String>);

/// Applies `rule` to `value`: `Ok((ours, None))` when mapped, `Ok((vec![], Some(reason)))`
/// when not applicable, `Err(reason)` when refused.
pub(crate) fn apply(rule: &Rule, ctx: &mut Ctx<'_>, value: &HValue) -> Result<Applied, String> {
    match rule.act {
        Act::To(ours, c) => Ok((convert(value, c)?.map(|v| vec![(ours.to_string(), v)]).unwrap_or_default(), None)),
        Act::Na(why) => Ok((Vec::new(), Some(why.to_string()))),
        Act::Refuse(why) => Err(why.to_string()),
        Act::Fn(f, _) => match f(ctx, value)? {
            Outcome::Mapped => Ok((ctx.take(), None)),
            Outcome::NotApplicable(why) => {
                ctx.take();
                Ok((Vec::new(), Some(why)))
            }
        },
    }
}

/// The nearest keys of `table` to `key`, for a refusal's "did you mean".
pub fn nearest(table: &[Rule], key: &str) -> Option<&'static str> {
    table
        .iter()
        .filter(|r| !r.key.ends_with(".*"))
        .map(|r| (strsim::normalized_levenshtein(r.key, key), r.key))
        .filter(|(s, _)| *s > 0.6)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k)
}

/// Accepted when false or absent; refused otherwise (a feature Reinforge lacks).
pub fn off_only(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_bool() {
        Some(false) => Ok(Outcome::NotApplicable("off".into())),
        _ if v.is_null() => Ok(Outcome::NotApplicable("off".into())),
        _ => Err("not supported yet; leave it off".into()),
    }
}

/// Accepted when null, empty or absent; refused with a value (a feature Reinforge lacks).
pub fn unset_only(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    let empty = match v {
        HValue::Null => true,
        HValue::Str(s) => s.is_empty(),
        HValue::List(l) => l.is_empty(),
        HValue::Dict(d) => d.is_empty(),
        _ => false,
    };
    if empty {
        return Ok(Outcome::NotApplicable("unset".into()));
    }
    Err(format!("`{v}`: not supported yet; leave it unset"))
}

/// Accepted when 0; refused otherwise.
pub fn zero_only(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_f64() {
        Some(0.0) => Ok(Outcome::NotApplicable("0: off".into())),
        _ if v.is_null() => Ok(Outcome::NotApplicable("unset: off".into())),
        _ => Err(format!("{v}: not supported yet; use 0")),
    }
}

/// A sequence-parallel degree (`what`: verl's Ulysses, OpenRLHF's ring attention): a layout,
/// like sharding, since the loss is normalised over the global batch either way; holding
/// whole sequences per rank changes memory and speed, not the update.
pub fn sequence_split(what: &str, v: &HValue) -> Result<Outcome, String> {
    match v.as_usize() {
        Some(1) => Ok(Outcome::NotApplicable(format!("no {what} (1)"))),
        Some(k) if k > 1 => Ok(Outcome::NotApplicable(format!(
            "{what} splits each sequence over {k} GPUs; Reinforge's ranks hold whole sequences: the same loss and gradient, but a sequence must fit one GPU's memory"
        ))),
        _ => Err(format!("expected a whole number ≥ 1, got `{v}`")),
    }
}

/// Accepted when 1 (no parallelism of that kind); refused otherwise.
pub fn one_only(_: &mut Ctx<'_>, v: &HValue) -> Result<Outcome, String> {
    match v.as_usize() {
        Some(1) => Ok(Outcome::NotApplicable("1: none".into())),
        _ if v.is_null() => Ok(Outcome::NotApplicable("unset: none".into())),
        _ => Err(format!("{v}: tensor, pipeline, expert and sequence parallelism are not supported yet; use 1")),
    }
}
