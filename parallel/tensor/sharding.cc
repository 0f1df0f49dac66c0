// Sharding (sharding.h).
#include "parallel/tensor/sharding.h"

#include <numeric>

#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"
#include "runtime/ops/concat.h"

namespace weft {
namespace {

// The blocks of the split dim: the layout's, or the whole dim as one.
std::vector<int64_t> blocks_of(const Shape& shape, const Layout& layout, int64_t dim) {
  if (!layout.blocks.empty()) return layout.blocks;
  return {shape[static_cast<size_t>(dim)]};
}

}  // namespace

void check_shardable(const Shape& shape, const Layout& layout, int size, const std::string& what) {
  WEFT_CHECK(size >= 1, what, ": cannot shard over ", size, " ranks");
  WEFT_CHECK(!layout.is_partial(), what, ": a partial sum is not a layout a stored tensor can have");
  if (!layout.is_split()) return;
  const int64_t dim = normalize_dim(layout.dim, shape, what);
  const std::vector<int64_t> blocks = blocks_of(shape, layout, dim);
  const int64_t total = std::accumulate(blocks.begin(), blocks.end(), int64_t{0});
  WEFT_CHECK(total == shape[static_cast<size_t>(dim)], what, ": the blocks of ", layout.to_string(), " add up to ",
             total, ", but dim ", dim, " of ", shape_string(shape), " has ", shape[static_cast<size_t>(dim)]);
  for (int64_t block : blocks) {
    WEFT_CHECK(block % size == 0, what, " ", shape_string(shape), ": ", layout.to_string(), " over ", size,
               " ranks needs every block of dim ", dim, " divisible by ", size, ", and ", block, " is not");
  }
}

Shape shard_shape(const Shape& full_shape, const Layout& layout, int size) {
  Shape shape = full_shape;
  if (layout.is_split()) {
    const int64_t dim = normalize_dim(layout.dim, full_shape, "shard_shape");
    shape[static_cast<size_t>(dim)] /= size;
  }
  return shape;
}

Tensor shard_of(const Tensor& full, const Layout& layout, int rank, int size) {
  check_shardable(full.shape(), layout, size, "shard_of");
  WEFT_CHECK(rank >= 0 && rank < size, "shard_of: rank ", rank, " of ", size);
  autograd::NoGradGuard no_grad;
  if (!layout.is_split() || size == 1) return full.contiguous().clone();
  const int64_t dim = normalize_dim(layout.dim, full.shape(), "shard_of");
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t block : blocks_of(full.shape(), layout, dim)) {
    const int64_t part = block / size;
    pieces.push_back(full.narrow(dim, start + rank * part, part));
    start += block;
  }
  return pieces.size() == 1 ? pieces[0].contiguous().clone() : concat(pieces, dim).contiguous();
}

Tensor assemble_shards(const std::vector<Tensor>& shards, const Layout& layout) {
  WEFT_CHECK(!shards.empty(), "assemble_shards: no shards");
  const int size = static_cast<int>(shards.size());
  autograd::NoGradGuard no_grad;
  if (!layout.is_split() || size == 1) return shards[0].contiguous().clone();
  const int64_t dim = normalize_dim(layout.dim, shards[0].shape(), "assemble_shards");
  Shape full_shape = shards[0].shape();
  full_shape[static_cast<size_t>(dim)] *= size;
  // Block sizes in the shard: each block's part.
  std::vector<int64_t> parts = blocks_of(full_shape, layout, dim);
  for (int64_t& part : parts) part /= size;
  std::vector<Tensor> pieces;
  for (size_t block = 0; block < parts.size(); ++block) {
    const int64_t offset = std::accumulate(parts.begin(), parts.begin() + static_cast<long>(block), int64_t{0});
    for (const Tensor& shard : shards) pieces.push_back(shard.narrow(dim, offset, parts[block]));
  }
  return concat(pieces, dim).contiguous();
}

Tensor gather_full(const Tensor& shard, const Layout& layout, const TensorParallelGroup& tp) {
  const int size = tp.size();
  if (!layout.is_split() || size == 1) return shard;
  autograd::NoGradGuard no_grad;
  const Tensor local = shard.contiguous();
  Tensor gathered = Tensor::empty({size * local.numel()}, local.dtype(), local.device());  // [N * shard]
  tp.group->all_gather(local.reshape({-1}), gathered, tp.stream)->wait();
  std::vector<Tensor> shards;
  for (int rank = 0; rank < size; ++rank) {
    shards.push_back(gathered.narrow(0, rank * local.numel(), local.numel()).reshape(local.shape()));
  }
  return assemble_shards(shards, layout);
}

}  // namespace weft
