// A decode step's RMSNorm fused into the linear layer that reads it, for few rows (a decode
// step's batch, m ≤ 64) of a small model: y = epilogue(rmsnorm(x) · Wᵀ + b), without the
// normalised rows ever going to memory. On SmolLM2-135M a decode layer is ~9 kernels of a few
// microseconds each for 9 MB of weights, and each launch's latency, not its bytes, is the
// cost (0.18 of the HBM roofline on an H200, 2026-11-27): this takes the two norms and SwiGLU
// out of the chain (the norm into the QKV and gate/up projections, SwiGLU into the latter's
// epilogue). cuBLASLt has no norm prologue, hence a GEMM of our own; it is built for rows
// ≤ 64 and inputs ≤ 1024 wide, where every block can read all of x from L2 (64 × 1024 bf16 =
// 128 KB), and the host keeps cuBLASLt for everything else.
//
// The norm first: the block's warps take a row each at a time and compute its 1/rms exactly
// as rmsnorm_fwd_rows does (the same lanes, order and rounding: prelude.cuh's rms_*), into
// shared memory; then the GEMM's A operand is each loaded x value normalised and scaled by γ
// and rounded to bf16 on the way into the products — the bits the norm kernel would have
// stored — so the fused layer differs from the separate kernels only in the GEMM's order of
// summation, as two cuBLASLt algorithms would. (Folding rstd into the epilogue instead, with
// x ⊙ γ as the operand, rounds differently: a decode step's log-probs then moved by up to 0.17
// from the training forward's on the tiny fixtures, against 6e-4.)
//
// Work: a block per 16 output columns (SwiGLU: 16 gate and the 16 matching up columns), 8
// warps that split k in 32-wide steps. A lane loads 16 contiguous bytes of a weight row and of
// each x row it needs straight into registers, and the m16n8k16 products take them with k
// permuted the same way on both sides (lane t's 8 values are k = 8t … 8t+7 of the step, fed
// as two k16 products): no shared memory in the loop, every weight byte read once, by one
// lane, in one 16-byte load. The next step's loads are issued before this step's products.
// The warps' partial sums meet in shared memory and one pass does the epilogue.
#include "prelude.cuh"

#define RF_DL_WARPS 8
#define RF_DL_COLS 16  // output columns per block: two 8-column n-tiles
#define RF_DL_MAX_ROWS 64
#define RF_DL_MAX_WIDTH 1024  // k: a row is at most 4 vectors per lane

// One k step's operands of a lane: x rows (g, g + 8) of each m-tile, and each n-tile's weight row.
template <int NT>
struct DlStep {
  rf_b128 a[4][2];
  rf_b128 b[NT];
};

// Issues a k step's loads (step `s`): rows at or past m are zeros.
template <int NT>
RF_DEV void dl_load(DlStep<NT>& st, const bf16* __restrict__ x, const bf16* const* wrow, int m, int mtiles, int k, int s) {
  int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  int k0 = 32 * s + 8 * t;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) st.b[nt] = ld_b128(wrow[nt] + k0);
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int row = 16 * mt + g + 8 * h;
      st.a[mt][h] = mt < mtiles && row < m ? ld_b128(x + (size_t)row * k + k0) : rf_b128{{0u, 0u, 0u, 0u}};
    }
}

// y = rmsnorm(x; γ, eps) · Wᵀ + bias for m ≤ 64 rows of width k (k a multiple of 32) —
// SWIGLU: W holds the gate rows then the up rows (2·n of them) and y = silu(gate) · up, gate
// and up rounded to bf16 first, as the separate GEMM's output would be. `rstd_out` (may be
// null) gets each row's 1/rms. k ≤ RF_DL_MAX_WIDTH. Grid: n / 16 blocks of 256 threads; dynamic shared memory:
// 8 warps · 4 · NT · 128 f32 partials.
template <bool SWIGLU>
RF_DEV void norm_linear(bf16* __restrict__ y, float* __restrict__ rstd_out, const bf16* __restrict__ x, const bf16* __restrict__ gamma,
                        const bf16* __restrict__ w, const bf16* __restrict__ bias, int m, int n, int k, float eps) {
  constexpr int NT = SWIGLU ? 4 : 2;
  constexpr int ROWS_PER_WARP = RF_DL_MAX_ROWS / RF_DL_WARPS;
  constexpr int VECS = RF_DL_MAX_WIDTH / 8 / 32;  // 16-byte vectors of a row per lane
  RF_DYN_SMEM(smem);
  __shared__ float row_rstd[RF_DL_MAX_ROWS];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int c0 = blockIdx.x * RF_DL_COLS;
  int mtiles = (m + 15) / 16, steps = k / 32, nv = k / 8;
  // Each row's 1/rms (rows warp, warp + 8, …): every load of the warp's rows in flight at once.
  {
    rf_b128 v[ROWS_PER_WARP][VECS];
#pragma unroll
    for (int j = 0; j < ROWS_PER_WARP; ++j)
#pragma unroll
      for (int i = 0; i < VECS; ++i) {
        int row = warp + RF_DL_WARPS * j, e = lane + 32 * i;
        if (row < m && e < nv) v[j][i] = ld_b128(x + (size_t)row * k + 8 * e);
      }
#pragma unroll
    for (int j = 0; j < ROWS_PER_WARP; ++j) {
      int row = warp + RF_DL_WARPS * j;
      if (row >= m) continue;  // uniform over the warp
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < VECS; ++i)
        if (lane + 32 * i < nv) ss = rms_add_squares(ss, v[j][i], x);
      float r = rms_rstd(ss, k, eps);
      if (lane == 0) {
        row_rstd[row] = r;
        if (rstd_out && blockIdx.x == 0) rstd_out[row] = r;
      }
    }
  }
  __syncthreads();
  float rs[4][2];  // 1/rms of this lane's rows g and g + 8 of each m-tile
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int row = 16 * mt + g + 8 * h;
      rs[mt][h] = row < m ? row_rstd[row] : 0.f;
    }
  // n-tile j's weight row for this lane: gate columns c0 … c0 + 15, then (SwiGLU) up's.
  const bf16* wrow[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) wrow[nt] = w + (size_t)((nt >= 2 ? n : 0) + c0 + 8 * (nt & 1) + g) * k;
  float acc[4][NT][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
  DlStep<NT> cur = {}, nxt = {};
  int s = warp;
  if (s < steps) dl_load<NT>(cur, x, wrow, m, mtiles, k, s);
  for (; s < steps; s += RF_DL_WARPS) {
    if (s + RF_DL_WARPS < steps) dl_load<NT>(nxt, x, wrow, m, mtiles, k, s + RF_DL_WARPS);
    float gm[8];
    ld_floats16(gamma + 32 * s + 8 * t, gm);
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      if (mt >= mtiles) continue;  // uniform over the block
      uint32_t a[2][4];  // this m-tile's A words for the step's two k16 products
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float f[8];
        unpack16(cur.a[mt][h], f, x);
        for (int e = 0; e < 8; ++e) f[e] = rms_scale(f[e], rs[mt][h], gm[e]);
        // words 0, 1 (k = 8t … 8t+3) feed the first product, 2, 3 the second; row g in a[·][0]
        // and a[·][2], row g + 8 in a[·][1] and a[·][3].
        a[0][h] = pack_bf16(f[0], f[1]);
        a[0][2 + h] = pack_bf16(f[2], f[3]);
        a[1][h] = pack_bf16(f[4], f[5]);
        a[1][2 + h] = pack_bf16(f[6], f[7]);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t b0[2] = {cur.b[nt].w[0], cur.b[nt].w[1]}, b1[2] = {cur.b[nt].w[2], cur.b[nt].w[3]};
        mma_bf16(acc[mt][nt], a[0], b0);
        mma_bf16(acc[mt][nt], a[1], b1);
      }
    }
    cur = nxt;
  }
  float* part = smem;  // [warp][mt][nt][lane][4]
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) part[(((warp * 4 + mt) * NT + nt) * 32 + lane) * 4 + i] = acc[mt][nt][i];
  __syncthreads();
  // One thread per (m-tile, 8-column tile of the 16 outputs, lane): its fragment's two rows ×
  // two adjacent columns, the warps' partials summed in a fixed order, stored as .b32 pairs.
  for (int e = threadIdx.x; e < mtiles * 2 * 32; e += blockDim.x) {
    int mt = e / 64, nt = (e / 32) % 2, ln = e % 32;
    int rg = ln >> 2, tt = ln & 3;
    float sum[2][4];  // [gate, up][fragment element]
#pragma unroll
    for (int q = 0; q < (SWIGLU ? 2 : 1); ++q)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v = 0.f;
        for (int wp = 0; wp < RF_DL_WARPS; ++wp) v += part[(((wp * 4 + mt) * NT + nt + 2 * q) * 32 + ln) * 4 + i];
        sum[q][i] = v;
      }
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
          float gv = to_f(from_f<bf16>(v));
          float uv = sum[1][2 * h + j];
          if (bias) uv += to_f(bias[n + col + j]);
          uv = to_f(from_f<bf16>(uv));
          v = gv * sigmoidf(gv) * uv;
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

RF_EMU_TABLE(decode_linear, RF_EMU_PLAIN(norm_linear_bf16), RF_EMU_PLAIN(norm_linear_swiglu_bf16))
