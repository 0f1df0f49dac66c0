// cpu::gemm (gemm.h): the BLAS calls behind the CPU backend's matmul and attention.
#include "runtime/cpu/gemm.h"

#include <cblas.h>

#include <optional>
#if WEFT_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#include "runtime/cpu/deferred_signals.h"
#include "runtime/cpu/parallel_for.h"
#include "runtime/error.h"

namespace weft::cpu {

const char* f32_gemm_library() {
#if WEFT_HAVE_ONEDNN
  return "oneDNN";
#else
  return "OpenBLAS";
#endif
}

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#if WEFT_HAVE_ONEDNN
  // Outside a parallel region: oneDNN sizes its own region by the calling thread's OpenMP setting,
  // so make it the pool's, and hold back signals while its kernels run (deferred_signals.h). Inside
  // one, parallel_for already holds them on every thread of the region.
  std::optional<DeferredSignals> deferred;
  if (omp_in_parallel() == 0) {
    if (omp_get_max_threads() != thread_count()) omp_set_num_threads(thread_count());
    deferred.emplace();
  }
  const dnnl_status_t status = dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', m, n, k, alpha, a, lda,
                                          b, ldb, beta, c, ldc);
  WEFT_CHECK(status == dnnl_success, "matmul: oneDNN's sgemm failed (status ", static_cast<int>(status), ") on [", m,
             ", ", k, "] x [", k, ", ", n, "] with leading dimensions ", lda, ", ", ldb, ", ", ldc);
#else
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace weft::cpu
