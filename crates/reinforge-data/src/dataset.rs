//! Loading dataset files into tokenized, length-filtered prompts.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::formats::{for_each_row, RawRow};
use crate::loader::Batch;
use crate::record::{parse_row, PromptRecord};
use crate::{DataError, Result};

/// What to do with a row that cannot be parsed or tokenized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBadRow {
    /// Count it, remember the first few reasons in the [`LoadReport`], and go on.
    Skip,
    /// Stop loading with an error naming the file and row (the default: bad data should be seen).
    #[default]
    Fail,
}

/// How to read a dataset file. Field names mirror verl's `data.*` config keys.
///
/// Unknown keys are ignored (not rejected) so this can be `#[serde(flatten)]`ed into a
/// larger `[data]` table together with [`crate::LoaderConfig`]; that table should reject typos.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoadOptions {
    /// Column holding the chat messages (verl `data.prompt_key`).
    pub prompt_key: String,
    /// Column naming the reward function.
    pub data_source_key: String,
    /// Column holding `{ground_truth, style}`.
    pub reward_model_key: String,
    /// Key of the ground truth inside the reward_model column.
    pub ground_truth_key: String,
    /// A top-level column holding the ground truth instead (OpenRLHF's `--label_key`).
    pub label_key: Option<String>,
    /// Column holding per-row metadata passed through to the reward.
    pub extra_info_key: String,
    /// Column holding verl's ability tag.
    pub ability_key: String,
    /// data_source for rows that have none; `None` makes such rows malformed.
    pub default_data_source: Option<String>,
    /// Whether a row without `reward_model.ground_truth` is malformed.
    pub require_ground_truth: bool,
    /// Decode a ground truth string that holds a JSON object (struct serialized to a string column).
    pub decode_json_ground_truth: bool,
    /// Longest prompt in tokens (after the chat template); `None` for no limit.
    pub max_prompt_length: Option<usize>,
    /// Drop prompts over `max_prompt_length` (counted); if false they are bad rows instead.
    pub filter_overlong_prompts: bool,
    /// Policy for malformed rows.
    pub on_bad_row: OnBadRow,
    /// How many bad-row reasons the report keeps (all are counted).
    pub max_reported_bad_rows: usize,
    /// Keep at most this many prompts (the first ones in file order) and stop reading.
    pub max_samples: Option<usize>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            prompt_key: "prompt".into(),
            data_source_key: "data_source".into(),
            reward_model_key: "reward_model".into(),
            ground_truth_key: "ground_truth".into(),
            label_key: None,
            extra_info_key: "extra_info".into(),
            ability_key: "ability".into(),
            default_data_source: None,
            require_ground_truth: true,
            decode_json_ground_truth: true,
            // verl's default data.max_prompt_length.
            max_prompt_length: Some(512),
            filter_overlong_prompts: true,
            on_bad_row: OnBadRow::Fail,
            max_reported_bad_rows: 10,
            max_samples: None,
        }
    }
}

impl LoadOptions {
    /// The top-level columns a row needs; the parquet reader projects onto these.
    pub(crate) fn columns(&self) -> Vec<&str> {
        let mut cols = vec![
            self.prompt_key.as_str(),
            &self.data_source_key,
            &self.reward_model_key,
            &self.extra_info_key,
            &self.ability_key,
        ];
        cols.extend(self.label_key.as_deref());
        cols
    }
}

/// One skipped row, kept in the report so users can find and fix it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadRow {
    /// File the row came from.
    pub file: PathBuf,
    /// 0-based row number in that file.
    pub row: usize,
    /// 1-based line number for JSONL files.
    pub line: Option<usize>,
    /// What is wrong with the row.
    pub reason: String,
}

/// What loading did with the rows it read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadReport {
    /// Rows seen in the file(s), malformed ones included.
    pub rows_read: usize,
    /// Rows that became dataset items.
    pub rows_kept: usize,
    /// Number of malformed rows skipped (`on_bad_row = "skip"`).
    pub skipped_malformed: usize,
    /// The first few skipped rows with reasons (at most `max_reported_bad_rows`).
    pub bad_rows: Vec<BadRow>,
    /// Prompts dropped for being longer than `max_prompt_length`.
    pub filtered_too_long: usize,
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "read {} rows, kept {}", self.rows_read, self.rows_kept)?;
        if self.filtered_too_long > 0 {
            write!(f, ", filtered {} over max_prompt_length", self.filtered_too_long)?;
        }
        if self.skipped_malformed > 0 {
            write!(f, ", skipped {} malformed", self.skipped_malformed)?;
            let shown: Vec<String> = self
                .bad_rows
                .iter()
                .map(|b| format!("{} row {}: {}", b.file.display(), b.row, b.reason))
                .collect();
            if !shown.is_empty() {
                write!(f, " (e.g. {})", shown.join("; "))?;
            }
        }
        Ok(())
    }
}

/// A prompt ready for rollout: the record plus its templated token ids.
#[derive(Debug, Clone, PartialEq)]
pub struct DataItem {
    /// The parsed row.
    pub record: PromptRecord,
    /// Token ids of the prompt after the chat template (with generation prompt).
    pub prompt_ids: Vec<u32>,
    /// Index into [`Dataset::files`] of the file the row came from.
    pub file: usize,
}

/// Tokenized prompts from one or more files, in file order.
#[derive(Debug, Clone)]
pub struct Dataset {
    items: Vec<DataItem>,
    files: Vec<PathBuf>,
    report: LoadReport,
}

/// The prompt encoder callers pass in: chat messages -> token ids (or an error message).
pub type Encoder<'a> = dyn Fn(&[Value]) -> std::result::Result<Vec<u32>, String> + 'a;

/// Accumulates rows from any source, applying the bad-row policy and length filter.
struct Collector<'a> {
    opts: &'a LoadOptions,
    encoder: Option<&'a Encoder<'a>>,
    report: LoadReport,
    items: Vec<DataItem>,
    records: Vec<PromptRecord>,
}

impl<'a> Collector<'a> {
    fn new(opts: &'a LoadOptions, encoder: Option<&'a Encoder<'a>>) -> Self {
        Collector { opts, encoder, report: LoadReport::default(), items: Vec::new(), records: Vec::new() }
    }

    fn full(&self) -> bool {
        self.opts.max_samples.is_some_and(|m| self.report.rows_kept >= m)
    }

    fn bad(&mut self, path: &Path, row: usize, line: Option<usize>, reason: String) -> Result<()> {
        match self.opts.on_bad_row {
            OnBadRow::Fail => Err(DataError::BadRow { path: path.to_path_buf(), row, line, reason }),
            OnBadRow::Skip => {
                tracing::debug!(file = %path.display(), row, %reason, "skipping malformed row");
                self.report.skipped_malformed += 1;
                if self.report.bad_rows.len() < self.opts.max_reported_bad_rows {
                    self.report.bad_rows.push(BadRow { file: path.to_path_buf(), row, line, reason });
                }
                Ok(())
            }
        }
    }

    /// Handles one raw row; returns false once `max_samples` prompts are kept.
    fn raw(&mut self, path: &Path, file: usize, raw: RawRow, columnar: bool) -> Result<bool> {
        self.report.rows_read += 1;
        let parsed = raw.value.and_then(|v| parse_row(raw.row, v, self.opts, columnar));
        match parsed {
            Ok(rec) => self.record(path, file, rec, raw.line)?,
            Err(reason) => self.bad(path, raw.row, raw.line, reason)?,
        }
        Ok(!self.full())
    }

    fn record(&mut self, path: &Path, file: usize, rec: PromptRecord, line: Option<usize>) -> Result<()> {
        let Some(encoder) = self.encoder else {
            self.report.rows_kept += 1;
            self.records.push(rec);
            return Ok(());
        };
        let ids = match encoder(&rec.messages) {
            Ok(ids) => ids,
            Err(e) => return self.bad(path, rec.row, line, format!("chat template/tokenizer failed: {e}")),
        };
        if let Some(max) = self.opts.max_prompt_length {
            if ids.len() > max {
                if self.opts.filter_overlong_prompts {
                    self.report.filtered_too_long += 1;
                    return Ok(());
                }
                return self.bad(
                    path,
                    rec.row,
                    line,
                    format!(
                        "prompt is {} tokens, over max_prompt_length = {max} (or set data.filter_overlong_prompts = true)",
                        ids.len()
                    ),
                );
            }
        }
        self.report.rows_kept += 1;
        self.items.push(DataItem { record: rec, prompt_ids: ids, file });
        Ok(())
    }

    fn read_file(&mut self, path: &Path, file: usize) -> Result<()> {
        if self.full() {
            return Ok(());
        }
        for_each_row(path, &self.opts.columns(), &mut |raw, columnar| self.raw(path, file, raw, columnar))
    }
}

fn files_label(files: &[PathBuf]) -> String {
    files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

impl Dataset {
    /// Loads one file (format from its extension), tokenizing prompts with `encoder`.
    pub fn load(path: impl AsRef<Path>, opts: &LoadOptions, encoder: &Encoder<'_>) -> Result<Dataset> {
        Self::load_files(&[path.as_ref()], opts, encoder)
    }

    /// Loads and concatenates several files, like verl's list-valued `data.train_files`.
    pub fn load_files<P: AsRef<Path>>(
        paths: &[P],
        opts: &LoadOptions,
        encoder: &Encoder<'_>,
    ) -> Result<Dataset> {
        let files: Vec<PathBuf> = paths.iter().map(|p| p.as_ref().to_path_buf()).collect();
        if files.is_empty() {
            return Err(DataError::Config("no dataset files given".into()));
        }
        let mut c = Collector::new(opts, Some(encoder));
        for (i, f) in files.iter().enumerate() {
            c.read_file(f, i)?;
        }
        Self::finish(c, files)
    }

    /// Builds a dataset from in-memory records (e.g. from [`crate::gen`]); `label` names them in errors.
    pub fn from_records(
        records: Vec<PromptRecord>,
        label: &str,
        opts: &LoadOptions,
        encoder: &Encoder<'_>,
    ) -> Result<Dataset> {
        let path = PathBuf::from(label);
        let mut c = Collector::new(opts, Some(encoder));
        for rec in records {
            if c.full() {
                break;
            }
            c.report.rows_read += 1;
            c.record(&path, 0, rec, None)?;
        }
        Self::finish(c, vec![path])
    }

    fn finish(c: Collector<'_>, files: Vec<PathBuf>) -> Result<Dataset> {
        let report = c.report;
        if c.items.is_empty() {
            return Err(DataError::Empty { files: files_label(&files), summary: report.to_string() });
        }
        tracing::info!(files = %files_label(&files), "loaded dataset: {report}");
        Ok(Dataset { items: c.items, files, report })
    }

    /// Number of prompts.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are no prompts (never true for a loaded dataset).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// All prompts in file order.
    pub fn items(&self) -> &[DataItem] {
        &self.items
    }

    /// The prompt at `index`, if any.
    pub fn get(&self, index: usize) -> Option<&DataItem> {
        self.items.get(index)
    }

    /// The files the prompts came from ([`DataItem::file`] indexes this).
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// What loading kept, skipped and filtered.
    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    /// The items a loader batch refers to, in batch order.
    ///
    /// Panics if the batch came from a loader built for a longer dataset.
    pub fn batch(&self, batch: &Batch) -> Vec<&DataItem> {
        batch.indices.iter().map(|&i| &self.items[i]).collect()
    }
}

/// Reads and validates a file's rows without tokenizing (inspection, conversion, tests).
pub fn read_records(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<(Vec<PromptRecord>, LoadReport)> {
    let path = path.as_ref();
    let mut c = Collector::new(opts, None);
    c.read_file(path, 0)?;
    Ok((c.records, c.report))
}
