// DropoutStream (dropout_stream.h).
#include "layers/dropout_stream.h"

#include "runtime/error.h"
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
  const uint64_t offset = offset_ + static_cast<uint64_t>(shard_rank_) * local;
  offset_ += static_cast<uint64_t>(shard_world_) * local;
  return dropout(x, probability_, key_, offset, true);
}

void DropoutStream::set_shard(int64_t rank, int64_t world) {
  WEFT_CHECK(world >= 1 && rank >= 0 && rank < world, "dropout: shard ", rank, " of ", world, " is not valid");
  shard_rank_ = rank;
  shard_world_ = world;
}

}  // namespace weft
