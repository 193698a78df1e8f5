//! SwiGLU, `silu(gate) · up`, as one fused op of the training forward.
//!
//! Why: burn composes it as sigmoid, two products and their backward — about ten temporaries
//! of `tokens × intermediate` floats per layer and step (12.6 MB each for 8 × 256 SmolLM2
//! tokens, 30 layers), each a fresh allocation. Fused, the forward writes one tensor and the
//! backward two, with a vectorised sigmoid (`reinforge_kernels::ops`).

use crate::fused::{apply, FusedOp};
use burn::tensor::activation::silu;
use burn::tensor::Tensor;
use rayon::prelude::*;
use reinforge_kernels::ops::{silu_mul, silu_mul_grad};

/// Elements one rayon task handles.
const GRAIN: usize = 1 << 14;

/// `silu(gate) · up` for two tensors of the same shape `[..., intermediate]`.
pub fn swiglu<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    let dims = gate.dims();
    if up.dims() != dims {
        // Not a SwiGLU pair; burn's broadcasting rules (and errors) apply.
        return silu(gate) * up;
    }
    let cols = dims[D - 1];
    let rows = dims.iter().product::<usize>() / cols.max(1);
    let (out, _) = apply(SwiGlu { shape: [rows, cols] }, gate.reshape([rows, cols]), up.reshape([rows, cols]));
    out.reshape(dims)
}

/// The op's shape (`[rows, cols]` of both inputs and the output).
#[derive(Debug, Clone)]
struct SwiGlu {
    shape: [usize; 2],
}

impl FusedOp for SwiGlu {
    type Saved = ();

    fn out_shape(&self) -> [usize; 2] {
        self.shape
    }

    fn forward(&self, gate: &[f32], up: &[f32]) -> (Vec<f32>, ()) {
        let mut out = vec![0f32; gate.len()];
        out.par_chunks_mut(GRAIN)
            .zip(gate.par_chunks(GRAIN).zip(up.par_chunks(GRAIN)))
            .for_each(|(o, (g, u))| silu_mul(g, u, o));
        (out, ())
    }

    fn backward(&self, gate: &[f32], up: &[f32], _: &(), d_out: &[f32], want: [bool; 2]) -> [Option<Vec<f32>>; 2] {
        // Both come out of one pass; computing one alone would not be cheaper.
        let (mut dg, mut du) = (vec![0f32; gate.len()], vec![0f32; gate.len()]);
        dg.par_chunks_mut(GRAIN)
            .zip(du.par_chunks_mut(GRAIN))
            .zip(gate.par_chunks(GRAIN).zip(up.par_chunks(GRAIN)).zip(d_out.par_chunks(GRAIN)))
            .for_each(|((dg, du), ((g, u), d))| silu_mul_grad(g, u, d, dg, du));
        [want[0].then_some(dg), want[1].then_some(du)]
    }

    fn composed(&self, gate: Tensor<2>, up: Tensor<2>) -> Tensor<2> {
        silu(gate) * up
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::tests::check_against_composed;

    #[test]
    fn fused_swiglu_equals_composed_ops_in_value_and_gradient() {
        // More elements than one rayon grain, with a ragged last grain, and gates from −12 to 12.
        let (rows, cols) = (7usize, 5000usize);
        let n = rows * cols;
        let gate = (0..n).map(|i| (i as f32 / n as f32 - 0.5) * 24.0).collect();
        let up = (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.5).collect();
        let g = (0..n).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.3).collect();
        check_against_composed(SwiGlu { shape: [rows, cols] }, (gate, [rows, cols]), (up, [rows, cols]), g, 1e-5);
    }
}
