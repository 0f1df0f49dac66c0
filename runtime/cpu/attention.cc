// CPU kernels: causal scaled dot-product attention, forward and backward, on GEMMs.
//
// With P = softmax(S), S = scale q k^T (masked above the diagonal), O = P v:
//   dv = P^T dO,   dP = dO v^T,   dS = P * (dP - rowsum(dO * O)),   dq = scale dS k,   dk = scale dS^T q.
// Each (batch, head) is taken in blocks of kQueryBlock query rows: the block's scores against the
// keys it may see are one GEMM into a [block, keys] tile (the only score buffer: no T x T matrix is
// kept), the softmax runs over the tile's rows, and the products with v, dO, k and q are GEMMs on
// the tile (cpu::gemm). The row statistics are recomputed in backward from the saved log-sum-exp
// (as flash attention does). Tensors are addressed through their strides (unit stride in D), so
// views (the heads of one [B, T, 3, H, D] projection) need no copies; bf16/f16 are widened to f32,
// computed, and rounded once on the way out. Any head dim.
//
// Threads: (batch, head) pairs in forward, (batch, kv head) pairs in backward are split over the
// pool (parallel_for.h); each pair is one thread's from start to end (its GEMMs included), and a kv
// head's dk, dv sum its query heads in order on that thread, so a split call's results do not depend
// on the thread count. A call too small to split stays on the calling thread, whose GEMMs may then
// use the pool (and oneDNN may split a GEMM's sums by its thread count).
// Grouped-query attention: k, v have KV heads (H % KV == 0) and query head h reads kv head
// h / (H / KV); dk, dv of a kv head are the sums over the query heads of its group.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/f32_scratch.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/kernel_support.h"
#include "runtime/cpu/parallel_for.h"
#include "runtime/cpu/vectorized.h"

namespace weft {
namespace {

// Query rows per score tile: a [64, T] tile of f32 is 64 KB at T = 256, within L2.
constexpr int64_t kQueryBlock = 64;

// The rows of a [B, H, T, D] view whose last stride is 1: the base pointer and strides read once
// per call. step_stride is the leading dimension of a head's [T, D] matrix for cpu::gemm.
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

void check_floating(const char* op, const Tensor& q) {
  const DType dtype = q.dtype();
  WEFT_CHECK(dtype == kFloat32 || dtype == kFloat64 || dtype == kBFloat16 || dtype == kFloat16, op, ": dtype ",
             dtype_name(dtype), " is not supported (expected f32, bf16, f16 or f64)");
}

// row[s] = exp(row[s] - shift) for s < count, in a loop built for the CPU's vector width.
template <class C>
WEFT_CPU_VECTORIZED void exponentiate_shifted(C* row, int64_t count, C shift) {
  for (int64_t s = 0; s < count; ++s) row[s] = cpu::kernel_exp(row[s] - shift);
}

// The causal mask and softmax of a score tile's row `row` (query step t sees keys 0..t): the row's
// probabilities replace its scores, masked entries become 0; returns the row's log-sum-exp.
template <class C>
C softmax_causal_row(C* row, int64_t visible, int64_t keys) {
  C maximum = -std::numeric_limits<C>::infinity();
  for (int64_t s = 0; s < visible; ++s) maximum = std::max(maximum, row[s]);
  exponentiate_shifted(row, visible, maximum);
  C total = 0;
  for (int64_t s = 0; s < visible; ++s) total += row[s];
  const C inverse = C(1) / total;
  for (int64_t s = 0; s < visible; ++s) row[s] *= inverse;
  std::fill(row + visible, row + keys, C(0));
  return maximum + std::log(total);
}

template <class C>
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, C scale, const Tensor& out, C* lse) {
  const int64_t batch = q.size(0), heads = q.size(1), steps = q.size(2), head_dim = q.size(3);
  const int64_t group = q.size(1) / k.size(1);
  const Rows<const C> q_rows(q), k_rows(k), v_rows(v);
  const Rows<C> out_rows(out);
  cpu::parallel_for(batch * heads, steps * steps * head_dim, [&](int64_t begin, int64_t end) {
    std::vector<C> tile(static_cast<size_t>(std::min(kQueryBlock, steps) * steps));  // [rows, keys]
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t b = pair / heads, h = pair % heads, kv_head = h / group;
      for (int64_t first = 0; first < steps; first += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, steps - first), keys = first + rows;
        cpu::gemm(false, true, rows, keys, head_dim, scale, q_rows(b, h, first), q_rows.step_stride,
                  k_rows(b, kv_head, 0), k_rows.step_stride, C(0), tile.data(), keys);
        for (int64_t r = 0; r < rows; ++r) {
          lse[(b * heads + h) * steps + first + r] = softmax_causal_row(tile.data() + r * keys, first + r + 1, keys);
        }
        cpu::gemm(false, false, rows, head_dim, keys, C(1), tile.data(), keys, v_rows(b, kv_head, 0),
                  v_rows.step_stride, C(0), out_rows(b, h, first), out_rows.step_stride);
      }
    }
  });
}

template <class C>
void attention_backward_pairs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const C* lse,
                              const Tensor& grad_out, C scale, const Tensor& grad_q, const Tensor& grad_k,
                              const Tensor& grad_v) {
  const int64_t batch = q.size(0), heads = q.size(1), steps = q.size(2), head_dim = q.size(3);
  const int64_t kv_heads = k.size(1), group = heads / kv_heads;
  const Rows<const C> q_rows(q), k_rows(k), v_rows(v), out_rows(out), grad_out_rows(grad_out);
  const Rows<C> grad_q_rows(grad_q), grad_k_rows(grad_k), grad_v_rows(grad_v);
  cpu::parallel_for(batch * kv_heads, group * steps * steps * head_dim * 2, [&](int64_t begin, int64_t end) {
    const int64_t block = std::min(kQueryBlock, steps);
    std::vector<C> probabilities(static_cast<size_t>(block * steps)), grad_scores(probabilities.size());
    std::vector<C> dk(static_cast<size_t>(steps * head_dim)), dv(dk.size());  // [T, D], rows of one kv head
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t b = pair / kv_heads, kv_head = pair % kv_heads;
      std::fill(dk.begin(), dk.end(), C(0));
      std::fill(dv.begin(), dv.end(), C(0));
      const C* key = k_rows(b, kv_head, 0);
      const C* value = v_rows(b, kv_head, 0);
      for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
        for (int64_t first = 0; first < steps; first += kQueryBlock) {
          const int64_t rows = std::min(kQueryBlock, steps - first), keys = first + rows;
          const C* query = q_rows(b, h, first);
          const C* grad_rows = grad_out_rows(b, h, first);
          // P = exp(scale q k^T - lse), zero above the diagonal.
          cpu::gemm(false, true, rows, keys, head_dim, scale, query, q_rows.step_stride, key, k_rows.step_stride, C(0),
                    probabilities.data(), keys);
          for (int64_t r = 0; r < rows; ++r) {
            C* row = probabilities.data() + r * keys;
            const C row_lse = lse[(b * heads + h) * steps + first + r];
            const int64_t visible = first + r + 1;
            exponentiate_shifted(row, visible, row_lse);
            std::fill(row + visible, row + keys, C(0));
          }
          // dv[0:keys] += P^T dO;  dP = dO v^T.
          cpu::gemm(true, false, keys, head_dim, rows, C(1), probabilities.data(), keys, grad_rows,
                    grad_out_rows.step_stride, C(1), dv.data(), head_dim);
          cpu::gemm(false, true, rows, keys, head_dim, C(1), grad_rows, grad_out_rows.step_stride, value,
                    v_rows.step_stride, C(0), grad_scores.data(), keys);
          // dS = scale P (dP - rowsum(dO * O)).
          for (int64_t r = 0; r < rows; ++r) {
            const C* grad_row = grad_rows + r * grad_out_rows.step_stride;
            const C* output = out_rows(b, h, first + r);
            C delta = 0;
            for (int64_t d = 0; d < head_dim; ++d) delta += grad_row[d] * output[d];
            const C* probability = probabilities.data() + r * keys;
            C* grad_score = grad_scores.data() + r * keys;
            for (int64_t s = 0; s < keys; ++s) grad_score[s] = probability[s] * (grad_score[s] - delta) * scale;
          }
          // dq = dS k;  dk[0:keys] += dS^T q.
          cpu::gemm(false, false, rows, head_dim, keys, C(1), grad_scores.data(), keys, key, k_rows.step_stride, C(0),
                    grad_q_rows(b, h, first), grad_q_rows.step_stride);
          cpu::gemm(true, false, keys, head_dim, rows, C(1), grad_scores.data(), keys, query, q_rows.step_stride, C(1),
                    dk.data(), head_dim);
        }
      }
      for (int64_t t = 0; t < steps; ++t) {
        std::copy_n(dk.data() + t * head_dim, head_dim, grad_k_rows(b, kv_head, t));
        std::copy_n(dv.data() + t * head_dim, head_dim, grad_v_rows(b, kv_head, t));
      }
    }
  });
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& out,
                           const Tensor& lse) {
  check_rows_unit_stride("attention", {&q, &k, &v, &out});
  check_floating("attention", q);
  query_heads_per_kv_head("attention", q, k);
  if (q.numel() == 0) return;
  const Tensor computed = cpu::f32_output_for(out);
  if (q.dtype() == kFloat64) {
    attention_forward<double>(q, k, v, scale, computed, lse.data<double>());
  } else {
    attention_forward<float>(cpu::widened_to_f32(q), cpu::widened_to_f32(k), cpu::widened_to_f32(v), static_cast<float>(scale), computed,
                             lse.data<float>());
  }
  cpu::store_from_f32(computed, out);
}

void CpuBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                    const Tensor& lse, const Tensor& grad_out, double scale, const Tensor& grad_q,
                                    const Tensor& grad_k, const Tensor& grad_v) {
  check_rows_unit_stride("attention_backward", {&q, &k, &v, &out, &grad_out, &grad_q, &grad_k, &grad_v});
  check_floating("attention_backward", q);
  query_heads_per_kv_head("attention_backward", q, k);
  if (q.numel() == 0) return;
  const Tensor computed_q = cpu::f32_output_for(grad_q), computed_k = cpu::f32_output_for(grad_k),
               computed_v = cpu::f32_output_for(grad_v);
  if (q.dtype() == kFloat64) {
    attention_backward_pairs<double>(q, k, v, out, lse.data<double>(), grad_out, scale, computed_q, computed_k,
                                     computed_v);
  } else {
    attention_backward_pairs<float>(cpu::widened_to_f32(q), cpu::widened_to_f32(k), cpu::widened_to_f32(v), cpu::widened_to_f32(out), lse.data<float>(),
                                    cpu::widened_to_f32(grad_out), static_cast<float>(scale), computed_q, computed_k,
                                    computed_v);
  }
  cpu::store_from_f32(computed_q, grad_q);
  cpu::store_from_f32(computed_k, grad_k);
  cpu::store_from_f32(computed_v, grad_v);
}

}  // namespace weft
