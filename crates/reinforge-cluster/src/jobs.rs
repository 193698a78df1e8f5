//! A client of the Ray dashboard's REST API: the Jobs API (`/api/jobs/`, `/api/packages/`),
//! the auth-mode probe and the state API used by status. Every request carries the cluster
//! token (`Authorization: Bearer …`) and a timeout, so nothing hangs.

use crate::error::{ClusterError, Result};
use crate::token::Token;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The dashboard port Ray uses unless told otherwise.
pub const DEFAULT_DASHBOARD_PORT: u16 = 8265;

/// Per-request timeout: the dashboard answers in milliseconds; a silent one is a dead one.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Uploads get longer: up to 100 MiB over a slow link.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// Submitting and stopping wait for Ray's job agent, which is slow on a busy head.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest body the dashboard accepts (`DASHBOARD_CLIENT_MAX_SIZE` in Ray).
pub const MAX_PACKAGE_BYTES: usize = 100 * 1024 * 1024;

/// Largest response body read (job logs can be long).
const MAX_RESPONSE_BYTES: u64 = 256 * 1024 * 1024;

/// Ray's prefix for content-addressed packages.
const RAY_PKG_PREFIX: &str = "_ray_pkg_";

/// Whether the cluster's control endpoints require a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMode {
    /// `RAY_AUTH_MODE=token`.
    Token,
    /// Auth off.
    Disabled,
    /// A Ray older than token auth (< 2.52: no `/api/authentication_mode`): runs without it.
    Unavailable,
    /// An answer this version of Reinforge does not know.
    Unknown(String),
}

impl AuthMode {
    /// Whether anyone who reaches the cluster's ports can use it.
    pub fn is_open(&self) -> bool {
        matches!(self, AuthMode::Disabled | AuthMode::Unavailable)
    }
}

/// `REINFORGE_NO_AUTH=1`: the explicit opt-out for clusters without token auth, for every
/// command at once (what `--no-auth` / `--allow-no-auth` say for one).
pub fn no_auth_from_env() -> bool {
    std::env::var("REINFORGE_NO_AUTH").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A Ray dashboard (the head's HTTP endpoint) and the token to talk to it.
#[derive(Clone)]
pub struct Dashboard {
    url: String,
    token: Option<Token>,
    agent: ureq::Agent,
    control_agent: ureq::Agent,
    upload_agent: ureq::Agent,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("url", &self.url)
            .field("token", &self.token)
            .finish()
    }
}

/// Normalises a dashboard address: `http(s)://…` as is, `HOST:PORT` → `http://HOST:PORT`,
/// `HOST` → `http://HOST:8265`; without one, `RAY_API_SERVER_ADDRESS`, then `RAY_ADDRESS` if it
/// is an http(s) URL, else `http://127.0.0.1:8265`.
pub fn dashboard_url(
    address: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String> {
    let chosen = match address.map(str::trim).filter(|a| !a.is_empty()) {
        Some(a) => a.to_string(),
        None => env("RAY_API_SERVER_ADDRESS")
            .filter(|a| !a.trim().is_empty())
            .or_else(|| {
                env("RAY_ADDRESS").filter(|a| a.starts_with("http://") || a.starts_with("https://"))
            })
            .unwrap_or_else(|| format!("http://127.0.0.1:{DEFAULT_DASHBOARD_PORT}")),
    };
    let chosen = chosen.trim().to_string();
    // Trailing slashes go, but not the ones of a bare scheme ("http://" has no host).
    let chosen = match chosen.strip_prefix("http://") {
        Some(rest) => format!("http://{}", rest.trim_end_matches('/')),
        None => chosen.trim_end_matches('/').to_string(),
    };
    if chosen.starts_with("https://") {
        return Err(ClusterError::usage(format!(
            "--address {chosen}: this build speaks plain http only (no TLS); use http://HEAD:8265 or an SSH tunnel"
        )));
    }
    let url = if chosen.starts_with("http://") {
        chosen
    } else if chosen.contains("://") {
        return Err(ClusterError::usage(format!(
            "--address {chosen} is not a dashboard URL; pass http://HEAD:8265"
        )));
    } else if chosen
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.contains(':') && p.parse::<u16>().is_ok())
        || chosen.starts_with('[') && chosen.contains("]:")
    {
        format!("http://{chosen}")
    } else {
        format!("http://{chosen}:{DEFAULT_DASHBOARD_PORT}")
    };
    let rest = url.trim_start_matches("http://");
    if rest.is_empty() || rest.starts_with(':') || rest.starts_with('/') {
        return Err(ClusterError::usage(format!(
            "--address {url} has no host; pass http://HEAD:8265"
        )));
    }
    Ok(url)
}

/// The dashboard URL and token for an address (see [`dashboard_url`]; token from `--token`,
/// `RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH`, `~/.ray/auth_token`), ready to use.
pub fn connect(address: Option<&str>, explicit_token: Option<&str>) -> Result<Dashboard> {
    let url = dashboard_url(address, &|k| std::env::var(k).ok())?;
    let token = crate::token::load(explicit_token)?;
    Ok(Dashboard::new(&url, token))
}

/// How a request went wrong before any HTTP status.
fn transport_detail(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(_) => "no answer in time".to_string(),
        ureq::Error::HostNotFound => "host not found".to_string(),
        ureq::Error::ConnectionFailed => "connection refused".to_string(),
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused".to_string()
        }
        other => other.to_string(),
    }
}

/// The last meaningful line of an error body (Ray sends Python tracebacks).
fn body_line(body: &str) -> String {
    // Ray answers an unexpected failure with a Python traceback (sometimes one wrapped in
    // another, ending in a lone "."): the line that says what went wrong is its last
    // `…Error: …` line, not its last line.
    let from_last = || body.lines().rev().map(str::trim);
    let exception = from_last().find(|l| {
        l.split_once(": ").is_some_and(|(kind, _)| !kind.contains(' ') && (kind.ends_with("Error") || kind.ends_with("Exception")))
    });
    let l = exception.or_else(|| from_last().find(|l| l.chars().any(char::is_alphanumeric))).unwrap_or("(empty body)");
    let mut s: String = l.chars().take(300).collect();
    if l.chars().count() > 300 {
        s.push('…');
    }
    s
}

/// Percent-encodes one URL path segment (job ids are user-chosen).
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn make_agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .timeout_connect(Some(Duration::from_secs(5)))
        // 4xx/5xx bodies are read and turned into one-line errors here.
        .http_status_as_error(false)
        .build()
        .into()
}

impl Dashboard {
    /// A client of the dashboard at `url` (already normalised, e.g. by [`dashboard_url`]).
    pub fn new(url: &str, token: Option<Token>) -> Dashboard {
        Dashboard {
            url: url.trim_end_matches('/').to_string(),
            token,
            agent: make_agent(REQUEST_TIMEOUT),
            control_agent: make_agent(CONTROL_TIMEOUT),
            upload_agent: make_agent(UPLOAD_TIMEOUT),
        }
    }

    /// The dashboard's base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The token sent with requests, if any.
    pub fn token(&self) -> Option<&Token> {
        self.token.as_ref()
    }

    /// One request; returns status and body, or a transport error turned into `NoDashboard`.
    fn send(&self, method: &str, path: &str, body: Option<Body<'_>>) -> Result<(u16, String)> {
        let url = format!("{}{}", self.url, path);
        let auth = self.token.as_ref().map(|t| format!("Bearer {}", t.value));
        let res = match (method, body) {
            ("GET", _) => {
                let mut r = self.agent.get(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
            ("PUT", Some(Body::Bytes(b))) => {
                let mut r = self
                    .upload_agent
                    .put(&url)
                    .header("Content-Type", "application/octet-stream");
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send(b)
            }
            ("POST", b) => {
                let mut r = self
                    .control_agent
                    .post(&url)
                    .header("Content-Type", "application/json");
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                match b {
                    Some(Body::Json(v)) => r.send(v.to_string()),
                    _ => r.send_empty(),
                }
            }
            _ => {
                return Err(ClusterError::Http {
                    method: method.into(),
                    url,
                    detail: "unsupported request".into(),
                });
            }
        };
        let mut resp = res.map_err(|e| ClusterError::NoDashboard {
            url: self.url.clone(),
            detail: transport_detail(&e),
        })?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(MAX_RESPONSE_BYTES)
            .read_to_string()
            .map_err(|e| ClusterError::NoDashboard {
                url: self.url.clone(),
                detail: format!(
                    "reading the answer to {method} {path}: {}",
                    transport_detail(&e)
                ),
            })?;
        tracing::debug!(method, %url, status, "dashboard request");
        Ok((status, text))
    }

    /// Maps auth failures and other non-2xx statuses to one-line errors.
    fn check(&self, method: &str, path: &str, status: u16, body: &str) -> Result<()> {
        match status {
            200..=299 => Ok(()),
            401 => Err(ClusterError::Unauthorized {
                url: self.url.clone(),
            }),
            403 => Err(ClusterError::TokenRejected {
                url: self.url.clone(),
                source_desc: self
                    .token
                    .as_ref()
                    .map(|t| t.source.to_string())
                    .unwrap_or_else(|| "nowhere".into()),
            }),
            _ => Err(self.http_error(method, path, format!("HTTP {status}: {}", body_line(body)))),
        }
    }

    /// An unexpected answer from `method` on `path`.
    fn http_error(&self, method: &str, path: &str, detail: String) -> ClusterError {
        ClusterError::Http { method: method.into(), url: format!("{}{}", self.url, path), detail }
    }

    fn json(&self, method: &str, path: &str, body: Option<Body<'_>>) -> Result<Value> {
        let (status, text) = self.send(method, path, body)?;
        self.check(method, path, status, &text)?;
        serde_json::from_str(&text).map_err(|e| {
            let detail = format!("the answer is not JSON ({e}); is this a Ray {} dashboard?", crate::ray::pinned_version());
            self.http_error(method, path, detail)
        })
    }

    /// `GET /api/authentication_mode` (public even with auth on).
    pub fn auth_mode(&self) -> Result<AuthMode> {
        let (status, text) = self.send("GET", "/api/authentication_mode", None)?;
        if status == 404 {
            return Ok(AuthMode::Unavailable);
        }
        self.check("GET", "/api/authentication_mode", status, &text)?;
        let v: Value = serde_json::from_str(&text).map_err(|_| ClusterError::NoDashboard {
            url: self.url.clone(),
            detail: format!(
                "something answers but not a Ray dashboard: {}",
                body_line(&text)
            ),
        })?;
        Ok(match v.get("authentication_mode").and_then(Value::as_str) {
            Some("token") => AuthMode::Token,
            Some("disabled") => AuthMode::Disabled,
            Some(other) => AuthMode::Unknown(other.to_string()),
            None => AuthMode::Unknown(text.chars().take(100).collect()),
        })
    }

    /// Refuses a cluster without token auth unless `allow_no_auth` (DESIGN §5), and one that
    /// needs a token when none is available. Returns the mode.
    pub fn ensure_auth(&self, allow_no_auth: bool) -> Result<AuthMode> {
        let mode = self.auth_mode()?;
        let allow_no_auth = allow_no_auth || no_auth_from_env();
        match &mode {
            AuthMode::Disabled if !allow_no_auth => {
                return Err(ClusterError::AuthDisabled {
                    what: "the Ray cluster".into(),
                    url: self.url.clone(),
                    flag: "--allow-no-auth (or REINFORGE_NO_AUTH=1)".into(),
                })
            }
            AuthMode::Unavailable if !allow_no_auth => {
                return Err(ClusterError::AuthDisabled {
                    what: "the Ray cluster (a Ray older than 2.52, which has no token auth)".into(),
                    url: self.url.clone(),
                    flag: "--allow-no-auth (or REINFORGE_NO_AUTH=1)".into(),
                })
            }
            AuthMode::Unknown(why) => {
                tracing::warn!(url = %self.url, %why, "cannot tell whether the cluster requires a token")
            }
            _ => {}
        }
        Ok(mode)
    }

    /// `GET /api/version`: Ray's version and session (needs the token when auth is on).
    pub fn version(&self) -> Result<Value> {
        self.json("GET", "/api/version", None)
    }

    /// `GET` of any dashboard path as JSON (state API etc.).
    pub fn get_json(&self, path: &str) -> Result<Value> {
        self.json("GET", path, None)
    }

    /// The state API's list under `path` (e.g. `/api/v0/nodes`): `data.result.result`.
    pub fn state_list(&self, path: &str) -> Result<Vec<Value>> {
        let v = self.get_json(path)?;
        let list = v
            .pointer("/data/result/result")
            .and_then(Value::as_array)
            .cloned();
        list.ok_or_else(|| self.http_error("GET", path, format!("unexpected answer: {}", body_line(&v.to_string()))))
    }

    /// Zips `dir` like Ray does (see [`package_dir`]), uploads it unless the head already has
    /// it, and returns the `gcs://…` URI for `runtime_env.working_dir`.
    pub fn upload_working_dir(&self, dir: &Path) -> Result<String> {
        let pkg = package_dir(dir)?;
        let path = format!("/api/packages/gcs/{}", pkg.name);
        let (status, text) = self.send("GET", &path, None)?;
        match status {
            200 => tracing::debug!(package = %pkg.name, "working dir already on the cluster"),
            404 => {
                tracing::debug!(package = %pkg.name, bytes = pkg.bytes.len(), files = pkg.files, "uploading working dir");
                let (status, text) = self.send("PUT", &path, Some(Body::Bytes(&pkg.bytes)))?;
                self.check("PUT", &path, status, &text)?;
            }
            _ => self.check("GET", &path, status, &text)?,
        }
        Ok(format!("gcs://{}", pkg.name))
    }

    /// Submits a job; returns its submission id.
    pub fn submit_job(&self, spec: &JobSpec) -> Result<String> {
        let mut runtime_env = serde_json::Map::new();
        if let Some(dir) = &spec.working_dir {
            runtime_env.insert(
                "working_dir".into(),
                Value::String(self.upload_working_dir(dir)?),
            );
        }
        if !spec.env_vars.is_empty() {
            runtime_env.insert(
                "env_vars".into(),
                serde_json::to_value(&spec.env_vars).unwrap_or_default(),
            );
        }
        let mut body = serde_json::Map::new();
        body.insert("entrypoint".into(), Value::String(spec.entrypoint.clone()));
        if let Some(id) = &spec.submission_id {
            body.insert("submission_id".into(), Value::String(id.clone()));
        }
        if !runtime_env.is_empty() {
            body.insert("runtime_env".into(), Value::Object(runtime_env));
        }
        let v = self.json("POST", "/api/jobs/", Some(Body::Json(&Value::Object(body))))?;
        v.get("submission_id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| self.http_error("POST", "/api/jobs/", format!("no submission_id in the answer: {}", body_line(&v.to_string()))))
    }

    /// A job's request on `path` with 404 mapped to "no such job".
    fn job_request(&self, method: &str, id: &str, suffix: &str) -> Result<Value> {
        let path = format!("/api/jobs/{}{suffix}", encode_segment(id));
        let (status, text) = self.send(method, &path, None)?;
        if status == 404 {
            return Err(ClusterError::JobNotFound {
                id: id.to_string(),
                url: self.url.clone(),
            });
        }
        self.check(method, &path, status, &text)?;
        serde_json::from_str(&text).map_err(|e| self.http_error(method, &path, format!("the answer is not JSON: {e}")))
    }

    /// All jobs the cluster knows (submitted ones and plain drivers).
    pub fn list_jobs(&self) -> Result<Vec<JobInfo>> {
        let v = self.json("GET", "/api/jobs/", None)?;
        serde_json::from_value(v).map_err(|e| self.http_error("GET", "/api/jobs/", format!("unexpected job list: {e}")))
    }

    /// One job by submission id (or job id).
    pub fn job(&self, id: &str) -> Result<JobInfo> {
        let v = self.job_request("GET", id, "")?;
        serde_json::from_value(v).map_err(|e| self.http_error("GET", &format!("/api/jobs/{id}"), format!("unexpected job info: {e}")))
    }

    /// A job's whole log so far.
    pub fn job_logs(&self, id: &str) -> Result<String> {
        let v = self.job_request("GET", id, "/logs")?;
        Ok(v.get("logs")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string())
    }

    /// Asks the cluster to stop a job; `true` if it was running.
    pub fn stop_job(&self, id: &str) -> Result<bool> {
        let v = self.job_request("POST", id, "/stop")?;
        Ok(v.get("stopped").and_then(Value::as_bool).unwrap_or(false))
    }

    /// Polls a job's logs and writes only the new bytes to `out` until the job is in a terminal
    /// state; returns its final info. `on_status` sees each status change (for progress lines).
    pub fn follow_logs(
        &self,
        id: &str,
        out: &mut dyn Write,
        poll: Duration,
        on_status: &mut dyn FnMut(&JobInfo),
    ) -> Result<JobInfo> {
        let mut printed: usize = 0;
        let mut last_status = String::new();
        loop {
            // Status first, then logs: a terminal status seen before the last log read means
            // that read holds the complete log.
            let info = self.job(id)?;
            if info.status != last_status {
                last_status = info.status.clone();
                on_status(&info);
            }
            let logs = self.job_logs(id)?;
            let bytes = logs.as_bytes();
            if bytes.len() < printed {
                // The log was truncated or rotated: print it again from the start.
                printed = 0;
            }
            if bytes.len() > printed {
                let _ = out.write_all(&bytes[printed..]);
                let _ = out.flush();
                printed = bytes.len();
            }
            if info.is_terminal() {
                return Ok(info);
            }
            std::thread::sleep(poll);
        }
    }

    /// Waits (bounded) until a job reaches a terminal state.
    pub fn wait_terminal(&self, id: &str, limit: Duration) -> Result<JobInfo> {
        let start = Instant::now();
        loop {
            let info = self.job(id)?;
            if info.is_terminal() {
                return Ok(info);
            }
            if start.elapsed() >= limit {
                return Err(ClusterError::Timeout(format!(
                    "job {id} on {} is still {} after {} s; check it with `reinforge job status {id}`",
                    self.url,
                    info.status,
                    limit.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// A request body.
enum Body<'a> {
    Json(&'a Value),
    Bytes(&'a [u8]),
}

/// What to submit.
#[derive(Debug, Clone, Default)]
pub struct JobSpec {
    /// The shell command line the job runs (see [`entrypoint_from_args`]).
    pub entrypoint: String,
    /// A chosen submission id; Ray makes one if absent.
    pub submission_id: Option<String>,
    /// `runtime_env.env_vars`.
    pub env_vars: BTreeMap<String, String>,
    /// A local directory uploaded as `runtime_env.working_dir`.
    pub working_dir: Option<PathBuf>,
}

/// A job as the Jobs API reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobInfo {
    /// "SUBMISSION" or "DRIVER".
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// The Ray job id (set once the driver runs).
    #[serde(default)]
    pub job_id: Option<String>,
    /// The submission id (submitted jobs only).
    #[serde(default)]
    pub submission_id: Option<String>,
    /// PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED.
    pub status: String,
    /// The command line.
    #[serde(default)]
    pub entrypoint: Option<String>,
    /// Ray's explanation of the status.
    #[serde(default)]
    pub message: Option<String>,
    /// Start time, ms since the epoch.
    #[serde(default)]
    pub start_time: Option<u64>,
    /// End time, ms since the epoch.
    #[serde(default)]
    pub end_time: Option<u64>,
    /// The entrypoint's exit code, once known.
    #[serde(default)]
    pub driver_exit_code: Option<i64>,
}

impl JobInfo {
    /// The id to show: the submission id, else the job id.
    pub fn id(&self) -> &str {
        self.submission_id
            .as_deref()
            .or(self.job_id.as_deref())
            .unwrap_or("?")
    }

    /// STOPPED, SUCCEEDED and FAILED never change again.
    pub fn is_terminal(&self) -> bool {
        matches!(self.status.as_str(), "STOPPED" | "SUCCEEDED" | "FAILED")
    }
}

/// Quotes one argument for a POSIX shell: unchanged when it has only safe characters, else in
/// single quotes (a `'` becomes `'\''`).
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=+/.,:@%^".contains(c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The entrypoint from the words after `--`: one word is taken verbatim as a shell command line
/// (so `-- 'python a.py && python b.py'` works), several are quoted one by one so each reaches
/// the program as it was typed.
pub fn entrypoint_from_args(args: &[String]) -> String {
    match args {
        [one] => one.clone(),
        many => many
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// The submission id of the Ray job this process runs in, if any. Ray's job supervisor hands
/// the entrypoint its job config as JSON in `RAY_JOB_CONFIG_JSON_ENV_VAR`, with the id under
/// `metadata.job_submission_id`.
pub fn current_job_id() -> Option<String> {
    job_id_from_config(&std::env::var("RAY_JOB_CONFIG_JSON_ENV_VAR").ok()?)
}

fn job_id_from_config(json: &str) -> Option<String> {
    let v: Value = serde_json::from_str(json).ok()?;
    v.get("metadata")?.get("job_submission_id")?.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

/// A zipped working directory.
#[derive(Debug, Clone)]
pub struct Package {
    /// `_ray_pkg_<hash>.zip`, Ray's content-addressed name.
    pub name: String,
    /// The zip file.
    pub bytes: Vec<u8>,
    /// Number of files in it.
    pub files: usize,
}

/// Whether a path (relative to the working dir, `/`-separated) is left out of the package:
/// any `.git` directory, and a top-level `target/` (Cargo builds; huge and useless remotely).
pub fn excluded(rel: &str) -> bool {
    rel == "target" || rel.split('/').any(|c| c == ".git")
}

/// One visited path of the working dir.
struct Entry {
    rel: String,
    path: PathBuf,
    is_dir: bool,
}

/// Walks `dir` like Ray's `_dir_travel` (the root itself first as "."), skipping [`excluded`]
/// paths, following symlinks but never looping.
fn walk(dir: &Path) -> Result<Vec<Entry>> {
    let mut out = vec![Entry {
        rel: ".".into(),
        path: dir.to_path_buf(),
        is_dir: true,
    }];
    let mut stack = vec![(
        dir.to_path_buf(),
        String::new(),
        vec![std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())],
    )];
    while let Some((d, prefix, ancestors)) = stack.pop() {
        let rd =
            std::fs::read_dir(&d).map_err(|e| ClusterError::io("cannot read directory", &d, e))?;
        let mut children: Vec<_> = rd.filter_map(|e| e.ok()).collect();
        children.sort_by_key(|e| e.file_name());
        for c in children {
            let name = c.file_name().to_string_lossy().into_owned();
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            if excluded(&rel) {
                continue;
            }
            let path = c.path();
            let meta = match std::fs::metadata(&path) {
                Ok(m) => m,
                Err(_) => continue, // a dangling symlink: Ray skips what it cannot stat, too
            };
            if meta.is_dir() {
                let canon = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
                if ancestors.contains(&canon) {
                    tracing::warn!(path = %path.display(), "skipping a symlink loop in the working dir");
                    continue;
                }
                let mut anc = ancestors.clone();
                anc.push(canon);
                out.push(Entry {
                    rel: rel.clone(),
                    path: path.clone(),
                    is_dir: true,
                });
                stack.push((path, rel, anc));
            } else {
                out.push(Entry {
                    rel,
                    path,
                    is_dir: false,
                });
            }
        }
    }
    Ok(out)
}

/// Ray's package hash (`packaging._hash_directory`): start from eight ASCII '0' bytes and XOR in
/// sha1(relative path [+ file content]) for every visited path; Python's `zip` truncates the XOR
/// to 8 bytes, so the name has 16 hex digits.
fn ray_hash(entries: &[Entry]) -> Result<[u8; 8]> {
    use sha1::{Digest, Sha1};
    let mut acc = [b'0'; 8];
    for e in entries {
        let mut h = Sha1::new();
        h.update(e.rel.as_bytes());
        if !e.is_dir {
            match std::fs::File::open(&e.path) {
                Ok(mut f) => {
                    std::io::copy(&mut f, &mut h)
                        .map_err(|err| ClusterError::io("cannot read", &e.path, err))?;
                }
                // Ray hashes only the name of a file it cannot open; so do we.
                Err(err) => tracing::debug!(path = %e.path.display(), %err, "hashing name only"),
            }
        }
        let d = h.finalize();
        for (a, b) in acc.iter_mut().zip(d.iter()) {
            *a ^= b;
        }
    }
    Ok(acc)
}

/// Zips a working directory the way Ray's `_zip_files` does (files and empty directories,
/// paths relative to `dir`, unix modes kept) and names it `_ray_pkg_<hash>.zip`.
pub fn package_dir(dir: &Path) -> Result<Package> {
    use zip::write::FileOptions;
    let meta = std::fs::metadata(dir)
        .map_err(|e| ClusterError::io("--working-dir: cannot open", dir, e))?;
    if !meta.is_dir() {
        return Err(ClusterError::usage(format!(
            "--working-dir {} is not a directory; pass a directory",
            dir.display()
        )));
    }
    let entries = walk(dir)?;
    let hash = ray_hash(&entries)?;
    let name = format!(
        "{RAY_PKG_PREFIX}{}.zip",
        hash.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );

    let zip_err = |e: zip::result::ZipError| {
        ClusterError::usage(format!("cannot zip the working dir {}: {e}", dir.display()))
    };
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let mut files = 0usize;
    let mut total: u64 = 0;
    for e in entries.iter().skip(1) {
        #[cfg(unix)]
        let mode = {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(&e.path)
                .map(|m| m.permissions().mode() & 0o7777)
                .unwrap_or(0o644)
        };
        #[cfg(not(unix))]
        let mode = 0o644;
        let opts = FileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(mode);
        if e.is_dir {
            let empty = std::fs::read_dir(&e.path)
                .map(|mut r| r.next().is_none())
                .unwrap_or(false);
            if empty {
                w.add_directory(format!("{}/", e.rel), opts)
                    .map_err(zip_err)?;
            }
            continue;
        }
        let mut f = std::fs::File::open(&e.path)
            .map_err(|err| ClusterError::io("cannot read", &e.path, err))?;
        w.start_file(e.rel.clone(), opts).map_err(zip_err)?;
        total += std::io::copy(&mut f, &mut w)
            .map_err(|err| ClusterError::io("cannot zip", &e.path, err))?;
        files += 1;
        if total as usize > 4 * MAX_PACKAGE_BYTES {
            return Err(too_big(dir, total as usize));
        }
    }
    let bytes = w.finish().map_err(zip_err)?.into_inner();
    if bytes.len() > MAX_PACKAGE_BYTES {
        return Err(too_big(dir, bytes.len()));
    }
    Ok(Package { name, bytes, files })
}

fn too_big(dir: &Path, n: usize) -> ClusterError {
    ClusterError::usage(format!(
        "--working-dir {} is {} MiB (zipped), over the {} MiB Ray accepts for an upload; move data and checkpoints out of it (.git and target/ are already left out) or put them on shared storage",
        dir.display(),
        n / (1024 * 1024),
        MAX_PACKAGE_BYTES / (1024 * 1024)
    ))
}

/// Parses `--env K=V`.
pub fn parse_env_pair(s: &str) -> Result<(String, String)> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !k.contains(char::is_whitespace) => {
            Ok((k.to_string(), v.to_string()))
        }
        _ => Err(ClusterError::usage(format!(
            "--env {s:?} is not KEY=VALUE; write e.g. --env HF_HOME=/data/hf"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_says_its_exception() {
        // What Ray 2.60 answers to a submission id that exists (HTTP 500).
        let body = "Traceback (most recent call last):\n  File \"job_head.py\", line 419, in submit_job\n    resp = await x\nRuntimeError: Request failed with status code 400: Traceback (most recent call last):\n  File \"job_manager.py\", line 553, in submit_job\n    raise ValueError(\nValueError: Job with submission_id rf-train-5 already exists. Please use a different submission_id.\n.\n";
        assert_eq!(body_line(body), "ValueError: Job with submission_id rf-train-5 already exists. Please use a different submission_id.");
        assert_eq!(body_line("not found\n"), "not found");
        assert_eq!(body_line("\n"), "(empty body)");
    }

    #[test]
    fn job_id_from_the_supervisors_config() {
        let cfg = r#"{"runtime_env": {"env_vars": {}}, "metadata": {"job_submission_id": "rf-train-2", "job_name": "rf-train-2"}}"#;
        assert_eq!(job_id_from_config(cfg).as_deref(), Some("rf-train-2"));
        assert_eq!(job_id_from_config(r#"{"metadata": {}}"#), None);
        assert_eq!(job_id_from_config("not json"), None);
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("echo"), "echo");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
        assert_eq!(shell_quote("trainer.nnodes=2"), "trainer.nnodes=2");
        let args: Vec<String> = ["reinforge", "train", "cfg.toml", "x=a b", "--name", "it's"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            entrypoint_from_args(&args),
            r"reinforge train cfg.toml 'x=a b' --name 'it'\''s'"
        );
        assert_eq!(
            entrypoint_from_args(&["echo a && echo b".to_string()]),
            "echo a && echo b"
        );
        assert_eq!(entrypoint_from_args(&[]), "");
    }

    #[test]
    fn quoting_roundtrips_through_sh() {
        let args: Vec<String> = [
            "printf",
            "%s|",
            "a b",
            "it's",
            "$HOME",
            "\"q\"",
            "",
            "back\\slash",
            "new\nline",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(entrypoint_from_args(&args))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "a b|it's|$HOME|\"q\"||back\\slash|new\nline|"
        );
    }

    #[test]
    fn urls() {
        let none = |_: &str| None;
        assert_eq!(dashboard_url(None, &none).unwrap(), "http://127.0.0.1:8265");
        assert_eq!(
            dashboard_url(Some("http://h:9000/"), &none).unwrap(),
            "http://h:9000"
        );
        assert_eq!(
            dashboard_url(Some("h:9000"), &none).unwrap(),
            "http://h:9000"
        );
        assert_eq!(
            dashboard_url(Some("10.0.0.2"), &none).unwrap(),
            "http://10.0.0.2:8265"
        );
        assert_eq!(
            dashboard_url(Some("[fd00::1]:9000"), &none).unwrap(),
            "http://[fd00::1]:9000"
        );
        let ray_addr = |k: &str| (k == "RAY_ADDRESS").then(|| "http://r:1".to_string());
        assert_eq!(dashboard_url(None, &ray_addr).unwrap(), "http://r:1");
        let gcs_addr = |k: &str| (k == "RAY_ADDRESS").then(|| "10.0.0.1:6379".to_string());
        assert_eq!(
            dashboard_url(None, &gcs_addr).unwrap(),
            "http://127.0.0.1:8265",
            "a GCS address is not a dashboard"
        );
        let api = |k: &str| (k == "RAY_API_SERVER_ADDRESS").then(|| "http://a:2".to_string());
        assert_eq!(dashboard_url(None, &api).unwrap(), "http://a:2");
        assert!(dashboard_url(Some("https://h"), &none)
            .unwrap_err()
            .to_string()
            .contains("plain http"));
        assert!(dashboard_url(Some("ftp://h"), &none).is_err());
        assert!(dashboard_url(Some("http://"), &none).is_err());
    }

    #[test]
    fn env_pairs() {
        assert_eq!(parse_env_pair("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert_eq!(parse_env_pair("A=").unwrap(), ("A".into(), "".into()));
        assert!(parse_env_pair("A").is_err());
        assert!(parse_env_pair("=x").is_err());
    }

    #[test]
    fn segments() {
        assert_eq!(encode_segment("raysubmit_AbC-1.2"), "raysubmit_AbC-1.2");
        assert_eq!(encode_segment("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn excludes() {
        assert!(excluded(".git"));
        assert!(excluded("sub/.git"));
        assert!(excluded("sub/.git/HEAD"));
        assert!(excluded("target"));
        assert!(!excluded("data/target"));
        assert!(!excluded("my.gitignore"));
    }

    /// The package name must equal what Ray's own `get_uri_for_directory` computes; the expected
    /// value was produced by Ray 2.60.0's packaging.py on this exact tree.
    #[test]
    fn package_name_matches_ray() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("a.txt"), "hello\n").unwrap();
        std::fs::create_dir_all(d.join("sub/deeper")).unwrap();
        std::fs::write(d.join("sub/b.bin"), [0u8, 1, 2, 255]).unwrap();
        std::fs::create_dir_all(d.join("empty")).unwrap();
        let pkg = package_dir(d).unwrap();
        assert_eq!(pkg.name, "_ray_pkg_62de8ff5a0e2976b.zip");
        assert_eq!(pkg.files, 2);
        // Excluded paths change neither the name nor the contents.
        std::fs::create_dir_all(d.join(".git/objects")).unwrap();
        std::fs::write(d.join(".git/HEAD"), "ref").unwrap();
        std::fs::create_dir_all(d.join("target/debug")).unwrap();
        std::fs::write(d.join("target/debug/big"), "x").unwrap();
        let again = package_dir(d).unwrap();
        assert_eq!(again.name, pkg.name);
        let mut z = zip::ZipArchive::new(std::io::Cursor::new(again.bytes)).unwrap();
        let mut names: Vec<String> = (0..z.len())
            .map(|i| z.by_index(i).unwrap().name().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["a.txt", "empty/", "sub/b.bin", "sub/deeper/"]);
        let mut s = String::new();
        std::io::Read::read_to_string(&mut z.by_name("a.txt").unwrap(), &mut s).unwrap();
        assert_eq!(s, "hello\n");
        // Content changes the name.
        std::fs::write(d.join("a.txt"), "hello!\n").unwrap();
        assert_ne!(package_dir(d).unwrap().name, pkg.name);
    }

    #[test]
    fn package_errors() {
        let e = package_dir(Path::new("/nonexistent/wd"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--working-dir") && e.contains("/nonexistent/wd"),
            "{e}"
        );
    }
}
