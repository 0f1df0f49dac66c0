// CPU kernel: batched matmul through cpu::gemm (gemm.h: oneDNN or OpenBLAS): one call per batch
// entry, or one for the whole batch when it shares one weight and its rows follow one another.
//
// Operands are passed to BLAS as they lie in memory: a row-major view is "no transpose", a
// column-major view (a transposed tensor) is "transpose", so x @ w.T never copies w. Other
// layouts (rare: a view with both strides non-unit) are copied to contiguous first. bf16/f16
// operands are widened to f32 scratch buffers, multiplied, and rounded back.
#include <algorithm>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/f32_scratch.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/kernel_support.h"

namespace weft {
namespace {

struct MatrixLayout {
  bool usable = false;
  bool transpose = false;
  int64_t leading = 0;  // leading dimension for row-major BLAS
};

// How a [rows, cols] matrix with strides (row_stride, col_stride) can be handed to row-major BLAS.
MatrixLayout matrix_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  if (cols == 1 || col_stride == 1) {
    const int64_t leading = rows == 1 ? cols : row_stride;
    if (leading >= std::max<int64_t>(cols, 1)) return {true, false, leading};
  }
  if (rows == 1 || row_stride == 1) {
    const int64_t leading = cols == 1 ? rows : col_stride;
    if (leading >= std::max<int64_t>(rows, 1)) return {true, true, leading};
  }
  return {};
}

template <class Scalar>
void gemm_batched(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta) {
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  Tensor left = a, right = b;
  MatrixLayout left_layout = matrix_layout(m, k, left.stride(1), left.stride(2));
  if (!left_layout.usable) {
    left = a.contiguous();
    left_layout = matrix_layout(m, k, left.stride(1), left.stride(2));
  }
  MatrixLayout right_layout = matrix_layout(k, n, right.stride(1), right.stride(2));
  if (!right_layout.usable) {
    right = b.contiguous();
    right_layout = matrix_layout(k, n, right.stride(1), right.stride(2));
  }
  const Scalar* left_data = left.data<Scalar>();
  const Scalar* right_data = right.data<Scalar>();
  Scalar* out_data = out.data<Scalar>();
  // One weight for the whole batch (x @ w.T with x [B, T, K]) and batch entries that follow one
  // another row after row: one GEMM of batch * m rows. Fewer, larger calls; and the product of a
  // row no longer depends on how the rows were grouped into a batch (oneDNN picks its kernel, and
  // with it the order of a dot product's terms, by the matrix's size), so x [B, T, K] and its
  // [B T, K] view multiply to the same bits.
  if (batch > 1 && right.stride(0) == 0 && !left_layout.transpose && left.stride(0) == m * left_layout.leading) {
    cpu::gemm(false, right_layout.transpose, batch * m, n, k, static_cast<Scalar>(alpha), left_data,
              left_layout.leading, right_data, right_layout.leading, static_cast<Scalar>(beta), out_data,
              std::max<int64_t>(n, 1));
    return;
  }
  for (int64_t i = 0; i < batch; ++i) {
    const Scalar* a_i = left_data + i * left.stride(0);
    const Scalar* b_i = right_data + i * right.stride(0);
    Scalar* c_i = out_data + i * m * n;
    cpu::gemm(left_layout.transpose, right_layout.transpose, m, n, k, static_cast<Scalar>(alpha), a_i,
              left_layout.leading, b_i, right_layout.leading, static_cast<Scalar>(beta), c_i, std::max<int64_t>(n, 1));
  }
}

}  // namespace

void CpuBackend::matmul(const Tensor& a, const Tensor& bm, const Tensor& out, double alpha, double beta) {
  if (out.numel() == 0) return;
  if (a.size(2) == 0) {
    // An empty inner dimension: the product is zero, and BLAS may not accept k = 0 everywhere.
    if (beta == 0.0) {
      fill(out, 0.0);
    } else {
      affine(out, beta, 0.0, out);
    }
    return;
  }
  switch (out.dtype()) {
    case kFloat32: gemm_batched<float>(a, bm, out, alpha, beta); return;
    case kFloat64: gemm_batched<double>(a, bm, out, alpha, beta); return;
    case kBFloat16:
    case kFloat16: {
      const Tensor wide_out = beta == 0.0 ? cpu::f32_output_for(out) : cpu::widened_to_f32(out);
      gemm_batched<float>(cpu::widened_to_f32(a), cpu::widened_to_f32(bm), wide_out, alpha, beta);
      cpu::store_from_f32(wide_out, out);
      return;
    }
    default: WEFT_FAIL("matmul: dtype ", dtype_name(out.dtype()), " is not supported");
  }
}

}  // namespace weft
