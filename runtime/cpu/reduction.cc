// CPU kernels: sum, mean and max over a set of dims, and the squared norms of a list of tensors,
// accumulating in double for exactness.
//
// One strided walk over x visits every element; each element is mapped to its output slot by
// strides equal to out's contiguous strides with the reduced dims set to 0 (out is contiguous).
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/kernel_support.h"

namespace weft {

void CpuBackend::reduce(ReduceOp op, const Tensor& x, absl::Span<const int64_t> dims, const Tensor& out,
                        const Tensor& indices) {
  const int64_t out_numel = out.numel();
  const int64_t reduced_count = out_numel == 0 ? 0 : x.numel() / out_numel;
  Strides slot_strides = contiguous_strides(out.shape());
  for (int64_t d : dims) slot_strides[d] = 0;
  cpu::dispatch_floating(x.dtype(), "reduce", [&]<class T>() {
    const T* in = x.data<T>();
    T* data = out.data<T>();
    if (op == ReduceOp::kMax) {
      std::vector<double> best(static_cast<size_t>(out_numel), -std::numeric_limits<double>::infinity());
      std::vector<int64_t> best_index(static_cast<size_t>(out_numel), 0);
      std::vector<int64_t> seen(static_cast<size_t>(out_numel), 0);
      cpu::for_each_index<2>(x.shape(), {&x.strides(), &slot_strides}, [&](int64_t i, int64_t slot) {
        const double value = static_cast<double>(load_element(in[i]));
        // The row-major walk visits a slot's elements in increasing order along the reduced dim, so
        // the count seen so far is the position along it. The first maximum wins; NaN propagates.
        const int64_t position = seen[slot]++;
        if (value > best[slot] || (std::isnan(value) && !std::isnan(best[slot]))) {
          best[slot] = value;
          best_index[slot] = position;
        }
      });
      for (int64_t s = 0; s < out_numel; ++s) {
        data[s] = store_element<T>(best[s]);
        if (indices.defined()) indices.data<int64_t>()[s] = best_index[s];
      }
      return;
    }
    std::vector<double> totals(static_cast<size_t>(out_numel), 0.0);
    cpu::for_each_index<2>(x.shape(), {&x.strides(), &slot_strides}, [&](int64_t i, int64_t slot) {
      totals[slot] += static_cast<double>(load_element(in[i]));
    });
    const double divisor = op == ReduceOp::kMean && reduced_count > 0 ? static_cast<double>(reduced_count) : 1.0;
    for (int64_t s = 0; s < out_numel; ++s) data[s] = store_element<T>(totals[s] / divisor);
  });
}

void CpuBackend::squared_norms(absl::Span<const Tensor> tensors, const Tensor& out) {
  WEFT_CHECK(out.dim() == 1 && out.size(0) == static_cast<int64_t>(tensors.size()) && out.is_contiguous() &&
                 (out.dtype() == kFloat32 || out.dtype() == kFloat64),
             "squared_norms: out must be [", tensors.size(), "] f32 or f64, contiguous; got ", out.describe());
  std::vector<double> totals(tensors.size(), 0.0);
  for (size_t t = 0; t < tensors.size(); ++t) {
    const Tensor& x = tensors[t];
    cpu::dispatch_floating(x.dtype(), "squared_norms", [&]<class T>() {
      const T* in = x.data<T>();
      double total = 0.0;
      cpu::for_each_index<1>(x.shape(), {&x.strides()}, [&](int64_t i) {
        const double value = static_cast<double>(load_element(in[i]));
        total += value * value;
      });
      totals[t] = total;
    });
  }
  for (size_t t = 0; t < totals.size(); ++t) {
    if (out.dtype() == kFloat64) {
      out.data<double>()[t] = totals[t];
    } else {
      out.data<float>()[t] = static_cast<float>(totals[t]);
    }
  }
}

}  // namespace weft
