//! The trainer's error: one variant per layer it drives, each already carrying what/where/fix.

/// Anything that stops a run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Model loading, generation or training.
    #[error(transparent)]
    Engine(#[from] reinforge_engine::EngineError),
    /// RL numerics.
    #[error(transparent)]
    Algo(#[from] reinforge_algos::AlgoError),
    /// Reward functions.
    #[error(transparent)]
    Reward(#[from] reinforge_reward::RewardError),
    /// Datasets.
    #[error(transparent)]
    Data(#[from] reinforge_data::DataError),
    /// Checkpoints.
    #[error(transparent)]
    Checkpoint(#[from] reinforge_checkpoint::CheckpointError),
    /// Metrics sinks.
    #[error(transparent)]
    Metrics(#[from] reinforge_metrics::MetricsError),
    /// Tokenizer and chat template.
    #[error(transparent)]
    Tokenizer(#[from] reinforge_tokenizer::TokenizerError),
    /// Model assets.
    #[error(transparent)]
    Assets(#[from] reinforge_assets::AssetError),
    /// Anything else, already phrased for the user.
    #[error("{0}")]
    Other(String),
}
