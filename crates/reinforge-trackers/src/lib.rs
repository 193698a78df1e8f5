//! Experiment trackers a run reports to besides its own files (`metrics.jsonl`, TensorBoard):
//!
//! - [`mlflow`]: an MLflow tracking server through its REST API (experiment, run, the resolved
//!   config as params, batched metrics), `MLFLOW_TRACKING_URI` as MLflow's clients read it;
//! - [`wandb`]: Weights & Biases through the official `wandb` Python package, in a sidecar
//!   process fed one JSON line per step (W&B has no stable public REST API for logging; its
//!   own client also honours `WANDB_MODE`, `WANDB_API_KEY`, `WANDB_BASE_URL`).
//!
//! Both are checked when the run starts (a missing package, key or server is one line then),
//! and neither can slow training: rows go through a queue to a thread of their own, and a
//! tracker that fails mid-run warns once and is dropped while training goes on. The tracker
//! runs belong to whoever owns the run directory: a run that lost it to another (which
//! continues the same tracker runs from `trackers.json`) sends nothing more and leaves their
//! status to the new owner. Metric names
//! stay verl's (`critic/score/mean`), so dashboards built for verl keep working.
//!
//! Dependencies: `ureq` (HTTP), `serde_json`, `reinforge-metrics` (the [`Metrics`] rows),
//! `reinforge-lease` (`trackers.json` is written only while the run owns its directory).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod mlflow;
pub mod wandb;

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use reinforge_metrics::Metrics;

/// A tracker that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum TrackerError {
    /// Not configured (an environment variable, a URI).
    #[error("{tracker}: {msg}")]
    Setup {
        /// `mlflow` or `wandb`.
        tracker: &'static str,
        /// What is missing and how to fix it.
        msg: String,
    },
    /// The server or package answered with an error.
    #[error("{tracker}: {msg}")]
    Failed {
        /// `mlflow` or `wandb`.
        tracker: &'static str,
        /// What it said.
        msg: String,
    },
}

/// What every tracker is told about the run.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// verl's `trainer.project_name`: the W&B project, the MLflow experiment.
    pub project: String,
    /// verl's `trainer.experiment_name`: the run's name in either.
    pub name: String,
    /// The run directory (W&B's files go under it; tracker ids are kept in it for resumes).
    pub dir: PathBuf,
    /// The resolved config.
    pub config: serde_json::Value,
    /// The run directory's lease: `trackers.json` is written only while the run holds it.
    pub fence: reinforge_lease::Fence,
}

/// How a run ended, as trackers record it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Every step done (or stopped cleanly by Ctrl-C).
    Finished,
    /// Stopped by an error. A run that lost its directory ends neither way: the tracker
    /// threads see the lost lease themselves and leave the tracker runs to the new owner.
    Failed,
}

/// The trackers of one run.
#[derive(Default)]
pub struct Trackers {
    sinks: Vec<Sink>,
}

/// One tracker's queue to its thread.
struct Sink {
    name: &'static str,
    tx: mpsc::Sender<Msg>,
    done: mpsc::Receiver<()>,
}

enum Msg {
    Row(u64, f64, Vec<(String, f64)>),
    End(Ending),
}

impl Trackers {
    /// Starts the trackers named in `loggers` (others are ignored); a tracker that cannot
    /// start is an error before any step runs.
    pub fn start(loggers: &[String], info: &RunInfo) -> Result<Self, TrackerError> {
        let mut t = Trackers::default();
        for l in loggers {
            match l.as_str() {
                "mlflow" => {
                    let client = mlflow::Run::start(info)?;
                    let fence = info.fence.clone();
                    t.sinks.push(spawn("mlflow", move |rx, done| mlflow::pump(client, fence, rx, done)));
                }
                "wandb" => {
                    let side = wandb::Sidecar::start(info)?;
                    let fence = info.fence.clone();
                    t.sinks.push(spawn("wandb", move |rx, done| wandb::pump(side, fence, rx, done)));
                }
                _ => {}
            }
        }
        Ok(t)
    }

    /// Whether any tracker runs.
    pub fn is_empty(&self) -> bool {
        self.sinks.is_empty()
    }

    /// Queues one step's metrics for every tracker; never blocks.
    pub fn log(&self, step: u64, timestamp: f64, m: &Metrics) {
        let row: Vec<(String, f64)> = m.iter().filter(|(_, v)| v.is_finite()).map(|(k, v)| (k.to_string(), v)).collect();
        for s in &self.sinks {
            // A tracker that stopped has warned already.
            let _ = s.tx.send(Msg::Row(step, timestamp, row.clone()));
        }
    }

    /// Marks the run ended and waits up to `wait` for every tracker to send what it holds.
    pub fn finish(self, ending: Ending, wait: Duration) {
        for s in &self.sinks {
            let _ = s.tx.send(Msg::End(ending));
        }
        let until = std::time::Instant::now() + wait;
        for s in self.sinks {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if s.done.recv_timeout(left).is_err() {
                tracing::warn!("{}: still sending after {:.0}s at the end of the run; not waiting longer", s.name, wait.as_secs_f64());
            }
        }
    }
}

fn spawn(name: &'static str, f: impl FnOnce(mpsc::Receiver<Msg>, mpsc::Sender<()>) + Send + 'static) -> Sink {
    let (tx, rx) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("tracker-{name}"))
        .spawn(move || f(rx, done_tx))
        .map(|_| ())
        .unwrap_or_else(|e| tracing::warn!("{name}: cannot start its thread ({e}); not logging to it"));
    Sink { name, tx, done }
}

/// Whether this run lost its directory to another run, which now owns the tracker runs too.
/// Asked before each send: a paused process that wakes up after a takeover must not log its
/// queued rows into the run the new owner continues. A check that cannot read the lease
/// (an I/O error) is not a loss: the rows go out.
fn superseded(fence: &reinforge_lease::Fence) -> bool {
    matches!(fence.check(), Err(reinforge_lease::LeaseError::Lost { .. }))
}

/// The config flattened to dotted keys (`actor.lr`), as trackers show params.
pub fn flatten(v: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    walk(&key, x, out);
                }
            }
            serde_json::Value::Null => {}
            serde_json::Value::String(s) => out.push((prefix.to_string(), s.clone())),
            other => out.push((prefix.to_string(), other.to_string())),
        }
    }
    let mut out = Vec::new();
    walk("", v, &mut out);
    out
}

/// Milliseconds since the Unix epoch for a timestamp in seconds.
fn millis(t: f64) -> i64 {
    (t * 1000.0).round() as i64
}

/// Reads `<run dir>/trackers.json` (ids of earlier attempts' tracker runs).
fn load_ids(dir: &std::path::Path) -> serde_json::Map<String, serde_json::Value> {
    std::fs::read_to_string(dir.join(IDS_FILE))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default()
}

/// Records `tracker`'s run id in `<run dir>/trackers.json`, so a resumed run continues it.
fn save_id(info: &RunInfo, tracker: &str, id: &str) {
    let dir = &info.dir;
    let mut ids = load_ids(dir);
    ids.insert(tracker.into(), serde_json::Value::String(id.into()));
    let body = serde_json::Value::Object(ids).to_string();
    let path = dir.join(IDS_FILE);
    // Checked after the tracker's network call, right before the rename.
    if let Err(e) = info.fence.publish(&path, body.as_bytes()) {
        tracing::warn!("{tracker}: cannot record the run id in {} ({e}); a resumed run starts a new {tracker} run", dir.display());
    }
}

/// Where tracker run ids are kept in the run directory.
pub const IDS_FILE: &str = "trackers.json";
