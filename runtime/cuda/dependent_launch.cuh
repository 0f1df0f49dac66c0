// Programmatic dependent launch (sm_90): a kernel launched with launch_dependent may have its blocks
// placed on the SMs while the kernel before it in the stream is still finishing, which hides the
// launch gap between two short kernels (about a microsecond, measured on the H200: a few percent of a
// 25 us norm backward).
//
// Invariant: a kernel launched with launch_dependent calls wait_for_previous_kernels() before its
// first global-memory access, read or write; that call returns once every kernel before it in the
// stream has completed and its writes are visible, so the stream order is kept for memory. Work
// before it may only touch registers and shared memory. Launched the ordinary way, the call returns at
// once. allow_next_kernel_to_start() is a hint: without it the next kernel may start once this one's
// blocks have exited.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "runtime/cuda/cuda_check.h"

namespace weft::cuda {

__device__ __forceinline__ void wait_for_previous_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel in the stream, if it was launched with launch_dependent, start placing its
// blocks once every block of this grid has called this (or exited).
__device__ __forceinline__ void allow_next_kernel_to_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// kernel<<<grid, block, shared_bytes, stream>>>(arguments...) as a programmatic dependent of the
// kernel before it in the stream (see the file comment for what the kernel must do first).
template <class... Parameters, class... Arguments>
void launch_dependent(void (*kernel)(Parameters...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                      Arguments&&... arguments) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  WEFT_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Arguments>(arguments)...));
}

}  // namespace weft::cuda
