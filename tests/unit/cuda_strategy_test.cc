// The data-parallel strategy on one GPU with its collectives on a second stream: with
// collectives_for_one_rank the group of one still runs every bucket's all-reduce or reduce-scatter
// (a copy into the shard for ZeRO 2) and every ZeRO all-gather, in the auto mode on the executor's
// dp_comm CUDA stream, ordered against backward and the optimizer only by events. A missing wait
// would let a copy read a bucket backward has not finished, and the weights would differ from the
// same steps on the CPU. The process groups themselves on one GPU: the group of one holds a copy's
// tensors until the copy on another stream is done, whatever the caller does with the handle; a
// one-rank NCCL group (MPI's singleton world) keys its communicators by stream id, sets aside the
// communicator of a stream weft destroyed, and lets its watchdog release finished handles. Skipped
// where no CUDA device is present. Two steps in flight give what one at a time gives.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "layers/language_model.h"
#include "parallel/comm/local_process_group.h"
#include "parallel/comm/process_group.h"
#include "parallel/strategy.h"
#include "parallel/step/weight_gradient_overlap.h"
#include "runtime/weft.h"
#include "tests/support/cuda_expectations.h"
#include "tests/support/gradient_check.h"
#include "tests/support/small_model_config.h"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/stream.h"
#endif
#if defined(WEFT_HAVE_CUDA) && defined(WEFT_HAVE_NCCL)
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/nccl_process_group.h"
#endif

namespace weft {
namespace {

constexpr int64_t kBatch = 4, kSteps = 3;

ModelConfig model_config() {
  ModelConfig config = testing::small_model_config();
  config.layers = 3;
  config.dim = 32;
  config.vocab = 64;
  config.seq_len = 16;
  config.init_std = 0.02;
  return config;
}

// The same ids for every device (the step uploads them): Philox from the step and the micro-batch.
MicroBatchSource batches(int64_t step) {
  auto count = std::make_shared<int64_t>(0);
  return [step, count] {
    const ModelConfig config = model_config();
    std::vector<double> draws = Tensor::uniform({kBatch, config.seq_len + 1}, 91,
                                                static_cast<uint64_t>(step * 100 + (*count)++) * 1000, 0.0,
                                                static_cast<double>(config.vocab), kFloat64)
                                    .to_vector();
    std::vector<int64_t> ids(draws.begin(), draws.end());
    Tensor all = Tensor::from_vector(absl::Span<const int64_t>(ids), {kBatch, config.seq_len + 1});
    return MicroBatch{all.narrow(1, 0, config.seq_len).contiguous(), all.narrow(1, 1, config.seq_len).contiguous()};
  };
}

// `in_flight` 2 issues each step before the last one is finished (Strategy::issue_step); `losses`,
// when given, receives each step's reported loss. `skipped_step` > 0 trains with AdamW and
// train.on_nan: skip, and makes that step's loss NaN (WEFT_FAULT=nan); `skipped` receives each
// step's report of it.
std::map<std::string, Tensor> train(Device device, const std::string& mode, int64_t zero, bool collectives,
                                    int in_flight = 1, std::vector<double>* losses = nullptr,
                                    int64_t skipped_step = 0, std::vector<bool>* skipped = nullptr,
                                    bool weight_gradient_stream = false) {
  std::shared_ptr<LanguageModel> model = build_model(model_config());
  if (!device.is_cpu()) model->to(device);
  StrategyOptions options;
  options.comm_mode = mode;
  options.zero_stage = zero;
  options.bucket_bytes = 8192;  // several buckets
  options.micro_batches = 2;
  options.weight_decay = 0.1;
  options.grad_clip = 1.0;
  options.collectives_for_one_rank = collectives;
  options.weight_gradient_stream = weight_gradient_stream;
  options.make_optimizer = [](std::vector<ParameterGroup> groups) {
    // SGD: a rounding difference stays a rounding difference (AdamW's first steps are sign-like).
    return make_sgd(std::move(groups), {0.9, false});
  };
  if (skipped_step > 0) {
    // AdamW: its bias corrections depend on how many updates were applied.
    options.on_nan = "skip";
    options.make_optimizer = [](std::vector<ParameterGroup> groups) { return make_adamw(std::move(groups), {}); };
    setenv("WEFT_FAULT", ("nan:rank=0:step=" + std::to_string(skipped_step)).c_str(), 1);
  }
  std::unique_ptr<Strategy> strategy = make_strategy(Mesh(1, 1, 1, 1), 0, *model, options);
  unsetenv("WEFT_FAULT");
  const auto report_of = [&](const StepReport& report) {
    if (losses != nullptr) losses->push_back(report.loss);
    if (skipped != nullptr) skipped->push_back(report.skipped);
  };
  int pending = 0;
  for (int64_t step = 1; step <= kSteps + (skipped_step > 0 ? 1 : 0); ++step) {
    strategy->issue_step(step, 0.5, batches(step));
    if (++pending < in_flight) continue;
    report_of(strategy->finish_step());
    --pending;
  }
  for (; pending > 0; --pending) report_of(strategy->finish_step());
  strategy->complete_parameter_updates();
  std::map<std::string, Tensor> state;
  for (const auto& [name, tensor] : model->state_dict()) state[name] = tensor.to(Device::cpu());
  return state;
}

class CudaStrategy : public ::testing::TestWithParam<int64_t> {};

TEST_P(CudaStrategy, CollectivesOnASecondStreamMatchTheCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("needs a CUDA device");
  const int64_t zero = GetParam();
  const auto expected = train(Device::cpu(), "manual", 0, false);
  for (const std::string mode : {"manual", "auto"}) {
    const auto actual = train(Device::cuda(0), mode, zero, true);
    for (const auto& [name, tensor] : actual) {
      EXPECT_LE(testing::relative_error(tensor, expected.at(name)), 1e-4) << mode << " zero " << zero << " " << name;
    }
  }
}

// Two steps in flight on the GPU, collectives on the second stream: the same losses and weights as
// one step at a time (a step's read-back or its reads of the weights crossing into the next step
// would change them by far more than rounding).
TEST_P(CudaStrategy, StepsInFlightMatchOneAtATime) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("needs a CUDA device");
  const int64_t zero = GetParam();
  std::vector<double> expected_losses, losses;
  const auto expected = train(Device::cuda(0), "auto", zero, true, 1, &expected_losses);
  const auto actual = train(Device::cuda(0), "auto", zero, true, 2, &losses);
  ASSERT_EQ(losses.size(), expected_losses.size());
  for (size_t k = 0; k < losses.size(); ++k) EXPECT_NEAR(losses[k], expected_losses[k], 1e-6 * expected_losses[k]) << k;
  for (const auto& [name, tensor] : actual) {
    EXPECT_LE(testing::relative_error(tensor, expected.at(name)), 1e-6) << "zero " << zero << " " << name;
  }
}

// train.on_nan: skip with two steps in flight on the GPU: step 3 is issued before step 2 (NaN) is
// read, and its AdamW update takes the counts the skip leaves from step 2's guard on the device. The
// same losses and weights as one step at a time (with the counts one too high, AdamW's third
// update would be about 30% smaller).
TEST_P(CudaStrategy, StepsInFlightWithASkippedStepMatchOneAtATime) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("needs a CUDA device");
  const int64_t zero = GetParam();
  std::vector<double> expected_losses, losses;
  std::vector<bool> expected_skipped, skipped;
  const auto expected = train(Device::cuda(0), "auto", zero, true, 1, &expected_losses, 2, &expected_skipped);
  const auto actual = train(Device::cuda(0), "auto", zero, true, 2, &losses, 2, &skipped);
  const std::vector<bool> only_step_2 = {false, true, false, false};
  EXPECT_EQ(expected_skipped, only_step_2);
  EXPECT_EQ(skipped, only_step_2);
  ASSERT_EQ(losses.size(), expected_losses.size());
  for (size_t k = 0; k < losses.size(); ++k) {
    if (k != 1) EXPECT_NEAR(losses[k], expected_losses[k], 1e-6 * expected_losses[k]) << k;
  }
  for (const auto& [name, tensor] : actual) {
    EXPECT_LE(testing::relative_error(tensor, expected.at(name)), 1e-6) << "zero " << zero << " " << name;
  }
}

// Each segment's weight-gradient products on a second stream (parallel/step/weight_gradient_overlap.h):
// the bits of the products on the compute stream, one step at a time and two in flight, in both
// comm modes. A missing wait would let a product read a dY the next segment's backward has already
// overwritten (its memory handed out again), or the optimizer read a gradient not yet accumulated.
TEST(CudaWeightGradientStream, MatchesTheProductsOnTheComputeStream) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("needs a CUDA device");
  const auto expected = train(Device::cuda(0), "manual", 0, false);
  for (const std::string mode : {"manual", "auto"}) {
    for (const int in_flight : {1, 2}) {
      const int64_t launched = weight_gradient_items_launched_for_testing();
      const auto actual = train(Device::cuda(0), mode, 0, false, in_flight, nullptr, 0, nullptr, true);
      EXPECT_GT(weight_gradient_items_launched_for_testing(), launched) << "the products were not deferred";
      for (const auto& [name, tensor] : actual) {
        EXPECT_EQ(tensor.to_vector(), expected.at(name).to_vector()) << mode << " in flight " << in_flight << " " << name;
      }
    }
  }
  // With collectives (here a group of one) the strategy keeps the products on the compute stream.
  const int64_t launched = weight_gradient_items_launched_for_testing();
  train(Device::cuda(0), "auto", 0, true, 1, nullptr, 0, nullptr, true);
  EXPECT_EQ(weight_gradient_items_launched_for_testing(), launched);
}

INSTANTIATE_TEST_SUITE_P(ZeroStages, CudaStrategy, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return "zero" + std::to_string(info.param);
                         });

#ifdef WEFT_HAVE_CUDA

// Holds a CUDA stream at a host function until open() (cudaLaunchHostFunc), so that what is queued
// behind it is certainly not done yet. The host function makes no CUDA call. It opens by itself
// after 30 s, so that a CUDA call that waits for the whole device while it is closed fails the
// test instead of hanging it.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) {
    EXPECT_EQ(cudaLaunchHostFunc(stream, &StreamGate::hold, this), cudaSuccess);
  }
  void open() { open_ = true; }

 private:
  static void CUDART_CB hold(void* gate) {
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!static_cast<StreamGate*>(gate)->open_.load() && std::chrono::steady_clock::now() < limit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::atomic<bool> open_{false};
};

int64_t allocated_bytes() { return cuda::memory_stats(0).allocated_bytes; }

TEST(CudaLocalProcessGroup, HoldsACopysTensorsUntilTheCopyOnItsStreamIsDone) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("needs a CUDA device");
  const Device gpu = Device::cuda(0);
  auto group = std::make_shared<LocalProcessGroup>(gpu, "dp");
  // First use out of the way (the handles' clock reference), so that nothing below synchronizes.
  group->barrier(CommStream())->synchronize();
  cuda::Stream side(0);
  const int64_t before = allocated_bytes();
  const int64_t elements = int64_t{1} << 20;  // 4 MiB each, a whole number of size classes
  {
    StreamGate gate(side.get());
    {
      const Tensor input = Tensor::full({elements}, 1.5, kFloat32, gpu);
      const Tensor output = Tensor::empty({elements}, kFloat32, gpu);
      group->all_gather(input, output, CommStream::cuda(side.get(), 0));  // the handle is dropped at once
    }
    // The copy waits behind the gate: its tensors must still be allocated.
    EXPECT_EQ(allocated_bytes(), before + 2 * elements * 4) << "a copy's tensors were freed before the copy ran";
    EXPECT_EQ(group->in_flight_count(), 1u) << "the copy's handle (the first barrier was done, and let go)";
    gate.open();
    side.synchronize();
  }
  // The next collective lets go of the finished copy.
  group->barrier(CommStream())->synchronize();
  EXPECT_EQ(allocated_bytes(), before);
  EXPECT_EQ(group->in_flight_count(), 1u) << "only the barrier's own handle";
}

#ifdef WEFT_HAVE_NCCL

// MPI's singleton world (no mpirun), made once and finalized at exit.
MpiEnvironment& mpi_environment() {
  static MpiEnvironment environment;
  return environment;
}

TEST(CudaNcclProcessGroup, OneRankGroupKeysCommunicatorsByStreamIdAndReleasesHandles) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("needs a CUDA device");
  const Device gpu = Device::cuda(0);
  mpi_environment();
  MPI_Comm comm = MPI_COMM_NULL;
  {
    MpiCallLock lock;
    ASSERT_EQ(MPI_Comm_dup(MPI_COMM_SELF, &comm), MPI_SUCCESS);
  }
  auto group = std::make_shared<NcclProcessGroup>(comm, "dp", std::vector<int>{mpi_world_rank()}, 0);
  Tensor tensor = Tensor::full({1024}, 2.0, kFloat32, gpu);
  // Created under the deadline (nonblocking init, polled), then used on the caller's stream.
  group->all_reduce(tensor, Reduction::kSum, CommStream())->synchronize();
  EXPECT_EQ(group->communicator_count(), 1u);
  {
    cuda::Stream side(0);
    group->all_reduce(tensor, Reduction::kAverage, CommStream::cuda(side.get(), 0))->synchronize();
    EXPECT_EQ(group->communicator_count(), 2u);
  }
  // The side stream is gone: its communicator is set aside, never to be found again.
  EXPECT_EQ(group->communicator_count(), 1u);
  EXPECT_EQ(group->retired_communicator_count(), 1u);
  {
    // A new stream, whatever handle CUDA gives it, gets a communicator of its own.
    cuda::Stream next(0);
    group->broadcast(tensor, 0, CommStream::cuda(next.get(), 0))->synchronize();
    EXPECT_EQ(group->communicator_count(), 2u);
    EXPECT_EQ(group->retired_communicator_count(), 1u);
  }
  EXPECT_EQ(tensor.to(Device::cpu()).at({1023}), 2.0) << "sum, average and broadcast over one rank";
  // A dropped handle's tensor lives until the watchdog sees the collective done (on its thread,
  // outside its lock), then goes.
  const int64_t before = allocated_bytes();
  {
    const Tensor big = Tensor::full({int64_t{1} << 20}, 1.0, kFloat32, gpu);
    group->all_reduce(big, Reduction::kSum, CommStream());
  }
  cudaDeviceSynchronize();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (allocated_bytes() != before && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(allocated_bytes(), before) << "the watchdog kept a finished collective's tensor";
  group.reset();  // finalizes and destroys the three communicators within the deadline
}

#endif  // WEFT_HAVE_NCCL
#endif  // WEFT_HAVE_CUDA

}  // namespace
}  // namespace weft
