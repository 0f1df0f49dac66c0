// Hopper's (sm_90) bulk copy from global to shared memory, counted on a shared-memory mbarrier: one
// thread asks for a contiguous run of bytes and goes on; the copy engine moves them without the
// block's registers or load instructions, and the threads that need them wait on the barrier's
// phase. For kernels that want whole rows in shared memory ahead of the work on them
// (cross_entropy.cu), where loads issued by the threads themselves stop while those threads compute.
//
// Invariants: source, destination and size 16-byte aligned; a barrier expects fewer than 2^20 bytes
// a phase. The device functions do nothing unless compiled for sm_90 or later, so a kernel that uses
// them runs only where kernel_runs_bulk_copies<Kernel>(device) says so (it was compiled from sm_90
// code: a build for an older target, run by the driver's JIT, has none).
// hopper_gemm.cuh has its own barrier helpers, for the tensor-map copies of sm_90a code.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/cuda_check.h"

namespace weft::cuda::bulk {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define WEFT_BULK_COPY_DEVICE 1
#endif

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// A barrier whose phase completes after `arrivals` arrivals and the bytes they announced.
__device__ __forceinline__ void barrier_init(uint64_t* barrier, uint32_t arrivals) {
#ifdef WEFT_BULK_COPY_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(arrivals) : "memory");
#endif
}

// Makes the initialized barriers visible to the copy engine (the async proxy); then a
// __syncthreads makes them visible to the block.
__device__ __forceinline__ void fence_barrier_init() {
#ifdef WEFT_BULK_COPY_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// One arrival that also tells the barrier to wait for `bytes` more before its phase completes.
__device__ __forceinline__ void arrive_expecting(uint64_t* barrier, uint32_t bytes) {
#ifdef WEFT_BULK_COPY_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
#endif
}

// Copies `bytes` from global memory to shared memory; their arrival is counted on `barrier`.
__device__ __forceinline__ void copy_to_shared(void* destination, const void* source, uint32_t bytes,
                                               uint64_t* barrier) {
#ifdef WEFT_BULK_COPY_DEVICE
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(destination)),
               "l"(source), "r"(bytes), "r"(shared_address(barrier))
               : "memory");
#endif
}

// Orders the block's earlier reads of shared memory (made visible to this thread by a
// __syncthreads) before this thread's next copies into it.
__device__ __forceinline__ void fence_before_copy_over_read_memory() {
#ifdef WEFT_BULK_COPY_DEVICE
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Waits until the barrier's phase of this parity (0 for its first phase, 1, 0, ... after) completes.
__device__ __forceinline__ void wait(uint64_t* barrier, uint32_t parity) {
#ifdef WEFT_BULK_COPY_DEVICE
  uint32_t done = 0;
  while (done == 0) {
    asm volatile(
        "{\n"
        ".reg .pred complete;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n"
        "}\n"
        : "=r"(done)
        : "r"(shared_address(barrier)), "r"(parity)
        : "memory");
  }
#endif
}

// Whether Kernel's code for `device` came from sm_90 or later device code, the only code in which
// the functions above do anything (cached per device).
template <auto Kernel>
bool kernel_runs_bulk_copies(int device) {
  static int known[64] = {};  // 0: not looked up, 1: yes, 2: no
  if (device < 0 || device >= 64) return false;
  if (known[device] == 0) {
    int major = 0;
    WEFT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    cudaFuncAttributes attributes{};
    WEFT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, Kernel));
    known[device] = major >= 9 && attributes.ptxVersion >= 90 && attributes.binaryVersion >= 90 ? 1 : 2;
  }
  return known[device] == 1;
}

}  // namespace weft::cuda::bulk
