//! [`RunLog`]: one run directory's `metrics.jsonl` and TensorBoard event file, kept in step,
//! with the rows of `samples.jsonl` (prompts, responses and rewards the run chose to keep;
//! set aside on resume like the metrics) and `log.txt` (what the run said, appended).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{io_err, Result};
use crate::jsonl::{check, keep_only, JsonlWriter, Truncation, METRICS_FILE};
use crate::metrics::Metrics;
use crate::tfevents::EventWriter;

/// Which sinks a [`RunLog`] writes, and whose run directory it is.
#[derive(Debug, Clone)]
pub struct RunLogOptions {
    /// Write `metrics.jsonl`.
    pub jsonl: bool,
    /// Write a TensorBoard event file.
    pub tensorboard: bool,
    /// Run-directory ownership: checked before every write, so a run that lost its directory
    /// to another neither truncates nor appends to that run's logs.
    pub fence: Option<reinforge_lease::Fence>,
    /// Keep `samples.jsonl` (opened when the first sample arrives).
    pub samples: bool,
    /// Append what the run says to `log.txt`.
    pub text_log: bool,
}

impl Default for RunLogOptions {
    fn default() -> Self {
        RunLogOptions { jsonl: true, tensorboard: true, fence: None, samples: false, text_log: false }
    }
}

/// The samples file of a run directory.
pub const SAMPLES_FILE: &str = "samples.jsonl";
/// The text log of a run directory.
pub const TEXT_LOG_FILE: &str = "log.txt";

/// Seconds since the Unix epoch, as a float (the `timestamp` / `wall_time` of records).
pub fn unix_time() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Writes a run's per-step metrics into its run directory.
#[derive(Debug)]
pub struct RunLog {
    dir: PathBuf,
    jsonl: Option<JsonlWriter>,
    events: Option<EventWriter>,
    fence: Option<reinforge_lease::Fence>,
    truncation: Truncation,
    samples: Option<JsonlWriter>,
    text_log: Option<fs::File>,
}

impl RunLog {
    /// Starts logging a new run in `dir` (created if missing); an existing `metrics.jsonl` is
    /// emptied, its rows appended to `metrics.jsonl.superseded`.
    pub fn create(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open(dir, None, &RunLogOptions::default())
    }

    /// Continues logging in `dir` after resuming from checkpoint step `step`: records of later
    /// steps move to `metrics.jsonl.superseded` so that curves do not double back.
    pub fn resume(dir: impl AsRef<Path>, step: u64) -> Result<Self> {
        Self::open(dir, Some(step), &RunLogOptions::default())
    }

    /// [`create`](Self::create) (`resume_step` is `None`) or [`resume`](Self::resume), with options.
    pub fn open(dir: impl AsRef<Path>, resume_step: Option<u64>, opts: &RunLogOptions) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
        // Checked again before each file is changed or created, not once: truncating reads
        // and fsyncs whole files, and a process paused meanwhile may have lost the directory.
        let fence = opts.fence.as_ref();
        check(fence)?;
        let mut truncation = Truncation::default();
        // A new run's log: the old rows set aside, then the file emptied.
        let fresh = |path: &Path| -> Result<(JsonlWriter, Truncation)> {
            let t = keep_only(path, None, fence)?;
            check(fence)?;
            Ok((JsonlWriter::create(path)?, t))
        };
        let jsonl = if opts.jsonl {
            let path = dir.join(METRICS_FILE);
            let (w, t) = match resume_step {
                Some(step) => JsonlWriter::resume_fenced(&path, step, fence)?,
                None => fresh(&path)?,
            };
            truncation = t;
            Some(w)
        } else {
            None
        };
        let events = if opts.tensorboard {
            // Each process writes its own event file, as TensorFlow does. The restart marker
            // tells TensorBoard to drop earlier files' data from this step on (all of it for
            // a new run), matching what was done to metrics.jsonl.
            let now = unix_time();
            check(fence)?;
            let mut w = EventWriter::create(&dir, now)?;
            w.write_session_start(resume_step.map_or(0, |s| s.saturating_add(1)), now)?;
            Some(w)
        } else {
            None
        };
        // Samples follow the metrics: rows of a superseded future are set aside the same way.
        let samples = if opts.samples {
            let path = dir.join(SAMPLES_FILE);
            Some(match resume_step {
                Some(step) => JsonlWriter::resume_fenced(&path, step, fence)?.0,
                None => fresh(&path)?.0,
            })
        } else {
            None
        };
        let text_log = if opts.text_log {
            let path = dir.join(TEXT_LOG_FILE);
            check(fence)?;
            Some(fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io_err("open", &path))?)
        } else {
            None
        };
        Ok(RunLog { dir, jsonl, events, fence: opts.fence.clone(), truncation, samples, text_log })
    }

    /// Appends sample rows (each a JSON object with its `step`) to `samples.jsonl`.
    pub fn log_samples(&mut self, rows: &[serde_json::Value]) -> Result<()> {
        let Some(w) = &mut self.samples else { return Ok(()) };
        if rows.is_empty() {
            return Ok(());
        }
        // One append for all rows, right after the check.
        let mut text = String::new();
        for r in rows {
            text.push_str(&r.to_string());
            text.push('\n');
        }
        check(self.fence.as_ref())?;
        w.append(text.as_bytes())
    }

    /// Appends a line to `log.txt`, stamped with the UTC time.
    pub fn note(&mut self, line: &str) -> Result<()> {
        let Some(f) = &mut self.text_log else { return Ok(()) };
        check(self.fence.as_ref())?;
        use std::io::Write;
        let path = self.dir.join(TEXT_LOG_FILE);
        writeln!(f, "{} {line}", utc_stamp(unix_time())).map_err(io_err("append to", &path))
    }

    /// What resuming did to `metrics.jsonl` (rows kept, rows set aside and where).
    pub fn truncation(&self) -> &Truncation {
        &self.truncation
    }

    /// Records `metrics` for `step`, timestamped now.
    pub fn log(&mut self, step: u64, metrics: &Metrics) -> Result<()> {
        self.log_at(step, unix_time(), metrics)
    }

    /// Records `metrics` for `step` with an explicit Unix `timestamp`.
    pub fn log_at(&mut self, step: u64, timestamp: f64, metrics: &Metrics) -> Result<()> {
        // Made first, whichever sinks are on: it rejects reserved names before anything is
        // written anywhere.
        let line = crate::jsonl::record_line(step, timestamp, metrics)? + "\n";
        if let Some(j) = &mut self.jsonl {
            check(self.fence.as_ref())?;
            j.append(line.as_bytes())?;
        }
        if let Some(e) = &mut self.events {
            check(self.fence.as_ref())?;
            e.write_scalars(step, timestamp, metrics)?;
        }
        Ok(())
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of `metrics.jsonl`, if written.
    pub fn jsonl_path(&self) -> Option<&Path> {
        self.jsonl.as_ref().map(JsonlWriter::path)
    }

    /// Path of this process's TensorBoard event file, if written.
    pub fn events_path(&self) -> Option<&Path> {
        self.events.as_ref().map(EventWriter::path)
    }
}

/// `2026-11-25T20:01:02Z` for a Unix time (civil date from days since the epoch, Howard
/// Hinnant's algorithm: no time-zone database needed for UTC).
pub fn utc_stamp(t: f64) -> String {
    let secs = t.max(0.0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod stamp_tests {
    #[test]
    fn utc_stamps() {
        assert_eq!(super::utc_stamp(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(super::utc_stamp(1_795_627_977.4), "2026-11-25T17:32:57Z");
        assert_eq!(super::utc_stamp(951_782_400.0), "2000-02-29T00:00:00Z");
    }
}
