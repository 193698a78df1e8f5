// Picking the next token of every live sequence on the device: greedy, or sampling at a
// temperature with optional top-k and top-p, from one row of logits per sequence; with the
// token's log-probability under the full softmax at that temperature (the policy the actor
// recomputes, before filtering), as the CPU engine reports it.
//
// Top-k and top-p are thresholds found by bisection (no sort): keep u ≥ τ where τ is the
// largest value with at least k tokens at or above it; then keep the tokens whose weight is
// at or above the largest θ whose kept mass still reaches top_p. The draw is an inverse CDF
// over the kept tokens in index order, with a uniform from a counter-based generator keyed
// by (seed, prompt, sample, step), mixed on the host: a sequence's tokens do not depend on
// which other sequences share its batch. One block of 1024 threads per row.
#include "prelude.cuh"

#define RF_SAMPLE_THREADS 1024

RF_DEV uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

RF_DEV float block_min(float v, float* scratch) { return -block_max(-v, scratch); }

RF_KERNEL void sample_rows(int* __restrict__ tokens, float* __restrict__ logprobs, const float* __restrict__ z,
                           const uint64_t* __restrict__ keys, int rows, int v, float inv_t, int greedy, int top_k, float top_p) {
  __shared__ float scratch[32];
  __shared__ float wsum[32];
  __shared__ int best_idx[32];
  __shared__ float best_val[32];
  __shared__ int chosen;
  int r = blockIdx.x;
  if (r >= rows) return;
  const float* zr = z + (size_t)r * v;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  float mx = -RF_INF;
  for (int i = tid; i < v; i += blockDim.x) mx = fmaxf(mx, zr[i] * inv_t);
  mx = block_max(mx, scratch);
  float s = 0.f;
  for (int i = tid; i < v; i += blockDim.x) s += expf(zr[i] * inv_t - mx);
  float lse = mx + logf(block_sum(s, scratch));

  if (greedy) {
    // Argmax, the lowest index among equal maxima (as the CPU engine's scan).
    float bv = -RF_INF;
    int bi = 0x7fffffff;
    for (int i = tid; i < v; i += blockDim.x) {
      float x = zr[i];
      if (x > bv) {
        bv = x;
        bi = i;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(RF_FULL_MASK, bv, o);
      int oi = __shfl_xor_sync(RF_FULL_MASK, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      best_val[warp] = bv;
      best_idx[warp] = bi;
    }
    __syncthreads();
    if (tid == 0) {
      float v0 = best_val[0];
      int i0 = best_idx[0];
      for (int w = 1; w < nw; ++w)
        if (best_val[w] > v0 || (best_val[w] == v0 && best_idx[w] < i0)) {
          v0 = best_val[w];
          i0 = best_idx[w];
        }
      tokens[r] = i0;
      logprobs[r] = zr[i0] * inv_t - lse;
    }
    return;
  }

  // Top-k: τ = the largest value with at least k tokens at or above it.
  float tau = -RF_INF;
  if (top_k > 0 && top_k < v) {
    float lo = RF_INF;
    for (int i = tid; i < v; i += blockDim.x) lo = fminf(lo, zr[i] * inv_t);
    lo = block_min(lo, scratch);
    float hi = mx;
    for (int it = 0; it < 40; ++it) {
      float mid = 0.5f * (lo + hi);
      float c = 0.f;
      for (int i = tid; i < v; i += blockDim.x) c += zr[i] * inv_t >= mid ? 1.f : 0.f;
      c = block_sum(c, scratch);
      if (c >= (float)top_k) lo = mid;
      else hi = mid;
    }
    tau = lo;
  }
  // Weights relative to the max; the kept mass.
  float kept = 0.f;
  for (int i = tid; i < v; i += blockDim.x) {
    float u = zr[i] * inv_t;
    if (u >= tau) kept += expf(u - mx);
  }
  kept = block_sum(kept, scratch);
  // Top-p: θ = the largest weight threshold whose mass reaches top_p of the kept mass.
  float theta = 0.f;
  if (top_p < 1.f) {
    float lo = 0.f, hi = 1.f;
    for (int it = 0; it < 40; ++it) {
      float mid = 0.5f * (lo + hi);
      float m = 0.f;
      for (int i = tid; i < v; i += blockDim.x) {
        float u = zr[i] * inv_t;
        float w = expf(u - mx);
        if (u >= tau && w >= mid) m += w;
      }
      m = block_sum(m, scratch);
      if (m >= top_p * kept) lo = mid;
      else hi = mid;
    }
    theta = lo;
    kept = 0.f;
    for (int i = tid; i < v; i += blockDim.x) {
      float u = zr[i] * inv_t;
      float w = expf(u - mx);
      if (u >= tau && w >= theta) kept += w;
    }
    kept = block_sum(kept, scratch);
  }
  uint64_t bits = splitmix64(keys[r]);
  float target = (float)(bits >> 40) * (1.0f / 16777216.0f) * kept;
  // Inverse CDF in index order: thread t owns indices [t·per, (t+1)·per).
  int per = (v + blockDim.x - 1) / blockDim.x;
  int lo_i = tid * per, hi_i = min(v, lo_i + per);
  float mine = 0.f;
  int last_kept = -1;
  for (int i = lo_i; i < hi_i; ++i) {
    float u = zr[i] * inv_t;
    float w = expf(u - mx);
    if (u >= tau && w >= theta) {
      mine += w;
      last_kept = i;
    }
  }
  // Exclusive prefix of `mine` over threads: within the warp, then over warp totals.
  float incl = mine;
  for (int o = 1; o < 32; o <<= 1) {
    float t = __shfl_sync(RF_FULL_MASK, incl, (lane - o) & 31);
    if (lane >= o) incl += t;
  }
  if (lane == 31) wsum[warp] = incl;
  if (tid == 0) chosen = -1;
  __syncthreads();
  float before = 0.f;
  for (int w = 0; w < warp; ++w) before += wsum[w];
  float start = before + incl - mine;
  if (mine > 0.f && target >= start && target < start + mine) {
    float acc = start;
    int pick = last_kept;
    for (int i = lo_i; i < hi_i; ++i) {
      float u = zr[i] * inv_t;
      float w = expf(u - mx);
      if (u >= tau && w >= theta) {
        acc += w;
        if (target < acc) {
          pick = i;
          break;
        }
      }
    }
    chosen = pick;
  }
  __syncthreads();
  // Rounding can leave the target past the last prefix: take the last kept token then.
  float lk = block_max((float)last_kept, scratch);
  if (tid == 0) {
    int t = chosen >= 0 ? chosen : (int)lk;
    tokens[r] = t;
    logprobs[r] = zr[t] * inv_t - lse;
  }
}

RF_EMU_TABLE(sample, RF_EMU_PLAIN(sample_rows))
