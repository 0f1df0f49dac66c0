// Mesh: the world's ranks arranged as dp x pp x tp, tensor parallel innermost.
//
//   world rank = (d * pp + p) * tp + t      for coordinates (d, p, t)
//
// so tensor-parallel peers are neighbouring ranks (the same host and its NVLink when ranks are
// placed by host), pipeline stages come next and data-parallel replicas are farthest apart. A group
// along an axis is the ranks that differ only in that axis's coordinate, listed by that coordinate,
// which is also the rank within the group.
//
// Validation: dp * pp * tp must equal the number of processes. The check is deterministic, so every
// rank decides alone; make_mesh_or_exit lets all ranks exit together (status 2) with rank 0 printing
// the message, which suggests factorizations that fit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft {

enum class Axis : uint8_t { kData, kPipeline, kTensor };
// "dp", "pp", "tp".
const char* axis_name(Axis axis);

struct MeshCoordinates {
  int dp = 0;
  int pp = 0;
  int tp = 0;
  int along(Axis axis) const { return axis == Axis::kData ? dp : axis == Axis::kPipeline ? pp : tp; }
  bool operator==(const MeshCoordinates&) const = default;
};

class Mesh {
 public:
  // Throws weft::Error (the message of size_error) unless every size is >= 1 and
  // dp * pp * tp == world_size.
  Mesh(int dp, int pp, int tp, int world_size);

  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int tp() const { return tp_; }
  int size(Axis axis) const;
  int world_size() const { return dp_ * pp_ * tp_; }

  int rank_of(MeshCoordinates coordinates) const;
  MeshCoordinates coordinates(int rank) const;
  // World ranks of the group along `axis` that holds `rank`, in group-rank order.
  std::vector<int> group_ranks(Axis axis, int rank) const;
  // Which of the axis's world_size() / size(axis) groups holds `rank` (0-based, by the lowest rank).
  int group_index(Axis axis, int rank) const;
  // Every group along `axis`, ordered by group_index.
  std::vector<std::vector<int>> groups(Axis axis) const;
  // "dp=2 pp=1 tp=2".
  std::string to_string() const;

  // Empty when the sizes fit `world_size`; otherwise the message Mesh's constructor throws, e.g.
  // "parallel.dp * parallel.pp * parallel.tp = 2 * 1 * 1 = 2, but 4 processes were started; with 4
  // processes use for example dp=4, or dp=2 tp=2, or tp=4".
  static std::string size_error(int dp, int pp, int tp, int world_size);

 private:
  int dp_;
  int pp_;
  int tp_;
};

// Builds the mesh over MPI_COMM_WORLD (or a world of one without MPI). Every rank calls it; when the
// sizes do not fit, rank 0 prints "weft: error: <size_error>" to stderr and every rank finalizes MPI
// and exits with status 2, so the job ends at once and without MPI_Abort's noise.
Mesh make_mesh_or_exit(int dp, int pp, int tp);

}  // namespace weft
