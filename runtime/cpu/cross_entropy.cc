// CPU kernels: cross-entropy over rows of logits, forward (per-row loss and log-sum-exp) and
// backward (softmax minus one-hot, scaled by each row's incoming gradient). Rows are split over the
// thread pool (parallel_for.h); each row is one thread's, so results do not depend on the count.
#include <cmath>
#include <limits>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/kernel_support.h"
#include "runtime/cpu/parallel_for.h"

namespace weft {
void CpuBackend::cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                               const Tensor& losses, const Tensor& lse) {
  const int64_t rows = logits.size(0), vocabulary = logits.size(1);
  cpu::dispatch_index(targets.dtype(), "cross_entropy", [&]<class I>() {
    const I* target_data = targets.data<I>();
    for (int64_t n = 0; n < rows; ++n) {
      const int64_t target = static_cast<int64_t>(target_data[n]);
      WEFT_CHECK(target == ignore_index || (target >= 0 && target < vocabulary), "cross_entropy: target ", target,
                 " of row ", n, " is outside [0, ", vocabulary, ") and is not ignore_index (", ignore_index, ")");
    }
    cpu::dispatch_floating(logits.dtype(), "cross_entropy", [&]<class T>() {
      using C = ComputeType<T>;
      const T* data = logits.data<T>();
      auto* loss_data = losses.data<StatisticType<T>>();
      auto* lse_data = lse.data<StatisticType<T>>();
      cpu::parallel_for(rows, vocabulary * 20, [&](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n) {
          const T* row = data + n * vocabulary;
          C maximum = -std::numeric_limits<C>::infinity();
          for (int64_t c = 0; c < vocabulary; ++c) maximum = std::max(maximum, load_element(row[c]));
          // The normaliser in double: a sequential f32 sum over a 50k vocabulary drifts by ~1e-4.
          double total = 0;
          for (int64_t c = 0; c < vocabulary; ++c) total += static_cast<double>(std::exp(load_element(row[c]) - maximum));
          const C row_lse = maximum + static_cast<C>(std::log(total));
          lse_data[n] = row_lse;
          const int64_t target = static_cast<int64_t>(target_data[n]);
          loss_data[n] = target == ignore_index ? C(0) : row_lse - load_element(row[target]);
        }
      });
    });
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                        int64_t ignore_index, const Tensor& grad_losses, const Tensor& grad_logits) {
  const int64_t rows = logits.size(0), vocabulary = logits.size(1);
  cpu::dispatch_index(targets.dtype(), "cross_entropy_backward", [&]<class I>() {
    const I* target_data = targets.data<I>();
    cpu::dispatch_floating(logits.dtype(), "cross_entropy_backward", [&]<class T>() {
      using C = ComputeType<T>;
      const T* data = logits.data<T>();
      const auto* lse_data = lse.data<StatisticType<T>>();
      const auto* grad_loss_data = grad_losses.data<StatisticType<T>>();
      T* out = grad_logits.data<T>();
      cpu::parallel_for(rows, vocabulary * 20, [&](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n) {
          const int64_t target = static_cast<int64_t>(target_data[n]);
          T* row_out = out + n * vocabulary;
          if (target == ignore_index) {
            std::fill(row_out, row_out + vocabulary, store_element<T>(0.0));
            continue;
          }
          const C row_lse = lse_data[n], grad_loss = grad_loss_data[n];
          for (int64_t c = 0; c < vocabulary; ++c) {
            const C probability = std::exp(load_element(data[n * vocabulary + c]) - row_lse);
            row_out[c] = store_element<T>((probability - (c == target ? C(1) : C(0))) * grad_loss);
          }
        }
      });
    });
  });
}

}  // namespace weft
