// Causal self-attention over packed variable-length sequences (training forward/backward and
// rollout prefill), flash-attention style: no [T, T] score matrix ever exists in memory; the
// softmax runs online over key chunks, the forward saves only each row's log-sum-exp, and the
// backward recomputes probabilities from it.
//
// Layout: `qkv` is the fused projection output, one row per token: [q (nh·hd) | k (kvh·hd) |
// v (kvh·hd)], row stride `ldq`; q and k already rotated (RoPE). GQA: query head h reads
// KV head h / (nh / kvh). Work is split into tiles of 16 rows of one sequence:
// `tiles[6t..6t+6] = (s0, len, off, ps, plen, x)`, a sequence continuing a shared prefix
// (`plen` > 0), and the continuation lists after the tiles, as in attention_tc.cu (see there).
// A block is 4 warps; each warp owns 4 of the tile's rows; a lane owns the head dimensions
// d ≡ lane (mod 32). Keys (or queries) stream through shared memory 32 at a time, one per
// lane for the dot products.
//
// These use CUDA cores (f32 FMAs). bf16 with head dims 16/32/64/128 runs on the tensor-core
// kernels of attention_tc.cu instead; these serve f32, other head dims, and comparison
// (REINFORGE_CUDA_ATTENTION=cuda-cores).
#include "prelude.cuh"

#define RF_ATT_ROWS 4   // rows per warp
#define RF_ATT_TILE 16  // rows per block (4 warps)
#define RF_ATT_CHUNK 32 // keys/queries per shared-memory chunk
#define RF_ATT_MAXC 8   // head_dim ≤ 256

/// The row of virtual position `j` of a sequence at `s0` continuing `plen` prefix rows at `ps`.
RF_DEV int virtual_row(int j, int s0, int ps, int plen) { return j < plen ? ps + j : s0 + j - plen; }

// Forward. Dynamic shared memory: (16·hd + 32·(hd+1) + 32·hd) floats.
template <class T>
RF_DEV void attn_fwd(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ qkv, const int* __restrict__ tiles,
                     int n, int nh, int kvh, int hd, int ldq, float scale) {
  RF_DYN_SMEM(smem);
  float* qs = smem;                            // [16][hd], pre-scaled
  float* ks = qs + RF_ATT_TILE * hd;           // [32][hd+1]
  float* vs = ks + RF_ATT_CHUNK * (hd + 1);    // [32][hd]
  int t = blockIdx.x, h = blockIdx.y;
  const int* TL = tiles + 6 * t;
  int s0 = TL[0], len = TL[1], off = TL[2], ps = TL[3], plen = TL[4];
  int kh = h / (nh / kvh);
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int e = threadIdx.x; e < RF_ATT_TILE * hd; e += blockDim.x) {
    int r = e / hd, d = e % hd;
    int q = off + r;
    qs[e] = q < len ? to_f(qkv[(size_t)(s0 + q) * ldq + h * hd + d]) * scale : 0.f;
  }
  float m[RF_ATT_ROWS], l[RF_ATT_ROWS], acc[RF_ATT_ROWS][RF_ATT_MAXC];
  for (int r = 0; r < RF_ATT_ROWS; ++r) {
    m[r] = -RF_INF;
    l[r] = 0.f;
    for (int c = 0; c < RF_ATT_MAXC; ++c) acc[r][c] = 0.f;
  }
  // Keys in virtual order (prefix, then own rows); causal: no row of this tile sees past its
  // last row.
  int kend = plen + min(len, off + RF_ATT_TILE);
  for (int kc = 0; kc < kend; kc += RF_ATT_CHUNK) {
    __syncthreads();
    for (int e = threadIdx.x; e < RF_ATT_CHUNK * hd; e += blockDim.x) {
      int j = e / hd, d = e % hd;
      int key = kc + j;
      bool ok = key < kend;
      const T* row = qkv + (size_t)(ok ? virtual_row(key, s0, ps, plen) : s0) * ldq;
      ks[j * (hd + 1) + d] = ok ? to_f(row[nh * hd + kh * hd + d]) : 0.f;
      vs[j * hd + d] = ok ? to_f(row[(nh + kvh) * hd + kh * hd + d]) : 0.f;
    }
    __syncthreads();
    int key = kc + lane;
    float sc[RF_ATT_ROWS];
    for (int r = 0; r < RF_ATT_ROWS; ++r) sc[r] = 0.f;
    for (int d = 0; d < hd; ++d) {
      float kv = ks[lane * (hd + 1) + d];
      for (int r = 0; r < RF_ATT_ROWS; ++r) sc[r] += qs[(warp * RF_ATT_ROWS + r) * hd + d] * kv;
    }
    for (int r = 0; r < RF_ATT_ROWS; ++r) {
      int q = plen + off + warp * RF_ATT_ROWS + r;
      float s = (key <= q && key < kend) ? sc[r] : -RF_INF;
      float mx = fmaxf(m[r], warp_max(s));
      float p = mx == -RF_INF ? 0.f : expf(s - mx);
      float corr = mx == -RF_INF ? 1.f : expf(m[r] - mx);
      l[r] = l[r] * corr + warp_sum(p);
      for (int c = 0; c < RF_ATT_MAXC; ++c) acc[r][c] *= corr;
      m[r] = mx;
      for (int j = 0; j < RF_ATT_CHUNK; ++j) {
        float pj = __shfl_sync(RF_FULL_MASK, p, j);
        for (int c = 0; c < RF_ATT_MAXC; ++c) {
          int d = lane + 32 * c;
          if (d < hd) acc[r][c] += pj * vs[j * hd + d];
        }
      }
    }
  }
  for (int r = 0; r < RF_ATT_ROWS; ++r) {
    int q = off + warp * RF_ATT_ROWS + r;
    if (q >= len) continue;
    float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    T* o = out + (size_t)(s0 + q) * nh * hd + h * hd;
    for (int c = 0; c < RF_ATT_MAXC; ++c) {
      int d = lane + 32 * c;
      if (d < hd) o[d] = from_f<T>(acc[r][c] * inv);
    }
    if (lane == 0) lse[(size_t)h * n + s0 + q] = m[r] + logf(l[r]);
  }
}
RF_TYPED(attn_fwd, (T * out, float* lse, const T* qkv, const int* tiles, int n, int nh, int kvh, int hd, int ldq, float scale),
         (out, lse, qkv, tiles, n, nh, kvh, hd, ldq, scale))

// delta[h, r] = Σ_d out[r, h, d] · dout[r, h, d]: the softmax backward's row term. One warp
// per (row, head).
template <class T>
RF_DEV void attn_bwd_delta(float* __restrict__ delta, const T* __restrict__ out, const T* __restrict__ dout, int n, int nh, int hd) {
  int warps = blockDim.x / 32;
  int item = blockIdx.x * warps + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (item >= n * nh) return;
  int r = item / nh, h = item % nh;
  size_t base = (size_t)r * nh * hd + h * hd;
  float s = 0.f;
  for (int d = lane; d < hd; d += 32) s += to_f(out[base + d]) * to_f(dout[base + d]);
  s = warp_sum(s);
  if (lane == 0) delta[(size_t)h * n + r] = s;
}
RF_TYPED(attn_bwd_delta, (float* delta, const T* out, const T* dout, int n, int nh, int hd), (delta, out, dout, n, nh, hd))

// dq for a tile of query rows (grid: tiles × nh), streaming keys. With s = scale·q·k,
// p = exp(s − lse), dp = dout·v, ds = p·(dp − delta): dq = scale · Σ_j ds_j k_j.
// Writes the q columns of `dqkv` (same layout as qkv). Dynamic shared memory:
// (2·16·hd + 2·32·(hd+1)) floats.
template <class T>
RF_DEV void attn_bwd_dq(T* __restrict__ dqkv, const T* __restrict__ qkv, const T* __restrict__ dout, const float* __restrict__ lse,
                        const float* __restrict__ delta, const int* __restrict__ tiles, int n, int nh, int kvh, int hd, int ldq,
                        float scale) {
  RF_DYN_SMEM(smem);
  float* qs = smem;                          // [16][hd], pre-scaled
  float* dos = qs + RF_ATT_TILE * hd;        // [16][hd]
  float* ks = dos + RF_ATT_TILE * hd;        // [32][hd+1]
  float* vs = ks + RF_ATT_CHUNK * (hd + 1);  // [32][hd+1]
  int t = blockIdx.x, h = blockIdx.y;
  const int* TL = tiles + 6 * t;
  int s0 = TL[0], len = TL[1], off = TL[2], ps = TL[3], plen = TL[4];
  int kh = h / (nh / kvh);
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int e = threadIdx.x; e < RF_ATT_TILE * hd; e += blockDim.x) {
    int r = e / hd, d = e % hd;
    int q = off + r;
    bool ok = q < len;
    qs[e] = ok ? to_f(qkv[(size_t)(s0 + q) * ldq + h * hd + d]) * scale : 0.f;
    dos[e] = ok ? to_f(dout[(size_t)(s0 + q) * nh * hd + h * hd + d]) : 0.f;
  }
  float lse_r[RF_ATT_ROWS], del_r[RF_ATT_ROWS], dq[RF_ATT_ROWS][RF_ATT_MAXC];
  for (int r = 0; r < RF_ATT_ROWS; ++r) {
    int q = off + warp * RF_ATT_ROWS + r;
    bool ok = q < len;
    lse_r[r] = ok ? lse[(size_t)h * n + s0 + q] : 0.f;
    del_r[r] = ok ? delta[(size_t)h * n + s0 + q] : 0.f;
    for (int c = 0; c < RF_ATT_MAXC; ++c) dq[r][c] = 0.f;
  }
  int kend = plen + min(len, off + RF_ATT_TILE);  // virtual, as in the forward
  for (int kc = 0; kc < kend; kc += RF_ATT_CHUNK) {
    __syncthreads();
    for (int e = threadIdx.x; e < RF_ATT_CHUNK * hd; e += blockDim.x) {
      int j = e / hd, d = e % hd;
      int key = kc + j;
      bool ok = key < kend;
      const T* row = qkv + (size_t)(ok ? virtual_row(key, s0, ps, plen) : s0) * ldq;
      ks[j * (hd + 1) + d] = ok ? to_f(row[nh * hd + kh * hd + d]) : 0.f;
      vs[j * (hd + 1) + d] = ok ? to_f(row[(nh + kvh) * hd + kh * hd + d]) : 0.f;
    }
    __syncthreads();
    int key = kc + lane;
    float sc[RF_ATT_ROWS], dp[RF_ATT_ROWS];
    for (int r = 0; r < RF_ATT_ROWS; ++r) sc[r] = dp[r] = 0.f;
    for (int d = 0; d < hd; ++d) {
      float kv = ks[lane * (hd + 1) + d], vv = vs[lane * (hd + 1) + d];
      for (int r = 0; r < RF_ATT_ROWS; ++r) {
        sc[r] += qs[(warp * RF_ATT_ROWS + r) * hd + d] * kv;
        dp[r] += dos[(warp * RF_ATT_ROWS + r) * hd + d] * vv;
      }
    }
    for (int r = 0; r < RF_ATT_ROWS; ++r) {
      int q = off + warp * RF_ATT_ROWS + r;
      bool ok = key <= plen + q && key < kend && q < len;
      float p = ok ? expf(sc[r] - lse_r[r]) : 0.f;
      float ds = p * (dp[r] - del_r[r]);
      for (int j = 0; j < RF_ATT_CHUNK; ++j) {
        float dsj = __shfl_sync(RF_FULL_MASK, ds, j);
        for (int c = 0; c < RF_ATT_MAXC; ++c) {
          int d = lane + 32 * c;
          if (d < hd) dq[r][c] += dsj * ks[j * (hd + 1) + d];
        }
      }
    }
  }
  for (int r = 0; r < RF_ATT_ROWS; ++r) {
    int q = off + warp * RF_ATT_ROWS + r;
    if (q >= len) continue;
    T* o = dqkv + (size_t)(s0 + q) * ldq + h * hd;
    for (int c = 0; c < RF_ATT_MAXC; ++c) {
      int d = lane + 32 * c;
      if (d < hd) o[d] = from_f<T>(dq[r][c] * scale);
    }
  }
}
RF_TYPED(attn_bwd_dq,
         (T * dqkv, const T* qkv, const T* dout, const float* lse, const float* delta, const int* tiles, int n, int nh, int kvh,
          int hd, int ldq, float scale),
         (dqkv, qkv, dout, lse, delta, tiles, n, nh, kvh, hd, ldq, scale))

// dk and dv for a tile of key rows of one KV head (grid: tiles × kvh), streaming the queries
// at or after the tile (causal) — and every query of the sequences continuing this one — of
// every query head that shares the KV head:
// dv_k = Σ_q p·dout_q, dk_k = Σ_q ds·(scale·q). Writes the k and v columns of `dqkv`.
// Dynamic shared memory: (2·16·hd + 2·32·(hd+1) + 2·32) floats.
template <class T>
RF_DEV void attn_bwd_dkdv(T* __restrict__ dqkv, const T* __restrict__ qkv, const T* __restrict__ dout, const float* __restrict__ lse,
                          const float* __restrict__ delta, const int* __restrict__ tiles, int n, int nh, int kvh, int hd, int ldq,
                          float scale) {
  RF_DYN_SMEM(smem);
  float* kt = smem;                          // [16][hd]
  float* vt = kt + RF_ATT_TILE * hd;         // [16][hd]
  float* qs = vt + RF_ATT_TILE * hd;         // [32][hd+1], pre-scaled
  float* dos = qs + RF_ATT_CHUNK * (hd + 1); // [32][hd+1]
  float* lses = dos + RF_ATT_CHUNK * (hd + 1);
  float* dels = lses + RF_ATT_CHUNK;
  int t = blockIdx.x, kh = blockIdx.y;
  const int* TL = tiles + 6 * t;
  int s0 = TL[0], len = TL[1], off = TL[2], x = TL[5];
  const int* ext = tiles;  // `x` indexes the whole buffer
  int nx = x < 0 ? 0 : ext[x];  // sequences continuing this one
  int g = nh / kvh;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int e = threadIdx.x; e < RF_ATT_TILE * hd; e += blockDim.x) {
    int r = e / hd, d = e % hd;
    int key = off + r;
    bool ok = key < len;
    const T* row = qkv + (size_t)(s0 + (ok ? key : 0)) * ldq;
    kt[e] = ok ? to_f(row[nh * hd + kh * hd + d]) : 0.f;
    vt[e] = ok ? to_f(row[(nh + kvh) * hd + kh * hd + d]) : 0.f;
  }
  float dk[RF_ATT_ROWS][RF_ATT_MAXC], dv[RF_ATT_ROWS][RF_ATT_MAXC];
  for (int r = 0; r < RF_ATT_ROWS; ++r)
    for (int c = 0; c < RF_ATT_MAXC; ++c) dk[r][c] = dv[r][c] = 0.f;
  for (int h = kh * g; h < (kh + 1) * g; ++h) {
    // Segment 0: this sequence's own queries, causal, from the tile on; then the queries of
    // each sequence continuing it, all of which see every key here.
    for (int sg = 0; sg <= nx; ++sg) {
      bool causal = sg == 0;
      int qs0 = causal ? s0 : ext[x + 2 * sg - 1], qlen = causal ? len : ext[x + 2 * sg];
      for (int qc = causal ? off : 0; qc < qlen; qc += RF_ATT_CHUNK) {
        __syncthreads();
        for (int e = threadIdx.x; e < RF_ATT_CHUNK * hd; e += blockDim.x) {
          int j = e / hd, d = e % hd;
          int q = qc + j;
          bool ok = q < qlen;
          qs[j * (hd + 1) + d] = ok ? to_f(qkv[(size_t)(qs0 + q) * ldq + h * hd + d]) * scale : 0.f;
          dos[j * (hd + 1) + d] = ok ? to_f(dout[(size_t)(qs0 + q) * nh * hd + h * hd + d]) : 0.f;
        }
        for (int j = threadIdx.x; j < RF_ATT_CHUNK; j += blockDim.x) {
          int q = qc + j;
          bool ok = q < qlen;
          lses[j] = ok ? lse[(size_t)h * n + qs0 + q] : 0.f;
          dels[j] = ok ? delta[(size_t)h * n + qs0 + q] : 0.f;
        }
        __syncthreads();
        int q = qc + lane;
        float sc[RF_ATT_ROWS], dp[RF_ATT_ROWS];
        for (int r = 0; r < RF_ATT_ROWS; ++r) sc[r] = dp[r] = 0.f;
        for (int d = 0; d < hd; ++d) {
          float qv = qs[lane * (hd + 1) + d], dov = dos[lane * (hd + 1) + d];
          for (int r = 0; r < RF_ATT_ROWS; ++r) {
            sc[r] += qv * kt[(warp * RF_ATT_ROWS + r) * hd + d];
            dp[r] += dov * vt[(warp * RF_ATT_ROWS + r) * hd + d];
          }
        }
        for (int r = 0; r < RF_ATT_ROWS; ++r) {
          int key = off + warp * RF_ATT_ROWS + r;
          bool ok = key < len && q < qlen && (!causal || key <= q);
          float p = ok ? expf(sc[r] - lses[lane]) : 0.f;
          float ds = p * (dp[r] - dels[lane]);
          for (int j = 0; j < RF_ATT_CHUNK; ++j) {
            float pj = __shfl_sync(RF_FULL_MASK, p, j);
            float dsj = __shfl_sync(RF_FULL_MASK, ds, j);
            for (int c = 0; c < RF_ATT_MAXC; ++c) {
              int d = lane + 32 * c;
              if (d < hd) {
                dv[r][c] += pj * dos[j * (hd + 1) + d];
                dk[r][c] += dsj * qs[j * (hd + 1) + d];
              }
            }
          }
        }
      }
    }
  }
  for (int r = 0; r < RF_ATT_ROWS; ++r) {
    int key = off + warp * RF_ATT_ROWS + r;
    if (key >= len) continue;
    T* row = dqkv + (size_t)(s0 + key) * ldq;
    for (int c = 0; c < RF_ATT_MAXC; ++c) {
      int d = lane + 32 * c;
      if (d < hd) {
        row[nh * hd + kh * hd + d] = from_f<T>(dk[r][c]);
        row[(nh + kvh) * hd + kh * hd + d] = from_f<T>(dv[r][c]);
      }
    }
  }
}
RF_TYPED(attn_bwd_dkdv,
         (T * dqkv, const T* qkv, const T* dout, const float* lse, const float* delta, const int* tiles, int n, int nh, int kvh,
          int hd, int ldq, float scale),
         (dqkv, qkv, dout, lse, delta, tiles, n, nh, kvh, hd, ldq, scale))

RF_EMU_TABLE(attention, RF_EMU_TYPED(attn_fwd), RF_EMU_TYPED(attn_bwd_delta), RF_EMU_TYPED(attn_bwd_dq), RF_EMU_TYPED(attn_bwd_dkdv))
