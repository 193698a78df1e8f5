// The fused LM head's per-row part: from one chunk of logits rows z (f32, the head GEMM's
// output), each row's log-probability of its target token and its entropy at temperature
// T = 1/inv_t; and in the backward, the gradient with respect to the logits, written where
// the next GEMM reads it. Only a chunk of rows exists at a time, so [tokens, vocab] logits
// never do. One block per row.
#include "prelude.cuh"

// With u = z·inv_t: lse = log Σ exp(u), lp = u_t − lse, entropy = lse − Σ p·u.
RF_KERNEL void logits_fwd(float* __restrict__ lp, float* __restrict__ ent, float* __restrict__ lse_out, const float* __restrict__ z,
                          const int* __restrict__ targets, int rows, int v, float inv_t) {
  __shared__ float sm[32], ss[32], ssu[32];
  int r = blockIdx.x;
  if (r >= rows) return;
  const float* zr = z + (size_t)r * v;
  SoftStats st;
  st.m = -RF_INF;
  st.s = st.su = 0.f;
  for (int i = threadIdx.x; i < v; i += blockDim.x) soft_add(st, scaled(zr[i], inv_t));
  st = soft_block(st, sm, ss, ssu);
  if (threadIdx.x == 0) {
    float logs = logf(st.s);
    lp[r] = __fsub_rn(scaled(zr[targets[r]], inv_t), st.m) - logs;
    ent[r] = logs - st.su / st.s;  // lse − Σp·u with both shifted by m
    lse_out[r] = st.m + logs;
  }
}

// dz_j = inv_t·(g_lp·(δ_jt − p_j) − g_ent·p_j·(log p_j + H)): the gradients of lp and of the
// entropy H with respect to the logits. `dz` may be `z` itself when T is float.
template <class T>
RF_DEV void logits_bwd(T* dz, const float* z, const int* __restrict__ targets, const float* __restrict__ lse,
                       const float* __restrict__ ent, const float* __restrict__ g_lp, const float* __restrict__ g_ent, int rows, int v,
                       float inv_t) {
  int r = blockIdx.x;
  if (r >= rows) return;
  const float* zr = z + (size_t)r * v;
  T* dr = dz + (size_t)r * v;
  float L = lse[r], H = ent[r], gl = g_lp[r], ge = g_ent[r];
  int t = targets[r];
  for (int i = threadIdx.x; i < v; i += blockDim.x) {
    float logp = __fsub_rn(scaled(zr[i], inv_t), L);
    float p = expf(logp);
    float d = gl * ((i == t ? 1.f : 0.f) - p) - ge * p * (logp + H);
    dr[i] = from_f<T>(d * inv_t);
  }
}
RF_TYPED(logits_bwd,
         (T * dz, const float* z, const int* targets, const float* lse, const float* ent, const float* g_lp, const float* g_ent, int rows,
          int v, float inv_t),
         (dz, z, targets, lse, ent, g_lp, g_ent, rows, v, inv_t))

RF_EMU_TABLE(head, RF_EMU_PLAIN(logits_fwd), RF_EMU_TYPED(logits_bwd))
