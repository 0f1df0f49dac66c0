// Dataset: a token stream cut into training windows, visited in an order fixed by a seed.
//
// A concrete dataset (launcher/text_dataset.h, launcher/token_shard_dataset.h) only provides the
// token stream; this base class owns the order, so every format resumes and shards the same way.
//
// Order. With T = `steps`, window w is tokens [w*T, w*T + T] of the stream (T + 1 tokens: the
// inputs are the first T, the targets the last T, i.e. the inputs shifted by one). There are
// (token_count - 1) / T windows; a short tail that does not fill one is never used. Each epoch
// visits every window exactly once, in the order of a permutation keyed by (seed, epoch) through
// Philox (runtime/random.h), so the window at (seed, epoch, cursor) is a pure function of those
// three numbers: no hidden state, so position() / seek() is all a checkpoint needs. A batch of B
// rows takes the next B windows; a batch may run across an epoch boundary.
//
// Sharding (data parallel). next_batch always takes the *global* batch B. After set_shard(rank,
// world) a dataset returns only rows [rank*B/world, (rank+1)*B/world) of that global batch and
// still advances its position by all B rows, so every rank stays at the same position and the
// global batch is identical for any world size: the rows of ranks 0..world-1, concatenated, equal
// what world = 1 returns.
//
// Invariants: position().cursor < windows per epoch between calls (it wraps to the next epoch);
// inputs and targets are contiguous CPU i64 tensors [rows, T], every value < vocabulary().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/tensor.h"

namespace weft {

// One batch of training windows. The model reads `inputs` and predicts `targets`.
struct TokenBatch {
  Tensor inputs;   // i64 [rows, T] token ids
  Tensor targets;  // i64 [rows, T] the next token after each input token
};

// Where a dataset stands, as saved in a checkpoint's state.json.
struct DatasetPosition {
  uint64_t epoch = 0;   // full passes over the windows already made
  uint64_t cursor = 0;  // windows already taken in this epoch
  uint64_t seed = 0;    // keys the per-epoch permutation
  bool operator==(const DatasetPosition&) const = default;
};

// {"epoch": ..., "cursor": ..., "seed": ...}; from_json throws nlohmann::json errors on a missing key.
void to_json(nlohmann::json& json, const DatasetPosition& position);
void from_json(const nlohmann::json& json, DatasetPosition& position);

class Dataset {
 public:
  virtual ~Dataset() = default;
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  // The next `batch` windows of `steps` tokens (this rank's rows of them; see set_shard). Throws
  // weft::Error when the stream holds fewer than steps + 1 tokens.
  TokenBatch next_batch(int64_t batch, int64_t steps);

  // Every token id is below this.
  virtual int64_t vocabulary() const = 0;
  // Tokens in the stream.
  virtual uint64_t token_count() const = 0;
  // One line for the log: format, source, sizes.
  virtual std::string describe() const = 0;

  DatasetPosition position() const { return position_; }
  // Continues from `position`, including its seed: a resumed run replays the same order even if
  // the configured seed changed.
  void seek(const DatasetPosition& position) { position_ = position; }

  // Makes this dataset return rank `rank`'s rows of each global batch (see the header comment).
  // world = 1 (the default) returns whole batches. Each global batch must have >= world rows.
  void set_shard(int64_t rank, int64_t world);
  int64_t shard_rank() const { return shard_rank_; }
  int64_t shard_world() const { return shard_world_; }

  // Windows of `steps` tokens in one epoch: (token_count - 1) / steps.
  uint64_t windows_per_epoch(int64_t steps) const;

 protected:
  explicit Dataset(uint64_t seed) { position_.seed = seed; }

  // Writes tokens [start, start + count) of the stream, which the caller keeps in range, as i64.
  virtual void read_tokens(uint64_t start, int64_t count, int64_t* destination) const = 0;

 private:
  // The window order of (position_.seed, epoch) for windows of `steps` tokens, cached because a
  // run asks for the same epoch batch after batch.
  const std::vector<uint64_t>& epoch_order(uint64_t epoch, int64_t steps);

  DatasetPosition position_;
  int64_t shard_rank_ = 0;
  int64_t shard_world_ = 1;

  std::vector<uint64_t> order_;  // order_[cursor] = window index; for the key below
  bool order_valid_ = false;
  uint64_t order_seed_ = 0;
  uint64_t order_epoch_ = 0;
  int64_t order_steps_ = 0;
};

// The permutation of [0, window_count) that epoch `epoch` of seed `seed` visits: window indices
// sorted by a Philox draw keyed by (seed, epoch). Exposed so that tests and tools can check it.
std::vector<uint64_t> window_permutation(uint64_t seed, uint64_t epoch, uint64_t window_count);

}  // namespace weft
