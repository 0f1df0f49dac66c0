// The launchers of weft's own Hopper products (runtime/cuda/hopper_products.h): linear_gelu's bias +
// GELU forward, GELU's backward in the next linear's dX product, a linear's dX product with its
// bias gradient's column sums, Llama's gate and up products with SwiGLU, and SwiGLU's backward in
// the down-projection's dX product. Compiled for sm_90a only (CMakeLists.txt: the weft_sm90a object
// library), where wgmma and setmaxnreg exist.
//
// The tiling per shape: every product takes the alternating 128 × 192 tiling. The bias + GELU
// forward runs it in bands of 16 rows of tiles where N is 4096 or more (the 1.3B shape's 8192: 6-12%
// faster than cuBLASLt's there, docs/performance.md, 2026-12-05, fifteenth session) and row by row
// on narrower products (GPT-2's 3072). Until the twenty-fourth session (2026-12-06) the narrower ones
// took the alternating 128 × 128 tiling, then the only one whose GELU epilogue hid under the other
// warpgroup's products; since the epilogue adds the bias once and computes GELU while TMA reads the
// pre-activation's boxes, the 192-column tiling's GELU product is the faster on GPT-2's
// up-projection too (docs/performance.md, twenty-fourth session). The backward products (B read
// N-major) take the 192-column tiling in bands of 16 at every width (row by row, GPT-2's dX
// products took 1-2.5% less alone but its training step 0.2% more: twenty-fourth session): on an
// H100 (docs/performance.md, 2026-12-05, sixteenth session) it was the fastest own tiling for every
// dX shape measured (GPT-2's fc with the sums 144 against 157 µs for the 128-column one, the 1.3B
// fc plain 442 against 475) and level on GPT-2's GELU backward (153 against 152). SwiGLU's two
// products take the 192-column tiling too (docs/performance.md,
// 2026-12-06, eighteenth session, on an H100 at Llama 1B's shapes): the forward in bands of 8 (1061
// µs against 1292 for cuBLASLt's two products and the SwiGLU pass, 1230 for the 128-column tiling in
// bands of 8), the backward in bands of 16 (674 against 873 for cuBLASLt's product and the pass;
// bands of 8 took 675, the 128-column tilings 737-772).
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/dependent_launch.cuh"
#include "runtime/cuda/hopper_gemm.cuh"
#include "runtime/cuda/hopper_products.h"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/tensor_map.h"

namespace weft::cuda {
namespace {

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

// Whether the own kernels take a product of these sizes and operands (see hopper_products.h), and if
// so the current device, which is then a Hopper one.
bool applies(int64_t m, int64_t n, int64_t k, std::initializer_list<const void*> pointers, int& device) {
  constexpr int64_t kLargest = std::numeric_limits<int32_t>::max();
  if (m <= 0 || n <= 0 || k <= 0 || m > kLargest || n > kLargest || k > kLargest) return false;
  if (k % 8 != 0 || n % 8 != 0) return false;  // TMA's row strides: multiples of 16 bytes
  for (const void* pointer : pointers) {
    if (!aligned(pointer)) return false;
  }
  WEFT_CUDA_CHECK(cudaGetDevice(&device));
  return is_hopper(device);  // also keeps device below 64 for the caches
}

// Launches tiling T's kernel, one persistent CTA an SM (clusters are not used here: pairs measured
// slower on these shapes). b is [n, k] (kNByK) or [k, n] (kKByN). pre_gelu: written by kBiasGelu
// (null: not kept), read by kGeluBackward and (the gate) by kSwigluBackward. partials: a's column
// sums in 32-row slices where kSumAColumns. second_out and second_pre: kSwigluBackward's grad_up
// (written) and up (read), [m, n] each; null for the other epilogues. False where a map cannot be
// made. Launched as a programmatic dependent of the kernel before it (dependent_launch.cuh; the
// kernel waits before its first global access), so that its launch overlaps that kernel's tail.
template <typename T, hopper::Epilogue kEpilogue, hopper::BLayout kB, bool kSumAColumns = false>
bool launch(const void* a, const void* b, const void* bias, void* out, const void* pre_gelu, int m, int n, int k,
            int group_rows, int device, cudaStream_t stream, float* partials = nullptr, void* second_out = nullptr,
            const void* second_pre = nullptr) {
  const auto kernel = hopper::gemm_kernel<T, kEpilogue, kB, kSumAColumns>;
  static bool configured[64] = {};  // the shared-memory size it asks for, allowed once on each device
  if (!configured[device]) {
    WEFT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSharedBytes));
    configured[device] = true;
  }
  CUtensorMap a_map, b_map, out_map, pre_map;
  const bool b_mapped = kB == hopper::BLayout::kNByK ? make_bf16_tensor_map(b_map, b, n, k, T::kBSliceRows)
                                                     : make_bf16_tensor_map(b_map, b, k, n, 64);
  if (!make_bf16_tensor_map(a_map, a, m, k, T::kBlockM) || !b_mapped || !make_bf16_tensor_map(out_map, out, m, n, 64) ||
      !make_bf16_tensor_map(pre_map, pre_gelu != nullptr ? pre_gelu : out, m, n, 64)) {
    return false;
  }
  // The second maps only where the epilogue reads them; the kernel ignores them otherwise.
  CUtensorMap second_out_map = out_map, second_pre_map = pre_map;
  if ((second_out != nullptr && !make_bf16_tensor_map(second_out_map, second_out, m, n, 64)) ||
      (second_pre != nullptr && !make_bf16_tensor_map(second_pre_map, second_pre, m, n, 64))) {
    return false;
  }
  const int64_t tiles = ((int64_t{m} + T::kBlockM - 1) / T::kBlockM) * ((int64_t{n} + T::kBlockN - 1) / T::kBlockN);
  const int grid = static_cast<int>(std::min<int64_t>(tiles, multiprocessor_count(device)));
  launch_dependent(kernel, grid, T::kThreads, T::kSharedBytes, stream, a_map, b_map, out_map, pre_map, b_map,
                   second_out_map, second_pre_map, m, n, k, static_cast<const __nv_bfloat16*>(bias),
                   kEpilogue == hopper::Epilogue::kBiasGelu && pre_gelu != nullptr, group_rows, partials);
  count_hopper_gemm_launch();
  return true;
}

// The tiling for a product N wide (the file's comment says why): the 192-column one, in bands of 16
// for the backward products (B N-major) and forward products of N 4096 or more, row by row for
// narrower forward products.
template <hopper::Epilogue kEpilogue, hopper::BLayout kB, bool kSumAColumns = false>
bool launch_for_width(const void* a, const void* b, const void* bias, void* out, const void* pre_gelu, int64_t m,
                      int64_t n, int64_t k, int device, cudaStream_t stream, float* partials = nullptr) {
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const int group_rows = kB == hopper::BLayout::kKByN || n >= 4096 ? 16 : 1;
  return launch<hopper::AlternatingWide, kEpilogue, kB, kSumAColumns>(a, b, bias, out, pre_gelu, mi, ni, ki, group_rows,
                                                                      device, stream, partials);
}

// SwiGLU's products on the alternating 128 × 192 tiling: 96 columns of each output a tile, stored
// in unswizzled [64, 96] boxes (hopper::swiglu_box_columns), in bands of 8 rows of tiles (the file's
// comment).
bool launch_swiglu(const void* x, const void* gate_weight, const void* up_weight, void* gate, void* up, void* out,
                   int m, int hidden, int k, int device, cudaStream_t stream) {
  using T = hopper::AlternatingWide;
  constexpr int kBoxColumns = hopper::swiglu_box_columns<T>();
  const auto kernel = hopper::gemm_kernel<T, hopper::Epilogue::kSwiglu, hopper::BLayout::kNByK>;
  static bool configured[64] = {};
  if (!configured[device]) {
    WEFT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSharedBytes));
    configured[device] = true;
  }
  CUtensorMap x_map, gate_weight_map, up_weight_map, out_map, gate_map, up_map;
  if (!make_bf16_tensor_map(x_map, x, m, k, T::kBlockM) ||
      !make_bf16_tensor_map(gate_weight_map, gate_weight, hidden, k, T::kBlockN / 2) ||
      !make_bf16_tensor_map(up_weight_map, up_weight, hidden, k, T::kBlockN / 2) ||
      !make_bf16_tensor_map(out_map, out, m, hidden, 64, kBoxColumns) ||
      !make_bf16_tensor_map(gate_map, gate, m, hidden, 64, kBoxColumns) ||
      !make_bf16_tensor_map(up_map, up, m, hidden, 64, kBoxColumns)) {
    return false;
  }
  constexpr int kOutputColumns = T::kBlockN / 2;  // of each output, a tile
  const int64_t tiles =
      ((int64_t{m} + T::kBlockM - 1) / T::kBlockM) * ((int64_t{hidden} + kOutputColumns - 1) / kOutputColumns);
  const int grid = static_cast<int>(std::min<int64_t>(tiles, multiprocessor_count(device)));
  launch_dependent(kernel, grid, T::kThreads, T::kSharedBytes, stream, x_map, gate_weight_map, out_map, gate_map,
                   up_weight_map, up_map, up_map, m, hidden, k, static_cast<const __nv_bfloat16*>(nullptr), false, 8,
                   static_cast<float*>(nullptr));
  count_hopper_gemm_launch();
  return true;
}

// sums[c] = Σ_s partials[s, c] over the slices, rounded once to bf16: the column sums' second pass. A
// block of kSliceSumWarps warps takes 32 columns: warp w adds slices w, w + kSliceSumWarps, ... (a
// lane a column, so each warp reads 128 contiguous bytes of a slice), then the first warp adds the
// warps' sums in order. A fixed order: the same bits on every run. (One thread a column over every
// slice left GPT-2's [512, 3072] partials to 12 blocks; with it the fused sums cost as much as a
// separate pass, docs/performance.md, 2026-12-05, sixteenth session. Eight columns a block, 96
// blocks instead of 24 for GPT-2's 768 columns, measured slower: 5.6 against 4.7 µs a call under
// Nsight Compute, docs/performance.md, 2026-12-06, twenty-second session.) Launched as a
// programmatic dependent of the product that wrote the partials.
constexpr int kSliceSumWarps = 16;
__global__ void __launch_bounds__(32 * kSliceSumWarps) sum_slices_kernel(const float* __restrict__ partials,
                                                                         int slices, int k,
                                                                         __nv_bfloat16* __restrict__ sums) {
  __shared__ float warp_sums[kSliceSumWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, c = blockIdx.x * 32 + lane;
  wait_for_previous_kernels();
  float sum = 0.f;
  if (c < k) {
    for (int s = warp; s < slices; s += kSliceSumWarps) sum += partials[static_cast<int64_t>(s) * k + c];
  }
  warp_sums[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && c < k) {
    float total = 0.f;
    for (int w = 0; w < kSliceSumWarps; ++w) total += warp_sums[w][lane];
    sums[c] = __float2bfloat16(total);
  }
}

}  // namespace

bool hopper_bias_gelu(const void* a, const void* b, const void* bias, void* out, void* pre_gelu, int64_t m, int64_t n,
                      int64_t k, cudaStream_t stream) {
  int device = 0;
  if (!applies(m, n, k, {a, b, bias, out, pre_gelu != nullptr ? pre_gelu : out}, device)) return false;
  return launch_for_width<hopper::Epilogue::kBiasGelu, hopper::BLayout::kNByK>(a, b, bias, out, pre_gelu, m, n, k,
                                                                               device, stream);
}

bool hopper_gelu_backward(const void* dy, const void* w, const void* pre_gelu, void* out, int64_t m, int64_t n,
                          int64_t k, cudaStream_t stream) {
  int device = 0;
  if (!applies(m, n, k, {dy, w, pre_gelu, out}, device)) return false;
  return launch_for_width<hopper::Epilogue::kGeluBackward, hopper::BLayout::kKByN>(dy, w, nullptr, out, pre_gelu, m,
                                                                                   n, k, device, stream);
}

bool hopper_input_gradient(const void* dy, const void* w, const void* pre_gelu, void* out, void* column_sums,
                           float* partials, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  int device = 0;
  if (!applies(m, n, k, {dy, w, pre_gelu != nullptr ? pre_gelu : out, out, partials}, device)) return false;
  const bool launched =
      pre_gelu != nullptr
          ? launch_for_width<hopper::Epilogue::kGeluBackward, hopper::BLayout::kKByN, true>(
                dy, w, nullptr, out, pre_gelu, m, n, k, device, stream, partials)
          : launch_for_width<hopper::Epilogue::kNone, hopper::BLayout::kKByN, true>(dy, w, nullptr, out, nullptr, m, n,
                                                                                   k, device, stream, partials);
  if (!launched) return false;
  const int columns = static_cast<int>(k);
  launch_dependent(sum_slices_kernel, (columns + 31) / 32, 32 * kSliceSumWarps, 0, stream,
                   partials, static_cast<int>(hopper_column_sum_slices(m)), columns,
                   static_cast<__nv_bfloat16*>(column_sums));
  return true;
}

bool hopper_swiglu(const void* x, const void* gate_weight, const void* up_weight, void* gate, void* up, void* out,
                   int64_t m, int64_t hidden, int64_t k, cudaStream_t stream) {
  int device = 0;
  if (!applies(m, hidden, k, {x, gate_weight, up_weight, gate, up, out}, device)) return false;
  return launch_swiglu(x, gate_weight, up_weight, gate, up, out, static_cast<int>(m), static_cast<int>(hidden),
                       static_cast<int>(k), device, stream);
}

bool hopper_swiglu_backward(const void* dy, const void* w, const void* gate, const void* up, void* grad_gate,
                            void* grad_up, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  int device = 0;
  if (!applies(m, n, k, {dy, w, gate, up, grad_gate, grad_up}, device)) return false;
  // 192 columns in bands of 16, one output box a staging round (its gate, up and product in the three
  // staging boxes).
  return launch<hopper::AlternatingWide, hopper::Epilogue::kSwigluBackward, hopper::BLayout::kKByN>(
      dy, w, nullptr, grad_gate, gate, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 16, device,
      stream, nullptr, grad_up, up);
}

}  // namespace weft::cuda
