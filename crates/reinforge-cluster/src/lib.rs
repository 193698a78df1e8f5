//! Multi-node on Ray: bringing up a Ray cluster (head, workers, token auth, the launch
//! conventions of torchrun, RunPod, Slurm and dstack), a client of Ray's Jobs REST API, cluster
//! status, preflight checks on every node (`doctor`), and the pieces remote worker groups need:
//! the Python launcher that places ranks with Ray, the framed wire protocol between controller
//! and workers, and CPU collectives.
//!
//! Ray provides membership, placement, process lifecycle, failure detection, jobs, logs and the
//! dashboard; this crate drives it and builds none of those itself. Depends only on
//! `reinforge-lease` (for this host's identity) and on no tensor library: the trainer builds
//! worker groups on top of it.

pub mod activity;
pub mod collective;
pub mod error;
pub mod ray;
pub mod launch;
pub mod wire;
pub mod bringup;
pub mod conventions;
pub mod doctor;
pub mod jobs;
pub mod status;
pub mod token;

pub use error::ClusterError;
pub use jobs::{connect, Dashboard};
pub use ray::RayInstall;
