//! Per-row decoder operations, written to match transformers' Llama/Qwen2 numerics in f32.

/// `out = x / sqrt(mean(x²) + eps) * w` for one row (the mean is summed in f64).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f64, out: &mut [f32]) {
    let ms = x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / x.len() as f64;
    let inv = (1.0 / (ms + eps).sqrt()) as f32;
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

/// `out = silu(gate) * up`, elementwise (SwiGLU).
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len(), "silu_mul: slices of different lengths");
    dispatch!(silu_mul_body(gate, up, out))
}

/// The gradients of [`silu_mul`]: `d_gate` and `d_up` from the output's gradient `d_out`.
pub fn silu_mul_grad(gate: &[f32], up: &[f32], d_out: &[f32], d_gate: &mut [f32], d_up: &mut [f32]) {
    let n = gate.len();
    assert!(up.len() == n && d_out.len() == n && d_gate.len() == n && d_up.len() == n, "silu_mul_grad: slices of different lengths");
    dispatch!(silu_mul_grad_body(gate, up, d_out, d_gate, d_up))
}

/// `1 / (1 + exp(-x))` through [`crate::exp_neg`] of `-|x|`, branch-free.
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    let e = crate::exp_neg(-x.abs());
    let r = 1.0 / (1.0 + e);
    if x >= 0.0 { r } else { e * r }
}

multiversion!(silu_mul_body(gate: &[f32], up: &[f32], out: &mut [f32]) -> () {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g * super::sigmoid(g) * u;
    }
});

multiversion!(silu_mul_grad_body(gate: &[f32], up: &[f32], d_out: &[f32], d_gate: &mut [f32], d_up: &mut [f32]) -> () {
    // silu'(g) = s (1 + g (1 − s)) with s = sigmoid(g).
    for i in 0..gate.len() {
        let (g, u, d) = (gate[i], up[i], d_out[i]);
        let s = super::sigmoid(g);
        d_gate[i] = d * u * s * (1.0 + g * (1.0 - s));
        d_up[i] = d * g * s;
    }
});

/// cos/sin of `position · θ^(-2i/d)` for positions `0..len`, `[len, d/2]` each, computed in
/// f64 like the reference and rounded once.
pub fn rope_tables(len: usize, head_dim: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let inv: Vec<f64> = (0..half).map(|i| theta.powf(-2.0 * i as f64 / head_dim as f64)).collect();
    let mut cos = Vec::with_capacity(len * half);
    let mut sin = Vec::with_capacity(len * half);
    for p in 0..len {
        for f in &inv {
            let a = p as f64 * f;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (cos, sin)
}

/// Rotates one head vector in place (transformers' `rotate_half` convention); `cos`/`sin` are
/// that position's `d/2` values.
pub fn apply_rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    let (x1, x2) = x.split_at_mut(half);
    for i in 0..half {
        let (a, b) = (x1[i], x2[i]);
        x1[i] = a * cos[i] + (-b) * sin[i];
        x2[i] = b * cos[i] + a * sin[i];
    }
}

/// Scaled dot-product attention of one query token's `g` heads (`q`: `[g, d]`) against the
/// first `len` cached keys and values of their shared KV head; writes `[g, d]` into `out`.
/// Keys are stored transposed, `[d, cap]` (so scores vectorise across positions), values
/// `[cap, d]`. `scores` is scratch space.
#[allow(clippy::too_many_arguments)]
pub fn attend(q: &[f32], keys_t: &[f32], cap: usize, values: &[f32], len: usize, d: usize, scale: f32, scores: &mut Vec<f32>, out: &mut [f32]) {
    assert!(keys_t.len() >= (d - 1) * cap + len && values.len() >= len * d && cap >= len, "attend: cache slices too short");
    scores.resize(len, 0.0);
    dispatch!(attend_body(q, keys_t, cap, values, len, d, scale, scores, out))
}

// Plain loops the compiler vectorises for whichever target features each copy enables.
multiversion!(attend_body(q: &[f32], kt: &[f32], cap: usize, values: &[f32], len: usize, d: usize, scale: f32, scores: &mut [f32], out: &mut [f32]) -> () {
    let scores = &mut scores[..len];
    for (qh, oh) in q.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        scores.fill(0.0);
        for (dd, &qv) in qh.iter().enumerate() {
            let krow = &kt[dd * cap..dd * cap + len];
            for (s, &k) in scores.iter_mut().zip(krow) {
                *s += qv * k;
            }
        }
        let mut max = f32::NEG_INFINITY;
        for s in scores.iter_mut() {
            *s *= scale;
            max = max.max(*s);
        }
        let mut sum = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let inv = 1.0 / sum;
        oh.fill(0.0);
        for (s, vj) in scores.iter().zip(values.chunks_exact(d)) {
            let p = s * inv;
            for (o, &v) in oh.iter_mut().zip(vj) {
                *o += p * v;
            }
        }
    }
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_mul_and_its_gradient_match_float64() {
        // Every path this CPU can run, each against the same reference.
        for isa in crate::Isa::available() {
            crate::Isa::with(isa, || {
                let gate: Vec<f32> = (0..203).map(|i| (i as f32 - 101.0) * 0.37).collect();
                let up: Vec<f32> = (0..203).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.5).collect();
                let d_out: Vec<f32> = (0..203).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.3).collect();
                let mut out = vec![0f32; 203];
                silu_mul(&gate, &up, &mut out);
                let (mut dg, mut du) = (vec![0f32; 203], vec![0f32; 203]);
                silu_mul_grad(&gate, &up, &d_out, &mut dg, &mut du);
                for i in 0..203 {
                    let (g, u, d) = (gate[i] as f64, up[i] as f64, d_out[i] as f64);
                    let s = 1.0 / (1.0 + (-g).exp());
                    let close = |a: f32, b: f64, what: &str| assert!((a as f64 - b).abs() <= 1e-6 * (1.0 + b.abs()), "{isa:?} {what}[{i}] (gate {g}): {a} vs {b}");
                    close(out[i], g * s * u, "out");
                    close(dg[i], d * u * s * (1.0 + g * (1.0 - s)), "d_gate");
                    close(du[i], d * g * s, "d_up");
                }
            });
        }
    }

    #[test]
    fn attention_matches_a_direct_softmax() {
        // Every path this CPU can run, each against the same reference.
        for isa in crate::Isa::available() {
            crate::Isa::with(isa, || {
                let d = 4;
                let q = [0.1f32, -0.2, 0.3, 0.4, 1.0, 0.0, -1.0, 0.5];
                let k = [0.5f32, 0.1, -0.3, 0.2, -0.4, 0.9, 0.0, 0.1, 0.3, 0.3, 0.3, 0.3];
                let v = [1.0f32, 2.0, 3.0, 4.0, -1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5];
                let mut out = [0f32; 8];
                // Keys transposed into a cache of 5 slots, 3 in use.
                let cap = 5;
                let mut kt = vec![f32::NAN; d * cap];
                for j in 0..3 {
                    for i in 0..d {
                        kt[i * cap + j] = k[j * d + i];
                    }
                }
                attend(&q, &kt, cap, &v, 3, d, 0.5, &mut Vec::new(), &mut out);
                for h in 0..2 {
                    let s: Vec<f64> = (0..3).map(|j| (0..d).map(|i| (q[h * d + i] * k[j * d + i]) as f64).sum::<f64>() * 0.5).collect();
                    let z: f64 = s.iter().map(|x| x.exp()).sum();
                    for i in 0..d {
                        let want: f64 = (0..3).map(|j| s[j].exp() / z * v[j * d + i] as f64).sum();
                        assert!((out[h * d + i] as f64 - want).abs() < 1e-6, "{isa:?} head {h} dim {i}");
                    }
                }
            });
        }
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_rotation_keeps_the_norm() {
        let (cos, sin) = rope_tables(3, 4, 10000.0);
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        apply_rope(&mut x, &cos[0..2], &sin[0..2]);
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
        apply_rope(&mut x, &cos[4..6], &sin[4..6]);
        let norm: f32 = x.iter().map(|v| v * v).sum();
        assert!((norm - 30.0).abs() < 1e-4);
    }

    #[test]
    fn rms_norm_scales_to_unit_rms() {
        let x = [3.0f32, -4.0];
        let mut out = [0f32; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut out);
        let r = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6 && (out[1] + 8.0 / r).abs() < 1e-6);
    }
}
