//! Reading and writing each format, including nested parquet as verl writes it.

use std::fs::File;
use std::sync::Arc;

use arrow_array::builder::{Int64Builder, ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Fields, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use reinforge_data::gen::{arith, countdown, ArithConfig, CountdownConfig};
use reinforge_data::{
    read_records, write_jsonl, write_parquet, DataError, Dataset, FileFormat, LoadOptions, PromptRecord,
};
use serde_json::{json, Value};

use crate::common::{fake_encode, temp_file};

fn opts() -> LoadOptions {
    LoadOptions { max_prompt_length: None, ..LoadOptions::default() }
}

fn round_trip(records: &[PromptRecord], name: &str) -> Vec<PromptRecord> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    if name.ends_with(".parquet") {
        write_parquet(&path, records).unwrap();
    } else {
        write_jsonl(&path, records).unwrap();
    }
    // Atomic write: nothing but the target is left in the directory.
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from(name)]);
    let (back, report) = read_records(&path, &opts()).unwrap();
    assert_eq!(report.rows_read, records.len());
    assert_eq!(report.rows_kept, records.len());
    back
}

#[test]
fn generated_datasets_round_trip_through_jsonl_and_parquet() {
    let cd = countdown(25, 7, &CountdownConfig::default()).unwrap();
    let ar = arith(25, 7, &ArithConfig::default()).unwrap();
    for records in [&cd, &ar] {
        assert_eq!(&round_trip(records, "d.jsonl"), records);
        assert_eq!(&round_trip(records, "d.parquet"), records);
    }
}

fn record(row: usize, gt: Value, extra: Value, ability: Option<&str>) -> PromptRecord {
    PromptRecord {
        row,
        data_source: format!("src{}", row % 2),
        messages: vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": format!("question {row}")}),
        ],
        ground_truth: gt,
        extra_info: extra,
        ability: ability.map(String::from),
    }
}

#[test]
fn heterogeneous_columns_round_trip_through_parquet() {
    let records = vec![
        // Struct-typed extra_info with keys differing per row; ints vs floats under one key.
        record(0, json!("42"), json!({"split": "train", "index": 0, "score": 1}), Some("math")),
        record(1, json!({"target": 3, "numbers": [1, 2]}), json!({"index": 1, "score": 0.5}), None),
        record(2, json!("x + 1"), json!({}), Some("algebra")),
        record(3, json!("7"), json!({"nested": {"a": [1, 2, 3]}}), None),
    ];
    assert_eq!(round_trip(&records, "h.parquet"), records);
    assert_eq!(round_trip(&records, "h.jsonl"), records);

    // Consistent types keep their nested parquet types (what verl's readers expect).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("typed.parquet");
    let typed = vec![
        record(0, json!("1"), json!({"split": "test", "index": 0}), Some("math")),
        record(1, json!("2"), json!({"split": "test", "index": 1}), Some("math")),
    ];
    write_parquet(&path, &typed).unwrap();
    let schema = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap().schema().clone();
    let ty = |name: &str| schema.field_with_name(name).unwrap().data_type().clone();
    match ty("prompt") {
        DataType::List(item) => match item.data_type() {
            DataType::Struct(f) => {
                let names: Vec<_> = f.iter().map(|f| f.name().as_str()).collect();
                assert_eq!(names, ["role", "content"]);
                assert!(f.iter().all(|f| f.data_type() == &DataType::Utf8));
            }
            other => panic!("prompt item type {other:?}"),
        },
        other => panic!("prompt type {other:?}"),
    }
    match ty("reward_model") {
        DataType::Struct(f) => {
            assert_eq!(f.find("ground_truth").unwrap().1.data_type(), &DataType::Utf8);
            assert_eq!(f.find("style").unwrap().1.data_type(), &DataType::Utf8);
        }
        other => panic!("reward_model type {other:?}"),
    }
    match ty("extra_info") {
        DataType::Struct(f) => assert_eq!(f.find("index").unwrap().1.data_type(), &DataType::Int64),
        other => panic!("extra_info type {other:?}"),
    }
    assert_eq!(ty("data_source"), DataType::Utf8);
}

/// Builds a parquet file the way verl's preprocessing scripts (pandas -> pyarrow) lay it
/// out, with the arrow writer directly rather than through this crate's writer.
fn write_verl_style_parquet(path: &std::path::Path) {
    let msg_fields = Fields::from(vec![
        Field::new("content", DataType::Utf8, true),
        Field::new("role", DataType::Utf8, true),
    ]);
    let mut prompt = ListBuilder::new(StructBuilder::from_fields(msg_fields.clone(), 0))
        .with_field(Arc::new(Field::new("element", DataType::Struct(msg_fields), true)));
    let chats: [&[(&str, &str)]; 3] = [
        &[("user", "What is 2 + 2?")],
        &[("system", "You are a helpful assistant."), ("user", "Natalia sold clips to 48 friends.")],
        &[("user", "Name a prime.")],
    ];
    for chat in chats {
        for (role, content) in chat {
            let s = prompt.values();
            s.field_builder::<StringBuilder>(0).unwrap().append_value(*content);
            s.field_builder::<StringBuilder>(1).unwrap().append_value(*role);
            s.append(true);
        }
        prompt.append(true);
    }
    let prompt = prompt.finish();

    let rm_fields = Fields::from(vec![
        Field::new("ground_truth", DataType::Utf8, true),
        Field::new("style", DataType::Utf8, true),
    ]);
    let mut rm = StructBuilder::from_fields(rm_fields, 3);
    for gt in ["4", "72", "{\"target\": 7, \"numbers\": [1, 6]}"] {
        rm.field_builder::<StringBuilder>(0).unwrap().append_value(gt);
        rm.field_builder::<StringBuilder>(1).unwrap().append_value("rule");
        rm.append(true);
    }
    let rm = rm.finish();

    let ei_fields = Fields::from(vec![
        Field::new("split", DataType::Utf8, true),
        Field::new("index", DataType::Int64, true),
        Field::new("answer", DataType::Utf8, true),
    ]);
    let mut ei = StructBuilder::from_fields(ei_fields, 3);
    for (i, present) in [true, true, false].into_iter().enumerate() {
        if present {
            ei.field_builder::<StringBuilder>(0).unwrap().append_value("train");
            ei.field_builder::<Int64Builder>(1).unwrap().append_value(i as i64);
            // Row 0 has no answer key: stored as a null struct member.
            if i == 0 {
                ei.field_builder::<StringBuilder>(2).unwrap().append_null();
            } else {
                ei.field_builder::<StringBuilder>(2).unwrap().append_value("#### 72");
            }
        } else {
            ei.field_builder::<StringBuilder>(0).unwrap().append_null();
            ei.field_builder::<Int64Builder>(1).unwrap().append_null();
            ei.field_builder::<StringBuilder>(2).unwrap().append_null();
        }
        ei.append(present);
    }
    let ei = ei.finish();

    let columns: Vec<(&str, ArrayRef)> = vec![
        ("data_source", Arc::new(StringArray::from(vec!["openai/gsm8k"; 3]))),
        ("prompt", Arc::new(prompt)),
        ("ability", Arc::new(StringArray::from(vec![Some("math"), Some("math"), None]))),
        ("reward_model", Arc::new(rm)),
        ("extra_info", Arc::new(ei)),
        // A column the loader does not need (like images): projected away, not read.
        ("images", Arc::new(StringArray::from(vec!["a", "b", "c"]))),
    ];
    let schema = Arc::new(Schema::new(
        columns.iter().map(|(n, a)| Field::new(*n, a.data_type().clone(), true)).collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(schema.clone(), columns.into_iter().map(|c| c.1).collect()).unwrap();
    let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn reads_verl_style_nested_snappy_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.parquet");
    write_verl_style_parquet(&path);

    let (recs, report) = read_records(&path, &opts()).unwrap();
    assert_eq!((report.rows_read, report.rows_kept, report.skipped_malformed), (3, 3, 0));
    assert_eq!(recs[0].row, 0);
    assert_eq!(recs[0].data_source, "openai/gsm8k");
    assert_eq!(recs[0].messages, vec![json!({"content": "What is 2 + 2?", "role": "user"})]);
    assert_eq!(recs[0].ground_truth, json!("4"));
    // The null member of a struct column reads as an absent key.
    assert_eq!(recs[0].extra_info, json!({"split": "train", "index": 0}));
    assert_eq!(recs[0].ability.as_deref(), Some("math"));
    assert_eq!(recs[1].messages.len(), 2);
    assert_eq!(recs[1].messages[0]["role"], "system");
    assert_eq!(recs[1].extra_info, json!({"split": "train", "index": 1, "answer": "#### 72"}));
    // A JSON object stored as a string ground truth is decoded; "4" and "72" stay strings.
    assert_eq!(recs[2].ground_truth, json!({"target": 7, "numbers": [1, 6]}));
    assert_eq!(recs[2].extra_info, json!({}));
    assert_eq!(recs[2].ability, None);

    let ds = Dataset::load(&path, &opts(), &fake_encode).unwrap();
    assert_eq!(ds.len(), 3);
    assert_eq!(ds.items()[0].prompt_ids, fake_encode(&recs[0].messages).unwrap());

    // A wrong prompt_key fails once, listing the columns that exist.
    let wrong = LoadOptions { prompt_key: "question".into(), ..opts() };
    let err = read_records(&path, &wrong).unwrap_err().to_string();
    assert!(err.contains("no column 'question'"), "{err}");
    assert!(err.contains("data_source, prompt, ability, reward_model, extra_info, images"), "{err}");
}

#[test]
fn reads_json_arrays_and_custom_column_names() {
    let text = r#"[
        {"question": [{"role": "user", "content": "hi there"}], "src": "a", "rm": {"answer": 1}, "meta": {"k": 1}, "skill": "x"},
        {"question": "plain string prompt", "src": "b", "rm": {"answer": [1, 2]}}
    ]"#;
    let (_d, path) = temp_file("rows.json", text);
    let o = LoadOptions {
        prompt_key: "question".into(),
        data_source_key: "src".into(),
        reward_model_key: "rm".into(),
        ground_truth_key: "answer".into(),
        extra_info_key: "meta".into(),
        ability_key: "skill".into(),
        ..opts()
    };
    let (recs, _) = read_records(&path, &o).unwrap();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].ground_truth, json!(1));
    assert_eq!(recs[0].extra_info, json!({"k": 1}));
    assert_eq!(recs[0].ability.as_deref(), Some("x"));
    // A plain string prompt is one user message.
    assert_eq!(recs[1].messages, vec![json!({"role": "user", "content": "plain string prompt"})]);
    assert_eq!(recs[1].ground_truth, json!([1, 2]));
    assert_eq!(recs[1].extra_info, json!({}));

    let (_d, obj) = temp_file("obj.json", r#"{"prompt": "x"}"#);
    let err = read_records(&obj, &opts()).unwrap_err().to_string();
    assert!(err.contains("must be an array of row objects"), "{err}");
}

#[test]
fn string_encoded_columns_and_default_data_source() {
    let rows = [
        json!({"prompt": "q0", "reward_model": "{\"ground_truth\": \"5\", \"style\": \"rule\"}", "extra_info": "{\"index\": 3}"}),
        json!({"prompt": "q1", "reward_model": {"ground_truth": "{\"target\": 1}"}}),
    ];
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    let (_d, path) = temp_file("s.jsonl", &text);
    let o = LoadOptions { default_data_source: Some("mine".into()), ..opts() };
    let (recs, _) = read_records(&path, &o).unwrap();
    assert_eq!(recs[0].data_source, "mine");
    assert_eq!(recs[0].ground_truth, json!("5"));
    assert_eq!(recs[0].extra_info, json!({"index": 3}));
    assert_eq!(recs[1].ground_truth, json!({"target": 1}));
    let keep = LoadOptions { decode_json_ground_truth: false, ..o };
    assert_eq!(read_records(&path, &keep).unwrap().0[1].ground_truth, json!("{\"target\": 1}"));
}

#[test]
fn unknown_extension_is_a_clear_error() {
    let (_d, path) = temp_file("data.csv", "prompt\nhi\n");
    let err = read_records(&path, &opts()).unwrap_err();
    assert!(matches!(err, DataError::Format { .. }));
    let msg = err.to_string();
    assert!(msg.contains("data.csv") && msg.contains("'.csv'") && msg.contains(".jsonl, .json or .parquet"), "{msg}");
    assert_eq!(FileFormat::from_path("X.PARQUET".as_ref()).unwrap(), FileFormat::Parquet);
    assert!(FileFormat::from_path("noext".as_ref()).unwrap_err().to_string().contains("(no extension)"));
}

#[test]
fn not_a_parquet_file_and_missing_file_are_errors() {
    let (_d, path) = temp_file("bad.parquet", "this is not parquet");
    let err = read_records(&path, &opts()).unwrap_err().to_string();
    assert!(err.contains("bad.parquet") && err.contains("cannot read parquet file"), "{err}");
    let err = read_records("/nonexistent/x.jsonl", &opts()).unwrap_err();
    assert!(matches!(err, DataError::Io { .. }), "{err}");
}

#[test]
fn load_files_concatenates_and_max_samples_stops_early() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.jsonl");
    let b = dir.path().join("b.parquet");
    write_jsonl(&a, &arith(3, 1, &ArithConfig::default()).unwrap()).unwrap();
    write_parquet(&b, &countdown(4, 1, &CountdownConfig::default()).unwrap()).unwrap();
    let ds = Dataset::load_files(&[&a, &b], &opts(), &fake_encode).unwrap();
    assert_eq!(ds.len(), 7);
    assert_eq!(ds.files(), &[a.clone(), b.clone()]);
    let files: Vec<usize> = ds.items().iter().map(|i| i.file).collect();
    assert_eq!(files, [0, 0, 0, 1, 1, 1, 1]);
    assert_eq!(ds.items()[3].record.row, 0);
    assert_eq!(ds.items()[3].record.data_source, "countdown");

    let capped = LoadOptions { max_samples: Some(4), ..opts() };
    let ds = Dataset::load_files(&[&a, &b], &capped, &fake_encode).unwrap();
    assert_eq!(ds.len(), 4);
    assert_eq!(ds.report().rows_read, 4);

    let gen = arith(5, 2, &ArithConfig::default()).unwrap();
    let ds = Dataset::from_records(gen.clone(), "<arith>", &opts(), &fake_encode).unwrap();
    assert_eq!(ds.len(), 5);
    assert_eq!(ds.items()[2].record, gen[2]);
}

#[test]
fn empty_write_and_read() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["e.jsonl", "e.parquet"] {
        let path = dir.path().join(name);
        if name.ends_with("parquet") {
            write_parquet(&path, &[]).unwrap();
        } else {
            write_jsonl(&path, &[]).unwrap();
        }
        let (recs, report) = read_records(&path, &opts()).unwrap();
        assert!(recs.is_empty());
        assert_eq!(report.rows_read, 0);
        let err = Dataset::load(&path, &opts(), &fake_encode).unwrap_err();
        assert!(matches!(err, DataError::Empty { .. }), "{err}");
    }
}

/// Search-R1's own data (`scripts/data_process/nq_search.py`, written by pandas + pyarrow
/// into tests/data/nq_search_sample.parquet by make_nq_search.py) loads as it is: FlashRAG's
/// extra columns are ignored, `prompt` is Search-R1's template, the golden answers are
/// `{"target": [...]}` for qa_em.
#[test]
fn reads_search_r1s_nq_search_parquet_unchanged() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nq_search_sample.parquet");
    let (recs, report) = read_records(&path, &opts()).unwrap();
    assert_eq!((recs.len(), report.skipped_malformed), (3, 0));
    let r = &recs[0];
    assert_eq!(r.data_source, "nq");
    assert_eq!(r.ability.as_deref(), Some("fact-reasoning"));
    assert_eq!(r.ground_truth, json!({"target": ["Wilhelm Conrad Röntgen"]}));
    assert_eq!(r.extra_info, json!({"split": "test", "index": 0}));
    assert_eq!(r.messages, vec![json!({"role": "user", "content": reinforge_data::gen::search_r1_prompt("who got the first nobel prize in physics")})]);
    assert_eq!(recs[2].ground_truth["target"], json!(["Olivia", "MFSK"]));
    // The question already ended in `?`: none added.
    assert!(recs[2].messages[0]["content"].as_str().unwrap().ends_with("Question: which mode is used for short wave broadcast service?\n"));
}

#[test]
fn label_key_reads_openrlhf_style_label_columns_from_jsonl_and_parquet() {
    // OpenRLHF's prompt files: `{input, label}` rows (--input_key, --label_key).
    let o = LoadOptions { prompt_key: "input".into(), label_key: Some("answer".into()), default_data_source: Some("openrlhf".into()), ..opts() };
    let (_d, path) = temp_file("p.jsonl", "{\"input\": \"1+1?\", \"answer\": \"2\"}\n{\"input\": \"2+2?\", \"answer\": 4}\n");
    let (recs, _) = read_records(&path, &o).unwrap();
    assert_eq!((recs[0].ground_truth.clone(), recs[1].ground_truth.clone()), (json!("2"), json!(4)));
    let (_d, missing) = temp_file("m.jsonl", "{\"input\": \"1+1?\", \"label\": \"2\"}\n");
    let err = read_records(&missing, &o).unwrap_err().to_string();
    assert!(err.contains("'answer'") && err.contains("data.label_key"), "{err}");

    // Parquet reads project onto the columns a row needs: the label column is one of them.
    let dir = tempfile::tempdir().unwrap();
    let pq = dir.path().join("p.parquet");
    let schema = Arc::new(Schema::new(vec![Field::new("input", DataType::Utf8, false), Field::new("answer", DataType::Utf8, false)]));
    let cols: Vec<ArrayRef> = vec![Arc::new(StringArray::from(vec!["1+1?", "2+2?"])), Arc::new(StringArray::from(vec!["2", "4"]))];
    let mut w = ArrowWriter::try_new(File::create(&pq).unwrap(), schema.clone(), None).unwrap();
    w.write(&RecordBatch::try_new(schema, cols).unwrap()).unwrap();
    w.close().unwrap();
    let (recs, _) = read_records(&pq, &o).unwrap();
    assert_eq!(recs.iter().map(|r| r.ground_truth.clone()).collect::<Vec<_>>(), [json!("2"), json!("4")]);
}
