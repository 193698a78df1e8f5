// Kernels that exist only in the emulator, to test the emulator itself
// (tests/emulator_faults.rs); the GPU never compiles them.
#include "prelude.cuh"

// out[2b]: what block b's static shared variable held before the block wrote it (all-ones on
// the emulator, as a GPU's leftover contents would be anything); out[2b + 1]: what thread 1
// read, behind a barrier, of what thread 0 wrote before it. In even blocks thread 0 runs
// first, so thread 1 reaches the declaration after the write, which must keep it (once per
// block, not once per thread). Every thread then leaves zeros behind, which the next block
// on the same OS thread must not see.
RF_KERNEL void emu_probe_static_shared(unsigned* out) {
  __shared__ unsigned v[2];
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = v[0];
    v[1] = 7u + blockIdx.x;
  }
  __syncthreads();
  if (threadIdx.x == 1) out[2 * blockIdx.x + 1] = v[1];
  __syncthreads();
  v[0] = 0u;
  v[1] = 0u;
}

// A kernel whose blocks may have at most 64 threads: a launch of more is refused, as the GPU
// refuses it.
#define RF_PROBE_BOUND 64
RF_KERNEL void __launch_bounds__(RF_PROBE_BOUND, 1) emu_probe_bounded(unsigned* out) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = threadIdx.x;
}

RF_EMU_TABLE(probes, RF_EMU_PLAIN(emu_probe_static_shared), RF_EMU_PLAIN(emu_probe_bounded))
