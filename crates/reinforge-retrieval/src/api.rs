//! Search-R1's retrieval API (`search_r1/search/retrieval_server.py`), shape for shape:
//!
//! ```text
//! POST /retrieve  {"queries": ["q1", …], "topk": 3, "return_scores": true}
//! 200             {"result": [[{"document": {"id": "0", "contents": "\"Title\"\ntext"}, "score": 12.3}, …], …]}
//!                 (return_scores false: {"result": [[{"id": "0", "contents": "…"}, …], …]})
//! ```
//!
//! One list per query, in the order sent; `topk` null or 0 means the server's default.
//! (Search-R1's own server fails on `return_scores: false` for most batch sizes; here both
//! forms answer.)

use serde::{Deserialize, Serialize};

use crate::corpus::Passage;

/// The request body of `POST /retrieve`. Unknown fields are ignored, as pydantic does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrieveRequest {
    /// The queries, answered in order.
    pub queries: Vec<String>,
    /// Passages per query; `null` or 0: the server's `--topk`.
    #[serde(default)]
    pub topk: Option<i64>,
    /// Wrap each passage as `{"document": …, "score": …}`.
    #[serde(default)]
    pub return_scores: bool,
}

/// A passage and its score (`return_scores: true`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoredDoc {
    /// The corpus row.
    pub document: Passage,
    /// BM25 score, or inner product for dense retrieval.
    pub score: f32,
}

/// The hits of one query, in either form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Hits {
    /// `return_scores: true`.
    Scored(Vec<ScoredDoc>),
    /// `return_scores: false`: the corpus rows alone.
    Plain(Vec<Passage>),
}

/// The response body of `POST /retrieve`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrieveResponse {
    /// One entry per query.
    pub result: Vec<Hits>,
}

/// The body of an error answer (4xx/5xx).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What is wrong and how to fix it.
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shapes_are_search_r1s() {
        // The request their trainer sends (search_r1/llm_agent/generation.py).
        let r: RetrieveRequest = serde_json::from_value(json!({"queries": ["who won"], "topk": 3, "return_scores": true})).unwrap();
        assert_eq!((r.queries.len(), r.topk, r.return_scores), (1, Some(3), true));
        let r: RetrieveRequest = serde_json::from_value(json!({"queries": [], "extra": 1})).unwrap();
        assert_eq!((r.topk, r.return_scores), (None, false));

        let doc = Passage { id: "0".into(), contents: "\"T\"\nx".into() };
        let scored = RetrieveResponse { result: vec![Hits::Scored(vec![ScoredDoc { document: doc.clone(), score: 1.5 }])] };
        assert_eq!(serde_json::to_value(&scored).unwrap(), json!({"result": [[{"document": {"id": "0", "contents": "\"T\"\nx"}, "score": 1.5}]]}));
        let plain = RetrieveResponse { result: vec![Hits::Plain(vec![doc])] };
        assert_eq!(serde_json::to_value(&plain).unwrap(), json!({"result": [[{"id": "0", "contents": "\"T\"\nx"}]]}));
    }
}
