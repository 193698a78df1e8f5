//! `metrics.jsonl`: one JSON object per step, `{"step": N, "timestamp": T, "<name>": value, ...}`.
//!
//! Each line goes to the file in a single unbuffered `write` in append mode, so a reader
//! (`tail -f`, pandas) sees whole lines, and a crash loses at most the line being written.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{io_err, MetricsError, Result};
use crate::metrics::Metrics;
use reinforge_lease::Fence;

/// File name of the JSONL log inside a run directory.
pub const METRICS_FILE: &str = "metrics.jsonl";

/// Suffix of the file that keeps the rows a resume removed from the log (`metrics.jsonl.superseded`).
pub const SUPERSEDED_SUFFIX: &str = ".superseded";

/// Keys every record has; metrics may not use them.
pub const RESERVED_KEYS: [&str; 2] = ["step", "timestamp"];

/// Appends one JSON line per step to a file.
#[derive(Debug)]
pub struct JsonlWriter {
    path: PathBuf,
    file: File,
}

/// What [`truncate_after`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Truncation {
    /// Lines kept (step ≤ the resumed step).
    pub kept: usize,
    /// Lines dropped: later steps, plus unparsable or partial lines.
    pub dropped: usize,
    /// Where the dropped lines were kept (appended, verbatim), when there were any.
    pub superseded: Option<PathBuf>,
}

impl JsonlWriter {
    /// Starts a fresh log at `path`, emptying any existing file.
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::create(&path).map_err(io_err("create", &path))?;
        Ok(JsonlWriter { path, file })
    }

    /// Continues the log at `path` after resuming from `step`: lines with a larger step are
    /// removed (they belong to the run's abandoned future), then new lines are appended.
    pub fn resume(path: impl AsRef<Path>, step: u64) -> Result<(Self, Truncation)> {
        Self::resume_fenced(path, step, None)
    }

    /// [`resume`](Self::resume) in a run directory owned through `fence`: see [`keep_only`].
    pub(crate) fn resume_fenced(path: impl AsRef<Path>, step: u64, fence: Option<&Fence>) -> Result<(Self, Truncation)> {
        let path = path.as_ref().to_path_buf();
        let truncation = keep_only(&path, Some(step), fence)?;
        check(fence)?;
        let file = OpenOptions::new().create(true).append(true).open(&path).map_err(io_err("open", &path))?;
        Ok((JsonlWriter { path, file }, truncation))
    }

    /// Appends whole lines (each ending in a newline) in one `write`.
    pub fn append(&mut self, lines: &[u8]) -> Result<()> {
        self.file.write_all(lines).map_err(io_err("append to", &self.path))
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The JSON text (without newline) of one record. Non-finite values become `null`, since JSON
/// has no NaN or infinity.
pub fn record_line(step: u64, timestamp: f64, metrics: &Metrics) -> Result<String> {
    let mut obj = serde_json::Map::new();
    obj.insert("step".into(), step.into());
    obj.insert("timestamp".into(), json_number(timestamp));
    for (name, value) in metrics.iter() {
        if RESERVED_KEYS.contains(&name) {
            return Err(MetricsError::ReservedName { name: name.to_string() });
        }
        obj.insert(name.to_string(), json_number(value));
    }
    Ok(serde_json::Value::Object(obj).to_string())
}

fn json_number(v: f64) -> serde_json::Value {
    serde_json::Number::from_f64(v).map(serde_json::Value::Number).unwrap_or(serde_json::Value::Null)
}

/// Rewrites the JSONL file at `path` keeping only records with `step <= step`, atomically
/// (temporary file, fsync, rename). Unparsable lines and a partial last line (a crash mid-write)
/// are dropped too. Nothing is lost: dropped lines are first appended to
/// `<path>.superseded`. A missing file is left missing.
pub fn truncate_after(path: &Path, step: u64) -> Result<Truncation> {
    keep_only(path, Some(step), None)
}

/// Empties the JSONL file at `path` for a new run, appending its rows to `<path>.superseded`
/// first. A missing file is left missing.
pub fn supersede_all(path: &Path) -> Result<Truncation> {
    keep_only(path, None, None)
}

/// `Ok` while `fence` (if any) says this process owns the run directory.
pub(crate) fn check(fence: Option<&Fence>) -> Result<()> {
    Ok(fence.map_or(Ok(()), Fence::check)?)
}

/// Keeps the records with `step <= keep_through` (none when `None`) and sets the rest aside.
/// With a `fence`, ownership is checked right before the append to `.superseded` and right
/// before the rename, each after the slow part it follows (reading, fsync): a process paused
/// there must not replace the log of the run that took its directory meanwhile.
pub(crate) fn keep_only(path: &Path, keep_through: Option<u64>, fence: Option<&Fence>) -> Result<Truncation> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Truncation::default()),
        Err(e) => return Err(io_err("read", path)(e)),
    };
    let mut kept = Vec::with_capacity(bytes.len());
    let mut dropped = Vec::new();
    let mut t = Truncation::default();
    let mut rest: &[u8] = &bytes;
    while !rest.is_empty() {
        let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
            tracing::warn!(path = %path.display(), "dropping a partial last line (the previous run stopped mid-write)");
            t.dropped += 1;
            dropped.extend_from_slice(rest);
            dropped.push(b'\n');
            break;
        };
        let line = &rest[..nl];
        rest = &rest[nl + 1..];
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let line_step = serde_json::from_slice::<serde_json::Value>(line).ok().and_then(|v| v.get("step")?.as_u64());
        if line_step.is_none() {
            tracing::warn!(path = %path.display(), "dropping a line that is not a JSON record with a step");
        }
        let keep = line_step.zip(keep_through).is_some_and(|(s, k)| s <= k);
        let (to, count) = if keep { (&mut kept, &mut t.kept) } else { (&mut dropped, &mut t.dropped) };
        to.extend_from_slice(line);
        to.push(b'\n');
        *count += 1;
    }
    if t.dropped == 0 {
        return Ok(t);
    }
    // Set aside before removing: a crash in between leaves the rows in both files, never in none.
    let aside = superseded_path(path);
    check(fence)?;
    (|| {
        let mut f = OpenOptions::new().create(true).append(true).open(&aside).map_err(io_err("open", &aside))?;
        f.write_all(&dropped).map_err(io_err("append to", &aside))?;
        f.sync_all().map_err(io_err("fsync", &aside))
    })()?;
    t.superseded = Some(aside);
    // A `.tmp-` name, which readers of the run directory know to skip.
    let name = path.file_name().map_or("metrics.jsonl".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".tmp-{name}-{}", std::process::id()));
    let written = (|| {
        let mut f = File::create(&tmp).map_err(io_err("create", &tmp))?;
        f.write_all(&kept).map_err(io_err("write", &tmp))?;
        f.sync_all().map_err(io_err("fsync", &tmp))?;
        check(fence)?;
        fs::rename(&tmp, path).map_err(io_err("replace", path))
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    Ok(t)
}

/// `<path>.superseded`: where [`truncate_after`] keeps the rows it removes.
pub fn superseded_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(SUPERSEDED_SUFFIX);
    PathBuf::from(name)
}
