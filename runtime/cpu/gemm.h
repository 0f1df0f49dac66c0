// One row-major GEMM call for the CPU kernels: C = alpha op(A) op(B) + beta C with op = transpose or
// not, on raw pointers and leading dimensions. f32 goes to oneDNN's sgemm when weft was built with it
// (WEFT_HAVE_ONEDNN), else to OpenBLAS's; f64 goes to OpenBLAS's dgemm. OpenBLAS runs on the calling
// thread (its own pool's spinning threads would contend with the OpenMP pool's: gemm.cc).
//
// Called from inside a parallel_for chunk (parallel_for.h), the GEMM runs on that one thread
// (oneDNN sees it is inside an OpenMP region); called outside, it uses the whole pool.
// Failures (oneDNN refusing a shape) raise with the shape in the message. Asynchronous signals wait
// while oneDNN's kernels run (deferred_signals.h). oneDNN may order a dot product's terms by the
// matrix's size and its thread count, so results are deterministic for a given shape and pool
// size, not across them.
#pragma once

#include <cstdint>

namespace weft::cpu {

// "oneDNN" or "OpenBLAS": the library behind the f32 calls, for the log.
const char* f32_gemm_library();

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

}  // namespace weft::cpu
