// CPU kernels: causal scaled dot-product attention, forward and backward.
//
// The reference form: for each (batch, head) the T x T score matrix is materialised one row at a
// time. With P = softmax(S), S = scale q k^T (masked above the diagonal), O = P v:
//   dv = P^T dO,   dP = dO v^T,   dS = P * (dP - rowsum(dO * O)),   dq = scale dS k,   dk = scale dS^T q.
// The row statistics are recomputed in backward from the saved log-sum-exp (as flash attention does).
// Tensors are addressed through their strides (unit stride in D), so views need no copies. Any head
// dim. Grouped-query attention: k, v have KV heads (H % KV == 0) and query head h reads kv head
// h / (H / KV); dk, dv of a kv head are the sums over the query heads of its group.
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/kernel_support.h"

namespace weft {
namespace {

// The rows of a [B, H, T, D] view whose last stride is 1 (backend.h: q, k, v and the outputs may be
// the heads of one [B, T, 3, H, D] projection): the base pointer and strides read once per call,
// not per row (the loops below ask for a row T * T times per head).
template <class T>
struct Rows {
  explicit Rows(const Tensor& tensor)
      : base(tensor.data<T>()), batch_stride(tensor.stride(0)), head_stride(tensor.stride(1)),
        step_stride(tensor.stride(2)) {}
  T* operator()(int64_t b, int64_t h, int64_t t) const {
    return base + b * batch_stride + h * head_stride + t * step_stride;
  }
  T* base;
  int64_t batch_stride, head_stride, step_stride;
};

void check_rows_unit_stride(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* tensor : tensors) {
    WEFT_CHECK(tensor->dim() == 4 && (tensor->size(3) <= 1 || tensor->stride(3) == 1), op,
               ": expected a [B, H, T, D] view with unit stride in D, got ", tensor->describe());
  }
}

// H / KV: how many query heads share one kv head (k, v [B, KV, T, D]; backend.h).
int64_t query_heads_per_kv_head(const char* op, const Tensor& q, const Tensor& k) {
  WEFT_CHECK(k.size(1) >= 1 && q.size(1) % k.size(1) == 0, op, ": the kv heads of k (", k.describe(),
             ") must divide the query heads of q (", q.describe(), ")");
  return q.size(1) / k.size(1);
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& out,
                           const Tensor& lse) {
  check_rows_unit_stride("attention", {&q, &k, &v, &out});
  const int64_t batch = q.size(0), heads = q.size(1), steps = q.size(2), head_dim = q.size(3);
  const int64_t group = query_heads_per_kv_head("attention", q, k);
  cpu::dispatch_floating(q.dtype(), "attention", [&]<class T>() {
    using C = ComputeType<T>;
    const Rows<T> q_rows(q), k_rows(k), v_rows(v), out_rows(out);
    auto* lse_data = lse.data<StatisticType<T>>();
    std::vector<C> scores(static_cast<size_t>(steps));
    std::vector<C> accumulator(static_cast<size_t>(head_dim));
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t t = 0; t < steps; ++t) {
          const T* query = q_rows(b, h, t);
          C maximum = -std::numeric_limits<C>::infinity();
          for (int64_t s = 0; s <= t; ++s) {
            const T* key = k_rows(b, h / group, s);
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
            const T* value = v_rows(b, h / group, s);
            const C weight = scores[s] / total;
            for (int64_t d = 0; d < head_dim; ++d) accumulator[d] += weight * load_element(value[d]);
          }
          T* output = out_rows(b, h, t);
          for (int64_t d = 0; d < head_dim; ++d) output[d] = store_element<T>(accumulator[d]);
          lse_data[(b * heads + h) * steps + t] = maximum + std::log(total);
        }
      }
    }
  });
}

void CpuBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                    const Tensor& lse, const Tensor& grad_out, double scale, const Tensor& grad_q,
                                    const Tensor& grad_k, const Tensor& grad_v) {
  check_rows_unit_stride("attention_backward", {&q, &k, &v, &out, &grad_out, &grad_q, &grad_k, &grad_v});
  const int64_t batch = q.size(0), heads = q.size(1), steps = q.size(2), head_dim = q.size(3);
  const int64_t group = query_heads_per_kv_head("attention_backward", q, k);
  cpu::dispatch_floating(q.dtype(), "attention_backward", [&]<class T>() {
    using C = ComputeType<T>;
    const Rows<T> q_rows(q), k_rows(k), v_rows(v), out_rows(out), grad_out_rows(grad_out), grad_q_rows(grad_q),
        grad_k_rows(grad_k), grad_v_rows(grad_v);
    const auto* lse_data = lse.data<StatisticType<T>>();
    // Accumulate in the compute type, then store once (bf16 outputs round once); dk, dv over the
    // whole group of query heads that share a kv head.
    const int64_t per_head = steps * head_dim;
    std::vector<C> dq(static_cast<size_t>(per_head)), dk(static_cast<size_t>(per_head)),
        dv(static_cast<size_t>(per_head));
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t kv_head = h / group;
        std::fill(dq.begin(), dq.end(), C(0));
        if (h % group == 0) {
          std::fill(dk.begin(), dk.end(), C(0));
          std::fill(dv.begin(), dv.end(), C(0));
        }
        for (int64_t t = 0; t < steps; ++t) {
          const T* query = q_rows(b, h, t);
          const T* grad_row = grad_out_rows(b, h, t);
          const T* output = out_rows(b, h, t);
          const C row_lse = lse_data[(b * heads + h) * steps + t];
          C delta = 0;  // rowsum(dO * O)
          for (int64_t d = 0; d < head_dim; ++d) delta += load_element(grad_row[d]) * load_element(output[d]);
          for (int64_t s = 0; s <= t; ++s) {
            const T* key = k_rows(b, kv_head, s);
            const T* value = v_rows(b, kv_head, s);
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
        for (int64_t t = 0; t < steps; ++t) {
          T* gq = grad_q_rows(b, h, t);
          for (int64_t d = 0; d < head_dim; ++d) gq[d] = store_element<T>(dq[t * head_dim + d]);
        }
        if (h % group != group - 1) continue;  // the group's last query head stores its kv head
        for (int64_t t = 0; t < steps; ++t) {
          T* gk = grad_k_rows(b, kv_head, t);
          T* gv = grad_v_rows(b, kv_head, t);
          for (int64_t d = 0; d < head_dim; ++d) {
            gk[d] = store_element<T>(dk[t * head_dim + d]);
            gv[d] = store_element<T>(dv[t * head_dim + d]);
          }
        }
      }
    }
  });
}

}  // namespace weft
