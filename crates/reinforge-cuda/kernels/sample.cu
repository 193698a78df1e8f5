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
// sequence's tokens do not depend on which other sequences share its batch. One block of 512
// threads per row, each thread with RF_ROW_BATCH groups of four in flight. Without top-k and
// top-p a row is read twice: once for the softmax's statistics (and, greedy, the argmax: then
// once in all), once for the draw; rows whose length is a multiple of 4 in 16-byte loads.
#include "prelude.cuh"

// 512 threads of up to 128 registers: room for RF_ROW_BATCH groups of four each (1024 threads
// get 64 registers, which spilled at 4 groups).
#define RF_SAMPLE_THREADS 512
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

/// The exact mass of logit x in the draw: its fixed-point weight when kept (u ≥ τ, w ≥ θ), else 0.
RF_DEV uint64_t mass_of(float x, float inv_t, float mx, float tau, float theta) {
  float u = scaled(x, inv_t);
  float w = weight(u, mx);
  return (u >= tau && w >= theta) ? fixed_w(w) : 0ull;
}

/// The four logits at i, i+1, i+2, i+3 (i a multiple of 4) of a row of length v: one 16-byte
/// load when v is a multiple of 4 (the row is then 16-byte aligned), else one by one; past
/// the row, −∞ (no mass, never the max).
RF_DEV void row4(const float* zr, int i, int v, float* x) {
  if (v % 4 == 0 && i < v) {
    ld_floats16(zr + i, x);
    return;
  }
  for (int t = 0; t < 4; ++t) x[t] = i + t < v ? zr[i + t] : -RF_INF;
}

// Groups of four a thread reads before it uses any: one block per row leaves each SM with a
// single row, so the loads a thread keeps in flight are what sets the speed. One at a time
// (the loop's work waits on each) read a 152k-token row at about 16 GB/s a block: 73 µs a
// step for the two passes of plain sampling on an H200 (2026-11-27).
#define RF_ROW_BATCH 8

/// Calls f(i, x) for the groups of four x at i = 4·t, 4·(t + blockDim), … of a row of length
/// v (thread t), in that order, with RF_ROW_BATCH groups' loads issued before the first call.
template <class F>
RF_DEV void for_row4(const float* zr, int v, F f) {
  int stride = 4 * blockDim.x;
  for (int i0 = 4 * threadIdx.x; i0 < v; i0 += RF_ROW_BATCH * stride) {
    float x[RF_ROW_BATCH][4];
#pragma unroll
    for (int u = 0; u < RF_ROW_BATCH; ++u) row4(zr, i0 + u * stride, v, x[u]);
#pragma unroll
    for (int u = 0; u < RF_ROW_BATCH; ++u)
      if (i0 + u * stride < v) f(i0 + u * stride, x[u]);
  }
}

/// Sum over the warp of a 64-bit integer, to every lane.
RF_DEV uint64_t warp_sum_u64(uint64_t v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RF_FULL_MASK, v, o);
  return v;
}

/// Inclusive prefix sum over the warp's lanes of a 64-bit integer.
RF_DEV uint64_t warp_scan_u64(uint64_t v) {
  int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    uint64_t t = __shfl_sync(RF_FULL_MASK, v, (lane - o) & 31);
    if (lane >= o) v += t;
  }
  return v;
}

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
  for_row4(zr, v, [&](int i0, const float* x) {
    for (int t = 0; t < 4; ++t) {
      float u = scaled(x[t], inv_t);
      if (mode == RadixCount) {
        if (i0 + t >= v) continue;  // past the row (its −∞ padding would be counted)
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
  });
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

// Steps a warp reads its part of a row in, for the draw (see below): their masses stay in
// shared memory, so the warp that holds the target finds it without reading its part again.
#define RF_DRAW_STEPS 64

RF_KERNEL void __launch_bounds__(RF_SAMPLE_THREADS, 1) sample_rows(int* __restrict__ tokens, float* __restrict__ logprobs, const float* __restrict__ z,
                           const uint64_t* __restrict__ keys, int rows, int v, float inv_t, int greedy, int top_k, float top_p) {
  __shared__ float sm[32], ss[32], ssu[32];
  __shared__ int best_idx[32];
  __shared__ float best_val[32];
  __shared__ int chosen;
  int r = blockIdx.x;
  if (r >= rows) return;
  const float* zr = z + (size_t)r * v;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  // The softmax's statistics in one read of the row (and the argmax with them when greedy):
  // thread t takes the groups of four at 4t, 4(t + blockDim), ...
  SoftStats st;
  st.m = -RF_INF;
  st.s = st.su = 0.f;
  float bv = -RF_INF;
  int bi = 0x7fffffff;
  for_row4(zr, v, [&](int i, const float* x) {
    for (int t = 0; t < 4 && i + t < v; ++t) {
      soft_add(st, scaled(x[t], inv_t));
      if (greedy && x[t] > bv) {  // this thread's indices rise: the first of equal maxima stays
        bv = x[t];
        bi = i + t;
      }
    }
  });
  st = soft_block(st, sm, ss, ssu);
  float mx = st.m;
  float lse = mx + logf(st.s);

  if (greedy) {
    // Argmax, the lowest index among equal maxima (as the CPU engine's scan).
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
    for_row4(zr, v, [&](int, const float* x) {
      for (int t = 0; t < 4; ++t) {
        float u = scaled(x[t], inv_t);
        if (u >= tau) kept += fixed_w(weight(u, mx));
      }
    });
    kept = block_sum_u64(kept, scratch64);
    double want = ceil((double)top_p * (double)kept);
    uint64_t need = want < 1.0 ? 1ull : (want >= (double)kept ? kept : (uint64_t)want);
    uint32_t prefix = 0;
    for (int shift = 24; shift >= 0; shift -= 8) prefix |= radix_digit(hist_lo, hist_hi, bins, &sh_digit, &sh_need, zr, v, inv_t, mx, tau, RadixMass, prefix, shift, &need) << shift;
    theta = from_order_key(prefix);
    if (!(theta == theta)) theta = 0.f;
  }
  // The draw: the first token, in index order, at which the kept mass reaches a uniform
  // target in [0, total). Warp w owns the contiguous part [w·span, (w+1)·span) of the row and
  // reads it in `steps` steps of 128·k tokens — lane l the groups of four at 4l, 4l + 128, …
  // of each step, so every load is coalesced — keeping each step's mass in shared memory.
  __shared__ uint64_t step_mass[RF_SAMPLE_THREADS / 32][RF_DRAW_STEPS];
  int per_warp = (v + nw - 1) / nw;
  int k = max(1, (per_warp + 128 * RF_DRAW_STEPS - 1) / (128 * RF_DRAW_STEPS));
  int step_len = 128 * k, steps = (per_warp + step_len - 1) / step_len;
  long long w0 = (long long)warp * steps * step_len;
  // RF_ROW_BATCH steps at a time, each step's loads issued before any is summed (masses are
  // integers: their sums do not depend on the order).
  uint64_t mine = 0;
  for (int j0 = 0; j0 < steps; j0 += RF_ROW_BATCH) {
    uint64_t m[RF_ROW_BATCH];
#pragma unroll
    for (int u = 0; u < RF_ROW_BATCH; ++u) m[u] = 0;
    for (int q = 0; q < k; ++q) {
      float x[RF_ROW_BATCH][4];
#pragma unroll
      for (int u = 0; u < RF_ROW_BATCH; ++u) {
        long long i = w0 + (long long)(j0 + u) * step_len + q * 128 + 4 * lane;
        row4(zr, j0 + u < steps && i < v ? (int)i : v, v, x[u]);  // past the part or row: −∞, no mass
      }
#pragma unroll
      for (int u = 0; u < RF_ROW_BATCH; ++u)
        for (int t = 0; t < 4; ++t) m[u] += mass_of(x[u][t], inv_t, mx, tau, theta);
    }
#pragma unroll
    for (int u = 0; u < RF_ROW_BATCH; ++u) {
      if (j0 + u >= steps) break;  // uniform over the warp
      uint64_t s = warp_sum_u64(m[u]);
      if (lane == 0) step_mass[warp][j0 + u] = s;
      mine += s;
    }
  }
  __syncthreads();  // scratch64 may still be read by the top-p sum; step_mass is written
  if (lane == 0) scratch64[warp] = mine;
  if (tid == 0) chosen = -1;
  __syncthreads();
  uint64_t before = 0, total = 0;
  for (int w = 0; w < nw; ++w) {
    if (w < warp) before += scratch64[w];
    total += scratch64[w];
  }
  uint64_t bits = splitmix64(keys[r]);
  // Exactly uniform on [0, total): the high half of a 64 × 64-bit product.
  uint64_t target = __umul64hi(bits, total);
  if (mine > 0 && target >= before && target < before + mine) {  // one warp, uniform in it
    // Its step: lanes scan the step masses (two per lane), the first whose running sum
    // passes the target.
    uint64_t rest = target - before;
    uint64_t a = lane < steps ? step_mass[warp][lane] : 0ull, b = lane + 32 < steps ? step_mass[warp][lane + 32] : 0ull;
    uint64_t ia = warp_scan_u64(a);
    uint64_t ib = warp_scan_u64(b) + __shfl_sync(RF_FULL_MASK, ia, 31);
    unsigned hit_a = __ballot_sync(RF_FULL_MASK, ia > rest), hit_b = __ballot_sync(RF_FULL_MASK, ib > rest);
    int j = hit_a ? __ffs(hit_a) - 1 : (hit_b ? 32 + __ffs(hit_b) - 1 : steps - 1);
    uint64_t upto = j < 32 ? __shfl_sync(RF_FULL_MASK, ia, j) : __shfl_sync(RF_FULL_MASK, ib, j - 32);
    rest -= upto - step_mass[warp][j];
    // In step j, lane l scans the 4k tokens [s0 + 4k·l, s0 + 4k·(l + 1)) in order.
    long long s0 = w0 + (long long)j * step_len + 4LL * k * lane;
    uint64_t lm = 0;
    for (int t = 0; t < 4 * k && s0 + t < v; ++t) lm += mass_of(zr[s0 + t], inv_t, mx, tau, theta);
    uint64_t incl = warp_scan_u64(lm);
    if (lm > 0 && rest >= incl - lm && rest < incl) {
      uint64_t acc = incl - lm;
      int pick = -1;
      for (int t = 0; t < 4 * k && s0 + t < v; ++t) {
        acc += mass_of(zr[s0 + t], inv_t, mx, tau, theta);
        if (rest < acc) {
          pick = (int)(s0 + t);
          break;
        }
      }
      chosen = pick;
    }
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
