// One-line checks for CUDA, cuBLAS(Lt), cuDNN and NCCL calls.
//
// Each macro evaluates the call once and, on failure, throws weft::Error with the file, the line,
// the call's text and the library's own error string, so a failure names where and why.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "runtime/error.h"

namespace weft::cuda {

const char* cublas_status_string(cublasStatus_t status);

}  // namespace weft::cuda

#define WEFT_CUDA_CHECK(call)                                                                          \
  do {                                                                                                 \
    const cudaError_t weft_cuda_status = (call);                                                       \
    if (weft_cuda_status != cudaSuccess) [[unlikely]] {                                                \
      WEFT_FAIL(__FILE__, ":", __LINE__, ": ", #call, " failed: ", cudaGetErrorString(weft_cuda_status)); \
    }                                                                                                  \
  } while (0)

#define WEFT_CUBLAS_CHECK(call)                                                                        \
  do {                                                                                                 \
    const cublasStatus_t weft_cublas_status = (call);                                                  \
    if (weft_cublas_status != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                                    \
      WEFT_FAIL(__FILE__, ":", __LINE__, ": ", #call, " failed: ",                                     \
                ::weft::cuda::cublas_status_string(weft_cublas_status));                               \
    }                                                                                                  \
  } while (0)

// Checks the last kernel launch (launch errors surface at once; faults at the next sync).
#define WEFT_CUDA_CHECK_LAUNCH() WEFT_CUDA_CHECK(cudaGetLastError())
