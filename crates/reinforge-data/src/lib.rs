//! Prompt datasets for RL post-training, in verl's schema.
//!
//! This crate's job is everything between a dataset file on disk and the batches of
//! prompts that a rollout step consumes:
//!
//! - [`PromptRecord`]: one row in verl's schema — `data_source`, `prompt` (chat
//!   messages), `reward_model.ground_truth`, `extra_info`, `ability` — with configurable
//!   column names ([`LoadOptions`], like verl's `data.prompt_key`).
//! - Reading JSONL, JSON (array of rows) and Parquet (verl's nested `list<struct>` /
//!   `struct` columns, snappy-compressed as pyarrow writes them), with a policy for
//!   malformed rows ([`OnBadRow`]) and a [`LoadReport`] saying what was skipped and why.
//! - [`Dataset::load`]: tokenizes each prompt through a caller-supplied closure (the chat
//!   template with generation prompt) and drops prompts over `max_prompt_length`, like
//!   verl's `filter_overlong_prompts`.
//! - [`EpochLoader`]: seeded per-epoch shuffling, `drop_last`, multi-epoch iteration,
//!   and a serializable [`LoaderState`] so a resumed run sees exactly the batches an
//!   uninterrupted one would.
//! - [`gen`]: deterministic synthetic tasks (TinyZero-style countdown, small
//!   arithmetic) and atomic writers ([`write_jsonl`], [`write_parquet`]).
//!
//! Dependencies are file formats only (`serde_json`, `parquet`, `arrow-json` for the
//! writer) plus a portable seeded RNG. The tokenizer is reached through a closure, so
//! this crate knows nothing about tensors, engines or chat templates.

mod dataset;
mod error;
mod formats;
mod json_arrow;
pub mod gen;
mod loader;
mod record;

pub use dataset::{read_records, BadRow, DataItem, Dataset, Encoder, LoadOptions, LoadReport, OnBadRow};
pub use error::DataError;
pub use formats::{write_jsonl, write_parquet, FileFormat};
pub use loader::{Batch, EpochLoader, LoaderConfig, LoaderState};
pub use record::PromptRecord;

/// Result type of this crate.
pub type Result<T, E = DataError> = std::result::Result<T, E>;
