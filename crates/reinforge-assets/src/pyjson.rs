//! JSON output laid out the way Python's `json.dumps(..., ensure_ascii=False)` lays it out.
//!
//! Hugging Face files are written by Python, and the project's fixtures were too. Matching
//! that layout (`", "` / `": "` separators, Python float reprs such as `1e-05`) makes the
//! generated files byte-comparable with their Python counterparts, not just equivalent.

use std::io::{self, Write};

use serde_json::ser::Formatter;
use serde_json::Value;

/// Serializes like `json.dumps(v, ensure_ascii=False)`; `indent` like its `indent=` argument.
pub fn to_string(v: &Value, indent: Option<usize>) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(
        &mut out,
        PyFormatter {
            indent,
            level: 0,
            has_value: false,
        },
    );
    serde::Serialize::serialize(v, &mut ser).expect("serializing a Value into a Vec cannot fail");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// Python's `repr(float)`: shortest round-trip digits, scientific notation when the decimal
/// exponent is below -4 or at least 16, and at least two exponent digits.
pub fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // `{:e}` gives the shortest round-trip digits, e.g. "1e-5", "-1.5e20".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    if (-4..16).contains(&exp) {
        let fixed = format!("{x}");
        if fixed.contains('.') {
            fixed
        } else {
            format!("{fixed}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// The layout state of [`to_string`]; mirrors serde_json's `PrettyFormatter`.
struct PyFormatter {
    indent: Option<usize>,
    level: usize,
    has_value: bool,
}

impl PyFormatter {
    fn newline_indent<W: ?Sized + Write>(&self, w: &mut W) -> io::Result<()> {
        if let Some(n) = self.indent {
            w.write_all(b"\n")?;
            for _ in 0..n * self.level {
                w.write_all(b" ")?;
            }
        }
        Ok(())
    }

    fn begin_item<W: ?Sized + Write>(&self, w: &mut W, first: bool) -> io::Result<()> {
        match (self.indent, first) {
            (Some(_), true) => {}
            (Some(_), false) => w.write_all(b",")?,
            (None, true) => {}
            (None, false) => w.write_all(b", ")?,
        }
        self.newline_indent(w)
    }

    fn end_container<W: ?Sized + Write>(&mut self, w: &mut W, close: &[u8]) -> io::Result<()> {
        self.level -= 1;
        if self.has_value {
            self.newline_indent(w)?;
        }
        w.write_all(close)
    }
}

impl Formatter for PyFormatter {
    fn write_f64<W: ?Sized + Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(python_float_repr(value).as_bytes())
    }

    fn write_f32<W: ?Sized + Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        self.write_f64(w, value.into())
    }

    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.end_container(w, b"]")
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.begin_item(w, first)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.end_container(w, b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.begin_item(w, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_print_like_python_repr() {
        for (x, want) in [
            (1e-5, "1e-05"),
            (100000.0, "100000.0"),
            (0.0001, "0.0001"),
            (0.00012, "0.00012"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (-2.5e-7, "-2.5e-07"),
            (0.0, "0.0"),
            (1e100, "1e+100"),
            (0.1, "0.1"),
        ] {
            assert_eq!(python_float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn layout_matches_json_dumps() {
        let v = json!({"a": [1, 2.0, "é\n"], "b": {}, "c": [], "d": null, "e": {"f": true}});
        assert_eq!(
            to_string(&v, None),
            r#"{"a": [1, 2.0, "é\n"], "b": {}, "c": [], "d": null, "e": {"f": true}}"#
        );
        assert_eq!(
            to_string(&v, Some(2)),
            "{\n  \"a\": [\n    1,\n    2.0,\n    \"é\\n\"\n  ],\n  \"b\": {},\n  \"c\": [],\n  \"d\": null,\n  \"e\": {\n    \"f\": true\n  }\n}"
        );
    }
}
