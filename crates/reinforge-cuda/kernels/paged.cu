// The rollout's paged KV cache: writing new tokens' rotated keys and values into their slots, and
// decode attention (one new query token per sequence) over a sequence's pages.
//
// Cache layout per layer: [slots, kvh, hd] with slot = block·block_size + offset; a
// sequence's blocks are listed in its row of `block_tables` ([rows, max_blocks]).
#include "prelude.cuh"

// RoPE on token r's q and k heads in place (as elementwise.cu's rope), and its rotated k and
// its v into cache slot slots[r]: one launch instead of two per layer, which a decode step
// (a few microseconds of work per kernel) feels. A thread's pairs are read in batches, every
// load of a batch before any store: written pair by pair, each store into the row kept the
// next pair's loads from being issued early, and a decode step's 64 rows took about 7.5 µs
// on an H200 (2026-11-27), a memory round trip per pair.
#define RF_ROPE_BATCH 4
template <class T>
RF_DEV void rope_kv_store(T* __restrict__ qkv, T* __restrict__ kc, T* __restrict__ vc, const float* __restrict__ cos_t,
                          const float* __restrict__ sin_t, const int* __restrict__ pos, const int* __restrict__ slots, int n, int nh,
                          int kvh, int hd, int ldq) {
  int r = blockIdx.x;
  if (r >= n) return;
  int half = hd / 2;
  int p = pos[r];
  const float* cr = cos_t + (size_t)p * half;
  const float* sr = sin_t + (size_t)p * half;
  T* row = qkv + (size_t)r * ldq;
  size_t s = (size_t)slots[r] * kvh * hd;
  int pairs = (nh + kvh) * half;
  for (int j0 = threadIdx.x; j0 < pairs; j0 += RF_ROPE_BATCH * blockDim.x) {
    float a[RF_ROPE_BATCH] = {}, b[RF_ROPE_BATCH] = {}, c[RF_ROPE_BATCH] = {}, sn[RF_ROPE_BATCH] = {};
#pragma unroll
    for (int u = 0; u < RF_ROPE_BATCH; ++u) {
      int j = j0 + u * blockDim.x;
      if (j >= pairs) continue;
      int hh = j / half, i = j % half;
      a[u] = to_f(row[hh * hd + i]);
      b[u] = to_f(row[hh * hd + i + half]);
      c[u] = cr[i];
      sn[u] = sr[i];
    }
#pragma unroll
    for (int u = 0; u < RF_ROPE_BATCH; ++u) {
      int j = j0 + u * blockDim.x;
      if (j >= pairs) continue;
      int hh = j / half, i = j % half;
      T ya, yb;
      rope_rot(a[u], b[u], c[u], sn[u], &ya, &yb);
      row[hh * hd + i] = ya;
      row[hh * hd + i + half] = yb;
      if (hh >= nh) {
        size_t o = s + (size_t)(hh - nh) * hd;
        kc[o + i] = ya;
        kc[o + i + half] = yb;
      }
    }
  }
  for (int e = threadIdx.x; e < kvh * hd; e += blockDim.x) vc[s + e] = row[(nh + kvh) * hd + e];
}
RF_TYPED(rope_kv_store,
         (T * qkv, T* kc, T* vc, const float* cos_t, const float* sin_t, const int* pos, const int* slots, int n, int nh, int kvh, int hd,
          int ldq),
         (qkv, kc, vc, cos_t, sin_t, pos, slots, n, nh, kvh, hd, ldq))

#define RF_DEC_CHUNK 32

// The cache slot of position p of a sequence with block table `table`, or −1 at or past `len`.
RF_DEV int cache_slot(const int* table, int p, int len, int block_size) { return p < len ? table[p / block_size] * block_size + p % block_size : -1; }
#define RF_DEC_MAXC 8   // head_dim ≤ 256
#define RF_DEC_HEADS 4  // query heads per warp: GQA groups up to 16
#define RF_DEC_WARPS 4  // warps per block (the launch's 128 threads)
#define RF_DEC_LOADS 4  // 16-byte key (and value) loads per thread per chunk: 32 keys of 128 bf16

// Issues the loads of a chunk's keys and values (cache slots `slot_of`, −1: zeros) into
// registers, RF_DEC_LOADS 16-byte words of each per thread, none used yet.
template <class T>
RF_DEV void dec_fetch(rf_b128* kr, rf_b128* vr, const T* __restrict__ kc, const T* __restrict__ vc, const int* slot_of, int kh, int kvh,
                      int hd, int hv) {
  constexpr int VEC = 16 / sizeof(T);
#pragma unroll
  for (int i = 0; i < RF_DEC_LOADS; ++i) {
    int e = threadIdx.x + i * blockDim.x;
    if (e >= RF_DEC_CHUNK * hv) continue;
    int j = e / hv, d = (e % hv) * VEC;
    int slot = slot_of[j];
    if (slot < 0) {
      kr[i] = vr[i] = rf_b128{{0u, 0u, 0u, 0u}};
      continue;
    }
    size_t idx = ((size_t)slot * kvh + kh) * hd + d;
    kr[i] = ld_b128(kc + idx);
    vr[i] = ld_b128(vc + idx);
  }
}

// The end of a decode-attention block (decode_attn, decode_attn_tc), after it wrote its split's
// partials for row r's query heads kh·g … kh·g + g − 1 (their max m in natural-log units):
// counts the split in `done`, and the last of the row's splits with work merges them into
// `out` and sets the count back to zero.
template <class T>
RF_DEV void dec_finish(T* __restrict__ out, const float* __restrict__ part, unsigned* __restrict__ done, const int* __restrict__ ctx_len,
                       int r, int kh, int g, int nh, int kvh, int hd, int split_keys, int splits) {
  int used = min(splits, (ctx_len[r] + split_keys - 1) / split_keys);
  __shared__ int merges;
  __threadfence();  // this block's partials are visible device-wide before it is counted
  __syncthreads();
  if (threadIdx.x == 0) merges = atomicAdd(&done[r * kvh + kh], 1u) == (unsigned)(used - 1);
  __syncthreads();
  if (!merges) return;  // uniform over the block
  __threadfence();  // the other splits' partials are read after their counts were seen
  __shared__ float head_max[RF_DEC_HEADS * RF_DEC_WARPS], head_inv[RF_DEC_HEADS * RF_DEC_WARPS];
  if ((int)threadIdx.x < g) {
    const float* p = part + ((size_t)r * nh + kh * g + threadIdx.x) * splits * (hd + 2);
    float mx = -RF_INF, sum = 0.f;
    for (int s = 0; s < used; ++s) mx = fmaxf(mx, ld_cg(p + s * (hd + 2) + hd));
    for (int s = 0; s < used; ++s) sum += ld_cg(p + s * (hd + 2) + hd + 1) * expf(ld_cg(p + s * (hd + 2) + hd) - mx);
    head_max[threadIdx.x] = mx;
    head_inv[threadIdx.x] = sum > 0.f ? 1.f / sum : 0.f;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < g * hd; e += blockDim.x) {
    int hq = e / hd, d = e % hd, h = kh * g + hq;
    const float* p = part + ((size_t)r * nh + h) * splits * (hd + 2);
    float acc = 0.f;
    for (int s = 0; s < used; ++s) acc += ld_cg(p + s * (hd + 2) + d) * expf(ld_cg(p + s * (hd + 2) + hd) - head_max[hq]);
    out[(size_t)r * nh * hd + h * hd + d] = from_f<T>(acc * head_inv[hq]);
  }
  if (threadIdx.x == 0) done[r * kvh + kh] = 0u;  // ready for the next step
}

// Decode attention, split over the context (flash-decoding): softmax(q·Kᵀ·scale) V over the
// ctx_len[r] cached positions of row r is computed by `splits` blocks per (row, KV head), each
// over `split_keys` consecutive positions, which write their unnormalised partial sums, max and
// sum of exponentials to `part` ([rows, nh, splits, hd + 2] floats). One block per (row, KV
// head) would leave most of a large GPU idle at rollout batch sizes. The last of a (row, KV
// head)'s splits to finish merges them into `out` — o = Σ acc·e^(m − M) / Σ l·e^(m − M), M
// the largest partial max — so no second launch is needed: each split makes its partials
// visible device-wide, then counts itself in `done[r · kvh + kh]`; the split that completes the
// count merges, and sets the count back to 0 for the next step (a graph replays the same
// buffer; it starts zeroed). Grid: rows × kvh × splits; 4 warps; the g query heads sharing a
// KV head split over the warps, and each 32-key chunk is read once into shared memory for all
// of them; a split wholly past the context has nothing to do and is not counted (every row
// has at least one cached position: its own token). Dynamic shared memory:
// (g·hd + 32·(hd+1) + 32·hd) floats.
template <class T>
RF_DEV void decode_attn(T* __restrict__ out, float* __restrict__ part, unsigned* __restrict__ done, const T* __restrict__ qkv,
                        const T* __restrict__ kc, const T* __restrict__ vc, const int* __restrict__ block_tables,
                        const int* __restrict__ ctx_len, int max_blocks, int block_size, int nh, int kvh, int hd, int ldq, float scale,
                        int split_keys, int splits) {
  RF_DYN_SMEM(smem);
  int r = blockIdx.x, kh = blockIdx.y, sp = blockIdx.z;
  int g = nh / kvh;
  float* qs = smem;                        // [g][hd], pre-scaled
  float* ks = qs + g * hd;                 // [32][hd+1]
  float* vs = ks + RF_DEC_CHUNK * (hd + 1);  // [32][hd]
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  int k0 = sp * split_keys;
  int len = min(ctx_len[r], k0 + split_keys);  // this split's end
  if (k0 >= len) return;  // uniform over the block
  const int* table = block_tables + (size_t)r * max_blocks;
  // Cache slots of a chunk's keys (−1 past the split), one thread per key: the block table is
  // read once per key, not per element. Two buffers: the next chunk's are written while this
  // chunk's are read.
  __shared__ int slot_of[2][RF_DEC_CHUNK];
  if (threadIdx.x < RF_DEC_CHUNK) slot_of[0][threadIdx.x] = cache_slot(table, k0 + threadIdx.x, len, block_size);
  for (int e = threadIdx.x; e < g * hd; e += blockDim.x) qs[e] = to_f(qkv[(size_t)r * ldq + (kh * g) * hd + e]) * scale;
  float m[RF_DEC_HEADS], l[RF_DEC_HEADS], acc[RF_DEC_HEADS][RF_DEC_MAXC];
  for (int a = 0; a < RF_DEC_HEADS; ++a) {
    m[a] = -RF_INF;
    l[a] = 0.f;
    for (int c = 0; c < RF_DEC_MAXC; ++c) acc[a][c] = 0.f;
  }
  // Keys and values move in 16-byte loads (a head's row is a multiple of 16 bytes for the head
  // dims models use), up to RF_DEC_LOADS pairs per thread per chunk, all issued before any is
  // used, into registers one chunk ahead: the next chunk's loads are in flight while this
  // chunk is computed, which a kernel bound by memory latency at decode's small grids needs.
  // Other head dims, and chunks too large for the registers (bf16 hd > 128, f32 hd > 64),
  // load element by element into shared memory when the chunk is due.
  constexpr int VEC = 16 / sizeof(T);
  int hv = hd / VEC;
  bool ahead = hd % VEC == 0 && RF_DEC_CHUNK * hv <= RF_DEC_LOADS * (int)blockDim.x;  // uniform
  rf_b128 kr[RF_DEC_LOADS], vr[RF_DEC_LOADS];
  __syncthreads();  // the first chunk's slots are written
  if (ahead) dec_fetch(kr, vr, kc, vc, slot_of[0], kh, kvh, hd, hv);
  if (threadIdx.x < RF_DEC_CHUNK) slot_of[1][threadIdx.x] = cache_slot(table, k0 + RF_DEC_CHUNK + threadIdx.x, len, block_size);
  for (int kc0 = k0, buf = 0; kc0 < len; kc0 += RF_DEC_CHUNK, buf ^= 1) {
    __syncthreads();  // the last chunk's readers are done; the next chunk's slots are written
    if (ahead) {
#pragma unroll
      for (int i = 0; i < RF_DEC_LOADS; ++i) {
        int e = threadIdx.x + i * blockDim.x;
        if (e >= RF_DEC_CHUNK * hv) continue;
        int j = e / hv, d = (e % hv) * VEC;
        float kf[VEC], vf[VEC];
        unpack16(kr[i], kf, kc);
        unpack16(vr[i], vf, vc);
        for (int t = 0; t < VEC; ++t) {
          ks[j * (hd + 1) + d + t] = kf[t];
          vs[j * hd + d + t] = vf[t];
        }
      }
      if (kc0 + RF_DEC_CHUNK < len) dec_fetch(kr, vr, kc, vc, slot_of[buf ^ 1], kh, kvh, hd, hv);
    } else {
      for (int e = threadIdx.x; e < RF_DEC_CHUNK * hd; e += blockDim.x) {
        int j = e / hd, d = e % hd;
        int slot = slot_of[buf][j];
        size_t idx = ((size_t)(slot < 0 ? 0 : slot) * kvh + kh) * hd + d;
        ks[j * (hd + 1) + d] = slot < 0 ? 0.f : to_f(kc[idx]);
        vs[j * hd + d] = slot < 0 ? 0.f : to_f(vc[idx]);
      }
    }
    __syncthreads();  // this chunk is in shared memory, and its slots are read
    if (threadIdx.x < RF_DEC_CHUNK) slot_of[buf][threadIdx.x] = cache_slot(table, kc0 + 2 * RF_DEC_CHUNK + threadIdx.x, len, block_size);
    int key = kc0 + lane;
    // Unrolled with `continue` (not `break`), so acc, m and l stay in registers.
#pragma unroll
    for (int a = 0; a < RF_DEC_HEADS; ++a) {
      int hq = warp + a * nwarps;  // this warp's a-th query head within the group
      if (hq >= g) continue;       // uniform across the warp
      float s = 0.f;
      for (int d = 0; d < hd; ++d) s += qs[hq * hd + d] * ks[lane * (hd + 1) + d];
      s = key < len ? s : -RF_INF;
      float mx = fmaxf(m[a], warp_max(s));
      float p = key < len ? expf(s - mx) : 0.f;
      float corr = expf(m[a] - mx);
      l[a] = l[a] * corr + warp_sum(p);
      for (int c = 0; c < RF_DEC_MAXC; ++c) acc[a][c] *= corr;
      m[a] = mx;
      for (int j = 0; j < RF_DEC_CHUNK; ++j) {
        float pj = __shfl_sync(RF_FULL_MASK, p, j);
        for (int c = 0; c < RF_DEC_MAXC; ++c) {
          int d = lane + 32 * c;
          if (d < hd) acc[a][c] += pj * vs[j * hd + d];
        }
      }
    }
  }
#pragma unroll
  for (int a = 0; a < RF_DEC_HEADS; ++a) {
    int hq = warp + a * nwarps;
    if (hq >= g) continue;
    int h = kh * g + hq;
    float* o = part + (((size_t)r * nh + h) * splits + sp) * (hd + 2);
    for (int c = 0; c < RF_DEC_MAXC; ++c) {
      int d = lane + 32 * c;
      if (d < hd) o[d] = acc[a][c];
    }
    if (lane == 0) {
      o[hd] = m[a];
      o[hd + 1] = l[a];
    }
  }
  dec_finish(out, part, done, ctx_len, r, kh, g, nh, kvh, hd, split_keys, splits);
}
RF_TYPED(decode_attn,
         (T * out, float* part, unsigned* done, const T* qkv, const T* kc, const T* vc, const int* block_tables, const int* ctx_len,
          int max_blocks, int block_size, int nh, int kvh, int hd, int ldq, float scale, int split_keys, int splits),
         (out, part, done, qkv, kc, vc, block_tables, ctx_len, max_blocks, block_size, nh, kvh, hd, ldq, scale, split_keys, splits))

// Decode attention on tensor cores (bf16, head dims 16 to 128): decode_attn's grid, splits,
// partials and merge (but for rows whose context fits one split: see `alone` below), with the g ≤ 16 query heads that share a KV head as the 16 rows of the
// m16n8k16 products (rows past g are zeros). A (row, KV head)'s keys and values are then read
// once for the whole group, and q·kᵀ and p·v run on tensor cores, as FlashInfer does for GQA
// decode. The CUDA-core kernel does both in f32 from shared memory, one multiply-add per
// shared load; on an H200 (2026-11-27) it was about half of the rollout's device time at batch
// 64 (SmolLM2-135M and Qwen2.5-1.5B's shapes), some 30× its share of the bytes read.
// Each warp takes every fourth 16-key chunk of the block's split with its own online softmax
// (FlashAttention-2's forward on 16 query rows), copying the chunk's keys and values into its
// own shared memory with cp.async, two stages deep (tc_pipeline, each warp on its own), so the
// loop has no block-wide barrier; the four warps' states are combined in shared memory at the
// end. Scores are in log2 units (exp2f), as in attention_tc.cu; the partials' max is written in
// natural-log units, as decode_attn writes it. Dynamic shared memory: max(4 · 2 · 2 · 16 ·
// (HD + 8) bf16, (4 · 16 · HD + 2 · 4 · 16) f32).
//
// ROPE: the row's new token is in `qkv` as the QKV projection left it, not yet rotated nor in
// the cache: rope_kv_store's work is done here, which saves a decode step a launch per layer
// (a few microseconds each, against a layer's ~40 µs on SmolLM2-135M). Each block rotates its
// query heads as it loads them (tc_rope_a), and the block of the split that holds the newest
// position (ctx_len − 1, at cache slot slots[r]) rotates that token's key for its KV head and
// stores it and the value into the cache before any of its warps stages that position; no
// other block reads it (but for decode's padding rows, which all write the same bytes to one
// scratch slot and whose outputs are dropped). The bits are rope_kv_store's, so the output is
// the same as with the separate launch. `qkv` is left unrotated.
#define RF_DTC_KEYS 16
template <int HD, bool ROPE>
RF_DEV void decode_attn_tc_impl(bf16* __restrict__ out, float* __restrict__ part, unsigned* __restrict__ done, const bf16* __restrict__ qkv,
                                bf16* __restrict__ kc, bf16* __restrict__ vc, const int* __restrict__ block_tables,
                                const int* __restrict__ ctx_len, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                const int* __restrict__ pos, const int* __restrict__ slots, int max_blocks, int block_size, int nh, int kvh,
                                int ldq, float scale, int split_keys, int splits) {
  constexpr int ld = HD + TC_PAD;
  constexpr int VPR = HD / 8;                        // 16-byte vectors per key row
  constexpr int LOADS = RF_DTC_KEYS * VPR / 32;      // of keys (and of values) per lane per chunk
  constexpr int half = HD / 2;
  RF_DYN_SMEM(smem);
  grid_release();
  int r = blockIdx.x, kh = blockIdx.y, sp = blockIdx.z;
  int g = nh / kvh;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, qr = lane >> 2, t = lane & 3, nwarps = blockDim.x >> 5;
  int k0 = sp * split_keys;
  int ctx = ctx_len[r];  // the step's input, like the block tables, positions and slots
  int len = min(ctx, k0 + split_keys);  // this split's end
  const bf16* row = qkv + (size_t)r * ldq;
  const int* table = block_tables + (size_t)r * max_blocks;
  // This warp's two stages, each a chunk's keys [16][ld] then values [16][ld]: chunk i + 1's
  // block-table reads and copies are in flight while chunk i is computed (one chunk at a time
  // left each warp waiting on memory for every chunk: 24 µs a call on an H200, 2026-11-27).
  bf16* stage = reinterpret_cast<bf16*>(smem) + warp * 2 * 2 * RF_DTC_KEYS * ld;
  int step = nwarps * RF_DTC_KEYS;
  auto valid = [&](int c0) { return c0 < len; };
  auto next = [&](int c0) { return c0 + step; };
  // Stages chunk c0 into stage buffer `buf`: lane j < 16 finds key c0 + j's slot (one
  // block-table read per key, −1 past the split), then every copy of the chunk is in flight
  // at once (cp.async: no registers held); slots past the split are zero-filled.
  auto fetch = [&](int c0, int buf) {
    bf16* ks = stage + buf * 2 * RF_DTC_KEYS * ld;
    bf16* vs = ks + RF_DTC_KEYS * ld;
    int my_slot = lane < RF_DTC_KEYS ? cache_slot(table, c0 + lane, len, block_size) : -1;
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
      int e = lane + 32 * i, j = e / VPR, d = (e % VPR) * 8;
      int slot = __shfl_sync(RF_FULL_MASK, my_slot, j);
      if (slot >= 0) {
        size_t idx = ((size_t)slot * kvh + kh) * HD + d;
        cp_async16(ks + j * ld + d, kc + idx);
        cp_async16(vs + j * ld + d, vc + idx);
      } else {
        st_b128(ks + j * ld + d, rf_b128{{0u, 0u, 0u, 0u}});
        st_b128(vs + j * ld + d, rf_b128{{0u, 0u, 0u, 0u}});
      }
    }
  };
  int first = k0 + warp * RF_DTC_KEYS;
  // q, and the newest position's k and v, are the kernel before's output (or, ROPE, this
  // kernel's store). A split that ends before the newest position reads only keys and values
  // that earlier steps stored, which no kernel of this step writes: its first chunks' copies
  // go out before grid_wait(), so under a dependent launch they stream in while the kernel
  // before (the QKV projection) finishes. The split that holds the newest position waits first.
  bool early = len < ctx;  // uniform over the block (and then k0 < len)
  if (early) tc_pipeline_start(first, valid, fetch);
  grid_wait();
  if (k0 >= len) return;  // uniform over the block; after the wait, as every block's exit must be
  const float* cr = nullptr;
  const float* sr = nullptr;
  if (ROPE) {
    cr = cos_t + (size_t)pos[r] * half;
    sr = sin_t + (size_t)pos[r] * half;
    if (!early) {  // uniform: this split holds the newest position
      size_t o = ((size_t)slots[r] * kvh + kh) * HD;
      const bf16* kn = row + (size_t)(nh + kh) * HD;
      const bf16* vn = row + (size_t)(nh + kvh + kh) * HD;
      for (int i = threadIdx.x; i < half; i += blockDim.x) rope_rot(to_f(kn[i]), to_f(kn[i + half]), cr[i], sr[i], kc + o + i, kc + o + i + half);
      for (int i = threadIdx.x; i < HD; i += blockDim.x) vc[o + i] = vn[i];
      // The warps' copies of this position (cp.async, from L2) follow these stores: visible
      // device-wide first, then the barrier orders them before every warp's loop.
      __threadfence();
      __syncthreads();
    }
  }
  if (!early) tc_pipeline_start(first, valid, fetch);
  // The first chunk is on its way while q is read. Row i of the query fragments is head
  // kh·g + i of row r's q (stride HD), zeros from g on.
  uint32_t qf[HD / 16][4];
  tc_rows_a<HD>(qf, row + (size_t)kh * g * HD, 0, 0, g, HD, 0);
  if (ROPE) tc_rope_a<HD>(qf, cr, sr);
  float o[HD / 8][4];
#pragma unroll
  for (int nd = 0; nd < HD / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
  float m[2] = {-RF_INF, -RF_INF}, l[2] = {0.f, 0.f};
  float sl2 = scale * RF_LOG2E;
  tc_pipeline_run<TcSync::Warp>(first, valid, next, fetch, [&](int c0, int buf) {
    const bf16* ks = stage + buf * 2 * RF_DTC_KEYS * ld;
    const bf16* vs = ks + RF_DTC_KEYS * ld;
    float s[2][4];  // scores: query rows × the chunk's two 8-key tiles
    tc_scores<HD, 2>(s, qf, ks, ld);
#pragma unroll
    for (int nb = 0; nb < 2; ++nb)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[nb][i] = c0 + 8 * nb + 2 * t + (i & 1) < len ? s[nb][i] * sl2 : -RF_INF;
    tc_softmax_step<HD, 2>(s, m, l, o);
    tc_acc_pm<HD, 1>(o, s, vs, ld);
  });
  cp_async_wait<0>();  // a guard: the pipeline's last group is empty
  // The warps' states into shared memory (over the staging buffers), then one state per
  // query head of the group: o = Σ_w o_w·2^(m_w − M), l = Σ_w l_w·2^(m_w − M), M = max_w m_w.
  // A warp that had no chunk holds m = −∞, l = 0, o = 0, which adds nothing.
  __syncthreads();
  float* om = smem;                     // [nwarps][16][HD]
  float* wm = om + nwarps * 16 * HD;    // [nwarps][16]
  float* wl = wm + nwarps * 16;         // [nwarps][16]
#pragma unroll
  for (int nd = 0; nd < HD / 8; ++nd)
#pragma unroll
    for (int i = 0; i < 4; ++i) om[(warp * 16 + qr + 8 * (i >> 1)) * HD + nd * 8 + 2 * t + (i & 1)] = o[nd][i];
  if (t == 0) {
    wm[warp * 16 + qr] = m[0];
    wm[warp * 16 + qr + 8] = m[1];
    wl[warp * 16 + qr] = l[0];
    wl[warp * 16 + qr + 8] = l[1];
  }
  __syncthreads();
  // A row whose context fits one split has this block alone: it writes `out` itself, with no
  // partials, fence, count or second read — the bits dec_finish's merge of one split gives
  // (its factors are all e⁰ = 1). Every step of a rollout whose contexts are still short.
  bool alone = min(splits, (ctx + split_keys - 1) / split_keys) == 1;  // uniform over the block
  for (int e = threadIdx.x; e < g * HD; e += blockDim.x) {
    int hrow = e / HD, d = e % HD;
    float mmax = -RF_INF;
    for (int w = 0; w < nwarps; ++w) mmax = fmaxf(mmax, wm[w * 16 + hrow]);
    float acc = 0.f;
    for (int w = 0; w < nwarps; ++w) acc += om[(w * 16 + hrow) * HD + d] * exp2f(wm[w * 16 + hrow] - mmax);
    if (alone || d == 0) {
      float sum = 0.f;
      for (int w = 0; w < nwarps; ++w) sum += wl[w * 16 + hrow] * exp2f(wm[w * 16 + hrow] - mmax);
      if (alone) {
        out[(size_t)r * nh * HD + (kh * g + hrow) * HD + d] = from_f<bf16>((0.f + acc) * (sum > 0.f ? 1.f / sum : 0.f));
        continue;
      }
      float* p = part + (((size_t)r * nh + kh * g + hrow) * splits + sp) * (HD + 2);
      p[HD] = mmax * RF_LN2;
      p[HD + 1] = sum;
    }
    part[(((size_t)r * nh + kh * g + hrow) * splits + sp) * (HD + 2) + d] = acc;
  }
  if (!alone) dec_finish(out, part, done, ctx_len, r, kh, g, nh, kvh, HD, split_keys, splits);
}
// The cache already holds every position and q is rotated (rope_kv_store ran first).
template <int HD>
RF_DEV void decode_attn_tc(bf16* out, float* part, unsigned* done, const bf16* qkv, bf16* kc, bf16* vc, const int* block_tables,
                           const int* ctx_len, int max_blocks, int block_size, int nh, int kvh, int ldq, float scale, int split_keys,
                           int splits) {
  decode_attn_tc_impl<HD, false>(out, part, done, qkv, kc, vc, block_tables, ctx_len, nullptr, nullptr, nullptr, nullptr, max_blocks,
                                 block_size, nh, kvh, ldq, scale, split_keys, splits);
}
RF_HEAD_DIMS(decode_attn_tc,
             (bf16 * out, float* part, unsigned* done, const bf16* qkv, bf16* kc, bf16* vc, const int* block_tables, const int* ctx_len,
              int max_blocks, int block_size, int nh, int kvh, int ldq, float scale, int split_keys, int splits),
             (out, part, done, qkv, kc, vc, block_tables, ctx_len, max_blocks, block_size, nh, kvh, ldq, scale, split_keys, splits))
// The new token's RoPE and cache store fused in (see ROPE above).
template <int HD>
RF_DEV void decode_attn_tc_rope(bf16* out, float* part, unsigned* done, const bf16* qkv, bf16* kc, bf16* vc, const int* block_tables,
                                const int* ctx_len, const float* cos_t, const float* sin_t, const int* pos, const int* slots, int max_blocks,
                                int block_size, int nh, int kvh, int ldq, float scale, int split_keys, int splits) {
  decode_attn_tc_impl<HD, true>(out, part, done, qkv, kc, vc, block_tables, ctx_len, cos_t, sin_t, pos, slots, max_blocks, block_size, nh,
                                kvh, ldq, scale, split_keys, splits);
}
RF_HEAD_DIMS(decode_attn_tc_rope,
             (bf16 * out, float* part, unsigned* done, const bf16* qkv, bf16* kc, bf16* vc, const int* block_tables, const int* ctx_len,
              const float* cos_t, const float* sin_t, const int* pos, const int* slots, int max_blocks, int block_size, int nh, int kvh,
              int ldq, float scale, int split_keys, int splits),
             (out, part, done, qkv, kc, vc, block_tables, ctx_len, cos_t, sin_t, pos, slots, max_blocks, block_size, nh, kvh, ldq, scale,
              split_keys, splits))

// dst block ← src block (all layers' caches are passed as one flat range per call):
// copies `n` whole blocks, pairs (src[i], dst[i]), of `block_elems` elements each.
template <class T>
RF_DEV void copy_blocks(T* __restrict__ cache, const int* __restrict__ src, const int* __restrict__ dst, int n, long long block_elems) {
  int b = blockIdx.x;
  if (b >= n) return;
  const T* s = cache + (size_t)src[b] * block_elems;
  T* d = cache + (size_t)dst[b] * block_elems;
  for (long long e = threadIdx.x; e < block_elems; e += blockDim.x) d[e] = s[e];
}
RF_TYPED(copy_blocks, (T * cache, const int* src, const int* dst, int n, long long block_elems), (cache, src, dst, n, block_elems))

RF_EMU_TABLE(paged, RF_EMU_TYPED(rope_kv_store), RF_EMU_TYPED(decode_attn), RF_EMU_HEAD_DIMS(decode_attn_tc),
             RF_EMU_HEAD_DIMS(decode_attn_tc_rope), RF_EMU_TYPED(copy_blocks))
