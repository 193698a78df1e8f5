//! Fused CPU ops on burn's autodiff graph: one node with a hand-written forward and backward
//! over host slices, where burn would chain several ops and allocate a tensor for each.
//!
//! Why: on the CPU the cost of a chain of elementwise ops is mostly its temporaries (each a
//! fresh allocation the kernel zeroes page by page), not its arithmetic. An op here is
//! registered through burn-tensor's `extension` feature and `burn_autodiff::ops::Backward` on
//! `Autodiff<Flex, C>`, with or without gradient checkpointing; a plain CPU tensor runs the
//! fused forward alone; any other backend or dtype runs the op's composed burn form, which
//! gives the same numbers (each op's tests compare the two).

use burn::tensor::{Tensor, TensorData};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::{BalancedCheckpointing, CheckpointStrategy, NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_autodiff::Autodiff;
use burn_flex::{Flex, FlexTensor};
use std::fmt::Debug;

/// A two-input, one-output op on 2-D f32 tensors with its own gradient.
pub(crate) trait FusedOp: Clone + Debug + Send + 'static {
    /// What the backward needs besides the two inputs.
    type Saved: Clone + Debug + Send + 'static;
    /// The output's shape.
    fn out_shape(&self) -> [usize; 2];
    /// The output (row-major, [`Self::out_shape`]) and what the backward keeps.
    fn forward(&self, a: &[f32], b: &[f32]) -> (Vec<f32>, Self::Saved);
    /// Gradients for `a` and `b` (each only where `want` says so) from the output's gradient.
    fn backward(&self, a: &[f32], b: &[f32], saved: &Self::Saved, grad: &[f32], want: [bool; 2]) -> [Option<Vec<f32>>; 2];
    /// The same op from burn's own ops, for tensors the fused form does not cover.
    fn composed(&self, a: Tensor<2>, b: Tensor<2>) -> Tensor<2>;
    /// The op for a forward whose backward never runs (no graph records it): itself, unless
    /// it keeps work for its backward beyond [`Self::Saved`]'s essentials (the LM head).
    fn without_backward(&self) -> Self {
        self.clone()
    }
}

/// Which implementation served a call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Path {
    /// The fused op on burn's autodiff graph (CPU).
    Graph,
    /// The fused forward without a graph (CPU inference).
    Plain,
    /// Composed burn ops (other backends, other dtypes).
    Composed,
}

/// Runs `op` on `a` and `b` through the best path their device allows.
pub(crate) fn apply<Op: FusedOp>(op: Op, a: Tensor<2>, b: Tensor<2>) -> (Tensor<2>, Path) {
    if let Some(out) = on_graph::<Op, NoCheckpointing>(&op, &a, &b) {
        return (out, Path::Graph);
    }
    if let Some(out) = on_graph::<Op, BalancedCheckpointing>(&op, &a, &b) {
        return (out, Path::Graph);
    }
    if let (Ok(x), Ok(y)) = (a.clone().try_into_primitive::<Flex>(), b.clone().try_into_primitive::<Flex>()) {
        let (x, y) = (contiguous(&x), contiguous(&y));
        if let (Some(xs), Some(ys)) = (x.as_slice::<f32>(), y.as_slice::<f32>()) {
            let (out, _) = op.without_backward().forward(xs, ys);
            return (Tensor::from_primitive::<Flex>(host_tensor(out, op.out_shape())), Path::Plain);
        }
    }
    (op.composed(a, b), Path::Composed)
}

/// The tensor itself when contiguous, else a contiguous copy (`as_slice` needs one).
fn contiguous(t: &FlexTensor) -> FlexTensor {
    if t.is_contiguous() { t.clone() } else { t.to_contiguous() }
}

fn host_tensor(values: Vec<f32>, shape: [usize; 2]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

/// The op on an autodiff CPU tensor pair with checkpoint strategy `C`, or `None` when the
/// tensors live elsewhere.
fn on_graph<Op, C>(op: &Op, a: &Tensor<2>, b: &Tensor<2>) -> Option<Tensor<2>>
where
    Op: FusedOp,
    C: CheckpointStrategy,
    burn_dispatch::DispatchTensor: burn_dispatch::DispatchKindConversion<Autodiff<Flex, C>>,
{
    let x = a.clone().try_into_primitive::<Autodiff<Flex, C>>().ok()?;
    let y = b.clone().try_into_primitive::<Autodiff<Flex, C>>().ok()?;
    let (xs, ys) = (contiguous(x.primitive()), contiguous(y.primitive()));
    let (xv, yv) = (xs.as_slice::<f32>()?, ys.as_slice::<f32>()?);
    let shapes = [a.dims(), b.dims()];
    let out = match Node::<Op>(std::marker::PhantomData).prepare::<C>([x.node(), y.node()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (out, saved) = op.forward(xv, yv);
            let out = host_tensor(out, op.out_shape());
            prep.finish(State { op: op.clone(), inputs: [xs, ys], shapes, saved }, out)
        }
        OpsKind::UnTracked(prep) => prep.finish(host_tensor(op.without_backward().forward(xv, yv).0, op.out_shape())),
    };
    Some(Tensor::from_primitive::<Autodiff<Flex, C>>(out))
}

/// The autodiff node of a [`FusedOp`]; parents are `[a, b]`.
#[derive(Debug)]
struct Node<Op>(std::marker::PhantomData<fn() -> Op>);

/// What the node keeps for its backward.
#[derive(Debug, Clone)]
struct State<Op: FusedOp> {
    op: Op,
    inputs: [FlexTensor; 2],
    shapes: [[usize; 2]; 2],
    saved: Op::Saved,
}

impl<Op: FusedOp> Backward<Flex, 2> for Node<Op> {
    type State = State<Op>;

    fn backward(self, ops: Ops<State<Op>, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let upstream = grads.consume::<Flex>(&ops.node).to_contiguous();
        let s = &ops.state;
        let (Some(a), Some(b), Some(g)) = (s.inputs[0].as_slice::<f32>(), s.inputs[1].as_slice::<f32>(), upstream.as_slice::<f32>()) else {
            // Unreachable: the forward only registers contiguous f32 inputs, and gradients of
            // an f32 output are f32.
            return;
        };
        let want = [ops.parents[0].is_some(), ops.parents[1].is_some()];
        let out = s.op.backward(a, b, &s.saved, g, want);
        for ((parent, grad), shape) in ops.parents.iter().zip(out).zip(s.shapes) {
            if let (Some(node), Some(grad)) = (parent, grad) {
                grads.register::<Flex>(node.id, host_tensor(grad, shape));
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use burn::tensor::Device;

    /// The three CPU devices and the path each must take.
    pub(crate) fn devices() -> [(Device, Path); 3] {
        let plain = Device::flex();
        [(plain.clone().autodiff(), Path::Graph), (plain.clone().autodiff().gradient_checkpointing(), Path::Graph), (plain, Path::Plain)]
    }

    /// Gradients with respect to both inputs.
    pub(crate) type Grads = Option<(Vec<f32>, Vec<f32>)>;

    /// Output and (for autodiff devices) gradients of `Σ g ⊙ out` through `op`, on `a`, `b`.
    pub(crate) fn run(device: &Device, a: (Vec<f32>, [usize; 2]), b: (Vec<f32>, [usize; 2]), g: Vec<f32>, op: impl Fn(Tensor<2>, Tensor<2>) -> Tensor<2>) -> (Vec<f32>, Grads) {
        let leaf = |(v, shape): (Vec<f32>, [usize; 2])| {
            let t = Tensor::<2>::from_data(TensorData::new(v, shape), device);
            if device.is_autodiff() { t.require_grad() } else { t }
        };
        let (x, w) = (leaf(a), leaf(b));
        let out = op(x.clone(), w.clone());
        let shape = out.dims();
        let vals: Vec<f32> = out.clone().into_data().try_to_vec::<f32>().expect("host");
        if !device.is_autodiff() {
            return (vals, None);
        }
        let g = Tensor::<2>::from_data(TensorData::new(g, shape), device);
        let grads = (out * g).sum().backward();
        let host = |t: Tensor<2>| -> Vec<f32> { t.grad(&grads).expect("gradient").into_data().try_to_vec::<f32>().expect("host") };
        (vals, Some((host(x), host(w))))
    }

    /// `a` and `b` agree within `tol` (absolute plus relative).
    pub(crate) fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol + tol * y.abs(), "{what}[{i}]: fused {x} vs composed {y}");
        }
    }

    /// Fused and composed forms of one op agree in value and both gradients on every CPU device,
    /// and the fused form served each device.
    pub(crate) fn check_against_composed<Op: FusedOp>(op: Op, a: (Vec<f32>, [usize; 2]), b: (Vec<f32>, [usize; 2]), g: Vec<f32>, tol: f32) {
        for (device, path) in devices() {
            let fused = run(&device, a.clone(), b.clone(), g.clone(), |x, y| {
                let (out, took) = apply(op.clone(), x, y);
                assert_eq!(took, path, "{device:?}");
                out
            });
            let composed = run(&device, a.clone(), b.clone(), g.clone(), |x, y| op.composed(x, y));
            close(&fused.0, &composed.0, tol, "output");
            match (fused.1, composed.1) {
                (Some((fa, fb)), Some((ca, cb))) => {
                    close(&fa, &ca, tol, "d a");
                    close(&fb, &cb, tol, "d b");
                }
                (None, None) => {}
                _ => panic!("gradients on one path only"),
            }
        }
    }
}
