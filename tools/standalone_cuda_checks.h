// CUDA_CHECK and CUBLAS_CHECK for the tools that stand apart from libweft (probes and benchmarks
// that call CUDA and cuBLASLt directly, such as gemm_energy_probe and cuda_hopper_gemm_benchmark):
// a failed call prints the call, its file and line and the library's message, then exits 1.
// Code inside weft uses runtime/cuda/cuda_check.h instead, which throws.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CUDA_CHECK(call) standalone_checks::check_cuda((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) standalone_checks::check_cublas((call), #call, __FILE__, __LINE__)

namespace standalone_checks {

inline void check_cuda(cudaError_t error, const char* call, const char* file, int line) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, call, cudaGetErrorString(error));
  std::exit(1);
}

inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", file, line, call, cublasLtGetStatusName(status),
               cublasLtGetStatusString(status));
  std::exit(1);
}

}  // namespace standalone_checks
