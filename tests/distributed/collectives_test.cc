// The CPU (MPI) process group under mpirun -np 2 and -np 4: every collective against the same
// reduction computed locally from every rank's rank-dependent data, on the caller stream and on a
// communication thread; the groups of every mesh that fits the world (the 2 x 2 mesh at -np 4);
// real overlap of a collective on the comm thread with compute on the main thread; timing fields;
// broadcast_before_deadline (how an NCCL unique id reaches every rank), repeated on one
// communicator as successive communicator creations do.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <thread>

#include "parallel/comm/comm_thread.h"
#include "parallel/comm/deadline_broadcast.h"
#include "parallel/mesh.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/process_group.h"
#include "runtime/clock.h"
#include "runtime/error.h"

namespace weft {
namespace {

// Rank-dependent data: small integers, so every sum is exact in every dtype (bf16 included).
double value(int rank, int64_t i) { return (rank + 1) * 10 + static_cast<double>(i % 7) - 3; }

Tensor rank_tensor(int rank, int64_t n, DType dtype, int64_t first = 0) {
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = value(rank, first + i);
  return Tensor::from_vector(absl::Span<const double>(values), {n}, dtype);
}

const std::vector<DType> kDtypes = {kFloat32, kFloat64, kBFloat16, kInt64};

class Collectives : public testing::TestWithParam<bool /* on a comm thread */> {
 protected:
  void SetUp() override {
    world = make_world_process_group(Device::cpu());
    stream = GetParam() ? CommStream::cpu("comm") : CommStream();
  }
  std::shared_ptr<ProcessGroup> world;
  CommStream stream;
};

// 1000 elements, and 1200007: tensors above 4 MB are reduced in slices of 4 MB (the MPI backend's
// all_reduce), a last partial slice included, for 4- and 8-byte elements and bf16 (widened to f32).
TEST_P(Collectives, AllReduceMatchesLocalReduction) {
  const int size = world->size();
  const int rank = world->rank();
  ASSERT_EQ(size, mpi_world_size());
  for (const int64_t n : {int64_t{1000}, int64_t{1200007}}) {
    for (DType dtype : kDtypes) {
      for (Reduction reduction : {Reduction::kSum, Reduction::kAverage, Reduction::kMax}) {
        if (reduction == Reduction::kAverage && is_integer(dtype)) continue;
        Tensor tensor = rank_tensor(rank, n, dtype);
        world->all_reduce(tensor, reduction, stream)->wait();
        const std::vector<double> got = tensor.to(kFloat64).to_vector();
        for (int64_t i = 0; i < n; ++i) {
          double expected = reduction == Reduction::kMax ? value(size - 1, i) : 0.0;
          if (reduction != Reduction::kMax) {
            for (int r = 0; r < size; ++r) expected += value(r, i);
            if (reduction == Reduction::kAverage) expected /= size;
          }
          const double tolerance = dtype == kBFloat16 ? std::abs(expected) / 128 : 0.0;
          ASSERT_NEAR(got[static_cast<size_t>(i)], expected, tolerance)
              << dtype_name(dtype) << " " << reduction_name(reduction) << " " << n << " elements, element " << i;
        }
      }
    }
  }
}

// 333 elements a rank, and 1200007: inputs above 8 MB are reduced in pieces of 8 MB (the MPI
// backend's reduce_scatter), a last partial piece included, for 4- and 8-byte elements and bf16
// (widened to f32 first).
TEST_P(Collectives, ReduceScatterMatchesLocalReduction) {
  const int size = world->size();
  const int rank = world->rank();
  for (const int64_t n : {int64_t{333}, int64_t{1200007}}) {
    for (DType dtype : kDtypes) {
      for (Reduction reduction : {Reduction::kSum, Reduction::kAverage}) {
        if (reduction == Reduction::kAverage && is_integer(dtype)) continue;
        Tensor input = rank_tensor(rank, size * n, dtype);
        Tensor output = Tensor::zeros({n}, dtype);
        world->reduce_scatter(input, output, reduction, stream)->wait();
        const std::vector<double> got = output.to(kFloat64).to_vector();
        for (int64_t j = 0; j < n; ++j) {
          double expected = 0;
          for (int r = 0; r < size; ++r) expected += value(r, rank * n + j);
          if (reduction == Reduction::kAverage) expected /= size;
          const double tolerance = dtype == kBFloat16 ? std::abs(expected) / 128 : 0.0;
          ASSERT_NEAR(got[static_cast<size_t>(j)], expected, tolerance)
              << dtype_name(dtype) << " " << n << " a rank, element " << j;
        }
      }
    }
  }
}

TEST_P(Collectives, AllGatherPlacesEachRankInOrder) {
  const int size = world->size();
  const int64_t n = 257;
  for (DType dtype : kDtypes) {
    Tensor input = rank_tensor(world->rank(), n, dtype);
    Tensor output = Tensor::zeros({size, n}, dtype);
    world->all_gather(input, output, stream)->wait();
    for (int r = 0; r < size; ++r) {
      for (int64_t j = 0; j < n; j += 5) ASSERT_EQ(output.at({r, j}), value(r, j)) << dtype_name(dtype);
    }
  }
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  for (int root = 0; root < world->size(); ++root) {
    for (DType dtype : kDtypes) {
      Tensor tensor = rank_tensor(world->rank(), 100, dtype);
      world->broadcast(tensor, root, stream)->wait();
      for (int64_t j = 0; j < 100; ++j) ASSERT_EQ(tensor.at({j}), value(root, j));
    }
  }
}

TEST_P(Collectives, SendAndRecvBetweenPairs) {
  const int size = world->size();
  const int rank = world->rank();
  // Pairs (0, 1), (2, 3): the even rank sends first, the odd one receives first.
  const int64_t n = 1 << 18;  // 1 MiB of f32: beyond the eager limit, so the order matters
  const int peer = rank ^ 1;
  if (peer >= size) GTEST_SKIP() << "no peer";
  Tensor mine = rank_tensor(rank, n, kFloat32);
  Tensor theirs = Tensor::zeros({n}, kFloat32);
  if (rank % 2 == 0) {
    world->send(mine, peer, stream)->wait();
    world->recv(theirs, peer, stream)->wait();
  } else {
    world->recv(theirs, peer, stream)->wait();
    world->send(mine, peer, stream)->wait();
  }
  for (int64_t j = 0; j < n; j += 1001) ASSERT_EQ(theirs.at({j}), value(peer, j));
}

TEST_P(Collectives, ExchangeAroundARing) {
  const int size = world->size();
  const int rank = world->rank();
  const int64_t n = 1 << 18;
  for (DType dtype : kDtypes) {
    Tensor mine = rank_tensor(rank, n, dtype);
    Tensor received = Tensor::zeros({n}, dtype);
    const int previous = (rank + size - 1) % size;
    world->exchange(mine, (rank + 1) % size, received, previous, stream)->wait();
    for (int64_t j = 0; j < n; j += 1001) ASSERT_EQ(received.at({j}), value(previous, j));
  }
}

TEST_P(Collectives, BarrierWaitsForTheLastRank) {
  world->barrier(stream)->wait();
  // The last rank arrives 500 ms after the others (the margin allows for a loaded machine).
  if (world->rank() == world->size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const double before = clock_ms();
  world->barrier(stream)->wait();
  if (world->rank() == 0) EXPECT_GE(clock_ms() - before, 250.0);
}

TEST_P(Collectives, CallsOnOneStreamRunInOrder) {
  // Each all-reduce doubles (sum over ranks of the same value): after k of them, value * size^k.
  Tensor tensor = Tensor::full({64}, 1.0, kFloat64);
  std::vector<CollectiveHandlePtr> handles;
  for (int k = 0; k < 10; ++k) handles.push_back(world->all_reduce(tensor, Reduction::kSum, stream));
  handles.back()->wait();
  for (auto& handle : handles) EXPECT_TRUE(handle->is_done());
  EXPECT_EQ(tensor.at({5}), std::pow(world->size(), 10));
}

TEST_P(Collectives, TimingIsFilledWhenDone) {
  Tensor tensor = rank_tensor(world->rank(), 1 << 16, kFloat32);
  const double submitted = clock_ms();
  CollectiveHandlePtr handle = world->all_reduce(tensor, Reduction::kSum, stream);
  handle->wait();
  ASSERT_TRUE(handle->is_done());
  EXPECT_GE(handle->start_ms(), submitted);
  EXPECT_GE(handle->end_ms(), handle->start_ms());
  EXPECT_LE(handle->end_ms(), clock_ms());
  EXPECT_EQ(handle->bytes(), (1 << 16) * 4);
  EXPECT_NE(handle->description().find("all_reduce(sum) of f32[65536] cpu on world"), std::string::npos)
      << handle->description();
}

INSTANTIATE_TEST_SUITE_P(Streams, Collectives, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) { return info.param ? "CommThread" : "Caller"; });

// --- Sub-groups of meshes ------------------------------------------------------------------------

TEST(MeshGroups, EveryAxisGroupOfEveryFittingMeshReducesOverItsMembers) {
  const int world_size = mpi_world_size();
  const int world_rank = mpi_world_rank();
  CommStream stream = CommStream::cpu("mesh");
  for (int pp = 1; pp <= world_size; ++pp) {
    for (int tp = 1; tp * pp <= world_size; ++tp) {
      if (world_size % (pp * tp) != 0) continue;
      const Mesh mesh(world_size / (pp * tp), pp, tp, world_size);
      for (Axis axis : {Axis::kData, Axis::kPipeline, Axis::kTensor}) {
        SCOPED_TRACE(mesh.to_string() + " axis " + axis_name(axis));
        std::shared_ptr<ProcessGroup> group = make_process_group(mesh, axis, Device::cpu());
        const std::vector<int> members = mesh.group_ranks(axis, world_rank);
        EXPECT_EQ(group->name(), axis_name(axis));
        EXPECT_EQ(group->size(), mesh.size(axis));
        EXPECT_EQ(group->rank(), mesh.coordinates(world_rank).along(axis));
        EXPECT_EQ(group->world_ranks(), members);
        // Sum of the members' world ranks, and each member's rank gathered in group order.
        Tensor sum = Tensor::full({3}, world_rank, kInt64);
        group->all_reduce(sum, Reduction::kSum, stream)->wait();
        int64_t expected = 0;
        for (int member : members) expected += member;
        EXPECT_EQ(sum.at({2}), expected);
        Tensor mine = Tensor::full({1}, world_rank, kInt64);
        Tensor gathered = Tensor::zeros({group->size()}, kInt64);
        group->all_gather(mine, gathered, stream)->wait();
        for (int i = 0; i < group->size(); ++i) EXPECT_EQ(gathered.at({i}), members[static_cast<size_t>(i)]);
      }
    }
  }
}

TEST(MeshGroups, TwoByTwoMeshGroupsAreTheExpectedRanks) {
  if (mpi_world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const Mesh mesh(2, 1, 2, 4);  // ranks: (d, t) -> d * 2 + t
  const int rank = mpi_world_rank();
  auto dp = make_process_group(mesh, Axis::kData, Device::cpu());
  auto tp = make_process_group(mesh, Axis::kTensor, Device::cpu());
  auto pp = make_process_group(mesh, Axis::kPipeline, Device::cpu());
  EXPECT_EQ(dp->world_ranks(), (std::vector<int>{rank % 2, rank % 2 + 2}));
  EXPECT_EQ(tp->world_ranks(), (std::vector<int>{rank / 2 * 2, rank / 2 * 2 + 1}));
  EXPECT_EQ(pp->size(), 1);
  // Reduce over tp, then over dp: the world sum.
  Tensor tensor = Tensor::full({8}, rank + 1, kFloat32);
  CommStream tp_stream = CommStream::cpu("tp-comm");
  CommStream dp_stream = CommStream::cpu("dp-comm");
  tp->all_reduce(tensor, Reduction::kSum, tp_stream)->wait(dp_stream);
  dp->all_reduce(tensor, Reduction::kSum, dp_stream)->wait();
  EXPECT_EQ(tensor.at({0}), 1 + 2 + 3 + 4);
}

// --- Overlap and asynchrony ----------------------------------------------------------------------

// Work the main thread does that touches no MPI: a dependent floating-point chain.
double compute_for(double milliseconds) {
  const double until = clock_ms() + milliseconds;
  double x = 1.0;
  while (clock_ms() < until) {
    for (int i = 0; i < 10000; ++i) x = x * 1.0000001 + 1e-9;
  }
  return x;
}

TEST(Overlap, CollectiveOnTheCommThreadProgressesWhileTheMainThreadComputes) {
  auto world = make_world_process_group(Device::cpu());
  CommStream comm = CommStream::cpu("dp-comm");
  const int64_t n = 1 << 22;  // 16 MiB of f32
  Tensor gradients = Tensor::full({n}, 1.0, kFloat32);
  world->barrier(CommStream())->wait();

  const double compute_start = clock_ms();
  CollectiveHandlePtr handle = world->all_reduce(gradients, Reduction::kSum, comm);
  // Compute, never calling MPI, until the collective has finished (or 30 s pass).
  double sink = 0;
  bool done_while_computing = false;
  while (clock_ms() - compute_start < 30000) {
    sink += compute_for(1.0);
    if (handle->is_done()) {
      done_while_computing = true;
      break;
    }
  }
  const double compute_end = clock_ms();
  handle->wait();
  ASSERT_TRUE(done_while_computing) << "the collective did not finish while the main thread computed";
  const double start = handle->start_ms();
  const double end = handle->end_ms();
  ASSERT_GE(start, 0.0);
  // The collective ran inside the compute interval: overlap is its whole duration.
  const double overlap = std::min(end, compute_end) - std::max(start, compute_start);
  EXPECT_GT(end - start, 0.0);
  EXPECT_GE(overlap, 0.99 * (end - start))
      << "collective [" << start << ", " << end << "] compute [" << compute_start << ", " << compute_end << "]";
  EXPECT_EQ(gradients.at({n - 1}), world->size());
  EXPECT_NE(sink, 0.0);
  if (world->rank() == 0) {
    std::printf("all_reduce of 16 MiB on the comm thread: %.2f ms, all of it while the main thread computed "
                "(%.2f ms of compute)\n", end - start, compute_end - compute_start);
  }
}

TEST(Overlap, HandleIsNotDoneWhileAPeerIsLate) {
  auto world = make_world_process_group(Device::cpu());
  CommStream comm = CommStream::cpu("comm");
  Tensor tensor = Tensor::full({16}, 1.0, kFloat32);
  world->barrier(CommStream())->wait();
  if (world->rank() == world->size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CollectiveHandlePtr handle = world->all_reduce(tensor, Reduction::kSum, comm);
  if (world->rank() == 0) {
    // The last rank joins 500 ms late: rank 0's handle is pending meanwhile and has no timing.
    EXPECT_FALSE(handle->is_done());
    EXPECT_LT(handle->start_ms(), 0.0);
  }
  handle->wait();
  EXPECT_GE(handle->start_ms(), 0.0);
  if (world->rank() == 0) EXPECT_GE(handle->end_ms() - handle->start_ms(), 250.0);
  EXPECT_EQ(tensor.at({0}), world->size());
}

TEST(Overlap, TwoStreamsOfOneGroupAreIndependent) {
  auto world = make_world_process_group(Device::cpu());
  CommStream first = CommStream::cpu("first");
  CommStream second = CommStream::cpu("second");
  // Each stream's first use creates its communicator, collectively: in one order on every rank
  // (process_group.h), not from two comm threads racing each other (which a slow build shows).
  world->barrier(first)->wait();
  world->barrier(second)->wait();
  Tensor a = Tensor::full({1 << 20}, 1.0, kFloat32);
  Tensor b = Tensor::full({8}, 2.0, kFloat64);
  CollectiveHandlePtr on_first = world->all_reduce(a, Reduction::kSum, first);
  CollectiveHandlePtr on_second = world->all_reduce(b, Reduction::kMax, second);
  on_second->wait();
  on_first->wait();
  EXPECT_EQ(a.at({7}), world->size());
  EXPECT_EQ(b.at({7}), 2.0);
}

TEST(Overlap, NamedCallerStreamsRunOneGroupFromTwoThreads) {
  // An executor's comm threads each run collectives themselves on their own caller stream. First
  // uses (which create each stream's communicator) happen in one order on every rank: here, on the
  // main thread.
  auto world = make_world_process_group(Device::cpu());
  CommStream dp_comm = CommStream::caller("dp_comm");
  CommStream tp_comm = CommStream::caller("tp_comm");
  world->barrier(dp_comm)->wait();
  world->barrier(tp_comm)->wait();
  Tensor a = Tensor::full({4096}, 1.0, kFloat32);
  Tensor b = Tensor::full({4096}, 1.0, kFloat64);
  std::thread first([&] {
    for (int i = 0; i < 20; ++i) world->all_reduce(a, Reduction::kAverage, dp_comm)->wait();
  });
  std::thread second([&] {
    for (int i = 0; i < 20; ++i) world->all_reduce(b, Reduction::kMax, tp_comm)->wait();
  });
  first.join();
  second.join();
  EXPECT_EQ(a.at({100}), 1.0);
  EXPECT_EQ(b.at({100}), 1.0);
}

// --- Argument errors (raised on the calling thread, before anything is queued) -------------------

TEST(Arguments, MismatchedSizesNameTheCollective) {
  auto world = make_world_process_group(Device::cpu());
  Tensor input = Tensor::zeros({world->size() * 4 + 1}, kFloat32);
  Tensor output = Tensor::zeros({4}, kFloat32);
  try {
    world->reduce_scatter(input, output, Reduction::kSum, CommStream());
    FAIL() << "expected weft::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("reduce_scatter(sum) on world"), std::string::npos) << error.what();
  }
  EXPECT_THROW(world->all_reduce(Tensor::zeros({4}, kInt64), Reduction::kAverage, CommStream()), Error);
  EXPECT_THROW(world->broadcast(output, world->size(), CommStream()), Error);
  EXPECT_THROW(world->all_reduce(Tensor::zeros({4, 4}).transpose(0, 1), Reduction::kSum, CommStream()), Error);
}

// --- broadcast_before_deadline (the NCCL unique id's way to every rank) ----------------------------

TEST(DeadlineBroadcast, HandsRankZerosBytesToEveryRankCallAfterCall) {
  MPI_Comm comm = MPI_COMM_NULL;
  {
    MpiCallLock lock;
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm), MPI_SUCCESS);
  }
  std::vector<int> world_ranks(static_cast<size_t>(mpi_world_size()));
  for (size_t r = 0; r < world_ranks.size(); ++r) world_ranks[r] = static_cast<int>(r);
  const int rank = mpi_world_rank();
  for (int call = 0; call < 5; ++call) {
    // 128 bytes, as an ncclUniqueId; rank 0's differ from call to call.
    std::vector<unsigned char> bytes(128, 0);
    if (rank == 0) {
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 7 + call);
    }
    broadcast_before_deadline(comm, bytes.data(), static_cast<int>(bytes.size()),
                              std::chrono::steady_clock::now() + std::chrono::seconds(30), 30, "test bytes",
                              world_ranks);
    for (size_t i = 0; i < bytes.size(); ++i) {
      ASSERT_EQ(bytes[i], static_cast<unsigned char>(i * 7 + call)) << "call " << call << ", byte " << i;
    }
  }
  MpiCallLock lock;
  MPI_Comm_free(&comm);
}

}  // namespace
}  // namespace weft
