//! The single-machine trainer: the controller loop of DESIGN.md §2 over worker groups
//! (actor+rollout sharing weights, reference, critic, reward), its TOML config, checkpoints,
//! resume and metrics.
//!
//! Depends on every library crate below it (engine and the CUDA engine, algos, reward, data,
//! checkpoint, metrics, lease, cluster, and retrieval's client for the multi-turn rollouts:
//! Search-R1's search loop and verl's tool agent);
//! nothing depends on it but the CLI.

pub mod build;
pub mod config;
pub mod cuda;
pub mod error;
pub mod multi_turn;
pub mod preflight;
pub mod remote;
pub mod reward_model;
pub mod roles;
pub mod run;
pub mod search;
pub mod tool_calls;
pub mod watchdog;
pub mod worker;

pub use config::TrainConfig;
pub use error::TrainError;
pub use run::{export_hf, train, train_with, RunSummary, StartOptions};
