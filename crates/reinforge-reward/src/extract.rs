//! Pulling the final answer out of a free-form response.
//!
//! Every scanner here is a single left-to-right (or right-to-left) pass over
//! bytes, so a 1 MB response costs microseconds and cannot blow the stack.
//! All patterns searched for are ASCII, so byte offsets found by `str::find`
//! always sit on char boundaries and slicing cannot panic.

use serde::{Deserialize, Serialize};

use crate::RewardError;

/// Where the answer lives in a response.
///
/// JSON: `"whole"` or `{"tag": "answer"}`; TOML: `extract = "whole"` or
/// `extract = { tag = "answer" }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum AnswerExtract {
    /// Content of the last `<tag>...</tag>` block (trimmed); no block means no answer.
    Tag(String),
    /// The whole response, trimmed.
    Whole,
}

impl Default for AnswerExtract {
    fn default() -> Self {
        AnswerExtract::Tag("answer".to_string())
    }
}

impl AnswerExtract {
    /// Rejects tag names that could never match or would need escaping.
    pub(crate) fn validate(&self, kind: &str) -> Result<(), RewardError> {
        if let AnswerExtract::Tag(t) = self {
            if t.is_empty()
                || t.len() > 64
                || t.contains(['<', '>', '/'])
                || t.chars().any(char::is_whitespace)
            {
                return Err(RewardError::config(
                    kind,
                    format!("answer tag `{t}` must be 1-64 chars without `<`, `>`, `/` or spaces"),
                ));
            }
        }
        Ok(())
    }

    /// Applies the rule; `None` when there is no (non-empty) answer.
    pub fn extract<'a>(&self, response: &'a str) -> Option<&'a str> {
        let s = match self {
            AnswerExtract::Tag(tag) => last_tag_block(response, tag)?,
            AnswerExtract::Whole => response.trim(),
        };
        (!s.is_empty()).then_some(s)
    }
}

/// Trimmed content of the last `<tag>...</tag>` block.
///
/// Matches like Python's `re.finditer(r"<tag>(.*?)</tag>", s, re.DOTALL)`
/// taking the last match (what TinyZero and Search-R1 do): blocks are found
/// left to right without overlap, each closing at the first `</tag>` after
/// its opening. An unclosed final `<tag>` is ignored.
pub fn last_tag_block<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let mut pos = 0;
    let mut last = None;
    while let Some(o) = text[pos..].find(&open) {
        let start = pos + o + open.len();
        match text[start..].find(&close) {
            Some(c) => {
                last = Some(&text[start..start + c]);
                pos = start + c + close.len();
            }
            None => break,
        }
    }
    last.map(str::trim)
}

/// Content of the last `\boxed{...}` / `\fbox{...}` (balanced braces), or of `\boxed x`.
///
/// Like Hendrycks' `last_boxed_only_string` used by verl: only the *last*
/// box counts, so a model that boxes several candidates is judged on its
/// final one. `\boxed x` (space form) runs to the next `$` or newline.
/// Unbalanced braces mean no answer.
pub fn last_boxed(text: &str) -> Option<&str> {
    let candidates = [r"\boxed", r"\fbox"];
    let (idx, cmd) = candidates
        .iter()
        .filter_map(|c| text.rfind(c).map(|i| (i, *c)))
        .max_by_key(|(i, _)| *i)?;
    let rest = &text[idx + cmd.len()..];
    let bytes = rest.as_bytes();
    match bytes.first()? {
        b'{' => {
            let mut depth = 0usize;
            for (i, &b) in bytes.iter().enumerate() {
                match b {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            let inner = rest[1..i].trim();
                            return (!inner.is_empty()).then_some(inner);
                        }
                    }
                    _ => {}
                }
            }
            None
        }
        b' ' | b'\t' => {
            let body = rest.trim_start_matches([' ', '\t']);
            let end = body.find(['$', '\n']).unwrap_or(body.len());
            let inner = body[..end].trim();
            (!inner.is_empty()).then_some(inner)
        }
        _ => None,
    }
}

fn is_num_byte(b: u8) -> bool {
    b.is_ascii_digit() || b == b'.' || b == b','
}

/// GSM8K strict: the last `#### N` where N matches `-?[0-9.,]+` (verl's `method="strict"`).
///
/// Commas are removed (`#### 1,000` is 1000), as verl does.
pub fn gsm8k_strict(text: &str) -> Option<String> {
    let mut last = None;
    for (i, m) in text.match_indices("#### ") {
        let rest = &text.as_bytes()[i + m.len()..];
        let neg = rest.first() == Some(&b'-');
        let digits = &rest[usize::from(neg)..];
        let n = digits.iter().take_while(|b| is_num_byte(**b)).count();
        if n > 0 {
            let start = i + m.len();
            let end = start + usize::from(neg) + n;
            last = Some(&text[start..end]);
        }
    }
    let s = last?.replace(',', "");
    // A run of only separators (`#### .`) carries no number.
    s.bytes().any(|b| b.is_ascii_digit()).then_some(s)
}

/// GSM8K flexible: the last number anywhere in the response (verl's `method="flexible"`).
///
/// A "number" is a maximal run of digits, `.` and `,` containing a digit,
/// with an immediately preceding `-`. It ends at its last digit, so trailing
/// `.`/`,` (sentence punctuation) is dropped, and so are thousands commas.
pub fn last_number(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let last_digit = b.iter().rposition(u8::is_ascii_digit)?;
    let mut start = last_digit;
    while start > 0 && is_num_byte(b[start - 1]) {
        start -= 1;
    }
    if start > 0 && b[start - 1] == b'-' {
        start -= 1;
    }
    // Leading `.` is kept (`.5` is a number); commas are separators only.
    Some(text[start..=last_digit].replace(',', ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_block_takes_last_and_trims() {
        let r = "<answer> 1 </answer> then <answer>\n2\n</answer>";
        assert_eq!(last_tag_block(r, "answer"), Some("2"));
    }

    #[test]
    fn tag_block_python_semantics() {
        // Lazy match from the first open: the nested open is part of the content.
        assert_eq!(
            last_tag_block("<answer>a<answer>b</answer>", "answer"),
            Some("a<answer>b")
        );
        // Unclosed final block is ignored, earlier complete one wins.
        assert_eq!(
            last_tag_block("<answer>x</answer><answer>y", "answer"),
            Some("x")
        );
        assert_eq!(last_tag_block("no tags", "answer"), None);
        assert_eq!(last_tag_block("</answer><answer>", "answer"), None);
        assert_eq!(last_tag_block("<answer></answer>", "answer"), Some(""));
    }

    #[test]
    fn tag_block_unicode_and_huge() {
        assert_eq!(
            last_tag_block("é<answer>ü 日本</answer>é", "answer"),
            Some("ü 日本")
        );
        let huge = "<answer>".repeat(200_000);
        assert_eq!(last_tag_block(&huge, "answer"), None);
        let huge2 = "<answer>1</answer>".repeat(60_000);
        assert_eq!(last_tag_block(&huge2, "answer"), Some("1"));
    }

    #[test]
    fn extract_rules() {
        assert_eq!(AnswerExtract::Whole.extract("  x \n"), Some("x"));
        assert_eq!(AnswerExtract::Whole.extract("  \n"), None);
        assert_eq!(
            AnswerExtract::default().extract("<answer>  </answer>"),
            None
        );
        assert!(AnswerExtract::Tag("a b".into()).validate("qa").is_err());
        assert!(AnswerExtract::Tag("".into()).validate("qa").is_err());
        assert!(AnswerExtract::Tag("final".into()).validate("qa").is_ok());
    }

    #[test]
    fn boxed_variants() {
        assert_eq!(last_boxed(r"so \boxed{\frac{1}{2}}."), Some(r"\frac{1}{2}"));
        assert_eq!(last_boxed(r"\boxed{1} or \boxed{2}"), Some("2"));
        assert_eq!(last_boxed(r"\boxed{1} or \fbox{3}"), Some("3"));
        assert_eq!(last_boxed(r"\fbox{3} or \boxed{4}"), Some("4"));
        assert_eq!(last_boxed(r"$\boxed 5$ done"), Some("5"));
        assert_eq!(last_boxed(r"\boxed{unclosed {x}"), None);
        assert_eq!(last_boxed(r"\boxed{}"), None);
        assert_eq!(last_boxed(r"trailing \boxed"), None);
        assert_eq!(last_boxed(r"\boxedx"), None);
        assert_eq!(last_boxed(r"\boxed{日本}"), Some("日本"));
        assert_eq!(last_boxed(""), None);
        let deep = format!(r"\boxed{{{}1{}}}", "{".repeat(100_000), "}".repeat(100_000));
        assert!(last_boxed(&deep).is_some());
        let unbalanced = format!(r"\boxed{}", "{".repeat(1_000_000));
        assert_eq!(last_boxed(&unbalanced), None);
    }

    #[test]
    fn gsm8k_extractors() {
        assert_eq!(gsm8k_strict("work\n#### 1,234"), Some("1234".into()));
        assert_eq!(gsm8k_strict("#### 1\n#### -7."), Some("-7.".into()));
        assert_eq!(gsm8k_strict("####5"), None);
        assert_eq!(gsm8k_strict("#### x"), None);
        assert_eq!(gsm8k_strict("#### ."), None);
        assert_eq!(gsm8k_strict("#### -"), None);
        assert_eq!(last_number("I think 3 then 42."), Some("42".into()));
        assert_eq!(last_number("total -1,000, ok"), Some("-1000".into()));
        assert_eq!(last_number("x-5"), Some("-5".into()));
        assert_eq!(last_number("3.5"), Some("3.5".into()));
        assert_eq!(last_number("no digits. at all"), None);
        assert_eq!(last_number(""), None);
        assert_eq!(last_number("日本7語"), Some("7".into()));
    }
}
