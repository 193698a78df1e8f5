//! Remote reward: POST a batch of samples to an HTTP scorer.
//!
//! For verifiers that cannot live in-process (code sandboxes, LLM judges,
//! Python reward functions). Blocking HTTP via `ureq`, one request per batch
//! (or per `batch_size` chunk).
//!
//! # Wire format
//!
//! Request (`POST url`, `Content-Type: application/json`):
//!
//! ```json
//! {"items": [{"data_source": "openai/gsm8k", "prompt": "...", "response": "...",
//!             "ground_truth": "72", "extra_info": {"index": 0}}]}
//! ```
//!
//! Response (HTTP 200), one entry per item, in order, in any of these forms:
//!
//! ```json
//! {"scores": [1.0, 0.0]}
//! {"scores": [{"score": 1.0, "details": {"format": 1.0}}, {"score": 0.0}]}
//! [1.0, 0.0]
//! ```
//!
//! Only numeric `details` values are kept; other fields are ignored. A
//! missing, non-numeric or non-finite score is an error, as is a length
//! mismatch.
//!
//! With `protocol = "openrlhf"` the server is one written for OpenRLHF's
//! `--remote_rm_url`: the request is `{"query": [prompt + response, ...],
//! "prompts": [...], "labels": [...]}` (a label is the ground truth as the row
//! holds it, `""` without one) and the answer `{"rewards": [...]}`, with
//! optional `"scores"` (kept as the detail `score`, which dynamic sampling reads) and
//! `"extra_logs": {"name": [...]}` kept as details.
//!
//! # Failure handling
//!
//! Connection errors, timeouts and HTTP 408/429/5xx are retried up to
//! `max_tries` requests in total, sleeping `backoff_ms * 2^(k-1)` (capped at
//! `max_backoff_ms`) before retry `k`; then [`RewardError::RemoteUnreachable`].
//! Other HTTP errors and malformed bodies fail at once with
//! [`RewardError::RemoteProtocol`]: repeating a request the server rejected
//! will not help.
//!
//! Plain `http://` only unless the workspace enables a TLS feature of `ureq`;
//! reward servers normally run on localhost or the cluster network.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::types::check_batch_len;
use crate::{RewardError, RewardFn, RewardInput, RewardOutput};

/// Parameters of [`RemoteReward`] (`kind = "remote"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// Endpoint, e.g. `http://127.0.0.1:8000/score`.
    pub url: String,
    /// Limit for one whole request (connect, send, receive), in seconds.
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    /// Total requests per batch before giving up (1 = no retry).
    #[serde(default = "default_max_tries")]
    pub max_tries: u32,
    /// First backoff, doubled per retry.
    #[serde(default = "default_backoff_ms")]
    pub backoff_ms: u64,
    /// Backoff ceiling.
    #[serde(default = "default_max_backoff_ms")]
    pub max_backoff_ms: u64,
    /// Items per request; 0 sends each batch in one request.
    #[serde(default)]
    pub batch_size: usize,
    /// Name in metrics and errors (default `remote`), to tell several remotes apart.
    #[serde(default)]
    pub name: Option<String>,
    /// The wire format: ours (`reinforge`) or OpenRLHF's reward-server protocol (`openrlhf`).
    #[serde(default)]
    pub protocol: RemoteProtocol,
}

/// Which request and answer shapes a remote scorer speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteProtocol {
    /// `{"items": [...]}` → `{"scores": [...]}` (the module docs).
    #[default]
    Reinforge,
    /// OpenRLHF's: `{"query", "prompts", "labels"}` → `{"rewards", "scores", "extra_logs"}`.
    Openrlhf,
}

fn default_timeout_s() -> f64 {
    60.0
}
fn default_max_tries() -> u32 {
    3
}
fn default_backoff_ms() -> u64 {
    500
}
fn default_max_backoff_ms() -> u64 {
    8000
}

impl RemoteConfig {
    /// A config for `url` with default timeout and retries.
    pub fn new(url: impl Into<String>) -> Self {
        RemoteConfig {
            url: url.into(),
            timeout_s: default_timeout_s(),
            max_tries: default_max_tries(),
            backoff_ms: default_backoff_ms(),
            max_backoff_ms: default_max_backoff_ms(),
            batch_size: 0,
            name: None,
            protocol: RemoteProtocol::Reinforge,
        }
    }
}

/// Upper bound on retries so a config typo cannot stall training for hours.
const MAX_TRIES_LIMIT: u32 = 20;
/// Upper bound on a response body; scores for any sane batch are far smaller.
const MAX_RESPONSE_BYTES: u64 = 64 << 20;

/// Scores batches by POSTing them to an HTTP endpoint (see the module docs for the protocol).
pub struct RemoteReward {
    cfg: RemoteConfig,
    name: String,
    agent: ureq::Agent,
}

enum Failure {
    /// Worth another try (transport error, timeout, 5xx/429/408).
    Retry(String),
    /// The request cannot be made at all (e.g. TLS missing); retrying will not help.
    Unreachable(String),
    /// Trying again would give the same answer.
    Fatal(RewardError),
}

impl RemoteReward {
    /// Validates the config and builds the HTTP client (no request is made yet).
    pub fn new(cfg: RemoteConfig) -> Result<Self, RewardError> {
        let bad = |m: String| Err(RewardError::config("remote", m));
        match cfg.url.parse::<ureq::http::Uri>() {
            Ok(u)
                if matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some() => {}
            _ => {
                return bad(format!(
                    "reward.remote.url `{}` is not an http(s) URL",
                    cfg.url
                ))
            }
        }
        if !(cfg.timeout_s.is_finite() && cfg.timeout_s > 0.0 && cfg.timeout_s <= 86_400.0) {
            return bad(format!(
                "timeout_s must be in (0, 86400], got {}",
                cfg.timeout_s
            ));
        }
        if cfg.max_tries == 0 || cfg.max_tries > MAX_TRIES_LIMIT {
            return bad(format!(
                "max_tries must be in 1..={MAX_TRIES_LIMIT}, got {}",
                cfg.max_tries
            ));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs_f64(cfg.timeout_s)))
            // Read 4xx/5xx bodies ourselves, to classify them and quote them in errors.
            .http_status_as_error(false)
            .build()
            .into();
        let name = cfg.name.clone().unwrap_or_else(|| "remote".to_string());
        Ok(RemoteReward { cfg, name, agent })
    }

    fn backoff(&self, retry: u32) -> Duration {
        let factor = 1u64 << retry.saturating_sub(1).min(30);
        Duration::from_millis(
            self.cfg
                .backoff_ms
                .saturating_mul(factor)
                .min(self.cfg.max_backoff_ms),
        )
    }

    fn protocol(&self, message: impl Into<String>) -> RewardError {
        RewardError::RemoteProtocol {
            url: self.cfg.url.clone(),
            message: message.into(),
        }
    }

    /// One request for one chunk, with retries.
    fn post(&self, items: &[RewardInput]) -> Result<Vec<RewardOutput>, RewardError> {
        #[derive(Serialize)]
        struct Request<'a> {
            items: &'a [RewardInput],
        }
        // Serialised once, reused by every retry.
        let body = match self.cfg.protocol {
            RemoteProtocol::Reinforge => serde_json::to_string(&Request { items }),
            RemoteProtocol::Openrlhf => {
                // OpenRLHF sends `data[label_key]` as it is; "" for a row without one.
                let label = |gt: &Value| match gt {
                    Value::Null => Value::String(String::new()),
                    other => other.clone(),
                };
                serde_json::to_string(&serde_json::json!({
                    "query": items.iter().map(|i| format!("{}{}", i.prompt, i.response)).collect::<Vec<_>>(),
                    "prompts": items.iter().map(|i| i.prompt.as_str()).collect::<Vec<_>>(),
                    "labels": items.iter().map(|i| label(&i.ground_truth)).collect::<Vec<_>>(),
                }))
            }
        }
        .map_err(|e| self.protocol(format!("could not encode request: {e}")))?;
        let mut last_error = String::new();
        for attempt in 1..=self.cfg.max_tries {
            if attempt > 1 {
                std::thread::sleep(self.backoff(attempt - 1));
            }
            match self.try_once(&body, items.len()) {
                Ok(outs) => return Ok(outs),
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Unreachable(msg)) => {
                    return Err(RewardError::RemoteUnreachable {
                        url: self.cfg.url.clone(),
                        tries: attempt,
                        last_error: msg,
                    })
                }
                Err(Failure::Retry(msg)) => {
                    tracing::warn!(url = %self.cfg.url, attempt, max_tries = self.cfg.max_tries, error = %msg, "remote reward request failed");
                    last_error = msg;
                }
            }
        }
        Err(RewardError::RemoteUnreachable {
            url: self.cfg.url.clone(),
            tries: self.cfg.max_tries,
            last_error,
        })
    }

    fn try_once(&self, body: &str, n: usize) -> Result<Vec<RewardOutput>, Failure> {
        let mut resp = match self
            .agent
            .post(&self.cfg.url)
            .header("content-type", "application/json")
            .send(body)
        {
            Ok(r) => r,
            Err(e) => {
                return Err(match e {
                    ureq::Error::Timeout(_) => Failure::Retry(format!(
                        "timed out after {}s (reward.remote.timeout_s)",
                        self.cfg.timeout_s
                    )),
                    ureq::Error::Io(_)
                    | ureq::Error::ConnectionFailed
                    | ureq::Error::HostNotFound
                    | ureq::Error::Protocol(_) => Failure::Retry(e.to_string()),
                    ureq::Error::Tls(_) | ureq::Error::TlsRequired => Failure::Unreachable(
                        format!("{e} (this build of ureq has no TLS support; use an http:// URL)"),
                    ),
                    other => Failure::Unreachable(other.to_string()),
                })
            }
        };
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(MAX_RESPONSE_BYTES)
            .read_to_string();
        if !(200..300).contains(&status) {
            let snippet = text.as_deref().map(snippet).unwrap_or_default();
            let msg = format!("HTTP {status}: {snippet}");
            return Err(if status >= 500 || status == 429 || status == 408 {
                Failure::Retry(msg)
            } else {
                Failure::Fatal(self.protocol(msg))
            });
        }
        let text = text.map_err(|e| Failure::Retry(format!("reading response: {e}")))?;
        match self.cfg.protocol {
            RemoteProtocol::Reinforge => parse_scores(&text, n),
            RemoteProtocol::Openrlhf => parse_openrlhf(&text, n),
        }
        .map_err(|m| Failure::Fatal(self.protocol(m)))
    }
}

/// First 200 chars of a body, for error messages.
fn snippet(s: &str) -> String {
    let mut out: String = s.chars().take(200).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// Decodes the response body into `n` outputs (see module docs for accepted shapes).
fn parse_scores(body: &str, n: usize) -> Result<Vec<RewardOutput>, String> {
    let v: Value = serde_json::from_str(body)
        .map_err(|e| format!("body is not JSON ({e}): {}", snippet(body)))?;
    let items = match v {
        Value::Array(a) => a,
        Value::Object(mut o) => match o.remove("scores") {
            Some(Value::Array(a)) => a,
            _ => {
                return Err(format!(
                    "expected {{\"scores\": [...]}}, got: {}",
                    snippet(body)
                ))
            }
        },
        _ => {
            return Err(format!(
                "expected {{\"scores\": [...]}}, got: {}",
                snippet(body)
            ))
        }
    };
    if items.len() != n {
        return Err(format!("expected {n} scores, got {}", items.len()));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let finite = |v: Option<&Value>| v.and_then(Value::as_f64).filter(|x| x.is_finite());
            match &item {
                Value::Number(_) => finite(Some(&item)).map(RewardOutput::new),
                Value::Object(o) => finite(o.get("score")).map(|s| RewardOutput::new(s).with_json_details(o.get("details"))),
                _ => None,
            }
            .ok_or_else(|| {
                format!(
                    "item {i} has no finite numeric score: {}",
                    snippet(&item.to_string())
                )
            })
        })
        .collect()
}

/// Decodes an OpenRLHF reward server's answer: `rewards` (one per item), and `scores` and
/// `extra_logs` lists as details.
fn parse_openrlhf(body: &str, n: usize) -> Result<Vec<RewardOutput>, String> {
    let v: Value = serde_json::from_str(body).map_err(|e| format!("body is not JSON ({e}): {}", snippet(body)))?;
    let list = |v: &Value, what: &str| -> Result<Vec<f64>, String> {
        let items = v.as_array().ok_or_else(|| format!("`{what}` is not a list: {}", snippet(&v.to_string())))?;
        if items.len() != n {
            return Err(format!("expected {n} {what}, got {}", items.len()));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, x)| x.as_f64().filter(|x| x.is_finite()).ok_or_else(|| format!("{what}[{i}] is not a finite number: {x}")))
            .collect()
    };
    let rewards = match &v {
        Value::Object(o) => list(o.get("rewards").ok_or_else(|| format!("expected {{\"rewards\": [...]}} (OpenRLHF's protocol), got: {}", snippet(body)))?, "rewards")?,
        _ => return Err(format!("expected {{\"rewards\": [...]}} (OpenRLHF's protocol), got: {}", snippet(body))),
    };
    let mut outs: Vec<RewardOutput> = rewards.into_iter().map(RewardOutput::new).collect();
    if let Some(Value::Object(logs)) = v.get("extra_logs") {
        for (k, xs) in logs {
            // Logs that are not one number per item are not metrics of ours.
            if let Ok(xs) = list(xs, k) {
                for (o, x) in outs.iter_mut().zip(xs) {
                    o.details.insert(k.clone(), x);
                }
            }
        }
    }
    // After the logs: `scores` is what dynamic sampling reads, whatever a log is named.
    if let Some(scores) = v.get("scores").filter(|s| !s.is_null()) {
        for (o, s) in outs.iter_mut().zip(list(scores, "scores")?) {
            o.details.insert("score".into(), s);
        }
    }
    Ok(outs)
}

impl RewardFn for RemoteReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError> {
        let mut outs = self.post(std::slice::from_ref(sample))?;
        check_batch_len(&self.name, 1, &outs)?;
        Ok(outs.remove(0))
    }

    fn score_batch(&self, samples: &[RewardInput]) -> Result<Vec<RewardOutput>, RewardError> {
        if samples.is_empty() {
            return Ok(Vec::new());
        }
        let chunk = if self.cfg.batch_size == 0 {
            samples.len()
        } else {
            self.cfg.batch_size
        };
        let mut out = Vec::with_capacity(samples.len());
        for c in samples.chunks(chunk) {
            out.extend(self.post(c)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    /// What the test server does with one connection.
    pub(crate) enum Reply {
        /// Answer with this status and body.
        Json(u16, String),
        /// Wait, then answer.
        Delayed(Duration, u16, String),
        /// Read the request and hang up without answering.
        Hangup,
    }

    /// A scripted HTTP/1.1 server on 127.0.0.1:0; handles one connection per reply, in order.
    pub(crate) struct TestServer {
        pub url: String,
        pub requests: Arc<Mutex<Vec<Value>>>,
    }

    fn read_request(s: &mut TcpStream) -> Option<Value> {
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let mut buf = Vec::new();
        let mut tmp = [0u8; 8192];
        loop {
            if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..pos]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buf.len() < pos + 4 + len {
                    let k = s.read(&mut tmp).ok()?;
                    if k == 0 {
                        return None;
                    }
                    buf.extend_from_slice(&tmp[..k]);
                }
                return serde_json::from_slice(&buf[pos + 4..pos + 4 + len]).ok();
            }
            let k = s.read(&mut tmp).ok()?;
            if k == 0 {
                return None;
            }
            buf.extend_from_slice(&tmp[..k]);
        }
    }

    fn respond(s: &mut TcpStream, status: u16, body: &str) {
        let msg = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = s.write_all(msg.as_bytes());
        let _ = s.flush();
    }

    pub(crate) fn serve(replies: Vec<Reply>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/score", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for reply in replies {
                let Ok((mut s, _)) = listener.accept() else {
                    return;
                };
                if let Some(v) = read_request(&mut s) {
                    seen.lock().unwrap().push(v);
                }
                match reply {
                    Reply::Json(code, body) => respond(&mut s, code, &body),
                    Reply::Delayed(d, code, body) => {
                        std::thread::sleep(d);
                        respond(&mut s, code, &body);
                    }
                    Reply::Hangup => drop(s),
                }
            }
        });
        TestServer { url, requests }
    }

    pub(crate) fn fast_cfg(url: &str) -> RemoteConfig {
        RemoteConfig {
            timeout_s: 5.0,
            max_tries: 3,
            backoff_ms: 10,
            max_backoff_ms: 50,
            ..RemoteConfig::new(url)
        }
    }

    fn samples(n: usize) -> Vec<RewardInput> {
        (0..n)
            .map(|i| {
                RewardInput::new("openai/gsm8k", format!("resp {i}"), json!(i))
                    .with_prompt("p")
                    .with_extra_info(json!({"index": i}))
            })
            .collect()
    }

    #[test]
    fn scores_batch_and_sends_documented_request() {
        let srv = serve(vec![Reply::Json(200, r#"{"scores": [0.5, 1]}"#.into())]);
        let r = RemoteReward::new(fast_cfg(&srv.url)).unwrap();
        let outs = r.score_batch(&samples(2)).unwrap();
        assert_eq!(
            outs.iter().map(|o| o.score).collect::<Vec<_>>(),
            vec![0.5, 1.0]
        );
        let reqs = srv.requests.lock().unwrap();
        assert_eq!(reqs.len(), 1);
        assert_eq!(
            reqs[0],
            json!({"items": [
                {"data_source": "openai/gsm8k", "prompt": "p", "response": "resp 0", "ground_truth": 0, "extra_info": {"index": 0}},
                {"data_source": "openai/gsm8k", "prompt": "p", "response": "resp 1", "ground_truth": 1, "extra_info": {"index": 1}}
            ]})
        );
    }

    #[test]
    fn accepts_object_items_and_bare_lists() {
        let srv = serve(vec![
            Reply::Json(200, r#"{"scores": [{"score": 1.0, "details": {"format": 1, "note": "x"}, "extra": 3}]}"#.into()),
            Reply::Json(200, "[0.25]".into()),
            Reply::Json(200, r#"[{"score": -1}]"#.into()),
        ]);
        let r = RemoteReward::new(fast_cfg(&srv.url)).unwrap();
        let s = &samples(1)[0];
        let out = r.score(s).unwrap();
        assert_eq!(
            (out.score, out.detail("format"), out.details.len()),
            (1.0, Some(1.0), 1)
        );
        assert_eq!(r.score(s).unwrap().score, 0.25);
        assert_eq!(r.score(s).unwrap().score, -1.0);
    }

    #[test]
    fn wrong_length_fails_without_retry() {
        let srv = serve(vec![
            Reply::Json(200, r#"{"scores": [1.0]}"#.into()),
            Reply::Json(200, "[1, 1]".into()),
        ]);
        let r = RemoteReward::new(fast_cfg(&srv.url)).unwrap();
        let err = r.score_batch(&samples(2)).unwrap_err();
        assert!(matches!(err, RewardError::RemoteProtocol { .. }), "{err}");
        assert!(
            err.to_string().contains("expected 2 scores, got 1"),
            "{err}"
        );
        assert_eq!(srv.requests.lock().unwrap().len(), 1);
    }

    #[test]
    fn malformed_bodies_are_protocol_errors() {
        for body in [
            "not json",
            r#"{"score": [1]}"#,
            r#"[null]"#,
            r#"[{"details": {}}]"#,
            r#"["1"]"#,
            "7",
            "[1e999]",
        ] {
            let srv = serve(vec![Reply::Json(200, body.into())]);
            let r = RemoteReward::new(fast_cfg(&srv.url)).unwrap();
            let err = r.score(&samples(1)[0]).unwrap_err();
            assert!(
                matches!(err, RewardError::RemoteProtocol { .. }),
                "{body}: {err}"
            );
        }
    }

    #[test]
    fn retries_500_then_succeeds() {
        let srv = serve(vec![
            Reply::Json(500, r#"{"error": "warming up"}"#.into()),
            Reply::Hangup,
            Reply::Json(200, r#"{"scores": [1.0]}"#.into()),
        ]);
        let r = RemoteReward::new(fast_cfg(&srv.url)).unwrap();
        assert_eq!(r.score(&samples(1)[0]).unwrap().score, 1.0);
        assert_eq!(srv.requests.lock().unwrap().len(), 3);
    }

    #[test]
    fn persistent_503_gives_up_with_status() {
        let srv = serve(
            (0..2)
                .map(|_| Reply::Json(503, "overloaded".into()))
                .collect(),
        );
        let r = RemoteReward::new(RemoteConfig {
            max_tries: 2,
            ..fast_cfg(&srv.url)
        })
        .unwrap();
        let err = r.score(&samples(1)[0]).unwrap_err().to_string();
        assert!(
            err.contains("after 2 tries") && err.contains("HTTP 503: overloaded"),
            "{err}"
        );
    }

    #[test]
    fn client_error_is_not_retried() {
        let srv = serve(vec![
            Reply::Json(422, r#"{"detail": "bad items"}"#.into()),
            Reply::Json(200, "[1]".into()),
        ]);
        let r = RemoteReward::new(fast_cfg(&srv.url)).unwrap();
        let err = r.score(&samples(1)[0]).unwrap_err().to_string();
        assert!(
            err.contains("HTTP 422") && err.contains("bad items"),
            "{err}"
        );
        assert_eq!(srv.requests.lock().unwrap().len(), 1);
    }

    #[test]
    fn down_server_gives_clear_error() {
        // Bind then drop to get a port nobody listens on.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}/score");
        let r = RemoteReward::new(RemoteConfig {
            max_tries: 2,
            ..fast_cfg(&url)
        })
        .unwrap();
        let err = r.score_batch(&samples(3)).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(
            err,
            RewardError::RemoteUnreachable { tries: 2, .. }
        ));
        assert!(
            msg.starts_with(&format!(
                "remote reward at {url} unreachable after 2 tries: "
            )) && msg.ends_with("; check the server or reward.remote.url")
                && !msg.contains('\n'),
            "{msg}"
        );
    }

    #[test]
    fn timeout_is_retried_then_reported() {
        let slow = || Reply::Delayed(Duration::from_secs(3), 200, "[1]".into());
        let srv = serve(vec![slow(), slow()]);
        let r = RemoteReward::new(RemoteConfig {
            timeout_s: 0.3,
            max_tries: 2,
            ..fast_cfg(&srv.url)
        })
        .unwrap();
        let t = Instant::now();
        let err = r.score(&samples(1)[0]).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        let msg = err.to_string();
        assert!(
            matches!(err, RewardError::RemoteUnreachable { tries: 2, .. }),
            "{msg}"
        );
        assert!(
            msg.to_lowercase().contains("timeout") || msg.to_lowercase().contains("timed out"),
            "{msg}"
        );
    }

    #[test]
    fn https_without_tls_fails_fast_and_says_why() {
        let srv = serve(vec![Reply::Json(200, "[1]".into())]);
        let url = srv.url.replace("http://", "https://");
        let r = RemoteReward::new(fast_cfg(&url)).unwrap();
        let msg = r.score(&samples(1)[0]).unwrap_err().to_string();
        // Either this build has TLS (then the handshake with a plain server fails),
        // or it says plainly that it has none; never a panic or a silent retry loop.
        assert!(msg.contains("unreachable after"), "{msg}");
        if msg.contains("TLS required") {
            assert!(
                msg.contains("after 1 try") && msg.contains("use an http:// URL"),
                "{msg}"
            );
        }
    }

    #[test]
    fn chunks_by_batch_size() {
        let srv = serve(vec![
            Reply::Json(200, "[1, 2]".into()),
            Reply::Json(200, "[3]".into()),
        ]);
        let r = RemoteReward::new(RemoteConfig {
            batch_size: 2,
            ..fast_cfg(&srv.url)
        })
        .unwrap();
        let outs = r.score_batch(&samples(3)).unwrap();
        assert_eq!(
            outs.iter().map(|o| o.score).collect::<Vec<_>>(),
            vec![1.0, 2.0, 3.0]
        );
        assert!(r.score_batch(&[]).unwrap().is_empty());
    }

    #[test]
    fn config_validation() {
        for url in ["", "localhost:8000", "ftp://x/y", "http://", "not a url"] {
            assert!(RemoteReward::new(RemoteConfig::new(url)).is_err(), "{url}");
        }
        let ok = "http://127.0.0.1:1/x";
        assert!(RemoteReward::new(RemoteConfig {
            max_tries: 0,
            ..RemoteConfig::new(ok)
        })
        .is_err());
        assert!(RemoteReward::new(RemoteConfig {
            max_tries: 99,
            ..RemoteConfig::new(ok)
        })
        .is_err());
        assert!(RemoteReward::new(RemoteConfig {
            timeout_s: f64::NAN,
            ..RemoteConfig::new(ok)
        })
        .is_err());
        assert!(RemoteReward::new(RemoteConfig {
            timeout_s: 0.0,
            ..RemoteConfig::new(ok)
        })
        .is_err());
        let named = RemoteReward::new(RemoteConfig {
            name: Some("judge".into()),
            ..RemoteConfig::new(ok)
        })
        .unwrap();
        assert_eq!(named.name(), "judge");
        let c: RemoteConfig = serde_json::from_value(json!({"url": ok})).unwrap();
        assert_eq!((c.max_tries, c.timeout_s), (3, 60.0));
        assert!(serde_json::from_value::<RemoteConfig>(json!({"url": ok, "retries": 2})).is_err());
        assert!(serde_json::from_value::<RemoteConfig>(json!({})).is_err());
    }

    #[test]
    fn backoff_is_bounded() {
        let r = RemoteReward::new(RemoteConfig {
            backoff_ms: 500,
            max_backoff_ms: 8000,
            ..RemoteConfig::new("http://127.0.0.1:1/")
        })
        .unwrap();
        assert_eq!(r.backoff(1), Duration::from_millis(500));
        assert_eq!(r.backoff(2), Duration::from_millis(1000));
        assert_eq!(r.backoff(19), Duration::from_millis(8000));
        assert_eq!(r.backoff(u32::MAX), Duration::from_millis(8000));
    }
}

#[cfg(test)]
mod openrlhf_tests {
    use super::tests::{fast_cfg, serve, Reply};
    use super::*;
    use serde_json::json;

    #[test]
    fn openrlhf_protocol_sends_query_prompts_labels_and_reads_rewards() {
        let body = json!({"rewards": [1.0, -0.5], "scores": [1.0, 0.0], "extra_logs": {"len": [3, 4], "note": "text"}}).to_string();
        let server = serve(vec![Reply::Json(200, body), Reply::Json(200, json!({"scores": [1.0]}).to_string())]);
        let r = RemoteReward::new(RemoteConfig { protocol: RemoteProtocol::Openrlhf, ..fast_cfg(&server.url) }).unwrap();
        let items = [
            RewardInput::new("a", " 42", json!("42")).with_prompt("Q1:"),
            RewardInput::new("b", " 7", json!({"target": [7]})).with_prompt("Q2:"),
        ];
        let outs = r.score_batch(&items).unwrap();
        assert_eq!(outs.iter().map(|o| o.score).collect::<Vec<_>>(), [1.0, -0.5]);
        assert_eq!((outs[1].detail("score"), outs[1].detail("len"), outs[1].detail("note")), (Some(0.0), Some(4.0), None));
        let sent = server.requests.lock().unwrap()[0].clone();
        assert_eq!(sent, json!({"query": ["Q1: 42", "Q2: 7"], "prompts": ["Q1:", "Q2:"], "labels": ["42", {"target": [7]}]}));
        // Our protocol's answer is not OpenRLHF's: a one-line error.
        let e = r.score(&items[0]).unwrap_err().to_string();
        assert!(e.contains("rewards") && e.contains("OpenRLHF"), "{e}");
    }
}
