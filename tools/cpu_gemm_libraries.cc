// The CPU GEMM libraries weft could use, timed at its models' shapes (issue #17): OpenBLAS, BLIS
// and oneDNN, each loaded at run time (dlopen) so that this program needs none of them to build and
// measures whichever are installed (libopenblas0, libblis4, libdnnl2). f32, row-major, the shapes
// of one layer's GEMMs forward and backward in the three GPT shapes of tools/cpu_benchmark.sh
// (rows = batch 16 x sequence): the qkv projection x w^T, the MLP's up projection, its input
// gradient dY w, and its weight gradient dY^T x. Each shape repeats for at least 0.3 s; the row
// prints GFLOP/s. The thread count is the library's own setting (OMP_NUM_THREADS for oneDNN and
// OpenMP BLIS, OPENBLAS_NUM_THREADS, BLIS_NUM_THREADS); tools/cpu_gemm_libraries.sh runs every
// library at 1 and 2 threads and prints one table.
//   usage: cpu_gemm_libraries LIBRARY_FILE     (a cblas library, or a libdnnl file: dnnl_sgemm)
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {

// cblas_sgemm's and dnnl_sgemm's signatures, declared here: the program includes neither header.
using CblasSgemm = void (*)(int layout, int transpose_a, int transpose_b, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);
using DnnlSgemm = int (*)(char transpose_a, char transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;

struct Shape {
  const char* name;
  int64_t m, n, k;
  bool transpose_a, transpose_b;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s LIBRARY_FILE (libopenblas.so.0, libblis.so.4, libdnnl.so.2, ...)\n", argv[0]);
    return 2;
  }
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr, "cpu_gemm_libraries: cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  auto cblas = reinterpret_cast<CblasSgemm>(dlsym(library, "cblas_sgemm"));
  auto dnnl = reinterpret_cast<DnnlSgemm>(dlsym(library, "dnnl_sgemm"));
  if (cblas == nullptr && dnnl == nullptr) {
    std::fprintf(stderr, "cpu_gemm_libraries: %s has neither cblas_sgemm nor dnnl_sgemm\n", argv[1]);
    return 1;
  }
  // rows = 16 x sequence; the tiny model is 64 wide (MLP 256), medium 256 (1024), laptop 384 (1536).
  const std::vector<Shape> shapes = {
      {"tiny qkv", 1024, 192, 64, false, true},       {"tiny mlp up", 1024, 256, 64, false, true},
      {"tiny mlp dX", 1024, 64, 256, false, false},   {"tiny mlp dW", 256, 64, 1024, true, false},
      {"medium qkv", 2048, 768, 256, false, true},    {"medium mlp up", 2048, 1024, 256, false, true},
      {"medium mlp dX", 2048, 256, 1024, false, false}, {"medium mlp dW", 1024, 256, 2048, true, false},
      {"laptop qkv", 4096, 1152, 384, false, true},   {"laptop mlp up", 4096, 1536, 384, false, true},
      {"laptop mlp dX", 4096, 384, 1536, false, false}, {"laptop mlp dW", 1536, 384, 4096, true, false},
  };
  for (const Shape& shape : shapes) {
    std::vector<float> a(static_cast<size_t>(shape.m * shape.k), 0.5f), b(static_cast<size_t>(shape.k * shape.n), 0.25f),
        c(static_cast<size_t>(shape.m * shape.n));
    const int64_t lda = shape.transpose_a ? shape.m : shape.k, ldb = shape.transpose_b ? shape.k : shape.n;
    auto multiply = [&] {
      if (dnnl != nullptr) {
        dnnl(shape.transpose_a ? 'T' : 'N', shape.transpose_b ? 'T' : 'N', shape.m, shape.n, shape.k, 1.0f, a.data(),
             lda, b.data(), ldb, 0.0f, c.data(), shape.n);
      } else {
        cblas(kCblasRowMajor, shape.transpose_a ? kCblasTrans : kCblasNoTrans,
              shape.transpose_b ? kCblasTrans : kCblasNoTrans, static_cast<int>(shape.m), static_cast<int>(shape.n),
              static_cast<int>(shape.k), 1.0f, a.data(), static_cast<int>(lda), b.data(), static_cast<int>(ldb), 0.0f,
              c.data(), static_cast<int>(shape.n));
      }
    };
    for (int warm_up = 0; warm_up < 3; ++warm_up) multiply();
    int repetitions = 0;
    double elapsed = 0.0;
    const auto start = std::chrono::steady_clock::now();
    do {
      multiply();
      ++repetitions;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (elapsed < 0.3);
    std::printf("%s\t%.1f\n", shape.name, 2.0 * shape.m * shape.n * shape.k * repetitions / elapsed / 1e9);
  }
  return 0;
}
