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
    /// An NVIDIA GPU by index.
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "cpu" | "flex" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda(0)),
            _ => {
                if let Some(idx) = s.strip_prefix("cuda:") {
                    return idx.parse().map(Self::Cuda).map_err(|_| EngineError::Device {
                        requested: s.clone(),
                        msg: "expected `cuda:N` with N a GPU index".into(),
                    });
                }
                Err(EngineError::Device {
                    requested: s,
                    msg: "known devices are `cpu` and `cuda[:N]`".into(),
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
        }
    }
}

impl DeviceSpec {
    /// The burn device for inference (no autodiff), or an error saying why it is absent.
    pub fn inference_device(self) -> Result<Device> {
        match self {
            Self::Cpu => Ok(Device::flex()),
            // This build compiles only the CPU backend: burn's CUDA backend needs an LLVM
            // download at build time that our build machines cannot make (DESIGN.md §6).
            Self::Cuda(_) => Err(EngineError::Device {
                requested: self.to_string(),
                msg: "this build of reinforge has only the CPU backend; use `--device cpu` \
                      (GPU backends are a separate build, not yet released)"
                    .into(),
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
