// The fused LM head's per-row part: from one chunk of logits rows z (f32, the head GEMM's
// output), each row's log-probability of its target token and its entropy at temperature
// T = 1/inv_t; and in the backward, the gradient with respect to the logits, written where
// the next GEMM reads it. Only a chunk of rows exists at a time, so [tokens, vocab] logits
// never do. One block per row.
#include "prelude.cuh"

// The softmax statistics of a set of u in one pass: the largest u (m), Σ e^(u−m) (s) and
// Σ e^(u−m)·(u−m) (su). A chunk of logits rows is far larger than L2, so a second pass over
// a row (max first, then sums) would read it from HBM again. s = 0: nothing yet.
struct SoftStats {
  float m, s, su;
};

RF_DEV void soft_add(SoftStats& a, float u) {
  if (u > a.m) {
    if (a.s > 0.f) {  // a new max: rescale what is there to it
      float d = __fsub_rn(a.m, u), c = expf(d);
      a.su = c * (a.su + a.s * d);
      a.s = c * a.s;
    }
    a.m = u;
  }
  float d = __fsub_rn(u, a.m), e = expf(d);
  a.s += e;
  a.su += e * d;
}

/// The statistics of the union of two sets.
RF_DEV SoftStats soft_merge(SoftStats a, SoftStats b) {
  if (b.s == 0.f) return a;
  if (a.s == 0.f) return b;
  float m = fmaxf(a.m, b.m);
  float da = __fsub_rn(a.m, m), db = __fsub_rn(b.m, m);
  float ca = expf(da), cb = expf(db);
  SoftStats r;
  r.m = m;
  r.s = ca * a.s + cb * b.s;
  r.su = ca * (a.su + a.s * da) + cb * (b.su + b.s * db);
  return r;
}

/// `v` merged over the warp into lane 0 (a fixed tree, so the same bits every run).
RF_DEV SoftStats soft_warp(SoftStats v) {
  for (int o = 16; o > 0; o >>= 1) {
    SoftStats w;
    w.m = __shfl_down_sync(RF_FULL_MASK, v.m, o);
    w.s = __shfl_down_sync(RF_FULL_MASK, v.s, o);
    w.su = __shfl_down_sync(RF_FULL_MASK, v.su, o);
    v = soft_merge(v, w);
  }
  return v;
}

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
  st = soft_warp(st);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) {
    sm[warp] = st.m;
    ss[warp] = st.s;
    ssu[warp] = st.su;
  }
  __syncthreads();
  if (warp == 0) {
    st.m = lane < nw ? sm[lane] : -RF_INF;
    st.s = lane < nw ? ss[lane] : 0.f;
    st.su = lane < nw ? ssu[lane] : 0.f;
    st = soft_warp(st);
    if (lane == 0) {
      float logs = logf(st.s);
      lp[r] = __fsub_rn(scaled(zr[targets[r]], inv_t), st.m) - logs;
      ent[r] = logs - st.su / st.s;  // lse − Σp·u with both shifted by m
      lse_out[r] = st.m + logs;
    }
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
