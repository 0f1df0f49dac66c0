// Rotary position embeddings (RoPE, Su et al. 2021) in the rotate-half layout of Llama and
// Hugging Face transformers.
//
// Pair i of a head (i in [0, D/2)) is the coordinates (i, i + D/2), rotated by the angle
// t * theta^(-2i/D) at position t:
//   out = x * cos + rotate_half(x) * sin,   rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2])
// with cos/sin tables [T, D] whose two halves repeat the D/2 angles. apply_rotary_embedding is the
// fused op runtime/ops/rotary.h (one kernel each way, its result in x's memory order of heads and
// positions); the formula above is what it computes, bit for bit in f32 and f64.
#pragma once

#include <cstdint>
#include <utility>

#include "runtime/tensor.h"

namespace weft {

// (cos, sin), each [seq_len, head_dim] f64, for positions 0..seq_len-1; head_dim must be even.
std::pair<Tensor, Tensor> rotary_tables(int64_t seq_len, int64_t head_dim, double theta);

// x [B, H, T, D], cos [T, D], sin [T, D] (x's dtype) -> [B, H, T, D]
Tensor apply_rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin);

}  // namespace weft
