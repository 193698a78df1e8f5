// RMSNorm: y = w * x / sqrt(mean(x²) + eps), one block per row; its backward, and the
// deterministic column reduction that turns per-block partial sums into a weight gradient.
#include "prelude.cuh"

template <class T>
RF_DEV void rmsnorm_fwd(T* __restrict__ y, float* __restrict__ rstd, const T* __restrict__ x, const T* __restrict__ w,
                        int n, int h, float eps) {
  __shared__ float scratch[32];
  int row = blockIdx.x;
  if (row >= n) return;
  const T* xr = x + (size_t)row * h;
  float ss = 0.f;
  for (int i = threadIdx.x; i < h; i += blockDim.x) {
    float v = to_f(xr[i]);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  float r = rsqrtf(ss / (float)h + eps);
  if (threadIdx.x == 0 && rstd) rstd[row] = r;
  T* yr = y + (size_t)row * h;
  for (int i = threadIdx.x; i < h; i += blockDim.x) yr[i] = from_f<T>(to_f(w[i]) * (to_f(xr[i]) * r));
}
RF_TYPED(rmsnorm_fwd, (T * y, float* rstd, const T* x, const T* w, int n, int h, float eps), (y, rstd, x, w, n, h, eps))

// The forward with a warp per row and the row held in registers, in 16-byte accesses: x is
// read once (rmsnorm_fwd reads it twice, around a block-wide reduction), and the sum of
// squares is a warp's shuffles, with no barrier. For rows of a multiple of 16 bytes, up to
// RF_NORM_VECS vectors per lane (4096 bf16, 2048 f32), and 16-byte aligned x, y and w; the host
// picks rmsnorm_fwd otherwise. A decode step's 64 rows took rmsnorm_fwd about 7 µs on an H200
// (2026-11-27), 58 GB/s. Grid: ⌈n / warps per block⌉.
#define RF_NORM_VECS 16
template <class T>
RF_DEV void rmsnorm_fwd_rows(T* __restrict__ y, float* __restrict__ rstd, const T* __restrict__ x, const T* __restrict__ w, int n, int h,
                             float eps) {
  constexpr int VEC = 16 / sizeof(T);
  int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= n) return;  // whole warps
  int nv = h / VEC;
  const T* xr = x + (size_t)row * h;
  rf_b128 v[RF_NORM_VECS];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < RF_NORM_VECS; ++i) {
    int e = lane + 32 * i;
    if (e >= nv) continue;
    v[i] = ld_b128(xr + e * VEC);
    ss = rms_add_squares(ss, v[i], xr);
  }
  float r = rms_rstd(ss, h, eps);
  if (lane == 0 && rstd) rstd[row] = r;
  T* yr = y + (size_t)row * h;
#pragma unroll
  for (int i = 0; i < RF_NORM_VECS; ++i) {
    int e = lane + 32 * i;
    if (e >= nv) continue;
    float f[VEC], g[VEC];
    unpack16(v[i], f, xr);
    unpack16(ld_b128(w + e * VEC), g, w);
    for (int k = 0; k < VEC; ++k) f[k] = rms_scale(f[k], r, g[k]);
    st_b128(yr + e * VEC, pack16(f, yr));
  }
}
RF_TYPED(rmsnorm_fwd_rows, (T * y, float* rstd, const T* x, const T* w, int n, int h, float eps), (y, rstd, x, w, n, h, eps))

// With x̂ = x·r and g = dy ⊙ w: dx = r·(g − x̂·mean(g ⊙ x̂)), dw = Σ_rows dy ⊙ x̂.
// Block b handles rows b, b + gridDim.x, ... and owns row b of `dw_part` ([gridDim.x, h]),
// which it overwrites; reduce_rows then sums the partials in a fixed order (no atomics, so
// the gradient is the same bits every run). A thread's partial sums stay in registers for the
// first RF_NORM_REGS · blockDim.x columns (hidden sizes up to 2048 at 256 threads) and are
// written once; wider rows add the rest to `dw_part` row by row. `accumulate`: dx += instead
// of dx =.
#define RF_NORM_REGS 8

// dx of element i of a row (written), and its dw term.
template <class T>
RF_DEV float rms_dx_at(T* dr, const T* xr, const T* gr, const T* w, int i, float r, float mean, int accumulate) {
  float xh = to_f(xr[i]) * r;
  float g = to_f(gr[i]);
  float v = r * (g * to_f(w[i]) - xh * mean);
  if (accumulate) v += to_f(dr[i]);
  dr[i] = from_f<T>(v);
  return g * xh;
}

template <class T>
RF_DEV void rmsnorm_bwd(T* __restrict__ dx, float* __restrict__ dw_part, const T* __restrict__ dy,
                        const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ rstd, int n, int h,
                        int accumulate) {
  __shared__ float scratch[32];
  float* part = dw_part + (size_t)blockIdx.x * h;
  int wide = RF_NORM_REGS * blockDim.x;  // columns from here on are summed in `part`
  for (int i = wide + threadIdx.x; i < h; i += blockDim.x) part[i] = 0.f;
  float acc[RF_NORM_REGS];
#pragma unroll
  for (int c = 0; c < RF_NORM_REGS; ++c) acc[c] = 0.f;
  for (int row = blockIdx.x; row < n; row += gridDim.x) {
    const T* xr = x + (size_t)row * h;
    const T* gr = dy + (size_t)row * h;
    float r = rstd[row];
    float dot = 0.f;
    for (int i = threadIdx.x; i < h; i += blockDim.x) dot += to_f(gr[i]) * to_f(w[i]) * to_f(xr[i]) * r;
    float mean = block_sum(dot, scratch) / (float)h;
    T* dr = dx + (size_t)row * h;
#pragma unroll
    for (int c = 0; c < RF_NORM_REGS; ++c) {
      int i = threadIdx.x + c * blockDim.x;
      if (i < h) acc[c] += rms_dx_at(dr, xr, gr, w, i, r, mean, accumulate);
    }
    for (int i = wide + threadIdx.x; i < h; i += blockDim.x) part[i] += rms_dx_at(dr, xr, gr, w, i, r, mean, accumulate);
  }
#pragma unroll
  for (int c = 0; c < RF_NORM_REGS; ++c) {
    int i = threadIdx.x + c * blockDim.x;
    if (i < h) part[i] = acc[c];
  }
}
RF_TYPED(rmsnorm_bwd,
         (T * dx, float* dw_part, const T* dy, const T* x, const T* w, const float* rstd, int n, int h, int accumulate),
         (dx, dw_part, dy, x, w, rstd, n, h, accumulate))

// rmsnorm_bwd for rows of whole 16-byte vectors, up to RF_NORM_BWD_VECS per thread (4096 bf16,
// 2048 f32 at 256 threads), every pointer 16-byte aligned (the host picks rmsnorm_bwd
// otherwise): x and dy move in vectors and are read once per row, held in registers between
// the row's reduction and its dx; w is read once per block. Each block owns row blockIdx.x of
// `dw_part` and its rows are summed in the same order as rmsnorm_bwd's; a row's dot product
// is not (so which kernel runs, which alignment decides, can change dx's last bits; the same
// buffers give the same bits every run). rmsnorm_bwd's element loads ran the 1.5B train
// step's backward norms at 0.7 TB/s on an H200 (2026-11-27).
#define RF_NORM_BWD_VECS 2
template <class T>
RF_DEV void rmsnorm_bwd_vec(T* __restrict__ dx, float* __restrict__ dw_part, const T* __restrict__ dy,
                            const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ rstd, int n, int h,
                            int accumulate) {
  constexpr int VEC = 16 / sizeof(T);
  __shared__ float scratch[32];
  int nv = h / VEC;
  float wf[RF_NORM_BWD_VECS][VEC], acc[RF_NORM_BWD_VECS][VEC];
#pragma unroll
  for (int c = 0; c < RF_NORM_BWD_VECS; ++c) {
    int e = threadIdx.x + c * blockDim.x;
    for (int k = 0; k < VEC; ++k) acc[c][k] = wf[c][k] = 0.f;
    if (e < nv) ld_floats16(w + e * VEC, wf[c]);
  }
  for (int row = blockIdx.x; row < n; row += gridDim.x) {
    const T* xr = x + (size_t)row * h;
    const T* gr = dy + (size_t)row * h;
    float r = rstd[row];
    float xf[RF_NORM_BWD_VECS][VEC], gf[RF_NORM_BWD_VECS][VEC];
    float dot = 0.f;
#pragma unroll
    for (int c = 0; c < RF_NORM_BWD_VECS; ++c) {
      int e = threadIdx.x + c * blockDim.x;
      if (e >= nv) continue;
      ld_floats16(xr + e * VEC, xf[c]);
      ld_floats16(gr + e * VEC, gf[c]);
      for (int k = 0; k < VEC; ++k) dot += gf[c][k] * wf[c][k] * xf[c][k] * r;
    }
    float mean = block_sum(dot, scratch) / (float)h;
    T* dr = dx + (size_t)row * h;
#pragma unroll
    for (int c = 0; c < RF_NORM_BWD_VECS; ++c) {
      int e = threadIdx.x + c * blockDim.x;
      if (e >= nv) continue;
      float o[VEC];
      if (accumulate) ld_floats16(dr + e * VEC, o);
      for (int k = 0; k < VEC; ++k) {
        float xh = xf[c][k] * r;
        float v = r * (gf[c][k] * wf[c][k] - xh * mean);
        o[k] = accumulate ? v + o[k] : v;
        acc[c][k] += gf[c][k] * xh;
      }
      st_b128(dr + e * VEC, pack16(o, dr));
    }
  }
  float* part = dw_part + (size_t)blockIdx.x * h;
#pragma unroll
  for (int c = 0; c < RF_NORM_BWD_VECS; ++c) {
    int e = threadIdx.x + c * blockDim.x;
    if (e < nv)
      for (int k = 0; k < VEC; ++k) part[e * VEC + k] = acc[c][k];
  }
}
RF_TYPED(rmsnorm_bwd_vec,
         (T * dx, float* dw_part, const T* dy, const T* x, const T* w, const float* rstd, int n, int h, int accumulate),
         (dx, dw_part, dy, x, w, rstd, n, h, accumulate))

// out[j] (+)= Σ_p part[p, j] over p = 0..parts-1, in a fixed order (the same bits every run).
// A block of 8 warps owns 32 columns, a lane one column: warp w sums the parts p ≡ w (mod 8)
// in order (each step a coalesced 128-byte read), then one warp adds the 8 sums in order.
// Grid: ⌈cols / 32⌉ blocks of 256 threads.
RF_KERNEL void reduce_rows_f32(float* __restrict__ out, const float* __restrict__ part, int parts, int cols,
                               int accumulate) {
  __shared__ float sums[8][32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int j = blockIdx.x * 32 + lane;
  float s = 0.f;
  if (j < cols)
    for (int p = warp; p < parts; p += nw) s += part[(size_t)p * cols + j];
  sums[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && j < cols) {
    float t = 0.f;
    for (int w = 0; w < nw; ++w) t += sums[w][lane];
    out[j] = accumulate ? out[j] + t : t;
  }
}

RF_EMU_TABLE(rmsnorm, RF_EMU_TYPED(rmsnorm_fwd), RF_EMU_TYPED(rmsnorm_fwd_rows), RF_EMU_TYPED(rmsnorm_bwd), RF_EMU_TYPED(rmsnorm_bwd_vec),
             RF_EMU_PLAIN(reduce_rows_f32))
