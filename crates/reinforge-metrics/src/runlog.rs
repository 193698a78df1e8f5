//! [`RunLog`]: one run directory's `metrics.jsonl` and TensorBoard event file, kept in step.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{io_err, Result};
use crate::jsonl::{JsonlWriter, Truncation, METRICS_FILE};
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
}

impl Default for RunLogOptions {
    fn default() -> Self {
        RunLogOptions { jsonl: true, tensorboard: true, fence: None }
    }
}

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
        check(opts.fence.as_ref())?;
        let mut truncation = Truncation::default();
        let jsonl = if opts.jsonl {
            let path = dir.join(METRICS_FILE);
            Some(match resume_step {
                Some(step) => {
                    let (w, t) = JsonlWriter::resume(&path, step)?;
                    truncation = t;
                    w
                }
                None => {
                    truncation = crate::jsonl::supersede_all(&path)?;
                    JsonlWriter::create(&path)?
                }
            })
        } else {
            None
        };
        let events = if opts.tensorboard {
            // Each process writes its own event file, as TensorFlow does. The restart marker
            // tells TensorBoard to drop earlier files' data from this step on (all of it for
            // a new run), matching what was done to metrics.jsonl.
            let now = unix_time();
            let mut w = EventWriter::create(&dir, now)?;
            w.write_session_start(resume_step.map_or(0, |s| s.saturating_add(1)), now)?;
            Some(w)
        } else {
            None
        };
        Ok(RunLog { dir, jsonl, events, fence: opts.fence.clone(), truncation })
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
        check(self.fence.as_ref())?;
        // JSONL first: it rejects reserved names before anything is written anywhere.
        if let Some(j) = &mut self.jsonl {
            j.write(step, timestamp, metrics)?;
        }
        if let Some(e) = &mut self.events {
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

fn check(fence: Option<&reinforge_lease::Fence>) -> Result<()> {
    Ok(fence.map_or(Ok(()), reinforge_lease::Fence::check)?)
}
