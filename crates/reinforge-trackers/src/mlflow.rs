//! MLflow through its REST API (`/api/2.0/mlflow/...`): the experiment named by
//! `MLFLOW_EXPERIMENT_NAME` or the project, a run named after the experiment, the resolved
//! config as params, and every step's metrics in `runs/log-batch` requests.
//!
//! Hand-written rather than a client crate: the five calls are plain JSON, and the Rust MLflow
//! crates on crates.io are unmaintained. The server is reached with MLflow's own settings:
//! `MLFLOW_TRACKING_URI` (an `http://` server), and `MLFLOW_TRACKING_TOKEN` or
//! `MLFLOW_TRACKING_USERNAME` / `MLFLOW_TRACKING_PASSWORD` when it wants them.

use std::sync::mpsc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::{flatten, load_ids, millis, save_id, superseded, Ending, Msg, RunInfo, TrackerError};

/// MLflow's limits per `log-batch` request.
const MAX_METRICS: usize = 1000;
const MAX_PARAMS: usize = 100;
/// Longest param value current servers take (older ones: 500; longer values are cut).
const MAX_PARAM_CHARS: usize = 6000;

fn setup(msg: impl Into<String>) -> TrackerError {
    TrackerError::Setup { tracker: "mlflow", msg: msg.into() }
}

/// A connection to one MLflow run.
pub struct Run {
    base: String,
    agent: ureq::Agent,
    auth: Option<String>,
    /// The run's id (what `mlflow ui` shows).
    pub run_id: String,
    /// The experiment's id.
    pub experiment_id: String,
}

/// An MLflow error body: `{"error_code": "...", "message": "..."}`.
struct ApiError {
    status: u16,
    code: String,
    message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.code.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "HTTP {} {}: {}", self.status, self.code, self.message)
        }
    }
}

impl Run {
    /// Finds or creates the experiment, then continues this run directory's MLflow run (a
    /// resume) or creates one and logs the config as params.
    pub fn start(info: &RunInfo) -> Result<Self, TrackerError> {
        let uri = std::env::var("MLFLOW_TRACKING_URI").unwrap_or_default();
        let base = tracking_base(&uri)?;
        let auth = match (std::env::var("MLFLOW_TRACKING_TOKEN"), std::env::var("MLFLOW_TRACKING_USERNAME")) {
            (Ok(t), _) if !t.is_empty() => Some(format!("Bearer {t}")),
            (_, Ok(u)) if !u.is_empty() => {
                let p = std::env::var("MLFLOW_TRACKING_PASSWORD").unwrap_or_default();
                Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))))
            }
            _ => None,
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(15)))
            .http_status_as_error(false)
            .build()
            .into();
        let mut run = Run { base, agent, auth, run_id: String::new(), experiment_id: String::new() };
        let unreachable = |e: ApiError| {
            setup(format!(
                "cannot use the tracking server at {uri} (MLFLOW_TRACKING_URI): {e}; start one with `mlflow server --host 127.0.0.1 --port 5000` or fix the URI"
            ))
        };
        let experiment = std::env::var("MLFLOW_EXPERIMENT_NAME").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| info.project.clone());
        run.experiment_id = run.experiment(&experiment).map_err(unreachable)?;
        let earlier = load_ids(&info.dir).get("mlflow").and_then(Value::as_str).map(str::to_string);
        if let Some(id) = earlier {
            let same = run.get("runs/get", &[("run_id", &id)]).ok().is_some_and(|r| {
                r.pointer("/run/info/experiment_id").and_then(Value::as_str) == Some(run.experiment_id.as_str())
            });
            if same {
                run.run_id = id;
                run.post("runs/update", json!({"run_id": run.run_id, "status": "RUNNING"})).map_err(unreachable)?;
                eprintln!("mlflow: continuing run {} in experiment `{experiment}` at {uri}", run.run_id);
                return Ok(run);
            }
        }
        let created = run
            .post(
                "runs/create",
                json!({
                    "experiment_id": run.experiment_id,
                    "run_name": info.name,
                    "start_time": millis(reinforge_metrics::unix_time()),
                    "tags": [
                        {"key": "mlflow.runName", "value": info.name},
                        {"key": "mlflow.source.name", "value": "reinforge"},
                        {"key": "reinforge.run_dir", "value": info.dir.display().to_string()},
                    ],
                }),
            )
            .map_err(unreachable)?;
        run.run_id = created
            .pointer("/run/info/run_id")
            .and_then(Value::as_str)
            .ok_or_else(|| TrackerError::Failed { tracker: "mlflow", msg: format!("runs/create answered without a run id: {created}") })?
            .to_string();
        save_id(info, "mlflow", &run.run_id);
        let params: Vec<Value> = flatten(&info.config)
            .into_iter()
            .map(|(k, v)| json!({"key": k, "value": v.chars().take(MAX_PARAM_CHARS).collect::<String>()}))
            .collect();
        for chunk in params.chunks(MAX_PARAMS) {
            if let Err(e) = run.post("runs/log-batch", json!({"run_id": run.run_id, "params": chunk})) {
                tracing::warn!("mlflow: the config was not logged as params ({e}); metrics still are");
                break;
            }
        }
        eprintln!("mlflow: run {} in experiment `{experiment}` at {uri}", run.run_id);
        Ok(run)
    }

    /// The id of `name`, created when missing.
    fn experiment(&self, name: &str) -> Result<String, ApiError> {
        let id = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
        match self.get("experiments/get-by-name", &[("experiment_name", name)]) {
            Ok(v) => id(&v, "/experiment/experiment_id").ok_or(ApiError { status: 200, code: String::new(), message: format!("no experiment id in {v}") }),
            Err(e) if e.code == "RESOURCE_DOES_NOT_EXIST" => match self.post("experiments/create", json!({"name": name})) {
                Ok(v) => id(&v, "/experiment_id").ok_or(ApiError { status: 200, code: String::new(), message: format!("no experiment id in {v}") }),
                // Another run created it meanwhile.
                Err(e) if e.code == "RESOURCE_ALREADY_EXISTS" => {
                    let v = self.get("experiments/get-by-name", &[("experiment_name", name)])?;
                    id(&v, "/experiment/experiment_id").ok_or(e)
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, ApiError> {
        let mut req = self.agent.get(format!("{}/api/2.0/mlflow/{path}", self.base));
        for (k, v) in query {
            req = req.query(*k, *v);
        }
        if let Some(a) = &self.auth {
            req = req.header("authorization", a);
        }
        answer(req.call())
    }

    fn post(&self, path: &str, body: Value) -> Result<Value, ApiError> {
        let mut req = self.agent.post(format!("{}/api/2.0/mlflow/{path}", self.base)).header("content-type", "application/json");
        if let Some(a) = &self.auth {
            req = req.header("authorization", a);
        }
        answer(req.send(body.to_string()))
    }

    /// Sends metrics rows in as few requests as MLflow allows.
    fn log_rows(&self, rows: &[MetricRow]) -> Result<(), ApiError> {
        let metrics: Vec<Value> = rows
            .iter()
            .flat_map(|(step, t, vals)| vals.iter().map(move |(k, v)| json!({"key": metric_key(k), "value": v, "timestamp": millis(*t), "step": step})))
            .collect();
        for chunk in metrics.chunks(MAX_METRICS) {
            self.post("runs/log-batch", json!({"run_id": self.run_id, "metrics": chunk}))?;
        }
        Ok(())
    }
}

/// A metric name as MLflow takes it: letters, digits and `_ - . / : space`, no empty path
/// segment; `@` becomes `_at_` as verl's own MLflow logger writes it (`val/pass@4` →
/// `val/pass_at_4`). One bad key fails the whole batch on the server, so every key is cleaned.
pub fn metric_key(k: &str) -> String {
    let k = k.replace('@', "_at_");
    let cleaned: String = k.chars().map(|c| if c.is_ascii_alphanumeric() || "_-. /:".contains(c) { c } else { '_' }).collect();
    let parts: Vec<&str> = cleaned.split('/').filter(|p| !p.is_empty() && *p != "." && *p != "..").collect();
    if parts.is_empty() {
        "_".into()
    } else {
        parts.join("/")
    }
}

/// The REST base of a tracking URI, or why it cannot be used.
fn tracking_base(uri: &str) -> Result<String, TrackerError> {
    if uri.is_empty() {
        return Err(setup(
            "trainer.logger includes mlflow but MLFLOW_TRACKING_URI is not set: export MLFLOW_TRACKING_URI=http://HOST:5000 (a `mlflow server`)",
        ));
    }
    if let Some(rest) = uri.strip_prefix("http://") {
        if rest.is_empty() {
            return Err(setup(format!("MLFLOW_TRACKING_URI = `{uri}` names no host")));
        }
        return Ok(uri.trim_end_matches('/').to_string());
    }
    if uri.starts_with("https://") {
        return Err(setup(format!(
            "MLFLOW_TRACKING_URI = `{uri}`: this build speaks plain http only; reach the server over http (e.g. an SSH tunnel: ssh -L 5000:localhost:5000 HOST, then http://127.0.0.1:5000)"
        )));
    }
    Err(setup(format!(
        "MLFLOW_TRACKING_URI = `{uri}`: Reinforge logs to an MLflow tracking server over http; start one with `mlflow server --backend-store-uri {} --port 5000` and use http://HOST:5000",
        if uri.contains("://") { "sqlite:///mlflow.db".to_string() } else { format!("file:{uri}") }
    )))
}

fn answer(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<Value, ApiError> {
    let mut resp = r.map_err(|e| ApiError { status: 0, code: String::new(), message: e.to_string() })?;
    let status = resp.status().as_u16();
    let text = resp.body_mut().with_config().limit(16 << 20).read_to_string().unwrap_or_default();
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if (200..300).contains(&status) {
        return Ok(if v.is_null() { json!({}) } else { v });
    }
    let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let message = if field("message").is_empty() { text.chars().take(200).collect() } else { field("message") };
    Err(ApiError { status, code: field("error_code"), message })
}

/// A metrics row: step, seconds since the epoch, and the named values.
type MetricRow = (u64, f64, Vec<(String, f64)>);

/// The tracker's thread: batches rows as they come and sends them; marks the run ended, unless
/// this run lost its directory (then the new owner continues the MLflow run and ends it).
pub(crate) fn pump(run: Run, fence: reinforge_lease::Fence, rx: mpsc::Receiver<Msg>, done: mpsc::Sender<()>) {
    let mut pending: Vec<MetricRow> = Vec::new();
    let mut failing = false;
    let mut ending = None;
    while ending.is_none() {
        // Block for the next row, then take whatever else is queued: one request for many
        // steps when the server is slower than training.
        let Ok(first) = rx.recv() else { break };
        for msg in std::iter::once(first).chain(rx.try_iter()) {
            match msg {
                Msg::Row(step, t, vals) => pending.push((step, t, vals)),
                Msg::End(e) => ending = Some(e),
            }
        }
        if superseded(&fence) {
            return leave_to_new_owner(&run, pending.len(), done);
        }
        match run.log_rows(&pending) {
            Ok(()) => {
                if failing {
                    eprintln!("mlflow: reachable again; sent {} queued step(s)", pending.len());
                }
                failing = false;
                pending.clear();
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("mlflow: cannot log metrics ({e}); training goes on, rows are kept and sent when the server answers");
                }
                failing = true;
                // A server that rejects the rows themselves would reject them forever.
                if e.status == 400 {
                    tracing::warn!("mlflow: the server refused {} step(s) of metrics: dropped", pending.len());
                    pending.clear();
                }
                std::thread::sleep(Duration::from_secs(2));
            }
        }
    }
    if superseded(&fence) {
        return leave_to_new_owner(&run, pending.len(), done);
    }
    if !pending.is_empty() {
        if let Err(e) = run.log_rows(&pending) {
            tracing::warn!("mlflow: {} step(s) of metrics not sent at the end of the run: {e}", pending.len());
        }
    }
    let status = match ending {
        Some(Ending::Finished) => "FINISHED",
        _ => "FAILED",
    };
    let end = json!({"run_id": run.run_id, "status": status, "end_time": millis(reinforge_metrics::unix_time())});
    if let Err(e) = run.post("runs/update", end) {
        tracing::warn!("mlflow: cannot mark run {} {status}: {e}", run.run_id);
    }
    let _ = done.send(());
}

/// Stops sending for a run that lost its directory. Its queued rows are dropped: the new owner
/// resumed from a checkpoint and logs those steps again, as it does in `metrics.jsonl`.
fn leave_to_new_owner(run: &Run, queued: usize, done: mpsc::Sender<()>) {
    eprintln!(
        "mlflow: this run lost its directory to another, which continues MLflow run {}; not sending {queued} queued step(s) nor marking it ended",
        run.run_id
    );
    let _ = done.send(());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_keys_are_made_valid_for_mlflow() {
        assert_eq!(metric_key("critic/score/mean"), "critic/score/mean");
        assert_eq!(metric_key("val/openai/gsm8k/pass@4"), "val/openai/gsm8k/pass_at_4");
        assert_eq!(metric_key("/a//b/"), "a/b");
        assert_eq!(metric_key("x{y}"), "x_y_");
    }

    #[test]
    fn tracking_uris_that_cannot_work_are_one_line_each() {
        assert_eq!(tracking_base("http://127.0.0.1:5000/").unwrap(), "http://127.0.0.1:5000");
        let e = |u: &str| tracking_base(u).unwrap_err().to_string();
        assert!(e("").contains("MLFLOW_TRACKING_URI is not set"), "{}", e(""));
        assert!(e("https://x").contains("plain http only"));
        assert!(e("./mlruns").contains("file:./mlruns"), "{}", e("./mlruns"));
        assert!(e("databricks://x").contains("mlflow server"));
    }
}
