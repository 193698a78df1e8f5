//! One dataset row in verl's schema, and the conversion from a raw JSON row.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::dataset::LoadOptions;

/// One prompt row in verl's schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptRecord {
    /// 0-based row number in the file it came from (pandas' index), for error messages.
    pub row: usize,
    /// Which reward function scores this row (verl's `data_source`).
    pub data_source: String,
    /// Chat messages, each an object with at least `role` and `content`.
    pub messages: Vec<Value>,
    /// `reward_model.ground_truth`: string, number, list or object, as the reward needs.
    pub ground_truth: Value,
    /// `extra_info`: always an object (empty when absent).
    pub extra_info: Value,
    /// verl's `ability` tag (e.g. "math"), if present.
    pub ability: Option<String>,
}

impl PromptRecord {
    /// The row as verl stores it: `{data_source, prompt, ability, reward_model: {style, ground_truth}, extra_info}`.
    pub fn to_verl_json(&self) -> Value {
        let mut row = Map::new();
        row.insert("data_source".into(), Value::String(self.data_source.clone()));
        row.insert("prompt".into(), Value::Array(self.messages.clone()));
        if let Some(ability) = &self.ability {
            row.insert("ability".into(), Value::String(ability.clone()));
        }
        // verl only ever uses style "rule" for rule-based rewards; the field is informational.
        row.insert(
            "reward_model".into(),
            json!({"style": "rule", "ground_truth": self.ground_truth}),
        );
        row.insert("extra_info".into(), self.extra_info.clone());
        Value::Object(row)
    }
}

/// A short name for a JSON value's type, for error messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Removes object members whose value is null, recursively.
///
/// Parquet struct columns hold the union of all rows' keys, so a key one row lacks
/// reads back as null; dropping those makes parquet rows look like the JSON they came from.
pub(crate) fn strip_null_members(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|_, x| !x.is_null());
            map.values_mut().for_each(strip_null_members);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_null_members),
        _ => {}
    }
}

/// Decodes a string holding a JSON object (how some writers store struct columns).
fn json_object_in_string(s: &str) -> Option<Value> {
    if !s.trim_start().starts_with('{') {
        return None;
    }
    match serde_json::from_str::<Value>(s) {
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    }
}

fn parse_messages(prompt: Value, key: &str) -> Result<Vec<Value>, String> {
    let items = match prompt {
        // A bare string is a single user turn (common in hand-made JSONL files).
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) => items,
        other => {
            return Err(format!(
                "'{key}' must be a list of {{role, content}} messages or a string, got {}",
                kind(&other)
            ))
        }
    };
    if items.is_empty() {
        return Err(format!("'{key}' is an empty list of messages"));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(mut m) = m else {
                return Err(format!("{key}[{i}] must be a {{role, content}} object, got {}", kind(&m)));
            };
            // Columnar storage pads messages with the union of all message keys as nulls
            // (e.g. `tool_calls: null`); a chat template would see them as defined.
            m.retain(|k, v| !v.is_null() || k == "role" || k == "content");
            match m.get("role") {
                Some(Value::String(_)) => {}
                None | Some(Value::Null) => return Err(format!("{key}[{i}] has no 'role'")),
                Some(other) => {
                    return Err(format!("{key}[{i}].role must be a string, got {}", kind(other)))
                }
            }
            match m.get("content") {
                // A list is multimodal content (a list of parts); templates handle it.
                Some(Value::String(_)) | Some(Value::Array(_)) => {}
                None | Some(Value::Null) => return Err(format!("{key}[{i}] has no 'content'")),
                Some(other) => {
                    return Err(format!(
                        "{key}[{i}].content must be a string or a list of parts, got {}",
                        kind(other)
                    ))
                }
            }
            Ok(Value::Object(m))
        })
        .collect()
}

/// Converts one raw row into a record, or says what is wrong with it.
pub(crate) fn parse_row(
    row: usize,
    value: Value,
    opts: &LoadOptions,
    from_columnar: bool,
) -> Result<PromptRecord, String> {
    let Value::Object(mut obj) = value else {
        return Err(format!("row must be a JSON object, got {}", kind(&value)));
    };

    let messages = match obj.remove(&opts.prompt_key) {
        None | Some(Value::Null) => {
            return Err(format!(
                "missing '{}' (the prompt column; set data.prompt_key if it is named differently)",
                opts.prompt_key
            ))
        }
        Some(p) => parse_messages(p, &opts.prompt_key)?,
    };

    let data_source = match obj.remove(&opts.data_source_key) {
        Some(Value::String(s)) => s,
        None | Some(Value::Null) => match &opts.default_data_source {
            Some(d) => d.clone(),
            None => {
                return Err(format!(
                    "missing '{}' (it selects the reward function; set data.default_data_source to use one for all rows)",
                    opts.data_source_key
                ))
            }
        },
        Some(other) => {
            return Err(format!("'{}' must be a string, got {}", opts.data_source_key, kind(&other)))
        }
    };

    let reward_model = match obj.remove(&opts.reward_model_key) {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(Value::String(s)) => match json_object_in_string(&s) {
            Some(Value::Object(m)) => Some(m),
            _ => {
                return Err(format!(
                    "'{}' must be an object {{ground_truth, style}}, got a string",
                    opts.reward_model_key
                ))
            }
        },
        Some(other) => {
            return Err(format!(
                "'{}' must be an object {{ground_truth, style}}, got {}",
                opts.reward_model_key,
                kind(&other)
            ))
        }
    };
    let mut ground_truth = match &opts.label_key {
        Some(k) => obj.remove(k).unwrap_or(Value::Null),
        None => reward_model.and_then(|mut m| m.remove(&opts.ground_truth_key)).unwrap_or(Value::Null),
    };
    if ground_truth.is_null() && opts.require_ground_truth {
        return Err(match &opts.label_key {
            Some(k) => format!("missing '{k}' (the label column, data.label_key; set data.require_ground_truth = false if the reward does not need it)"),
            None => format!(
                "missing '{}.{}' (set data.require_ground_truth = false if the reward does not need it)",
                opts.reward_model_key, opts.ground_truth_key
            ),
        });
    }
    if opts.decode_json_ground_truth {
        // Only objects: a string like "42" or "[1, 2]" is a legitimate answer, but a string
        // holding a JSON object is a struct that was serialized to fit a string column.
        if let Some(decoded) = ground_truth.as_str().and_then(json_object_in_string) {
            ground_truth = decoded;
        }
    }

    let mut extra_info = match obj.remove(&opts.extra_info_key) {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v,
        Some(Value::String(s)) => json_object_in_string(&s).ok_or_else(|| {
            format!("'{}' must be an object, got a string", opts.extra_info_key)
        })?,
        Some(other) => {
            return Err(format!("'{}' must be an object, got {}", opts.extra_info_key, kind(&other)))
        }
    };

    let ability = match obj.remove(&opts.ability_key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(other) => {
            return Err(format!("'{}' must be a string, got {}", opts.ability_key, kind(&other)))
        }
    };

    if from_columnar {
        strip_null_members(&mut extra_info);
        strip_null_members(&mut ground_truth);
    }

    Ok(PromptRecord { row, data_source, messages, ground_truth, extra_info, ability })
}
