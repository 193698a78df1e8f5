//! Row-wise log-softmax statistics and their gradient over one row of logits, for the fused
//! LM head (per-token log-probs and entropies without materialising `[tokens, vocab]`).
//!
//! Why hand-written: the row is a vocabulary (49k–152k floats) and each training step touches
//! every row twice; `f32::exp` is a scalar libm call, so a vectorised `exp` is the difference
//! between the softmax costing a tenth of the head's matmul or a third of it.

/// What the forward keeps of one row: enough to recompute its softmax in the backward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowStats {
    /// `log Σ exp(z·inv_t)` over the row.
    pub lse: f32,
    /// `z_target·inv_t − lse`: the target's log-probability.
    pub logprob: f32,
    /// `−Σ p log p` of the row's distribution.
    pub entropy: f32,
}

/// Statistics of `softmax(row · inv_t)` for the token `target`. `inv_t` must be positive.
pub fn row_stats(row: &[f32], inv_t: f32, target: usize) -> RowStats {
    assert!(target < row.len(), "row_stats: target {target} outside a row of {}", row.len());
    let (max, s, sz) = dispatch!(stats_body(row, inv_t));
    // With m = max·inv_t and e_j = exp(z_j·inv_t − m): lse = m + ln s, and
    // H = lse − Σ p_j z_j·inv_t = ln s − (Σ e_j (z_j·inv_t − m)) / s.
    let m = max * inv_t;
    let lse = m + s.ln();
    RowStats { lse, logprob: row[target] * inv_t - lse, entropy: s.ln() - sz / s }
}

/// Overwrites `row` (logits `z`) with `∂L/∂z` for `L = g_logprob·logprob + g_entropy·entropy`
/// of the statistics `st` that [`row_stats`] returned for the same row, `inv_t` and `target`.
pub fn row_grad(row: &mut [f32], inv_t: f32, target: usize, st: RowStats, g_logprob: f32, g_entropy: f32) {
    assert!(target < row.len(), "row_grad: target {target} outside a row of {}", row.len());
    // With y = z·inv_t and p = exp(y − lse):
    //   ∂logprob/∂y_j = δ_j,target − p_j,   ∂H/∂y_j = −p_j (y_j − lse + H),
    // and ∂y/∂z = inv_t.
    dispatch!(grad_body(row, inv_t, st.lse, st.entropy, g_logprob, g_entropy));
    row[target] += g_logprob * inv_t;
}

multiversion!(stats_body(row: &[f32], inv_t: f32) -> (f32, f32, f32) {
    // Lane-wise partial maxima and sums over fixed-width blocks so the loops vectorise.
    const W: usize = 16;
    let mut mx = [f32::NEG_INFINITY; W];
    let chunks = row.chunks_exact(W);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..W {
            mx[l] = mx[l].max(c[l]);
        }
    }
    let mut max = mx.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max = tail.iter().copied().fold(max, f32::max);
    let m = max * inv_t;
    let (mut s, mut sz) = ([0f32; W], [0f32; W]);
    for c in row.chunks_exact(W) {
        for l in 0..W {
            let y = c[l] * inv_t - m;
            let e = crate::exp_neg(y);
            s[l] += e;
            sz[l] += e * y;
        }
    }
    let (mut s_t, mut sz_t) = (0f32, 0f32);
    for &z in tail {
        let y = z * inv_t - m;
        let e = crate::exp_neg(y);
        s_t += e;
        sz_t += e * y;
    }
    (max, s.iter().sum::<f32>() + s_t, sz.iter().sum::<f32>() + sz_t)
});

multiversion!(grad_body(row: &mut [f32], inv_t: f32, lse: f32, ent: f32, g_lp: f32, g_ent: f32) -> () {
    // ∂L/∂z_j = −inv_t · p_j · (g_lp + g_ent (y_j − lse + H)); the target's δ term is added
    // by the caller.
    let shift = ent - lse;
    for z in row.iter_mut() {
        let y = *z * inv_t;
        let p = crate::exp_neg(y - lse);
        *z = -inv_t * p * (g_lp + g_ent * (y + shift));
    }
});

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(row: &[f32], inv_t: f64, target: usize) -> (f64, f64, f64, Vec<f64>) {
        let y: Vec<f64> = row.iter().map(|&z| z as f64 * inv_t).collect();
        let m = y.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + y.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        let p: Vec<f64> = y.iter().map(|v| (v - lse).exp()).collect();
        let ent = -p.iter().zip(&y).map(|(p, y)| p * (y - lse)).sum::<f64>();
        (lse, y[target] - lse, ent, p)
    }

    fn row(n: usize, seed: u32) -> Vec<f32> {
        // A deterministic spread of logits with a few large ones, like a trained LM head.
        (0..n)
            .map(|i| {
                let h = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503)) >> 8;
                let u = h as f32 / (1u32 << 24) as f32;
                if i % 97 == 3 { 12.0 * u } else { 6.0 * u - 3.0 }
            })
            .collect()
    }

    #[test]
    fn exp_neg_matches_libm() {
        use crate::exp_neg;
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            worst = worst.max(((exp_neg(x) as f64 - want) / want).abs());
            x += 0.003_7;
        }
        assert!(worst < 2e-7, "relative error {worst}");
        assert_eq!(exp_neg(0.0), 1.0);
        assert!(exp_neg(-200.0) >= 0.0 && exp_neg(-200.0) < 1e-37);
    }

    #[test]
    fn stats_match_a_float64_reference() {
        // Every path this CPU can run, each against the same reference.
        for isa in crate::Isa::available() {
            crate::Isa::with(isa, || {
                for (n, inv_t) in [(1usize, 1.0f32), (15, 1.0), (16, 0.5), (1000, 1.0), (49_157, 1.0 / 0.7)] {
                    let r = row(n, n as u32);
                    let target = n / 3;
                    let st = row_stats(&r, inv_t, target);
                    let (lse, lp, ent, _) = reference(&r, inv_t as f64, target);
                    assert!((st.lse as f64 - lse).abs() < 1e-4 * lse.abs().max(1.0), "{isa:?} n={n}: lse {} vs {lse}", st.lse);
                    assert!((st.logprob as f64 - lp).abs() < 1e-4, "{isa:?} n={n}: logprob {} vs {lp}", st.logprob);
                    assert!((st.entropy as f64 - ent).abs() < 1e-4, "{isa:?} n={n}: entropy {} vs {ent}", st.entropy);
                }
            });
        }
    }

    #[test]
    fn gradient_matches_the_analytic_one_and_finite_differences() {
        // Every path this CPU can run, each against the same reference.
        for isa in crate::Isa::available() {
            crate::Isa::with(isa, || {
                let (n, inv_t, target) = (37usize, 1.0f32 / 0.8, 5usize);
                let r = row(n, 9);
                let (g_lp, g_ent) = (0.7f32, -0.3f32);
                let st = row_stats(&r, inv_t, target);
                let mut g = r.clone();
                row_grad(&mut g, inv_t, target, st, g_lp, g_ent);
                let loss = |r: &[f32]| {
                    let (_, lp, ent, _) = reference(r, inv_t as f64, target);
                    g_lp as f64 * lp + g_ent as f64 * ent
                };
                for j in 0..n {
                    let h = 1e-2f32;
                    let (mut up, mut down) = (r.clone(), r.clone());
                    up[j] += h;
                    down[j] -= h;
                    let fd = (loss(&up) - loss(&down)) / (2.0 * h as f64);
                    assert!((g[j] as f64 - fd).abs() < 2e-4, "{isa:?} dz[{j}] = {} vs finite difference {fd}", g[j]);
                }
            });
        }
    }
}
