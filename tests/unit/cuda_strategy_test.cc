// The data-parallel strategy on one GPU with its collectives on a second stream: with
// collectives_for_one_rank the group of one still runs every bucket's all-reduce or reduce-scatter
// (a copy into the shard for ZeRO 2) and every ZeRO all-gather, in the auto mode on the executor's
// dp_comm CUDA stream, ordered against backward and the optimizer only by events. A missing wait
// would let a copy read a bucket backward has not finished, and the weights would differ from the
// same steps on the CPU. Skipped where no CUDA device is present.
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "layers/language_model.h"
#include "parallel/strategy.h"
#include "runtime/weft.h"
#include "tests/support/cuda_expectations.h"
#include "tests/support/gradient_check.h"
#include "tests/support/small_model_config.h"

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

std::map<std::string, Tensor> train(Device device, const std::string& mode, int64_t zero, bool collectives) {
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
  options.make_optimizer = [](std::vector<ParameterGroup> groups) {
    // SGD: a rounding difference stays a rounding difference (AdamW's first steps are sign-like).
    return make_sgd(std::move(groups), {0.9, false});
  };
  std::unique_ptr<Strategy> strategy = make_strategy(Mesh(1, 1, 1, 1), 0, *model, options);
  for (int64_t step = 1; step <= kSteps; ++step) strategy->step(step, 0.5, batches(step));
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

INSTANTIATE_TEST_SUITE_P(ZeroStages, CudaStrategy, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return "zero" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace weft
