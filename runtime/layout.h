// Layout: how one tensor is laid out across the ranks of one mesh axis.
//
// Replicate: every rank holds the whole tensor. Split(dim): each rank holds one equal slice along
// `dim`. Partial: every rank holds a partial sum; the true value is the sum over the axis. The
// runtime (parallel/, auto comm mode) turns one layout into another with a collective:
// Partial -> Replicate all-reduce, Partial -> Split reduce-scatter, Split -> Replicate all-gather.
// Layers declare the layouts of their parameters; until tensor parallelism lands every parameter
// is Replicate.
#pragma once

#include <cstdint>
#include <string>

namespace weft {

struct Layout {
  enum class Kind : uint8_t { kReplicate, kSplit, kPartial };
  Kind kind = Kind::kReplicate;
  int64_t dim = 0;  // the split dim, for kSplit

  static Layout replicate() { return {Kind::kReplicate, 0}; }
  static Layout split(int64_t dim) { return {Kind::kSplit, dim}; }
  static Layout partial() { return {Kind::kPartial, 0}; }
  bool operator==(const Layout&) const = default;
  // "replicate", "split(0)", "partial".
  std::string to_string() const {
    switch (kind) {
      case Kind::kReplicate: return "replicate";
      case Kind::kSplit: return "split(" + std::to_string(dim) + ")";
      case Kind::kPartial: return "partial";
    }
    return "unknown";
  }
};

}  // namespace weft
