// Random token ids for tests: the same on every rank and every run, drawn from Philox (seed, offset)
// as uniform doubles in [0, vocab) and truncated, so a test picks a batch by its step alone.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/tensor.h"

namespace weft::testing {

// i64 ids of `shape` (for a training batch: [B, T + 1], inputs and targets shifted by one).
inline Tensor random_token_ids(const std::vector<int64_t>& shape, int64_t vocab, uint64_t seed, uint64_t offset) {
  const std::vector<double> draws =
      Tensor::uniform(shape, seed, offset, 0.0, static_cast<double>(vocab), kFloat64).to_vector();
  const std::vector<int64_t> ids(draws.begin(), draws.end());
  return Tensor::from_vector(absl::Span<const int64_t>(ids), shape);
}

}  // namespace weft::testing
