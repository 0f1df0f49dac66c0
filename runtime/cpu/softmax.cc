// CPU kernels: softmax and log-softmax over the last dim of a contiguous [N, C] tensor. Rows are
// split over the thread pool (parallel_for.h), each row one thread's.
#include <cmath>
#include <limits>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/kernel_support.h"
#include "runtime/cpu/parallel_for.h"

namespace weft {

void CpuBackend::softmax(const Tensor& x, const Tensor& out, bool log) {
  const int64_t columns = x.dim() == 0 ? 1 : x.size(-1);
  const int64_t rows = columns == 0 ? 0 : x.numel() / columns;
  cpu::dispatch_floating(x.dtype(), "softmax", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    T* data = out.data<T>();
    cpu::parallel_for(rows, columns * 20, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* row = in + r * columns;
        T* row_out = data + r * columns;
        C maximum = -std::numeric_limits<C>::infinity();
        for (int64_t c = 0; c < columns; ++c) maximum = std::max(maximum, load_element(row[c]));
        // The normaliser in double: a sequential f32 sum over a 50k-wide row drifts by ~1e-4.
        double wide_total = 0;
        for (int64_t c = 0; c < columns; ++c) wide_total += static_cast<double>(std::exp(load_element(row[c]) - maximum));
        const C total = static_cast<C>(wide_total);
        const C log_total = static_cast<C>(std::log(wide_total));
        for (int64_t c = 0; c < columns; ++c) {
          const C shifted = load_element(row[c]) - maximum;
          row_out[c] = store_element<T>(log ? shifted - log_total : std::exp(shifted) / total);
        }
      }
    });
  });
}

void CpuBackend::softmax_backward(const Tensor& y, const Tensor& grad_y, const Tensor& grad_x, bool log) {
  const int64_t columns = y.dim() == 0 ? 1 : y.size(-1);
  const int64_t rows = columns == 0 ? 0 : y.numel() / columns;
  cpu::dispatch_floating(y.dtype(), "softmax_backward", [&]<class T>() {
    using C = ComputeType<T>;
    const T* out = y.data<T>();
    const T* gy = grad_y.data<T>();
    T* gx = grad_x.data<T>();
    cpu::parallel_for(rows, columns * 20, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t base = r * columns;
        C reduction = 0;
        for (int64_t c = 0; c < columns; ++c) {
          reduction += log ? load_element(gy[base + c]) : load_element(gy[base + c]) * load_element(out[base + c]);
        }
        for (int64_t c = 0; c < columns; ++c) {
          const C value = load_element(out[base + c]);
          const C g = load_element(gy[base + c]);
          gx[base + c] = store_element<T>(log ? g - std::exp(value) * reduction : value * (g - reduction));
        }
      }
    });
  });
}

}  // namespace weft
