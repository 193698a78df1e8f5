//! Python-compatible text forms of template values.
//!
//! transformers renders chat templates with jinja2, so every value that reaches the output
//! goes through Python's `str()`/`repr()` and `tojson` is `json.dumps(..., ensure_ascii=False)`.
//! minijinja's own forms differ (double-quoted strings in lists, `1e16` for floats, sorted or
//! compact JSON), so the few places where that matters are re-implemented here.

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// Options of Python's `json.dumps` that HF's `tojson` filter forwards.
#[derive(Debug, Clone, Default)]
pub(crate) struct JsonOptions {
    /// Escape every non-ASCII character as `\uXXXX` (surrogate pairs above the BMP).
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: pretty-print, `s` per nesting level.
    pub indent: Option<String>,
    /// Item and key separators; `None` means Python's defaults for the indent mode.
    pub separators: Option<(String, String)>,
    /// Sort object keys.
    pub sort_keys: bool,
}

/// `json.dumps(value, **opts)` over a template value.
pub(crate) fn json_dumps(value: &Value, opts: &JsonOptions) -> Result<String, Error> {
    let (item_sep, key_sep) = match &opts.separators {
        Some((i, k)) => (i.clone(), k.clone()),
        // Python drops the space after "," when indenting, so lines have no trailing blank.
        None if opts.indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let mut out = String::new();
    let w = JsonWriter {
        opts,
        item_sep: &item_sep,
        key_sep: &key_sep,
    };
    w.value(&mut out, value, 0)?;
    Ok(out)
}

struct JsonWriter<'a> {
    opts: &'a JsonOptions,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl JsonWriter<'_> {
    fn value(&self, out: &mut String, v: &Value, depth: usize) -> Result<(), Error> {
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&json_number(v)),
            ValueKind::String => self.string(out, v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container(out, '[', ']', items.len(), depth, |out, i| {
                    self.value(out, &items[i], depth + 1)
                })?;
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in v.try_iter()? {
                    let item = v.get_item(&key)?;
                    entries.push((json_key(&key)?, item));
                }
                if self.opts.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(out, '{', '}', entries.len(), depth, |out, i| {
                    self.string(out, &entries[i].0);
                    out.push_str(self.key_sep);
                    self.value(out, &entries[i].1, depth + 1)
                })?;
            }
            // Python raises TypeError for these; silently printing something would hide bugs.
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: object of type {kind} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }

    fn container(
        &self,
        out: &mut String,
        open: char,
        close: char,
        len: usize,
        depth: usize,
        mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if len == 0 {
            out.push(close);
            return Ok(());
        }
        let newline = |out: &mut String, level: usize| {
            if let Some(indent) = &self.opts.indent {
                out.push('\n');
                for _ in 0..level {
                    out.push_str(indent);
                }
            }
        };
        for i in 0..len {
            if i > 0 {
                out.push_str(self.item_sep);
            }
            newline(out, depth + 1);
            item(out, i)?;
        }
        newline(out, depth);
        out.push(close);
        Ok(())
    }

    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.opts.ensure_ascii && !c.is_ascii() => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// JSON text of a number: integers verbatim, floats as Python's `float.__repr__`.
fn json_number(v: &Value) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
    if f.is_nan() {
        "NaN".to_owned()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned()
    } else {
        float_repr(f)
    }
}

/// Python's conversion of a dict key for `json.dumps` (keys must be str, number, bool or None).
fn json_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::Number => Ok(json_number(key)),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form outside [1e-4, 1e16).
fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as Python, e.g. "-1.25e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}e{esign}{:02}", exp.abs());
    }
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let point = exp as usize + 1;
    if digits.len() <= point {
        format!("{sign}{digits}{}.0", "0".repeat(point - digits.len()))
    } else {
        format!("{sign}{}.{}", &digits[..point], &digits[point..])
    }
}

/// Python's `str(value)` as jinja2 prints it in `{{ ... }}`.
pub(crate) fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::String => v.as_str().unwrap_or_default().to_owned(),
        _ => py_repr(v),
    }
}

/// Python's `repr()` of a JSON value as `json.loads` would give it (`'text'`, `72`, `72.0`,
/// `None`, `[1, 'a']`, `{'k': True}`): for messages that quote model output the Python way.
pub fn repr_json(v: &serde_json::Value) -> String {
    use serde_json::Value as J;
    match v {
        J::Null => "None".to_owned(),
        J::Bool(b) => if *b { "True" } else { "False" }.to_owned(),
        J::Number(n) if n.is_f64() => float_repr(n.as_f64().unwrap_or(f64::NAN)),
        J::Number(n) => n.to_string(),
        J::String(s) => str_repr(s),
        J::Array(a) => format!("[{}]", a.iter().map(repr_json).collect::<Vec<_>>().join(", ")),
        J::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, x)| format!("{}: {}", str_repr(k), repr_json(x)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Python's `str()` of a JSON value as `json.loads` would give it (strings as they are).
pub fn str_json(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => repr_json(other),
    }
}

/// Python's `repr(value)`: single-quoted strings, `None`/`True`, `[a, b]`, `{'k': v}`.
fn py_repr(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::Number if !v.is_integer() => {
            float_repr(f64::try_from(v.clone()).unwrap_or(f64::NAN))
        }
        ValueKind::String => str_repr(v.as_str().unwrap_or_default()),
        ValueKind::Seq => match v.try_iter() {
            Ok(items) => format!(
                "[{}]",
                items.map(|x| py_repr(&x)).collect::<Vec<_>>().join(", ")
            ),
            Err(_) => v.to_string(),
        },
        ValueKind::Map => match v.try_iter() {
            Ok(keys) => {
                let entries: Vec<String> = keys
                    .map(|k| {
                        let item = v.get_item(&k).unwrap_or_default();
                        format!("{}: {}", py_repr(&k), py_repr(&item))
                    })
                    .collect();
                format!("{{{}}}", entries.join(", "))
            }
            Err(_) => v.to_string(),
        },
        // minijinja already prints None/True/False and integers the Python way.
        _ => v.to_string(),
    }
}

/// Python's `repr(str)`: prefers single quotes, switches to double when only `'` occurs.
fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_values_print_as_python_prints_them() {
        let v = serde_json::json!([null, true, 72, 72.0, "it's", {"k": "a\nb"}, 1e16]);
        assert_eq!(repr_json(&v), r#"[None, True, 72, 72.0, "it's", {'k': 'a\nb'}, 1e+16]"#);
        assert_eq!(str_json(&serde_json::json!("x'y")), "x'y");
        assert_eq!(str_json(&serde_json::json!(false)), "False");
    }

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-1.25e-7, "-1.25e-07"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1e300, "1e+300"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "repr({f:e})");
        }
    }

    #[test]
    fn json_dumps_matches_python() {
        let v = Value::from_serialize(serde_json::json!({
            "b": [1, 2.0, null, true], "a": {"é": "x\"\n\u{1}"}, "e": [], "f": {}
        }));
        let compact = json_dumps(&v, &JsonOptions::default()).unwrap();
        assert_eq!(
            compact,
            r#"{"b": [1, 2.0, null, true], "a": {"é": "x\"\n\u0001"}, "e": [], "f": {}}"#
        );
        let opts = JsonOptions {
            indent: Some("  ".into()),
            sort_keys: true,
            ..Default::default()
        };
        assert_eq!(
            json_dumps(&v, &opts).unwrap(),
            "{\n  \"a\": {\n    \"é\": \"x\\\"\\n\\u0001\"\n  },\n  \"b\": [\n    1,\n    2.0,\n    null,\n    true\n  ],\n  \"e\": [],\n  \"f\": {}\n}"
        );
        let ascii = JsonOptions {
            ensure_ascii: true,
            ..Default::default()
        };
        assert_eq!(
            json_dumps(&Value::from("é😀"), &ascii).unwrap(),
            r#""\u00e9\ud83d\ude00""#
        );
    }

    #[test]
    fn str_matches_python() {
        let v =
            Value::from_serialize(serde_json::json!(["it's", "a", 1, 1.5, null, true, {"k": "v"}]));
        assert_eq!(
            py_str(&v),
            r#"["it's", 'a', 1, 1.5, None, True, {'k': 'v'}]"#
        );
    }
}
