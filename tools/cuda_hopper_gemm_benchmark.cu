// cuda_hopper_gemm_benchmark: weft's own Hopper product (runtime/cuda/hopper_gemm.cuh) against cuBLASLt on
// the linear layers' forward shapes: plain, and bias + GELU with the pre-activation kept (cuBLASLt's
// CUBLASLT_EPILOGUE_GELU_AUX_BIAS); and on the backward dX products, dY · W with W read N-major: the
// MLP's down-projection times gelu'(pre-activation) (CUBLASLT_EPILOGUE_DGELU), and the plain ones with
// the bias gradient's column sums of dY fused (against cuBLASLt's product and a separate pass);
// Llama's gate and up products with SwiGLU (against cuBLASLt's two products and a SwiGLU pass); and
// SwiGLU's backward in the down-projection's dX product (against cuBLASLt's N-major product and a
// SwiGLU backward pass). Each cuBLASLt row is the fastest of the heuristic's first 8 algorithms, as
// weft's autotuner picks.
// Before timing, every output of weft's kernel is checked against cuBLASLt's (relative to the
// output's largest magnitude), and odd shapes against a plain f32 reference kernel, so a fast wrong
// kernel cannot pass.
//
//   cuda_hopper_gemm_benchmark [rounds]     (default 3; each round times every variant 20 times)
//   SHAPES="gpt2 up" cuda_hopper_gemm_benchmark 1     (only the shapes whose names start so; no odd shapes)
// Under Nsight Compute with --profile-from-start off, only the output checks are profiled: each
// variant's first product of each shape, after cuBLASLt's algorithms are chosen.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "runtime/cuda/hopper_gemm.cuh"
#include "runtime/cuda/silu.cuh"
#include "runtime/cuda/tensor_map.h"
#include "tools/standalone_cuda_checks.h"

namespace {

using bf16 = __nv_bfloat16;
namespace hopper = weft::cuda::hopper;

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kRepeats = 20;

__global__ void fill_kernel(bf16* data, size_t count, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    data[i] = __float2bfloat16(scale * (static_cast<float>(h & 0xFFFFFF) / 8388608.f - 1.f));
  }
}

// out[m, n] = sum_k a[m, k] b[n, k] (+ bias[n]), or sum_k a[m, k] b[k, n] where b_by_n (b [K, N]), in
// f32: the reference for odd shapes.
__global__ void reference_kernel(const bf16* a, const bf16* b, const bf16* bias, float* out, int m_size, int n_size,
                                 int k_size, bool b_by_n = false) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= n_size) return;
  float sum = 0.f;
  for (int k = 0; k < k_size; ++k)
    sum += __bfloat162float(a[size_t(m) * k_size + k]) *
           __bfloat162float(b_by_n ? b[size_t(k) * n_size + n] : b[size_t(n) * k_size + k]);
  if (bias != nullptr) sum += __bfloat162float(bias[n]);
  out[size_t(m) * n_size + n] = sum;
}

// A TMA map of a row-major [rows, columns] bf16 matrix in boxes of [box_rows, box_columns] (64:
// 128-byte swizzled; otherwise unswizzled, as make_bf16_tensor_map makes them).
CUtensorMap operand_map(const bf16* data, int rows, int columns, int box_rows, int box_columns = 64) {
  CUtensorMap map{};
  if (!weft::cuda::make_bf16_tensor_map(map, data, rows, columns, box_rows, box_columns)) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed for [%d, %d]\n", rows, columns);
    std::exit(1);
  }
  return map;
}

// pre_gelu: written by kBiasGelu (null: not kept), read by kGeluBackward, and the gate read by
// kSwigluBackward. b: [n, k], or [k, n] for BLayout::kKByN. column_partials: with kSumAColumns, a's
// column sums in 32-row slices ([ceil(m / 32), k] f32). second_out and second_pre: kSwigluBackward's
// grad_up (written) and up (read), [m, n] each (out is then grad_gate).
template <typename T, hopper::Epilogue kEpilogue, hopper::BLayout kB = hopper::BLayout::kNByK,
          bool kSumAColumns = false>
void launch_own(const bf16* a, const bf16* b, const bf16* bias, bf16* out, bf16* pre_gelu, int m, int n, int k,
                cudaStream_t stream, int group_rows = 1, float* column_partials = nullptr, bf16* second_out = nullptr,
                const bf16* second_pre = nullptr) {
  const auto kernel = hopper::gemm_kernel<T, kEpilogue, kB, kSumAColumns>;
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = T::kCluster;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  config.blockDim = dim3(T::kThreads);
  config.dynamicSmemBytes = T::kSharedBytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = T::kCluster > 1 ? 1 : 0;  // a launch of clusters of one ran 4-15% slower
  static int resident_clusters = 0;  // persistent: as many clusters as fit at once, a CTA an SM
  if (resident_clusters == 0) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSharedBytes));
    int device = 0, processors = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device));
    resident_clusters = processors;
    if (T::kCluster > 1) {
      config.gridDim = dim3(processors / T::kCluster * T::kCluster);
      CUDA_CHECK(cudaOccupancyMaxActiveClusters(&resident_clusters, kernel, &config));
      if (resident_clusters == 0) {
        std::fprintf(stderr, "no cluster of %d CTAs fits\n", T::kCluster);
        std::exit(1);
      }
    }
  }
  const CUtensorMap a_map = operand_map(a, m, k, T::kBlockM);
  const CUtensorMap b_map =
      kB == hopper::BLayout::kNByK ? operand_map(b, n, k, T::kBSliceRows) : operand_map(b, k, n, 64);
  const CUtensorMap out_map = operand_map(out, m, n, 64);
  const CUtensorMap pre_gelu_map = operand_map(pre_gelu != nullptr ? pre_gelu : out, m, n, 64);
  const CUtensorMap second_out_map = second_out != nullptr ? operand_map(second_out, m, n, 64) : out_map;
  const CUtensorMap second_pre_map = second_pre != nullptr ? operand_map(second_pre, m, n, 64) : pre_gelu_map;
  const int m_groups = ((m + T::kBlockM - 1) / T::kBlockM + T::kCluster - 1) / T::kCluster;
  const int groups = m_groups * ((n + T::kBlockN - 1) / T::kBlockN);
  config.gridDim = dim3(std::min(groups, resident_clusters) * T::kCluster);
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a_map, b_map, out_map, pre_gelu_map, b_map, second_out_map,
                                second_pre_map, m, n, k, bias,
                                kEpilogue == hopper::Epilogue::kBiasGelu && pre_gelu != nullptr, group_rows,
                                column_partials));
  CUDA_CHECK(cudaGetLastError());
}

// Llama's gate and up products with SwiGLU (kSwiglu): gate [m, hidden] = x [m, k] · gate_weight
// [hidden, k]ᵀ, up likewise, out = silu(gate) · up; one persistent CTA an SM, as the runtime launches
// it (runtime/cuda/sm90a/hopper_products.cu).
template <typename T>
void launch_own_swiglu(const bf16* x, const bf16* gate_weight, const bf16* up_weight, bf16* gate, bf16* up, bf16* out,
                       int m, int hidden, int k, cudaStream_t stream, int group_rows = 1) {
  const auto kernel = hopper::gemm_kernel<T, hopper::Epilogue::kSwiglu>;
  static int processors = 0;
  if (processors == 0) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSharedBytes));
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device));
  }
  const int tiles = ((m + T::kBlockM - 1) / T::kBlockM) * ((hidden + T::kBlockN / 2 - 1) / (T::kBlockN / 2));
  constexpr int kBoxColumns = hopper::swiglu_box_columns<T>();
  kernel<<<std::min(tiles, processors), T::kThreads, T::kSharedBytes, stream>>>(
      operand_map(x, m, k, T::kBlockM), operand_map(gate_weight, hidden, k, T::kBlockN / 2),
      operand_map(out, m, hidden, 64, kBoxColumns), operand_map(gate, m, hidden, 64, kBoxColumns),
      operand_map(up_weight, hidden, k, T::kBlockN / 2), operand_map(up, m, hidden, 64, kBoxColumns),
      operand_map(up, m, hidden, 64, kBoxColumns), m, hidden, k, nullptr, false, group_rows, nullptr);
  CUDA_CHECK(cudaGetLastError());
}

// out = silu(gate) · up over count elements, as runtime/cuda/swiglu.cu computes it (silu.cuh; 8 values a
// thread): the baseline's third pass, and what the own product's out must equal bit for bit.
__global__ void swiglu_pass_kernel(const bf16* gate, const bf16* up, bf16* out, size_t count) {
  const size_t start = (blockIdx.x * size_t{blockDim.x} + threadIdx.x) * 8;
  for (size_t i = start; i < count; i += size_t{gridDim.x} * blockDim.x * 8) {
    if (i + 8 <= count) {
      const uint4 g = *reinterpret_cast<const uint4*>(gate + i), u = *reinterpret_cast<const uint4*>(up + i);
      uint4 result;
      const bf16 *gs = reinterpret_cast<const bf16*>(&g), *us = reinterpret_cast<const bf16*>(&u);
      bf16* rs = reinterpret_cast<bf16*>(&result);
      for (int j = 0; j < 8; ++j) {
        rs[j] = __float2bfloat16(weft::cuda::swiglu_value(__bfloat162float(gs[j]), __bfloat162float(us[j])));
      }
      *reinterpret_cast<uint4*>(out + i) = result;
    } else {
      for (size_t j = i; j < count; ++j) {
        out[j] = __float2bfloat16(weft::cuda::swiglu_value(__bfloat162float(gate[j]), __bfloat162float(up[j])));
      }
    }
  }
}
void swiglu_pass(const bf16* gate, const bf16* up, bf16* out, size_t count, cudaStream_t stream) {
  swiglu_pass_kernel<<<1024, 256, 0, stream>>>(gate, up, out, count);
  CUDA_CHECK(cudaGetLastError());
}

// SwiGLU's backward of one element, as runtime/cuda/swiglu.cu's pass computes it (silu.cuh).
__device__ void swiglu_backward_element(bf16 gate, bf16 up, bf16 grad, bf16& grad_gate, bf16& grad_up) {
  float gate_gradient, up_gradient;
  weft::cuda::swiglu_gradients(__bfloat162float(gate), __bfloat162float(up), __bfloat162float(grad), gate_gradient,
                               up_gradient);
  grad_gate = __float2bfloat16(gate_gradient);
  grad_up = __float2bfloat16(up_gradient);
}

// grad_gate = (grad · up) · silu'(gate) and grad_up = grad · silu(gate) over count elements (8 a
// thread), grad being the down-projection's dX product: what weft runs after cuBLASLt's product
// today, and what the own kSwigluBackward product must equal bit for bit given the own plain
// product of the same tiling (the same accumulators, so the same rounded grad).
__global__ void swiglu_backward_pass_kernel(const bf16* gate, const bf16* up, const bf16* grad, bf16* grad_gate,
                                            bf16* grad_up, size_t count) {
  const size_t start = (blockIdx.x * size_t{blockDim.x} + threadIdx.x) * 8;
  for (size_t i = start; i < count; i += size_t{gridDim.x} * blockDim.x * 8) {
    if (i + 8 <= count) {
      const uint4 g = *reinterpret_cast<const uint4*>(gate + i), u = *reinterpret_cast<const uint4*>(up + i),
                  d = *reinterpret_cast<const uint4*>(grad + i);
      uint4 gate_result, up_result;
      const bf16 *gs = reinterpret_cast<const bf16*>(&g), *us = reinterpret_cast<const bf16*>(&u),
                 *ds = reinterpret_cast<const bf16*>(&d);
      bf16 *gate_results = reinterpret_cast<bf16*>(&gate_result), *up_results = reinterpret_cast<bf16*>(&up_result);
      for (int j = 0; j < 8; ++j) swiglu_backward_element(gs[j], us[j], ds[j], gate_results[j], up_results[j]);
      *reinterpret_cast<uint4*>(grad_gate + i) = gate_result;
      *reinterpret_cast<uint4*>(grad_up + i) = up_result;
    } else {
      for (size_t j = i; j < count; ++j) swiglu_backward_element(gate[j], up[j], grad[j], grad_gate[j], grad_up[j]);
    }
  }
}
void swiglu_backward_pass(const bf16* gate, const bf16* up, const bf16* grad, bf16* grad_gate, bf16* grad_up,
                          size_t count, cudaStream_t stream) {
  swiglu_backward_pass_kernel<<<1024, 256, 0, stream>>>(gate, up, grad, grad_gate, grad_up, count);
  CUDA_CHECK(cudaGetLastError());
}

// cuBLASLt's out [M, N] = a [M, K] · b [N, K]ᵀ, column-major: out'[N, M] = op_T(b' [K, N]) · a' [K, M]; or
// with b [K, N] (b_by_n): out'[N, M] = b' [N, K] · a' [K, M].
struct Lt {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t description = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, d_layout = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
  void* workspace = nullptr;
  const bf16 *a = nullptr, *b = nullptr;
  bf16* d = nullptr;
  cudaStream_t stream = nullptr;

  void destroy() const {
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(a_layout));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(b_layout));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d_layout));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(description));
  }

  void run() const {
    const float alpha = 1.f, beta = 0.f;
    CUBLAS_CHECK(cublasLtMatmul(handle, description, &alpha, b, a_layout, a, b_layout, &beta, d, d_layout, d, d_layout,
                                &algorithm, workspace, kWorkspaceBytes, stream));
  }
};

float time_ms(const std::function<void()>& product, cudaStream_t stream) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < kRepeats; ++i) product();
  CUDA_CHECK(cudaEventRecord(stop, stream));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return ms / kRepeats;
}

// epilogue: CUBLASLT_EPILOGUE_DEFAULT, _BIAS or _GELU_AUX_BIAS (bias and aux written), or _DGELU
// (aux read).
Lt make_lt(cublasLtHandle_t handle, void* workspace, cudaStream_t stream, const bf16* a, const bf16* b,
           const bf16* bias, bf16* d, bf16* aux, int m, int n, int k,
           cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT, bool b_by_n = false) {
  Lt lt;
  lt.handle = handle;
  lt.workspace = workspace;
  lt.stream = stream;
  lt.a = a;
  lt.b = b;
  lt.d = d;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&lt.description, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = b_by_n ? CUBLAS_OP_N : CUBLAS_OP_T, none = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.description, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.description, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none)));
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.description, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  }
  if (bias != nullptr) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.description, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (aux != nullptr) {
    const int64_t aux_ld = n;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.description, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                sizeof(aux)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.description, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                sizeof(aux_ld)));
  }
  if (b_by_n) {
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.a_layout, CUDA_R_16BF, n, k, n));
  } else {
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.a_layout, CUDA_R_16BF, k, n, k));
  }
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.b_layout, CUDA_R_16BF, k, m, k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.d_layout, CUDA_R_16BF, n, m, n));
  cublasLtMatmulPreference_t preference = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace_bytes = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof(workspace_bytes)));
  std::array<cublasLtMatmulHeuristicResult_t, 8> candidates{};
  int count = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, lt.description, lt.a_layout, lt.b_layout, lt.d_layout,
                                              lt.d_layout, preference, 8, candidates.data(), &count));
  float best = 1e30f;
  cublasLtMatmulAlgo_t chosen = candidates[0].algo;
  for (int i = 0; i < count; ++i) {
    lt.algorithm = candidates[i].algo;
    lt.run();  // warm-up
    const float ms = time_ms([&] { lt.run(); }, stream);
    if (ms < best) best = ms, chosen = candidates[i].algo;
  }
  lt.algorithm = chosen;
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
  return lt;
}

std::vector<float> to_host(const bf16* data, size_t count) {
  std::vector<bf16> raw(count);
  CUDA_CHECK(cudaMemcpy(raw.data(), data, count * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = __bfloat162float(raw[i]);
  return values;
}

// max |x - reference| / max |reference|.
double relative_error(const std::vector<float>& values, const std::vector<float>& reference) {
  double largest = 0, worst = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    largest = std::max(largest, std::fabs(double(reference[i])));
    const double difference = std::fabs(double(values[i]) - reference[i]);
    worst = std::max(worst, std::isnan(difference) ? 1e30 : difference);
  }
  return worst / std::max(largest, 1e-30);
}

// relative_error, and where it is 1e-2 or more a diagnosis on stderr, so that one run on the GPU says
// where a new product goes wrong: how many elements are off by more than 1e-2 of the largest
// reference value (and how many are NaN: outputs are filled with 0xFF first, so NaN means never
// written), the first few with their (row, column) in a matrix `columns` wide, and how many 64 × 64
// boxes (TMA's unit of load and store) hold one.
double checked_error(const char* what, const std::vector<float>& values, const std::vector<float>& reference,
                     int columns) {
  const double error = relative_error(values, reference);
  if (error < 1e-2) return error;
  double largest = 0;
  for (float r : reference) largest = std::max(largest, std::fabs(double(r)));
  const double tolerance = 1e-2 * std::max(largest, 1e-30);
  size_t wrong = 0, never_written = 0, wrong_boxes = 0;
  const size_t box_columns = (columns + 63) / 64, all_boxes = ((values.size() / columns + 63) / 64) * box_columns;
  std::vector<bool> box_wrong(all_boxes, false);
  std::fprintf(stderr, "  %s: error %.2e; first wrong (row, column): value / reference:", what, error);
  for (size_t i = 0; i < values.size(); ++i) {
    const double difference = std::fabs(double(values[i]) - reference[i]);
    if (!(difference > tolerance) && !std::isnan(difference)) continue;
    ++wrong;
    if (std::isnan(values[i])) ++never_written;
    const int row = static_cast<int>(i / columns), column = static_cast<int>(i % columns);
    if (wrong <= 4) std::fprintf(stderr, " (%d, %d): %g / %g", row, column, values[i], reference[i]);
    const size_t box = (row / 64) * box_columns + column / 64;
    if (!box_wrong[box]) box_wrong[box] = true, ++wrong_boxes;
  }
  std::fprintf(stderr, "\n  %s: %zu of %zu wrong (%zu NaN), in %zu of %zu 64 x 64 boxes\n", what, wrong, values.size(),
               never_written, wrong_boxes, all_boxes);
  return error;
}

float host_gelu(float x) { return 0.5f * x * (1.f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x))); }
float host_gelu_derivative(float x) {
  constexpr float c = 0.7978845608028654f, a = 0.044715f;
  const float t = std::tanh(c * (x + a * x * x * x));
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * c * (1.f + 3.f * a * x * x);
}

template <typename T>
bool check_odd_shape(const char* tiling, int m, int n, int k, cudaStream_t stream, int group_rows = 1) {
  bf16 *a, *b, *bias, *out, *pre;
  float* reference;
  CUDA_CHECK(cudaMalloc(&a, size_t(m) * k * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&b, size_t(n) * k * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&bias, size_t(n) * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&out, size_t(m) * n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&pre, size_t(m) * n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&reference, size_t(m) * n * sizeof(float)));
  fill_kernel<<<256, 256, 0, stream>>>(a, size_t(m) * k, 1, 1.f);
  fill_kernel<<<256, 256, 0, stream>>>(b, size_t(n) * k, 2, 1.f / std::sqrt(float(k)));
  fill_kernel<<<256, 256, 0, stream>>>(bias, n, 3, 0.5f);
  CUDA_CHECK(cudaMemsetAsync(out, 0xFF, size_t(m) * n * sizeof(bf16), stream));
  launch_own<T, hopper::Epilogue::kBiasGelu>(a, b, bias, out, pre, m, n, k, stream, group_rows);
  reference_kernel<<<dim3((n + 127) / 128, m), 128, 0, stream>>>(a, b, bias, reference, m, n, k);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> expected(size_t(m) * n), expected_gelu(expected.size());
  CUDA_CHECK(cudaMemcpy(expected.data(), reference, expected.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < expected.size(); ++i) expected_gelu[i] = host_gelu(expected[i]);
  const double pre_error = relative_error(to_host(pre, expected.size()), expected);
  const double out_error = relative_error(to_host(out, expected.size()), expected_gelu);
  // The bias epilogue alone, into an output filled with ones' bits first.
  CUDA_CHECK(cudaMemsetAsync(out, 0xFF, size_t(m) * n * sizeof(bf16), stream));
  launch_own<T, hopper::Epilogue::kBias>(a, b, bias, out, nullptr, m, n, k, stream, group_rows);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const double bias_error = relative_error(to_host(out, expected.size()), expected);
  const bool ok = pre_error < 1e-2 && out_error < 1e-2 && bias_error < 1e-2;
  std::printf("%s (bands of %d), odd shape m %d n %d k %d: errors: GELU's pre-activation %.2e, GELU %.2e, bias alone %.2e  %s\n",
              tiling, group_rows, m, n, k, pre_error, out_error, bias_error, ok ? "ok" : "WRONG");
  for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(bias), static_cast<void*>(out),
                  static_cast<void*>(pre), static_cast<void*>(reference)})
    CUDA_CHECK(cudaFree(p));
  return ok;
}

void sum_slices(const float* partials, int slices, int k, float* sums, cudaStream_t stream);

// GELU's backward with B read N-major: out = (a [m, k] · b [k, n]) ⊙ gelu'(pre [m, n]), and the plain
// N-major product, against the f32 reference; for alternating tilings also the plain product with
// a's column sums fused (kSumAColumns), against the host's.
template <typename T>
bool check_odd_shape_backward(const char* tiling, int m, int n, int k, cudaStream_t stream, int group_rows = 1) {
  bf16 *a, *b, *pre, *out;
  float* reference;
  CUDA_CHECK(cudaMalloc(&a, size_t(m) * k * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&b, size_t(k) * n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&pre, size_t(m) * n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&out, size_t(m) * n * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&reference, size_t(m) * n * sizeof(float)));
  fill_kernel<<<256, 256, 0, stream>>>(a, size_t(m) * k, 4, 1.f);
  fill_kernel<<<256, 256, 0, stream>>>(b, size_t(k) * n, 5, 1.f / std::sqrt(float(k)));
  fill_kernel<<<256, 256, 0, stream>>>(pre, size_t(m) * n, 6, 3.f);  // GELU's curved part and both tails
  CUDA_CHECK(cudaMemsetAsync(out, 0xFF, size_t(m) * n * sizeof(bf16), stream));
  launch_own<T, hopper::Epilogue::kGeluBackward, hopper::BLayout::kKByN>(a, b, nullptr, out, pre, m, n, k, stream,
                                                                        group_rows);
  reference_kernel<<<dim3((n + 127) / 128, m), 128, 0, stream>>>(a, b, nullptr, reference, m, n, k, true);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> expected(size_t(m) * n), expected_backward(expected.size());
  CUDA_CHECK(cudaMemcpy(expected.data(), reference, expected.size() * sizeof(float), cudaMemcpyDeviceToHost));
  const std::vector<float> pre_values = to_host(pre, expected.size());
  for (size_t i = 0; i < expected.size(); ++i) expected_backward[i] = expected[i] * host_gelu_derivative(pre_values[i]);
  const double backward_error = checked_error("GELU backward", to_host(out, expected.size()), expected_backward, n);
  CUDA_CHECK(cudaMemsetAsync(out, 0xFF, size_t(m) * n * sizeof(bf16), stream));
  launch_own<T, hopper::Epilogue::kNone, hopper::BLayout::kKByN>(a, b, nullptr, out, nullptr, m, n, k, stream,
                                                                group_rows);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const double plain_error = checked_error("plain, B N-major", to_host(out, expected.size()), expected, n);
  double sums_error = 0;
  if constexpr (T::kPingPong) {
    float *partials, *sums;
    CUDA_CHECK(cudaMalloc(&partials, size_t((m + 31) / 32) * k * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&sums, size_t(k) * sizeof(float)));
    CUDA_CHECK(cudaMemsetAsync(out, 0xFF, size_t(m) * n * sizeof(bf16), stream));
    CUDA_CHECK(cudaMemsetAsync(partials, 0xFF, size_t((m + 31) / 32) * k * sizeof(float), stream));
    launch_own<T, hopper::Epilogue::kNone, hopper::BLayout::kKByN, true>(a, b, nullptr, out, nullptr, m, n, k, stream,
                                                                         group_rows, partials);
    sum_slices(partials, (m + 31) / 32, k, sums, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<float> a_values = to_host(a, size_t(m) * k);
    std::vector<float> expected_sums(k, 0.f), got(k);
    for (int row = 0; row < m; ++row)
      for (int c = 0; c < k; ++c) expected_sums[c] += a_values[size_t(row) * k + c];
    CUDA_CHECK(cudaMemcpy(got.data(), sums, size_t(k) * sizeof(float), cudaMemcpyDeviceToHost));
    sums_error = std::max(checked_error("plain with the sums", to_host(out, expected.size()), expected, n),
                          checked_error("a's column sums", got, expected_sums, k));
    CUDA_CHECK(cudaFree(partials));
    CUDA_CHECK(cudaFree(sums));
  }
  const bool ok = backward_error < 1e-2 && plain_error < 1e-2 && sums_error < 1e-2;
  std::printf(
      "%s (bands of %d), B N-major, odd shape m %d n %d k %d: errors: GELU backward %.2e, plain %.2e, with a's column "
      "sums %.2e  %s\n",
      tiling, group_rows, m, n, k, backward_error, plain_error, sums_error, ok ? "ok" : "WRONG");
  for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(pre), static_cast<void*>(out),
                  static_cast<void*>(reference)})
    CUDA_CHECK(cudaFree(p));
  return ok;
}

struct Shape {
  const char* name;
  int m, n, k;
};

// sums[c] = Σ_s partials[s, c] over `slices` rows of [slices, k] f32: the second pass of the fused
// column sums, as the runtime's (runtime/cuda/sm90a/hopper_products.cu: 16 warps a block of 32
// columns, warp w adding every 16th slice), but kept in f32 here to compare.
__global__ void sum_slices_kernel(const float* partials, int slices, int k, float* sums) {
  __shared__ float warp_sums[16][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, c = blockIdx.x * 32 + lane;
  float sum = 0.f;
  if (c < k) {
    for (int s = warp; s < slices; s += 16) sum += partials[size_t(s) * k + c];
  }
  warp_sums[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && c < k) {
    float total = 0.f;
    for (int w = 0; w < 16; ++w) total += warp_sums[w][lane];
    sums[c] = total;
  }
}
void sum_slices(const float* partials, int slices, int k, float* sums, cudaStream_t stream) {
  sum_slices_kernel<<<(k + 31) / 32, 512, 0, stream>>>(partials, slices, k, sums);
}

// A bias gradient's column sums as a pass of their own, the way weft computes them today (in two
// passes over 256-row slices): the baseline the fused sums are measured against.
__global__ void column_partials_kernel(const bf16* a, int m, int k, float* partials) {
  const int pair = blockIdx.x * 32 + threadIdx.x % 32, slice = blockIdx.y;
  if (2 * pair >= k) return;
  float first = 0.f, second = 0.f;
  for (int row = slice * 256 + threadIdx.x / 32; row < min(m, (slice + 1) * 256); row += 8) {
    const __nv_bfloat162 values = *reinterpret_cast<const __nv_bfloat162*>(a + size_t(row) * k + 2 * pair);
    first += __low2float(values);
    second += __high2float(values);
  }
  __shared__ float2 warp_sums[8][32];
  warp_sums[threadIdx.x / 32][threadIdx.x % 32] = make_float2(first, second);
  __syncthreads();
  if (threadIdx.x < 32) {
    float2 sum = warp_sums[0][threadIdx.x];
    for (int w = 1; w < 8; ++w) sum.x += warp_sums[w][threadIdx.x].x, sum.y += warp_sums[w][threadIdx.x].y;
    *reinterpret_cast<float2*>(partials + size_t(slice) * k + 2 * pair) = sum;
  }
}
void separate_column_sums(const bf16* a, int m, int k, float* partials, float* sums, cudaStream_t stream) {
  const int slices = (m + 255) / 256;
  column_partials_kernel<<<dim3((k / 2 + 31) / 32, slices), 256, 0, stream>>>(a, m, k, partials);
  sum_slices(partials, slices, k, sums, stream);
}

// The backward dX products, dY [M, K] · W [K, N] (W as stored: N-major), each of weft's variants
// checked against cuBLASLt's and against f32 column sums of dY where it takes them, then timed in
// alternating rounds, µs:
// - the MLP's down-projection with GELU's backward (cuBLASLt's DGELU; weft's kGeluBackward);
// - the other dX products, plain, where the column sums are a bias gradient: "lt p+sums" is
//   cuBLASLt's product and then the sums in a pass of their own (separate_column_sums), "+s" the own
//   product with them fused (kSumAColumns) and then the pass over the slices.
// Prints two tables; false where an output is wrong.
bool time_backward_shapes(cublasLtHandle_t handle, void* workspace, cudaStream_t stream, int rounds,
                          const std::string& shape_prefix) {
  using hopper::BLayout;
  using hopper::Epilogue;
  struct Buffers {
    const bf16 *a, *b, *pre;
    bf16* out;
    float *partials, *sums;
  };
  struct Variant {
    const char* name;
    bool gelu, sums;  // compared with cuBLASLt's DGELU (else its plain product); column sums taken
    std::function<void(const Buffers&, int m, int n, int k)> run;
  };
#define WEFT_OWN_BACKWARD(label, tiling, epilogue, with_sums, group_rows)                                         \
  {label, Epilogue::epilogue == Epilogue::kGeluBackward, with_sums,                                              \
   [stream](const Buffers& x, int m, int n, int k) {                                                              \
     launch_own<hopper::tiling, Epilogue::epilogue, BLayout::kKByN, with_sums>(                                   \
         x.a, x.b, nullptr, x.out, const_cast<bf16*>(x.pre), m, n, k, stream, group_rows, x.partials);            \
     if (with_sums) sum_slices(x.partials, (m + 31) / 32, k, x.sums, stream);                                      \
   }}
  const std::vector<Variant> gelu_variants = {
      WEFT_OWN_BACKWARD("alt dg", AlternatingTiling, kGeluBackward, false, 1),
      WEFT_OWN_BACKWARD("alt dg+s", AlternatingTiling, kGeluBackward, true, 1),
      WEFT_OWN_BACKWARD("alt b8 dg", AlternatingTiling, kGeluBackward, false, 8),
      WEFT_OWN_BACKWARD("wide dg", WideTiling, kGeluBackward, false, 1),
      WEFT_OWN_BACKWARD("a192b16 p", AlternatingWide, kNone, false, 16),
      WEFT_OWN_BACKWARD("a192b16 dg", AlternatingWide, kGeluBackward, false, 16),
      WEFT_OWN_BACKWARD("a192 dg+s", AlternatingWide, kGeluBackward, true, 16),
      WEFT_OWN_BACKWARD("a192b1 dg+s", AlternatingWide, kGeluBackward, true, 1),
  };
  // The product with the sums in its slices but without the pass over them: what the sums cost the
  // product itself (its sums are not checked; its output is).
  const Variant slices_only = {"a192 slices", false, false, [stream](const Buffers& x, int m, int n, int k) {
                                 launch_own<hopper::AlternatingWide, Epilogue::kNone, BLayout::kKByN, true>(
                                     x.a, x.b, nullptr, x.out, nullptr, m, n, k, stream, 16, x.partials);
                               }};
  const std::vector<Variant> plain_variants = {
      WEFT_OWN_BACKWARD("alt p", AlternatingTiling, kNone, false, 1),
      WEFT_OWN_BACKWARD("alt p+s", AlternatingTiling, kNone, true, 1),
      WEFT_OWN_BACKWARD("alt b8 p+s", AlternatingTiling, kNone, true, 8),
      WEFT_OWN_BACKWARD("a192b16 p", AlternatingWide, kNone, false, 16),
      WEFT_OWN_BACKWARD("a192 p+s", AlternatingWide, kNone, true, 16),
      WEFT_OWN_BACKWARD("a192b1 p+s", AlternatingWide, kNone, true, 1),
      slices_only,
  };
#undef WEFT_OWN_BACKWARD
  struct Table {
    const char* title;
    std::vector<Shape> shapes;
    const std::vector<Variant>* variants;
  };
  const std::vector<Table> tables = {
      {"GELU backward dX (µs)", {{"gpt2 down dX (16384x3072x768)", 16384, 3072, 768},
                                 {"1.3B down dX (8192x8192x2048)", 8192, 8192, 2048}}, &gelu_variants},
      {"plain dX, bias sums (µs)", {{"gpt2 fc dX (16384x768x3072)", 16384, 768, 3072},
                                    {"gpt2 qkv dX (16384x768x2304)", 16384, 768, 2304},
                                    {"gpt2 attn dX (16384x768x768)", 16384, 768, 768},
                                    {"1.3B fc dX (8192x2048x8192)", 8192, 2048, 8192}}, &plain_variants},
  };
  bool all_ok = true;
  for (const Table& table : tables) {
    const bool gelu_table = table.variants == &gelu_variants;
    std::printf("\n%-30s %9s %9s", table.title, "lt p", gelu_table ? "lt dg" : "lt p+sums");
    for (const Variant& variant : *table.variants) std::printf(" %10s", variant.name);
    std::printf("\n");
    for (const Shape& shape : table.shapes) {
      if (std::string(shape.name).rfind(shape_prefix, 0) != 0) continue;
      const int m = shape.m, n = shape.n, k = shape.k;
      const size_t count = size_t(m) * n;
      bf16 *a, *b, *pre, *lt_out, *own_out;
      float *partials, *sums;
      CUDA_CHECK(cudaMalloc(&a, size_t(m) * k * sizeof(bf16)));
      CUDA_CHECK(cudaMalloc(&b, size_t(k) * n * sizeof(bf16)));
      for (bf16** p : {&pre, &lt_out, &own_out}) CUDA_CHECK(cudaMalloc(p, count * sizeof(bf16)));
      CUDA_CHECK(cudaMalloc(&partials, size_t((m + 31) / 32) * k * sizeof(float)));
      CUDA_CHECK(cudaMalloc(&sums, size_t(k) * sizeof(float)));
      fill_kernel<<<1024, 256, 0, stream>>>(a, size_t(m) * k, 21, 1.f);
      fill_kernel<<<1024, 256, 0, stream>>>(b, size_t(k) * n, 22, 1.f / std::sqrt(float(k)));
      fill_kernel<<<1024, 256, 0, stream>>>(pre, count, 23, 3.f);
      const Buffers buffers{a, b, pre, own_out, partials, sums};
      const Lt plain = make_lt(handle, workspace, stream, a, b, nullptr, lt_out, nullptr, m, n, k,
                               CUBLASLT_EPILOGUE_DEFAULT, true);
      const Lt backward =
          make_lt(handle, workspace, stream, a, b, nullptr, lt_out, pre, m, n, k, CUBLASLT_EPILOGUE_DGELU, true);
      // The column sums of a in f64 on the host: what every "+s" variant must give.
      std::vector<float> expected_sums(k, 0.f);
      {
        const std::vector<float> a_values = to_host(a, size_t(m) * k);
        std::vector<double> column(k, 0.0);
        for (int row = 0; row < m; ++row)
          for (int c = 0; c < k; ++c) column[c] += a_values[size_t(row) * k + c];
        for (int c = 0; c < k; ++c) expected_sums[c] = static_cast<float>(column[c]);
      }
      CUDA_CHECK(cudaProfilerStart());
      plain.run();
      const std::vector<float> lt_plain_out = to_host(lt_out, count);
      backward.run();
      const std::vector<float> lt_backward_out = to_host(lt_out, count);
      double worst = 0;
      for (const Variant& variant : *table.variants) {
        CUDA_CHECK(cudaMemsetAsync(own_out, 0xFF, count * sizeof(bf16), stream));
        CUDA_CHECK(cudaMemsetAsync(sums, 0xFF, size_t(k) * sizeof(float), stream));
        variant.run(buffers, m, n, k);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        worst = std::max(worst, checked_error(variant.name, to_host(own_out, count),
                                              variant.gelu ? lt_backward_out : lt_plain_out, n));
        if (variant.sums) {
          std::vector<float> got(k);
          CUDA_CHECK(cudaMemcpy(got.data(), sums, size_t(k) * sizeof(float), cudaMemcpyDeviceToHost));
          worst = std::max(worst, checked_error(variant.name, got, expected_sums, k));
        }
      }
      // The separate pass, checked too.
      separate_column_sums(a, m, k, partials, sums, stream);
      {
        std::vector<float> got(k);
        CUDA_CHECK(cudaMemcpy(got.data(), sums, size_t(k) * sizeof(float), cudaMemcpyDeviceToHost));
        worst = std::max(worst, checked_error("separate column sums", got, expected_sums, k));
      }
      CUDA_CHECK(cudaProfilerStop());
      const bool ok = worst < 1e-2;
      all_ok = all_ok && ok;
      std::vector<std::vector<float>> ms(table.variants->size() + 2);
      for (int round = 0; round < rounds; ++round) {
        ms[0].push_back(time_ms([&] { plain.run(); }, stream));
        if (gelu_table) {
          ms[1].push_back(time_ms([&] { backward.run(); }, stream));
        } else {
          ms[1].push_back(time_ms(
              [&] {
                plain.run();
                separate_column_sums(a, m, k, partials, sums, stream);
              },
              stream));
        }
        for (size_t v = 0; v < table.variants->size(); ++v)
          ms[v + 2].push_back(time_ms([&] { (*table.variants)[v].run(buffers, m, n, k); }, stream));
      }
      std::printf("%-30s", shape.name);
      for (size_t v = 0; v < ms.size(); ++v) {
        std::sort(ms[v].begin(), ms[v].end());
        std::printf(v < 2 ? " %9.1f" : " %10.1f", ms[v][ms[v].size() / 2] * 1e3f);
      }
      std::printf("   error %.1e %s\n", worst, ok ? "ok" : "WRONG");
      plain.destroy();
      backward.destroy();
      for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(pre),
                      static_cast<void*>(lt_out), static_cast<void*>(own_out), static_cast<void*>(partials),
                      static_cast<void*>(sums)})
        CUDA_CHECK(cudaFree(p));
    }
  }
  return all_ok;
}

// Whether two bf16 buffers hold the same bits.
bool same_bits(const bf16* first, const bf16* second, size_t count) {
  std::vector<uint16_t> a(count), b(count);
  CUDA_CHECK(cudaMemcpy(a.data(), first, count * sizeof(bf16), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(b.data(), second, count * sizeof(bf16), cudaMemcpyDeviceToHost));
  return a == b;
}

// Whether two bf16 buffers of a matrix `columns` wide hold the same bits; where not, how many
// elements differ and the first few (row, column) with both values on stderr, so that one run on
// the GPU tells a rounding difference (a last bit) from a misplaced value.
bool same_bits_reported(const char* what, const bf16* values, const bf16* expected, size_t count, int columns) {
  if (same_bits(values, expected, count)) return true;
  const std::vector<float> got = to_host(values, count), wanted = to_host(expected, count);
  size_t differing = 0;
  std::fprintf(stderr, "  %s: not the expected bits; first differing (row, column): value / expected:", what);
  for (size_t i = 0; i < count; ++i) {
    if (got[i] == wanted[i] || (std::isnan(got[i]) && std::isnan(wanted[i]))) continue;
    if (++differing <= 4) {
      std::fprintf(stderr, " (%zu, %zu): %g / %g", i / columns, i % columns, got[i], wanted[i]);
    }
  }
  std::fprintf(stderr, "\n  %s: %zu of %zu values differ%s\n", what, differing, count,
               differing == 0 ? " (only NaNs' bits do)" : "");
  return false;
}

// SwiGLU's products on an odd shape against the f32 reference: gate and up within bf16's rounding,
// out the swiglu pass's bits of the kernel's own gate and up.
template <typename T>
bool check_odd_shape_swiglu(const char* tiling, int m, int hidden, int k, cudaStream_t stream, int group_rows = 1) {
  const size_t count = size_t(m) * hidden;
  bf16 *x, *gate_weight, *up_weight, *gate, *up, *out, *expected_out;
  float *gate_reference, *up_reference;
  CUDA_CHECK(cudaMalloc(&x, size_t(m) * k * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&gate_weight, size_t(hidden) * k * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&up_weight, size_t(hidden) * k * sizeof(bf16)));
  for (bf16** p : {&gate, &up, &out, &expected_out}) CUDA_CHECK(cudaMalloc(p, count * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&gate_reference, count * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&up_reference, count * sizeof(float)));
  fill_kernel<<<256, 256, 0, stream>>>(x, size_t(m) * k, 31, 1.f);
  fill_kernel<<<256, 256, 0, stream>>>(gate_weight, size_t(hidden) * k, 32, 2.f / std::sqrt(float(k)));
  fill_kernel<<<256, 256, 0, stream>>>(up_weight, size_t(hidden) * k, 33, 1.f / std::sqrt(float(k)));
  for (bf16* p : {gate, up, out}) CUDA_CHECK(cudaMemsetAsync(p, 0xFF, count * sizeof(bf16), stream));
  launch_own_swiglu<T>(x, gate_weight, up_weight, gate, up, out, m, hidden, k, stream, group_rows);
  const dim3 reference_grid((hidden + 127) / 128, m);
  reference_kernel<<<reference_grid, 128, 0, stream>>>(x, gate_weight, nullptr, gate_reference, m, hidden, k);
  reference_kernel<<<reference_grid, 128, 0, stream>>>(x, up_weight, nullptr, up_reference, m, hidden, k);
  swiglu_pass(gate, up, expected_out, count, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> expected_gate(count), expected_up(count);
  CUDA_CHECK(cudaMemcpy(expected_gate.data(), gate_reference, count * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(expected_up.data(), up_reference, count * sizeof(float), cudaMemcpyDeviceToHost));
  const double gate_error = checked_error("gate", to_host(gate, count), expected_gate, hidden);
  const double up_error = checked_error("up", to_host(up, count), expected_up, hidden);
  const bool out_same = same_bits_reported("swiglu out", out, expected_out, count, hidden);
  const bool ok = gate_error < 1e-2 && up_error < 1e-2 && out_same;
  std::printf("%s SwiGLU (bands of %d), odd shape m %d hidden %d k %d: errors: gate %.2e, up %.2e; out %s  %s\n",
              tiling, group_rows, m, hidden, k, gate_error, up_error,
              out_same ? "the swiglu pass's bits" : "NOT the swiglu pass's bits", ok ? "ok" : "WRONG");
  for (void* p : {static_cast<void*>(x), static_cast<void*>(gate_weight), static_cast<void*>(up_weight),
                  static_cast<void*>(gate), static_cast<void*>(up), static_cast<void*>(out),
                  static_cast<void*>(expected_out), static_cast<void*>(gate_reference),
                  static_cast<void*>(up_reference)})
    CUDA_CHECK(cudaFree(p));
  return ok;
}

float host_silu(float x) { return x / (1.f + std::exp(-x)); }
float host_silu_derivative(float x) {
  const float sigmoid = 1.f / (1.f + std::exp(-x));
  return sigmoid * (1.f + x * (1.f - sigmoid));
}

// SwiGLU's backward with B read N-major on an odd shape: with p = dy [m, k] · w [k, n], grad_gate =
// (p · up) · silu'(gate) and grad_up = p · silu(gate), against the f32 reference's p (within bf16's
// rounding); and bit for bit against the swiglu backward pass over the own plain product of the same
// tiling (the same accumulators, so the same rounded p).
template <typename T>
bool check_odd_shape_swiglu_backward(const char* tiling, int m, int n, int k, cudaStream_t stream, int group_rows = 1) {
  using hopper::BLayout;
  using hopper::Epilogue;
  const size_t count = size_t(m) * n;
  bf16 *dy, *w, *gate, *up, *grad_gate, *grad_up, *product, *expected_grad_gate, *expected_grad_up;
  float* reference;
  CUDA_CHECK(cudaMalloc(&dy, size_t(m) * k * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&w, size_t(k) * n * sizeof(bf16)));
  for (bf16** p : {&gate, &up, &grad_gate, &grad_up, &product, &expected_grad_gate, &expected_grad_up})
    CUDA_CHECK(cudaMalloc(p, count * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&reference, count * sizeof(float)));
  fill_kernel<<<256, 256, 0, stream>>>(dy, size_t(m) * k, 51, 1.f);
  fill_kernel<<<256, 256, 0, stream>>>(w, size_t(k) * n, 52, 1.f / std::sqrt(float(k)));
  fill_kernel<<<256, 256, 0, stream>>>(gate, count, 53, 3.f);  // silu's curved part and both tails
  fill_kernel<<<256, 256, 0, stream>>>(up, count, 54, 1.f);
  for (bf16* p : {grad_gate, grad_up, product}) CUDA_CHECK(cudaMemsetAsync(p, 0xFF, count * sizeof(bf16), stream));
  launch_own<T, Epilogue::kSwigluBackward, BLayout::kKByN>(dy, w, nullptr, grad_gate, gate, m, n, k, stream, group_rows,
                                                           nullptr, grad_up, up);
  launch_own<T, Epilogue::kNone, BLayout::kKByN>(dy, w, nullptr, product, nullptr, m, n, k, stream, group_rows);
  swiglu_backward_pass(gate, up, product, expected_grad_gate, expected_grad_up, count, stream);
  reference_kernel<<<dim3((n + 127) / 128, m), 128, 0, stream>>>(dy, w, nullptr, reference, m, n, k, true);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> expected(count);
  CUDA_CHECK(cudaMemcpy(expected.data(), reference, count * sizeof(float), cudaMemcpyDeviceToHost));
  const std::vector<float> gate_values = to_host(gate, count), up_values = to_host(up, count);
  std::vector<float> expected_gate(count), expected_up(count);
  for (size_t i = 0; i < count; ++i) {
    expected_gate[i] = expected[i] * up_values[i] * host_silu_derivative(gate_values[i]);
    expected_up[i] = expected[i] * host_silu(gate_values[i]);
  }
  const double gate_error = checked_error("SwiGLU backward: grad_gate", to_host(grad_gate, count), expected_gate, n);
  const double up_error = checked_error("SwiGLU backward: grad_up", to_host(grad_up, count), expected_up, n);
  const bool gate_bits = same_bits_reported("SwiGLU backward: grad_gate", grad_gate, expected_grad_gate, count, n);
  const bool up_bits = same_bits_reported("SwiGLU backward: grad_up", grad_up, expected_grad_up, count, n);
  const bool ok = gate_error < 1e-2 && up_error < 1e-2 && gate_bits && up_bits;
  std::printf(
      "%s SwiGLU backward (bands of %d), B N-major, odd shape m %d n %d k %d: errors: grad_gate %.2e, grad_up %.2e; "
      "%sthe pass's bits over the own plain product  %s\n",
      tiling, group_rows, m, n, k, gate_error, up_error, gate_bits && up_bits ? "" : "NOT ", ok ? "ok" : "WRONG");
  for (void* p : {static_cast<void*>(dy), static_cast<void*>(w), static_cast<void*>(gate), static_cast<void*>(up),
                  static_cast<void*>(grad_gate), static_cast<void*>(grad_up), static_cast<void*>(product),
                  static_cast<void*>(expected_grad_gate), static_cast<void*>(expected_grad_up),
                  static_cast<void*>(reference)})
    CUDA_CHECK(cudaFree(p));
  return ok;
}

// Llama's gate and up products with SwiGLU, µs: "lt 2p+sw" is what weft runs without the own
// product (cuBLASLt's two products, then the SwiGLU pass over gate and up), "lt 2p" the two products
// alone; then the own kSwiglu variants, each checked first (gate and up against cuBLASLt's, out the
// swiglu pass's bits of its own gate and up). False where an output is wrong.
bool time_swiglu_shapes(cublasLtHandle_t handle, void* workspace, cudaStream_t stream, int rounds,
                        const std::string& shape_prefix) {
  struct Buffers {
    const bf16 *x, *gate_weight, *up_weight;
    bf16 *gate, *up, *out;
  };
  struct Variant {
    const char* name;
    std::function<void(const Buffers&, int m, int hidden, int k)> run;
  };
#define WEFT_OWN_SWIGLU(label, tiling, group_rows)                                                              \
  {label, [stream](const Buffers& b, int m, int hidden, int k) {                                               \
     launch_own_swiglu<hopper::tiling>(b.x, b.gate_weight, b.up_weight, b.gate, b.up, b.out, m, hidden, k, stream, \
                                       group_rows);                                                             \
   }}
  const std::vector<Variant> variants = {
      WEFT_OWN_SWIGLU("alt b8 sw", AlternatingTiling, 8),
      WEFT_OWN_SWIGLU("wide4b8 sw", WideFourStages, 8),
      WEFT_OWN_SWIGLU("a192 sw", AlternatingWide, 1),
      WEFT_OWN_SWIGLU("a192b8 sw", AlternatingWide, 8),
      WEFT_OWN_SWIGLU("a192b16 sw", AlternatingWide, 16),
  };
#undef WEFT_OWN_SWIGLU
  const std::vector<Shape> shapes = {{"llama1b gate+up (16384x5504x2048)", 16384, 5504, 2048},
                                     {"llama7b gate+up (8192x11008x4096)", 8192, 11008, 4096}};
  std::printf("\n%-34s %9s %9s", "SwiGLU forward (µs)", "lt 2p", "lt 2p+sw");
  for (const Variant& variant : variants) std::printf(" %10s", variant.name);
  std::printf("\n");
  bool all_ok = true;
  for (const Shape& shape : shapes) {
    if (std::string(shape.name).rfind(shape_prefix, 0) != 0) continue;
    const int m = shape.m, hidden = shape.n, k = shape.k;
    const size_t count = size_t(m) * hidden;
    bf16 *x, *gate_weight, *up_weight, *lt_gate, *lt_up, *lt_out, *gate, *up, *out, *expected_out;
    CUDA_CHECK(cudaMalloc(&x, size_t(m) * k * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&gate_weight, size_t(hidden) * k * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&up_weight, size_t(hidden) * k * sizeof(bf16)));
    for (bf16** p : {&lt_gate, &lt_up, &lt_out, &gate, &up, &out, &expected_out})
      CUDA_CHECK(cudaMalloc(p, count * sizeof(bf16)));
    fill_kernel<<<1024, 256, 0, stream>>>(x, size_t(m) * k, 41, 1.f);
    fill_kernel<<<1024, 256, 0, stream>>>(gate_weight, size_t(hidden) * k, 42, 2.f / std::sqrt(float(k)));
    fill_kernel<<<1024, 256, 0, stream>>>(up_weight, size_t(hidden) * k, 43, 1.f / std::sqrt(float(k)));
    const Lt gate_product = make_lt(handle, workspace, stream, x, gate_weight, nullptr, lt_gate, nullptr, m, hidden, k);
    const Lt up_product = make_lt(handle, workspace, stream, x, up_weight, nullptr, lt_up, nullptr, m, hidden, k);
    const Buffers buffers{x, gate_weight, up_weight, gate, up, out};
    CUDA_CHECK(cudaProfilerStart());
    gate_product.run();
    up_product.run();
    const std::vector<float> lt_gate_values = to_host(lt_gate, count), lt_up_values = to_host(lt_up, count);
    double worst = 0;
    bool bits_ok = true;
    for (const Variant& variant : variants) {
      for (bf16* p : {gate, up, out}) CUDA_CHECK(cudaMemsetAsync(p, 0xFF, count * sizeof(bf16), stream));
      variant.run(buffers, m, hidden, k);
      swiglu_pass(gate, up, expected_out, count, stream);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      worst = std::max(worst, checked_error(variant.name, to_host(gate, count), lt_gate_values, hidden));
      worst = std::max(worst, checked_error(variant.name, to_host(up, count), lt_up_values, hidden));
      bits_ok = same_bits_reported(variant.name, out, expected_out, count, hidden) && bits_ok;
    }
    CUDA_CHECK(cudaProfilerStop());
    const bool ok = worst < 1e-2 && bits_ok;
    all_ok = all_ok && ok;
    std::vector<std::vector<float>> ms(variants.size() + 2);
    for (int round = 0; round < rounds; ++round) {
      ms[0].push_back(time_ms(
          [&] {
            gate_product.run();
            up_product.run();
          },
          stream));
      ms[1].push_back(time_ms(
          [&] {
            gate_product.run();
            up_product.run();
            swiglu_pass(lt_gate, lt_up, lt_out, count, stream);
          },
          stream));
      for (size_t v = 0; v < variants.size(); ++v)
        ms[v + 2].push_back(time_ms([&] { variants[v].run(buffers, m, hidden, k); }, stream));
    }
    std::printf("%-34s", shape.name);
    for (size_t v = 0; v < ms.size(); ++v) {
      std::sort(ms[v].begin(), ms[v].end());
      std::printf(v < 2 ? " %9.1f" : " %10.1f", ms[v][ms[v].size() / 2] * 1e3f);
    }
    std::printf("   error %.1e %s\n", worst, ok ? "ok" : "WRONG");
    gate_product.destroy();
    up_product.destroy();
    for (void* p : {static_cast<void*>(x), static_cast<void*>(gate_weight), static_cast<void*>(up_weight),
                    static_cast<void*>(lt_gate), static_cast<void*>(lt_up), static_cast<void*>(lt_out),
                    static_cast<void*>(gate), static_cast<void*>(up), static_cast<void*>(out),
                    static_cast<void*>(expected_out)})
      CUDA_CHECK(cudaFree(p));
  }
  return all_ok;
}

// SwiGLU's backward in Llama's down-projection dX product, µs: "lt p+swb" is what weft runs
// without the own product (cuBLASLt's N-major product dY · W, then the SwiGLU backward pass over it
// with gate and up), "lt p" the product alone, "a192b16 p" the own plain product of the runtime's
// backward tiling (what the epilogue adds to); then the own kSwigluBackward variants, each checked
// first: both gradients against cuBLASLt's product and the pass (within bf16's rounding), and bit
// for bit against the pass over the own plain product of the same tiling. False where an output is
// wrong.
bool time_swiglu_backward_shapes(cublasLtHandle_t handle, void* workspace, cudaStream_t stream, int rounds,
                                 const std::string& shape_prefix) {
  using hopper::BLayout;
  using hopper::Epilogue;
  struct Buffers {
    const bf16 *dy, *w, *gate, *up;
    bf16 *grad_gate, *grad_up, *product;
  };
  struct Variant {
    const char* name;
    std::function<void(const Buffers&, int m, int n, int k)> run;    // the gradients
    std::function<void(const Buffers&, int m, int n, int k)> plain;  // the same tiling's plain product
  };
#define WEFT_OWN_SWIGLU_BACKWARD(label, tiling, group_rows)                                                      \
  {label,                                                                                                       \
   [stream](const Buffers& x, int m, int n, int k) {                                                            \
     launch_own<hopper::tiling, Epilogue::kSwigluBackward, BLayout::kKByN>(x.dy, x.w, nullptr, x.grad_gate,     \
                                                                           const_cast<bf16*>(x.gate), m, n, k,  \
                                                                           stream, group_rows, nullptr,         \
                                                                           x.grad_up, x.up);                    \
   },                                                                                                           \
   [stream](const Buffers& x, int m, int n, int k) {                                                            \
     launch_own<hopper::tiling, Epilogue::kNone, BLayout::kKByN>(x.dy, x.w, nullptr, x.product, nullptr, m, n, \
                                                                 k, stream, group_rows);                       \
   }}
  const std::vector<Variant> variants = {
      WEFT_OWN_SWIGLU_BACKWARD("a192 swb", AlternatingWide, 1),
      WEFT_OWN_SWIGLU_BACKWARD("a192b8 swb", AlternatingWide, 8),
      WEFT_OWN_SWIGLU_BACKWARD("a192b16swb", AlternatingWide, 16),
  };
#undef WEFT_OWN_SWIGLU_BACKWARD
  // The runtime's plain dX product (runtime/cuda/sm90a/hopper_products.cu), for what the epilogue costs.
  auto own_plain = [stream](const Buffers& x, int m, int n, int k) {
    launch_own<hopper::AlternatingWide, Epilogue::kNone, BLayout::kKByN>(x.dy, x.w, nullptr, x.product, nullptr, m, n,
                                                                        k, stream, 16);
  };
  const std::vector<Shape> shapes = {{"llama1b down dX (16384x5504x2048)", 16384, 5504, 2048},
                                     {"llama7b down dX (8192x11008x4096)", 8192, 11008, 4096}};
  std::printf("\n%-34s %9s %9s %10s", "SwiGLU backward dX (µs)", "lt p", "lt p+swb", "a192b16 p");
  for (const Variant& variant : variants) std::printf(" %10s", variant.name);
  std::printf("\n");
  bool all_ok = true;
  for (const Shape& shape : shapes) {
    if (std::string(shape.name).rfind(shape_prefix, 0) != 0) continue;
    const int m = shape.m, n = shape.n, k = shape.k;
    const size_t count = size_t(m) * n;
    bf16 *dy, *w, *gate, *up, *lt_product, *lt_grad_gate, *lt_grad_up, *grad_gate, *grad_up, *product,
        *expected_grad_gate, *expected_grad_up;
    CUDA_CHECK(cudaMalloc(&dy, size_t(m) * k * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&w, size_t(k) * n * sizeof(bf16)));
    for (bf16** p : {&gate, &up, &lt_product, &lt_grad_gate, &lt_grad_up, &grad_gate, &grad_up, &product,
                     &expected_grad_gate, &expected_grad_up})
      CUDA_CHECK(cudaMalloc(p, count * sizeof(bf16)));
    fill_kernel<<<1024, 256, 0, stream>>>(dy, size_t(m) * k, 61, 1.f);
    fill_kernel<<<1024, 256, 0, stream>>>(w, size_t(k) * n, 62, 1.f / std::sqrt(float(k)));
    fill_kernel<<<1024, 256, 0, stream>>>(gate, count, 63, 3.f);
    fill_kernel<<<1024, 256, 0, stream>>>(up, count, 64, 1.f);
    const Lt plain = make_lt(handle, workspace, stream, dy, w, nullptr, lt_product, nullptr, m, n, k,
                             CUBLASLT_EPILOGUE_DEFAULT, true);
    const Buffers buffers{dy, w, gate, up, grad_gate, grad_up, product};
    CUDA_CHECK(cudaProfilerStart());
    plain.run();
    swiglu_backward_pass(gate, up, lt_product, lt_grad_gate, lt_grad_up, count, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<float> lt_product_values = to_host(lt_product, count);
    const std::vector<float> lt_gate_values = to_host(lt_grad_gate, count), lt_up_values = to_host(lt_grad_up, count);
    CUDA_CHECK(cudaMemsetAsync(product, 0xFF, count * sizeof(bf16), stream));
    own_plain(buffers, m, n, k);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    double worst = checked_error("a192b16 p", to_host(product, count), lt_product_values, n);
    bool bits_ok = true;
    for (const Variant& variant : variants) {
      for (bf16* p : {grad_gate, grad_up, product}) CUDA_CHECK(cudaMemsetAsync(p, 0xFF, count * sizeof(bf16), stream));
      variant.run(buffers, m, n, k);
      variant.plain(buffers, m, n, k);
      swiglu_backward_pass(gate, up, product, expected_grad_gate, expected_grad_up, count, stream);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      worst = std::max(worst, checked_error(variant.name, to_host(grad_gate, count), lt_gate_values, n));
      worst = std::max(worst, checked_error(variant.name, to_host(grad_up, count), lt_up_values, n));
      bits_ok = same_bits_reported(variant.name, grad_gate, expected_grad_gate, count, n) && bits_ok;
      bits_ok = same_bits_reported(variant.name, grad_up, expected_grad_up, count, n) && bits_ok;
    }
    CUDA_CHECK(cudaProfilerStop());
    const bool ok = worst < 1e-2 && bits_ok;
    all_ok = all_ok && ok;
    std::vector<std::vector<float>> ms(variants.size() + 3);
    for (int round = 0; round < rounds; ++round) {
      ms[0].push_back(time_ms([&] { plain.run(); }, stream));
      ms[1].push_back(time_ms(
          [&] {
            plain.run();
            swiglu_backward_pass(gate, up, lt_product, lt_grad_gate, lt_grad_up, count, stream);
          },
          stream));
      ms[2].push_back(time_ms([&] { own_plain(buffers, m, n, k); }, stream));
      for (size_t v = 0; v < variants.size(); ++v)
        ms[v + 3].push_back(time_ms([&] { variants[v].run(buffers, m, n, k); }, stream));
    }
    std::printf("%-34s", shape.name);
    for (size_t v = 0; v < ms.size(); ++v) {
      std::sort(ms[v].begin(), ms[v].end());
      std::printf(v < 2 ? " %9.1f" : " %10.1f", ms[v][ms[v].size() / 2] * 1e3f);
    }
    std::printf("   error %.1e %s\n", worst, ok ? "ok" : "WRONG");
    plain.destroy();
    for (void* p : {static_cast<void*>(dy), static_cast<void*>(w), static_cast<void*>(gate), static_cast<void*>(up),
                    static_cast<void*>(lt_product), static_cast<void*>(lt_grad_gate), static_cast<void*>(lt_grad_up),
                    static_cast<void*>(grad_gate), static_cast<void*>(grad_up), static_cast<void*>(product),
                    static_cast<void*>(expected_grad_gate), static_cast<void*>(expected_grad_up)})
      CUDA_CHECK(cudaFree(p));
  }
  return all_ok;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  cublasLtHandle_t handle;
  CUBLAS_CHECK(cublasLtCreate(&handle));
  void* workspace;
  CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));

  bool all_ok = true;
  const char* wanted = std::getenv("SHAPES");
  const std::string shape_prefix = wanted != nullptr ? wanted : "";
  std::vector<std::array<int, 3>> odd_shapes = {{200, 136, 72}, {129, 136, 64}, {64, 8, 8}, {1000, 520, 776}, {4000, 1032, 136}};
  if (!shape_prefix.empty()) odd_shapes.clear();
  for (const std::array<int, 3>& odd : odd_shapes) {
    all_ok = check_odd_shape<hopper::WideTiling>("wide", odd[0], odd[1], odd[2], stream) && all_ok;
    all_ok = check_odd_shape<hopper::AlternatingTiling>("alternating", odd[0], odd[1], odd[2], stream) && all_ok;
    all_ok = check_odd_shape<hopper::WideFourStages>("wide, four stages", odd[0], odd[1], odd[2], stream) && all_ok;
    all_ok = check_odd_shape<hopper::AlternatingWide>("alternating, 192 columns", odd[0], odd[1], odd[2], stream) && all_ok;
    all_ok = check_odd_shape<hopper::WideFourStagesPaired>("wide, four stages, paired", odd[0], odd[1], odd[2],
                                                           stream) &&
             all_ok;
    all_ok = check_odd_shape<hopper::AlternatingSixStagesPaired>("alternating, six stages, paired", odd[0], odd[1],
                                                                 odd[2], stream) &&
             all_ok;
    all_ok = check_odd_shape<hopper::AlternatingWidePaired>("alternating, 192 columns, paired", odd[0], odd[1], odd[2],
                                                            stream, 3) &&
             all_ok;
    all_ok = check_odd_shape<hopper::AlternatingTiling>("alternating", odd[0], odd[1], odd[2], stream, 2) && all_ok;
    all_ok = check_odd_shape<hopper::AlternatingPaired>("alternating, paired", odd[0], odd[1], odd[2], stream) && all_ok;
    all_ok = check_odd_shape<hopper::AlternatingWidePaired>("alternating, 192 columns, paired", odd[0], odd[1], odd[2],
                                                            stream) &&
             all_ok;
    all_ok = check_odd_shape_backward<hopper::AlternatingTiling>("alternating", odd[0], odd[1], odd[2], stream) && all_ok;
    all_ok = check_odd_shape_backward<hopper::WideTiling>("wide", odd[0], odd[1], odd[2], stream) && all_ok;
    all_ok = check_odd_shape_backward<hopper::AlternatingWide>("alternating, 192 columns", odd[0], odd[1], odd[2],
                                                               stream, 3) &&
             all_ok;
    all_ok = check_odd_shape_backward<hopper::AlternatingPaired>("alternating, paired", odd[0], odd[1], odd[2],
                                                                 stream) &&
             all_ok;
    all_ok = check_odd_shape_swiglu<hopper::AlternatingTiling>("alternating", odd[0], odd[1], odd[2], stream) && all_ok;
    all_ok = check_odd_shape_swiglu<hopper::AlternatingTiling>("alternating", odd[0], odd[1], odd[2], stream, 3) &&
             all_ok;
    all_ok = check_odd_shape_swiglu<hopper::WideFourStages>("wide, four stages", odd[0], odd[1], odd[2], stream) &&
             all_ok;
    all_ok = check_odd_shape_swiglu<hopper::AlternatingWide>("alternating, 192 columns", odd[0], odd[1], odd[2],
                                                             stream) &&
             all_ok;
    all_ok = check_odd_shape_swiglu<hopper::AlternatingWide>("alternating, 192 columns", odd[0], odd[1], odd[2],
                                                             stream, 3) &&
             all_ok;
    all_ok = check_odd_shape_swiglu_backward<hopper::AlternatingWide>("alternating, 192 columns", odd[0], odd[1],
                                                                       odd[2], stream) &&
             all_ok;
    all_ok = check_odd_shape_swiglu_backward<hopper::AlternatingWide>("alternating, 192 columns", odd[0], odd[1],
                                                                       odd[2], stream, 3) &&
             all_ok;
  }

  const std::vector<Shape> shapes = {
      {"gpt2 up (16384x3072x768)", 16384, 3072, 768},   {"gpt2 qkv (16384x2304x768)", 16384, 2304, 768},
      {"gpt2 proj (16384x768x768)", 16384, 768, 768},   {"gpt2 down (16384x768x3072)", 16384, 768, 3072},
      {"1.3B up (8192x8192x2048)", 8192, 8192, 2048},   {"1.3B qkv (8192x6144x2048)", 8192, 6144, 2048},
      {"1.3B down (8192x2048x8192)", 8192, 2048, 8192},
      // Llama 1B's forward products other than gate and up: qkv (GQA 16/8, 2048 + 2 · 1024 columns), the
      // attention's output, down. On an H100 (docs/performance.md, 2026-12-06, nineteenth session) the
      // own plain product lost qkv by 15% and was level or 6% ahead on the others: cuBLASLt keeps them.
      {"llama1b qkv (16384x4096x2048)", 16384, 4096, 2048}, {"llama1b o (16384x2048x2048)", 16384, 2048, 2048},
      {"llama1b down (16384x2048x5504)", 16384, 2048, 5504},
  };
  // The variants, in the table's order: cuBLASLt's, then each of weft's tilings, plain and with
  // bias + GELU.
  struct Variant {
    const char* name;
    bool gelu;
    std::function<void(const Lt& plain, const Lt& gelu, const bf16* a, const bf16* b, const bf16* bias, bf16* out,
                       bf16* pre, int m, int n, int k)>
        run;
  };
  using hopper::Epilogue;
  const std::vector<Variant> variants = {
      {"lt plain", false, [](const Lt& p, const Lt&, auto...) { p.run(); }},
      {"lt gelu", true, [](const Lt&, const Lt& g, auto...) { g.run(); }},
#define WEFT_OWN_VARIANT(label, tiling, epilogue, gelu, group_rows)                                               \
  {label, gelu,                                                                                                  \
   [stream](const Lt&, const Lt&, const bf16* a, const bf16* b, const bf16* bias, bf16* out, bf16* pre, int m, \
            int n, int k) {                                                                                      \
     launch_own<hopper::tiling, Epilogue::epilogue>(a, b, gelu ? bias : nullptr, out, gelu ? pre : nullptr, m, n, \
                                                    k, stream, group_rows);                                      \
   }}
      WEFT_OWN_VARIANT("alt p", AlternatingTiling, kNone, false, 1),
      WEFT_OWN_VARIANT("alt g", AlternatingTiling, kBiasGelu, true, 1),
      WEFT_OWN_VARIANT("alt6x2 p", AlternatingSixStagesPaired, kNone, false, 1),
      WEFT_OWN_VARIANT("alt6x2 g", AlternatingSixStagesPaired, kBiasGelu, true, 1),
      WEFT_OWN_VARIANT("a6x2b8 p", AlternatingSixStagesPaired, kNone, false, 8),
      WEFT_OWN_VARIANT("a6x2b8 g", AlternatingSixStagesPaired, kBiasGelu, true, 8),
      WEFT_OWN_VARIANT("alt192 p", AlternatingWide, kNone, false, 1),
      WEFT_OWN_VARIANT("alt192 g", AlternatingWide, kBiasGelu, true, 1),
      WEFT_OWN_VARIANT("a192b16 p", AlternatingWide, kNone, false, 16),
      WEFT_OWN_VARIANT("a192b16 g", AlternatingWide, kBiasGelu, true, 16),
      WEFT_OWN_VARIANT("a192x2 p", AlternatingWidePaired, kNone, false, 1),
      WEFT_OWN_VARIANT("a192x2 g", AlternatingWidePaired, kBiasGelu, true, 1),
      WEFT_OWN_VARIANT("a192x2b8 p", AlternatingWidePaired, kNone, false, 8),
      WEFT_OWN_VARIANT("a192x2b8 g", AlternatingWidePaired, kBiasGelu, true, 8),
#undef WEFT_OWN_VARIANT
  };
  std::printf("\n%-28s", "shape (µs)");
  for (const Variant& variant : variants) std::printf(" %9s", variant.name);
  std::printf("\n");
  for (const Shape& shape : shapes) {
    if (std::string(shape.name).rfind(shape_prefix, 0) != 0) continue;
    const int m = shape.m, n = shape.n, k = shape.k;
    bf16 *a, *b, *bias, *lt_out, *lt_aux, *own_out, *own_aux;
    CUDA_CHECK(cudaMalloc(&a, size_t(m) * k * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&b, size_t(n) * k * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&bias, size_t(n) * sizeof(bf16)));
    for (bf16** p : {&lt_out, &lt_aux, &own_out, &own_aux}) CUDA_CHECK(cudaMalloc(p, size_t(m) * n * sizeof(bf16)));
    fill_kernel<<<1024, 256, 0, stream>>>(a, size_t(m) * k, 11, 1.f);
    fill_kernel<<<1024, 256, 0, stream>>>(b, size_t(n) * k, 12, 1.f / std::sqrt(float(k)));
    fill_kernel<<<1024, 256, 0, stream>>>(bias, n, 13, 0.5f);
    const size_t count = size_t(m) * n;

    const Lt plain = make_lt(handle, workspace, stream, a, b, nullptr, lt_out, nullptr, m, n, k);
    const Lt gelu =
        make_lt(handle, workspace, stream, a, b, bias, lt_out, lt_aux, m, n, k, CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
    auto run = [&](const Variant& variant, bf16* out, bf16* pre) {
      variant.run(plain, gelu, a, b, bias, out, pre, m, n, k);
    };
    // Outputs first: each of weft's variants against cuBLASLt's (plain against plain, GELU and its
    // pre-activation against GELU_AUX_BIAS's).
    CUDA_CHECK(cudaProfilerStart());
    plain.run();
    const std::vector<float> lt_plain_out = to_host(lt_out, count);
    gelu.run();
    const std::vector<float> lt_gelu_out = to_host(lt_out, count), lt_pre = to_host(lt_aux, count);
    double worst = 0;
    for (size_t v = 2; v < variants.size(); ++v) {
      CUDA_CHECK(cudaMemsetAsync(own_out, 0xFF, count * sizeof(bf16), stream));
      CUDA_CHECK(cudaMemsetAsync(own_aux, 0xFF, count * sizeof(bf16), stream));
      run(variants[v], own_out, own_aux);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      if (!variants[v].gelu) {
        worst = std::max(worst, relative_error(to_host(own_out, count), lt_plain_out));
      } else {
        worst = std::max(worst, relative_error(to_host(own_out, count), lt_gelu_out));
        worst = std::max(worst, relative_error(to_host(own_aux, count), lt_pre));
      }
    }
    CUDA_CHECK(cudaProfilerStop());
    const bool ok = worst < 1e-2;
    all_ok = all_ok && ok;

    std::vector<std::vector<float>> ms(variants.size());
    for (int round = 0; round < rounds; ++round)
      for (size_t v = 0; v < variants.size(); ++v)
        ms[v].push_back(time_ms([&] { run(variants[v], own_out, own_aux); }, stream));
    std::printf("%-28s", shape.name);
    for (std::vector<float>& times : ms) {
      std::sort(times.begin(), times.end());
      std::printf(" %9.1f", times[times.size() / 2] * 1e3f);
    }
    std::printf("   error %.1e %s\n", worst, ok ? "ok" : "WRONG");
    plain.destroy();
    gelu.destroy();
    for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(bias), static_cast<void*>(lt_out),
                    static_cast<void*>(lt_aux), static_cast<void*>(own_out), static_cast<void*>(own_aux)})
      CUDA_CHECK(cudaFree(p));
  }
  all_ok = time_backward_shapes(handle, workspace, stream, rounds, shape_prefix) && all_ok;
  all_ok = time_swiglu_shapes(handle, workspace, stream, rounds, shape_prefix) && all_ok;
  all_ok = time_swiglu_backward_shapes(handle, workspace, stream, rounds, shape_prefix) && all_ok;
  std::printf("\n%s\n", all_ok ? "every output checked: ok" : "SOME OUTPUTS WRONG");
  return all_ok ? 0 : 1;
}
