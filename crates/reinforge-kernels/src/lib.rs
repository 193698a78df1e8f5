//! CPU f32 kernels for Reinforge's rollout engine: a matmul against pre-packed weights, and
//! the small per-token operations of a decoder (RMSNorm, RoPE, SwiGLU, attention over a KV
//! cache); for the training step's fused LM head: row-wise log-softmax statistics and
//! their gradient; and a general blocked GEMM over strided operands ([`gemm`]) that the
//! training step's linears use on a path `REINFORGE_ISA` forces.
//!
//! Why hand-written: generation multiplies a handful of rows (the live sequences) by every
//! weight matrix at each step. General GEMM libraries repack the weight operand on every call,
//! which for 16 rows costs as much memory traffic as the multiply itself; packing once, when
//! the weights change, removes that. Everything here works on plain row-major slices.
//!
//! Depends on rayon (threads) and `std::arch` only; no tensor library and no other Reinforge
//! crate.

/// Runs a body compiled for the active vector extension ([`Isa::active`]).
macro_rules! dispatch {
    ($body:ident($($arg:expr),*)) => {
        match crate::Isa::active() {
            // SAFETY: the CPU has the features (detected); the bodies only index slices.
            #[cfg(target_arch = "x86_64")]
            crate::Isa::Avx512 => unsafe { $body::avx512($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            crate::Isa::Avx2Fma => unsafe { $body::avx2($($arg),*) },
            _ => $body::portable($($arg),*),
        }
    };
}

/// Defines `portable`, `avx2` and `avx512` copies of one inlined body in a module of its name.
macro_rules! multiversion {
    ($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty $body:block) => {
        #[allow(clippy::too_many_arguments)]
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[inline(always)]
            fn body($($arg: $ty),*) -> $ret $body
            pub(super) fn portable($($arg: $ty),*) -> $ret { body($($arg),*) }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            pub(super) unsafe fn avx2($($arg: $ty),*) -> $ret { body($($arg),*) }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f")]
            pub(super) unsafe fn avx512($($arg: $ty),*) -> $ret { body($($arg),*) }
        }
    };
}

pub mod gemm;
pub mod matmul;
pub mod ops;
pub mod softmax;

pub use matmul::{Isa, PackedMatrix, ISA_ENV};

/// A raw output pointer shared by parallel tasks that write disjoint elements (each use says
/// which).
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: every user hands copies only to tasks that write disjoint elements.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Deterministic test values in [-0.5, 0.5) from a small LCG (no dependency).
#[cfg(test)]
fn test_values(len: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            ((s >> 8) as f32 / (1u32 << 24) as f32) - 0.5
        })
        .collect()
}

/// `exp(x)` for `x ≤ 0` (as in a softmax after subtracting the max), branch-free so loops
/// over it vectorise. Relative error ≤ 2e-7 on `[−87, 0]`; flushes to 0 below.
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a part exact in f32 times any n ≤ 2^8, plus the rest (Cody–Waite).
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer without a libm call.
    const ROUND: f32 = 12_582_912.0;
    let x = x.max(-87.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    // Taylor terms to r^7 on |r| ≤ ln2/2.
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let scale = f32::from_bits((((n as i32) + 127) as u32) << 23);
    p * scale
}
