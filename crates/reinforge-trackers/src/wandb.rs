//! Weights & Biases through the official `wandb` package: a small Python sidecar
//! (`wandb_sidecar.py`, compiled into the binary) that `wandb.init`s the run and `wandb.log`s
//! each step the trainer writes to its stdin.
//!
//! W&B's settings are the package's own: `WANDB_MODE=offline` writes the run under
//! `<run dir>/wandb/` for a later `wandb sync`, `WANDB_API_KEY` / `wandb login` for online
//! runs, `WANDB_BASE_URL` for a self-hosted server, `WANDB_ENTITY`. The Python is
//! `REINFORGE_PYTHON`, else `python3` on the PATH.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::{load_ids, save_id, superseded, Ending, Msg, RunInfo, TrackerError};

const SCRIPT: &str = include_str!("wandb_sidecar.py");

/// How long `wandb.init` may take before the run starts without waiting further (online
/// init talks to the server).
const START_TIMEOUT: Duration = Duration::from_secs(120);

fn setup(msg: impl Into<String>) -> TrackerError {
    TrackerError::Setup { tracker: "wandb", msg: msg.into() }
}

/// The running sidecar.
pub struct Sidecar {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The W&B run id.
    pub run_id: String,
}

/// The Python that runs the sidecar.
pub fn python() -> String {
    std::env::var("REINFORGE_PYTHON").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into())
}

impl Sidecar {
    /// Starts the sidecar and waits for `wandb.init` (package, key and server checked there).
    pub fn start(info: &RunInfo) -> Result<Self, TrackerError> {
        let py = python();
        let mut child = Command::new(&py)
            .args(["-u", "-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| setup(format!("cannot run `{py}` ({e}): install Python with `pip install wandb`, or set REINFORGE_PYTHON to one")))?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(setup("the sidecar's pipes did not open"));
        };
        let resume_id = load_ids(&info.dir).get("wandb").and_then(Value::as_str).map(str::to_string);
        let start = json!({
            "project": info.project,
            "name": info.name,
            "dir": info.dir.display().to_string(),
            "config": info.config,
            "resume_id": resume_id,
        });
        if let Err(e) = writeln!(stdin, "{start}") {
            let _ = child.kill();
            return Err(setup(format!("cannot talk to `{py}` ({e})")));
        }
        // Its stdout is read on a thread so a hung `wandb.init` cannot hang the run's start.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = match rx.recv_timeout(START_TIMEOUT) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                return Err(setup(format!(
                    "wandb.init did not answer in {}s (is WANDB_BASE_URL reachable?); WANDB_MODE=offline logs locally",
                    START_TIMEOUT.as_secs()
                )));
            }
        };
        let line = line.trim();
        if let Some(id) = line.strip_prefix("READY ") {
            save_id(info, "wandb", id);
            eprintln!("wandb: run {id} in project `{}`{}", info.project, match std::env::var("WANDB_MODE").as_deref() {
                Ok("offline") => format!(" (offline, under {}/wandb)", info.dir.display()),
                _ => String::new(),
            });
            return Ok(Sidecar { child, stdin: Some(stdin), run_id: id.to_string() });
        }
        let _ = child.wait();
        match line.strip_prefix("ERROR ") {
            Some(why) => Err(setup(why.to_string())),
            None => Err(setup(format!("the sidecar (`{py}`) exited before wandb.init answered; its messages are above"))),
        }
    }

    fn send(&mut self, v: &Value) -> std::io::Result<()> {
        match &mut self.stdin {
            Some(s) => writeln!(s, "{v}"),
            None => Err(std::io::Error::other("closed")),
        }
    }
}

/// The tracker's thread: one line per step to the sidecar, then the end and its exit. A run
/// that lost its directory sends no more steps and ends as `superseded` (see the sidecar).
pub(crate) fn pump(mut side: Sidecar, fence: reinforge_lease::Fence, rx: mpsc::Receiver<Msg>, done: mpsc::Sender<()>) {
    let mut broken = false;
    let mut ending = Some(Ending::Failed);
    for msg in rx.iter() {
        match msg {
            Msg::Row(step, _, vals) => {
                if broken {
                    continue;
                }
                if superseded(&fence) {
                    ending = None;
                    break;
                }
                let metrics: serde_json::Map<String, Value> = vals.into_iter().map(|(k, v)| (k, json!(v))).collect();
                if let Err(e) = side.send(&json!({"step": step, "metrics": metrics})) {
                    tracing::warn!("wandb: the sidecar stopped taking metrics ({e}); training goes on without W&B");
                    broken = true;
                }
            }
            Msg::End(e) => {
                ending = Some(e);
                break;
            }
        }
    }
    if ending.is_some() && superseded(&fence) {
        ending = None;
    }
    let end = match ending {
        Some(Ending::Finished) => "finished",
        Some(Ending::Failed) => "failed",
        None => {
            eprintln!("wandb: this run lost its directory to another, which continues W&B run {}; sending no more steps", side.run_id);
            "superseded"
        }
    };
    let _ = side.send(&json!({ "end": end }));
    side.stdin = None;
    match side.child.wait() {
        Ok(s) if s.success() => {}
        Ok(s) => tracing::warn!("wandb: the sidecar ended with {s}"),
        Err(e) => tracing::warn!("wandb: waiting for the sidecar: {e}"),
    }
    let _ = done.send(());
}
