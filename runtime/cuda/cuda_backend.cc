// Registration of the CUDA backend and its caching allocator.
//
// libweft is a shared library, so this static initializer runs when it is loaded, in every
// program. It only stores two pointers: nothing here touches the GPU, so a CUDA build of weft runs
// on a machine without a GPU or driver until a CUDA tensor is requested, and that request fails with
// "no CUDA device is available (cudaGetDeviceCount: ...)" from the allocator. The backend registered
// is the CUDA backend inside NvtxAnnotatedBackend, which names every op on the NVTX timeline.
#include "runtime/cuda/cuda_backend.h"

#include "runtime/allocator.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/nvtx_annotated_backend.h"
#include "runtime/cuda/pinned_buffer.h"
#include "runtime/cuda/stream.h"

namespace weft {

void CudaBackend::synchronize(Device device) {
  cuda::set_device(device.index);
  WEFT_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream(device.index)));
}

DeviceMemory CudaBackend::memory(Device device, bool reset_peak) {
  const cuda::MemoryStats stats = cuda::memory_stats(device.index);
  if (reset_peak) cuda::reset_peak(device.index);
  return {stats.allocated_bytes, stats.peak_allocated_bytes, stats.reserved_bytes};
}

namespace {

CudaBackend& cuda_backend_instance() {
  static CudaBackend backend;
  return backend;
}

[[maybe_unused]] const bool registered = [] {
  static NvtxAnnotatedBackend annotated(cuda_backend_instance());
  register_backend(DeviceType::kCuda, &annotated);
  register_cuda_allocator(&cuda::caching_allocator());
  register_pinned_host_allocator(&cuda::page_locked_host_allocator());
  return true;
}();

}  // namespace
}  // namespace weft
