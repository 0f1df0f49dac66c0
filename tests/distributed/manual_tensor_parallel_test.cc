// The manual comm mode's tensor- and sequence-parallel GPT and Llama (parallel/manual/) under mpirun
// -np 2 and 4, against the one-process build_model(config) at f64: the gathered logits, the
// vocabulary-parallel loss against cross_entropy, and every parameter's gradient (gathered from the
// shards, or summed over tp where it is partial), with and without sequence parallelism, with
// dropout in training mode, on the world as the tp group and (at 4 ranks) on the tp groups of a
// dp 2 x tp 2 mesh, on the caller stream and on a comm thread. At tp = 1 the logits equal
// build_model's bit for bit (the weights and dropout masks are drawn in the same order). Segments
// are GptModel's. The factory's config errors are checked on a group that only has a size.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "layers/language_model.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/process_group.h"
#include "parallel/manual/tensor_parallel_gpt.h"
#include "parallel/mesh.h"
#include "parallel/tensor/sharding.h"
#include "parallel/tensor/vocab_parallel.h"
#include "runtime/error.h"
#include "runtime/ops/loss.h"
#include "tests/support/error_expectations.h"
#include "tests/support/gradient_check.h"

namespace weft {
namespace {

using testing::max_abs_difference;

constexpr double kTolerance = 1e-12;

ModelConfig gpt_test_config() {  // learned positions, layer_norm, gelu_mlp, tied, biases
  ModelConfig config;
  config.type = "gpt";
  config.layers = 2;
  config.dim = 32;
  config.heads = 4;
  config.vocab = 64;
  config.seq_len = 8;
  config.init_std = 0.1;
  config.seed = 7;
  return config;
}

ModelConfig llama_test_config() {  // rope, rms_norm, swiglu_mlp, untied, no biases, 4 kv heads for 8
  ModelConfig config = gpt_test_config();
  config.type = "llama";
  config.heads = 8;
  config.kv_heads = 4;
  return config;
}

// ids [2, 8] and targets [2, 8] (one ignored), the same on every rank.
Tensor test_ids(int64_t vocab) {
  std::vector<int64_t> values;
  for (int64_t i = 0; i < 16; ++i) values.push_back((i * 37 + 5) % vocab);
  return Tensor::from_vector(values, {2, 8}, kInt64);
}
Tensor test_targets(int64_t vocab) {
  std::vector<int64_t> values;
  for (int64_t i = 0; i < 16; ++i) values.push_back(i == 3 ? -100 : (i * 11 + 2) % vocab);
  return Tensor::from_vector(values, {2, 8}, kInt64);
}

bool expect_partial(const std::string& name, bool sequence_parallel) {
  const bool norm = name.find("norm") != std::string::npos;
  const bool row_bias = name.ends_with("proj.bias") || name.ends_with("down.bias");
  return sequence_parallel && (norm || row_bias);
}

// The tp model against one process: logits, loss and every gradient at f64.
void expect_matches_one_process(const ModelConfig& config, const TensorParallelGroup& tp, bool sequence_parallel) {
  SCOPED_TRACE(config.type + (sequence_parallel ? " sequence parallel" : "") + " tp " + std::to_string(tp.size()) +
               " dropout " + std::to_string(config.dropout));
  std::shared_ptr<LanguageModel> reference = build_model(config);
  reference->to(kFloat64);
  std::shared_ptr<LanguageModel> model = build_tensor_parallel_model(config, tp, sequence_parallel);
  model->to(kFloat64);
  const Tensor ids = test_ids(config.vocab), targets = test_targets(config.vocab);
  const int64_t local_vocab = config.vocab / tp.size();

  const Tensor expected_logits = reference->logits(ids);  // [B, T, V]
  const Tensor logits = model->logits(ids);                // [B, T, V/N]
  ASSERT_EQ(logits.shape(), Shape({2, 8, local_vocab}));
  EXPECT_LT(max_abs_difference(gather_full(logits, Layout::split(-1), tp), expected_logits), kTolerance);

  const Tensor expected_loss = cross_entropy(expected_logits.reshape({-1, config.vocab}), targets.reshape({-1}));
  const Tensor loss = vocab_parallel_cross_entropy(logits.reshape({-1, local_vocab}), targets.reshape({-1}), -100,
                                                   15, tp);
  EXPECT_NEAR(loss.item(), expected_loss.item(), kTolerance);
  expected_loss.backward();
  loss.backward();

  std::map<std::string, Tensor> expected_gradients;
  for (const NamedParameter& parameter : reference->named_parameters()) {
    expected_gradients[parameter.name] = parameter.tensor.grad();
  }
  const std::vector<NamedParameter> parameters = model->named_parameters();
  EXPECT_EQ(parameters.size(), expected_gradients.size());
  for (const NamedParameter& parameter : parameters) {
    ASSERT_TRUE(expected_gradients.contains(parameter.name)) << parameter.name;
    EXPECT_EQ(parameter.partial_gradient, expect_partial(parameter.name, sequence_parallel)) << parameter.name;
    const Tensor gradient = parameter.tensor.grad();
    ASSERT_TRUE(gradient.defined()) << parameter.name;
    Tensor full = parameter.partial_gradient ? gradient.clone() : gather_full(gradient, parameter.layout, tp);
    if (parameter.partial_gradient) tp.group->all_reduce(full, Reduction::kSum, tp.stream)->wait();
    EXPECT_LT(max_abs_difference(full, expected_gradients[parameter.name]), kTolerance) << parameter.name;
  }
}

enum class GroupKind { kWorldCaller, kWorldThread, kMeshCaller, kMeshThread };

class ManualTensorParallel : public ::testing::TestWithParam<GroupKind> {
 protected:
  void SetUp() override {
    const GroupKind kind = GetParam();
    const bool mesh = kind == GroupKind::kMeshCaller || kind == GroupKind::kMeshThread;
    if (mesh && mpi_world_size() != 4) GTEST_SKIP() << "the dp 2 x tp 2 mesh needs 4 ranks";
    std::shared_ptr<ProcessGroup> group = mesh ? make_process_group(Mesh(2, 1, 2, 4), Axis::kTensor, Device::cpu())
                                               : make_world_process_group(Device::cpu());
    const bool thread = kind == GroupKind::kWorldThread || kind == GroupKind::kMeshThread;
    tp = {group, thread ? CommStream::cpu("tp_comm") : CommStream()};
  }
  TensorParallelGroup tp;
};

TEST_P(ManualTensorParallel, GptMatchesOneProcess) {
  for (bool sequence_parallel : {false, true}) expect_matches_one_process(gpt_test_config(), tp, sequence_parallel);
}

TEST_P(ManualTensorParallel, LlamaMatchesOneProcess) {
  for (bool sequence_parallel : {false, true}) expect_matches_one_process(llama_test_config(), tp, sequence_parallel);
}

TEST_P(ManualTensorParallel, DropoutInTrainingMatchesOneProcess) {
  for (ModelConfig config : {gpt_test_config(), llama_test_config()}) {
    config.dropout = 0.1;
    for (bool sequence_parallel : {false, true}) expect_matches_one_process(config, tp, sequence_parallel);
  }
}

TEST_P(ManualTensorParallel, SegmentsAreGptModelsAndComposeToTheLogits) {
  for (const ModelConfig& config : {gpt_test_config(), llama_test_config()}) {
    std::shared_ptr<LanguageModel> model = build_tensor_parallel_model(config, tp, true);
    const std::vector<ModelSegment> segments = model->segments();
    const std::vector<ModelSegment> expected = build_model(config)->segments();
    ASSERT_EQ(segments.size(), expected.size());
    for (size_t index = 0; index < segments.size(); ++index) {
      EXPECT_EQ(segments[index].name, expected[index].name);
      EXPECT_EQ(segments[index].parameters, expected[index].parameters) << segments[index].name;
    }
    const Tensor ids = test_ids(config.vocab);
    EXPECT_EQ(max_abs_difference(run_segments(segments, ids), model->logits(ids)), 0.0) << config.type;
  }
}

INSTANTIATE_TEST_SUITE_P(Groups, ManualTensorParallel,
                         ::testing::Values(GroupKind::kWorldCaller, GroupKind::kWorldThread, GroupKind::kMeshCaller,
                                           GroupKind::kMeshThread),
                         [](const ::testing::TestParamInfo<GroupKind>& info) {
                           switch (info.param) {
                             case GroupKind::kWorldCaller: return "WorldCallerStream";
                             case GroupKind::kWorldThread: return "WorldCommThread";
                             case GroupKind::kMeshCaller: return "MeshTensorAxisCallerStream";
                             case GroupKind::kMeshThread: return "MeshTensorAxisCommThread";
                           }
                           return "Unknown";
                         });

TEST(ManualTensorParallelOfOne, LogitsEqualBuildModelBitForBit) {
  const TensorParallelGroup tp{make_local_process_group(Device::cpu()), CommStream()};
  for (ModelConfig config : {gpt_test_config(), llama_test_config()}) {
    for (double dropout : {0.0, 0.1}) {
      for (bool sequence_parallel : {false, true}) {
        config.dropout = dropout;
        const Tensor ids = test_ids(config.vocab);
        const Tensor expected = build_model(config)->logits(ids);  // training mode
        const Tensor logits = build_tensor_parallel_model(config, tp, sequence_parallel)->logits(ids);
        EXPECT_EQ(max_abs_difference(logits, expected), 0.0)
            << config.type << " dropout " << dropout << (sequence_parallel ? " sequence parallel" : "");
      }
    }
  }
}

// A group with a size and no transport: what the factory's checks need, without that many ranks.
class SizeOnlyGroup final : public ProcessGroup {
 public:
  explicit SizeOnlyGroup(int size) : size_(size), world_ranks_(static_cast<size_t>(size)) {}
  int size() const override { return size_; }
  int rank() const override { return 0; }
  const std::string& name() const override { return name_; }
  Device device() const override { return Device::cpu(); }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  CollectiveHandlePtr all_reduce(const Tensor&, Reduction, const CommStream&) override { return refuse(); }
  CollectiveHandlePtr reduce_scatter(const Tensor&, const Tensor&, Reduction, const CommStream&) override {
    return refuse();
  }
  CollectiveHandlePtr all_gather(const Tensor&, const Tensor&, const CommStream&) override { return refuse(); }
  CollectiveHandlePtr broadcast(const Tensor&, int, const CommStream&) override { return refuse(); }
  CollectiveHandlePtr send(const Tensor&, int, const CommStream&) override { return refuse(); }
  CollectiveHandlePtr recv(const Tensor&, int, const CommStream&) override { return refuse(); }
  CollectiveHandlePtr exchange(const Tensor&, int, const Tensor&, int, const CommStream&) override { return refuse(); }
  CollectiveHandlePtr barrier(const CommStream&) override { return refuse(); }

 private:
  static CollectiveHandlePtr refuse() { throw Error("SizeOnlyGroup has no transport"); }
  int size_;
  std::string name_ = "tp";
  std::vector<int> world_ranks_;
};

std::string build_error(ModelConfig config, int tp_size, bool sequence_parallel = false) {
  const TensorParallelGroup tp{std::make_shared<SizeOnlyGroup>(tp_size), CommStream()};
  return testing::error_message([&] { build_tensor_parallel_model(config, tp, sequence_parallel); });
}

TEST(ManualTensorParallelConfig, ErrorsNameTheKeyAndTheSizesThatFit) {
  EXPECT_EQ(build_error(gpt_test_config(), 3), "parallel.tp = 3 does not divide model.heads = 4; use tp 1, 2 or 4");
  ModelConfig llama = llama_test_config();
  llama.kv_heads = 2;
  EXPECT_EQ(build_error(llama, 4), "parallel.tp = 4 does not divide model.kv_heads = 2; use tp 1 or 2");
  ModelConfig vocab = gpt_test_config();
  vocab.vocab = 66;
  EXPECT_EQ(build_error(vocab, 4), "parallel.tp = 4 does not divide model.vocab = 66; use tp 1 or 2");
  ModelConfig hidden = gpt_test_config();
  hidden.hidden_dim = 130;
  EXPECT_EQ(build_error(hidden, 4), "parallel.tp = 4 does not divide model.hidden_dim = 130; use tp 1 or 2");
  ModelConfig sequence = gpt_test_config();
  sequence.seq_len = 6;
  EXPECT_EQ(build_error(sequence, 4, true),
            "parallel.tp = 4 does not divide model.seq_len = 6 (sequence parallelism splits it); use tp 1 or 2");
  EXPECT_NO_THROW(build_tensor_parallel_model(sequence, {std::make_shared<SizeOnlyGroup>(4), CommStream()}, false));
}

TEST(ManualTensorParallelConfig, UnsupportedLayersAndModelsAreRefused) {
  ModelConfig custom = gpt_test_config();
  custom.mlp = "squared_relu_mlp";
  testing::expect_contains(build_error(custom, 2), {"model.mlp = 'squared_relu_mlp'", "comm.mode: manual",
                                                   "comm.mode: auto", "declared layout"});
  ModelConfig other = gpt_test_config();
  other.type = "mamba";
  testing::expect_contains(build_error(other, 2), {"model.type = 'mamba'", "gpt and llama"});
  ModelConfig invalid = gpt_test_config();
  invalid.heads = 5;
  testing::expect_contains(build_error(invalid, 1), {"model.heads = 5 does not divide model.dim = 32"});
}

}  // namespace
}  // namespace weft
