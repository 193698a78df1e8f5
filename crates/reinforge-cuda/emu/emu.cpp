// The emulator's scheduler: blocks on OS threads, CUDA threads as fibers, and the launch
// entry point the Rust side calls. See emu.h for what it models and what not.
//
// Fibers switch with a few instructions on x86-64 (callee-saved registers and the stack
// pointer): kernels meet a barrier every few dozen operations, and ucontext's swapcontext
// makes a system call per switch, which made the emulator 10× slower. Elsewhere, ucontext.
#include "emu.h"

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace rf_emu {

thread_local Thread* cur = nullptr;
thread_local bool async_early = false;
thread_local Dim3 block_idx;
thread_local Dim3 block_dim;
thread_local Dim3 grid_dim;
thread_local unsigned char* dyn_smem = nullptr;
thread_local uint64_t block_serial = 0;

namespace {

/// The kernel this OS thread is running blocks of (for the invalid-address report).
thread_local const char* running_kernel = nullptr;

constexpr size_t kPage = 4096;

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/// An allocation's body (its size rounded up to 256 bytes, as cudaMalloc rounds) and the
/// span mapped for it, the body ending where an inaccessible guard page begins.
struct Span {
  size_t body, span;
};

Span span_of(size_t bytes) {
  size_t body = round_up(bytes ? bytes : 1, 256);
  return Span{body, round_up(body, kPage) + kPage};
}

struct sigaction previous_segv;

// An access past the end of a buffer lands in its guard page: say which kernel did it (a GPU
// reports an illegal memory access and poisons the context), then let the fault take the
// process down. Faults outside kernels go to the handler that was there before (Rust's
// stack-overflow report).
void on_segv(int sig, siginfo_t* info, void* ctx) {
  if (const char* k = running_kernel) {
    static std::atomic<bool> reported{false}, written{false};
    if (reported.exchange(true)) {
      // Another block of the launch (on another thread) is reporting: wait until it has
      // written, or this thread's fatal fault could end the process before the report.
      while (!written.load()) {
      }
      signal(SIGSEGV, SIG_DFL);
      return;
    }
    char buf[512];
    int n = std::snprintf(buf, sizeof buf,
                          "emulated kernel %s: invalid address %p, past the end of a buffer (an illegal memory access on a GPU)\n", k,
                          info->si_addr);
    if (n > 0) (void)!write(2, buf, (size_t)n);
    written.store(true);
    signal(SIGSEGV, SIG_DFL);
    return;  // the access faults again, now fatally
  }
  if (previous_segv.sa_flags & SA_SIGINFO) {
    if (previous_segv.sa_sigaction) previous_segv.sa_sigaction(sig, info, ctx);
    return;
  }
  if (previous_segv.sa_handler == SIG_DFL || previous_segv.sa_handler == SIG_IGN) {
    signal(SIGSEGV, SIG_DFL);
    return;
  }
  previous_segv.sa_handler(sig);
}

void install_segv_report() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
  });
}

/// Which blocks run their threads in reverse order (see `rf_emu_set_mirrored`).
std::atomic<unsigned> mirrored{0};

/// The most dynamic shared memory a block may ask for: sm_90's opt-in limit (227 KiB); a
/// launch over it fails on an H100 as it does here.
constexpr unsigned kMaxSmem = 227 * 1024;

enum class State { Ready, WaitWarp, WaitBlock, Done };

constexpr size_t kStack = 96 * 1024;

#if defined(__x86_64__)
#define RF_FAST_SWITCH 1
// rf_emu_switch(save, to): saves the callee-saved registers on the current stack, stores the
// stack pointer in *save, and resumes the context whose stack pointer is `to`.
extern "C" void rf_emu_switch(void** save, void* to);
asm(R"(
.text
.p2align 4
.globl rf_emu_switch
.type rf_emu_switch,@function
rf_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size rf_emu_switch, .-rf_emu_switch
)");
#endif

struct Fiber {
#ifdef RF_FAST_SWITCH
  void* sp;
#else
  ucontext_t ctx;
#endif
  State state;
  Thread thread;
};

/// Everything one OS thread needs to run blocks: fibers, their stacks, shared memory.
struct Worker {
  std::vector<Fiber> fibers;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<uint64_t> slots;  // 32 per warp
  std::vector<uint32_t> live;   // per warp: its lanes that exist and have not exited
  unsigned char* smem = nullptr;  // the launch's dynamic shared memory, guarded like a buffer
  size_t smem_len = 0;
#ifdef RF_FAST_SWITCH
  void* sched_sp = nullptr;
#else
  ucontext_t sched;
#endif
  Fiber* running = nullptr;
  const Entry* entry = nullptr;
  void** args = nullptr;
  const char* error = nullptr;  // the first misuse a kernel reported (`misuse`)
};

thread_local Worker* W = nullptr;

void fiber_main() {
  Worker* w = W;
  w->entry->invoke(w->args);
  w->running->state = State::Done;
  w->live[w->running->thread.warp] &= ~(1u << w->running->thread.lane);
#ifdef RF_FAST_SWITCH
  void* dead;
  rf_emu_switch(&dead, w->sched_sp);  // never resumed
  __builtin_unreachable();
#endif
  // With ucontext, returning resumes uc_link, the scheduler.
}

void suspend(State s) {
  Fiber* f = W->running;
  f->state = s;
#ifdef RF_FAST_SWITCH
  rf_emu_switch(&f->sp, W->sched_sp);
#else
  swapcontext(&f->ctx, &W->sched);
#endif
}

void resume(Worker& w, Fiber& f) {
#ifdef RF_FAST_SWITCH
  rf_emu_switch(&w.sched_sp, f.sp);
#else
  swapcontext(&w.sched, &f.ctx);
#endif
}

/// Runs one block to completion; returns an error message, or nullptr. `reverse` resumes the
/// block's threads from the last to the first in every round.
const char* run_block(Worker& w, unsigned nthreads, bool reverse) {
  unsigned nwarps = (nthreads + 31) / 32;
  if (w.fibers.size() < nthreads) w.fibers.resize(nthreads);
  while (w.stacks.size() < nthreads) w.stacks.emplace_back(new char[kStack]);
  w.slots.assign(nwarps * 32, 0);
  w.live.assign(nwarps, 0);
  for (unsigned i = 0; i < nthreads; ++i) w.live[i / 32] |= 1u << (i % 32);
  w.error = nullptr;
  // A GPU gives a block whatever its SM's shared memory last held: all-ones bytes are NaN as
  // f32 and as bf16 (and -1 as int), so a kernel that reads shared memory it has not written
  // sees it in its results instead of a friendly zero.
  std::memset(w.smem, 0xFF, w.smem_len);
  ++block_serial;  // static __shared__ variables: fresh_shared gives them the same
  for (unsigned i = 0; i < nthreads; ++i) {
    Fiber& f = w.fibers[i];
    f.state = State::Ready;
    f.thread.linear = i;
    f.thread.idx = Dim3{i % block_dim.x, (i / block_dim.x) % block_dim.y, i / (block_dim.x * block_dim.y)};
    f.thread.lane = i % 32;
    f.thread.warp = i / 32;
    f.thread.async_n = 0;  // a copy the last block never waited for never lands
    f.thread.async_group = 0;
#ifdef RF_FAST_SWITCH
    // A fresh stack that rf_emu_switch "returns" into fiber_main from: six zero registers,
    // then the return address, placed so fiber_main starts with the alignment of a call.
    uintptr_t top = reinterpret_cast<uintptr_t>(w.stacks[i].get() + kStack) & ~uintptr_t(15);
    void** sp = reinterpret_cast<void**>(top - 16);
    sp[0] = reinterpret_cast<void*>(&fiber_main);
    for (int r = 1; r <= 6; ++r) sp[-r] = nullptr;
    f.sp = sp - 6;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = w.stacks[i].get();
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &w.sched;
    makecontext(&f.ctx, fiber_main, 0);
#endif
  }
  unsigned done = 0;
  while (done < nthreads) {
    bool ran = false;
    for (unsigned k = 0; k < nthreads; ++k) {
      Fiber& f = w.fibers[reverse ? nthreads - 1 - k : k];
      if (f.state != State::Ready) continue;
      ran = true;
      w.running = &f;
      cur = &f.thread;
      resume(w, f);
      if (w.error) return w.error;
      if (f.state == State::Done) ++done;
    }
    if (done == nthreads) break;
    // Release barriers that every live thread of their scope has reached.
    bool released = false;
    for (unsigned wp = 0; wp < nwarps; ++wp) {
      unsigned lo = wp * 32, hi = std::min(nthreads, lo + 32);
      bool all = true, any = false;
      for (unsigned i = lo; i < hi; ++i) {
        State s = w.fibers[i].state;
        if (s == State::Done) continue;
        any = true;
        if (s != State::WaitWarp) all = false;
      }
      if (any && all) {
        for (unsigned i = lo; i < hi; ++i)
          if (w.fibers[i].state == State::WaitWarp) w.fibers[i].state = State::Ready;
        released = true;
      }
    }
    if (!released) {
      bool all = true;
      for (unsigned i = 0; i < nthreads; ++i) {
        State s = w.fibers[i].state;
        if (s != State::Done && s != State::WaitBlock) all = false;
      }
      if (all) {
        for (unsigned i = 0; i < nthreads; ++i)
          if (w.fibers[i].state == State::WaitBlock) w.fibers[i].state = State::Ready;
        released = true;
      }
    }
    if (!ran && !released) return "divergent barrier: some threads wait in __syncthreads() while others wait in a warp shuffle/__syncwarp() (undefined on a GPU)";
  }
  return nullptr;
}

}  // namespace

void sync_block() { suspend(State::WaitBlock); }
void sync_warp() { suspend(State::WaitWarp); }
void misuse(const char* what) {
  if (!W->error) W->error = what;
}
uint64_t* warp_slots() { return W->slots.data() + cur->warp * 32; }
uint32_t live_lanes() { return W->live[cur->warp]; }

}  // namespace rf_emu

extern "C" {
/// Device memory: zeroed, 256-byte aligned, its last 256-byte unit's slack NaN bytes, and an
/// inaccessible page right after it, so a kernel reading or writing past the end faults
/// (reported by on_segv) instead of quietly using a neighbour's data. nullptr when out of
/// memory.
void* rf_emu_alloc(size_t bytes) {
  rf_emu::Span s = rf_emu::span_of(bytes);
  void* base = mmap(nullptr, s.span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  char* guard = static_cast<char*>(base) + s.span - rf_emu::kPage;
  if (mprotect(guard, rf_emu::kPage, PROT_NONE) != 0) {
    munmap(base, s.span);
    return nullptr;
  }
  char* p = guard - s.body;
  std::memset(p + bytes, 0xFF, s.body - bytes);
  return p;
}

/// Frees what rf_emu_alloc(bytes) returned.
void rf_emu_free(void* p, size_t bytes) {
  rf_emu::Span s = rf_emu::span_of(bytes);
  char* base = static_cast<char*>(p) + s.body + rf_emu::kPage - s.span;
  munmap(base, s.span);
}

/// Swaps the thread order of even and odd blocks (`on` != 0) for the launches that follow.
void rf_emu_set_mirrored(unsigned on) { rf_emu::mirrored.store(on ? 1 : 0); }

// Defined in the generated registry (all kernels, one translation unit).
const rf_emu::Entry* rf_emu_find(const char* name);
/// The most threads per block kernel `name` admits: its `__launch_bounds__`, else 1024.
unsigned rf_emu_bounds(const char* name);

/// Launches `name` like cuLaunchKernel and waits for it. Returns 0, or 1 with a message in
/// `err` (unknown kernel, bad launch shape, divergent barrier).
int rf_emu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                  unsigned smem_bytes, void** args, unsigned max_threads, char* err, size_t err_len) {
  const rf_emu::Entry* e = rf_emu_find(name);
  auto fail = [&](const char* msg) {
    std::snprintf(err, err_len, "%s", msg);
    return 1;
  };
  if (!e) return fail("no such kernel in the emulator's registry");
  if (bx > 1024 || by > 1024 || bz > 64) return fail("block dimensions over (1024, 1024, 64)");
  unsigned nthreads = bx * by * bz;
  if (nthreads == 0 || nthreads > 1024) return fail("block size must be 1..1024 threads");
  if (unsigned bound = rf_emu_bounds(name); nthreads > bound) {
    std::snprintf(err, err_len, "launched with %u threads per block, more than the kernel's __launch_bounds__ (%u): the GPU refuses the launch", nthreads, bound);
    return 1;
  }
  if (gx == 0 || gy == 0 || gz == 0) return fail("grid has a zero dimension");
  if (gx > 0x7fffffffu || gy > 65535 || gz > 65535) return fail("grid dimensions over (2^31 - 1, 65535, 65535): the GPU refuses the launch");
  if (smem_bytes > rf_emu::kMaxSmem) return fail("dynamic shared memory over 227 KiB per block (sm_90's limit): the GPU refuses the launch");
  unsigned mirror = rf_emu::mirrored.load();
  rf_emu::install_segv_report();
  size_t nblocks = (size_t)gx * gy * gz;
  unsigned nworkers = std::max(1u, std::min<unsigned>(max_threads, (unsigned)std::min<size_t>(nblocks, 64)));
  std::atomic<size_t> next{0};
  std::mutex m;
  const char* first_error = nullptr;
  auto work = [&]() {
    rf_emu::Worker w;
    rf_emu::W = &w;
    w.entry = e;
    w.args = args;
    w.smem = static_cast<unsigned char*>(rf_emu_alloc(smem_bytes));
    if (!w.smem) {
      std::lock_guard<std::mutex> g(m);
      if (!first_error) first_error = "out of host memory for a block's shared memory";
      rf_emu::W = nullptr;
      return;
    }
    w.smem_len = smem_bytes;
    rf_emu::dyn_smem = w.smem;
    rf_emu::running_kernel = e->name;
    rf_emu::block_dim = rf_emu::Dim3{bx, by, bz};
    rf_emu::grid_dim = rf_emu::Dim3{gx, gy, gz};
    for (;;) {
      size_t b = next.fetch_add(1);
      if (b >= nblocks) break;
      rf_emu::block_idx = rf_emu::Dim3{(unsigned)(b % gx), (unsigned)((b / gx) % gy), (unsigned)(b / ((size_t)gx * gy))};
      // Threads of a block run until their next barrier one after another, so a missing
      // barrier hides when the writer happens to run first. Even and odd blocks run their
      // threads in opposite orders, and `rf_emu_set_mirrored` swaps which: a kernel whose
      // results differ between the two schedules has a race.
      bool reverse = ((b & 1) != 0) != (mirror != 0);
      // cp.async landing (emu.h) from another bit than the order, so every block index sees
      // all four pairings of order and landing over the two schedules.
      rf_emu::async_early = (((b >> 1) & 1) != 0) != (mirror != 0);
      const char* msg = rf_emu::run_block(w, nthreads, reverse);
      if (msg) {
        std::lock_guard<std::mutex> g(m);
        if (!first_error) first_error = msg;
        next.store(nblocks);
        break;
      }
    }
    rf_emu::running_kernel = nullptr;
    rf_emu_free(w.smem, smem_bytes);
    rf_emu::W = nullptr;
    rf_emu::cur = nullptr;
  };
  if (nworkers == 1) {
    work();
  } else {
    std::vector<std::thread> ts;
    for (unsigned i = 0; i < nworkers; ++i) ts.emplace_back(work);
    for (auto& t : ts) t.join();
  }
  if (first_error) return fail(first_error);
  return 0;
}
}
