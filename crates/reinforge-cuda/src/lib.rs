//! Reinforge's engine on NVIDIA GPUs: the decoder-only transformer's training step (forward,
//! hand-written backward, AdamW) and rollout (paged KV cache, sampling on device), with the
//! same models, weights and answers as the CPU engine in `reinforge-engine`.
//!
//! Nothing CUDA is needed to build it: the driver, cuBLASLt, NVRTC and NCCL are loaded at
//! run time ([`libs`]), and the kernels (`kernels/*.cu`, CUDA C) are compiled by NVRTC for
//! the GPU at first use ([`kernels`]). The same kernel sources also compile for the CPU into
//! an emulator (`emu/`), so every layer above [`gpu`] runs and is tested on machines
//! without a GPU (`GpuKind::Emulated`).
//!
//! Data-parallel ranks sum their gradients through NCCL ([`nccl`]) where every rank has it.
//!
//! Depends on `reinforge-engine` (model config, weights, sampling types), `reinforge-assets`
//! (the cache directory) and `reinforge-tokenizer`; knows nothing of RL or clusters.

pub mod error;
pub mod gpu;
pub mod kernels;
pub mod libs;
pub mod model;
pub mod nccl;
pub mod ops;
pub mod rollout;
pub mod selftest;
pub mod train;

pub use error::{CudaError, Result};
pub use gpu::{DType, DevPtr, Gpu, GpuKind};
pub use model::{DeviceModel, Head, Packed, RowGrads, RowOut};
pub use rollout::{DecodeOp, Rollout};
pub use train::{GradReduce, TrainState};
