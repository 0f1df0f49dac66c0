// cpu::gemm (gemm.h): the BLAS calls behind the CPU backend's matmul and attention.
#include "runtime/cpu/gemm.h"

#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <optional>
#if WEFT_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#include "runtime/cpu/deferred_signals.h"
#include "runtime/cpu/parallel_for.h"
#include "runtime/error.h"

namespace weft::cpu {
namespace {

// OpenBLAS keeps a thread pool of its own, whose idle threads spin for a while after each call, as
// the OpenMP pool's do between regions: two pools on the same cores then spend their turns spinning
// on each other's, and the tiny CPU model's step took 15-86 ms in the OpenBLAS build against 13-14
// ms with either pool alone (docs/performance.md). So OpenBLAS runs on the calling thread, and the
// OpenMP pool is the process's only one. (Splitting a call's rows over the pool instead changed the
// results' last bits with the pool's size: OpenBLAS tiles a smaller call differently.)
// OPENBLAS_NUM_THREADS, when set, wins. A shared BLAS is looked up at run time (Debian's
// alternatives may link another, without the call); a static OpenBLAS hides its symbols from
// dlsym, so it is called directly.
void keep_openblas_on_the_calling_thread() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return;
#if WEFT_STATIC_OPENBLAS
    openblas_set_num_threads(1);
#else
    using SetThreads = void (*)(int);
    auto set_threads = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    if (set_threads != nullptr) set_threads(1);
#endif
  });
}

}  // namespace

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
  keep_openblas_on_the_calling_thread();
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  keep_openblas_on_the_calling_thread();
  cblas_dgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace weft::cpu
