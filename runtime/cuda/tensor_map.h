// TMA tensor maps (CUtensorMap) of row-major bf16 matrices, for kernels that load and store through
// the Tensor Memory Accelerator (runtime/cuda/hopper_gemm.cuh). Header-only, so that standalone tools
// (tools/cuda_hopper_gemm_benchmark) share it with the library.
//
// The driver's cuTensorMapEncodeTiled is reached through the runtime's entry-point query, so nothing
// links libcuda directly. Invariants of a map made here: 2-D, the row stride (columns · 2 bytes) a
// multiple of 16, the base 16-byte aligned; boxes of [box_rows, 64] elements (64 bf16 are the 128
// bytes of the swizzle), 128-byte swizzled, or of [box_rows, box_columns] unswizzled where asked;
// zeros loaded past the matrix's edges.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace weft::cuda {

using TensorMapEncoder = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                      const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                      CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled, or null where the driver lacks it (looked up once).
inline TensorMapEncoder tensor_map_encoder() {
  static const TensorMapEncoder encoder = [] {
    void* pointer = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &pointer, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return TensorMapEncoder{nullptr};
    }
    return reinterpret_cast<TensorMapEncoder>(pointer);
  }();
  return encoder;
}

// A map of data [rows, columns] bf16 (row-major, rows of `columns` elements) in boxes of
// [box_rows, box_columns]: 128-byte swizzled when box_columns is 64, unswizzled otherwise (then
// box_columns · 2 must be a multiple of 16 and box_columns at most 256). False where it cannot be
// made (no encoder, or the driver refuses the shape).
inline bool make_bf16_tensor_map(CUtensorMap& map, const void* data, int64_t rows, int64_t columns, int box_rows,
                                 int box_columns = 64) {
  const TensorMapEncoder encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(columns), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(columns) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_columns), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                box_columns == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace weft::cuda
