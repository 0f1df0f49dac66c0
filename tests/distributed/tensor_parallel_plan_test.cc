// The auto comm mode's tensor parallelism (parallel/tensor/tensor_parallel_plan.h) under mpirun
// -np 2 and -np 4: the plain layers of layers/ split by their declared plans over the world (and,
// at 4 ranks, over the tp groups of a dp 2 x tp 2 mesh), against the one-process model at f64 —
// the gathered logits, the vocabulary-parallel loss, and every parameter's gradient (partial ones
// summed over tp, split ones gathered) — for a GPT and a Llama, with and without sequence
// parallelism, with dropout; plus the plan's overrides and its errors.
#include <cmath>

#include "gtest/gtest.h"
#include "layers/language_model.h"
#include "parallel/comm/mpi_environment.h"
#include "parallel/mesh.h"
#include "parallel/tensor/sharding.h"
#include "parallel/tensor/tensor_parallel_plan.h"
#include "parallel/tensor/vocab_parallel.h"
#include "runtime/weft.h"
#include "tests/support/random_token_ids.h"

namespace weft {
namespace {

constexpr int64_t kBatch = 2, kSequence = 8;

ModelConfig model_config(const std::string& type, int tp) {
  ModelConfig config;
  config.type = type;
  config.layers = 2;
  config.dim = 16;
  config.heads = 4;
  config.vocab = 24;
  config.seq_len = kSequence;
  config.init_std = 0.3;
  config.seed = 3;
  if (type == "llama") {
    config.norm = "rms_norm";
    config.mlp = "swiglu_mlp";
    config.positions = "rope";
    config.bias = false;
    config.tie_embeddings = false;
    config.kv_heads = tp > 2 ? tp : 2;  // grouped-query attention where tp allows
  }
  return config;
}

Tensor ids(uint64_t offset) { return testing::random_token_ids({kBatch, kSequence}, 24, 11, offset); }

double max_relative_difference(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  EXPECT_EQ(x.size(), y.size());
  double worst = 0, scale = 1e-12;
  for (double value : y) scale = std::max(scale, std::abs(value));
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]) / scale);
  return worst;
}

struct Case {
  std::string type;
  bool sequence_parallel;
  double dropout;
};

class TensorParallelPlan : public ::testing::TestWithParam<Case> {};

void check_against_one_process(const Case& c, const TensorParallelGroup& tp) {
  ModelConfig config = model_config(c.type, tp.size());
  config.dropout = c.dropout;
  std::shared_ptr<LanguageModel> reference = build_model(config);
  reference->to(kFloat64);
  std::shared_ptr<LanguageModel> model = build_model(config);
  const std::vector<AppliedPlanEntry> applied = apply_tensor_parallel_plan(*model, tp, c.sequence_parallel, {});
  EXPECT_FALSE(applied.empty());
  model->to(kFloat64);
  const std::vector<ModelSegment> segments = tensor_parallel_segments(model->segments(), tp, c.sequence_parallel);

  for (uint64_t step = 0; step < 2; ++step) {  // twice: dropout masks move on alike
    const Tensor inputs = ids(step * 100), targets = ids(step * 100 + 50);
    const Tensor expected_logits = reference->logits(inputs);                       // [B, T, V]
    const Tensor expected_loss = cross_entropy(expected_logits.reshape({-1, config.vocab}), targets.reshape({-1}));
    expected_loss.backward();
    const Tensor logits = run_segments(segments, inputs);                            // [B, T, V / tp]
    ASSERT_EQ(logits.size(-1), config.vocab / tp.size());
    const Tensor loss = vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), -100,
                                                     targets.numel(), tp);
    loss.backward();
    EXPECT_NEAR(loss.item(), expected_loss.item(), 1e-10);
    EXPECT_LT(max_relative_difference(gather_full(logits.detach().contiguous(), Layout::split(-1), tp), expected_logits),
              1e-10);
  }
  const std::map<std::string, Tensor> expected = reference->state_dict();
  for (const NamedParameter& parameter : model->named_parameters()) {
    Tensor gradient = parameter.tensor.grad().clone();
    if (parameter.partial_gradient) tp.group->all_reduce(gradient, Reduction::kSum, tp.stream)->wait();
    const Tensor full = gather_full(gradient, parameter.layout, tp);
    const Tensor reference_gradient = expected.at(parameter.name).grad();
    ASSERT_EQ(full.shape(), reference_gradient.shape()) << parameter.name;
    EXPECT_LT(max_relative_difference(full, reference_gradient), 1e-9) << parameter.name << " "
                                                                        << parameter.layout.to_string();
  }
}

TEST_P(TensorParallelPlan, MatchesOneProcessOverTheWorld) {
  const TensorParallelGroup tp{make_world_process_group(Device::cpu()), CommStream::cpu("tp_comm")};
  tp.group->barrier(tp.stream)->synchronize();
  check_against_one_process(GetParam(), tp);
}

TEST_P(TensorParallelPlan, MatchesOneProcessOverTheTpGroupsOfADataParallelMesh) {
  const int world = MpiEnvironment::current()->world_size();
  if (world != 4) GTEST_SKIP() << "needs 4 ranks for dp 2 x tp 2";
  const Mesh mesh(2, 1, 2, world);
  const TensorParallelGroup tp{make_process_group(mesh, Axis::kTensor, Device::cpu()), CommStream()};
  check_against_one_process(GetParam(), tp);
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelPlan,
                         ::testing::Values(Case{"gpt", false, 0.0}, Case{"gpt", true, 0.0}, Case{"llama", false, 0.0},
                                         Case{"llama", true, 0.0}, Case{"gpt", true, 0.2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.type + (info.param.sequence_parallel ? "_sp" : "") +
                                  (info.param.dropout > 0 ? "_dropout" : "");
                         });

TEST(TensorParallelPlanErrors, OverridesMustNameModulesAndFitTheirStyle) {
  const TensorParallelGroup tp{make_world_process_group(Device::cpu()), CommStream()};
  std::shared_ptr<LanguageModel> model = build_model(model_config("gpt", tp.size()));
  try {
    apply_tensor_parallel_plan(*model, tp, false, {{"blocks.*.mlp.nothing", "column"}});
    FAIL() << "an override naming no module was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("names no module"), std::string::npos) << error.what();
  }
  model = build_model(model_config("gpt", tp.size()));
  try {
    apply_tensor_parallel_plan(*model, tp, false, {{"blocks.*.norm1", "column"}});
    FAIL() << "a column style on a norm was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("Linear layer"), std::string::npos) << error.what();
  }
}

TEST(TensorParallelPlanErrors, AnOverrideReplacesADeclaredStyle) {
  // The MLP's fc declared column-wise, overridden to stay whole (a replicated Linear is what a
  // "sequence" entry leaves it): its weight keeps the full shape.
  const TensorParallelGroup tp{make_world_process_group(Device::cpu()), CommStream()};
  std::shared_ptr<LanguageModel> model = build_model(model_config("gpt", tp.size()));
  apply_tensor_parallel_plan(*model, tp, false, {{"blocks.0.mlp.proj", "sequence"}, {"blocks.0.mlp.fc", "sequence"}});
  int checked = 0;
  for (const NamedParameter& parameter : model->named_parameters()) {
    if (parameter.name == "blocks.0.mlp.fc.weight") {
      EXPECT_EQ(parameter.tensor.size(0), 64);  // the override kept it whole
      ++checked;
    }
    if (parameter.name == "blocks.1.mlp.fc.weight") {
      EXPECT_EQ(parameter.tensor.size(0), 64 / tp.size());  // the declared column split
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2);
}

TEST(TensorParallelPlanAtOneRank, ChangesNothing) {
  const TensorParallelGroup tp{make_local_process_group(Device::cpu()), CommStream()};
  ModelConfig config = model_config("gpt", 1);
  std::shared_ptr<LanguageModel> reference = build_model(config);
  std::shared_ptr<LanguageModel> model = build_model(config);
  EXPECT_TRUE(apply_tensor_parallel_plan(*model, tp, true, {}).empty());
  const Tensor inputs = ids(0);
  EXPECT_EQ(run_segments(tensor_parallel_segments(model->segments(), tp, true), inputs).to_vector(),
            reference->logits(inputs).to_vector());
}

}  // namespace
}  // namespace weft
