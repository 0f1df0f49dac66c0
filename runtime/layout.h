// Layout: how one tensor is laid out across the ranks of one mesh axis.
//
// Replicate: every rank holds the whole tensor. Split(dim): each rank holds one equal slice along
// `dim`. Partial: every rank holds a partial sum; the true value is the sum over the axis. The
// runtime (parallel/, auto comm mode) turns one layout into another with a collective:
// Partial -> Replicate all-reduce, Partial -> Split reduce-scatter, Split -> Replicate all-gather.
// Layers declare the layouts of their parameters (layers/module.h); activations' layouts are
// declared by the tensor-parallel plans of parallel/tensor/.
//
// A split dim may be made of blocks (`blocks`, sizes adding up to the dim's size), each split
// evenly on its own: a fused q/k/v weight [(H + 2 KV) D, C] is Split(0) in blocks {H D, KV D, KV D},
// so rank r holds whole heads of q, of k and of v, not the first rows of the fused matrix. Empty
// blocks: the dim is one block.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace weft {

struct Layout {
  enum class Kind : uint8_t { kReplicate, kSplit, kPartial };
  Kind kind = Kind::kReplicate;
  int64_t dim = 0;               // the split dim, for kSplit
  std::vector<int64_t> blocks;   // kSplit: sizes of the dim's blocks, each split evenly; empty: one

  static Layout replicate() { return {Kind::kReplicate, 0, {}}; }
  static Layout split(int64_t dim) { return {Kind::kSplit, dim, {}}; }
  static Layout split(int64_t dim, std::vector<int64_t> blocks) { return {Kind::kSplit, dim, std::move(blocks)}; }
  static Layout partial() { return {Kind::kPartial, 0, {}}; }
  bool is_replicate() const { return kind == Kind::kReplicate; }
  bool is_split() const { return kind == Kind::kSplit; }
  bool is_partial() const { return kind == Kind::kPartial; }
  bool operator==(const Layout&) const = default;
  // "replicate", "split(0)", "split(0, blocks 64+16+16)", "partial".
  std::string to_string() const {
    switch (kind) {
      case Kind::kReplicate: return "replicate";
      case Kind::kSplit: {
        std::string out = "split(" + std::to_string(dim);
        for (size_t i = 0; i < blocks.size(); ++i) out += (i == 0 ? ", blocks " : "+") + std::to_string(blocks[i]);
        return out + ")";
      }
      case Kind::kPartial: return "partial";
    }
    return "unknown";
  }
};

}  // namespace weft
