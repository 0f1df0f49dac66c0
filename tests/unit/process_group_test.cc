// parallel/ without mpirun: the Mesh (rank layout, groups, the world-size message), the
// single-process group, CommStream threads and handles.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "parallel/comm/host_staged_process_group.h"
#include "parallel/comm/local_process_group.h"
#include "parallel/mesh.h"
#include "parallel/comm/process_group.h"
#include "runtime/error.h"
#include "tests/support/error_expectations.h"

namespace weft {
namespace {

TEST(Mesh, TensorParallelIsInnermost) {
  const Mesh mesh(2, 3, 4, 24);
  for (int rank = 0; rank < 24; ++rank) {
    const MeshCoordinates c = mesh.coordinates(rank);
    EXPECT_EQ(rank, (c.dp * 3 + c.pp) * 4 + c.tp);
    EXPECT_EQ(mesh.rank_of(c), rank);
  }
  EXPECT_EQ(mesh.group_ranks(Axis::kTensor, 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(mesh.group_ranks(Axis::kPipeline, 5), (std::vector<int>{1, 5, 9}));
  EXPECT_EQ(mesh.group_ranks(Axis::kData, 5), (std::vector<int>{5, 17}));
  EXPECT_EQ(mesh.groups(Axis::kData).size(), 12u);
  EXPECT_EQ(mesh.groups(Axis::kTensor).size(), 6u);
  EXPECT_EQ(mesh.group_index(Axis::kTensor, 5), 1);
  EXPECT_EQ(mesh.to_string(), "dp=2 pp=3 tp=4");
}

TEST(Mesh, TwoByTwoGroups) {
  const Mesh mesh(2, 1, 2, 4);
  EXPECT_EQ(mesh.groups(Axis::kTensor), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(mesh.groups(Axis::kData), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(mesh.groups(Axis::kPipeline).size(), 4u);
}

TEST(Mesh, WorldSizeMismatchSuggestsFittingSizes) {
  EXPECT_EQ(Mesh::size_error(2, 1, 1, 4),
            "parallel.dp * parallel.pp * parallel.tp = 2 * 1 * 1 = 2, but 4 processes were started; with 4 "
            "processes use for example dp=4, or dp=2 tp=2, or tp=4");
  EXPECT_EQ(Mesh::size_error(2, 1, 1, 3),
            "parallel.dp * parallel.pp * parallel.tp = 2 * 1 * 1 = 2, but 3 processes were started; with 3 "
            "processes use for example dp=3, or tp=3, or pp=3");
  EXPECT_EQ(Mesh::size_error(2, 1, 1, 1),
            "parallel.dp * parallel.pp * parallel.tp = 2 * 1 * 1 = 2, but 1 process was started; with 1 process "
            "use dp=1 pp=1 tp=1");
  // A pipeline depth that divides the world is kept.
  EXPECT_NE(Mesh::size_error(1, 2, 1, 8).find("use for example dp=4 pp=2, or dp=2 pp=2 tp=2, or pp=2 tp=4"),
            std::string::npos)
      << Mesh::size_error(1, 2, 1, 8);
  EXPECT_EQ(Mesh::size_error(0, 1, 1, 1), "parallel.dp must be at least 1 (got 0)");
  EXPECT_EQ(Mesh::size_error(2, 2, 1, 4), "");
  try {
    Mesh(2, 1, 1, 4);
    FAIL() << "expected weft::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("but 4 processes were started"), std::string::npos);
  }
}

TEST(LocalProcessGroup, CollectivesOfOneRank) {
  for (bool on_thread : {false, true}) {
    CommStream stream = on_thread ? CommStream::cpu("comm") : CommStream();
    auto group = make_local_process_group(Device::cpu(), "dp");
    EXPECT_EQ(group->size(), 1);
    EXPECT_EQ(group->rank(), 0);
    EXPECT_EQ(group->name(), "dp");
    Tensor tensor = Tensor::from_vector(std::vector<double>{1, 2, 3}, {3}, kBFloat16);
    group->all_reduce(tensor, Reduction::kAverage, stream)->wait();
    EXPECT_EQ(tensor.to_vector(), (std::vector<double>{1, 2, 3}));
    Tensor output = Tensor::zeros({3}, kBFloat16);
    group->reduce_scatter(tensor, output, Reduction::kSum, stream)->wait();
    EXPECT_EQ(output.to_vector(), (std::vector<double>{1, 2, 3}));
    Tensor gathered = Tensor::zeros({1, 3}, kBFloat16);
    group->all_gather(tensor, gathered, stream)->wait();
    EXPECT_EQ(gathered.to_vector(), (std::vector<double>{1, 2, 3}));
    group->broadcast(tensor, 0, stream)->wait();
    Tensor received = Tensor::zeros({3}, kBFloat16);
    group->send(tensor, 0, stream);
    tensor.fill_(9);  // the send took a copy
    group->recv(received, 0, stream)->wait();
    EXPECT_EQ(received.to_vector(), (std::vector<double>{1, 2, 3}));
    Tensor exchanged = Tensor::zeros({3}, kBFloat16);
    group->exchange(tensor, 0, exchanged, 0, stream)->wait();
    EXPECT_EQ(exchanged.to_vector(), (std::vector<double>{9, 9, 9}));
    CollectiveHandlePtr barrier = group->barrier(stream);
    barrier->wait();
    ASSERT_GE(barrier->start_ms(), 0.0);
    EXPECT_GE(barrier->end_ms(), barrier->start_ms());
    EXPECT_THROW(group->broadcast(tensor, 1, stream), Error);
    EXPECT_THROW(group->recv(received, 0, stream), Error);  // nothing sent
  }
}

// Root and peer checks are shared by every backend (parallel/comm/collective_arguments.h): the message
// names the call as written, with the rank that is out of range and the ranks the group has.
TEST(LocalProcessGroup, BadRootsAndPeersAreNamed) {
  auto group = make_local_process_group(Device::cpu(), "dp");
  const Tensor tensor = Tensor::zeros({3});
  const Tensor other = Tensor::zeros({3});
  testing::expect_contains(testing::error_message([&] { group->broadcast(tensor, 2, CommStream()); }),
                           {"broadcast(root 2) on dp", "root 2 is not a rank of the group (0..0)"});
  testing::expect_contains(testing::error_message([&] { group->send(tensor, 1, CommStream()); }),
                           {"send(to group rank 1) on dp", "peer 1 is not a rank of the group (0..0)"});
  testing::expect_contains(testing::error_message([&] { group->recv(tensor, -1, CommStream()); }),
                           {"recv(from group rank -1) on dp", "peer -1 is not a rank"});
  testing::expect_contains(testing::error_message([&] { group->exchange(tensor, 0, other, 3, CommStream()); }),
                           {"exchange(send to group rank 0, recv from group rank 3) on dp", "peer 3 is not a rank"});
  testing::expect_contains(
      testing::error_message([&] { group->send(Tensor::zeros({4, 4}).transpose(0, 1), 0, CommStream()); }),
      {"send(to group rank 0)", "the sent tensor", "must be contiguous"});
}

TEST(LocalProcessGroup, MakeProcessGroupWithoutMpiForAxesOfOne) {
  const Mesh mesh(1, 1, 1, 1);
  for (Axis axis : {Axis::kData, Axis::kPipeline, Axis::kTensor}) {
    auto group = make_process_group(mesh, axis, Device::cpu());
    EXPECT_EQ(group->size(), 1);
    EXPECT_EQ(group->name(), axis_name(axis));
    EXPECT_EQ(group->describe(), std::string(axis_name(axis)) + " (world ranks 0)");
  }
  EXPECT_EQ(make_world_process_group(Device::cpu())->size(), 1);
}

TEST(CommStream, TasksRunInOrderOnTheThreadWhileTheCallerGoesOn) {
  CommStream stream = CommStream::cpu("comm");
  EXPECT_TRUE(stream.is_cpu_thread());
  EXPECT_EQ(stream.name(), "comm");
  EXPECT_NE(stream.id(), CommStream::cpu("other").id());
  std::atomic<bool> release{false};
  std::vector<int> order;
  CollectiveHandlePtr first = stream.enqueue("first", [&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    order.push_back(1);
  });
  CollectiveHandlePtr second = stream.enqueue("second", [&] { order.push_back(2); });
  EXPECT_FALSE(first->is_done());  // the caller was not blocked
  EXPECT_LT(second->start_ms(), 0.0);  // not known before it has run
  EXPECT_LT(second->end_ms(), 0.0);
  release = true;
  second->wait();
  EXPECT_TRUE(first->is_done());
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_LE(first->end_ms(), second->start_ms());
  EXPECT_EQ(first->description(), "first");
}

TEST(CommStream, FailureIsRethrownByWait) {
  CommStream stream = CommStream::cpu("comm");
  CollectiveHandlePtr failing = stream.enqueue("failing", [] { WEFT_FAIL("injected"); });
  CollectiveHandlePtr after = stream.enqueue("after", [] {});
  after->wait();  // the stream goes on
  EXPECT_TRUE(failing->is_done());
  EXPECT_THROW(failing->wait(), Error);
}

TEST(CommStream, WaitOnAnotherStreamOrdersIt) {
  CommStream a = CommStream::cpu("a");
  CommStream b = CommStream::cpu("b");
  std::atomic<int> value{0};
  CollectiveHandlePtr slow = a.enqueue("slow", [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    value = 1;
  });
  slow->wait(b);
  int seen = -1;
  b.enqueue("reader", [&] { seen = value; })->wait();
  EXPECT_EQ(seen, 1);
  b.synchronize();
  CommStream caller;
  EXPECT_TRUE(caller.is_caller());
  EXPECT_TRUE(caller.enqueue("now", [] {})->is_done());
}

TEST(CommStream, NamedCallerStreamsHaveTheirOwnIdentity) {
  CommStream a = CommStream::caller("dp_comm");
  CommStream b = CommStream::caller("tp_comm");
  EXPECT_TRUE(a.is_caller());
  EXPECT_NE(a.id(), 0u);
  EXPECT_NE(a.id(), b.id());
  EXPECT_EQ(a.name(), "dp_comm");
  EXPECT_EQ(CommStream().name(), "caller");
  EXPECT_TRUE(a == CommStream(a));
  EXPECT_FALSE(a == b);
}

// A handle is the step graph's Completion as it is: a node's work returns it unchanged.
TEST(CollectiveHandle, IsACompletionForTheStepGraph) {
  CommStream stream = CommStream::cpu("comm");
  const double before = clock_ms();
  CompletionPtr completion = stream.enqueue("task", [] {});
  completion->synchronize();
  EXPECT_TRUE(completion->is_done());
  EXPECT_GE(completion->start_ms(), before);
  EXPECT_GE(completion->end_ms(), completion->start_ms());
  EXPECT_LE(completion->end_ms(), clock_ms());
  CompletionPtr failing = stream.enqueue("failing", [] { WEFT_FAIL("injected"); });
  EXPECT_THROW(failing->synchronize(), Error);
  EXPECT_TRUE(failing->is_done());
}

// WEFT_GPU_COLLECTIVES picks NCCL (unset, empty, "nccl") or the host (mpi: ranks may share a GPU,
// tools/device/shared-gpu-pass); anything else stops with the values it takes.
TEST(GpuCollectives, TheVariableChoosesNcclOrTheHostAndRefusesOtherValues) {
  const char* saved = std::getenv("WEFT_GPU_COLLECTIVES");
  const std::string previous = saved ? saved : "";
  unsetenv("WEFT_GPU_COLLECTIVES");
  EXPECT_FALSE(gpu_collectives_through_host());
  setenv("WEFT_GPU_COLLECTIVES", "nccl", 1);
  EXPECT_FALSE(gpu_collectives_through_host());
  setenv("WEFT_GPU_COLLECTIVES", "mpi", 1);
  EXPECT_TRUE(gpu_collectives_through_host());
  setenv("WEFT_GPU_COLLECTIVES", "gloo", 1);
  testing::expect_contains(testing::error_message([] { gpu_collectives_through_host(); }),
                           {"WEFT_GPU_COLLECTIVES='gloo' is not a collective backend",
                            "expected WEFT_GPU_COLLECTIVES=nccl (the default) or =mpi"});
  if (saved) {
    setenv("WEFT_GPU_COLLECTIVES", previous.c_str(), 1);
  } else {
    unsetenv("WEFT_GPU_COLLECTIVES");
  }
}

}  // namespace
}  // namespace weft
