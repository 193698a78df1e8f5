// Picking the next token of every live sequence on the device: greedy, or sampling at a
// temperature with optional top-k and top-p, from one row of logits per sequence; with the
// token's log-probability under the full softmax at that temperature (the policy the actor
// recomputes, before filtering), as the CPU engine reports it.
//
// Top-k and top-p are thresholds found by radix selection (no sort): τ is the k-th largest
// u = z / T, θ the weight w = exp(u − max) at which the kept tokens' mass, heaviest first,
// first reaches top_p of the kept total; tokens with u ≥ τ and w ≥ θ are kept (ties at a
// threshold are kept together). Each threshold takes four passes over the row, one 8-bit
// digit of an order-preserving key per pass, from the top: a histogram of the digit (counts
// for τ, masses for θ) picks the bin where the running total reaches what is needed. Masses
// are fixed-point integers (units of 2⁻⁴⁰ of the largest weight), so every sum is exact and
// the same in any order: thresholds and draws do not depend on the order of atomics.
//
// The draw is an inverse CDF over the kept tokens in index order, with a 64-bit uniform from a
// counter-based generator keyed by (seed, prompt, sample, step), mixed on the host: a
// sequence's tokens do not depend on which other sequences share its batch. One block of 1024
// threads per row.
#include "prelude.cuh"

#define RF_SAMPLE_THREADS 1024
// Warps that share one radix histogram (fewer copies, less contention than one per block).
#define RF_HIST_COPIES 8

RF_DEV uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A key whose unsigned order is the float order (NaN aside).
RF_DEV uint32_t order_key(float x) {
  uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/// The float of an `order_key`.
RF_DEV float from_order_key(uint32_t k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

/// A weight w ∈ [0, 1] as an integer number of 2⁻⁴⁰: sums of a row's weights fit 64 bits.
RF_DEV uint64_t fixed_w(float w) { return (uint64_t)(w * 1099511627776.f); }

/// Sum over the block of a 64-bit integer (every thread calls it, every thread gets it).
RF_DEV uint64_t block_sum_u64(uint64_t v, uint64_t* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RF_FULL_MASK, v, o);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : 0ull;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RF_FULL_MASK, v, o);
  return v;
}

/// What a radix pass ranks: `RadixCount` — every token by u, weight 1 (top-k); `RadixMass` — the tokens
/// with u ≥ τ by w, weighted by their fixed-point weight (top-p).
enum RadixMode { RadixCount = 0, RadixMass = 1 };

/// One digit (8 bits at `shift`) of a radix selection from the top. Among the tokens whose key
/// has `prefix`'s bits above the digit, finds the digit d at which the weight of keys with a
/// digit ≥ d first reaches `*need`, and lowers `*need` by the weight of larger digits. Every
/// thread calls it and gets d. `lo` and `hi` are RF_HIST_COPIES × 256 shared counters: the
/// 32-bit halves of each bin's weight, because shared-memory atomics are native for 32 bits
/// (64-bit ones are compare-and-swap loops), and counting adds 1 (combined in hardware).
RF_DEV uint32_t radix_digit(uint32_t* lo, uint32_t* hi, uint64_t* bins, uint32_t* sh_digit, uint64_t* sh_need, const float* zr, int v,
                            float inv_t, float mx, float tau, int mode, uint32_t prefix, int shift, uint64_t* need) {
  int tid = threadIdx.x;
  for (int b = tid; b < RF_HIST_COPIES * 256; b += blockDim.x) lo[b] = hi[b] = 0u;
  __syncthreads();
  uint32_t above = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
  int copy = 256 * ((tid >> 5) % RF_HIST_COPIES);
  for (int i = tid; i < v; i += blockDim.x) {
    float u = scaled(zr[i], inv_t);
    if (mode == RadixCount) {
      uint32_t key = order_key(u);
      if ((key & above) == (prefix & above)) atomicAdd(&lo[copy + ((key >> shift) & 255u)], 1u);
    } else {
      if (!(u >= tau)) continue;
      float w = weight(u, mx);
      uint32_t key = order_key(w);
      if ((key & above) != (prefix & above)) continue;
      uint64_t wt = fixed_w(w);
      int b = copy + ((key >> shift) & 255u);
      uint32_t add = (uint32_t)wt, old = atomicAdd(&lo[b], add);
      uint32_t carry = old + add < old ? 1u : 0u;  // the low half wrapped: one more in the high half
      if ((wt >> 32) + carry) atomicAdd(&hi[b], (uint32_t)(wt >> 32) + carry);
    }
  }
  __syncthreads();
  // Fold the copies (bins spread over the threads), then one warp scans the 256 bins from
  // the top: lane l holds bins 255 − 8l … 248 − 8l.
  for (int b = tid; b < 256; b += blockDim.x) {
    uint64_t t = 0;
    for (int c = 0; c < RF_HIST_COPIES; ++c) t += ((uint64_t)hi[256 * c + b] << 32) + lo[256 * c + b];
    bins[b] = t;
  }
  __syncthreads();
  if (tid < 32) {
    uint64_t part = 0;
    for (int j = 0; j < 8; ++j) part += bins[255 - 8 * tid - j];
    uint64_t incl = part;
    for (int o = 1; o < 32; o <<= 1) {
      uint64_t t = __shfl_sync(RF_FULL_MASK, incl, (tid - o) & 31);
      if (tid >= o) incl += t;
    }
    // What is needed never exceeds what the prefix holds (the passes see the same weights);
    // clamped all the same, so some lane always hits.
    uint64_t all = __shfl_sync(RF_FULL_MASK, incl, 31);
    if (*need > all) *need = all > 0 ? all : 1ull;
    unsigned hit = __ballot_sync(RF_FULL_MASK, incl >= *need);
    int first = hit ? __ffs(hit) - 1 : 31;
    if (tid == first) {
      uint64_t cum = incl - part;
      uint32_t d = 255 - 8 * tid - 7;
      uint64_t rest = 1ull;
      for (int j = 0; j < 8; ++j) {
        int b = 255 - 8 * tid - j;
        if (cum + bins[b] >= *need) {
          d = b;
          rest = *need - cum;
          break;
        }
        cum += bins[b];
      }
      *sh_digit = d;
      *sh_need = rest;
    }
  }
  __syncthreads();
  *need = *sh_need;
  return *sh_digit;
}

RF_KERNEL void __launch_bounds__(RF_SAMPLE_THREADS, 1) sample_rows(int* __restrict__ tokens, float* __restrict__ logprobs, const float* __restrict__ z,
                           const uint64_t* __restrict__ keys, int rows, int v, float inv_t, int greedy, int top_k, float top_p) {
  __shared__ float scratch[32];
  __shared__ int best_idx[32];
  __shared__ float best_val[32];
  __shared__ int chosen;
  int r = blockIdx.x;
  if (r >= rows) return;
  const float* zr = z + (size_t)r * v;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  float mx = -RF_INF;
  for (int i = tid; i < v; i += blockDim.x) mx = fmaxf(mx, scaled(zr[i], inv_t));
  mx = block_max(mx, scratch);
  float s = 0.f;
  for (int i = tid; i < v; i += blockDim.x) s += weight(scaled(zr[i], inv_t), mx);
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
      if (i0 >= v) i0 = 0;  // a row of NaN or −∞ has no maximum: token 0, as on the CPU
      tokens[r] = i0;
      logprobs[r] = scaled(zr[i0], inv_t) - lse;
    }
    return;
  }

  __shared__ uint32_t hist_lo[RF_HIST_COPIES * 256];
  __shared__ uint32_t hist_hi[RF_HIST_COPIES * 256];
  __shared__ uint64_t bins[256];
  __shared__ uint64_t scratch64[32];
  __shared__ uint32_t sh_digit;
  __shared__ uint64_t sh_need;

  // Top-k: τ = the k-th largest u.
  float tau = -RF_INF;
  if (top_k > 0 && top_k < v) {
    uint32_t prefix = 0;
    uint64_t need = (uint64_t)top_k;
    for (int shift = 24; shift >= 0; shift -= 8) prefix |= radix_digit(hist_lo, hist_hi, bins, &sh_digit, &sh_need, zr, v, inv_t, mx, tau, RadixCount, prefix, shift, &need) << shift;
    tau = from_order_key(prefix);
    if (!(tau == tau)) tau = -RF_INF;  // never NaN: keep every token rather than none
  }
  // Top-p: θ = the weight at which the kept mass, heaviest first, reaches top_p of it.
  float theta = 0.f;
  if (top_p < 1.f) {
    uint64_t kept = 0;
    for (int i = tid; i < v; i += blockDim.x) {
      float u = scaled(zr[i], inv_t);
      if (u >= tau) kept += fixed_w(weight(u, mx));
    }
    kept = block_sum_u64(kept, scratch64);
    double want = ceil((double)top_p * (double)kept);
    uint64_t need = want < 1.0 ? 1ull : (want >= (double)kept ? kept : (uint64_t)want);
    uint32_t prefix = 0;
    for (int shift = 24; shift >= 0; shift -= 8) prefix |= radix_digit(hist_lo, hist_hi, bins, &sh_digit, &sh_need, zr, v, inv_t, mx, tau, RadixMass, prefix, shift, &need) << shift;
    theta = from_order_key(prefix);
    if (!(theta == theta)) theta = 0.f;
  }
  // Inverse CDF in index order over exact integer masses: thread t owns indices
  // [t·per, (t+1)·per), and exactly one thread's range holds the target.
  int per = (v + blockDim.x - 1) / blockDim.x;
  int lo_i = tid * per, hi_i = min(v, lo_i + per);
  uint64_t mine = 0;
  int last_kept = -1;
  for (int i = lo_i; i < hi_i; ++i) {
    float u = scaled(zr[i], inv_t);
    float w = weight(u, mx);
    if (u >= tau && w >= theta) {
      mine += fixed_w(w);
      last_kept = i;
    }
  }
  // Exclusive prefix of `mine` over threads: within the warp, then over warp totals.
  uint64_t incl = mine;
  for (int o = 1; o < 32; o <<= 1) {
    uint64_t t = __shfl_sync(RF_FULL_MASK, incl, (lane - o) & 31);
    if (lane >= o) incl += t;
  }
  __syncthreads();  // scratch64 may still be read by the top-p sum
  if (lane == 31) scratch64[warp] = incl;
  if (tid == 0) chosen = -1;
  __syncthreads();
  uint64_t before = 0, total = 0;
  for (int w = 0; w < nw; ++w) {
    if (w < warp) before += scratch64[w];
    total += scratch64[w];
  }
  uint64_t start = before + incl - mine;
  uint64_t bits = splitmix64(keys[r]);
  // Exactly uniform on [0, total): the high half of a 64 × 64-bit product.
  uint64_t target = __umul64hi(bits, total);
  if (mine > 0 && target >= start && target < start + mine) {
    uint64_t acc = start;
    int pick = last_kept;
    for (int i = lo_i; i < hi_i; ++i) {
      float u = scaled(zr[i], inv_t);
      float w = weight(u, mx);
      if (u >= tau && w >= theta) {
        acc += fixed_w(w);
        if (target < acc) {
          pick = i;
          break;
        }
      }
    }
    chosen = pick;
  }
  __syncthreads();
  // The heaviest token is always kept (w = 1 passes both thresholds), so `total` > 0 and
  // one thread chose; the guard keeps a token in range whatever happens.
  if (tid == 0) {
    int t = chosen >= 0 ? chosen : 0;
    tokens[r] = t;
    logprobs[r] = scaled(zr[t], inv_t) - lse;
  }
}

RF_EMU_TABLE(sample, RF_EMU_PLAIN(sample_rows))
