//! Come as you are: verl's `main_ppo` overrides (Hydra syntax) and OpenRLHF's `train_ppo_ray`
//! flags, translated into Reinforge config keys, with an answer for every key.
//!
//! Each foreign key is looked up in one table per tool ([`verl::RULES`], [`openrlhf::RULES`]):
//! it is **mapped** to our keys (batch sizes and placement converted exactly), **accepted as not
//! applicable** with the reason, or **refused** with the reason and the nearest supported
//! setting. The tool's own defaults go through the same table first, so a command resolves to
//! what a user of that tool expects, not to Reinforge's defaults. [`Translation::report`] is
//! what `reinforge train --verl|--openrlhf` prints before it starts, and
//! [`reference_table`] is README's mapping table (a test keeps the two equal).
//!
//! Dependencies: `toml` (our values), `strsim` (suggestions). Nothing of Reinforge: the CLI
//! layers the result onto the trainer's config, and says which keys are its own.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod hydra;
pub mod openrlhf;
pub mod rules;
pub mod verl;

use std::collections::BTreeMap;

use hydra::{HValue, Op};
use rules::{Act, Ctx, Rule};

/// Pseudo-key a conversion sets for `reinforge train --resume` (verl's resume_mode,
/// OpenRLHF's --load_checkpoint).
pub const RESUME: &str = "@resume";
/// Pseudo-key for a W&B API key given on the command line (OpenRLHF's `--use_wandb KEY`).
pub const WANDB_KEY: &str = "@wandb_key";

/// Errors in a foreign command line.
#[derive(Debug, thiserror::Error)]
pub enum CompatError {
    /// An argument that does not parse.
    #[error("`{arg}`: {why}")]
    Syntax {
        /// The argument as typed.
        arg: String,
        /// What is wrong.
        why: String,
    },
}

/// Which tool's command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `python3 -m verl.trainer.main_ppo` overrides (also Search-R1's).
    Verl,
    /// `python3 -m openrlhf.cli.train_ppo_ray` flags.
    OpenRlhf,
}

impl Source {
    /// The tool's name.
    pub fn name(self) -> &'static str {
        match self {
            Source::Verl => "verl",
            Source::OpenRlhf => "OpenRLHF",
        }
    }

    /// Its table.
    pub fn rules(self) -> &'static [Rule] {
        match self {
            Source::Verl => verl::RULES,
            Source::OpenRlhf => openrlhf::RULES,
        }
    }

    fn defaults(self) -> Vec<(&'static str, HValue)> {
        match self {
            Source::Verl => verl::defaults(),
            Source::OpenRlhf => openrlhf::defaults(),
        }
    }

    /// The defaults in effect for this command: the tool's, with what a named config file
    /// (verl's `--config-name gsm8k_multiturn_grpo`) sets over them.
    fn defaults_for(self, given: &[Given]) -> Vec<(&'static str, HValue)> {
        let mut defaults = self.defaults();
        let config = given.iter().rev().find(|g| g.key == "--config-name").and_then(|g| g.value.as_text());
        if let (Source::Verl, Some(name)) = (self, config) {
            for (k, v) in verl::config_defaults(name.trim_end_matches(".yaml")) {
                match defaults.iter_mut().find(|(d, _)| *d == k) {
                    Some(slot) => slot.1 = v,
                    None => defaults.push((k, v)),
                }
            }
        }
        defaults
    }

    /// Our settings that follow from the tool itself (or from the command as a whole) rather
    /// than from one of its keys; what was typed is applied over them.
    fn implied(self, all: &BTreeMap<String, HValue>) -> Vec<(String, toml::Value)> {
        let strings = |v: &[&str]| toml::Value::Array(v.iter().map(|s| toml::Value::String(s.to_string())).collect());
        match self {
            // verl's trainer.device default (cuda) is one of its keys. A Search-R1 command
            // searches (its do_search defaults to true; a typed do_search=false wins).
            Source::Verl if verl::SEARCH_R1_KEYS.iter().any(|k| all.contains_key(*k)) => {
                vec![("tools.search.enable".into(), toml::Value::Boolean(true))]
            }
            Source::Verl => Vec::new(),
            // OpenRLHF runs on GPUs and logs to the console unless --use_wandb/--use_tensorboard.
            Source::OpenRlhf => vec![
                ("trainer.device".into(), toml::Value::String("cuda".into())),
                ("trainer.logger".into(), strings(&["console", "jsonl"])),
            ],
        }
    }

    /// Whether `key`, under a family row, is one of the tool's own keys.
    fn family_member(self, key: &str) -> bool {
        match self {
            Source::Verl => verl::known_keys().contains(key) || verl::OPEN_FAMILIES.iter().any(|f| key.starts_with(f)),
            Source::OpenRlhf => true,
        }
    }

    /// The tool's key nearest to a misspelt one.
    fn nearest(self, key: &str) -> Option<&'static str> {
        let from_table = rules::nearest(self.rules(), key);
        match self {
            Source::Verl => {
                let score = |k: &str| strsim::normalized_levenshtein(k, key);
                let known = verl::known_keys().iter().copied().max_by(|a, b| score(a).total_cmp(&score(b))).filter(|k| score(k) > 0.6);
                match (from_table, known) {
                    (Some(t), Some(k)) => Some(if score(k) > score(t) { k } else { t }),
                    (t, k) => t.or(k),
                }
            }
            // A dotted (v0.10.2+) name is nearest to another dotted one.
            Source::OpenRlhf if key.contains('.') => openrlhf::nearest_dotted(key).or(from_table),
            Source::OpenRlhf => from_table,
        }
    }

    /// What the tool calls its settings.
    fn noun(self) -> &'static str {
        match self {
            Source::Verl => "key",
            Source::OpenRlhf => "flag",
        }
    }

    /// How a key is written on the tool's command line.
    fn spell(self, key: &str) -> String {
        match self {
            Source::Verl => key.to_string(),
            Source::OpenRlhf => format!("--{key}"),
        }
    }
}

/// One foreign argument as parsed: the text typed, the key, and the value.
#[derive(Debug, Clone, PartialEq)]
pub struct Given {
    /// As typed (`actor_rollout_ref.actor.optim.lr=1e-6`, `--bf16`, `--pretrain PATH`).
    pub raw: String,
    /// The tool's key (verl's dotted key, OpenRLHF's flag without `--`).
    pub key: String,
    /// Set or delete (`~key`, verl only).
    pub op: Op,
    /// The value.
    pub value: HValue,
}

/// What became of one argument.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Set these keys of ours (`key = value`, TOML).
    Mapped(Vec<String>),
    /// Accepted, does not apply: why.
    NotApplicable(String),
    /// Refused: why, and what to use instead.
    Refused(String),
    /// A Reinforge key given among the foreign ones.
    Own,
    /// `~key`: back to the tool's default.
    Reset,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// The argument as typed.
    pub arg: String,
    /// What became of it.
    pub verdict: Verdict,
}

/// A foreign command line in our terms.
#[derive(Debug, Clone, Default)]
pub struct Translation {
    /// Our keys from the tool's defaults: the base under a config file.
    pub defaults: Vec<(String, toml::Value)>,
    /// Our keys from what was typed: applied over a config file.
    pub given: Vec<(String, toml::Value)>,
    /// Reinforge's own `key=value` overrides found among the foreign ones (applied last).
    pub own: Vec<String>,
    /// One line per argument.
    pub lines: Vec<Line>,
    /// What `--resume` the command asks for (`auto`, `none` or a checkpoint path), if it says.
    pub resume: Option<String>,
    /// A W&B API key given on the command line.
    pub wandb_key: Option<String>,
}

impl Translation {
    /// Arguments refused.
    pub fn refused(&self) -> usize {
        self.lines.iter().filter(|l| matches!(l.verdict, Verdict::Refused(_))).count()
    }

    /// The tool's defaults as a TOML table of ours: the base a config file goes over.
    pub fn defaults_table(&self) -> toml::Table {
        let mut t = toml::Table::new();
        for (k, v) in &self.defaults {
            set_dotted(&mut t, k, v.clone());
        }
        t
    }

    /// What was typed, as `key=value` overrides of ours (TOML values), then our own.
    pub fn overrides(&self) -> Vec<String> {
        self.given.iter().map(|(k, v)| format!("{k}={}", inline(v))).chain(self.own.iter().cloned()).collect()
    }

    /// The report printed before a run: one line per argument, counts first.
    pub fn report(&self, source: Source) -> String {
        let count = |f: fn(&Verdict) -> bool| self.lines.iter().filter(|l| f(&l.verdict)).count();
        let mut out = format!(
            "{} command line → Reinforge: {} mapped, {} not applicable, {} refused, {} Reinforge key(s)\n",
            source.name(),
            count(|v| matches!(v, Verdict::Mapped(_) | Verdict::Reset)),
            count(|v| matches!(v, Verdict::NotApplicable(_))),
            count(|v| matches!(v, Verdict::Refused(_))),
            count(|v| matches!(v, Verdict::Own)),
        );
        let width = self.lines.iter().map(|l| l.arg.chars().count()).max().unwrap_or(0).min(60);
        let mut previous: Option<&Vec<String>> = None;
        for l in &self.lines {
            let (tag, what) = match &l.verdict {
                Verdict::Mapped(keys) if keys.is_empty() => ("mapped ", "(our default)".to_string()),
                // Placement flags each set the whole placement: say it once.
                Verdict::Mapped(keys) if previous == Some(keys) && keys.len() > 2 => ("mapped ", "(with the line above)".to_string()),
                Verdict::Mapped(keys) => ("mapped ", compact(keys)),
                Verdict::NotApplicable(why) => ("n/a    ", why.clone()),
                Verdict::Refused(why) => ("REFUSED", why.clone()),
                Verdict::Own => ("ours   ", "a Reinforge key".to_string()),
                Verdict::Reset => ("mapped ", format!("back to {}'s default", source.name())),
            };
            out.push_str(&format!("  {tag} {:<width$}  {what}\n", l.arg));
            previous = match &l.verdict {
                Verdict::Mapped(keys) => Some(keys),
                _ => None,
            };
        }
        out
    }
}

/// Translates a foreign command line. `is_ours` says whether a dotted key is one of
/// Reinforge's (those pass through as our own overrides). Hub dataset ids are not looked up
/// (see [`translate_with`]).
pub fn translate(source: Source, given: &[Given], is_ours: &dyn Fn(&str) -> bool) -> Translation {
    translate_with(source, given, is_ours, &|_| Ok(None))
}

/// Where a dataset named by a string that is neither a local file nor a directory (a Hugging
/// Face Hub id, `OpenRLHF/prompt-collection-v0.1`) is on this machine: its downloaded snapshot
/// directory, `None` when it is not there (or the string is no Hub id), or why it cannot be
/// read.
pub type HubDatasets<'a> = &'a dyn Fn(&str) -> Result<Option<std::path::PathBuf>, String>;

/// [`translate`], with `hub` finding the datasets a command line names by Hub id (the CLI
/// looks in the Hugging Face cache).
pub fn translate_with(source: Source, given: &[Given], is_ours: &dyn Fn(&str) -> bool, hub: HubDatasets<'_>) -> Translation {
    let table = source.rules();
    let defaults = source.defaults_for(given);
    let mut all: BTreeMap<String, HValue> = defaults.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    for g in given {
        match g.op {
            Op::Delete => match defaults.iter().find(|(k, _)| *k == g.key) {
                Some((_, d)) => all.insert(g.key.clone(), d.clone()),
                None => all.remove(&g.key),
            },
            _ => all.insert(g.key.clone(), g.value.clone()),
        };
    }
    let mut t = Translation { defaults: source.implied(&all), ..Default::default() };
    // The defaults first, each seeing the whole command (a typed nnodes changes what a default
    // micro-batch converts to).
    for (key, _) in &defaults {
        let Some(rule) = rules::lookup(table, key) else { continue };
        let value = all.get(*key).cloned().unwrap_or(HValue::Null);
        let mut ctx = Ctx::new(&all, hub);
        if let Ok((ours, _)) = rules::apply(rule, &mut ctx, &value) {
            t.defaults.extend(ours);
        }
    }
    for g in given {
        let rule = rules::lookup(table, &g.key).filter(|r| !r.key.ends_with(".*") || source.family_member(&g.key));
        let verdict = match (rule, g.op) {
            (Some(_), Op::Delete) => Verdict::Reset,
            (Some(rule), _) => {
                let mut ctx = Ctx::new(&all, hub);
                match rules::apply(rule, &mut ctx, all.get(&g.key).unwrap_or(&g.value)) {
                    Ok((ours, None)) => {
                        let shown = ours.iter().map(|(k, v)| shown(k, v)).collect();
                        t.given.extend(ours);
                        Verdict::Mapped(shown)
                    }
                    Ok((_, Some(why))) => Verdict::NotApplicable(why),
                    Err(why) => Verdict::Refused(why),
                }
            }
            (None, Op::Delete) if is_ours(&g.key) => Verdict::Refused("`~` deletes verl keys; for a Reinforge key give its value".into()),
            (None, _) if is_ours(&g.key) => {
                t.own.push(format!("{}={}", g.key, inline(&rules::generic(&g.value))));
                Verdict::Own
            }
            (None, _) => Verdict::Refused(match source.nearest(&g.key) {
                Some(n) => format!("not a {} {} Reinforge knows; did you mean `{}`?", source.name(), source.noun(), source.spell(n)),
                None => format!("not a {} {} Reinforge knows (README: Coming from verl / OpenRLHF lists them)", source.name(), source.noun()),
            }),
        };
        t.lines.push(Line { arg: g.raw.clone(), verdict });
    }
    // Pseudo-keys are for the command line, not the config.
    for (k, v) in t.given.iter().filter(|(k, _)| k.starts_with('@')) {
        let v = v.as_str().map(str::to_string);
        match k.as_str() {
            RESUME => t.resume = v,
            WANDB_KEY => t.wandb_key = v,
            _ => {}
        }
    }
    t.given.retain(|(k, _)| !k.starts_with('@'));
    t.defaults.retain(|(k, _)| !k.starts_with('@'));
    t
}

/// A mapped list for the report: `cluster.R.nnodes = a` and `cluster.R.gpus_per_node = b` read
/// as `cluster.R = a × b`.
fn compact(keys: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < keys.len() {
        let pair = keys.get(i + 1).and_then(|next| {
            let (role, nodes) = keys[i].strip_suffix("").and_then(|k| k.split_once(".nnodes = "))?;
            let (role2, gpus) = next.split_once(".gpus_per_node = ")?;
            (role == role2).then(|| format!("{role} = {nodes} × {gpus}"))
        });
        match pair {
            Some(p) => {
                out.push(p);
                i += 2;
            }
            None => {
                out.push(keys[i].clone());
                i += 1;
            }
        }
    }
    out.join(", ")
}

/// How a key of ours reads in the report.
fn shown(k: &str, v: &toml::Value) -> String {
    match (k, v.as_str()) {
        (RESUME, Some(r)) => format!("--resume {r}"),
        (WANDB_KEY, _) => "WANDB_API_KEY (when not set already)".into(),
        _ => format!("{k} = {}", inline(v)),
    }
}

/// README's reference table for a tool: every row of its rules, in table order.
pub fn reference_table(source: Source) -> String {
    let mut out = format!("| {} | Reinforge |\n| --- | --- |\n", source.name());
    for r in source.rules() {
        let what = match r.act {
            Act::To(ours, _) => format!("`{ours}`"),
            Act::Na(why) => format!("accepted, not applicable: {why}"),
            Act::Refuse(why) => format!("refused: {why}"),
            Act::Fn(_, doc) => doc.to_string(),
        };
        out.push_str(&format!("| `{}` | {} |\n", source.spell(r.key), what.replace('|', "\\|")));
    }
    out
}

/// A TOML value on one line (arrays and tables inline).
pub fn inline(v: &toml::Value) -> String {
    v.to_string()
}

/// Sets `path = value` inside a TOML table, creating sections as needed (a value in the way
/// is replaced: the tables are ours, built from a fixed list of keys).
pub fn set_dotted(root: &mut toml::Table, path: &str, value: toml::Value) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap_or_default();
    let mut table = root;
    for p in parts {
        let entry = table.entry(p.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        table = match entry {
            toml::Value::Table(next) => next,
            _ => return,
        };
    }
    table.insert(last.to_string(), value);
}

/// Deep-merges `top` over `base` (tables merge, everything else replaces).
pub fn merge(base: &mut toml::Table, top: toml::Table) {
    for (k, v) in top {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(t)) => merge(b, t),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}
