// DropoutStream: one layer's dropout, with a new mask on every call and the same masks on every run.
//
// weft::dropout draws its mask from Philox(seed, offset + i). A layer keeps one stream: its key is
// mixed from the model seed and a stream id unique to the layer (its first weight offset), and the
// offset advances by the input's size after each training call, so no two calls, and no two layers,
// share a mask. Evaluation calls (training false) and p == 0 consume nothing.
//
// The call counter is state a bit-exact resume needs: offset() / set_offset() expose it.
#pragma once

#include <cstdint>

#include "runtime/tensor.h"

namespace weft {

class DropoutStream {
 public:
  DropoutStream(double probability, uint64_t seed, uint64_t stream);
  // x unchanged unless training and probability > 0.
  Tensor apply(const Tensor& x, bool training);
  double probability() const { return probability_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }
  // Data parallelism: this rank holds rows [rank * n, (rank + 1) * n) of a global batch split evenly
  // over `world` ranks (batch dim first, as every dropout input is). Each call then draws the part
  // of the global mask those rows get in one process, and the counter advances by the global size,
  // so N ranks together use exactly the masks of one process.
  void set_shard(int64_t rank, int64_t world);
  // Sequence parallelism: inputs [B, T / size, ...] are chunk `rank` of the sequence (dim 1) of the
  // [B, T, ...] tensor one process would drop; each call draws that chunk's part of its mask (per
  // batch row, one contiguous run of the mask) and the counter advances by the whole sequence.
  void set_sequence_shard(int64_t rank, int64_t size);

 private:
  double probability_;
  uint64_t key_;        // Philox key for this layer's masks
  uint64_t offset_ = 0; // counter of the next (global) mask's first element
  int64_t shard_rank_ = 0;
  int64_t shard_world_ = 1;
  int64_t sequence_rank_ = 0;
  int64_t sequence_size_ = 1;
};

}  // namespace weft
