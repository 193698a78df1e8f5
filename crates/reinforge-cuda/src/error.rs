//! The CUDA engine's error type: each variant says what failed, where, and what to do.

use std::path::PathBuf;

/// Errors from finding CUDA, compiling kernels and running the engine on a GPU.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA library could not be found or loaded.
    #[error("{lib} not found (looked in {searched}); {fix}")]
    MissingLibrary {
        /// The library's file name (e.g. `libcublasLt.so.13`).
        lib: String,
        /// Where we looked, in order.
        searched: String,
        /// How to make it available.
        fix: String,
    },
    /// No usable GPU: no driver, no device, or a bad index.
    #[error("device `{requested}`: {msg}")]
    Device {
        /// What the user asked for.
        requested: String,
        /// Why, and what to use instead.
        msg: String,
    },
    /// A CUDA driver / cuBLASLt / NVRTC / NCCL call failed.
    #[error("{call} failed: {msg}")]
    Api {
        /// The call that failed.
        call: String,
        /// The library's error name and description, with our hint where we have one.
        msg: String,
    },
    /// A kernel source did not compile.
    #[error("kernel source {file} does not compile for {arch}:\n{log}")]
    Compile {
        /// The `.cu` file.
        file: String,
        /// The target architecture.
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// The GPU has too little free memory for what was asked.
    #[error("out of GPU memory: {what} needs {need_mib} MiB, {free_mib} MiB free of {total_mib} MiB; {fix}")]
    OutOfMemory {
        /// What was being allocated.
        what: String,
        /// MiB requested.
        need_mib: u64,
        /// MiB free at the time.
        free_mib: u64,
        /// MiB on the device.
        total_mib: u64,
        /// Which setting lowers it.
        fix: String,
    },
    /// A kernel launch on the emulator failed (unknown kernel, divergent barrier, ...).
    #[error("kernel {kernel} on the emulator: {msg}")]
    Emulator {
        /// The kernel.
        kernel: String,
        /// What went wrong.
        msg: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A request the engine cannot serve, or an internal invariant (reported, never a panic).
    #[error("{0}")]
    Request(String),
    /// An error from the CPU engine (config, weights, tokenizer).
    #[error(transparent)]
    Engine(#[from] reinforge_engine::EngineError),
}

/// Result alias for the CUDA engine.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;
