//! Malformed rows, the bad-row policy, and the prompt length filter.

use reinforge_data::{read_records, DataError, Dataset, LoadOptions, OnBadRow};
use serde_json::Value;

use crate::common::{fake_encode, temp_file};

/// Row numbers (0-based, blank lines not counted) and what is wrong with each.
const JSONL: &str = r#"{"data_source": "a", "prompt": [{"role": "user", "content": "good zero"}], "reward_model": {"ground_truth": "1"}}

{"data_source": "a", "prompt": [{"role": "user", "content": "bad json"
{"data_source": "a", "prompt": 7, "reward_model": {"ground_truth": "1"}}
{"data_source": "a", "prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}}
{"data_source": "a", "prompt": [{"role": "user", "content": "no truth"}], "reward_model": {"style": "rule"}}
[1, 2, 3]
{"data_source": "a", "prompt": [{"role": "user", "content": "good six"}], "reward_model": {"ground_truth": "2"}}
{"prompt": "no data source", "reward_model": {"ground_truth": "1"}}
{"data_source": "a", "prompt": [], "reward_model": {"ground_truth": "1"}}
{"data_source": "a", "prompt": [{"content": "x"}], "reward_model": {"ground_truth": "1"}}
{"data_source": 5, "prompt": "x", "reward_model": {"ground_truth": "1"}}
{"data_source": "a", "prompt": "x", "reward_model": {"ground_truth": "1"}, "extra_info": [1]}
{"data_source": "a", "prompt": [{"role": "user", "content": null, "name": null}], "reward_model": {"ground_truth": "1"}}

"#;

fn skip() -> LoadOptions {
    LoadOptions { on_bad_row: OnBadRow::Skip, max_prompt_length: None, ..LoadOptions::default() }
}

#[test]
fn skip_counts_bad_rows_and_keeps_reasons_with_row_numbers() {
    let (_d, path) = temp_file("mixed.jsonl", JSONL);
    let (recs, report) = read_records(&path, &skip()).unwrap();
    assert_eq!(report.rows_read, 13);
    assert_eq!(report.rows_kept, 2);
    assert_eq!(report.skipped_malformed, 11);
    assert_eq!(report.bad_rows.len(), 10, "reasons are capped at max_reported_bad_rows");
    let rows: Vec<usize> = recs.iter().map(|r| r.row).collect();
    assert_eq!(rows, [0, 6]);
    let expect: [(usize, usize, &str); 10] = [
        (1, 3, "invalid JSON"),
        (2, 4, "'prompt' must be a list of {role, content} messages or a string, got a number"),
        (3, 5, "prompt[0] has no 'content'"),
        (4, 6, "missing 'reward_model.ground_truth'"),
        (5, 7, "row must be a JSON object, got a list"),
        (7, 9, "missing 'data_source'"),
        (8, 10, "'prompt' is an empty list of messages"),
        (9, 11, "prompt[0] has no 'role'"),
        (10, 12, "'data_source' must be a string, got a number"),
        (11, 13, "'extra_info' must be an object, got a list"),
    ];
    for (bad, (row, line, reason)) in report.bad_rows.iter().zip(expect) {
        assert_eq!((bad.row, bad.line), (row, Some(line)), "{bad:?}");
        assert!(bad.reason.contains(reason), "row {row}: {:?} should contain {reason:?}", bad.reason);
        assert_eq!(bad.file, path);
    }
    let shown = report.to_string();
    assert!(shown.starts_with("read 13 rows, kept 2, skipped 11 malformed (e.g. "), "{shown}");

    let more = LoadOptions { max_reported_bad_rows: 100, ..skip() };
    let (_, report) = read_records(&path, &more).unwrap();
    assert_eq!(report.bad_rows.len(), 11);
    assert_eq!(report.bad_rows[10].row, 12);
    assert!(report.bad_rows[10].reason.contains("prompt[0] has no 'content'"));
}

#[test]
fn fail_names_file_row_and_line() {
    let (_d, path) = temp_file("mixed.jsonl", JSONL);
    let fail = LoadOptions { on_bad_row: OnBadRow::Fail, ..skip() };
    let err = read_records(&path, &fail).unwrap_err();
    let DataError::BadRow { row, line, ref reason, .. } = err else { panic!("{err:?}") };
    assert_eq!((row, line), (1, Some(3)));
    assert!(reason.starts_with("invalid JSON: "), "{reason}");
    let msg = err.to_string();
    let prefix = format!("{}: row 1 (line 3): invalid JSON: ", path.display());
    assert!(msg.starts_with(&prefix), "{msg}");
    assert!(msg.ends_with("(set data.on_bad_row = \"skip\" to skip such rows)"), "{msg}");

    // Parquet/JSON rows have no line number.
    let (_d2, json) = temp_file("rows.json", r#"[{"data_source": "a", "prompt": "x"}]"#);
    let msg = read_records(&json, &fail).unwrap_err().to_string();
    assert_eq!(
        msg,
        format!(
            "{}: row 0: missing 'reward_model.ground_truth' (set data.require_ground_truth = false if the reward does not need it) (set data.on_bad_row = \"skip\" to skip such rows)",
            json.display()
        )
    );
    let lenient = LoadOptions { require_ground_truth: false, ..fail };
    let (recs, _) = read_records(&json, &lenient).unwrap();
    assert_eq!(recs[0].ground_truth, Value::Null);
}

#[test]
fn invalid_utf8_line_is_a_bad_row_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bin.jsonl");
    let mut bytes = b"{\"data_source\": \"a\", \"prompt\": \"ok\", \"reward_model\": {\"ground_truth\": \"1\"}}\n".to_vec();
    bytes.extend_from_slice(b"\xff\xfe garbage\r\n");
    std::fs::write(&path, bytes).unwrap();
    let (recs, report) = read_records(&path, &skip()).unwrap();
    assert_eq!((recs.len(), report.skipped_malformed), (1, 1));
    assert_eq!(report.bad_rows[0].row, 1);
}

fn rows_with_words(words: &[usize]) -> String {
    words
        .iter()
        .map(|&n| {
            let content = vec!["w"; n].join(" ");
            format!(
                "{{\"data_source\": \"a\", \"prompt\": [{{\"role\": \"user\", \"content\": \"{content}\"}}], \"reward_model\": {{\"ground_truth\": \"1\"}}}}\n"
            )
        })
        .collect()
}

#[test]
fn overlong_prompts_are_filtered_and_counted() {
    // fake_encode: 2 + words + 1 tokens.
    let (_d, path) = temp_file("len.jsonl", &rows_with_words(&[1, 5, 2, 9, 3]));
    let o = LoadOptions { max_prompt_length: Some(6), ..LoadOptions::default() };
    let ds = Dataset::load(&path, &o, &fake_encode).unwrap();
    let rows: Vec<usize> = ds.items().iter().map(|i| i.record.row).collect();
    assert_eq!(rows, [0, 2, 4]);
    assert!(ds.items().iter().all(|i| i.prompt_ids.len() <= 6));
    assert_eq!(ds.items()[1].prompt_ids.len(), 5);
    let r = ds.report();
    assert_eq!((r.rows_read, r.rows_kept, r.filtered_too_long, r.skipped_malformed), (5, 3, 2, 0));
    assert_eq!(r.to_string(), "read 5 rows, kept 3, filtered 2 over max_prompt_length");

    // Without filtering, an overlong prompt is a bad row (verl's truncation = "error").
    let strict = LoadOptions { filter_overlong_prompts: false, ..o.clone() };
    let msg = Dataset::load(&path, &strict, &fake_encode).unwrap_err().to_string();
    assert!(msg.contains("row 1 (line 2): prompt is 8 tokens, over max_prompt_length = 6"), "{msg}");

    // Everything filtered is an error that says why.
    let tiny = LoadOptions { max_prompt_length: Some(2), ..o };
    let err = Dataset::load(&path, &tiny, &fake_encode).unwrap_err();
    assert!(matches!(err, DataError::Empty { .. }));
    assert!(err.to_string().contains("read 5 rows, kept 0, filtered 5 over max_prompt_length"), "{err}");
}

#[test]
fn encoder_errors_follow_the_bad_row_policy() {
    let (_d, path) = temp_file("enc.jsonl", &rows_with_words(&[1, 2, 3]));
    let picky = |m: &[Value]| -> Result<Vec<u32>, String> {
        let ids = fake_encode(m)?;
        if ids.len() == 5 { Err("template rejects this".into()) } else { Ok(ids) }
    };
    let ds = Dataset::load(&path, &skip(), &picky).unwrap();
    assert_eq!(ds.len(), 2);
    assert_eq!(ds.report().skipped_malformed, 1);
    assert!(ds.report().bad_rows[0].reason.contains("chat template/tokenizer failed: template rejects this"));
    let fail = LoadOptions { on_bad_row: OnBadRow::Fail, ..skip() };
    let msg = Dataset::load(&path, &fail, &picky).unwrap_err().to_string();
    assert!(msg.contains("row 1 (line 2): chat template/tokenizer failed"), "{msg}");
}

#[test]
fn options_deserialize_from_config_names() {
    let o: LoadOptions = serde_json::from_value(serde_json::json!({
        "prompt_key": "question", "max_prompt_length": 1024, "on_bad_row": "skip"
    }))
    .unwrap();
    assert_eq!(o.prompt_key, "question");
    assert_eq!(o.max_prompt_length, Some(1024));
    assert_eq!(o.on_bad_row, OnBadRow::Skip);
    assert_eq!(o.reward_model_key, "reward_model");
    // Flattened next to the loader's keys in one [data] table: both parse from it.
    let table = serde_json::json!({"prompt_key": "q", "train_batch_size": 32, "shuffle": false});
    let o: LoadOptions = serde_json::from_value(table.clone()).unwrap();
    let l: reinforge_data::LoaderConfig = serde_json::from_value(table).unwrap();
    assert_eq!((o.prompt_key.as_str(), l.batch_size, l.shuffle), ("q", 32, false));
}
