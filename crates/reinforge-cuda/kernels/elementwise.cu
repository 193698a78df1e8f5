// Small per-element and per-row kernels: casts, embedding lookup and its gradient, row
// gather/scatter, RoPE, SwiGLU, column sums (bias gradients), the value head.
#include "prelude.cuh"

// ---- casts and fills ----------------------------------------------------------------------

template <class T>
RF_DEV void cast_from_f32(T* __restrict__ out, const float* __restrict__ in, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = from_f<T>(in[i]);
}
RF_TYPED(cast_from_f32, (T * out, const float* in, long long n), (out, in, n))

template <class T>
RF_DEV void cast_to_f32(float* __restrict__ out, const T* __restrict__ in, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = to_f(in[i]);
}
RF_TYPED(cast_to_f32, (float* out, const T* in, long long n), (out, in, n))

// y += a·x
template <class T>
RF_DEV void axpy(T* __restrict__ y, const T* __restrict__ x, float a, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] = from_f<T>(to_f(y[i]) + a * to_f(x[i]));
}
RF_TYPED(axpy, (T * y, const T* x, float a, long long n), (y, x, a, n))

RF_KERNEL void scale_f32(float* __restrict__ x, float a, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    x[i] *= a;
}

// ---- embedding ------------------------------------------------------------------------------

// out[r] = table[id]; one block per row. id = ids[r], except where `from` is given and
// from[r] >= 0: then id = prev[from[r]], the token the previous decode step sampled for that
// row, still on the device (the host queues a step before it has read the last one's tokens).
template <class T>
RF_DEV void embed_fwd(T* __restrict__ out, const T* __restrict__ table, const int* __restrict__ ids,
                      const int* __restrict__ from, const int* __restrict__ prev, int n, int h) {
  int r = blockIdx.x;
  if (r >= n) return;
  int id = ids[r];
  if (from != nullptr && from[r] >= 0) id = prev[from[r]];
  const T* src = table + (size_t)id * h;
  T* dst = out + (size_t)r * h;
  for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = src[i];
}
RF_TYPED(embed_fwd, (T * out, const T* table, const int* ids, const int* from, const int* prev, int n, int h),
         (out, table, ids, from, prev, n, h))

// dtable[uniq[b]] += Σ dx[rows[offs[b] .. offs[b+1]]], one block per distinct token id, rows
// summed in a fixed order: no atomics, so the gradient has the same bits every run. The
// host sorts the batch's positions by token id (it has the ids anyway).
template <class T>
RF_DEV void embed_bwd(float* __restrict__ dtable, const T* __restrict__ dx, const int* __restrict__ uniq,
                      const int* __restrict__ offs, const int* __restrict__ rows, int n_uniq, int h) {
  int b = blockIdx.x;
  if (b >= n_uniq) return;
  float* dst = dtable + (size_t)uniq[b] * h;
  int lo = offs[b], hi = offs[b + 1];
  for (int i = threadIdx.x; i < h; i += blockDim.x) {
    float s = 0.f;
    for (int j = lo; j < hi; ++j) s += to_f(dx[(size_t)rows[j] * h + i]);
    dst[i] += s;
  }
}
RF_TYPED(embed_bwd, (float* dtable, const T* dx, const int* uniq, const int* offs, const int* rows, int n_uniq, int h),
         (dtable, dx, uniq, offs, rows, n_uniq, h))

// ---- rows -----------------------------------------------------------------------------------

// out[r] = in[idx[r]] (rows of width h; ld = h for both).
template <class T>
RF_DEV void gather_rows(T* __restrict__ out, const T* __restrict__ in, const int* __restrict__ idx, int n, int h) {
  int r = blockIdx.x;
  if (r >= n) return;
  const T* src = in + (size_t)idx[r] * h;
  T* dst = out + (size_t)r * h;
  for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = src[i];
}
RF_TYPED(gather_rows, (T * out, const T* in, const int* idx, int n, int h), (out, in, idx, n, h))

// out[idx[r]] = in[r] (`accumulate`: +=); indices are distinct, so no two blocks share a row.
template <class T>
RF_DEV void scatter_rows(T* __restrict__ out, const T* __restrict__ in, const int* __restrict__ idx, int n, int h,
                         int accumulate) {
  int r = blockIdx.x;
  if (r >= n) return;
  const T* src = in + (size_t)r * h;
  T* dst = out + (size_t)idx[r] * h;
  for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = from_f<T>(to_f(src[i]) + (accumulate ? to_f(dst[i]) : 0.f));
}
RF_TYPED(scatter_rows, (T * out, const T* in, const int* idx, int n, int h, int accumulate), (out, in, idx, n, h, accumulate))

// ---- RoPE -----------------------------------------------------------------------------------

// Rotates the first `heads` heads of each row (q then k in the fused qkv row, stride
// `stride`) in place, HF's rotate_half layout: pair (x[i], x[i + hd/2]) by angle
// pos·inv_freq[i], with cos/sin read from a table [max_pos, hd/2] computed on the host in
// f64 (as the CPU engine does). `inverse` rotates by −angle: the backward of the rotation.
template <class T>
RF_DEV void rope(T* __restrict__ x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                 const int* __restrict__ pos, int n, int heads, int hd, int stride, int inverse) {
  int r = blockIdx.x;
  if (r >= n) return;
  int half = hd / 2;
  int p = pos[r];
  const float* cr = cos_t + (size_t)p * half;
  const float* sr = sin_t + (size_t)p * half;
  T* row = x + (size_t)r * stride;
  for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
    int hh = j / half, i = j % half;
    T ya, yb;
    rope_pair(row + hh * hd, i, half, cr[i], inverse ? -sr[i] : sr[i], &ya, &yb);
  }
}
RF_TYPED(rope, (T * x, const float* cos_t, const float* sin_t, const int* pos, int n, int heads, int hd, int stride, int inverse),
         (x, cos_t, sin_t, pos, n, heads, hd, stride, inverse))

// ---- SwiGLU ---------------------------------------------------------------------------------

// out[r, j] = silu(gu[r, j]) · gu[r, I + j]: the gate and up projections side by side in one
// GEMM output row of width 2I. Rows are blockIdx.y (grid-stride), a row's columns the x
// threads, in 16-byte vectors when `vec` (the host's word: I a multiple of the vector width,
// every pointer 16-byte aligned), else one element at a time. A flat index over n·I cost a
// 64-bit division per element: the 1.5B train step's swiglu ran at 1.6 TB/s on an H200
// (2026-11-27).
template <class T>
RF_DEV void swiglu_fwd(T* __restrict__ out, const T* __restrict__ gu, int n, int inter, int vec) {
  constexpr int VEC = 16 / sizeof(T);
  int width = vec ? inter / VEC : inter;
  for (long long r = blockIdx.y; r < n; r += gridDim.y) {  // long: n may be near INT_MAX
    const T* g = gu + (size_t)r * 2 * inter;
    const T* u = g + inter;
    T* o = out + (size_t)r * inter;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x) {
      if (vec) {
        float gf[VEC], uf[VEC];
        ld_floats16(g + c * VEC, gf);
        ld_floats16(u + c * VEC, uf);
        for (int k = 0; k < VEC; ++k) gf[k] = gf[k] * sigmoidf(gf[k]) * uf[k];
        st_b128(o + c * VEC, pack16(gf, o));
      } else {
        float gv = to_f(g[c]), uv = to_f(u[c]);
        o[c] = from_f<T>(gv * sigmoidf(gv) * uv);
      }
    }
  }
}
RF_TYPED(swiglu_fwd, (T * out, const T* gu, int n, int inter, int vec), (out, gu, n, inter, vec))

// dgate = dout · u · silu'(g), dup = dout · silu(g), with silu'(g) = s·(1 + g·(1 − s)); the
// forward's grid and vectors.
template <class T>
RF_DEV void swiglu_bwd(T* __restrict__ dgu, const T* __restrict__ gu, const T* __restrict__ dout, int n, int inter, int vec) {
  constexpr int VEC = 16 / sizeof(T);
  int width = vec ? inter / VEC : inter;
  for (long long r = blockIdx.y; r < n; r += gridDim.y) {  // long: n may be near INT_MAX
    size_t gi = (size_t)r * 2 * inter, ui = gi + inter;
    const T* dr = dout + (size_t)r * inter;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x) {
      if (vec) {
        float gf[VEC], uf[VEC], df[VEC];
        ld_floats16(gu + gi + c * VEC, gf);
        ld_floats16(gu + ui + c * VEC, uf);
        ld_floats16(dr + c * VEC, df);
        for (int k = 0; k < VEC; ++k) {
          float s = sigmoidf(gf[k]);
          float dg = df[k] * uf[k] * s * (1.f + gf[k] * (1.f - s));
          uf[k] = df[k] * gf[k] * s;
          gf[k] = dg;
        }
        st_b128(dgu + gi + c * VEC, pack16(gf, dgu));
        st_b128(dgu + ui + c * VEC, pack16(uf, dgu));
      } else {
        float g = to_f(gu[gi + c]), u = to_f(gu[ui + c]), d = to_f(dr[c]);
        float s = sigmoidf(g);
        dgu[gi + c] = from_f<T>(d * u * s * (1.f + g * (1.f - s)));
        dgu[ui + c] = from_f<T>(d * g * s);
      }
    }
  }
}
RF_TYPED(swiglu_bwd, (T * dgu, const T* gu, const T* dout, int n, int inter, int vec), (dgu, gu, dout, n, inter, vec))

// ---- column sums (bias and value-head gradients) ---------------------------------------------

// part[p, j] = Σ_{rows r of part p} w[r]·x[r, j] (w = nullptr: 1), rows split into gridDim.y
// contiguous parts; reduce_rows_f32 (rmsnorm.cu) then adds the parts in order.
template <class T>
RF_DEV void col_sum_part(float* __restrict__ part, const T* __restrict__ x, const float* __restrict__ w, int n, int cols,
                         int ld) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  int parts = gridDim.y, p = blockIdx.y;
  int per = (n + parts - 1) / parts;
  int lo = p * per, hi = min(n, lo + per);
  float s = 0.f;
  for (int r = lo; r < hi; ++r) s += (w ? w[r] : 1.f) * to_f(x[(size_t)r * ld + j]);
  part[(size_t)p * cols + j] = s;
}
RF_TYPED(col_sum_part, (float* part, const T* x, const float* w, int n, int cols, int ld), (part, x, w, n, cols, ld))

// ---- value head -----------------------------------------------------------------------------

// values[r] = h[r] · w (one warp per row).
template <class T>
RF_DEV void value_fwd(float* __restrict__ values, const T* __restrict__ h, const T* __restrict__ w, int n, int hd) {
  int warps = blockDim.x / 32;
  int r = blockIdx.x * warps + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (r >= n) return;  // the whole warp leaves together
  float s = 0.f;
  for (int i = lane; i < hd; i += 32) s += to_f(h[(size_t)r * hd + i]) * to_f(w[i]);
  s = warp_sum(s);
  if (lane == 0) values[r] = s;
}
RF_TYPED(value_fwd, (float* values, const T* h, const T* w, int n, int hd), (values, h, w, n, hd))

// dh[r, i] = g[r]·w[i]
template <class T>
RF_DEV void value_bwd(T* __restrict__ dh, const float* __restrict__ g, const T* __restrict__ w, int n, int hd) {
  int r = blockIdx.x;
  if (r >= n) return;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) dh[(size_t)r * hd + i] = from_f<T>(g[r] * to_f(w[i]));
}
RF_TYPED(value_bwd, (T * dh, const float* g, const T* w, int n, int hd), (dh, g, w, n, hd))

RF_EMU_TABLE(elementwise, RF_EMU_TYPED(cast_from_f32), RF_EMU_TYPED(cast_to_f32), RF_EMU_TYPED(axpy), RF_EMU_PLAIN(scale_f32),
             RF_EMU_TYPED(embed_fwd), RF_EMU_TYPED(embed_bwd), RF_EMU_TYPED(gather_rows), RF_EMU_TYPED(scatter_rows),
             RF_EMU_TYPED(rope), RF_EMU_TYPED(swiglu_fwd), RF_EMU_TYPED(swiglu_bwd), RF_EMU_TYPED(col_sum_part),
             RF_EMU_TYPED(value_fwd), RF_EMU_TYPED(value_bwd))
