// Error strings for the check macros of cuda_check.h.
#include "runtime/cuda/cuda_check.h"

namespace weft::cuda {

const char* cublas_status_string(cublasStatus_t status) {
  // cuBLAS names its own codes ("CUBLAS_STATUS_NOT_SUPPORTED"); the hint says what usually causes it.
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED (no cuBLAS handle: is a CUDA device present and selected?)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED (cuBLAS could not allocate memory)";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE (an unsupported shape, stride, leading dimension or pointer)";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH (the device lacks a feature this call needs)";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED (no algorithm for this combination of types, layouts and epilogue)";
    default: return cublasGetStatusString(status);
  }
}

}  // namespace weft::cuda
