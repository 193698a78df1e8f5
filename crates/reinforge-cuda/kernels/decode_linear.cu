// A decode step's RMSNorm fused into the linear layer that reads it, for few rows (a decode
// step's batch, m ≤ 64) of a small model: y = epilogue(rmsnorm(x) · Wᵀ + b), without the
// normalised rows ever going to memory. On SmolLM2-135M a decode layer is ~9 kernels of a few
// microseconds each for 9 MB of weights, and each launch's latency, not its bytes, is the
// cost (0.18 of the HBM roofline on an H200, 2026-11-27): this takes the two norms and SwiGLU
// out of the chain (the norm into the QKV and gate/up projections, SwiGLU into the latter's
// epilogue). cuBLASLt has no norm prologue, hence a GEMM of our own; it is built for rows
// ≤ 64 and inputs ≤ 1024 wide, where a block holds all of x, normalised, in shared memory
// (64 × 576 bf16 = 74 KB on SmolLM2; the host keeps it within the 96 KB every sm_80+ GPU gives
// a block), and the host keeps cuBLASLt for everything else.
//
// The norm first: the block's warps take a row each at a time, compute its 1/rms exactly as
// rmsnorm_fwd_rows does (the same lanes, order and rounding: prelude.cuh's rms_*), and store
// the row normalised and scaled by γ, rounded to bf16 — the bits the norm kernel would have
// stored — into shared memory, once per block. The fused layer then differs from the separate
// kernels only in the GEMM's order of summation, as two cuBLASLt algorithms would. (Folding
// rstd into the epilogue instead, with x ⊙ γ as the operand, rounds differently: a decode
// step's log-probs then moved by up to 0.17 from the training forward's on the tiny fixtures,
// against 6e-4.)
//
// Work: a block per 16 output columns (SwiGLU: 16 gate and the 16 matching up columns), 8
// warps that split k in 32-wide steps (at most 4 each: k ≤ 1024). Each lane issues every
// weight load of its steps first — 16 contiguous bytes of a weight row per step and n-tile,
// straight into registers — so the weights stream from HBM while the norm runs; every weight
// byte is read once, by one lane. The m16n8k16 products take a step's 8 values of lane t
// (k = 8t … 8t+7) with k permuted the same way on both sides, A's from the normalised rows in
// shared memory. The warps' partial sums meet in shared memory (over the rows, after a
// barrier) and one pass sums them in a fixed order and does the epilogue.
#include "prelude.cuh"

#define RF_DL_WARPS 8
#define RF_DL_COLS 16  // output columns per block: two 8-column n-tiles
#define RF_DL_MAX_ROWS 64
#define RF_DL_MAX_WIDTH 1024  // k: a row is at most 4 vectors per lane, a warp at most 4 steps
// bf16 per shared row of k columns (k a multiple of 32): padded so that rows g and g + 1 are
// 64 bytes apart in the banks (a row of 32·odd columns takes 64 more).
RF_DEV int dl_lda(int k) { return k + 32 + (k & 32); }
#define RF_DL_SPLIT 512       // linear_rows: most of k a block takes (2 steps a warp; 64 rows = 69.6 KB)

// This lane's weight fragments for its warp's k steps (step s = warp + 8j of the block's, while
// s < steps, starting at column k0 of each weight row): for each 8-column n-tile nt, 16
// contiguous bytes of row c0 + 8·(nt & 1) + g (n-tiles 2 and 3: the up rows, n further on).
template <int STEPS, int NT>
RF_DEV void dl_load_w(rf_b128 (&wb)[STEPS][NT], const bf16* __restrict__ w, int n, int k, int c0, int k0, int steps, int warp, int g, int t) {
#pragma unroll
  for (int j = 0; j < STEPS; ++j) {
    int s = warp + RF_DL_WARPS * j;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const bf16* wrow = w + (size_t)((nt >= 2 ? n : 0) + c0 + 8 * (nt & 1) + g) * k;
      wb[j][nt] = s < steps ? ld_b128(wrow + k0 + 32 * s + 8 * t) : rf_b128{{0u, 0u, 0u, 0u}};
    }
  }
}

// acc = A · Wᵀ over this warp's steps: A's rows from shared memory (`as`, row stride lda, the
// block's k from its column 0), W from the fragments dl_load_w left in registers.
template <int STEPS, int NT>
RF_DEV void dl_products(float (&acc)[4][NT][4], const rf_b128 (&wb)[STEPS][NT], const bf16* as, int lda, int m, int steps, int warp, int g, int t) {
  int mtiles = (m + 15) / 16;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
#pragma unroll
  for (int j = 0; j < STEPS; ++j) {
    int s = warp + RF_DL_WARPS * j;
    if (s >= steps) continue;  // uniform over the warp
    int k0 = 32 * s + 8 * t;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      if (mt >= mtiles) continue;  // uniform over the block
      int r0 = 16 * mt + g, r1 = r0 + 8;
      rf_b128 a0 = r0 < m ? ld_b128(as + (size_t)r0 * lda + k0) : rf_b128{{0u, 0u, 0u, 0u}};
      rf_b128 a1 = r1 < m ? ld_b128(as + (size_t)r1 * lda + k0) : rf_b128{{0u, 0u, 0u, 0u}};
      // Words 0, 1 (k = 8t … 8t+3) feed the first product, 2, 3 the second; row g in a[0] and
      // a[2], row g + 8 in a[1] and a[3].
      uint32_t p0[4] = {a0.w[0], a1.w[0], a0.w[1], a1.w[1]}, p1[4] = {a0.w[2], a1.w[2], a0.w[3], a1.w[3]};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t b0[2] = {wb[j][nt].w[0], wb[j][nt].w[1]}, b1[2] = {wb[j][nt].w[2], wb[j][nt].w[3]};
        mma_bf16(acc[mt][nt], p0, b0);
        mma_bf16(acc[mt][nt], p1, b1);
      }
    }
  }
}

// The warps' partial sums into shared memory ([warp][mt][nt][lane][4], a lane's four in one
// 16-byte store), over whatever was there: the caller has a barrier before and after.
template <int NT>
RF_DEV void dl_store_partials(float* part, const float (&acc)[4][NT][4], int warp, int lane) {
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      st_b128(part + (((warp * 4 + mt) * NT + nt) * 32 + lane) * 4,
              rf_b128{{__float_as_uint(acc[mt][nt][0]), __float_as_uint(acc[mt][nt][1]), __float_as_uint(acc[mt][nt][2]), __float_as_uint(acc[mt][nt][3])}});
}

// Fragment (mt, nt, lane ln)'s four sums over the warps, in a fixed order (warp 0 first).
template <int NT>
RF_DEV void dl_sum_partials(float (&sum)[4], const float* part, int mt, int nt, int ln) {
  sum[0] = sum[1] = sum[2] = sum[3] = 0.f;
  for (int wp = 0; wp < RF_DL_WARPS; ++wp) {
    float pv[4];
    unpack16(ld_b128(part + (((wp * 4 + mt) * NT + nt) * 32 + ln) * 4), pv, part);
    for (int i = 0; i < 4; ++i) sum[i] += pv[i];
  }
}

// y = rmsnorm(x; γ, eps) · Wᵀ + bias for m ≤ 64 rows of width k (a multiple of 32, at most
// RF_DL_MAX_WIDTH) — SWIGLU: W holds the gate rows then the up rows (2·n of them) and
// y = silu(gate) · up, gate and up rounded to bf16 first, as the separate GEMM's output would
// be. `rstd_out` (may be null) gets each row's 1/rms. Grid: n / 16 blocks of 256 threads;
// dynamic shared memory: max(m · dl_lda(k) bf16, 8 warps · 4 · NT · 128 f32).
template <bool SWIGLU>
RF_DEV void norm_linear(bf16* __restrict__ y, float* __restrict__ rstd_out, const bf16* __restrict__ x, const bf16* __restrict__ gamma,
                        const bf16* __restrict__ w, const bf16* __restrict__ bias, int m, int n, int k, float eps) {
  constexpr int NT = SWIGLU ? 4 : 2;
  constexpr int VECS = RF_DL_MAX_WIDTH / 8 / 32;               // 16-byte vectors of a row per lane
  constexpr int STEPS = RF_DL_MAX_WIDTH / 32 / RF_DL_WARPS;    // k steps per warp
  constexpr int ROWS_AT_ONCE = 4;                              // rows a warp normalises together
  RF_DYN_SMEM(smem);
  bf16* as = reinterpret_cast<bf16*>(smem);  // [m][dl_lda(k)]: the normalised rows
  int lda = dl_lda(k);
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int c0 = blockIdx.x * RF_DL_COLS;
  int mtiles = (m + 15) / 16, steps = k / 32, nv = k / 8;
  grid_release();
  // Every weight load of this lane's steps, in flight from the start (as a dependent launch,
  // while the kernel before still runs: weights are not the step's to write).
  rf_b128 wb[STEPS][NT];
  dl_load_w<STEPS, NT>(wb, w, n, k, c0, 0, steps, warp, g, t);
  // The norm, a warp per row (rows warp, warp + 8, …), ROWS_AT_ONCE rows' loads in flight.
  rf_b128 gv[VECS];
#pragma unroll
  for (int i = 0; i < VECS; ++i) gv[i] = lane + 32 * i < nv ? ld_b128(gamma + 8 * (lane + 32 * i)) : rf_b128{{0u, 0u, 0u, 0u}};
  grid_wait();  // x is the kernel before's output
#pragma unroll
  for (int j0 = 0; j0 < RF_DL_MAX_ROWS / RF_DL_WARPS; j0 += ROWS_AT_ONCE) {
    rf_b128 v[ROWS_AT_ONCE][VECS];
#pragma unroll
    for (int j = 0; j < ROWS_AT_ONCE; ++j)
#pragma unroll
      for (int i = 0; i < VECS; ++i) {
        int row = warp + RF_DL_WARPS * (j0 + j), e = lane + 32 * i;
        v[j][i] = row < m && e < nv ? ld_b128(x + (size_t)row * k + 8 * e) : rf_b128{{0u, 0u, 0u, 0u}};
      }
#pragma unroll
    for (int j = 0; j < ROWS_AT_ONCE; ++j) {
      int row = warp + RF_DL_WARPS * (j0 + j);
      if (row >= m) continue;  // uniform over the warp
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < VECS; ++i)
        if (lane + 32 * i < nv) ss = rms_add_squares(ss, v[j][i], x);
      float r = rms_rstd(ss, k, eps);
      if (lane == 0 && rstd_out && blockIdx.x == 0) rstd_out[row] = r;
#pragma unroll
      for (int i = 0; i < VECS; ++i) {
        int e = lane + 32 * i;
        if (e >= nv) continue;
        float f[8], gm[8];
        unpack16(v[j][i], f, x);
        unpack16(gv[i], gm, gamma);
        for (int q = 0; q < 8; ++q) f[q] = rms_scale(f[q], r, gm[q]);
        st_b128(as + (size_t)row * lda + 8 * e, pack16(f, as));
      }
    }
  }
  __syncthreads();
  float acc[4][NT][4];
  dl_products<STEPS, NT>(acc, wb, as, lda, m, steps, warp, g, t);
  __syncthreads();  // every warp is done with the rows: the partials go over them
  float* part = smem;
  dl_store_partials<NT>(part, acc, warp, lane);
  __syncthreads();
  // One thread per (m-tile, 8-column tile of the 16 outputs, lane): its fragment's two rows ×
  // two adjacent columns, the warps' partials summed in a fixed order, stored as .b32 pairs.
  for (int e = threadIdx.x; e < mtiles * 2 * 32; e += blockDim.x) {
    int mt = e / 64, nt = (e / 32) % 2, ln = e % 32;
    int rg = ln >> 2, tt = ln & 3;
    float sum[2][4] = {};  // [gate, up][fragment element]
#pragma unroll
    for (int q = 0; q < (SWIGLU ? 2 : 1); ++q) dl_sum_partials<NT>(sum[q], part, mt, nt + 2 * q, ln);
    int col = c0 + 8 * nt + 2 * tt;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int row = 16 * mt + rg + 8 * h;
      if (row >= m) continue;
      float o[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float v = sum[0][2 * h + j];
        if (bias) v += to_f(bias[col + j]);
        if (SWIGLU) {
          // gate and up as the separate GEMM would have stored them, then SwiGLU's kernel's math
          float gt = to_f(from_f<bf16>(v));
          float up = sum[1][2 * h + j];
          if (bias) up += to_f(bias[n + col + j]);
          up = to_f(from_f<bf16>(up));
          v = gt * sigmoidf(gt) * up;
        }
        o[j] = v;
      }
      st_b32(y + (size_t)row * n + col, pack_bf16(o[0], o[1]));
    }
  }
}
RF_KERNEL void norm_linear_bf16(bf16* y, float* rstd, const bf16* x, const bf16* gamma, const bf16* w, const bf16* bias, int m, int n, int k,
                                float eps) {
  norm_linear<false>(y, rstd, x, gamma, w, bias, m, n, k, eps);
}
RF_KERNEL void norm_linear_swiglu_bf16(bf16* y, float* rstd, const bf16* x, const bf16* gamma, const bf16* w, const bf16* bias, int m, int n,
                                       int k, float eps) {
  norm_linear<true>(y, rstd, x, gamma, w, bias, m, n, k, eps);
}

// The linear layers after attention and after SwiGLU (o_proj, down), for the same few rows:
// y = x · Wᵀ (+ bias) (+ residual). cuBLASLt took 6.6–7.9 µs for each of these on SmolLM2
// whatever their size (eager profile, H200): its tiles leave most SMs idle at 64 rows and
// 576 outputs. Here a block takes 16 output columns of one split of k (at most RF_DL_SPLIT
// wide), so 576 outputs still fill the GPU: the host picks the splits. The block's weights go
// to registers as in norm_linear, while its slice of x goes to shared memory by cp.async (it
// is in L2: the kernel before wrote it), then the same products and warp sums.
//
// With one split, the block adds bias and residual and stores. With more, each block writes
// its f32 partial tile to `part` ([split][m][n]), counts itself in done[column block], and
// the block that completes the count sums the splits in split order (so the bits do not
// depend on which block came last), does the epilogue and sets the count back to zero.
template <int STEPS>
RF_DEV void linear_rows(bf16* __restrict__ y, float* __restrict__ part, unsigned* __restrict__ done, const bf16* __restrict__ x,
                        const bf16* __restrict__ w, const bf16* __restrict__ bias, const bf16* __restrict__ res, int m, int n, int k,
                        int k_split) {
  RF_DYN_SMEM(smem);
  __shared__ int last;  // whether this block completes its column block's splits
  bf16* as = reinterpret_cast<bf16*>(smem);  // [m][dl_lda(k_split)]: this split's columns of x
  int lda = dl_lda(k_split);
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int c0 = blockIdx.x * RF_DL_COLS, kb = blockIdx.y * k_split, splits = gridDim.y;
  int kw = min(k_split, k - kb), steps = kw / 32, vecs = kw / 8, mtiles = (m + 15) / 16;
  grid_release();
  rf_b128 wb[STEPS][2];
  dl_load_w<STEPS, 2>(wb, w, n, k, c0, kb, steps, warp, g, t);
  grid_wait();  // x is the kernel before's output
  for (int e = threadIdx.x; e < m * vecs; e += blockDim.x) {
    int row = e / vecs, v = e % vecs;
    cp_async16(as + (size_t)row * lda + 8 * v, x + (size_t)row * k + kb + 8 * v);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  float acc[4][2][4];
  dl_products<STEPS, 2>(acc, wb, as, lda, m, steps, warp, g, t);
  __syncthreads();  // every warp is done with x: the partials go over it
  float* wpart = smem;
  dl_store_partials<2>(wpart, acc, warp, lane);
  __syncthreads();
  // One thread per (m-tile, n-tile, lane) fragment: two rows × two adjacent columns.
  int e = threadIdx.x, mt = e / 64, nt = (e / 32) % 2, ln = e % 32;
  bool mine = e < mtiles * 64;
  int col = c0 + 8 * nt + 2 * (ln & 3), row0 = 16 * mt + (ln >> 2);
  float sum[4] = {0.f, 0.f, 0.f, 0.f};
  if (mine) dl_sum_partials<2>(sum, wpart, mt, nt, ln);
  if (splits > 1) {  // uniform over the launch
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (mine && row0 + 8 * h < m)
        for (int j = 0; j < 2; ++j) part[((size_t)blockIdx.y * m + row0 + 8 * h) * n + col + j] = sum[2 * h + j];
    __threadfence();  // this block's tile is visible device-wide before it is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&done[blockIdx.x], 1u) == (unsigned)(splits - 1);
    __syncthreads();
    if (!last) return;  // uniform over the block
    __threadfence();  // the other splits' tiles are read after their counts were seen
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (mine && row0 + 8 * h < m)
        for (int j = 0; j < 2; ++j) {
          float v = 0.f;
#pragma unroll 4
          for (int sp = 0; sp < splits; ++sp) v += ld_cg(part + ((size_t)sp * m + row0 + 8 * h) * n + col + j);
          sum[2 * h + j] = v;
        }
    if (threadIdx.x == 0) done[blockIdx.x] = 0u;  // ready for the next launch
  }
  if (!mine) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int row = row0 + 8 * h;
    if (row >= m) continue;
    float o[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float v = sum[2 * h + j];
      if (bias) v += to_f(bias[col + j]);
      if (res) v += to_f(res[(size_t)row * n + col + j]);
      o[j] = v;
    }
    st_b32(y + (size_t)row * n + col, pack_bf16(o[0], o[1]));
  }
}
RF_KERNEL void linear_rows_bf16(bf16* y, float* part, unsigned* done, const bf16* x, const bf16* w, const bf16* bias, const bf16* res, int m,
                                int n, int k, int k_split) {
  linear_rows<RF_DL_SPLIT / 32 / RF_DL_WARPS>(y, part, done, x, w, bias, res, m, n, k, k_split);
}

RF_EMU_TABLE(decode_linear, RF_EMU_PLAIN(norm_linear_bf16), RF_EMU_PLAIN(norm_linear_swiglu_bf16), RF_EMU_PLAIN(linear_rows_bf16))
