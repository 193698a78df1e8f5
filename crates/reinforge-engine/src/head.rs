//! The fused LM head of the training forward: per-token log-probabilities and entropies
//! straight from the final hidden states, without a `[tokens, vocab]` logits tensor.
//!
//! Why by hand: as composed burn ops (matmul, slice, log-softmax, gather and their backward),
//! the head allocates about eight `tokens × vocab` tensors per step — 400 MB each for 8 × 256
//! SmolLM2 tokens — and the kernel zeroes every fresh page of them. Here the work goes
//! through row chunks: the forward keeps only each row's log-sum-exp and entropy, and the
//! backward recomputes a chunk's logits (one more head matmul) and turns them into the
//! gradient in place. Both matmuls go through `gemm`, the GEMM burn's CPU backend uses.
//!
//! The op is registered with burn's autodiff graph on the CPU backend (with or without
//! gradient checkpointing); any other backend gets the same numbers from composed ops.

use crate::error::{EngineError, Result};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::{BalancedCheckpointing, CheckpointStrategy, NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_autodiff::Autodiff;
use burn_flex::{Flex, FlexTensor};
use rayon::prelude::*;
use reinforge_kernels::softmax::{row_grad, row_stats, RowStats};
use std::sync::Arc;

/// Bytes of logits one chunk of rows may hold: big enough that the backward's weight-gradient
/// matmul (k = rows) runs near peak, small enough to stay out of the way (SmolLM2: 512 rows).
const CHUNK_BYTES: usize = 96 << 20;

/// `[N, 2]`: column 0 is `log softmax(hidden · weight / temperature)[target]`, column 1 the
/// distribution's entropy, for each of the `N` rows of `hidden` (`[N, H]`); `weight` is `[H, V]`.
pub fn head_logprobs(hidden: Tensor<2>, weight: Tensor<2>, targets: &[u32], temperature: f64) -> Result<Tensor<2>> {
    let v = weight.dims()[1];
    head_in_chunks(hidden, weight, targets, temperature, (CHUNK_BYTES / (v.max(1) * 4)).clamp(16, 4096)).map(|(t, _)| t)
}

/// Which implementation served a call.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    /// The fused op on burn's autodiff graph (CPU).
    Graph,
    /// The fused forward without a graph (CPU inference).
    Plain,
    /// Composed burn ops (other backends, other dtypes).
    Composed,
}

/// [`head_logprobs`] working through `chunk` rows at a time.
fn head_in_chunks(hidden: Tensor<2>, weight: Tensor<2>, targets: &[u32], temperature: f64, chunk: usize) -> Result<(Tensor<2>, Path)> {
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
    let head = Head { n, h, v, chunk: chunk.max(1), inv_t: (1.0 / temperature) as f32, targets: targets.into() };
    if let Some(out) = head.autodiff::<NoCheckpointing>(&hidden, &weight) {
        return Ok((out, Path::Graph));
    }
    if let Some(out) = head.autodiff::<BalancedCheckpointing>(&hidden, &weight) {
        return Ok((out, Path::Graph));
    }
    if let (Ok(x), Ok(w)) = (hidden.clone().try_into_primitive::<Flex>(), weight.clone().try_into_primitive::<Flex>()) {
        if let (Some(x), Some(w)) = (f32_rows(&x), f32_rows(&w)) {
            let (out, _) = head.forward(x.as_slice::<f32>().unwrap_or_default(), w.as_slice::<f32>().unwrap_or_default());
            return Ok((Tensor::from_primitive::<Flex>(out), Path::Plain));
        }
    }
    Ok((head.composed(hidden, weight), Path::Composed))
}

/// A contiguous f32 copy (or view) of a tensor, or `None` for other dtypes.
fn f32_rows(t: &FlexTensor) -> Option<FlexTensor> {
    let t = if t.is_contiguous() { t.clone() } else { t.to_contiguous() };
    t.as_slice::<f32>().is_some().then_some(t)
}

/// The shape of one head call and its targets.
#[derive(Debug, Clone)]
struct Head {
    n: usize,
    h: usize,
    v: usize,
    /// Rows per chunk.
    chunk: usize,
    inv_t: f32,
    targets: Arc<[u32]>,
}

/// What the backward needs besides the upstream gradient.
#[derive(Debug, Clone)]
struct Saved {
    head: Head,
    hidden: FlexTensor,
    weight: FlexTensor,
    stats: Arc<[RowStats]>,
}

/// The autodiff node of [`head_logprobs`]; parents are `[hidden, weight]`.
#[derive(Debug)]
struct FusedHead;

impl Backward<Flex, 2> for FusedHead {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let upstream = grads.consume::<Flex>(&ops.node);
        let upstream = upstream.to_contiguous();
        let s = &ops.state;
        let (x, w) = (s.hidden.as_slice::<f32>().unwrap_or_default(), s.weight.as_slice::<f32>().unwrap_or_default());
        let g = upstream.as_slice::<f32>().unwrap_or_default();
        let [px, pw] = &ops.parents;
        let (dx, dw) = s.head.backward(x, w, &s.stats, g, px.is_some(), pw.is_some());
        if let (Some(node), Some(dx)) = (px, dx) {
            grads.register::<Flex>(node.id, FlexTensor::from_data(TensorData::new(dx, [s.head.n, s.head.h])));
        }
        if let (Some(node), Some(dw)) = (pw, dw) {
            grads.register::<Flex>(node.id, FlexTensor::from_data(TensorData::new(dw, [s.head.h, s.head.v])));
        }
    }
}

impl Head {
    /// The op on an autodiff CPU tensor pair with checkpoint strategy `C`, or `None` when the
    /// tensors live elsewhere.
    fn autodiff<C>(&self, hidden: &Tensor<2>, weight: &Tensor<2>) -> Option<Tensor<2>>
    where
        C: CheckpointStrategy,
        burn_dispatch::DispatchTensor: burn_dispatch::DispatchKindConversion<Autodiff<Flex, C>>,
    {
        let x = hidden.clone().try_into_primitive::<Autodiff<Flex, C>>().ok()?;
        let w = weight.clone().try_into_primitive::<Autodiff<Flex, C>>().ok()?;
        let (xs, ws) = (f32_rows(x.primitive())?, f32_rows(w.primitive())?);
        let (out, stats) = self.forward(xs.as_slice::<f32>()?, ws.as_slice::<f32>()?);
        let out = match FusedHead.prepare::<C>([x.node(), w.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                prep.finish(Saved { head: self.clone(), hidden: xs, weight: ws, stats: stats.into() }, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        Some(Tensor::from_primitive::<Autodiff<Flex, C>>(out))
    }

    /// Log-probs and entropies `[N, 2]`, and each row's statistics for the backward.
    fn forward(&self, x: &[f32], w: &[f32]) -> (FlexTensor, Vec<RowStats>) {
        let (n, v) = (self.n, self.v);
        let rows = self.chunk.min(n.max(1));
        let mut logits = vec![0f32; rows * v];
        let mut stats = Vec::with_capacity(n);
        for r0 in (0..n).step_by(rows) {
            let m = rows.min(n - r0);
            let z = &mut logits[..m * v];
            self.logits(&x[r0 * self.h..(r0 + m) * self.h], w, z);
            let targets = &self.targets[r0..r0 + m];
            let chunk: Vec<RowStats> =
                z.par_chunks(v).zip(targets.par_iter()).map(|(row, &t)| row_stats(row, self.inv_t, t as usize)).collect();
            stats.extend(chunk);
        }
        let out: Vec<f32> = stats.iter().flat_map(|s| [s.logprob, s.entropy]).collect();
        (FlexTensor::from_data(TensorData::new(out, [n, 2])), stats)
    }

    /// `∂L/∂hidden` and `∂L/∂weight` (each only when asked) for the upstream gradient `g`
    /// (`[N, 2]`, same layout as the output).
    fn backward(&self, x: &[f32], w: &[f32], stats: &[RowStats], g: &[f32], want_dx: bool, want_dw: bool) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
        let (n, h, v) = (self.n, self.h, self.v);
        let rows = self.chunk.min(n.max(1));
        let mut dz = vec![0f32; rows * v];
        let mut dx = want_dx.then(|| vec![0f32; n * h]);
        let mut dw = want_dw.then(|| vec![0f32; h * v]);
        for (c, r0) in (0..n).step_by(rows).enumerate() {
            let m = rows.min(n - r0);
            let z = &mut dz[..m * v];
            let xc = &x[r0 * h..(r0 + m) * h];
            self.logits(xc, w, z);
            z.par_chunks_mut(v).enumerate().for_each(|(i, row)| {
                let r = r0 + i;
                row_grad(row, self.inv_t, self.targets[r] as usize, stats[r], g[2 * r], g[2 * r + 1]);
            });
            if let Some(dx) = dx.as_mut() {
                // dx[r0..r0+m] = dz · wᵀ: (m × v) · (v × h), wᵀ read through strides.
                let dst = &mut dx[r0 * h..(r0 + m) * h];
                // SAFETY: every pointer/stride pair addresses inside its slice: dst is m×h
                // row-major, z is m×v row-major, w is h×v row-major read as its transpose.
                unsafe { gemm_f32(m, h, v, dst.as_mut_ptr(), h as isize, false, z.as_ptr(), 1, v as isize, w.as_ptr(), v as isize, 1) };
            }
            if let Some(dw) = dw.as_mut() {
                // dw += xcᵀ · dz: (h × m) · (m × v), xcᵀ read through strides.
                // SAFETY: as above; dw is h×v row-major, xc is m×h read as its transpose.
                unsafe { gemm_f32(h, v, m, dw.as_mut_ptr(), v as isize, c > 0, xc.as_ptr(), h as isize, 1, z.as_ptr(), 1, v as isize) };
            }
        }
        (dx, dw)
    }

    /// `z = x · w / 1` for `x` of `m` rows (`[m, h]`) into `z` (`[m, v]`).
    fn logits(&self, x: &[f32], w: &[f32], z: &mut [f32]) {
        let m = x.len() / self.h;
        debug_assert_eq!(z.len(), m * self.v);
        // SAFETY: z is m×v, x is m×h and w is h×v, all row-major and exactly that long.
        unsafe { gemm_f32(m, self.v, self.h, z.as_mut_ptr(), self.v as isize, false, x.as_ptr(), 1, self.h as isize, w.as_ptr(), 1, self.v as isize) };
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

/// `dst (m×n, row stride dst_rs) = [dst +] lhs (m×k) · rhs (k×n)`, operands given by column
/// and row strides, threaded over the rayon pool.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_f32(m: usize, n: usize, k: usize, dst: *mut f32, dst_rs: isize, accumulate: bool, lhs: *const f32, lhs_cs: isize, lhs_rs: isize, rhs: *const f32, rhs_cs: isize, rhs_rs: isize) {
    // SAFETY: forwarded from the caller.
    unsafe {
        gemm::gemm(m, n, k, dst, 1, dst_rs, accumulate, lhs, lhs_cs, lhs_rs, rhs, rhs_cs, rhs_rs, 1.0, 1.0, false, false, false, gemm::Parallelism::Rayon(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    /// Hidden states, weight, targets and loss weights for an 11-row head over 23 tokens.
    fn case() -> (Vec<f32>, Vec<f32>, Vec<u32>, Vec<f32>) {
        let (n, h, v) = (11usize, 6usize, 23usize);
        let f = |i: usize, s: f32| ((i as f32 * 0.618 + s).fract() - 0.5) * 2.0;
        let x = (0..n * h).map(|i| f(i, 0.1)).collect();
        let w = (0..h * v).map(|i| f(i, 0.7) * 1.5).collect();
        let t = (0..n).map(|i| (i * 7 % v) as u32).collect();
        let g = (0..2 * n).map(|i| f(i, 0.3)).collect();
        (x, w, t, g)
    }

    /// Gradients with respect to hidden states and weight.
    type Grads = Option<(Vec<f32>, Vec<f32>)>;

    /// Output and (for autodiff devices) gradients of `Σ g ⊙ out` through `op`.
    fn run(device: &Device, op: impl Fn(Tensor<2>, Tensor<2>, &[u32]) -> Tensor<2>) -> (Vec<f32>, Grads) {
        let (x, w, t, g) = case();
        let leaf = |v: Vec<f32>, shape: [usize; 2]| {
            let t = Tensor::<2>::from_data(TensorData::new(v, shape), device);
            if device.is_autodiff() { t.require_grad() } else { t }
        };
        let (x, w) = (leaf(x, [11, 6]), leaf(w, [6, 23]));
        let out = op(x.clone(), w.clone(), &t);
        let vals: Vec<f32> = out.clone().into_data().try_to_vec::<f32>().expect("host");
        if !device.is_autodiff() {
            return (vals, None);
        }
        let g = Tensor::<2>::from_data(TensorData::new(g, [11, 2]), device);
        let grads = (out * g).sum().backward();
        let host = |t: Tensor<2>| -> Vec<f32> { t.grad(&grads).expect("gradient").into_data().try_to_vec::<f32>().expect("host") };
        (vals, Some((host(x), host(w))))
    }

    fn close(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-5 + 1e-5 * y.abs(), "{what}[{i}]: fused {x} vs composed {y}");
        }
    }

    #[test]
    fn fused_head_equals_composed_ops_in_value_and_gradient() {
        let plain = Device::flex();
        let cases = [
            (plain.clone().autodiff(), Path::Graph),
            (plain.clone().autodiff().gradient_checkpointing(), Path::Graph),
            (plain, Path::Plain),
        ];
        for (device, path) in cases {
            // Chunks of 4 rows leave a ragged last chunk of 3; temperature ≠ 1 scales both paths.
            let fused = run(&device, |x, w, t| {
                let (out, took) = head_in_chunks(x, w, t, 0.7, 4).expect("fused head");
                assert_eq!(took, path, "{device:?}");
                out
            });
            let composed = run(&device, |x, w, t| {
                let head = Head { n: 11, h: 6, v: 23, chunk: 4, inv_t: (1.0 / 0.7f64) as f32, targets: t.into() };
                head.composed(x, w)
            });
            close(&fused.0, &composed.0, "output");
            match (fused.1, composed.1) {
                (Some((fx, fw)), Some((cx, cw))) => {
                    close(&fx, &cx, "d hidden");
                    close(&fw, &cw, "d weight");
                }
                (None, None) => {}
                _ => panic!("gradients on one path only"),
            }
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
