//! File formats: reading raw JSON rows from JSONL / JSON / Parquet, and atomic writers.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::Type;
use serde_json::{json, Value};

use crate::json_arrow::column as json_column;
use crate::record::PromptRecord;
use crate::{DataError, Result};

/// A dataset file format, chosen by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// One JSON object per line (`.jsonl`, `.ndjson`); blank lines are ignored.
    Jsonl,
    /// A JSON array of row objects (`.json`).
    Json,
    /// Apache Parquet (`.parquet`), as written by pyarrow / HF `datasets` / verl's preprocessors.
    Parquet,
}

impl FileFormat {
    /// The format for a path's extension (case-insensitive), or a clear error.
    pub fn from_path(path: &Path) -> Result<FileFormat> {
        let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("jsonl") | Some("ndjson") => Ok(FileFormat::Jsonl),
            Some("json") => Ok(FileFormat::Json),
            Some("parquet") | Some("pq") => Ok(FileFormat::Parquet),
            other => Err(DataError::format(
                path,
                format!(
                    "unsupported dataset format {}: expected a .jsonl, .json or .parquet file",
                    other.map(|e| format!("'.{e}'")).unwrap_or_else(|| "(no extension)".into())
                ),
            )),
        }
    }
}

/// One row as read from a file, before schema validation.
pub(crate) struct RawRow {
    /// 0-based row number in the file.
    pub row: usize,
    /// 1-based line number (JSONL only).
    pub line: Option<usize>,
    /// The row's JSON, or why it could not be read (invalid JSON line).
    pub value: std::result::Result<Value, String>,
}

/// Callback for each row: (row, columnar) -> keep going?
pub(crate) type RowSink<'a> = dyn FnMut(RawRow, bool) -> Result<bool> + 'a;

/// Streams the rows of a file to `sink` (stops early when it returns false).
///
/// `columns` are the top-level columns rows need; parquet reads only those, which
/// matters for multimodal files with large image columns.
pub(crate) fn for_each_row(path: &Path, columns: &[&str], sink: &mut RowSink<'_>) -> Result<()> {
    match FileFormat::from_path(path)? {
        FileFormat::Jsonl => read_jsonl(path, sink),
        FileFormat::Json => read_json(path, sink),
        FileFormat::Parquet => read_parquet(path, columns, sink),
    }
}

fn open(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| DataError::io(path, e))
}

fn read_jsonl(path: &Path, sink: &mut RowSink<'_>) -> Result<()> {
    let mut reader = BufReader::new(open(path)?);
    let mut buf = Vec::new();
    let (mut line, mut row) = (0usize, 0usize);
    loop {
        buf.clear();
        // Bytes, not `lines()`: invalid UTF-8 on one line is a bad row, not an I/O failure.
        let n = reader.read_until(b'\n', &mut buf).map_err(|e| DataError::io(path, e))?;
        if n == 0 {
            return Ok(());
        }
        line += 1;
        if buf.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        let value = serde_json::from_slice::<Value>(&buf).map_err(|e| format!("invalid JSON: {e}"));
        if !sink(RawRow { row, line: Some(line), value }, false)? {
            return Ok(());
        }
        row += 1;
    }
}

fn read_json(path: &Path, sink: &mut RowSink<'_>) -> Result<()> {
    let mut text = String::new();
    open(path)?.read_to_string(&mut text).map_err(|e| DataError::io(path, e))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| DataError::format(path, format!("invalid JSON: {e}")))?;
    let Value::Array(rows) = value else {
        return Err(DataError::format(
            path,
            "a .json dataset must be an array of row objects (use .jsonl for one object per line)",
        ));
    };
    for (row, v) in rows.into_iter().enumerate() {
        if !sink(RawRow { row, line: None, value: Ok(v) }, false)? {
            break;
        }
    }
    Ok(())
}

fn read_parquet(path: &Path, columns: &[&str], sink: &mut RowSink<'_>) -> Result<()> {
    let bad = |e: parquet::errors::ParquetError| {
        DataError::format(path, format!("cannot read parquet file: {e}"))
    };
    let reader = SerializedFileReader::new(open(path)?).map_err(bad)?;
    let root = reader.metadata().file_metadata().schema();
    let fields: Vec<_> =
        root.get_fields().iter().filter(|f| columns.contains(&f.name())).cloned().collect();
    // The prompt column decides whether this is a prompt dataset at all: fail once, not per row.
    if !fields.iter().any(|f| f.name() == columns[0]) {
        let names: Vec<&str> = root.get_fields().iter().map(|f| f.name()).collect();
        return Err(DataError::format(
            path,
            format!(
                "no column '{}' (columns: {}); set data.prompt_key to the prompt column",
                columns[0],
                names.join(", ")
            ),
        ));
    }
    let projection = Type::group_type_builder(root.name()).with_fields(fields).build().map_err(bad)?;
    let rows = reader.get_row_iter(Some(projection)).map_err(bad)?;
    for (row, r) in rows.enumerate() {
        // A decode error here means a corrupt file or unsupported codec: not one bad row.
        let r = r.map_err(|e| DataError::format(path, format!("row {row}: cannot decode parquet: {e}")))?;
        if !sink(RawRow { row, line: None, value: Ok(r.to_json_value()) }, true)? {
            break;
        }
    }
    Ok(())
}

/// Writes `path` via a temporary file in the same directory and a rename, so readers
/// never see a half-written dataset.
fn write_atomic(path: &Path, write: impl FnOnce(&mut BufWriter<File>) -> Result<()>) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| DataError::io(&dir, e))?;
    let name = path
        .file_name()
        .ok_or_else(|| DataError::format(path, "not a file path"))?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let file = File::create(&tmp).map_err(|e| DataError::io(&tmp, e))?;
        let mut w = BufWriter::new(file);
        write(&mut w)?;
        let file = w.into_inner().map_err(|e| DataError::io(&tmp, e.into_error()))?;
        file.sync_all().map_err(|e| DataError::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| DataError::io(path, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes records as JSONL in verl's schema (atomically).
pub fn write_jsonl(path: impl AsRef<Path>, rows: &[PromptRecord]) -> Result<()> {
    let path = path.as_ref();
    write_atomic(path, |w| {
        for r in rows {
            serde_json::to_writer(&mut *w, &r.to_verl_json())
                .map_err(|e| DataError::format(path, e.to_string()))?;
            w.write_all(b"\n").map_err(|e| DataError::io(path, e))?;
        }
        Ok(())
    })
}

/// Writes records as snappy-compressed Parquet in verl's schema (atomically).
///
/// Columns keep their nested types, as verl's preprocessing scripts write them:
/// `prompt: list<struct<role, content, ...>>`, `reward_model: struct<style, ground_truth>`,
/// `extra_info: struct<...>` (types inferred from the values). A `ground_truth` or
/// `extra_info` column whose values do not share one type (or would not read back
/// unchanged) is stored as JSON text instead; the reader decodes JSON objects back, but
/// a number or list stored that way reads back as its text.
pub fn write_parquet(path: impl AsRef<Path>, rows: &[PromptRecord]) -> Result<()> {
    let path = path.as_ref();
    let batch = build_batch(rows).map_err(|e| DataError::format(path, e))?;
    write_atomic(path, |w| {
        let err = |e: parquet::errors::ParquetError| {
            DataError::format(path, format!("cannot write parquet: {e}"))
        };
        let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
        let mut writer = ArrowWriter::try_new(w, batch.schema(), Some(props)).map_err(err)?;
        writer.write(&batch).map_err(err)?;
        writer.close().map_err(err)?;
        Ok(())
    })
}

fn build_batch(rows: &[PromptRecord]) -> std::result::Result<RecordBatch, String> {
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    let mut push = |col: (Field, ArrayRef)| {
        fields.push(col.0);
        columns.push(col.1);
    };

    let ds: Vec<Value> = rows.iter().map(|r| Value::String(r.data_source.clone())).collect();
    push(json_column("data_source", &ds).map_err(|e| format!("data_source: {e}"))?);

    let prompts: Vec<Value> = rows.iter().map(|r| Value::Array(r.messages.clone())).collect();
    push(json_column("prompt", &prompts).map_err(|e| {
        format!("cannot store prompt messages as list<struct> (do all messages share key types?): {e}")
    })?);

    let ability: Vec<Value> =
        rows.iter().map(|r| r.ability.clone().map(Value::String).unwrap_or(Value::Null)).collect();
    push(json_column("ability", &ability).map_err(|e| format!("ability: {e}"))?);

    let reward = |gt: &dyn Fn(&Value) -> Value| -> Vec<Value> {
        rows.iter().map(|r| json!({"style": "rule", "ground_truth": gt(&r.ground_truth)})).collect()
    };
    let rm = json_column("reward_model", &reward(&|g| g.clone()))
        .or_else(|_| json_column("reward_model", &reward(&json_text)))
        .map_err(|e| format!("reward_model: {e}"))?;
    push(rm);

    // verl treats a missing extra_info as {}; parquet cannot store an empty struct at all.
    if rows.iter().any(|r| r.extra_info.as_object().is_some_and(|m| !m.is_empty())) {
        let extra: Vec<Value> = rows.iter().map(|r| r.extra_info.clone()).collect();
        let col = json_column("extra_info", &extra)
            .or_else(|_| string_column("extra_info", extra.iter().map(json_text).collect()))
            .map_err(|e| format!("extra_info: {e}"))?;
        push(col);
    }

    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| e.to_string())
}

/// A value as JSON text, leaving strings as they are (for a plain string column).
fn json_text(v: &Value) -> Value {
    match v {
        Value::String(_) | Value::Null => v.clone(),
        other => Value::String(other.to_string()),
    }
}

fn string_column(name: &str, values: Vec<Value>) -> std::result::Result<(Field, ArrayRef), String> {
    let array: StringArray = values.iter().map(|v| v.as_str()).collect();
    Ok((Field::new(name, DataType::Utf8, true), Arc::new(array)))
}

