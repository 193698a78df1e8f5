//! Python reward functions, run as their authors wrote them: verl's
//! `compute_score(data_source, solution_str, ground_truth, extra_info)` (its
//! `custom_reward_function`) or OpenRLHF's `reward_func(queries, prompts, labels)` (its
//! `--remote_rm_url file.py`).
//!
//! The function lives in a Python process of its own, started when the reward is built (so a
//! file that does not import fails before training) and fed one batch per request over its
//! stdin/stdout as JSON lines (`python_host.py`). Its prints go to stderr, next to ours. A
//! function that raises, returns something that is not a number, or spends more than
//! `timeout_s` on one sample stops the run with the sample and the reason: verl lets such an
//! exception end its run too. The process has a process group of its own, so a terminal's
//! Ctrl-C reaches the trainer alone (which finishes its step), and stopping it stops whatever
//! it started too.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::types::check_batch_len;
use crate::{RewardError, RewardFn, RewardInput, RewardOutput};

/// The host script, compiled into the binary so nothing needs installing beside it.
const HOST: &str = include_str!("python_host.py");

/// Whose calling convention the function follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PythonStyle {
    /// verl: `f(data_source=, solution_str=, ground_truth=, extra_info=, **kwargs)` per sample,
    /// returning a number or a dict with `score` (its other numbers are logged).
    #[default]
    Verl,
    /// OpenRLHF: `f([prompt + response], [prompt], [label], **kwargs)` per sample, returning
    /// `{"rewards": …, "scores": …, "extra_logs": {…}}` (tensors or lists) or the rewards;
    /// `scores` becomes the detail `score` (what dynamic sampling's `score` metric reads).
    Openrlhf,
}

/// Parameters of [`PythonReward`] (`kind = "python"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonConfig {
    /// The `.py` file, or `pkg://package.module` to import an installed module.
    pub path: String,
    /// The function's name (default `compute_score`, or `reward_func` in OpenRLHF's style).
    #[serde(default)]
    pub function: Option<String>,
    /// The calling convention.
    #[serde(default)]
    pub style: PythonStyle,
    /// Keyword arguments added to every call (verl's `custom_reward_function.reward_kwargs`).
    #[serde(default)]
    pub kwargs: Map<String, Value>,
    /// The interpreter (default: `$REINFORGE_PYTHON`, else `python3`).
    #[serde(default)]
    pub python: Option<String>,
    /// Longest one sample (or the import at start) may take, in seconds.
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
}

fn default_timeout_s() -> f64 {
    300.0
}

impl PythonConfig {
    /// A config for `path` in verl's style with default settings.
    pub fn new(path: impl Into<String>) -> Self {
        PythonConfig { path: path.into(), function: None, style: PythonStyle::Verl, kwargs: Map::new(), python: None, timeout_s: default_timeout_s() }
    }

    fn function(&self) -> &str {
        match (&self.function, self.style) {
            (Some(f), _) => f,
            (None, PythonStyle::Verl) => "compute_score",
            (None, PythonStyle::Openrlhf) => "reward_func",
        }
    }
}

/// The Python process and the lines it writes.
struct Host {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<std::io::Result<String>>,
    /// Why the process was stopped, once it was: every later call fails with it at once.
    stopped: Option<String>,
    /// Whether the child was waited for: its pid (and group id) may be reused after that.
    reaped: bool,
}

impl Host {
    /// Stops the process and everything it started (its process group), reaps it, and says
    /// how it ended (for messages). `grace`: how long to let a process that is ending on its
    /// own (its stdout closed) finish, so that its own exit status is the one reported.
    fn stop(&mut self, grace: Duration) -> String {
        if self.reaped {
            return "stopped".into();
        }
        let pid = self.child.id() as libc::id_t;
        // Whether it exited by itself, looked at without reaping it: a reaped pid could be
        // reused, and the group id with it, before the kill below.
        let exited = || {
            // SAFETY: waitid with WNOWAIT only reads the child's state into `info`.
            unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) == 0 && info.si_pid() != 0
            }
        };
        let deadline = std::time::Instant::now() + grace;
        while !exited() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let own = exited();
        // SAFETY: killpg only sends a signal, to the group the child leads (process_group(0));
        // the child is not reaped yet, so its pid still names that group.
        unsafe {
            libc::killpg(pid as libc::pid_t, libc::SIGKILL);
        }
        self.reaped = true;
        let status = self.child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
        if own { status } else { "stopped by Reinforge".into() }
    }

    /// Stops the process (see [`Host::stop`]) and keeps why, made from how it ended: every
    /// later call fails with that at once. Returns it.
    fn give_up(&mut self, grace: Duration, why: impl FnOnce(String) -> String) -> String {
        let why = why(self.stop(grace));
        self.stopped = Some(why.clone());
        why
    }
}

/// Scores samples with a Python function in a process of its own (see the module docs).
pub struct PythonReward {
    cfg: PythonConfig,
    host: Mutex<Host>,
}

impl PythonReward {
    /// Starts the interpreter and imports the function; any failure to do so is the error.
    pub fn new(cfg: PythonConfig) -> Result<Self, RewardError> {
        let bad = |m: String| RewardError::config("python", m);
        if !(cfg.timeout_s.is_finite() && cfg.timeout_s > 0.0 && cfg.timeout_s <= 1e6) {
            return Err(bad(format!("timeout_s must be a number of seconds in (0, 1000000], got {}", cfg.timeout_s)));
        }
        if !cfg.path.starts_with("pkg://") && !Path::new(&cfg.path).is_file() {
            return Err(bad(format!("no file `{}` (reward.params.path: a .py file, or pkg://module)", cfg.path)));
        }
        let python = cfg.python.clone().or_else(|| std::env::var("REINFORGE_PYTHON").ok()).unwrap_or_else(|| "python3".into());
        let kwargs = Value::Object(cfg.kwargs.clone()).to_string();
        let style = match cfg.style {
            PythonStyle::Verl => "verl",
            PythonStyle::Openrlhf => "openrlhf",
        };
        let mut child = Command::new(&python)
            .args(["-u", "-c", HOST, &cfg.path, cfg.function(), style, &kwargs])
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| bad(format!("cannot start `{python}` ({e}): install Python 3, or name the interpreter with reward.params.python or REINFORGE_PYTHON")))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(bad("the interpreter's pipes could not be opened".into()));
        };
        // A reader thread, so that a function that never answers can be timed out.
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let reward = PythonReward { cfg, host: Mutex::new(Host { child, stdin, lines, stopped: None, reaped: false }) };
        {
            let mut host = reward.host.lock().map_err(|_| bad("poisoned".into()))?;
            let ready = reward.answer(&mut host, &[])?;
            if ready.get("ready") != Some(&Value::Bool(true)) {
                return Err(reward.error(format!("unexpected first line from the host: {}", Value::Object(ready))));
            }
        }
        Ok(reward)
    }

    fn error(&self, message: String) -> RewardError {
        RewardError::Python { path: self.cfg.path.clone(), message }
    }

    /// The host's next answer, as JSON, waiting at most `timeout_s` for each line (a
    /// `progress` line, one per sample scored, restarts the clock); its `error`, its death and
    /// its silence are errors.
    /// (Callers check `host.stopped` first.)
    fn answer(&self, host: &mut Host, batch: &[RewardInput]) -> Result<Map<String, Value>, RewardError> {
        let mut done = 0;
        loop {
            let line = match host.lines.recv_timeout(Duration::from_secs_f64(self.cfg.timeout_s)) {
                Ok(Ok(line)) => line,
                Ok(Err(e)) => return Err(self.error(host.give_up(Duration::ZERO, |_| format!("reading from the Python process: {e}")))),
                Err(RecvTimeoutError::Timeout) => {
                    let what = match batch.get(done) {
                        Some(s) => format!("`{}` took more than {}s on item {done} of the batch (data_source `{}`)", self.cfg.function(), self.cfg.timeout_s, s.data_source),
                        None => format!("no answer within {}s", self.cfg.timeout_s),
                    };
                    return Err(self.error(host.give_up(Duration::ZERO, |_| format!("{what}; the Python process was stopped (reward.params.timeout_s is per sample)"))));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Its helpers may outlive it: the group goes too.
                    return Err(self.error(host.give_up(Duration::from_millis(500), |status| format!("the Python process ended ({status}); its output is above"))));
                }
            };
            match serde_json::from_str::<Value>(&line) {
                Ok(Value::Object(mut o)) => match (o.remove("error"), o.contains_key("progress")) {
                    (Some(e), _) => return Err(self.error(e.as_str().map_or_else(|| e.to_string(), str::to_string))),
                    (None, true) => done += 1,
                    (None, false) => return Ok(o),
                },
                // The rest of this batch's lines would be read as the next batch's.
                _ => return Err(self.error(host.give_up(Duration::ZERO, |_| format!("unreadable line from the host: {line:.200}")))),
            }
        }
    }

    fn scores(&self, answer: Map<String, Value>, batch: &[RewardInput]) -> Result<Vec<RewardOutput>, RewardError> {
        let Some(Value::Array(items)) = answer.get("scores") else {
            return Err(self.error("the host's answer has no scores".into()));
        };
        items
            .iter()
            .zip(batch)
            .map(|(item, sample)| {
                let score = item.get("score").and_then(Value::as_f64).filter(|x| x.is_finite()).ok_or_else(|| {
                    self.error(format!("`{}` returned a score that is not a finite number for data_source `{}`: {}", self.cfg.function(), sample.data_source, item["score"]))
                })?;
                Ok(RewardOutput::new(score).with_json_details(item.get("details")))
            })
            .collect()
    }
}

impl RewardFn for PythonReward {
    fn name(&self) -> &str {
        "python"
    }

    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError> {
        let mut outs = self.score_batch(std::slice::from_ref(sample))?;
        check_batch_len("python", 1, &outs)?;
        Ok(outs.remove(0))
    }

    fn score_batch(&self, samples: &[RewardInput]) -> Result<Vec<RewardOutput>, RewardError> {
        if samples.is_empty() {
            return Ok(Vec::new());
        }
        let mut host = self.host.lock().map_err(|_| self.error("an earlier call panicked".into()))?;
        if let Some(why) = &host.stopped {
            return Err(self.error(why.clone()));
        }
        let request = serde_json::json!({ "items": samples }).to_string();
        if let Err(e) = writeln!(host.stdin, "{request}").and_then(|_| host.stdin.flush()) {
            return Err(self.error(host.give_up(Duration::from_millis(500), |status| format!("the Python process ended ({status}; {e}); its output is above"))));
        }
        let answer = self.answer(&mut host, samples)?;
        let outs = self.scores(answer, samples)?;
        check_batch_len("python", samples.len(), &outs)?;
        Ok(outs)
    }
}

impl Drop for PythonReward {
    fn drop(&mut self) {
        let host = self.host.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = host.stop(Duration::ZERO);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn file(dir: &Path, name: &str, src: &str) -> String {
        let p = dir.join(name);
        std::fs::write(&p, src).unwrap();
        p.display().to_string()
    }

    fn item(ds: &str, resp: &str, gt: Value) -> RewardInput {
        RewardInput::new(ds, resp, gt).with_prompt("Q: ").with_extra_info(json!({"index": 7}))
    }

    #[test]
    fn verl_style_numbers_dicts_kwargs_and_extra_info() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path(), "r.py", r#"
import asyncio
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    print("a print must not break the protocol")
    if data_source == "dict":
        return {"score": 0.5 + bonus, "acc": True, "pred": solution_str, "turns": extra_info["num_turns"]}
    if data_source == "bool":
        return solution_str.strip() == ground_truth
    return float(extra_info["index"]) + bonus
async def later(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(0)
    return len(solution_str)
"#);
        let mut cfg = PythonConfig::new(path.clone());
        cfg.kwargs.insert("bonus".into(), json!(1.0));
        let r = PythonReward::new(cfg).unwrap();
        let outs = r.score_batch(&[item("num", "x", json!("x")), item("dict", "x", json!("x")), item("bool", " 42 ", json!("42")), item("bool", "41", json!("42"))]).unwrap();
        assert_eq!(outs.iter().map(|o| o.score).collect::<Vec<_>>(), [8.0, 1.5, 1.0, 0.0]);
        assert_eq!((outs[1].detail("acc"), outs[1].detail("turns"), outs[1].detail("pred")), (Some(1.0), Some(2.0), None));
        // The process stays up between batches, and async functions are awaited.
        assert_eq!(r.score(&item("num", "x", json!(null))).unwrap().score, 8.0);
        let r = PythonReward::new(PythonConfig { function: Some("later".into()), ..PythonConfig::new(path) }).unwrap();
        assert_eq!(r.score(&item("a", "abcd", json!(null))).unwrap().score, 4.0);
    }

    #[test]
    fn openrlhf_style_takes_query_prompt_and_label() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path(), "rf.py", r#"
def reward_func(queries, prompts, labels, **kwargs):
    assert len(queries) == len(prompts) == len(labels) == 1
    ok = queries[0].startswith(prompts[0]) and queries[0][len(prompts[0]):].strip() == labels[0]
    r = [1.0 if ok else 0.0]
    return {"rewards": r, "scores": r, "extra_logs": {"query_len": [len(queries[0])], "label_is_list": [float(isinstance(labels[0], list))]}}
"#);
        let r = PythonReward::new(PythonConfig { style: PythonStyle::Openrlhf, ..PythonConfig::new(path) }).unwrap();
        // A label that is not text reaches the function as it is, as OpenRLHF passes it.
        let outs = r.score_batch(&[item("x", "42", json!("42")), item("x", "41", json!("42")), item("x", "[1, 2]", json!([1, 2]))]).unwrap();
        assert_eq!(outs.iter().map(|o| o.score).collect::<Vec<_>>(), [1.0, 0.0, 0.0]);
        assert_eq!((outs[0].detail("label_is_list"), outs[2].detail("label_is_list")), (Some(0.0), Some(1.0)));
        assert_eq!((outs[0].detail("score"), outs[0].detail("query_len")), (Some(1.0), Some(5.0)));
    }

    #[test]
    fn failures_are_one_line_errors_naming_the_cause() {
        let dir = tempfile::tempdir().unwrap();
        let e = |cfg: PythonConfig| PythonReward::new(cfg).err().expect("an error").to_string();
        assert!(e(PythonConfig::new(dir.path().join("none.py").display().to_string())).contains("no file"));
        let syntax = file(dir.path(), "bad.py", "def compute_score(:\n");
        assert!(e(PythonConfig::new(syntax)).contains("SyntaxError"));
        let other = file(dir.path(), "other.py", "def f(**k):\n    return 1\n");
        let msg = e(PythonConfig::new(other.clone()));
        assert!(msg.contains("compute_score") && msg.contains("AttributeError"), "{msg}");
        assert!(e(PythonConfig { python: Some("/nonexistent/python".into()), ..PythonConfig::new(other) }).contains("cannot start"));

        let path = file(dir.path(), "r.py", r#"
import subprocess, time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "raise":
        raise ValueError("no answer tag")
    if data_source == "lines":
        raise RuntimeError("first line\nsecond line")
    if data_source == "helper":
        with open(solution_str, "w") as f:
            f.write(str(subprocess.Popen(["sleep", "60"]).pid))
        time.sleep(30)
    if data_source == "text":
        return "high"
    if data_source == "nan":
        return float("nan")
    if data_source == "slow":
        time.sleep(30)
    if data_source == "nap":
        time.sleep(0.6)
    return 1
"#);
        let r = PythonReward::new(PythonConfig::new(path.clone())).unwrap();
        let err = r.score_batch(&[item("ok", "", json!(null)), item("raise", "", json!(null))]).unwrap_err().to_string();
        assert!(err.contains("item 1") && err.contains("'raise'") && err.contains("ValueError: no answer tag") && err.contains("r.py:"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        // The process serves the next batch after a function's exception.
        assert_eq!(r.score(&item("ok", "", json!(null))).unwrap().score, 1.0);
        let err = r.score(&item("lines", "", json!(null))).unwrap_err().to_string();
        assert!(err.contains("first line second line") && !err.contains('\n'), "{err}");
        assert!(r.score(&item("text", "", json!(null))).unwrap_err().to_string().contains("expected a number"));
        assert!(r.score(&item("nan", "", json!(null))).unwrap_err().to_string().contains("finite"));
        // The clock is per sample: three samples of 0.6 s pass a 1 s limit, and three quick
        // samples then a slow one name the slow one.
        let r = PythonReward::new(PythonConfig { timeout_s: 1.0, ..PythonConfig::new(path.clone()) }).unwrap();
        assert_eq!(r.score_batch(&[item("nap", "", json!(null)), item("nap", "", json!(null)), item("nap", "", json!(null))]).unwrap().len(), 3);
        let batch = [item("ok", "", json!(null)), item("ok", "", json!(null)), item("ok", "", json!(null)), item("slow", "", json!(null))];
        let err = r.score_batch(&batch).unwrap_err().to_string();
        assert!(err.contains("item 3") && err.contains("`slow`") && err.contains("timeout_s"), "{err}");
        assert!(r.score(&item("ok", "", json!(null))).unwrap_err().to_string().contains("was stopped"), "a stopped host stays an error");
        // What the function started goes with it.
        let pid_file = dir.path().join("helper.pid");
        let r = PythonReward::new(PythonConfig { timeout_s: 1.0, ..PythonConfig::new(path) }).unwrap();
        assert!(r.score(&item("helper", &pid_file.display().to_string(), json!(null))).is_err());
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(state.split_whitespace().nth(2).is_none_or(|s| s == "Z" || s == "X"), "the helper still runs: {state}");
    }
}
