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

// With x̂ = x·r and g = dy ⊙ w: dx = r·(g − x̂·mean(g ⊙ x̂)), dw = Σ_rows dy ⊙ x̂.
// Block b handles rows b, b + gridDim.x, ... and owns row b of `dw_part` ([gridDim.x, h]),
// which it overwrites; reduce_rows then sums the partials in a fixed order (no atomics, so
// the gradient is the same bits every run). `accumulate`: dx += instead of dx =.
template <class T>
RF_DEV void rmsnorm_bwd(T* __restrict__ dx, float* __restrict__ dw_part, const T* __restrict__ dy,
                        const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ rstd, int n, int h,
                        int accumulate) {
  __shared__ float scratch[32];
  float* part = dw_part + (size_t)blockIdx.x * h;
  for (int i = threadIdx.x; i < h; i += blockDim.x) part[i] = 0.f;
  for (int row = blockIdx.x; row < n; row += gridDim.x) {
    const T* xr = x + (size_t)row * h;
    const T* gr = dy + (size_t)row * h;
    float r = rstd[row];
    float dot = 0.f;
    for (int i = threadIdx.x; i < h; i += blockDim.x) dot += to_f(gr[i]) * to_f(w[i]) * to_f(xr[i]) * r;
    float mean = block_sum(dot, scratch) / (float)h;
    T* dr = dx + (size_t)row * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
      float xh = to_f(xr[i]) * r;
      float g = to_f(gr[i]);
      float v = r * (g * to_f(w[i]) - xh * mean);
      if (accumulate) v += to_f(dr[i]);
      dr[i] = from_f<T>(v);
      part[i] += g * xh;
    }
  }
}
RF_TYPED(rmsnorm_bwd,
         (T * dx, float* dw_part, const T* dy, const T* x, const T* w, const float* rstd, int n, int h, int accumulate),
         (dx, dw_part, dy, x, w, rstd, n, h, accumulate))

// out[j] (+)= Σ_p part[p, j] for p = 0..parts-1 in order; one thread per column.
RF_KERNEL void reduce_rows_f32(float* __restrict__ out, const float* __restrict__ part, int parts, int cols,
                               int accumulate) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float s = 0.f;
  for (int p = 0; p < parts; ++p) s += part[(size_t)p * cols + j];
  out[j] = accumulate ? out[j] + s : s;
}

RF_EMU_TABLE(rmsnorm, RF_EMU_TYPED(rmsnorm_fwd), RF_EMU_TYPED(rmsnorm_bwd), RF_EMU_PLAIN(reduce_rows_f32))
