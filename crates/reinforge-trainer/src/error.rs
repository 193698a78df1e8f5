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
    /// The CUDA engine (device, libraries, kernels, GPU memory).
    #[error(transparent)]
    Cuda(#[from] reinforge_cuda::CudaError),
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
    /// Run-directory ownership.
    #[error(transparent)]
    Lease(#[from] reinforge_lease::LeaseError),
    /// A worker rank is gone (its process died, its node was lost or went silent): a restart
    /// from the last checkpoint can continue the run (`trainer.max_restarts`).
    #[error("{0}")]
    LostWorker(String),
    /// The cluster has no room for the worker groups (right now).
    #[error("{0}")]
    Unplaceable(String),
    /// An error in one phase of one step, which it names.
    #[error("step {step}, {phase}: {source}")]
    InPhase {
        /// The step (1-based) being computed.
        step: usize,
        /// The phase it failed in.
        phase: crate::run::Phase,
        /// What went wrong.
        source: Box<TrainError>,
    },
    /// Anything else, already phrased for the user.
    #[error("{0}")]
    Other(String),
}

impl TrainError {
    /// Whether the run stopped because it lost a worker rank: the case automatic recovery handles.
    pub fn is_lost_worker(&self) -> bool {
        match self {
            TrainError::LostWorker(_) => true,
            TrainError::InPhase { source, .. } => source.is_lost_worker(),
            _ => false,
        }
    }

    /// The step an error names, if it happened inside one.
    pub fn step(&self) -> Option<usize> {
        match self {
            TrainError::InPhase { step, .. } => Some(*step),
            _ => None,
        }
    }
}
