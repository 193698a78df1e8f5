// The optimizer step on device: the global gradient norm (deterministic: fixed partial sums,
// then one block adds them in order) and AdamW over the flat parameter buffers.
#include "prelude.cuh"

// part[b] = Σ x[i]² over the grid-stride range of block b.
RF_KERNEL void sumsq_part(float* __restrict__ part, const float* __restrict__ x, long long n) {
  __shared__ float scratch[32];
  float s = 0.f;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) s += x[i] * x[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// out[0] = Σ part[0..parts) (one block).
RF_KERNEL void sum_final(float* __restrict__ out, const float* __restrict__ part, int parts) {
  __shared__ float scratch[32];
  float s = 0.f;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) s += part[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) out[0] = s;
}

// PyTorch's (and burn's) AdamW on f32 master weights and moments, with the gradient scaled
// by `gscale` (norm clipping) first; writes the compute copy `weights` (which is `master`
// itself when T is float). bc1 = 1 − β1^t, bc2 = 1 − β2^t.
template <class T>
RF_DEV void adamw(float* master, T* weights, float* __restrict__ m, float* __restrict__ v, const float* __restrict__ g, long long n,
                  float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float gscale) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float grad = g[i] * gscale;
    float mi = b1 * m[i] + (1.f - b1) * grad;
    float vi = b2 * v[i] + (1.f - b2) * grad * grad;
    float p = master[i] * (1.f - lr * wd) - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    weights[i] = from_f<T>(p);
  }
}
RF_TYPED(adamw,
         (float* master, T* weights, float* m, float* v, const float* g, long long n, float lr, float b1, float b2, float eps, float wd,
          float bc1, float bc2, float gscale),
         (master, weights, m, v, g, n, lr, b1, b2, eps, wd, bc1, bc2, gscale))

RF_EMU_TABLE(optim, RF_EMU_PLAIN(sumsq_part), RF_EMU_PLAIN(sum_final), RF_EMU_TYPED(adamw))
