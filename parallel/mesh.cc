#include "parallel/mesh.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "parallel/comm/mpi_environment.h"
#include "runtime/error.h"

namespace weft {

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::kData: return "dp";
    case Axis::kPipeline: return "pp";
    case Axis::kTensor: return "tp";
  }
  return "?";
}

namespace {

// "dp=2 tp=2": the sizes above 1 (all three when every size is 1).
std::string format_sizes(int dp, int pp, int tp) {
  std::string text;
  auto add = [&](const char* name, int size) {
    if (size == 1) return;
    if (!text.empty()) text += ' ';
    text += str(name, '=', size);
  };
  add("dp", dp);
  add("pp", pp);
  add("tp", tp);
  return text.empty() ? "dp=1 pp=1 tp=1" : text;
}

std::string processes(int count) { return count == 1 ? "1 process" : str(count, " processes"); }

}  // namespace

std::string Mesh::size_error(int dp, int pp, int tp, int world_size) {
  for (auto [name, size] : {std::pair{"dp", dp}, std::pair{"pp", pp}, std::pair{"tp", tp}}) {
    if (size < 1) return str("parallel.", name, " must be at least 1 (got ", size, ")");
  }
  const int64_t product = int64_t{dp} * pp * tp;
  if (product == world_size) return "";
  // Suggestions: keep the configured pipeline depth when it divides the world (pipelines are the
  // rarest choice), then prefer data parallelism over tensor parallelism.
  std::vector<std::tuple<int, int, int>> fits;
  for (int p = 1; p <= world_size; ++p) {
    if (world_size % p != 0) continue;
    for (int t = 1; t <= world_size / p; ++t) {
      if ((world_size / p) % t == 0) fits.emplace_back(world_size / p / t, p, t);
    }
  }
  const bool keep_pp = world_size % pp == 0;
  std::sort(fits.begin(), fits.end(), [&](const auto& a, const auto& b) {
    auto key = [&](const auto& fit) {
      auto [d, p, t] = fit;
      return std::tuple(keep_pp ? p != pp : false, p, -d);
    };
    return key(a) < key(b);
  });
  std::string suggestion;
  const size_t shown = std::min<size_t>(fits.size(), 3);
  for (size_t i = 0; i < shown; ++i) {
    auto [d, p, t] = fits[i];
    suggestion += (i == 0 ? "" : ", or ") + format_sizes(d, p, t);
  }
  return str("parallel.dp * parallel.pp * parallel.tp = ", dp, " * ", pp, " * ", tp, " = ", product, ", but ",
             processes(world_size), world_size == 1 ? " was" : " were", " started; with ", processes(world_size),
             " use ", shown > 1 ? "for example " : "", suggestion);
}

Mesh::Mesh(int dp, int pp, int tp, int world_size) : dp_(dp), pp_(pp), tp_(tp) {
  const std::string error = size_error(dp, pp, tp, world_size);
  WEFT_CHECK(error.empty(), error);
}

int Mesh::size(Axis axis) const {
  return axis == Axis::kData ? dp_ : axis == Axis::kPipeline ? pp_ : tp_;
}

int Mesh::rank_of(MeshCoordinates c) const {
  WEFT_CHECK(c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_ && c.tp >= 0 && c.tp < tp_,
             "mesh coordinates (", c.dp, ", ", c.pp, ", ", c.tp, ") are outside the mesh ", to_string());
  return (c.dp * pp_ + c.pp) * tp_ + c.tp;
}

MeshCoordinates Mesh::coordinates(int rank) const {
  WEFT_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " is outside the mesh ", to_string(), " of ",
             world_size(), " ranks");
  return {rank / (pp_ * tp_), (rank / tp_) % pp_, rank % tp_};
}

std::vector<int> Mesh::group_ranks(Axis axis, int rank) const {
  MeshCoordinates c = coordinates(rank);
  std::vector<int> ranks;
  for (int i = 0; i < size(axis); ++i) {
    MeshCoordinates member = c;
    (axis == Axis::kData ? member.dp : axis == Axis::kPipeline ? member.pp : member.tp) = i;
    ranks.push_back(rank_of(member));
  }
  return ranks;
}

int Mesh::group_index(Axis axis, int rank) const {
  const std::vector<std::vector<int>> all = groups(axis);
  const int first = group_ranks(axis, rank).front();
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].front() == first) return static_cast<int>(i);
  }
  return -1;  // unreachable: every rank is in one group
}

std::vector<std::vector<int>> Mesh::groups(Axis axis) const {
  std::vector<std::vector<int>> all;
  for (int rank = 0; rank < world_size(); ++rank) {
    if (coordinates(rank).along(axis) == 0) all.push_back(group_ranks(axis, rank));
  }
  return all;
}

std::string Mesh::to_string() const { return str("dp=", dp_, " pp=", pp_, " tp=", tp_); }

Mesh make_mesh_or_exit(int dp, int pp, int tp) {
  const int world_size = mpi_world_size();
  const std::string error = Mesh::size_error(dp, pp, tp, world_size);
  if (error.empty()) return Mesh(dp, pp, tp, world_size);
  if (mpi_world_rank() == 0) {
    std::fprintf(stderr, "weft: error: %s\n", error.c_str());
    std::fflush(stderr);
  }
  // Every rank reached the same verdict, so every rank is here: finalizing is safe and quiet.
  if (mpi_is_active()) MPI_Finalize();
  std::exit(2);
}

}  // namespace weft
