//! Run-time device selection: the single seam where a GPU backend plugs in later.

use crate::error::{EngineError, Result};
use burn::tensor::Device;
use std::fmt;
use std::str::FromStr;

/// A device the user can name on the command line or in a config (`cpu`, `cuda:0`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The pure-Rust CPU backend (burn `flex`), always available.
    Cpu,
    /// An NVIDIA GPU by index (the CUDA engine, `reinforge-cuda`).
    Cuda(usize),
    /// The CUDA engine with its kernels run by the CPU emulator: slow, for testing the GPU code
    /// path on machines without a GPU.
    CudaEmulated,
}

impl FromStr for DeviceSpec {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "cpu" | "flex" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda(0)),
            "cuda-emu" | "cuda-emulated" => Ok(Self::CudaEmulated),
            _ => {
                if let Some(idx) = s.strip_prefix("cuda:") {
                    return idx.parse().map(Self::Cuda).map_err(|_| EngineError::Device {
                        requested: s.clone(),
                        msg: "expected `cuda:N` with N a GPU index".into(),
                    });
                }
                Err(EngineError::Device {
                    requested: s,
                    msg: "known devices are `cpu`, `cuda[:N]` and `cuda-emu` (the CUDA engine's kernels emulated on the CPU, for testing)".into(),
                })
            }
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(i) => write!(f, "cuda:{i}"),
            Self::CudaEmulated => write!(f, "cuda-emu"),
        }
    }
}

impl DeviceSpec {
    /// Whether this is the CUDA engine (a GPU or its emulator) rather than this crate's CPU engine.
    pub fn is_cuda(self) -> bool {
        matches!(self, Self::Cuda(_) | Self::CudaEmulated)
    }

    /// The burn device of the CPU engine (no autodiff); an error for the CUDA engine's
    /// devices, which `reinforge-cuda` runs (burn's own CUDA backend cannot be built here:
    /// DESIGN.md §6).
    pub fn inference_device(self) -> Result<Device> {
        match self {
            Self::Cpu => Ok(Device::flex()),
            Self::Cuda(_) | Self::CudaEmulated => Err(EngineError::Device {
                requested: self.to_string(),
                msg: "runs on the CUDA engine (reinforge-cuda), not on burn's CPU backend; this call site supports only `cpu`".into(),
            }),
        }
    }

    /// The burn device for training: the inference device with autodiff on.
    pub fn training_device(self, gradient_checkpointing: bool) -> Result<Device> {
        let dev = self.inference_device()?;
        Ok(if gradient_checkpointing {
            dev.autodiff().gradient_checkpointing()
        } else {
            dev.autodiff()
        })
    }
}
