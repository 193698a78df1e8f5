//! Rotary position embedding of the training forward's queries and keys, as one fused op.
//!
//! Why: composed from burn ops (two slices, a negation, a concatenation, two products and a
//! sum, then their backward) it writes about six temporaries of the queries' size per layer,
//! for the queries and again for the keys. Fused, it is one pass each way over the
//! projections' own `[tokens, heads · head_dim]` layout, before the heads are split off.

use crate::fused::{apply, FusedOp};
use burn::tensor::{Device, Tensor, TensorData};
use rayon::prelude::*;

/// Per-token angles for [`rope`]: row `r` is `[cos θ₀ … cos θ_{d/2-1}, sin θ₀ … sin θ_{d/2-1}]`
/// of that token's position (HF's rotate-half convention), `[tokens, head_dim]`.
pub fn rope_table(positions: &[Vec<usize>], hd: usize, theta: f64, device: &Device) -> Tensor<2> {
    let half = hd / 2;
    // Angles in f64 like the reference, rounded once.
    let inv: Vec<f64> = (0..half).map(|i| theta.powf(-2.0 * i as f64 / hd as f64)).collect();
    let tokens = positions.iter().map(Vec::len).sum::<usize>();
    let mut table = Vec::with_capacity(tokens * hd);
    for &p in positions.iter().flatten() {
        table.extend(inv.iter().map(|f| (p as f64 * f).cos() as f32));
        table.extend(inv.iter().map(|f| (p as f64 * f).sin() as f32));
    }
    Tensor::from_data(TensorData::new(table, [tokens, hd]), device)
}

/// Rotates every head of `x` (`[tokens, heads · head_dim]`) by its token's angles in `table`
/// ([`rope_table`]).
pub fn rope(x: Tensor<2>, table: Tensor<2>) -> Tensor<2> {
    let [n, width] = x.dims();
    let [_, hd] = table.dims();
    apply(Rope { shape: [n, width], hd }, x, table).0
}

/// The op's shape and head width.
#[derive(Debug, Clone)]
struct Rope {
    shape: [usize; 2],
    hd: usize,
}

impl Rope {
    /// Applies the rotation (`sign` 1) or its inverse (`sign` −1, the backward: a rotation's
    /// transpose is the rotation by the opposite angle) row by row.
    fn rotate(&self, x: &[f32], table: &[f32], sign: f32) -> Vec<f32> {
        let [n, width] = self.shape;
        let (hd, half) = (self.hd, self.hd / 2);
        let mut out = vec![0f32; n * width];
        out.par_chunks_mut(width).zip(x.par_chunks(width)).zip(table.par_chunks(hd)).for_each(|((o, xr), t)| {
            let (cos, sin) = t.split_at(half);
            for (oh, xh) in o.chunks_exact_mut(hd).zip(xr.chunks_exact(hd)) {
                let (x1, x2) = xh.split_at(half);
                let (o1, o2) = oh.split_at_mut(half);
                for i in 0..half {
                    let s = sign * sin[i];
                    // out = x·cos + rotate_half(x)·sin, rotate_half(x) = [−x₂, x₁].
                    o1[i] = x1[i] * cos[i] + -x2[i] * s;
                    o2[i] = x2[i] * cos[i] + x1[i] * s;
                }
            }
        });
        out
    }
}

impl FusedOp for Rope {
    type Saved = ();

    fn out_shape(&self) -> [usize; 2] {
        self.shape
    }

    fn forward(&self, x: &[f32], table: &[f32]) -> (Vec<f32>, ()) {
        (self.rotate(x, table, 1.0), ())
    }

    fn backward(&self, x: &[f32], table: &[f32], _: &(), d_out: &[f32], [want_dx, want_dt]: [bool; 2]) -> [Option<Vec<f32>>; 2] {
        let dx = want_dx.then(|| self.rotate(d_out, table, -1.0));
        // The training forward's table comes from positions and asks for no gradient; it is
        // here so the op is a whole function of both inputs (and testable as one).
        let dt = want_dt.then(|| {
            let [n, width] = self.shape;
            let (hd, half) = (self.hd, self.hd / 2);
            let mut dt = vec![0f32; n * hd];
            dt.par_chunks_mut(hd).zip(x.par_chunks(width).zip(d_out.par_chunks(width))).for_each(|(t, (xr, dr))| {
                let (dcos, dsin) = t.split_at_mut(half);
                for (xh, dh) in xr.chunks_exact(hd).zip(dr.chunks_exact(hd)) {
                    let ((x1, x2), (d1, d2)) = (xh.split_at(half), dh.split_at(half));
                    for i in 0..half {
                        dcos[i] += d1[i] * x1[i] + d2[i] * x2[i];
                        dsin[i] += d2[i] * x1[i] - d1[i] * x2[i];
                    }
                }
            });
            dt
        });
        [dx, dt]
    }

    fn composed(&self, x: Tensor<2>, table: Tensor<2>) -> Tensor<2> {
        let [n, width] = self.shape;
        let (hd, half, heads) = (self.hd, self.hd / 2, width / self.hd.max(1));
        let x = x.reshape([n, heads, hd]);
        let cos = table.clone().slice([0..n, 0..half]);
        let sin = table.slice([0..n, half..hd]);
        let (cos, sin) = (Tensor::cat(vec![cos.clone(), cos], 1).unsqueeze_dim::<3>(1), Tensor::cat(vec![sin.clone(), sin], 1).unsqueeze_dim::<3>(1));
        let x1 = x.clone().slice([0..n, 0..heads, 0..half]);
        let x2 = x.clone().slice([0..n, 0..heads, half..hd]);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 2);
        (x * cos + rotated * sin).reshape([n, width])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::tests::check_against_composed;

    #[test]
    fn fused_rope_equals_composed_ops_in_value_and_gradient() {
        // 3 heads of width 8 over 40 tokens at scattered positions.
        let (n, hd, heads) = (40usize, 8usize, 3usize);
        let positions = vec![(0..n).map(|i| i * 37 % 101).collect::<Vec<_>>()];
        let table: Vec<f32> = rope_table(&positions, hd, 10000.0, &Device::flex()).into_data().try_into_vec().unwrap();
        let x = (0..n * heads * hd).map(|i| ((i * 7 % 19) as f32 - 9.0) * 0.1).collect();
        let g = (0..n * heads * hd).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.3).collect();
        check_against_composed(Rope { shape: [n, heads * hd], hd }, (x, [n, heads * hd]), (table, [n, hd]), g, 1e-6);
    }
}
