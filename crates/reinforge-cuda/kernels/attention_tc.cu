// Causal self-attention over packed variable-length sequences on tensor cores (bf16 operands,
// f32 accumulation; mma.sync m16n8k16, prelude.cuh): the training forward and backward of
// attention.cu's CUDA-core kernels, with the same contract — the same `qkv`, `out`, `lse`
// (natural log) and `dqkv` layouts — for bf16 and head dims 16, 32, 64, 128 (`name_d<HD>`).
// The CUDA-core kernels remain for f32 and other head dims.
//
// Work is split into tiles of 64 rows of one sequence: `tiles[6t..6t+6] = (s0, len, off, ps,
// plen, x)`: the sequence's first row and length, the tile's offset in it, and the sequence's
// shared prefix — `plen` rows from row `ps` that it continues (samples of one prompt packed
// after one copy of it: the continuation sees all of the prefix, then itself causally, at
// positions plen, plen + 1, …) or `plen` = 0. A sequence that others continue lists them at
// `tiles[x] = m, (rs, rlen) × m` (x = −1: none), lists stored after the tiles (`x` indexes the
// whole buffer, so the grid need not be the tile count). In the forward and dq a query tile reads keys in the continuation's virtual order
// (prefix rows, then its own); dk/dv of a prefix's key tile also sum over every continuation's
// queries, which all see it. A block is 4 warps; warp w owns rows
// 16w … 16w+15 of the tile (queries in the forward and dq, keys in dk/dv), and every product
// a warp computes is 16 rows × (8-column tiles). The head dim is a template constant, so the
// fragment arrays stay in registers. The fragment helpers and the shared-memory padding are
// in prelude.cuh (the decode kernel in paged.cu uses them too).
#include "prelude.cuh"

#define TC_ROWS 64     // rows per tile, 16 per warp
#define TC_KEYS 64     // keys per chunk in the forward
#define TC_DQ_KEYS 32  // keys per chunk in dq (two more 16×32 products live in registers)
#define TC_DK_QS 32    // queries per chunk in dk/dv

// Copies virtual rows [r0, r0 + NROWS) of a sequence of two bf16 matrices — columns
// [col_a, col_a + HD) of `a` (row stride `lda`) and [col_b, col_b + HD) of `b` (stride `ldb`),
// such as a head's keys and values — into shared rows of stride HD + TC_PAD: virtual row j is
// row ps + j for j < plen (the shared prefix) and s0 + j − plen after it; rows at or past
// `end` are zeros. Strides and columns are multiples of HD ≥ 16, so every copy is one aligned
// 16-byte cp.async, and all of a thread's copies are in flight at once, held in no register,
// in the group the caller's next cp_async_commit closes (the rows past `end` are stored at
// once). The loads these kernels had before (.b32 loads of one element pair at a time, each
// stored before the next, nothing in flight while a chunk was computed) left them at about a
// tenth of FlashAttention-2's rate on an H200 (2026-11-27): about 20 µs per 64-key chunk of the
// forward by its profile, where the chunk's mma work takes about 1 µs. Needs the kernels' 128
// threads.
#define TC_THREADS 128
template <int HD, int NROWS>
RF_DEV void tc_copy2(bf16* da, const bf16* __restrict__ a, int lda, int col_a, bf16* db, const bf16* __restrict__ b, int ldb, int col_b,
                     int s0, int ps, int plen, int r0, int end) {
  constexpr int ld = HD + TC_PAD, VPR = HD / 8, N = (NROWS * VPR + TC_THREADS - 1) / TC_THREADS;
#ifdef RF_EMU
  if (blockDim.x != TC_THREADS) ::rf_emu::misuse("tc_copy2 needs the tensor-core kernels' 128 threads per block");
#endif
#pragma unroll
  for (int i = 0; i < N; ++i) {
    int e = threadIdx.x + i * TC_THREADS;
    if (e >= NROWS * VPR) continue;
    int r = e / VPR, c = (e % VPR) * 8;
    int row = r0 + r;
    if (row < end) {
      int phys = row < plen ? ps + row : s0 + row - plen;
      cp_async16(da + r * ld + c, a + (size_t)phys * lda + col_a + c);
      cp_async16(db + r * ld + c, b + (size_t)phys * ldb + col_b + c);
    } else {
      st_b128(da + r * ld + c, rf_b128{{0u, 0u, 0u, 0u}});
      st_b128(db + r * ld + c, rf_b128{{0u, 0u, 0u, 0u}});
    }
  }
}

// Streams a sequence's keys and values — virtual rows [0, kend), as tc_copy2 maps them, of
// columns `kcol` and `vcol` of `qkv` — through shared memory in chunks of KEYS rows, calling
// `body(kc, ks, vs)` on each chunk with the block's threads together (tc_pipeline, prelude.cuh; `kv`: two
// buffers of KEYS keys then KEYS values, rows of HD + TC_PAD).
template <int HD, int KEYS, class Body>
RF_DEV void tc_stream_kv(bf16* kv, const bf16* __restrict__ qkv, int ldq, int kcol, int vcol, int s0, int ps, int plen, int kend,
                         Body body) {
  constexpr int ld = HD + TC_PAD;
  tc_pipeline<TcSync::Block>(
      0, [&](int kc) { return kc < kend; }, [&](int kc) { return kc + KEYS; },
      [&](int kc, int buf) {
        bf16* ks = kv + buf * 2 * KEYS * ld;
        tc_copy2<HD, KEYS>(ks, qkv, ldq, kcol, ks + KEYS * ld, qkv, ldq, vcol, s0, ps, plen, kc, kend);
      },
      [&](int kc, int buf) {
        const bf16* ks = kv + buf * 2 * KEYS * ld;
        body(kc, ks, ks + KEYS * ld);
      });
}

// Forward: out = softmax(scale · q·kᵀ, causal) · v and lse per (head, row). Grid: tiles × nh.
// Dynamic shared memory: 2 · 2 · 64 · (HD + 8) bf16 (keys and values, double-buffered).
template <int HD>
RF_DEV void attn_tc_fwd(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv, const int* __restrict__ tiles,
                        int n, int nh, int kvh, int ldq, float scale) {
  constexpr int ld = HD + TC_PAD;
  RF_DYN_SMEM(smem);
  bf16* kv = reinterpret_cast<bf16*>(smem);  // two buffers of [64][ld] keys, then [64][ld] values
  int tile = blockIdx.x, h = blockIdx.y;
  const int* T = tiles + 6 * tile;
  int s0 = T[0], len = T[1], off = T[2], ps = T[3], plen = T[4];
  int kh = h / (nh / kvh);
  int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  int q0 = off + 16 * warp;
  uint32_t qf[HD / 16][4];
  tc_rows_a<HD>(qf, qkv, s0, q0, len, ldq, h * HD);
  float o[HD / 8][4];
#pragma unroll
  for (int nd = 0; nd < HD / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
  float m[2] = {-RF_INF, -RF_INF}, l[2] = {0.f, 0.f};
  float sl2 = scale * RF_LOG2E;  // scores in log2 units: exp2f below
  // Keys in virtual order (prefix, then own rows); causal: no row of this tile sees past its
  // last row, virtual position plen + its offset.
  int kend = plen + min(len, off + TC_ROWS);
  tc_stream_kv<HD, TC_KEYS>(kv, qkv, ldq, (nh + kh) * HD, (nh + kvh + kh) * HD, s0, ps, plen, kend, [&](int kc, const bf16* ks, const bf16* vs) {
    if (q0 >= len || kc > plen + q0 + 15) return;  // warp-uniform: every row of this warp is done
    float s[TC_KEYS / 8][4];
    tc_scores<HD, TC_KEYS / 8>(s, qf, ks, ld);
#pragma unroll
    for (int nb = 0; nb < TC_KEYS / 8; ++nb)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        int row = plen + q0 + g + 8 * (i >> 1), key = kc + 8 * nb + 2 * t + (i & 1);
        s[nb][i] = key <= row && key < kend ? s[nb][i] * sl2 : -RF_INF;
      }
    tc_softmax_step<HD, TC_KEYS / 8>(s, m, l, o);
    tc_acc_pm<HD, TC_KEYS / 16>(o, s, vs, ld);
  });
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int row = q0 + g + 8 * r;
    if (row >= len) continue;
    float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    bf16* orow = out + (size_t)(s0 + row) * nh * HD + h * HD + 2 * t;
#pragma unroll
    for (int nd = 0; nd < HD / 8; ++nd) st_b32(orow + 8 * nd, pack_bf16(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv));
    if (t == 0) lse[(size_t)h * n + s0 + row] = (m[r] + log2f(l[r])) * RF_LN2;
  }
}
RF_HEAD_DIMS(attn_tc_fwd, (bf16 * out, float* lse, const bf16* qkv, const int* tiles, int n, int nh, int kvh, int ldq, float scale),
             (out, lse, qkv, tiles, n, nh, kvh, ldq, scale))

// dq for a tile of query rows (grid: tiles × nh), streaming keys 32 at a time. With
// s = scale·q·k, p = exp(s − lse), dp = dout·v, ds = p·(dp − delta): dq = scale · Σ ds·k.
// `delta` comes from attn_bwd_delta_bf16 (attention.cu). Writes the q columns of `dqkv`.
// Dynamic shared memory: 2 · 2 · 32 · (HD + 8) bf16 (keys and values, double-buffered).
template <int HD>
RF_DEV void attn_tc_dq(bf16* __restrict__ dqkv, const bf16* __restrict__ qkv, const bf16* __restrict__ dout, const float* __restrict__ lse,
                       const float* __restrict__ delta, const int* __restrict__ tiles, int n, int nh, int kvh, int ldq, float scale) {
  constexpr int ld = HD + TC_PAD;
  RF_DYN_SMEM(smem);
  bf16* kv = reinterpret_cast<bf16*>(smem);  // two buffers of [32][ld] keys, then [32][ld] values
  int tile = blockIdx.x, h = blockIdx.y;
  const int* T = tiles + 6 * tile;
  int s0 = T[0], len = T[1], off = T[2], ps = T[3], plen = T[4];
  int kh = h / (nh / kvh);
  int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  int q0 = off + 16 * warp;
  uint32_t qf[HD / 16][4], df[HD / 16][4];
  tc_rows_a<HD>(qf, qkv, s0, q0, len, ldq, h * HD);
  tc_rows_a<HD>(df, dout, s0, q0, len, nh * HD, h * HD);
  float lse2[2], del[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int row = q0 + g + 8 * r;
    lse2[r] = row < len ? lse[(size_t)h * n + s0 + row] * RF_LOG2E : 0.f;
    del[r] = row < len ? delta[(size_t)h * n + s0 + row] : 0.f;
  }
  float dq[HD / 8][4];
#pragma unroll
  for (int nd = 0; nd < HD / 8; ++nd) dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.f;
  float sl2 = scale * RF_LOG2E;
  int kend = plen + min(len, off + TC_ROWS);  // virtual, as in the forward
  tc_stream_kv<HD, TC_DQ_KEYS>(kv, qkv, ldq, (nh + kh) * HD, (nh + kvh + kh) * HD, s0, ps, plen, kend, [&](int kc, const bf16* ks, const bf16* vs) {
    if (q0 >= len || kc > plen + q0 + 15) return;  // warp-uniform: every row of this warp is done
    float s[TC_DQ_KEYS / 8][4], dp[TC_DQ_KEYS / 8][4];
    tc_scores<HD, TC_DQ_KEYS / 8>(s, qf, ks, ld);   // q·kᵀ
    tc_scores<HD, TC_DQ_KEYS / 8>(dp, df, vs, ld);  // dout·vᵀ
#pragma unroll
    for (int nb = 0; nb < TC_DQ_KEYS / 8; ++nb)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        int row = q0 + g + 8 * (i >> 1), key = kc + 8 * nb + 2 * t + (i & 1);
        bool ok = key <= plen + row && key < kend && row < len;
        float p = ok ? exp2f(s[nb][i] * sl2 - lse2[i >> 1]) : 0.f;
        s[nb][i] = p * (dp[nb][i] - del[i >> 1]);  // ds
      }
    tc_acc_pm<HD, TC_DQ_KEYS / 16>(dq, s, ks, ld);
  });
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int row = q0 + g + 8 * r;
    if (row >= len) continue;
    bf16* drow = dqkv + (size_t)(s0 + row) * ldq + h * HD + 2 * t;
#pragma unroll
    for (int nd = 0; nd < HD / 8; ++nd) st_b32(drow + 8 * nd, pack_bf16(dq[nd][2 * r] * scale, dq[nd][2 * r + 1] * scale));
  }
}
RF_HEAD_DIMS(attn_tc_dq,
             (bf16 * dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta, const int* tiles, int n, int nh,
              int kvh, int ldq, float scale),
             (dqkv, qkv, dout, lse, delta, tiles, n, nh, kvh, ldq, scale))

// dk and dv for a tile of key rows of one KV head (grid: tiles × kvh), streaming, 32 at a
// time, the queries at or after the tile (causal) — and every query of the sequences that
// continue this one — of every query head that shares the KV head: dv = Σ_q p·dout_q, dk = scale · Σ_q ds·q, computed transposed (keys are the rows):
// sᵀ = k·qᵀ, dpᵀ = v·doutᵀ. Writes the k and v columns of `dqkv`. The query chunks, over
// heads, segments and positions, are double-buffered: chunk i + 1's copies are in flight while
// chunk i is computed.
// Dynamic shared memory: (2 · 64 + 2 · 2 · 32) · (HD + 8) bf16 + 2 · 2 · 32 floats.
template <int HD>
RF_DEV void attn_tc_dkdv(bf16* __restrict__ dqkv, const bf16* __restrict__ qkv, const bf16* __restrict__ dout, const float* __restrict__ lse,
                         const float* __restrict__ delta, const int* __restrict__ tiles, int n, int nh, int kvh, int ldq, float scale) {
  constexpr int ld = HD + TC_PAD;
  RF_DYN_SMEM(smem);
  bf16* kt = reinterpret_cast<bf16*>(smem);  // [64][ld]: this tile's keys
  bf16* vt = kt + TC_ROWS * ld;               // [64][ld]
  // Two buffers, each: [32][ld] queries, [32][ld] their output gradients.
  bf16* qbuf = vt + TC_ROWS * ld;
  // Two buffers, each: their lse [32] (natural log, as stored), then their delta [32].
  float* sbuf = reinterpret_cast<float*>(qbuf + 2 * 2 * TC_DK_QS * ld);
  int tile = blockIdx.x, kh = blockIdx.y;
  const int* T = tiles + 6 * tile;
  int s0 = T[0], len = T[1], off = T[2], x = T[5];
  const int* ext = tiles;  // `x` indexes the whole buffer
  int nx = x < 0 ? 0 : ext[x];  // sequences continuing this one
  int group = nh / kvh;
  int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  int k0 = off + 16 * warp;  // this warp's first key
  float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
  for (int nd = 0; nd < HD / 8; ++nd)
#pragma unroll
    for (int i = 0; i < 4; ++i) dk[nd][i] = dv[nd][i] = 0.f;
  float sl2 = scale * RF_LOG2E;
  // A chunk of queries: head h, segment sg (0: this sequence's own queries, causal, from the
  // tile on; then the queries of each sequence continuing it, all of which see every key
  // here), and its first position qc in the segment's rows [qs0, qs0 + qlen). h = −1: none.
  struct Chunk {
    int h, sg, qc, qs0, qlen;
  };
  auto segment = [&](Chunk& c) {
    c.qs0 = c.sg == 0 ? s0 : ext[x + 2 * c.sg - 1];
    c.qlen = c.sg == 0 ? len : ext[x + 2 * c.sg];
    c.qc = c.sg == 0 ? off : 0;
  };
  auto next = [&](Chunk c) {
    c.qc += TC_DK_QS;
    while (c.qc >= c.qlen) {
      if (++c.sg > nx) {
        c.sg = 0;
        if (++c.h >= (kh + 1) * group) return Chunk{-1, 0, 0, 0, 0};
      }
      segment(c);
    }
    return c;
  };
  auto copy = [&](const Chunk& c, int buf) {
    bf16* qs = qbuf + buf * 2 * TC_DK_QS * ld;
    tc_copy2<HD, TC_DK_QS>(qs, qkv, ldq, c.h * HD, qs + TC_DK_QS * ld, dout, nh * HD, c.h * HD, c.qs0, c.qs0, 0, c.qc, c.qlen);
    // Their lse and delta, by cp.async too (a plain load's latency would hold up the barrier).
    float* lses = sbuf + buf * 2 * TC_DK_QS;
    for (int j = threadIdx.x; j < 2 * TC_DK_QS; j += blockDim.x) {
      int q = c.qc + j % TC_DK_QS;
      if (q < c.qlen) {
        cp_async4(lses + j, (j < TC_DK_QS ? lse : delta) + (size_t)c.h * n + c.qs0 + q);
      } else {
        lses[j] = 0.f;
      }
    }
  };
  Chunk first{kh * group, 0, 0, 0, 0};
  segment(first);  // the tile's own rows: off < len
  // The key tile, landing with the first chunk.
  tc_copy2<HD, TC_ROWS>(kt, qkv, ldq, (nh + kh) * HD, vt, qkv, ldq, (nh + kvh + kh) * HD, s0, s0, 0, off, len);
  tc_pipeline<TcSync::Block>(first, [](const Chunk& c) { return c.h >= 0; }, next, copy, [&](const Chunk& c, int buf) {
    const bf16* qs = qbuf + buf * 2 * TC_DK_QS * ld;
    const bf16* ds_ = qs + TC_DK_QS * ld;
    const float* lses = sbuf + buf * 2 * TC_DK_QS;
    const float* dels = lses + TC_DK_QS;
    bool causal = c.sg == 0;
    int qc = c.qc, qlen = c.qlen;
    // Warp-uniform: a warp whose keys are all past the sequence, or after every query here, skips.
    if (k0 >= len || (causal && qc + TC_DK_QS - 1 < k0)) return;
    float st[TC_DK_QS / 8][4], dpt[TC_DK_QS / 8][4];
#pragma unroll
    for (int nb = 0; nb < TC_DK_QS / 8; ++nb)
#pragma unroll
      for (int i = 0; i < 4; ++i) st[nb][i] = dpt[nb][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t ak[4], av[4];
      tc_frag_a(ak, kt + 16 * warp * ld + 16 * kk, ld);
      tc_frag_a(av, vt + 16 * warp * ld + 16 * kk, ld);
#pragma unroll
      for (int nb = 0; nb < TC_DK_QS / 8; ++nb) {
        uint32_t b[2];
        tc_frag_bt(b, qs + nb * 8 * ld + kk * 16, ld);
        mma_bf16(st[nb], ak, b);
        tc_frag_bt(b, ds_ + nb * 8 * ld + kk * 16, ld);
        mma_bf16(dpt[nb], av, b);
      }
    }
#pragma unroll
    for (int nb = 0; nb < TC_DK_QS / 8; ++nb)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        int key = k0 + g + 8 * (i >> 1), j = 8 * nb + 2 * t + (i & 1), q = qc + j;
        bool ok = key < len && q < qlen && (!causal || key <= q);
        float p = ok ? exp2f(st[nb][i] * sl2 - lses[j] * RF_LOG2E) : 0.f;
        st[nb][i] = p;
        dpt[nb][i] = p * (dpt[nb][i] - dels[j]);  // dsᵀ
      }
    tc_acc_pm<HD, TC_DK_QS / 16>(dv, st, ds_, ld);
    tc_acc_pm<HD, TC_DK_QS / 16>(dk, dpt, qs, ld);
  });
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int key = k0 + g + 8 * r;
    if (key >= len) continue;
    bf16* row = dqkv + (size_t)(s0 + key) * ldq + 2 * t;
#pragma unroll
    for (int nd = 0; nd < HD / 8; ++nd) {
      st_b32(row + (nh + kh) * HD + 8 * nd, pack_bf16(dk[nd][2 * r] * scale, dk[nd][2 * r + 1] * scale));
      st_b32(row + (nh + kvh + kh) * HD + 8 * nd, pack_bf16(dv[nd][2 * r], dv[nd][2 * r + 1]));
    }
  }
}
RF_HEAD_DIMS(attn_tc_dkdv,
             (bf16 * dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* delta, const int* tiles, int n, int nh,
              int kvh, int ldq, float scale),
             (dqkv, qkv, dout, lse, delta, tiles, n, nh, kvh, ldq, scale))

RF_EMU_TABLE(attention_tc, RF_EMU_HEAD_DIMS(attn_tc_fwd), RF_EMU_HEAD_DIMS(attn_tc_dq), RF_EMU_HEAD_DIMS(attn_tc_dkdv))
