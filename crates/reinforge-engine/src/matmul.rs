//! The training step's matrix multiplies: the linears as one fused op on burn's CPU autodiff
//! graph, and the GEMM behind it and the fused LM head.
//!
//! Why a fused op: burn's autodiff `x · W` copied the transposed operands of its backward
//! (`xᵀ`, `Wᵀ`) into fresh tensors before multiplying; here the backward multiplies through
//! strided views. Why two GEMMs: the `gemm` crate is the fastest on the path it picks itself
//! (the CPU's best), but it picks it inside, so under `REINFORGE_ISA` (a lower path forced to
//! test or benchmark it) the multiplies run on `reinforge_kernels::gemm` for that path.

use crate::fused::{apply, FusedOp};
use burn::tensor::Tensor;
use reinforge_kernels::gemm::View;
use reinforge_kernels::Isa;

/// `c (row stride ldc) = a · b`, or `c += a · b` when `accumulate`.
pub(crate) fn gemm(a: View<'_>, b: View<'_>, c: &mut [f32], ldc: usize, accumulate: bool) {
    let isa = Isa::active();
    if isa != Isa::detect() {
        return reinforge_kernels::gemm::gemm_with(isa, a, b, c, ldc, accumulate);
    }
    let (m, k, n) = (a.rows(), a.cols(), b.cols());
    assert_eq!(b.rows(), k, "gemm: [{m}, {k}] · [{}, {n}]", b.rows());
    if m == 0 || n == 0 {
        return;
    }
    assert!(c.len() >= (m - 1) * ldc + n, "gemm: c has {} values for [{m}, {n}] with stride {ldc}", c.len());
    // SAFETY: `View` checked that every (row, column) of a and b addresses inside its slice;
    // c is checked above; gemm reads and writes nothing else.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            ldc as isize,
            accumulate,
            a.data().as_ptr(),
            a.cs() as isize,
            a.rs() as isize,
            b.data().as_ptr(),
            b.cs() as isize,
            b.rs() as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        )
    }
}

/// `x · w` for `x [m, k]` and `w [k, n]` (a linear's rows against its `[in, out]` weight).
pub fn matmul(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    let ([m, k], [k2, n]) = (x.dims(), w.dims());
    if k != k2 {
        // Not a product of these shapes; burn's error applies.
        return x.matmul(w);
    }
    apply(MatMul { m, k, n }, x, w).0
}

/// The op's shape.
#[derive(Debug, Clone)]
struct MatMul {
    m: usize,
    k: usize,
    n: usize,
}

impl FusedOp for MatMul {
    type Saved = ();

    fn out_shape(&self) -> [usize; 2] {
        [self.m, self.n]
    }

    fn forward(&self, x: &[f32], w: &[f32]) -> (Vec<f32>, ()) {
        let Self { m, k, n } = *self;
        let mut y = vec![0f32; m * n];
        gemm(View::row_major(x, m, k), View::row_major(w, k, n), &mut y, n, false);
        (y, ())
    }

    fn backward(&self, x: &[f32], w: &[f32], _: &(), g: &[f32], [want_dx, want_dw]: [bool; 2]) -> [Option<Vec<f32>>; 2] {
        let Self { m, k, n } = *self;
        let g = View::row_major(g, m, n);
        let dx = want_dx.then(|| {
            let mut dx = vec![0f32; m * k];
            gemm(g, View::row_major(w, k, n).t(), &mut dx, k, false);
            dx
        });
        let dw = want_dw.then(|| {
            let mut dw = vec![0f32; k * n];
            gemm(View::row_major(x, m, k).t(), g, &mut dw, n, false);
            dw
        });
        [dx, dw]
    }

    fn composed(&self, x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
        x.matmul(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::tests::check_against_composed;

    fn values(len: usize, seed: u64) -> Vec<f32> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..len).map(|_| rng.random_range(-0.5f32..0.5)).collect()
    }

    #[test]
    fn the_fused_linear_matches_burns_matmul_and_its_gradients_on_every_path() {
        let (m, k, n) = (37, 70, 45);
        let (x, w, g) = (values(m * k, 1), values(k * n, 2), values(m * n, 3));
        for isa in Isa::available() {
            Isa::with(isa, || check_against_composed(MatMul { m, k, n }, (x.clone(), [m, k]), (w.clone(), [k, n]), g.clone(), 1e-5));
        }
    }
}
