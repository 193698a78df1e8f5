//! Search-augmented RL's retrieval side (Search-R1): an index over a passage corpus, the HTTP
//! server Search-R1's trainer talks to, and the client Reinforge's trainer uses.
//!
//! - [`corpus`]: Search-R1's JSONL corpus (`id`, `contents` = `"Title"\ntext`, gzip or not)
//!   and the document store an index keeps so hits come back as corpus rows;
//! - [`bm25`]: BM25 with tantivy, Lucene's English analysis (pyserini's default);
//! - [`dense`]: embeddings from a BERT-family encoder (`reinforge-engine`'s, mean pooling,
//!   L2-normalised) and exact inner-product search, Search-R1's default retriever shape;
//! - [`index`]: building (`reinforge retrieval index`) and opening an index directory;
//! - [`server`]: `POST /retrieve` with Search-R1's request and response shapes, `GET /health`,
//!   size limits, 4xx on bad requests, graceful shutdown (`reinforge retrieval serve`);
//! - [`client`]: batched requests with timeouts and retries, for the trainer's multi-turn rollouts.
//!
//! Dependencies: tantivy (full-text index), tokio + axum (HTTP server), ureq (client),
//! `reinforge-engine` (the encoder for dense retrieval). Nothing of the trainer: the server
//! stands alone on any node.

#![warn(missing_docs)]

pub mod api;
pub mod bm25;
pub mod client;
pub mod corpus;
pub mod dense;
pub mod index;
pub mod server;

pub use api::{RetrieveRequest, RetrieveResponse, ScoredDoc};
pub use client::RetrievalClient;
pub use corpus::Passage;
pub use index::{IndexOptions, Retriever, RetrieverKind};

/// Errors of the retrieval crate, each one line: what, where, and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum RetrievalError {
    /// A corpus file that cannot be read or parsed.
    #[error("{0}")]
    Corpus(String),
    /// An index directory that cannot be built, opened or searched.
    #[error("{0}")]
    Index(String),
    /// A file-system error.
    #[error("{0}")]
    Io(String),
    /// The dense encoder.
    #[error("{0}")]
    Encoder(String),
    /// The HTTP server.
    #[error("{0}")]
    Server(String),
    /// A retrieval request that failed (after its retries).
    #[error("{0}")]
    Request(String),
}

/// Result type of this crate.
pub type Result<T, E = RetrievalError> = std::result::Result<T, E>;
