//! RMSNorm, `w · x / sqrt(mean(x²) + eps)` per row, as one fused op of the training forward.
//!
//! Why: burn composes it as a square, a mean, a square root, a reciprocal and two products,
//! and its backward as about as many more: each a full pass over `tokens × hidden` floats and
//! most a fresh allocation, 61 times a step for a 30-layer model. Fused, the forward is one
//! pass that keeps each row's `1 / rms`, and the backward one pass for the input's gradient
//! and one for the weight's.

use crate::fused::{apply, FusedOp};
use burn::tensor::Tensor;
use rayon::prelude::*;
use std::sync::Arc;

/// Rows one task of the weight gradient sums: fixed, so the sum's order (and its rounding)
/// does not depend on the thread count.
const ROWS_PER_PARTIAL: usize = 64;

/// `w · x / sqrt(mean(x²) + eps)` over the last dimension of `x` (`[.., hidden]`), `w` `[hidden]`.
pub fn rms_norm<const D: usize>(x: Tensor<D>, weight: Tensor<1>, eps: f64) -> Tensor<D> {
    let dims = x.dims();
    let h = dims[D - 1];
    let [hw] = weight.dims();
    let rows = dims.iter().product::<usize>() / h.max(1);
    let norm = RmsNorm { shape: [rows, h], eps: eps as f32 };
    if hw != h || h == 0 {
        // Not a norm of these shapes; burn's broadcasting rules (and errors) apply.
        return norm.composed(x.reshape([rows, h]), weight.unsqueeze::<2>()).reshape(dims);
    }
    apply(norm, x.reshape([rows, h]), weight.reshape([1, h])).0.reshape(dims)
}

/// The op's shape (`[rows, hidden]` of the input and output) and epsilon.
#[derive(Debug, Clone)]
struct RmsNorm {
    shape: [usize; 2],
    eps: f32,
}

/// `Σ x²` of a row, in eight lanes so it vectorises (one fixed order either way).
fn sum_sq(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += v * v;
        }
    }
    lanes.iter().sum::<f32>() + rest.iter().map(|v| v * v).sum::<f32>()
}

/// `Σ a·b` of two rows, in eight lanes.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let rest: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for ((l, &p), &q) in lanes.iter_mut().zip(x).zip(y) {
            *l += p * q;
        }
    }
    lanes.iter().sum::<f32>() + rest
}

impl FusedOp for RmsNorm {
    /// Each row's `1 / sqrt(mean(x²) + eps)`.
    type Saved = Arc<[f32]>;

    fn out_shape(&self) -> [usize; 2] {
        self.shape
    }

    fn forward(&self, x: &[f32], w: &[f32]) -> (Vec<f32>, Arc<[f32]>) {
        let [n, h] = self.shape;
        let mut y = vec![0f32; n * h];
        let mut inv = vec![0f32; n];
        y.par_chunks_mut(h).zip(inv.par_iter_mut()).zip(x.par_chunks(h)).for_each(|((yr, r), xr)| {
            *r = 1.0 / (sum_sq(xr) / h as f32 + self.eps).sqrt();
            for ((o, &v), &g) in yr.iter_mut().zip(xr).zip(w) {
                *o = v * *r * g;
            }
        });
        (y, inv.into())
    }

    fn backward(&self, x: &[f32], w: &[f32], inv: &Arc<[f32]>, dy: &[f32], [want_dx, want_dw]: [bool; 2]) -> [Option<Vec<f32>>; 2] {
        let [n, h] = self.shape;
        // y = x·r·w with r = (mean(x²) + eps)^-½, so with g = dy·w:
        // dx = r·g − x·r³·(g·x)/h, and dw = Σ_rows dy·x·r.
        let dx = want_dx.then(|| {
            let mut dx = vec![0f32; n * h];
            dx.par_chunks_mut(h).zip(x.par_chunks(h).zip(dy.par_chunks(h))).zip(inv.par_iter()).for_each(|((dxr, (xr, dyr)), &r)| {
                let g: Vec<f32> = dyr.iter().zip(w).map(|(d, w)| d * w).collect();
                let c = r * r * r * dot(&g, xr) / h as f32;
                for ((o, &gi), &xi) in dxr.iter_mut().zip(&g).zip(xr) {
                    *o = r * gi - xi * c;
                }
            });
            dx
        });
        let dw = want_dw.then(|| {
            let partials: Vec<Vec<f32>> = x
                .par_chunks(ROWS_PER_PARTIAL * h)
                .zip(dy.par_chunks(ROWS_PER_PARTIAL * h))
                .zip(inv.par_chunks(ROWS_PER_PARTIAL))
                .map(|((xs, dys), rs)| {
                    let mut acc = vec![0f32; h];
                    for ((xr, dyr), &r) in xs.chunks(h).zip(dys.chunks(h)).zip(rs) {
                        for ((a, &xi), &di) in acc.iter_mut().zip(xr).zip(dyr) {
                            *a += di * xi * r;
                        }
                    }
                    acc
                })
                .collect();
            let mut dw = vec![0f32; h];
            for p in &partials {
                for (d, v) in dw.iter_mut().zip(p) {
                    *d += v;
                }
            }
            dw
        });
        [dx, dw]
    }

    fn composed(&self, x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
        let inv = x.clone().square().mean_dim(1).add_scalar(self.eps).sqrt().recip();
        x * inv * w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::tests::check_against_composed;

    #[test]
    fn fused_rms_norm_equals_composed_ops_in_value_and_gradient() {
        // More rows than one partial of the weight gradient, a width that is not a multiple
        // of the 8 lanes, and rows of very different scales.
        let (rows, h) = (150usize, 37usize);
        let x = (0..rows * h).map(|i| ((i * 7 % 19) as f32 - 9.0) * (1.0 + (i / h % 5) as f32 * 3.0)).collect();
        let w = (0..h).map(|j| 0.5 + (j % 7) as f32 * 0.25).collect();
        let g = (0..rows * h).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.3).collect();
        check_against_composed(RmsNorm { shape: [rows, h], eps: 1e-6 }, (x, [rows, h]), (w, [1, h]), g, 1e-5);
    }
}
