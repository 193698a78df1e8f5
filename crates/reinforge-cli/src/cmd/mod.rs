//! One module per subcommand.

pub mod bench;
pub mod bench_cuda;
pub mod bench_retrieval;
pub mod cluster;
pub mod cuda;
pub mod dashboard;
pub mod data;
pub mod doctor;
pub mod train;
pub mod generate;
pub mod model;
pub mod retrieval;
pub mod reward;
pub mod vectors;

use anyhow::{Context, Result};
use reinforge_engine::{CausalLm, DeviceSpec};
use reinforge_tokenizer::ChatTokenizer;
use std::path::PathBuf;

/// A model directory resolved from a name or path, with its tokenizer.
pub struct Loaded {
    pub dir: PathBuf,
    pub model: CausalLm,
    pub tok: ChatTokenizer,
}

/// Resolves `--model` (known name or HF directory) and loads weights and tokenizer.
pub fn load_model(name_or_path: &str, device: &str, training: bool) -> Result<Loaded> {
    let dir = reinforge_assets::resolve_model(name_or_path)?;
    let spec: DeviceSpec = device.parse()?;
    let dev = if training { spec.training_device(false)? } else { spec.inference_device()? };
    let tok = ChatTokenizer::load_from_dir(&dir)?;
    let model = CausalLm::load(&dir, &dev).with_context(|| format!("loading model from {}", dir.display()))?;
    Ok(Loaded { dir, model, tok })
}

/// Peak resident memory of this process in MiB (Linux `VmHWM`), if readable.
pub fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
