//! The client the trainer's multi-turn rollouts use: one batched `POST /retrieve` per turn,
//! a timeout per attempt, retries with exponential backoff on transport errors, timeouts and
//! 5xx, and an error naming the URL when the server stays down (never an empty observation
//! passed off as a result).

use std::time::{Duration, Instant};

use crate::api::{Hits, RetrieveRequest, RetrieveResponse, ScoredDoc};
use crate::{Result, RetrievalError};

/// How to reach a retrieval server.
#[derive(Debug, Clone)]
pub struct RetrievalClient {
    url: String,
    topk: usize,
    timeout: Duration,
    retries: u32,
    backoff: Duration,
    agent: ureq::Agent,
}

/// Upper bound on a response body.
const MAX_RESPONSE_BYTES: u64 = 256 << 20;

impl RetrievalClient {
    /// A client for `url` (Search-R1's `retriever.url`, e.g. `http://127.0.0.1:8000/retrieve`)
    /// asking `topk` passages per query; each attempt may take `timeout`, and a failed one is
    /// tried again `retries` times, waiting `backoff`, then twice that, and so on.
    pub fn new(url: &str, topk: usize, timeout: Duration, retries: u32, backoff: Duration) -> Result<Self> {
        match url.parse::<ureq::http::Uri>() {
            Ok(u) if u.scheme_str() == Some("http") && u.authority().is_some() => {}
            _ => return Err(RetrievalError::Request(format!("retriever url `{url}` is not an http:// URL (e.g. http://127.0.0.1:8000/retrieve)"))),
        }
        let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(timeout)).http_status_as_error(false).build().into();
        Ok(Self { url: url.to_string(), topk, timeout, retries, backoff, agent })
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The passages for each query, in order, and how long the request took (retries
    /// included). An empty batch asks nothing.
    pub fn retrieve(&self, queries: &[String]) -> Result<(Vec<Vec<ScoredDoc>>, Duration)> {
        let t0 = Instant::now();
        if queries.is_empty() {
            return Ok((Vec::new(), t0.elapsed()));
        }
        let body = serde_json::to_string(&RetrieveRequest { queries: queries.to_vec(), topk: Some(self.topk as i64), return_scores: true })
            .map_err(|e| RetrievalError::Request(e.to_string()))?;
        let mut last = String::new();
        for attempt in 0..=self.retries {
            if attempt > 0 {
                let wait = self.backoff.saturating_mul(1 << (attempt - 1).min(16));
                tracing::warn!(url = %self.url, attempt, error = %last, "retrieval request failed; retrying in {:.1}s", wait.as_secs_f64());
                std::thread::sleep(wait);
            }
            match self.once(&body, queries.len()) {
                Ok(hits) => return Ok((hits, t0.elapsed())),
                Err((retry, why)) if retry => last = why,
                Err((_, why)) => return Err(RetrievalError::Request(format!("retrieval server at {}: {why}", self.url))),
            }
        }
        Err(RetrievalError::Request(format!(
            "retrieval server at {} did not answer after {} attempt(s) over {:.1}s (last: {last}); start it on this node with \
             `reinforge retrieval serve --index DIR --port PORT`, or point tools.search.url (retriever.url) at one",
            self.url,
            self.retries + 1,
            t0.elapsed().as_secs_f64()
        )))
    }

    /// One attempt: the hits, or whether to retry and why not.
    fn once(&self, body: &str, n: usize) -> std::result::Result<Vec<Vec<ScoredDoc>>, (bool, String)> {
        let mut resp = self.agent.post(&self.url).header("content-type", "application/json").send(body).map_err(|e| match e {
            ureq::Error::Timeout(_) => (true, format!("no answer within {:.1}s", self.timeout.as_secs_f64())),
            other => (true, other.to_string()),
        })?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().with_config().limit(MAX_RESPONSE_BYTES).read_to_string();
        if !(200..300).contains(&status) {
            let msg: String = text.unwrap_or_default().chars().take(300).collect();
            return Err((status >= 500 || status == 429 || status == 408, format!("HTTP {status}: {msg}")));
        }
        let text = text.map_err(|e| (true, format!("reading the answer: {e}")))?;
        let parsed: RetrieveResponse =
            serde_json::from_str(&text).map_err(|e| (false, format!("the answer is not Search-R1's {{\"result\": [[…]]}} shape ({e})")))?;
        if parsed.result.len() != n {
            return Err((false, format!("{} result lists for {n} queries", parsed.result.len())));
        }
        parsed
            .result
            .into_iter()
            .map(|h| match h {
                Hits::Scored(v) => Ok(v),
                // An empty list parses as either form.
                Hits::Plain(v) if v.is_empty() => Ok(Vec::new()),
                Hits::Plain(_) => Err((false, "passages without scores: the server ignored return_scores".to_string())),
            })
            .collect()
    }
}
