// CPU kernels: layer norm and RMS norm over the last dim, forward and backward.
//
// The backward formulas, per row with xhat = (x - mean) * rstd and g = grad_out * weight:
//   layer norm: grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMS norm:   grad_x = rstd * (g - xhat * mean(g * xhat)),  xhat = x * rstd
// grad_weight sums grad_out * xhat over rows; grad_bias sums grad_out. NormBackwardExtras (backend.h):
// an addend joins grad_x before its rounding, accumulated parameter gradients are added in double, and
// grad_x's column sums (a linear's bias gradient) are taken over its stored values after it is written.
//
// Threads (parallel_for.h): rows are split over the pool for the outputs and grad_x; grad_weight and
// grad_bias, sums over rows, are a second pass split by columns, each column summed over the rows in
// order by one thread, so the results do not depend on the thread count.
#include <cmath>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/kernel_support.h"
#include "runtime/cpu/parallel_for.h"

namespace weft {
namespace {

// out[c] = sums[c] rounded to T, or with `accumulate` out[c] + sums[c] (added in double, rounded once).
template <class T>
void store_parameter_gradient(const double* sums, int64_t columns, bool accumulate, T* out) {
  for (int64_t c = 0; c < columns; ++c) {
    out[c] = store_element<T>(accumulate ? static_cast<double>(load_element(out[c])) + sums[c] : sums[c]);
  }
}

// weight_sums[c] = sum over rows r of grad_out[r, c] * xhat[r, c] (and bias_sums[c] the sum of
// grad_out[r, c] when bias_sums is not null), rows in order, in double; xhat[r, c] = (x[r, c] -
// mean[r]) * rstd[r], with mean null for RMS norm.
template <class T, class S>
void column_sums(const T* x, const T* grad_out, const S* means, const S* rstds, int64_t rows, int64_t columns,
                 double* weight_sums, double* bias_sums) {
  using C = ComputeType<T>;
  cpu::parallel_for(columns, rows * 4, [&](int64_t first, int64_t last) {
    for (int64_t r = 0; r < rows; ++r) {
      const C row_mean = means != nullptr ? C(means[r]) : C(0), row_rstd = rstds[r];
      const T* x_row = x + r * columns;
      const T* grad_row = grad_out + r * columns;
      for (int64_t c = first; c < last; ++c) {
        const C xhat = (load_element(x_row[c]) - row_mean) * row_rstd;
        weight_sums[c] += static_cast<double>(load_element(grad_row[c]) * xhat);
      }
      if (bias_sums != nullptr) {
        for (int64_t c = first; c < last; ++c) bias_sums[c] += static_cast<double>(load_element(grad_row[c]));
      }
    }
  });
}

}  // namespace
void CpuBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,
                            const Tensor& mean, const Tensor& rstd) {
  const int64_t columns = x.size(-1);
  const int64_t rows = columns == 0 ? 0 : x.numel() / columns;
  cpu::dispatch_floating(x.dtype(), "layer_norm", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    const T* w = weight.data<T>();
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    T* data = out.data<T>();
    auto* mean_out = mean.data<StatisticType<T>>();
    auto* rstd_out = rstd.data<StatisticType<T>>();
    cpu::parallel_for(rows, columns * 8, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* row = in + r * columns;
        C total = 0;
        for (int64_t c = 0; c < columns; ++c) total += load_element(row[c]);
        const C row_mean = total / C(columns);
        C squares = 0;
        for (int64_t c = 0; c < columns; ++c) {
          const C centered = load_element(row[c]) - row_mean;
          squares += centered * centered;
        }
        const C row_rstd = C(1) / std::sqrt(squares / C(columns) + C(eps));
        for (int64_t c = 0; c < columns; ++c) {
          C value = (load_element(row[c]) - row_mean) * row_rstd * load_element(w[c]);
          if (b != nullptr) value += load_element(b[c]);
          data[r * columns + c] = store_element<T>(value);
        }
        mean_out[r] = row_mean;
        rstd_out[r] = row_rstd;
      }
    });
  });
}

void CpuBackend::layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& grad_out, const Tensor& grad_x, const Tensor& grad_weight,
                                     const Tensor& grad_bias, const NormBackwardExtras& extras) {
  const int64_t columns = x.size(-1);
  const int64_t rows = columns == 0 ? 0 : x.numel() / columns;
  cpu::dispatch_floating(x.dtype(), "layer_norm_backward", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    const T* w = weight.data<T>();
    const T* gy = grad_out.data<T>();
    const auto* row_means = mean.data<StatisticType<T>>();
    const auto* row_rstds = rstd.data<StatisticType<T>>();
    T* gx = grad_x.data<T>();
    const T* addend = extras.grad_x_addend.defined() ? extras.grad_x_addend.data<T>() : nullptr;
    std::vector<double> weight_sums(static_cast<size_t>(columns), 0.0), bias_sums(static_cast<size_t>(columns), 0.0);
    column_sums(in, gy, row_means, row_rstds, rows, columns, weight_sums.data(), bias_sums.data());
    cpu::parallel_for(rows, columns * 12, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t base = r * columns;
        const C row_mean = row_means[r], row_rstd = row_rstds[r];
        C mean_g = 0, mean_g_xhat = 0;
        for (int64_t c = 0; c < columns; ++c) {
          const C xhat = (load_element(in[base + c]) - row_mean) * row_rstd;
          const C g = load_element(gy[base + c]) * load_element(w[c]);
          mean_g += g;
          mean_g_xhat += g * xhat;
        }
        mean_g /= C(columns);
        mean_g_xhat /= C(columns);
        for (int64_t c = 0; c < columns; ++c) {
          const C xhat = (load_element(in[base + c]) - row_mean) * row_rstd;
          const C g = load_element(gy[base + c]) * load_element(w[c]);
          const C gradient = row_rstd * (g - mean_g - xhat * mean_g_xhat);
          gx[base + c] = store_element<T>(addend != nullptr ? gradient + load_element(addend[base + c]) : gradient);
        }
      }
    });
    // grad_x's stored values summed over the rows (Backend::sum_over_rows: in double, rows in order,
    // rounded once), exactly the linear's own column sums.
    if (extras.grad_x_column_sums.defined()) sum_over_rows(grad_x.view({-1, columns}), extras.grad_x_column_sums);
    store_parameter_gradient(weight_sums.data(), columns, extras.accumulate_parameter_gradients,
                             grad_weight.data<T>());
    if (grad_bias.defined()) {
      store_parameter_gradient(bias_sums.data(), columns, extras.accumulate_parameter_gradients, grad_bias.data<T>());
    }
  });
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out, const Tensor& rstd) {
  const int64_t columns = x.size(-1);
  const int64_t rows = columns == 0 ? 0 : x.numel() / columns;
  cpu::dispatch_floating(x.dtype(), "rms_norm", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    const T* w = weight.data<T>();
    T* data = out.data<T>();
    auto* rstd_out = rstd.data<StatisticType<T>>();
    cpu::parallel_for(rows, columns * 6, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* row = in + r * columns;
        C squares = 0;
        for (int64_t c = 0; c < columns; ++c) squares += load_element(row[c]) * load_element(row[c]);
        const C row_rstd = C(1) / std::sqrt(squares / C(columns) + C(eps));
        for (int64_t c = 0; c < columns; ++c) {
          data[r * columns + c] = store_element<T>(load_element(row[c]) * row_rstd * load_element(w[c]));
        }
        rstd_out[r] = row_rstd;
      }
    });
  });
}

void CpuBackend::rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& grad_out,
                                   const Tensor& grad_x, const Tensor& grad_weight, const NormBackwardExtras& extras) {
  const int64_t columns = x.size(-1);
  const int64_t rows = columns == 0 ? 0 : x.numel() / columns;
  cpu::dispatch_floating(x.dtype(), "rms_norm_backward", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    const T* w = weight.data<T>();
    const T* gy = grad_out.data<T>();
    const auto* row_rstds = rstd.data<StatisticType<T>>();
    T* gx = grad_x.data<T>();
    const T* addend = extras.grad_x_addend.defined() ? extras.grad_x_addend.data<T>() : nullptr;
    std::vector<double> weight_sums(static_cast<size_t>(columns), 0.0);
    column_sums(in, gy, static_cast<const StatisticType<T>*>(nullptr), row_rstds, rows, columns, weight_sums.data(),
                nullptr);
    cpu::parallel_for(rows, columns * 10, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t base = r * columns;
        const C row_rstd = row_rstds[r];
        C mean_g_xhat = 0;
        for (int64_t c = 0; c < columns; ++c) {
          const C xhat = load_element(in[base + c]) * row_rstd;
          mean_g_xhat += load_element(gy[base + c]) * load_element(w[c]) * xhat;
        }
        mean_g_xhat /= C(columns);
        for (int64_t c = 0; c < columns; ++c) {
          const C xhat = load_element(in[base + c]) * row_rstd;
          const C g = load_element(gy[base + c]) * load_element(w[c]);
          const C gradient = row_rstd * (g - xhat * mean_g_xhat);
          gx[base + c] = store_element<T>(addend != nullptr ? gradient + load_element(addend[base + c]) : gradient);
        }
      }
    });
    // grad_x's stored values summed over the rows (Backend::sum_over_rows: in double, rows in order,
    // rounded once), exactly the linear's own column sums.
    if (extras.grad_x_column_sums.defined()) sum_over_rows(grad_x.view({-1, columns}), extras.grad_x_column_sums);
    store_parameter_gradient(weight_sums.data(), columns, extras.accumulate_parameter_gradients,
                             grad_weight.data<T>());
  });
}

}  // namespace weft
