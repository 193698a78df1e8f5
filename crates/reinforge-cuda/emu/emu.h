// CUDA's execution model on the CPU, so the engine's kernels can be tested on machines
// without a GPU (ours and CI's).
//
// The kernel sources in ../kernels are compiled twice: by NVRTC for the GPU, and by the host
// C++ compiler with RF_EMU defined and this header included first. Every CUDA thread of a
// block runs as a fiber (its own stack), so `__syncthreads()` and warp shuffles suspend it
// until the block (or warp) catches up, exactly as the hardware orders them. Blocks run on
// several OS threads; `__shared__` variables are per OS thread, which is per block.
//
// What it checks besides the numbers, so that what fails on a GPU fails here first:
// - a barrier reached by only part of a block or warp (divergent barriers, undefined on a
//   GPU) is an error instead of a hang, and so is a shuffle or ballot whose mask names a lane
//   that has exited;
// - launches the GPU refuses (grid or block dimensions, blocks larger than the kernel's
//   `__launch_bounds__`, more than 227 KiB of dynamic shared memory) and misaligned ldmatrix
//   rows and .b32 accesses are errors;
// - shared memory, dynamic and static, starts every block as all-ones bytes (NaN as f32 and
//   bf16, -1 as int), not zeros nor the last block's values: a read of what the block never
//   wrote shows up in its results;
// - races inside a block: threads run one after another between barriers, even blocks from
//   the first thread, odd blocks from the last, and `rf_emu_set_mirrored` swaps which, so a
//   missing barrier changes a kernel's results between the two schedules (see the test
//   `tests/schedules.rs`) whichever of the racing threads is the writer.
// - device memory and each block's dynamic shared memory end at an inaccessible page: an
//   access past a buffer's last 256-byte unit stops the process with a report naming the
//   kernel (a GPU's illegal-address error), and that unit's slack reads as NaN bytes.
// - cp.async copies land when issued in half the blocks and at their wait in the others, so
//   a read before the wait, or a buffer refilled under threads still reading it, shows up.
// What it does not model: timing, memory coalescing, bank conflicts, the weak memory ordering
// between blocks (blocks must not depend on each other, as on a GPU; where one block merges
// others' results, its fences and L2 loads are checked by reading only), or accesses before
// a buffer's start. It contracts multiply-adds into FMAs as the GPU compiler does, but
// where the host compiler finds them, not where NVVM would, and its `expf`, `rsqrtf` and
// friends are the host's: a GPU's results match within tolerances, not bit for bit.
#pragma once

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace rf_emu {

struct Dim3 {
  unsigned x, y, z;
};

/// A cp.async copy in flight: `bytes` from `src` to `dst`, in commit group `group`.
struct AsyncCopy {
  void* dst;
  const void* src;
  unsigned group;
  unsigned bytes;
};

/// cp.async copies one thread may have in flight (the kernels keep at most some tens).
constexpr unsigned kMaxAsync = 128;

/// One CUDA thread: its index in the block and in its warp.
struct Thread {
  Dim3 idx;
  unsigned linear;
  unsigned lane;
  unsigned warp;
  /// Its cp.async copies not yet waited for (`async_n` of them), and the number of the group
  /// they join next. A fixed array, not a vector: the scheduler (built for the baseline CPU)
  /// resets these, and must share no inline function, such as a vector's, with the kernels'
  /// FMA build (build.rs).
  AsyncCopy async[kMaxAsync];
  unsigned async_n;
  unsigned async_group;
};

extern thread_local Thread* cur;
extern thread_local Dim3 block_idx;
extern thread_local Dim3 block_dim;
extern thread_local Dim3 grid_dim;
extern thread_local unsigned char* dyn_smem;
/// Which block the calling OS thread runs now (a new number at every block it starts).
extern thread_local uint64_t block_serial;

/// Suspends the calling thread until every live thread of its block arrives.
void sync_block();
/// Suspends the calling thread until every live thread of its warp arrives.
void sync_warp();
/// The 32 exchange slots of the calling thread's warp.
uint64_t* warp_slots();
/// Reports `what` (something the GPU would refuse or leave undefined: a misaligned address, a
/// collective naming a lane that exited) as the launch's error, once the calling thread next
/// yields.
void misuse(const char* what);
/// The lanes of the calling thread's warp that exist and have not exited (bit l: lane l).
uint32_t live_lanes();

/// Gives a static `__shared__` variable what a GPU gives a new block — whatever the SM last
/// held, here all-ones bytes — once per block, at the first of its threads to reach the
/// declaration (build.rs adds the call after each one). Without it the variable would keep
/// the OS thread's previous block's values, or zeros, and hide a read before the first write.
inline void fresh_shared(void* p, size_t bytes) {
  // Every variable this OS thread has met (some tens over all kernels): a list beats a map.
  thread_local std::vector<std::pair<void*, uint64_t>> seen;
  for (auto& [q, serial] : seen) {
    if (q == p) {
      if (serial != block_serial) {
        std::memset(p, 0xFF, bytes);
        serial = block_serial;
      }
      return;
    }
  }
  std::memset(p, 0xFF, bytes);
  seen.emplace_back(p, block_serial);
}

/// A `*_sync` collective must be reached by every lane its mask names: on a GPU one naming a
/// lane that has exited, or that a partial warp does not have, is undefined (here it would
/// quietly read that lane's last value). Checked once the warp has met at the collective, when
/// every lane has either arrived or exited, so whichever order the lanes ran in.
inline void check_mask(unsigned mask) {
  if (mask & ~live_lanes())
    misuse("a warp shuffle or ballot whose mask names a lane that has exited or does not exist (undefined on the GPU): exit whole warps, launch whole warps, or name only the lanes that reach it");
}

template <class T>
inline T shfl_from(T v, unsigned src, unsigned mask) {
  static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
  uint64_t* s = warp_slots();
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  s[cur->lane] = bits;
  sync_warp();
  check_mask(mask);
  uint64_t got = s[src & 31u];
  sync_warp();  // nobody overwrites a slot before every lane has read it
  T r;
  std::memcpy(&r, &got, sizeof(T));
  return r;
}

template <class T>
inline T shfl_down(T v, unsigned d, unsigned mask) {
  unsigned src = cur->lane + d;
  T got = shfl_from(v, src < 32 ? src : cur->lane, mask);
  return src < 32 ? got : v;
}

inline unsigned ballot(bool pred, unsigned mask) {
  uint64_t* s = warp_slots();
  s[cur->lane] = pred ? 1 : 0;
  sync_warp();
  check_mask(mask);
  uint32_t live = live_lanes();
  unsigned m = 0;
  for (unsigned l = 0; l < 32; ++l)
    if ((live >> l & 1u) && s[l]) m |= 1u << l;
  sync_warp();
  return m & mask;
}

template <class T>
inline T atomic_add(T* p, T v) {
  std::atomic_ref<T> a(*p);
  if constexpr (std::is_floating_point_v<T>) {
    T old = a.load();
    while (!a.compare_exchange_weak(old, old + v)) {
    }
    return old;
  } else {
    return a.fetch_add(v);
  }
}

template <class T>
inline T atomic_max(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}

template <class T>
inline T atomic_cas(T* p, T cmp, T val) {
  std::atomic_ref<T> a(*p);
  a.compare_exchange_strong(cmp, val);
  return cmp;
}

}  // namespace rf_emu

// The CUDA vocabulary, mapped onto the emulator.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// `__shared__` variables live once per block; a block runs on one OS thread at a time. build.rs
// follows each declaration with RF_EMU_FRESH_SHARED of every variable it declares.
#define __shared__ static thread_local
#define RF_EMU_FRESH_SHARED(x) ::rf_emu::fresh_shared(&(x), sizeof(x))
#define threadIdx (::rf_emu::cur->idx)
#define blockIdx (::rf_emu::block_idx)
#define blockDim (::rf_emu::block_dim)
#define gridDim (::rf_emu::grid_dim)
#define __syncthreads() ::rf_emu::sync_block()
#define __syncwarp(...) ::rf_emu::sync_warp()
#define __shfl_xor_sync(mask, v, m) ::rf_emu::shfl_from((v), ::rf_emu::cur->lane ^ (unsigned)(m), (unsigned)(mask))
#define __shfl_sync(mask, v, src) ::rf_emu::shfl_from((v), (unsigned)(src), (unsigned)(mask))
#define __shfl_down_sync(mask, v, d) ::rf_emu::shfl_down((v), (unsigned)(d), (unsigned)(mask))
#define __ballot_sync(mask, pred) ::rf_emu::ballot((pred), (unsigned)(mask))
#define atomicAdd(p, v) ::rf_emu::atomic_add((p), (v))
#define atomicMax(p, v) ::rf_emu::atomic_max((p), (v))
#define atomicCAS(p, c, v) ::rf_emu::atomic_cas((p), (c), (v))
#define __threadfence() std::atomic_thread_fence(std::memory_order_seq_cst)

inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// Round-to-nearest arithmetic that the GPU compiler never contracts into an FMA. The kernels
// are built with contraction on, as on the GPU (build.rs), so the operands and the result pass
// through an empty asm statement the compiler cannot see into: `__fadd_rn(a * b, c)` rounds
// the product first, and nothing downstream fuses with the result.
inline float rf_emu_rounded(float r) {
#if defined(__x86_64__)
  asm("" : "+x"(r));
#elif defined(__aarch64__)
  asm("" : "+w"(r));
#else
  volatile float v = r;
  r = v;
#endif
  return r;
}
inline float __fmul_rn(float a, float b) { return rf_emu_rounded(rf_emu_rounded(a) * rf_emu_rounded(b)); }
inline float __fsub_rn(float a, float b) { return rf_emu_rounded(rf_emu_rounded(a) - rf_emu_rounded(b)); }
inline float __fadd_rn(float a, float b) { return rf_emu_rounded(rf_emu_rounded(a) + rf_emu_rounded(b)); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
inline int __float_as_int(float x) { return (int)__float_as_uint(x); }
inline float __int_as_float(int i) { return __uint_as_float((unsigned)i); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
using std::max;
using std::min;

namespace rf_emu {
/// A kernel as the launcher sees it: its name and a trampoline that unpacks `void** args`
/// (cuLaunchKernel's convention) into the kernel's typed parameters and calls it.
/// Tables of entries are `constexpr`: the kernels' translation unit is built for FMA
/// (build.rs), so it must have no code that runs at process start on any CPU.
struct Entry {
  const char* name;
  void (*invoke)(void** args);
};

template <class... A, size_t... I>
inline void invoke_impl(void (*k)(A...), void** args, std::index_sequence<I...>) {
  k(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}

template <class... A>
inline void invoke_with(void (*k)(A...), void** args) {
  invoke_impl(k, args, std::index_sequence_for<A...>{});
}

template <auto K>
void invoke_kernel(void** args) {
  invoke_with(K, args);
}

template <auto K>
constexpr Entry entry(const char* name) {
  return Entry{name, &invoke_kernel<K>};
}
}  // namespace rf_emu

#define RF_EMU_ENTRY(k) ::rf_emu::entry<&k>(#k)

// cp.async: a GPU lands a copy at any time between its issue and the wait_group that covers
// it. Here it lands at one end or the other, by block: half the blocks (by the second bit of
// the block index, swapped by `rf_emu_set_mirrored`) land copies when issued, the others at the
// wait (reading their source then), each half running its threads in both orders. A kernel that reads shared memory before waiting then reads
// what was there before (all-ones bytes, or the last chunk) in the late blocks, and one that
// refills a buffer before every thread is done reading it (a missing barrier) overwrites it
// under the threads that run after the copying one in the early blocks.
namespace rf_emu {
/// Whether the calling OS thread's block lands cp.async copies when they are issued.
extern thread_local bool async_early;
/// cp.async of `bytes` (4, 8 or 16), both addresses aligned to it.
inline void cp_async(void* dst, const void* src, unsigned bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 || reinterpret_cast<uintptr_t>(src) % bytes != 0)
    misuse("cp.async: an address not aligned to the copy's size (a misaligned-address fault on the GPU)");
  if (async_early) {
    std::memcpy(dst, src, bytes);
  } else {
    if (cur->async_n == kMaxAsync) {
      misuse("cp.async: more copies in flight in one thread than the emulator holds (128): wait for some first");
      return;
    }
    cur->async[cur->async_n++] = AsyncCopy{dst, src, cur->async_group, bytes};
  }
}
inline void cp_async_commit() { ++cur->async_group; }
/// cp.async.wait_group n: every copy of the groups committed before the last `n` lands.
inline void cp_async_wait(unsigned n) {
  AsyncCopy* q = cur->async;
  unsigned kept = 0;
  for (unsigned i = 0; i < cur->async_n; ++i) {
    if (q[i].group + n < cur->async_group) {
      std::memcpy(q[i].dst, q[i].src, q[i].bytes);
    } else {
      q[kept++] = q[i];
    }
  }
  cur->async_n = kept;
}
}  // namespace rf_emu

// Warp-level matrix instructions (mma.sync, ldmatrix): every lane of the warp contributes its
// fragment and gets its own part of the result, in PTX's layouts (see prelude.cuh).
namespace rf_emu {
/// Every lane's `v`, in lane order: an all-gather over the calling thread's warp.
inline void warp_all(uint64_t v, uint64_t out[32]) {
  uint64_t* s = warp_slots();
  s[cur->lane] = v;
  sync_warp();
  std::memcpy(out, s, 32 * sizeof(uint64_t));
  sync_warp();  // nobody overwrites a slot before every lane has read it
}

/// The bf16 in the low (`hi` = 0) or high half of `w`, as f32.
inline float bf16_half(uint32_t w, int hi) { return __uint_as_float((hi ? (w >> 16) : (w & 0xffffu)) << 16); }

/// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 with C = D: d += A · B.
inline void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  uint64_t a01[32], a23[32], bb[32];
  warp_all(a[0] | (uint64_t)a[1] << 32, a01);
  warp_all(a[2] | (uint64_t)a[3] << 32, a23);
  warp_all(b[0] | (uint64_t)b[1] << 32, bb);
  float A[16][16], B[16][8];
  for (unsigned l = 0; l < 32; ++l) {
    unsigned g = l >> 2, t = l & 3;
    uint32_t r0 = (uint32_t)a01[l], r1 = (uint32_t)(a01[l] >> 32), r2 = (uint32_t)a23[l], r3 = (uint32_t)(a23[l] >> 32);
    uint32_t b0 = (uint32_t)bb[l], b1 = (uint32_t)(bb[l] >> 32);
    for (int h = 0; h < 2; ++h) {
      A[g][2 * t + h] = bf16_half(r0, h);
      A[g + 8][2 * t + h] = bf16_half(r1, h);
      A[g][2 * t + 8 + h] = bf16_half(r2, h);
      A[g + 8][2 * t + 8 + h] = bf16_half(r3, h);
      B[2 * t + h][g] = bf16_half(b0, h);
      B[2 * t + 8 + h][g] = bf16_half(b1, h);
    }
  }
  unsigned g = cur->lane >> 2, t = cur->lane & 3;
  for (int i = 0; i < 4; ++i) {
    unsigned row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
    float s = d[i];
    for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
    d[i] = s;
  }
}

/// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lane l gives row l % 8 of matrix l / 8.
/// A row address that is not 16-byte aligned is an error on the GPU; here it is reported as
/// one too.
inline void ldsm_x4_trans(uint32_t r[4], const void* row) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) misuse("ldmatrix: a row address is not 16-byte aligned (a misaligned-address fault on the GPU)");
  uint64_t p[32];
  warp_all(reinterpret_cast<uintptr_t>(row), p);
  unsigned g = cur->lane >> 2, t = cur->lane & 3;
  for (int j = 0; j < 4; ++j) {
    const uint16_t* r0 = reinterpret_cast<const uint16_t*>(static_cast<uintptr_t>(p[8 * j + 2 * t]));
    const uint16_t* r1 = reinterpret_cast<const uint16_t*>(static_cast<uintptr_t>(p[8 * j + 2 * t + 1]));
    r[j] = (uint32_t)r0[g] | ((uint32_t)r1[g] << 16);
  }
}
}  // namespace rf_emu
