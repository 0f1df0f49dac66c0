// CUDA kernel: dropout with the counter-based Philox mask (CudaBackend::dropout; the CPU reference
// is runtime/cpu/dropout.cc, the draw is runtime/random.h).
//
// Element i is kept when philox_uniform(seed, offset + i) >= p, the same __host__ __device__
// function and the same double comparison as on the CPU, so the mask is bit-identical; a kept value
// is x * float(1 / (1 - p)) rounded once, as on the CPU, so outputs are bit-identical too. Elements
// move in 16-byte packs where the pointers allow, with a scalar tail. The 10 Philox rounds per
// element make this kernel arithmetic-bound rather than memory-bound at bf16.
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/stream.h"
#include "runtime/random.h"

namespace weft {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__device__ __forceinline__ float dropped(float value, int64_t element, double p, uint64_t seed, uint64_t offset,
                                         float keep_scale) {
  const bool keep = philox_uniform(seed, offset + static_cast<uint64_t>(element)) >= p;
  return keep ? value * keep_scale : 0.0f;
}

template <class T, int kVec>
__global__ void __launch_bounds__(kThreads)
    dropout_kernel(const T* __restrict__ x,  // [count]
                   T* __restrict__ out,      // [count]
                   int64_t count, double p, uint64_t seed, uint64_t offset, float keep_scale) {
  const int64_t packs = count / kVec;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = first; i < packs; i += stride) {
    const Pack<T, kVec> pack = load_pack_streaming<T, kVec>(x + i * kVec);
    Pack<T, kVec> result;
#pragma unroll
    for (int j = 0; j < kVec; ++j) result.set(j, dropped<T>(pack.get(j), i * kVec + j, p, seed, offset, keep_scale));
    store_pack(out + i * kVec, result);
  }
  for (int64_t element = packs * kVec + first; element < count; element += stride) {
    out[element] = from_float<T>(dropped<T>(to_float(x[element]), element, p, seed, offset, keep_scale));
  }
}

}  // namespace
}  // namespace cuda

void CudaBackend::dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& out) {
  const int64_t count = x.numel();
  if (count == 0) return;
  const int device = x.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  // Rounded to f32 on the host exactly as the CPU kernel rounds it.
  const float keep_scale = static_cast<float>(1.0 / (1.0 - p));
  cuda::dispatch_cuda_floating(x.dtype(), "dropout", [&]<class T>() {
    const T* in = x.data<T>();
    T* data = out.data<T>();
    cuda::dispatch_pack<T>(cuda::is_aligned_16(in) && cuda::is_aligned_16(data), [&]<int kVec>() {
      const int64_t packs = count / kVec;
      cuda::dropout_kernel<T, kVec><<<cuda::grid_for(packs > 0 ? packs : count, cuda::kThreads), cuda::kThreads, 0,
                                       stream>>>(in, data, count, p, seed, offset, keep_scale);
      WEFT_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace weft
