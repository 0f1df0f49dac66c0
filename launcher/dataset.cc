#include "launcher/dataset.h"

#include <algorithm>
#include <utility>

#include "runtime/error.h"
#include "runtime/random.h"

namespace weft {

namespace {

// Mixed into the seed before it keys the data order. The run's seed also keys the initial weights
// (Tensor::normal with counters from 0); without this the window order and the first weights would
// come from the same Philox stream, a correlation no one would think to look for.
constexpr uint64_t kDataOrderDomain = 0x6461746120726e67ull;  // "data rng"

uint64_t low_words(const PhiloxWords& words) {
  return static_cast<uint64_t>(words.word[0]) | (static_cast<uint64_t>(words.word[1]) << 32);
}

}  // namespace

void to_json(nlohmann::json& json, const DatasetPosition& position) {
  json = nlohmann::json{{"epoch", position.epoch}, {"cursor", position.cursor}, {"seed", position.seed}};
}

void from_json(const nlohmann::json& json, DatasetPosition& position) {
  json.at("epoch").get_to(position.epoch);
  json.at("cursor").get_to(position.cursor);
  json.at("seed").get_to(position.seed);
}

std::vector<uint64_t> window_permutation(uint64_t seed, uint64_t epoch, uint64_t window_count) {
  // One Philox draw per (seed, epoch) gives the epoch's key, so epochs are independent streams
  // with no limit on the number of windows (a counter of epoch * count + i would overflow).
  const uint64_t epoch_key = low_words(philox4x32_10(seed ^ kDataOrderDomain, epoch));
  std::vector<std::pair<uint64_t, uint64_t>> keyed(window_count);
  for (uint64_t window = 0; window < window_count; ++window) {
    keyed[window] = {low_words(philox4x32_10(epoch_key, window)), window};
  }
  // Ties in the 64-bit key fall back to the window index, so the order is total and the same on
  // every platform and standard library.
  std::sort(keyed.begin(), keyed.end());
  std::vector<uint64_t> order(window_count);
  for (uint64_t index = 0; index < window_count; ++index) order[index] = keyed[index].second;
  return order;
}

uint64_t Dataset::windows_per_epoch(int64_t steps) const {
  WEFT_CHECK(steps > 0, "Dataset: the sequence length must be positive, got ", steps);
  const uint64_t tokens = token_count();
  return tokens == 0 ? 0 : (tokens - 1) / static_cast<uint64_t>(steps);
}

void Dataset::set_shard(int64_t rank, int64_t world) {
  WEFT_CHECK(world >= 1 && rank >= 0 && rank < world, "Dataset::set_shard: rank ", rank,
             " is not in [0, world) for world ", world);
  shard_rank_ = rank;
  shard_world_ = world;
}

const std::vector<uint64_t>& Dataset::epoch_order(uint64_t epoch, int64_t steps) {
  if (!order_valid_ || order_seed_ != position_.seed || order_epoch_ != epoch || order_steps_ != steps) {
    order_ = window_permutation(position_.seed, epoch, windows_per_epoch(steps));
    order_valid_ = true;
    order_seed_ = position_.seed;
    order_epoch_ = epoch;
    order_steps_ = steps;
  }
  return order_;
}

TokenBatch Dataset::next_batch(int64_t batch, int64_t steps) {
  WEFT_CHECK(batch > 0, "Dataset::next_batch: the batch size must be positive, got ", batch);
  WEFT_CHECK(steps > 0, "Dataset::next_batch: the sequence length must be positive, got ", steps);
  const uint64_t windows = windows_per_epoch(steps);
  WEFT_CHECK(windows > 0, describe(), ": ", token_count(), " tokens are too few for one sequence of seq_len ",
             steps, " (needs seq_len + 1 = ", steps + 1, " tokens)");
  WEFT_CHECK(batch >= shard_world_, "Dataset::next_batch: a global batch of ", batch,
             " rows cannot give each of ", shard_world_, " ranks at least one row");
  // A cursor past the end means the position came from a checkpoint of other data (or another
  // seq_len); continuing would silently read a different sequence than the one saved.
  WEFT_CHECK(position_.cursor <= windows, describe(), ": the data position (epoch ", position_.epoch,
             ", cursor ", position_.cursor, ") is beyond the ", windows, " windows of seq_len ", steps,
             " in one epoch; was it saved with other data or another seq_len?");

  const int64_t first_row = shard_rank_ * batch / shard_world_;
  const int64_t end_row = (shard_rank_ + 1) * batch / shard_world_;
  const int64_t rows = end_row - first_row;
  TokenBatch result{Tensor::empty({rows, steps}, kInt64), Tensor::empty({rows, steps}, kInt64)};
  int64_t* inputs = result.inputs.data<int64_t>();
  int64_t* targets = result.targets.data<int64_t>();
  std::vector<int64_t> window_tokens(static_cast<size_t>(steps) + 1);

  for (int64_t row = 0; row < batch; ++row) {
    if (position_.cursor >= windows) {
      ++position_.epoch;
      position_.cursor = 0;
    }
    const uint64_t window = epoch_order(position_.epoch, steps)[position_.cursor];
    ++position_.cursor;
    if (row < first_row || row >= end_row) continue;  // another rank's row
    read_tokens(window * static_cast<uint64_t>(steps), steps + 1, window_tokens.data());
    const int64_t local_row = row - first_row;
    std::copy(window_tokens.begin(), window_tokens.end() - 1, inputs + local_row * steps);
    std::copy(window_tokens.begin() + 1, window_tokens.end(), targets + local_row * steps);
  }
  // Leave the cursor wrapped so position() always names a window that exists.
  if (position_.cursor >= windows) {
    ++position_.epoch;
    position_.cursor = 0;
  }
  return result;
}

}  // namespace weft
