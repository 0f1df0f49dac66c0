// hopper_bias_gelu (runtime/cuda/hopper_bias_gelu.h): the launch of weft's own Hopper product for a
// linear layer's bias + GELU forward. Compiled for sm_90a only (CMakeLists.txt: the weft_sm90a
// object library), where wgmma and setmaxnreg exist.
//
// The tiling per shape, from docs/performance.md (2026-12-05, fifteenth session): N of 4096 or more
// (the 1.3B shape's 8192) takes the alternating 128 × 192 tiling in bands of 16 rows of tiles, whose
// bias + GELU product ran 6-12% faster than cuBLASLt's there; narrower products (GPT-2's 3072) take
// the alternating 128 × 128 tiling row by row, the one whose GELU epilogue hides under the other
// warpgroup's products (5-10% faster than cuBLASLt's on GPT-2's up-projection).
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/hopper_bias_gelu.h"
#include "runtime/cuda/hopper_gemm.cuh"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/tensor_map.h"

namespace weft::cuda {
namespace {

std::atomic<int> enabled_state{-1};  // -1: not read yet
std::atomic<int64_t> launches{0};

// Whether `device` is compute capability 9.0, the one sm_90a code runs on (cached per device, as
// multiprocessor_count caches its attribute).
bool is_hopper(int device) {
  static int known[64] = {};  // 0: not looked up, 1: 9.0, 2: another
  if (device < 0 || device >= 64) return false;
  if (known[device] == 0) {
    int major = 0, minor = 0;
    WEFT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    WEFT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    known[device] = major == 9 && minor == 0 ? 1 : 2;
  }
  return known[device] == 1;
}

bool aligned(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// Launches the kernel of tiling T with GELU, one persistent CTA an SM (clusters are not used here:
// pairs measured slower on these shapes). False where a map cannot be made.
template <typename T>
bool launch(const void* a, const void* b, const void* bias, void* out, void* pre_gelu, int m, int n, int k,
            int group_rows, int device, cudaStream_t stream) {
  const auto kernel = hopper::gemm_kernel<T, hopper::Epilogue::kBiasGelu>;
  static bool configured[64] = {};  // the shared-memory size it asks for, allowed once on each device
  if (!configured[device]) {
    WEFT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSharedBytes));
    configured[device] = true;
  }
  CUtensorMap a_map, b_map, out_map, pre_map;
  if (!make_bf16_tensor_map(a_map, a, m, k, T::kBlockM) || !make_bf16_tensor_map(b_map, b, n, k, T::kBSliceRows) ||
      !make_bf16_tensor_map(out_map, out, m, n, 64) ||
      !make_bf16_tensor_map(pre_map, pre_gelu != nullptr ? pre_gelu : out, m, n, 64)) {
    return false;
  }
  const int64_t tiles = ((int64_t{m} + T::kBlockM - 1) / T::kBlockM) * ((int64_t{n} + T::kBlockN - 1) / T::kBlockN);
  const int grid = static_cast<int>(std::min<int64_t>(tiles, multiprocessor_count(device)));
  kernel<<<grid, T::kThreads, T::kSharedBytes, stream>>>(a_map, b_map, out_map, pre_map, m, n, k,
                                                          static_cast<const __nv_bfloat16*>(bias), pre_gelu != nullptr,
                                                          group_rows);
  WEFT_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace

bool hopper_gemm_enabled() {
  int state = enabled_state.load(std::memory_order_relaxed);
  if (state < 0) {
    const char* value = std::getenv("WEFT_HOPPER_GEMM");
    state = value != nullptr && std::strcmp(value, "1") == 0 ? 1 : 0;
    enabled_state.store(state, std::memory_order_relaxed);
  }
  return state == 1;
}

void set_hopper_gemm_enabled(bool enabled) { enabled_state.store(enabled ? 1 : 0, std::memory_order_relaxed); }

int64_t hopper_gemm_launches() { return launches.load(std::memory_order_relaxed); }

bool hopper_bias_gelu(const void* a, const void* b, const void* bias, void* out, void* pre_gelu, int64_t m, int64_t n,
                      int64_t k, cudaStream_t stream) {
  constexpr int64_t kLargest = std::numeric_limits<int32_t>::max();
  if (m <= 0 || n <= 0 || k <= 0 || m > kLargest || n > kLargest || k > kLargest) return false;
  if (k % 8 != 0 || n % 8 != 0) return false;  // TMA's row strides: multiples of 16 bytes
  if (!aligned(a) || !aligned(b) || !aligned(out) || (pre_gelu != nullptr && !aligned(pre_gelu)) ||
      !aligned(bias)) {
    return false;
  }
  int device = 0;
  WEFT_CUDA_CHECK(cudaGetDevice(&device));
  if (!is_hopper(device)) return false;  // also keeps device below 64 for the caches
  const bool launched =
      n >= 4096 ? launch<hopper::AlternatingWide>(a, b, bias, out, pre_gelu, m, n, k, 16, device, stream)
                : launch<hopper::AlternatingTiling>(a, b, bias, out, pre_gelu, m, n, k, 1, device, stream);
  if (launched) launches.fetch_add(1, std::memory_order_relaxed);
  return launched;
}

}  // namespace weft::cuda
