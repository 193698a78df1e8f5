//! Recorded device work, replayed with one call: CUDA graphs on a GPU (one `cuGraphLaunch`
//! instead of hundreds of kernel launches, which is what bounds a small model's decode step),
//! and the same contract on the emulator, which records the work as a list and replays it.
//!
//! While [`super::Gpu::capture`] records, the work is queued but not run, so anything that
//! cannot be part of a replay is refused rather than silently baked in: allocating or freeing
//! device memory, host copies, waiting for the device. The emulator enforces exactly what a
//! GPU would, so code that records correctly there records correctly on a GPU. A recording
//! has the device to itself: other threads sharing it wait.

use super::{Arg, DevPtr, Gemm, Gpu};
use std::sync::Arc;

/// One unit of recorded work (emulator).
pub(super) enum Recorded {
    Launch { name: String, grid: [u32; 3], block: [u32; 3], smem: u32, args: Vec<Arg> },
    Gemm(Gemm),
    Copy { dst: DevPtr, src: DevPtr, bytes: usize },
    Zero { dst: DevPtr, bytes: usize },
}

/// The state of a recording in progress.
#[derive(Default)]
pub(super) struct Recording {
    /// The work, where the emulator records it (a GPU's stream capture holds its own).
    pub(super) ops: Vec<Recorded>,
    /// The first thing attempted that a replay could not repeat.
    pub(super) refused: Option<String>,
    /// Buffers dropped while recording, freed once it ends.
    pub(super) deferred_frees: Vec<DevPtr>,
    /// Staging memory dropped while recording: freeing it first waits for its copies, which
    /// a stream being captured cannot do, so it is freed once the recording ends.
    pub(super) deferred_staging: Vec<super::Staging>,
}

/// Who may use the device: while one thread records a graph every other thread's device work
/// waits (on a GPU it would be taken into the recording: the stream is shared), and a
/// recording waits for other threads' work in flight.
#[derive(Default)]
pub(super) struct Gate {
    /// The recording thread and what it has recorded.
    pub(super) recording: Option<(std::thread::ThreadId, Recording)>,
    /// One entry per device operation in progress outside a recording, by thread.
    pub(super) in_flight: Vec<std::thread::ThreadId>,
}

pub(super) enum GraphImp {
    Cuda(cudarc::driver::sys::CUgraphExec),
    Emu(Vec<Recorded>),
}

/// Work recorded by [`Gpu::capture`], run again by [`Gpu::replay`]. It refers to the device
/// memory it was recorded with: those buffers must outlive it.
pub struct Graph {
    pub(super) gpu: Arc<Gpu>,
    pub(super) imp: GraphImp,
}

impl Graph {
    /// Kernel launches and copies in it (the emulator's count; 0 on a GPU, which does not say).
    pub fn recorded_ops(&self) -> usize {
        match &self.imp {
            GraphImp::Emu(ops) => ops.len(),
            GraphImp::Cuda(_) => 0,
        }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let GraphImp::Cuda(exec) = self.imp {
            self.gpu.destroy_graph(exec);
        }
    }
}

// SAFETY: a graph exec is a driver handle any thread may use with the context current (the
// Gpu makes it current on every call).
unsafe impl Send for Graph {}
