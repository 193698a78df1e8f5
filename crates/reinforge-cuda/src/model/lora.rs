//! LoRA on the device, as PEFT computes it: after each fused GEMM of a block (q/k/v, o,
//! gate/up, down) with adapted members, `t = x·Aᵀ` for all of them at once (their `A` are
//! stacked), then each member's columns of the output gain `scale · t_j · B_jᵀ`. Two thin
//! GEMMs per member, never the `[out, in]` update. The backward gives the factors' gradients
//! only (the base weights are frozen: their gradient GEMMs are skipped, and the gradient
//! buffer holds the factors alone).
//!
//! Rollout decodes with a merged copy (`W + scale·B·A` per adapted linear, one GEMM each):
//! the decode kernels stay the plain model's, and weight sync sends a plain model.

use super::layout::{Group, Layout};
use super::DeviceModel;
use crate::error::{CudaError, Result};
use crate::gpu::{Buf, DevPtr};
use crate::ops::Operand;

impl DeviceModel {
    /// After fused GEMM `g` of block `l` wrote `y` (rows `ld_out` apart) from `x` (`n` rows):
    /// `t = x·Aᵀ`, kept for the backward, then every member's columns of `y` gain
    /// `scale · t_j · B_jᵀ`. Nothing without an adapter there.
    pub(super) fn lora_forward(&self, l: usize, g: Group, x: DevPtr, t: Option<&Buf>, y: DevPtr, n: usize) -> Result<()> {
        let Some((grp, r, scale)) = self.layout.lora_group(l, g) else { return Ok(()) };
        let t = t.ok_or_else(|| CudaError::Request("LoRA activations were not allocated".into()))?;
        let (ops, es, w) = (self.ops(), self.dt.size(), grp.width(r));
        ops.linear(x, self.p(grp.a), None, None, t.ptr, n, w, grp.input)?;
        for (j, m) in grp.members.iter().enumerate() {
            let tj = Operand { ptr: t.ptr.add(j * r * es), ld: w, trans: false };
            let bj = Operand { ptr: self.p(m.b), ld: r, trans: true };
            let yj = y.add(m.col * es);
            ops.matmul(tj, bj, Some(yj), yj, grp.ld_out, (n, m.width, r), scale, 1.0, false)?;
        }
        Ok(())
    }

    /// The backward of [`Self::lora_forward`] given `dy = ∂L/∂y` (rows `ld_out` apart): each
    /// member's `B` gradient, `A`'s, and `dx += ∂L/∂x` through the adapter (after the base
    /// GEMM's input gradient has been written there). `dt` is scratch of `n · width`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn lora_backward(&self, l: usize, g: Group, x: DevPtr, t: Option<&Buf>, dy: DevPtr, dx: DevPtr, dt: Option<&Buf>, grads: DevPtr, n: usize) -> Result<()> {
        let Some((grp, r, scale)) = self.layout.lora_group(l, g) else { return Ok(()) };
        let missing = || CudaError::Request("LoRA activations were not allocated".into());
        let (t, dt) = (t.ok_or_else(missing)?, dt.ok_or_else(missing)?);
        let (ops, es, w) = (self.ops(), self.dt.size(), grp.width(r));
        let gp = |off: usize| grads.add(off * 4);
        for (j, m) in grp.members.iter().enumerate() {
            let dyj = dy.add(m.col * es);
            // ∂L/∂B_j += scale · dy_jᵀ · t_j (f32, across micro-batches).
            let dy_t = Operand { ptr: dyj, ld: grp.ld_out, trans: true };
            let tj = Operand { ptr: t.ptr.add(j * r * es), ld: w, trans: false };
            ops.matmul(dy_t, tj, Some(gp(m.b)), gp(m.b), r, (m.width, r, n), scale, 1.0, true)?;
            // ∂L/∂t_j = scale · dy_j · B_j.
            let dy_j = Operand { ptr: dyj, ld: grp.ld_out, trans: false };
            let bj = Operand { ptr: self.p(m.b), ld: r, trans: false };
            ops.matmul(dy_j, bj, None, dt.ptr.add(j * r * es), w, (n, r, m.width), scale, 0.0, false)?;
        }
        ops.linear_dw(dt.ptr, x, gp(grp.a), n, w, grp.input)?;
        ops.linear_dx(dt.ptr, self.p(grp.a), dx, n, w, grp.input, true)
    }

    /// Elements of the widest `x·Aᵀ` of a block (0 without an adapter): the size of the
    /// backward's `dt` scratch per token.
    pub(super) fn lora_width(&self) -> usize {
        Group::ALL.iter().filter_map(|&g| self.layout.lora_group(0, g)).map(|(grp, r, _)| grp.width(r)).max().unwrap_or(0)
    }

    /// The plain model this LoRA model computes, each adapted weight merged (`W + scale·B·A`):
    /// what its rollout decodes with and what weight sync sends (a second copy of the base
    /// weights in the storage type). Refresh it after updates with [`Self::merge_into`].
    pub fn merged(&self) -> Result<DeviceModel> {
        let lora = self.layout.lora.as_ref().ok_or_else(|| CudaError::Request("this model has no LoRA adapter to merge".into()))?;
        let plain = Layout::new(&self.cfg, false);
        if plain.total + lora.base != self.layout.total {
            return Err(CudaError::Request("the LoRA layout does not end with the base model's".into()));
        }
        let es = self.dt.size();
        let params = self.gpu.alloc(plain.total * es, "merged LoRA weights for rollout", "use a smaller model or a GPU with more memory (a LoRA run keeps a merged copy of the weights for rollout)")?;
        // Everything but the adapted weights stays as the frozen base has it.
        self.gpu.copy(params.ptr, self.p(lora.base), plain.total * es)?;
        let mut m = DeviceModel::with_params(&self.gpu, self.cfg.clone(), plain, params, self.dt)?;
        m.head_chunk_rows = self.head_chunk_rows;
        self.merge_into(&m)?;
        Ok(m)
    }

    /// Rewrites the adapted weights of `into` (made by [`Self::merged`]) as `W + scale·B·A` from
    /// this model's frozen `W` and current factors.
    pub fn merge_into(&self, into: &DeviceModel) -> Result<()> {
        let lora = self.layout.lora.as_ref().ok_or_else(|| CudaError::Request("this model has no LoRA adapter to merge".into()))?;
        let (ops, r) = (self.ops(), lora.rank);
        for l in 0..self.cfg.num_layers {
            for g in Group::ALL {
                let Some((grp, ..)) = self.layout.lora_group(l, g) else { continue };
                let (base_w, merged_w) = (g.weight(&self.layout.layers[l]), g.weight(&into.layout.layers[l]));
                for (j, m) in grp.members.iter().enumerate() {
                    // Member j's rows of the fused weight: `[width, in]` from row `col`.
                    let rows = m.col * grp.input;
                    let b = Operand { ptr: self.p(m.b), ld: r, trans: false };
                    let a = Operand { ptr: self.p(grp.a + j * r * grp.input), ld: grp.input, trans: false };
                    let w = into.p(merged_w + rows);
                    ops.matmul(b, a, Some(self.p(base_w + rows)), w, grp.input, (m.width, grp.input, r), lora.scale, 1.0, false)?;
                }
            }
        }
        Ok(())
    }
}
