//! CPU f32 kernels for Reinforge's rollout engine: a matmul against pre-packed weights, and
//! the small per-token operations of a decoder (RMSNorm, RoPE, SwiGLU, attention over a KV
//! cache); and for the training step's fused LM head: row-wise log-softmax statistics and
//! their gradient.
//!
//! Why hand-written: generation multiplies a handful of rows (the live sequences) by every
//! weight matrix at each step. General GEMM libraries repack the weight operand on every call,
//! which for 16 rows costs as much memory traffic as the multiply itself; packing once, when
//! the weights change, removes that. Everything here works on plain row-major slices.
//!
//! Depends on rayon (threads) and `std::arch` only; no tensor library and no other Reinforge
//! crate.

pub mod matmul;
pub mod ops;
pub mod softmax;

pub use matmul::{Isa, PackedMatrix};
