//! The fused LM head of the training forward: per-token log-probabilities and entropies
//! straight from the final hidden states, without a `[tokens, vocab]` logits tensor.
//!
//! Why by hand: as composed burn ops (matmul, slice, log-softmax, gather and their backward),
//! the head allocates about eight `tokens × vocab` tensors per step — 400 MB each for 8 × 256
//! SmolLM2 tokens — and the kernel zeroes every fresh page of them. Here the work goes
//! through row chunks: the forward keeps each row's log-sum-exp and entropy, and the logits of
//! its first rows up to a memory budget; the backward turns those into the gradient in place
//! and recomputes the rest chunk by chunk (one more head matmul for them). The matmuls go
//! through [`crate::matmul::gemm`].
//!
//! It runs as a `fused::FusedOp`: its own node on burn's CPU autodiff graph, composed burn
//! ops elsewhere.

use crate::error::{EngineError, Result};
use crate::fused::{apply, FusedOp};
use crate::matmul::gemm;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};
use rayon::prelude::*;
use reinforge_kernels::gemm::View;
use reinforge_kernels::softmax::{row_grad, row_stats, RowStats};
use std::sync::{Arc, Mutex};

/// Bytes of logits one chunk of rows may hold: big enough that the backward's weight-gradient
/// matmul (k = rows) runs near peak, small enough to stay out of the way (SmolLM2: 512 rows).
const CHUNK_BYTES: usize = 96 << 20;

/// Bytes of logits the forward keeps for the backward (whole chunks, the first ones): those
/// rows skip the backward's recomputing matmul, a quarter of the head's work. About 2,700
/// rows of SmolLM2's vocabulary; past it, rows are recomputed and memory stays flat.
const KEEP_BYTES: usize = 512 << 20;

/// `[N, 2]`: column 0 is `log softmax(hidden · weight / temperature)[target]`, column 1 the
/// distribution's entropy, for each of the `N` rows of `hidden` (`[N, H]`); `weight` is `[H, V]`.
pub fn head_logprobs(hidden: Tensor<2>, weight: Tensor<2>, targets: &[u32], temperature: f64) -> Result<Tensor<2>> {
    let [n, h] = hidden.dims();
    let [hw, v] = weight.dims();
    if hw != h || targets.len() != n {
        return Err(EngineError::Request(format!(
            "LM head: hidden [{n}, {h}], weight [{hw}, {v}] and {} targets do not fit",
            targets.len()
        )));
    }
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(EngineError::Request(format!("temperature must be a positive number, got {temperature}")));
    }
    if let Some(&bad) = targets.iter().find(|&&t| t as usize >= v) {
        return Err(EngineError::Request(format!("token id {bad} is outside the vocabulary (size {v})")));
    }
    let chunk = (CHUNK_BYTES / (v.max(1) * 4)).clamp(16, 4096);
    let keep = (KEEP_BYTES / (v.max(1) * 4)).min(n);
    let head = Head { n, h, v, chunk, keep, inv_t: (1.0 / temperature) as f32, targets: targets.into() };
    Ok(apply(head, hidden, weight).0)
}

/// The shape of one head call and its targets.
#[derive(Debug, Clone)]
struct Head {
    n: usize,
    h: usize,
    v: usize,
    /// Rows per chunk.
    chunk: usize,
    /// Rows whose logits the forward keeps for the backward (whole chunks within them).
    keep: usize,
    inv_t: f32,
    targets: Arc<[u32]>,
}

/// What the forward leaves for the backward: each row's statistics, and the logits of the
/// first rows (taken by the backward, which turns them into gradients in place).
#[derive(Debug, Clone)]
struct Saved {
    stats: Arc<[RowStats]>,
    logits: Arc<Mutex<Option<Vec<f32>>>>,
}

impl FusedOp for Head {
    type Saved = Saved;

    fn out_shape(&self) -> [usize; 2] {
        [self.n, 2]
    }

    /// Log-probs and entropies `[N, 2]`, and each row's statistics for the backward.
    fn forward(&self, x: &[f32], w: &[f32]) -> (Vec<f32>, Saved) {
        let mut stats = Vec::with_capacity(self.n);
        // Whole chunks only; the matmul writes them in place (fresh zero pages, no copy).
        let rows = self.chunk.min(self.n.max(1));
        let keep = if self.keep >= self.n { self.n } else { self.keep / rows * rows };
        let mut kept = vec![0f32; keep * self.v];
        self.chunks(x, w, Kept::Fill(&mut kept), |r0, _, z| {
            let targets = &self.targets[r0..r0 + z.len() / self.v];
            stats.par_extend(z.par_chunks(self.v).zip(targets.par_iter()).map(|(row, &t)| row_stats(row, self.inv_t, t as usize)));
        });
        let out: Vec<f32> = stats.iter().flat_map(|s| [s.logprob, s.entropy]).collect();
        (out, Saved { stats: stats.into(), logits: Arc::new(Mutex::new(Some(kept))) })
    }

    /// `∂L/∂hidden` and `∂L/∂weight` (each only when asked) for the upstream gradient `g`
    /// (`[N, 2]`, same layout as the output).
    fn backward(&self, x: &[f32], w: &[f32], saved: &Saved, g: &[f32], [want_dx, want_dw]: [bool; 2]) -> [Option<Vec<f32>>; 2] {
        let (n, h, v) = (self.n, self.h, self.v);
        let stats = &saved.stats;
        let mut dx = want_dx.then(|| vec![0f32; n * h]);
        let mut dw = want_dw.then(|| vec![0f32; h * v]);
        // A poisoned lock or a second backward finds nothing kept: every row is recomputed.
        let mut kept = saved.logits.lock().ok().and_then(|mut k| k.take()).unwrap_or_default();
        self.chunks(x, w, Kept::Read(&mut kept), |r0, xc, z| {
            let m = xc.len() / h;
            z.par_chunks_mut(v).enumerate().for_each(|(i, row)| {
                let r = r0 + i;
                row_grad(row, self.inv_t, self.targets[r] as usize, stats[r], g[2 * r], g[2 * r + 1]);
            });
            if let Some(dx) = dx.as_mut() {
                // dx[r0..r0+m] = dz · wᵀ: (m × v) · (v × h), wᵀ read through strides.
                gemm(View::row_major(z, m, v), View::row_major(w, h, v).t(), &mut dx[r0 * h..(r0 + m) * h], h, false);
            }
            if let Some(dw) = dw.as_mut() {
                // dw (+)= xcᵀ · dz: (h × m) · (m × v), xcᵀ read through strides; the first chunk
                // overwrites, the others accumulate.
                gemm(View::row_major(xc, m, h).t(), View::row_major(z, m, v), dw, v, r0 > 0);
            }
        });
        [dx, dw]
    }

    /// No backward will read kept logits: keep none.
    fn without_backward(&self) -> Self {
        Self { keep: 0, ..self.clone() }
    }

    /// The same numbers from composed burn ops, for backends the fused op does not cover.
    fn composed(&self, hidden: Tensor<2>, weight: Tensor<2>) -> Tensor<2> {
        let device = hidden.device();
        let logits = hidden.matmul(weight).mul_scalar(self.inv_t);
        let logp = log_softmax(logits, 1);
        let t: Vec<i64> = self.targets.iter().map(|&t| t as i64).collect();
        let t = Tensor::<2, Int>::from_data(TensorData::new(t, [self.n, 1]), &device);
        let picked = logp.clone().gather(1, t);
        let ent = (logp.clone().exp() * logp).sum_dim(1).neg();
        Tensor::cat(vec![picked, ent], 1)
    }
}

/// Logits of the first rows held across the forward and backward (`[rows, vocab]`).
enum Kept<'a> {
    /// The forward computes them into this buffer.
    Fill(&'a mut [f32]),
    /// The backward finds them computed here.
    Read(&'a mut [f32]),
}

impl Head {
    /// Runs `f(first_row, x_chunk, logits_chunk)` over the rows in chunks of `self.chunk`,
    /// each chunk's logits `x_chunk · w` in `kept` where it covers the chunk (computed there
    /// or, when reading, already there), else computed into one reused buffer.
    fn chunks(&self, x: &[f32], w: &[f32], kept: Kept<'_>, mut f: impl FnMut(usize, &[f32], &mut [f32])) {
        let (n, h, v) = (self.n, self.h, self.v);
        let rows = self.chunk.min(n.max(1));
        let (held, computed) = match kept {
            Kept::Fill(k) => (k, false),
            Kept::Read(k) => (k, true),
        };
        let mut buf = Vec::new();
        for r0 in (0..n).step_by(rows) {
            let m = rows.min(n - r0);
            let xc = &x[r0 * h..(r0 + m) * h];
            let in_held = held.len() >= (r0 + m) * v;
            let z = if in_held {
                &mut held[r0 * v..(r0 + m) * v]
            } else {
                buf.resize(rows * v, 0.0);
                &mut buf[..m * v]
            };
            if !(in_held && computed) {
                gemm(View::row_major(xc, m, h), View::row_major(w, h, v), z, v, false);
            }
            f(r0, xc, z);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::tests::check_against_composed;
    use burn::tensor::Device;

    #[test]
    fn fused_head_equals_composed_ops_in_value_and_gradient() {
        // 11 rows in chunks of 4 leave a ragged last chunk; temperature 0.7 scales both paths.
        let (n, h, v) = (11usize, 6usize, 23usize);
        let f = |i: usize, s: f32| ((i as f32 * 0.618 + s).fract() - 0.5) * 2.0;
        let x: Vec<f32> = (0..n * h).map(|i| f(i, 0.1)).collect();
        let w: Vec<f32> = (0..h * v).map(|i| f(i, 0.7) * 1.5).collect();
        let targets: Vec<u32> = (0..n).map(|i| (i * 7 % v) as u32).collect();
        let g: Vec<f32> = (0..2 * n).map(|i| f(i, 0.3)).collect();
        // Logits kept for no chunk, the first, all three: recomputed and kept rows alike.
        for keep in [0, 5, 11] {
            let head = Head { n, h, v, chunk: 4, keep, inv_t: (1.0 / 0.7f64) as f32, targets: targets.clone().into() };
            check_against_composed(head, (x.clone(), [n, h]), (w.clone(), [h, v]), g.clone(), 1e-5);
        }
    }

    #[test]
    fn bad_calls_are_refused_with_the_reason() {
        let d = Device::flex();
        let x = Tensor::<2>::zeros([2, 3], &d);
        let w = Tensor::<2>::zeros([3, 5], &d);
        let err = |r: Result<Tensor<2>>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err(head_logprobs(x.clone(), w.clone(), &[0, 5], 1.0)).contains("token id 5 is outside the vocabulary"));
        assert!(err(head_logprobs(x.clone(), w.clone(), &[0], 1.0)).contains("do not fit"));
        assert!(err(head_logprobs(x, w, &[0, 1], 0.0)).contains("temperature must be a positive number"));
    }
}
