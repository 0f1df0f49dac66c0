// CPU kernels: causal scaled dot-product attention, forward and backward.
//
// The reference form: for each (batch, head) the T x T score matrix is materialised one row at a
// time. With P = softmax(S), S = scale q k^T (masked above the diagonal), O = P v:
//   dv = P^T dO,   dP = dO v^T,   dS = P * (dP - rowsum(dO * O)),   dq = scale dS k,   dk = scale dS^T q.
// The row statistics are recomputed in backward from the saved log-sum-exp (as flash attention does).
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/kernel_support.h"

namespace weft {
void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& out,
                           const Tensor& lse) {
  const int64_t heads_total = q.size(0) * q.size(1), steps = q.size(2), head_dim = q.size(3);
  cpu::dispatch_floating(q.dtype(), "attention", [&]<class T>() {
    using C = ComputeType<T>;
    const T* q_data = q.data<T>();
    const T* k_data = k.data<T>();
    const T* v_data = v.data<T>();
    T* o_data = out.data<T>();
    auto* lse_data = lse.data<StatisticType<T>>();
    std::vector<C> scores(static_cast<size_t>(steps));
    std::vector<C> accumulator(static_cast<size_t>(head_dim));
    for (int64_t h = 0; h < heads_total; ++h) {
      const int64_t base = h * steps * head_dim;
      for (int64_t t = 0; t < steps; ++t) {
        const T* query = q_data + base + t * head_dim;
        C maximum = -std::numeric_limits<C>::infinity();
        for (int64_t s = 0; s <= t; ++s) {
          const T* key = k_data + base + s * head_dim;
          C dot = 0;
          for (int64_t d = 0; d < head_dim; ++d) dot += load_element(query[d]) * load_element(key[d]);
          scores[s] = dot * C(scale);
          maximum = std::max(maximum, scores[s]);
        }
        C total = 0;
        for (int64_t s = 0; s <= t; ++s) {
          scores[s] = std::exp(scores[s] - maximum);
          total += scores[s];
        }
        std::fill(accumulator.begin(), accumulator.end(), C(0));
        for (int64_t s = 0; s <= t; ++s) {
          const T* value = v_data + base + s * head_dim;
          const C weight = scores[s] / total;
          for (int64_t d = 0; d < head_dim; ++d) accumulator[d] += weight * load_element(value[d]);
        }
        for (int64_t d = 0; d < head_dim; ++d) o_data[base + t * head_dim + d] = store_element<T>(accumulator[d]);
        lse_data[h * steps + t] = maximum + std::log(total);
      }
    }
  });
}

void CpuBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                    const Tensor& lse, const Tensor& grad_out, double scale, const Tensor& grad_q,
                                    const Tensor& grad_k, const Tensor& grad_v) {
  const int64_t heads_total = q.size(0) * q.size(1), steps = q.size(2), head_dim = q.size(3);
  cpu::dispatch_floating(q.dtype(), "attention_backward", [&]<class T>() {
    using C = ComputeType<T>;
    const T* q_data = q.data<T>();
    const T* k_data = k.data<T>();
    const T* v_data = v.data<T>();
    const T* o_data = out.data<T>();
    const T* go_data = grad_out.data<T>();
    const auto* lse_data = lse.data<StatisticType<T>>();
    // Accumulate in the compute type, then store once (bf16 outputs round once).
    const int64_t per_head = steps * head_dim;
    std::vector<C> dq(static_cast<size_t>(per_head)), dk(static_cast<size_t>(per_head)),
        dv(static_cast<size_t>(per_head));
    std::vector<C> probabilities(static_cast<size_t>(steps));
    for (int64_t h = 0; h < heads_total; ++h) {
      const int64_t base = h * per_head;
      std::fill(dq.begin(), dq.end(), C(0));
      std::fill(dk.begin(), dk.end(), C(0));
      std::fill(dv.begin(), dv.end(), C(0));
      for (int64_t t = 0; t < steps; ++t) {
        const T* query = q_data + base + t * head_dim;
        const T* grad_row = go_data + base + t * head_dim;
        const C row_lse = lse_data[h * steps + t];
        C delta = 0;  // rowsum(dO * O)
        for (int64_t d = 0; d < head_dim; ++d) {
          delta += load_element(grad_row[d]) * load_element(o_data[base + t * head_dim + d]);
        }
        for (int64_t s = 0; s <= t; ++s) {
          const T* key = k_data + base + s * head_dim;
          const T* value = v_data + base + s * head_dim;
          C dot = 0, grad_probability = 0;
          for (int64_t d = 0; d < head_dim; ++d) {
            dot += load_element(query[d]) * load_element(key[d]);
            grad_probability += load_element(grad_row[d]) * load_element(value[d]);
          }
          const C probability = std::exp(dot * C(scale) - row_lse);
          const C grad_score = probability * (grad_probability - delta) * C(scale);
          for (int64_t d = 0; d < head_dim; ++d) {
            dv[s * head_dim + d] += probability * load_element(grad_row[d]);
            dq[t * head_dim + d] += grad_score * load_element(key[d]);
            dk[s * head_dim + d] += grad_score * load_element(query[d]);
          }
        }
      }
      T* gq = grad_q.data<T>() + base;
      T* gk = grad_k.data<T>() + base;
      T* gv = grad_v.data<T>() + base;
      for (int64_t i = 0; i < per_head; ++i) {
        gq[i] = store_element<T>(dq[i]);
        gk[i] = store_element<T>(dk[i]);
        gv[i] = store_element<T>(dv[i]);
      }
    }
  });
}

}  // namespace weft
