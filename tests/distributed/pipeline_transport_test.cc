// PipelineTransport (parallel/pipeline/pipeline_transport.h) under mpirun -np 2 and -np 4, every
// rank a pipeline stage (pp = world size), on the CPU.
//
// Both routes carry every dtype and shape a stage may hand on (a non-contiguous tensor included)
// to both ring neighbours, the last stage's link to the first included (the interleaved schedule's
// chunks pass that way). Each stage sends from one thread and receives on another, as the executor
// does (compute list and p2p list), so the direct route's sends, which wait for their receives,
// meet them. The direct route pairs data by order: a receive whose tag names a message out of that
// order must stop with the error that says so, rather than take another message's data.
//
// Assertions that could stop one rank early use EXPECT, so that a failure on one rank never leaves
// the others waiting in a receive.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "parallel/comm/mpi_environment.h"
#include "parallel/mesh.h"
#include "parallel/pipeline/pipeline_transport.h"
#include "runtime/ops/elementwise.h"
#include "runtime/error.h"
#include "tests/support/error_expectations.h"

namespace weft {
namespace {

using Route = PipelineTransport::Route;
using testing::error_message;
using testing::expect_contains;

// The message stage `from` sends to stage `to` as its number `index`: values that name all three.
Tensor message(int from, int to, int index, DType dtype) {
  const Shape shape = index % 2 == 0 ? Shape{2, 3, 4} : Shape{5, 7};
  Tensor values = Tensor::arange(shape_numel(shape), kFloat64).reshape(shape);
  values = add_scalar(values, 1000.0 * from + 100.0 * to + 10.0 * index);
  return values.to(dtype);
}

const DType kDtypes[] = {kFloat32, kFloat64, kBFloat16, kInt64};

void expect_same(const Tensor& received, const Tensor& expected, const std::string& what) {
  EXPECT_EQ(received.dtype(), expected.dtype()) << what;
  EXPECT_EQ(received.shape(), expected.shape()) << what;
  if (received.shape() != expected.shape()) return;
  EXPECT_EQ(received.to(kFloat64).to_vector(), expected.to(kFloat64).to_vector()) << what;
}

class PipelineTransportTest : public ::testing::TestWithParam<Route> {};

TEST_P(PipelineTransportTest, CarriesEveryDtypeAndShapeToBothNeighbours) {
  const int stages = mpi_world_size();
  const int stage = mpi_world_rank();
  const Mesh mesh(1, stages, 1, stages);
  PipelineTransport transport(mesh, stage, GetParam());
  const int next = (stage + 1) % stages, previous = (stage + stages - 1) % stages;
  // Tags as the step builder's: distinct per (direction, message). Each direction's messages are
  // sent and received in one order, which the direct route needs.
  auto tag = [&](int from, int to, int index) { return static_cast<int64_t>(((from * stages + to) * 8 + index)); };
  const int count = 2 * static_cast<int>(std::size(kDtypes));
  // Two stages have one neighbour; more have two.
  const std::vector<int> receive_from = stages == 2 ? std::vector<int>{previous} : std::vector<int>{previous, next};
  const std::vector<int> send_to = stages == 2 ? std::vector<int>{next} : std::vector<int>{next, previous};
  std::vector<std::pair<std::string, std::pair<Tensor, Tensor>>> received;
  std::thread receiver([&] {
    for (int index = 0; index < count; ++index) {
      const DType dtype = kDtypes[index % std::size(kDtypes)];
      for (int peer : receive_from) {
        try {
          Tensor got = transport.receive(Device::cpu(), peer, tag(peer, stage, index));
          received.push_back({str("from stage ", peer, " message ", index), {got, message(peer, stage, index, dtype)}});
        } catch (const Error& error) {
          ADD_FAILURE() << error.what();
        }
      }
    }
  });
  for (int index = 0; index < count; ++index) {
    const DType dtype = kDtypes[index % std::size(kDtypes)];
    for (int peer : send_to) {
      Tensor tensor = message(stage, peer, index, dtype);
      // Some messages leave as a transposed view: the transport sends their values in order.
      if (index % 3 == 1) tensor = tensor.transpose(0, 1).contiguous().transpose(0, 1);
      transport.post_send(tensor, peer, tag(stage, peer, index));
    }
  }
  receiver.join();
  transport.finish_sends();
  for (const auto& [what, pair] : received) expect_same(pair.first, pair.second, what);
  EXPECT_EQ(received.size(), static_cast<size_t>(count) * receive_from.size());
}

INSTANTIATE_TEST_SUITE_P(Routes, PipelineTransportTest, ::testing::Values(Route::kHost, Route::kDirect),
                         [](const ::testing::TestParamInfo<Route>& info) {
                           return info.param == Route::kHost ? "Host" : "Direct";
                         });

// Stage 0 sends three messages to stage 1; stage 1 takes the first, then asks for the third before
// the second. The host route matches by tag and would give each its own data; the direct route
// would hand the second message's data to the third receive, so it stops naming both orders.
TEST(PipelineTransportDirect, AReceiveOutOfTheSendersOrderStops) {
  const int stages = mpi_world_size();
  const int stage = mpi_world_rank();
  PipelineTransport transport(Mesh(1, stages, 1, stages), stage, Route::kDirect);
  if (stage == 0) {
    // The first message waits for stage 1's receive (its group's communicator is made then); the
    // next two are small and leave at once.
    for (int index = 0; index < 3; ++index) transport.post_send(message(0, 1, index, kFloat32), 1, 10 + index);
    transport.finish_sends();
  } else if (stage == 1) {
    expect_same(transport.receive(Device::cpu(), 0, 10), message(0, 1, 0, kFloat32), "message 0");
    expect_contains(error_message([&] { transport.receive(Device::cpu(), 0, 12); }),
                    {"pipeline receive at stage 1 from stage 0 (tag 12)", "sent this message as its number 2",
                     "the next to arrive here is number 1", "pairs messages by order, not by tag",
                     "use parallel.pp_transport host"});
    // The second message is still next in order, with its own data. (The third's data stays
    // unclaimed: it left stage 0 eagerly, so no rank waits for it.)
    expect_same(transport.receive(Device::cpu(), 0, 11), message(0, 1, 1, kFloat32), "message 1");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace weft
