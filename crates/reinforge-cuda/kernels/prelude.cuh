// Shared by every kernel: integer types (NVRTC has no standard headers), the bf16 storage
// type and its conversions, warp and block reductions.
//
// Kernels are templates over the activation/weight storage type `T` (float or bf16; the
// math is always f32) and exported once per type as `extern "C"` entry points named
// `<kernel>_f32` / `<kernel>_bf16`. The same source compiles with NVRTC for the GPU and
// with the host C++ compiler (RF_EMU) for the emulator in ../emu.
#pragma once

#ifdef RF_EMU
#include "emu.h"
#define RF_KERNEL extern "C"
#else
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef long long int64_t;
#define RF_KERNEL extern "C" __global__
#endif

#define RF_DEV __device__ __forceinline__
#define RF_INF __int_as_float(0x7f800000)
#define RF_FULL_MASK 0xffffffffu

/// Programmatic dependent launch (sm_90+; no-ops before, and on the emulator, which runs
/// launches one after another). A kernel the host launches as dependent (Ops::launch_after)
/// may start while the kernel before it in the stream still runs: until grid_wait() returns
/// it may only read what no kernel of the step writes (weights, tables, the cache positions
/// earlier steps stored) and may write nothing but its own shared memory; after it, every
/// earlier kernel has finished and its writes are visible.
/// grid_release() lets the next dependent kernel's blocks be scheduled (once every block of
/// this one has called it or exited); it orders nothing, so calling it first is safe.
RF_DEV void grid_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
RF_DEV void grid_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/// bfloat16 as raw bits: the upper half of an f32.
struct bf16 {
  uint16_t bits;
};

RF_DEV float to_f(float x) { return x; }
RF_DEV float to_f(bf16 x) { return __uint_as_float(((uint32_t)x.bits) << 16); }

template <class T>
RF_DEV T from_f(float x);

template <>
RF_DEV float from_f<float>(float x) {
  return x;
}

/// Round to nearest even, as PyTorch's and cuBLAS's conversions do.
template <>
RF_DEV bf16 from_f<bf16>(float x) {
  bf16 r;
#ifdef RF_EMU
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.bits = 0x7fc0;  // NaN
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    r.bits = (uint16_t)(u >> 16);
  }
#else
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
#endif
  return r;
}

RF_DEV float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RF_FULL_MASK, v, o);
  return v;
}

RF_DEV float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(RF_FULL_MASK, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, every thread calls it); every thread gets
/// the total. `scratch` is a `__shared__ float[32]` of the caller's.
RF_DEV float block_sum(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // the previous call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : 0.f;
  return warp_sum(v);
}

/// Max over the block, as `block_sum`.
RF_DEV float block_max(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : -RF_INF;
  return warp_max(v);
}

/// The logistic function (SwiGLU's gate: elementwise.cu, and decode_linear.cu's epilogue).
RF_DEV float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

/// u = z / T as `z · inv_t`, rounded once: never fused into a later subtraction (NVRTC
/// contracts a·b − c into an FMA where it can, per site), so every kernel and pass sees the
/// same u — the LM head's log-probs and the sampler's agree — and the largest logit's weight
/// is exactly 1.
RF_DEV float scaled(float z, float inv_t) { return __fmul_rn(z, inv_t); }

/// w = exp(u − max), the same bits at every site.
RF_DEV float weight(float u, float mx) { return expf(__fsub_rn(u, mx)); }

/// The softmax statistics of a set of u in one pass: the largest u (m), Σ e^(u−m) (s) and
/// Σ e^(u−m)·(u−m) (su). A row of logits read twice (max first, then sums) would come from
/// memory twice: the LM head's rows and the sampler's take them in one read. s = 0: nothing yet.
struct SoftStats {
  float m, s, su;
};

RF_DEV void soft_add(SoftStats& a, float u) {
  if (u == -RF_INF) return;  // no weight (and −∞ − −∞ would be NaN while nothing is in yet)
  if (u > a.m) {
    if (a.s > 0.f) {  // a new max: rescale what is there to it
      float d = __fsub_rn(a.m, u), c = expf(d);
      a.su = c * (a.su + a.s * d);
      a.s = c * a.s;
    }
    a.m = u;
  }
  float d = __fsub_rn(u, a.m), e = expf(d);
  a.s += e;
  a.su += e * d;
}

/// The statistics of the union of two sets.
RF_DEV SoftStats soft_merge(SoftStats a, SoftStats b) {
  if (b.s == 0.f) return a;
  if (a.s == 0.f) return b;
  float m = fmaxf(a.m, b.m);
  float da = __fsub_rn(a.m, m), db = __fsub_rn(b.m, m);
  float ca = expf(da), cb = expf(db);
  SoftStats r;
  r.m = m;
  r.s = ca * a.s + cb * b.s;
  r.su = ca * (a.su + a.s * da) + cb * (b.su + b.s * db);
  return r;
}

/// `v` merged over the warp into lane 0 (a fixed tree, so the same bits every run).
RF_DEV SoftStats soft_warp(SoftStats v) {
  for (int o = 16; o > 0; o >>= 1) {
    SoftStats w;
    w.m = __shfl_down_sync(RF_FULL_MASK, v.m, o);
    w.s = __shfl_down_sync(RF_FULL_MASK, v.s, o);
    w.su = __shfl_down_sync(RF_FULL_MASK, v.su, o);
    v = soft_merge(v, w);
  }
  return v;
}

/// `v` of every thread merged over the block, to every thread (a fixed tree: the same bits
/// every run). `sm`, `ss`, `ssu`: `__shared__ float[32]` scratch of the caller's.
RF_DEV SoftStats soft_block(SoftStats v, float* sm, float* ss, float* ssu) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = soft_warp(v);
  __syncthreads();  // a previous call's readers are done with the scratch
  if (lane == 0) {
    sm[warp] = v.m;
    ss[warp] = v.s;
    ssu[warp] = v.su;
  }
  __syncthreads();
  v.m = lane < nw ? sm[lane] : -RF_INF;
  v.s = lane < nw ? ss[lane] : 0.f;
  v.su = lane < nw ? ssu[lane] : 0.f;
  v = soft_warp(v);
  v.m = __shfl_sync(RF_FULL_MASK, v.m, 0);
  v.s = __shfl_sync(RF_FULL_MASK, v.s, 0);
  v.su = __shfl_sync(RF_FULL_MASK, v.su, 0);
  return v;
}


/// RoPE's rotation of a pair (a, b) by the angle with cosine c and sine s, rounded as stored,
/// into *ya and *yb. Every product is rounded on its own (no FMA contraction, which the
/// compiler may choose per site), so the trainer's rope and the rollout's rope_kv_store give
/// the same bits for the same inputs.
template <class T>
RF_DEV void rope_rot(float a, float b, float c, float s, T* ya, T* yb) {
  *ya = from_f<T>(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
  *yb = from_f<T>(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
}
/// rope_rot of the pair (head[i], head[i + half]), written back in place.
template <class T>
RF_DEV void rope_pair(T* head, int i, int half, float c, float s, T* ya, T* yb) {
  rope_rot(to_f(head[i]), to_f(head[i + half]), c, s, ya, yb);
  head[i] = *ya;
  head[i + half] = *yb;
}

// `RF_TYPED(name, (params using T), (args))` exports the device template `name<T>` twice:
// `name_f32` (T = float) and `name_bf16` (T = bf16). The entry points sit in namespaces only
// so that `T` can be a typedef in their signatures; extern "C" names ignore namespaces.
#define RF_TYPED(NAME, SIG, CALL)                   \
  namespace rf_f32 {                                \
  typedef float T;                                  \
  RF_KERNEL void NAME##_f32 SIG { NAME<T> CALL; }   \
  }                                                 \
  namespace rf_bf16 {                               \
  typedef bf16 T;                                   \
  RF_KERNEL void NAME##_bf16 SIG { NAME<T> CALL; }  \
  }

// The emulator's table of a file's kernels (see ../emu/registry.cpp, generated by build.rs):
// `RF_EMU_TABLE(file, entries...)` with `RF_EMU_TYPED(name)` for a pair from RF_TYPED and
// `RF_EMU_PLAIN(name)` for a single kernel.
#ifdef RF_EMU
#define RF_EMU_TYPED(NAME) \
  ::rf_emu::entry<&rf_f32::NAME##_f32>(#NAME "_f32"), ::rf_emu::entry<&rf_bf16::NAME##_bf16>(#NAME "_bf16")
#define RF_EMU_PLAIN(NAME) ::rf_emu::entry<&NAME>(#NAME)
#define RF_EMU_TABLE(FILE, ...)                                             \
  static constexpr ::rf_emu::Entry rf_emu_table_##FILE[] = {__VA_ARGS__}; \
  static constexpr size_t rf_emu_table_##FILE##_len = sizeof(rf_emu_table_##FILE) / sizeof(::rf_emu::Entry);
#else
#define RF_EMU_TABLE(FILE, ...)
#endif

// `RF_DYN_SMEM(name)`: `float* name` = the block's dynamic shared memory (the launch's
// `smem` bytes).
#ifdef RF_EMU
#define RF_DYN_SMEM(name) float* name = (float*)::rf_emu::dyn_smem
#else
#define RF_DYN_SMEM(name)                       \
  extern __shared__ __align__(16) float rf_dyn_smem_[]; \
  float* name = rf_dyn_smem_
#endif

// Tensor cores (sm_80+, which the engine requires for bf16): one warp's 16×8×16 bf16
// multiply-accumulate into f32, and four 8×8 b16 matrices loaded transposed from shared
// memory, in PTX's fragment layouts. With g = lane / 4 and t = lane % 4:
//   A (16×16, row-major), a[0..3] = A[g][2t..2t+1], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]
//   B (16×8),             b[0..1] = B[2t..2t+1][g], B[2t+8..2t+9][g]
//   C, D (16×8, f32),     d[0..3] = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]
// each .b32 holding two bf16, the lower-indexed one in the low half. The emulator gathers
// the warp's fragments and multiplies exactly in these layouts, so a fragment mistake fails
// the emulator's tests as it would fail on the GPU.

/// Two bf16 (round to nearest even) in one .b32: `lo` in the low half.
RF_DEV uint32_t pack_bf16(float lo, float hi) { return (uint32_t)from_f<bf16>(lo).bits | ((uint32_t)from_f<bf16>(hi).bits << 16); }

/// The .b32 at `p` (4-byte aligned): two bf16.
RF_DEV uint32_t ld_b32(const bf16* p) {
#ifdef RF_EMU
  if (reinterpret_cast<uintptr_t>(p) % 4 != 0) ::rf_emu::misuse("a .b32 load from an address that is not 4-byte aligned (a misaligned-address fault on the GPU)");
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#else
  return *reinterpret_cast<const uint32_t*>(p);
#endif
}

/// Stores a .b32 (two bf16) at `p` (4-byte aligned).
RF_DEV void st_b32(bf16* p, uint32_t v) {
#ifdef RF_EMU
  if (reinterpret_cast<uintptr_t>(p) % 4 != 0) ::rf_emu::misuse("a .b32 store to an address that is not 4-byte aligned (a misaligned-address fault on the GPU)");
  std::memcpy(p, &v, 4);
#else
  *reinterpret_cast<uint32_t*>(p) = v;
#endif
}

/// 16 bytes, loaded or stored as one vector access.
struct __align__(16) rf_b128 {
  uint32_t w[4];
};

/// The 16 bytes at `p` (16-byte aligned) in one load.
RF_DEV rf_b128 ld_b128(const void* p) {
#ifdef RF_EMU
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) ::rf_emu::misuse("a 16-byte load from an address that is not 16-byte aligned (a misaligned-address fault on the GPU)");
  rf_b128 v;
  std::memcpy(&v, p, 16);
  return v;
#else
  return *reinterpret_cast<const rf_b128*>(p);
#endif
}

/// Stores 16 bytes at `p` (16-byte aligned) in one vector access.
RF_DEV void st_b128(void* p, const rf_b128& v) {
#ifdef RF_EMU
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) ::rf_emu::misuse("a 16-byte store to an address that is not 16-byte aligned (a misaligned-address fault on the GPU)");
  std::memcpy(p, &v, 16);
#else
  *reinterpret_cast<rf_b128*>(p) = v;
#endif
}

/// Starts copying 16 bytes from global `src` to shared `dst` (both 16-byte aligned) without
/// passing through registers (cp.async, sm_80+), in the group the next cp_async_commit closes.
/// The copy is visible to this thread after a cp_async_wait that covers its group, to the
/// block after that and a barrier.
RF_DEV void cp_async16(void* dst, const void* src) {
#ifdef RF_EMU
  ::rf_emu::cp_async(dst, src, 16);
#elif __CUDA_ARCH__ >= 800
  uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
#else
  __trap();
#endif
}

/// cp_async16 of 4 bytes (both addresses 4-byte aligned), through L1 (.ca: the only kind for
/// fewer than 16 bytes).
RF_DEV void cp_async4(void* dst, const void* src) {
#ifdef RF_EMU
  ::rf_emu::cp_async(dst, src, 4);
#elif __CUDA_ARCH__ >= 800
  uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
#else
  __trap();
#endif
}

/// Closes this thread's group of cp.async copies.
RF_DEV void cp_async_commit() {
#ifdef RF_EMU
  ::rf_emu::cp_async_commit();
#elif __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

/// Waits until at most N of this thread's committed cp.async groups, the latest, are in flight.
template <int N>
RF_DEV void cp_async_wait() {
#ifdef RF_EMU
  ::rf_emu::cp_async_wait(N);
#elif __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

/// A float another block of this launch wrote (after a __threadfence): read from L2, past this
/// SM's L1, which is not coherent with other SMs' writes.
RF_DEV float ld_cg(const float* p) {
#ifdef RF_EMU
  return *p;
#else
  return __ldcg(p);
#endif
}

/// 16 bytes loaded from memory of type T (the pointer only picks the type) as their
/// 16 / sizeof(T) values, in floats.
RF_DEV void unpack16(const rf_b128& v, float* out, const float*) {
  for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(v.w[i]);
}
RF_DEV void unpack16(const rf_b128& v, float* out, const bf16*) {
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(v.w[i] << 16);
    out[2 * i + 1] = __uint_as_float(v.w[i] & 0xffff0000u);
  }
}

/// 16 / sizeof(T) floats as 16 bytes of T (bf16 rounded to nearest even; the pointer only
/// picks the type).
RF_DEV rf_b128 pack16(const float* in, const float*) {
  rf_b128 v;
  for (int i = 0; i < 4; ++i) v.w[i] = __float_as_uint(in[i]);
  return v;
}
RF_DEV rf_b128 pack16(const float* in, const bf16*) {
  rf_b128 v;
  for (int i = 0; i < 4; ++i) v.w[i] = pack_bf16(in[2 * i], in[2 * i + 1]);
  return v;
}

/// The 16 / sizeof(T) values of T at `p` (16-byte aligned) as floats, in one load.
template <class T>
RF_DEV void ld_floats16(const T* p, float* out) {
  unpack16(ld_b128(p), out, p);
}

// RMSNorm's forward as rmsnorm_fwd_rows takes it — a lane adds the squares of its 16-byte
// vectors (lane, lane + 32, …) in order, the warp sums the lanes — shared so that a kernel
// that normalises rows inside another (decode_linear.cu) gets the same bits.
template <class T>
RF_DEV float rms_add_squares(float ss, const rf_b128& v, const T* type) {
  float f[16 / sizeof(T)];
  unpack16(v, f, type);
  for (int k = 0; k < 16 / (int)sizeof(T); ++k) ss += f[k] * f[k];
  return ss;
}
/// 1/rms of a row of h values from its lanes' sums of squares (the whole warp calls it).
RF_DEV float rms_rstd(float lane_ss, int h, float eps) { return rsqrtf(warp_sum(lane_ss) / (float)h + eps); }
/// A normalised value: weight · (x · rstd).
RF_DEV float rms_scale(float x, float rstd, float w) { return w * (x * rstd); }

/// d += a · b on the warp's tensor cores (m16n8k16, bf16 × bf16 → f32).
RF_DEV void mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef RF_EMU
  ::rf_emu::mma_bf16_16816(d, a, b);
#elif __CUDA_ARCH__ >= 800
  // volatile, as CUTLASS has it: a warp-collective instruction (.sync.aligned) the compiler
  // must neither drop, duplicate nor move out of the warp-uniform branch that reaches it.
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}

/// ldmatrix .x4 .trans: lane l passes the address of row l % 8 of matrix l / 8 (16-byte
/// aligned, shared memory); r[j] gets matrix j transposed: (M_j[2t][g], M_j[2t+1][g]).
RF_DEV void ldsm_x4_trans(uint32_t r[4], const bf16* row) {
#ifdef RF_EMU
  ::rf_emu::ldsm_x4_trans(r, row);
#elif __CUDA_ARCH__ >= 800
  uint32_t addr = (uint32_t)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");  // it reads shared memory the compiler must not cache around it
#else
  __trap();
#endif
}

// Tensor-core fragments shared by the attention kernels (attention_tc.cu, paged.cu).
//
// Shared-memory rows are padded by 8 bf16 (a stride of HD + 8 elements: an odd multiple of 16
// bytes): the fragment loads (8 rows × 4 words) and ldmatrix's 8 row reads then
// hit distinct banks, and every ldmatrix row stays 16-byte aligned.
#define TC_PAD 8
#define RF_LOG2E 1.4426950408889634f
#define RF_LN2 0.6931471805599453f

// A fragments (rows 16, all HD columns) of rows `row0 + g`, `row0 + g + 8` of a bf16 matrix in
// global memory (sequence `s0`, row stride `ldg`, columns from `col`); rows ≥ `end` are zeros.
template <int HD>
RF_DEV void tc_rows_a(uint32_t a[HD / 16][4], const bf16* __restrict__ src, int s0, int row0, int end, int ldg, int col) {
  int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const bf16* r0 = src + (size_t)(s0 + row0 + g) * ldg + col + 2 * t;
  const bf16* r1 = r0 + (size_t)8 * ldg;
  bool ok0 = row0 + g < end, ok1 = row0 + g + 8 < end;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    a[kk][0] = ok0 ? ld_b32(r0 + 16 * kk) : 0u;
    a[kk][1] = ok1 ? ld_b32(r1 + 16 * kk) : 0u;
    a[kk][2] = ok0 ? ld_b32(r0 + 16 * kk + 8) : 0u;
    a[kk][3] = ok1 ? ld_b32(r1 + 16 * kk + 8) : 0u;
  }
}

// The A fragment of the 16×16 block at `s` of a row-major shared matrix (stride `ld`).
RF_DEV void tc_frag_a(uint32_t a[4], const bf16* s, int ld) {
  int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  a[0] = ld_b32(s + g * ld + 2 * t);
  a[1] = ld_b32(s + (g + 8) * ld + 2 * t);
  a[2] = ld_b32(s + g * ld + 2 * t + 8);
  a[3] = ld_b32(s + (g + 8) * ld + 2 * t + 8);
}

// The B fragment (16 × 8) of Mᵀ, where M's 8 rows × 16 columns start at `s` (row-major,
// stride `ld`): B[k][n] = M[n][k]. This is K for Q·Kᵀ: a row per key.
RF_DEV void tc_frag_bt(uint32_t b[2], const bf16* s, int ld) {
  int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  b[0] = ld_b32(s + g * ld + 2 * t);
  b[1] = ld_b32(s + g * ld + 2 * t + 8);
}

// The B fragments of two 8-column tiles of M itself (16 rows k × 16 columns n at `s`,
// row-major, stride `ld`): b[0..1] for columns 0–7, b[2..3] for 8–15. This is V for P·V.
RF_DEV void tc_frag_b2(uint32_t b[4], const bf16* s, int ld) {
  int lane = threadIdx.x & 31, j = lane >> 3, r = lane & 7;
  ldsm_x4_trans(b, s + ((j & 1) * 8 + r) * ld + (j >> 1) * 8);
}

// acc[HD/8] += A(16 × 16·KT, as f32 accumulators c[2·KT] of a previous product, rounded to
// bf16) · M (16·KT rows × HD, shared, stride `ld`). The f32 accumulator layout of two adjacent
// 8-column tiles is the A fragment layout of one 16×16 block (FlashAttention-2's trick).
template <int HD, int KT>
RF_DEV void tc_acc_pm(float acc[HD / 8][4], const float c[2 * KT][4], const bf16* m, int ld) {
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    uint32_t a[4] = {pack_bf16(c[2 * kk][0], c[2 * kk][1]), pack_bf16(c[2 * kk][2], c[2 * kk][3]),
                     pack_bf16(c[2 * kk + 1][0], c[2 * kk + 1][1]), pack_bf16(c[2 * kk + 1][2], c[2 * kk + 1][3])};
#pragma unroll
    for (int nd = 0; nd < HD / 16; ++nd) {
      uint32_t b[4];
      tc_frag_b2(b, m + kk * 16 * ld + nd * 16, ld);
      mma_bf16(acc[2 * nd], a, b);
      mma_bf16(acc[2 * nd + 1], a, b + 2);
    }
  }
}

// s = q·kᵀ for a warp's 16 query rows (A fragments `qf`) against NB 8-key tiles of keys held
// a row per key in shared memory at `ks` (stride `ld`); dQ also takes dout·vᵀ from it.
template <int HD, int NB>
RF_DEV void tc_scores(float s[NB][4], const uint32_t qf[HD / 16][4], const bf16* ks, int ld) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
    s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t b[2];
      tc_frag_bt(b, ks + nb * 8 * ld + kk * 16, ld);
      mma_bf16(s[nb], qf[kk], b);
    }
  }
}

// FlashAttention-2's online-softmax step for a warp's 16 query rows after a chunk of keys: `s`
// holds the chunk's scores (log2 units, masked ones −∞) as NB 8-key tiles and becomes
// p = 2^(s − m') in place, m' the rows' new running max; this lane's two rows' max `m` and sum
// `l`, and the output accumulators `o`, are rescaled to m'. A row with every key so far masked
// keeps m = −∞ and p = 0.
template <int HD, int NB>
RF_DEV void tc_softmax_step(float s[NB][4], float m[2], float l[2], float o[HD / 8][4]) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int i = 0; i < 4; ++i) mx[i >> 1] = fmaxf(mx[i >> 1], s[nb][i]);
  float corr[2], rs[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // The four lanes of a quad hold one row between them.
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(RF_FULL_MASK, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(RF_FULL_MASK, mx[r], 2));
    corr[r] = mx[r] == -RF_INF ? 1.f : exp2f(m[r] - mx[r]);
  }
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float mr = mx[i >> 1];
      float p = mr == -RF_INF ? 0.f : exp2f(s[nb][i] - mr);
      s[nb][i] = p;
      rs[i >> 1] += p;
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rs[r] += __shfl_xor_sync(RF_FULL_MASK, rs[r], 1);
    rs[r] += __shfl_xor_sync(RF_FULL_MASK, rs[r], 2);
    l[r] = l[r] * corr[r] + rs[r];
    m[r] = mx[r];
  }
#pragma unroll
  for (int nd = 0; nd < HD / 8; ++nd) {
    o[nd][0] *= corr[0];
    o[nd][1] *= corr[0];
    o[nd][2] *= corr[1];
    o[nd][3] *= corr[1];
  }
}

// Who waits at a two-stage pipeline's barriers: the block's threads together (the training
// attention kernels share each chunk across warps) or each warp on its own (decode attention,
// whose warps stream chunks of their own, so no warp waits on another's).
enum class TcSync { Block, Warp };
template <TcSync S>
RF_DEV void tc_sync() {
  if (S == TcSync::Block) __syncthreads();
  else __syncwarp();
}

// The first half of tc_pipeline: issues the first item's copies into buffer 0 and closes their
// group. A caller with other loads to issue (decode attention's query) puts them between this
// and tc_pipeline_run, so they overlap the copies.
template <class Item, class Valid, class Copy>
RF_DEV void tc_pipeline_start(Item item, Valid valid, Copy copy) {
  if (valid(item)) copy(item, 0);
  cp_async_commit();
}

// The rest of tc_pipeline, after tc_pipeline_start(item, …): the loop over the items.
template <TcSync S, class Item, class Valid, class Next, class Copy, class Body>
RF_DEV void tc_pipeline_run(Item item, Valid valid, Next next, Copy copy, Body body) {
  for (int buf = 0; valid(item); buf ^= 1) {
    Item after = next(item);
    // Into the other buffer, which every thread finished reading before the last barrier.
    if (valid(after)) copy(after, buf ^ 1);
    cp_async_commit();   // possibly empty: the wait below then always leaves one group in flight
    cp_async_wait<1>();  // this item's copies (all but the group just committed) have landed
    tc_sync<S>();        // and every thread's are visible
    body(item, buf);
    tc_sync<S>();  // every thread is done with this buffer before the next iteration refills it
    item = after;
  }
}

// Runs `body(item, buf)` over the items `first`, `next(first)`, … while `valid(item)`, each
// item's data in shared-memory buffer `buf` (0 or 1), double-buffered: `copy(item, buf)` issues
// an item's cp.async copies, and item i + 1's are in flight while item i is computed. Copies
// issued before the call and not yet committed land with the first item's. The threads that
// `S` names call it together. The last group committed is empty, so no copy is in flight when
// it returns.
template <TcSync S, class Item, class Valid, class Next, class Copy, class Body>
RF_DEV void tc_pipeline(Item item, Valid valid, Next next, Copy copy, Body body) {
  tc_pipeline_start(item, valid, copy);
  tc_pipeline_run<S>(item, valid, next, copy, body);
}

// RoPE on query fragments loaded by tc_rows_a (A fragments of HD columns): rotates each pair
// of columns (i, i + HD/2) by the angle whose cosine and sine are cs[i] and sn[i], rounding as
// rope_rot does, so the result has the bits rope_kv_store would have stored. A lane's words
// hold columns 16·kk + 8·hi + 2t and the next one, and HD/2 is a multiple of 8, so each
// column's partner lies in the same lane's fragments: no shuffle. Zero rows stay zero (or −0).
template <int HD>
RF_DEV void tc_rope_a(uint32_t a[HD / 16][4], const float* __restrict__ cs, const float* __restrict__ sn) {
  constexpr int half = HD / 2;
  int t = threadIdx.x & 3;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      int cb = 16 * kk + 8 * hi;  // a compile-time constant once unrolled
      if (cb >= half) continue;
      int pk = (cb + half) / 16, ph = (cb + half) % 16 / 8;
      int i = cb + 2 * t;
      float c0 = cs[i], c1 = cs[i + 1], s0 = sn[i], s1 = sn[i + 1];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {  // rows g and g + 8
        uint32_t x = a[kk][2 * hi + rr], y = a[pk][2 * ph + rr];
        bf16 x0, x1, y0, y1;
        rope_rot(__uint_as_float(x << 16), __uint_as_float(y << 16), c0, s0, &x0, &y0);
        rope_rot(__uint_as_float(x & 0xffff0000u), __uint_as_float(y & 0xffff0000u), c1, s1, &x1, &y1);
        a[kk][2 * hi + rr] = (uint32_t)x0.bits | ((uint32_t)x1.bits << 16);
        a[pk][2 * ph + rr] = (uint32_t)y0.bits | ((uint32_t)y1.bits << 16);
      }
    }
}

// `RF_HEAD_DIMS(name, (params), (args))` exports the device template `name<HD>` once per
// supported head dimension: `name_d16`, `name_d32`, `name_d64`, `name_d128`.
#define RF_HEAD_DIM_ONE(NAME, HD, SIG, CALL) \
  RF_KERNEL void NAME##_d##HD SIG { NAME<HD> CALL; }
#define RF_HEAD_DIMS(NAME, SIG, CALL)    \
  RF_HEAD_DIM_ONE(NAME, 16, SIG, CALL)   \
  RF_HEAD_DIM_ONE(NAME, 32, SIG, CALL)   \
  RF_HEAD_DIM_ONE(NAME, 64, SIG, CALL)   \
  RF_HEAD_DIM_ONE(NAME, 128, SIG, CALL)
#ifdef RF_EMU
#define RF_EMU_HEAD_DIMS(NAME)                                                                   \
  ::rf_emu::entry<&NAME##_d16>(#NAME "_d16"), ::rf_emu::entry<&NAME##_d32>(#NAME "_d32"),        \
      ::rf_emu::entry<&NAME##_d64>(#NAME "_d64"), ::rf_emu::entry<&NAME##_d128>(#NAME "_d128")
#endif
