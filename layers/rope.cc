// Rotary position embeddings (rope.h).
#include "layers/rope.h"

#include <cmath>
#include <vector>

#include "runtime/error.h"
#include "runtime/ops/rotary.h"

namespace weft {

std::pair<Tensor, Tensor> rotary_tables(int64_t seq_len, int64_t head_dim, double theta) {
  WEFT_CHECK(head_dim >= 2 && head_dim % 2 == 0, "rotary embeddings need an even head dim, got ", head_dim);
  WEFT_CHECK(seq_len >= 1 && theta > 0, "rotary_tables: seq_len ", seq_len, " and theta ", theta,
             " must be positive");
  const int64_t half = head_dim / 2;
  std::vector<double> cos_values(static_cast<size_t>(seq_len * head_dim));
  std::vector<double> sin_values(cos_values.size());
  for (int64_t t = 0; t < seq_len; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // Computed in double, as 1 / theta^(2i/D), so a f64 model and its PyTorch reference agree.
      const double inverse_frequency = 1.0 / std::pow(theta, static_cast<double>(2 * i) / head_dim);
      const double angle = static_cast<double>(t) * inverse_frequency;
      for (const int64_t column : {i, i + half}) {
        cos_values[static_cast<size_t>(t * head_dim + column)] = std::cos(angle);
        sin_values[static_cast<size_t>(t * head_dim + column)] = std::sin(angle);
      }
    }
  }
  return {Tensor::from_vector(absl::Span<const double>(cos_values), {seq_len, head_dim}, kFloat64),
          Tensor::from_vector(absl::Span<const double>(sin_values), {seq_len, head_dim}, kFloat64)};
}

Tensor apply_rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  return rotary_embedding(x, cos, sin);  // [B, H, T, D]; checks shapes, dtypes and devices
}

}  // namespace weft
