// DropoutStream (dropout_stream.h).
#include "layers/dropout_stream.h"

#include "runtime/error.h"
#include "runtime/ops/concat.h"
#include "runtime/ops/dropout.h"

namespace weft {
namespace {

// splitmix64's finalizer: nearby (seed, stream) pairs give unrelated keys, and a key never equals
// the weight seed, so masks are independent of initial weights.
uint64_t mix(uint64_t value) {
  value += 0x9E3779B97F4A7C15ull;
  value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ull;
  value = (value ^ (value >> 27)) * 0x94D049BB133111EBull;
  return value ^ (value >> 31);
}

}  // namespace

DropoutStream::DropoutStream(double probability, uint64_t seed, uint64_t stream)
    : probability_(probability), key_(mix(mix(seed) ^ stream)) {
  WEFT_CHECK(probability >= 0.0 && probability < 1.0, "dropout probability must be in [0, 1), got ", probability);
}

Tensor DropoutStream::apply(const Tensor& x, bool training) {
  if (!training || probability_ == 0.0) return x;
  const uint64_t local = static_cast<uint64_t>(x.numel());
  if (sequence_size_ == 1) {
    const uint64_t offset = offset_ + static_cast<uint64_t>(shard_rank_) * local;
    offset_ += static_cast<uint64_t>(shard_world_) * local;
    return dropout(x, probability_, key_, offset, true);
  }
  // x [B, T / size, ...]: in one process's mask of [B, T, ...] (for this dp rank's rows), row b's
  // chunk starts at (b * size + rank) * chunk, chunk = (T / size) * (the trailing sizes).
  WEFT_CHECK(x.dim() >= 2, "dropout: a sequence-parallel input must be [B, T, ...], got ", x.describe());
  const int64_t rows = x.size(0);
  const uint64_t chunk = local / static_cast<uint64_t>(rows);
  const uint64_t global_rows_offset = offset_ + static_cast<uint64_t>(shard_rank_) * local * sequence_size_;
  std::vector<Tensor> dropped;
  for (int64_t row = 0; row < rows; ++row) {
    const uint64_t start =
        global_rows_offset + (static_cast<uint64_t>(row * sequence_size_ + sequence_rank_)) * chunk;
    dropped.push_back(dropout(x.narrow(0, row, 1), probability_, key_, start, true));
  }
  offset_ += static_cast<uint64_t>(shard_world_ * sequence_size_) * local;
  return rows == 1 ? dropped[0] : concat(dropped, 0);
}

void DropoutStream::set_sequence_shard(int64_t rank, int64_t size) {
  WEFT_CHECK(size >= 1 && rank >= 0 && rank < size, "dropout: sequence shard ", rank, " of ", size, " is not valid");
  sequence_rank_ = rank;
  sequence_size_ = size;
}

void DropoutStream::set_shard(int64_t rank, int64_t world) {
  WEFT_CHECK(world >= 1 && rank >= 0 && rank < world, "dropout: shard ", rank, " of ", world, " is not valid");
  shard_rank_ = rank;
  shard_world_ = world;
}

}  // namespace weft
