// The segmented step in one process: the gradient buffer's views and in-place accumulation, the
// step graph the strategy builds for each comm mode, and one-process training through the strategy
// against the plain loop (loss.backward(), clip, update) it replaces, for a cut model and for a
// custom model that is one segment.
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "layers/language_model.h"
#include "layers/embedding.h"
#include "layers/linear.h"
#include "optim/gradient_clipping.h"
#include "parallel/data/data_parallel_strategy.h"
#include "parallel/data/gradient_buffer.h"
#include "parallel/strategy.h"
#include "parallel/step/weight_gradient_overlap.h"
#include "runtime/weft.h"
#include "tests/support/random_token_ids.h"
#include "tests/support/gradient_check.h"
#include "tests/support/small_model_config.h"

namespace weft {
namespace {

ModelConfig model_config() {
  ModelConfig config = testing::small_model_config();
  config.vocab = 16;
  config.init_std = 0.1;
  return config;
}

MicroBatch micro_batch(uint64_t offset) {
  const ModelConfig config = model_config();
  const Tensor all = testing::random_token_ids({2, config.seq_len + 1}, config.vocab, 7, offset);
  return {all.narrow(1, 0, config.seq_len).contiguous(), all.narrow(1, 1, config.seq_len).contiguous()};
}

// SGD: the segmented backward sums some gradients in another order than the whole-model one, and
// AdamW's first steps are sign-like (lr * g / |g|), so a k-bias gradient that is rounding noise
// (softmax does not see it) would move by 2 lr; SGD keeps a rounding difference a rounding difference.
StrategyOptions options(const std::string& mode, int64_t micro_batches = 1) {
  StrategyOptions options;
  options.comm_mode = mode;
  options.micro_batches = micro_batches;
  options.grad_clip = 0.5;
  options.weight_decay = 0.1;
  options.bucket_bytes = 512;
  options.make_optimizer = [](std::vector<ParameterGroup> groups) {
    return make_sgd(std::move(groups), {0.9, false});
  };
  return options;
}

TEST(GradientBuffer, GradientsAreViewsOfBucketsInBackwardOrderAndAccumulateInPlace) {
  std::shared_ptr<LanguageModel> model = build_model(model_config());
  const std::vector<NamedParameter> parameters = model->named_parameters();
  GradientBuffer buffer(parameters, /*bucket_bytes=*/256, /*pad_multiple=*/4);
  buffer.attach();
  ASSERT_GT(buffer.buckets().size(), 2u);
  // Backward order: the last registered parameter opens the first bucket, the first closes the last.
  EXPECT_EQ(buffer.buckets().front().slots.front().parameter, parameters.size() - 1);
  EXPECT_EQ(buffer.buckets().back().slots.back().parameter, 0u);
  std::set<size_t> seen;
  for (const GradientBuffer::Bucket& bucket : buffer.buckets()) {
    EXPECT_EQ(bucket.padded_elements % 4, 0);
    EXPECT_GE(bucket.padded_elements, bucket.elements);
    for (const GradientBuffer::Slot& slot : bucket.slots) EXPECT_TRUE(seen.insert(slot.parameter).second);
  }
  EXPECT_EQ(seen.size(), parameters.size());
  // Two backward passes accumulate into the buckets themselves: .grad still aliases the slot.
  const MicroBatch batch = micro_batch(0);
  loss(*model, batch.inputs, batch.targets).backward();
  loss(*model, batch.inputs, batch.targets).backward();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Tensor grad = parameters[i].tensor.grad();
    const GradientBuffer::Slot& slot = buffer.slot_of(i);
    const Tensor view = buffer.buckets()[buffer.bucket_of(i)].data.narrow(0, slot.offset, slot.elements);
    EXPECT_EQ(grad.data<float>(), view.data<float>()) << parameters[i].name << " no longer in its bucket";
  }
  const double before = clip_grad_norm(model->parameters(), 0.0);
  EXPECT_GT(before, 0.0);
  buffer.zero();
  EXPECT_EQ(clip_grad_norm(model->parameters(), 0.0), 0.0);
  EXPECT_TRUE(parameters[0].tensor.grad().defined());
}

// A Llama's gate and up weights (one gradient group: swiglu_linear writes both gradients with one
// product) share a bucket, up's slot right before gate's, even with buckets of one parameter each;
// the gradients of two backward passes still equal the unbuffered model's.
TEST(GradientBuffer, KeepsAGradientGroupNextToEachOther) {
  ModelConfig config = model_config();
  config.type = "llama";
  std::shared_ptr<LanguageModel> model = build_model(config);
  std::shared_ptr<LanguageModel> reference = build_model(config);
  const std::vector<NamedParameter> parameters = model->named_parameters();
  GradientBuffer buffer(parameters, /*bucket_bytes=*/4, /*pad_multiple=*/1);
  buffer.attach();
  int groups = 0;
  for (size_t i = 0; i + 1 < parameters.size(); ++i) {
    if (parameters[i].name.find("mlp.gate.weight") == std::string::npos) {
      EXPECT_TRUE(parameters[i].gradient_group.empty() ||
                  parameters[i].name.find("mlp.up.weight") != std::string::npos) << parameters[i].name;
      continue;
    }
    ++groups;
    ASSERT_NE(parameters[i + 1].name.find("mlp.up.weight"), std::string::npos) << parameters[i + 1].name;
    EXPECT_FALSE(parameters[i].gradient_group.empty());
    EXPECT_EQ(parameters[i].gradient_group, parameters[i + 1].gradient_group);
    ASSERT_EQ(buffer.bucket_of(i), buffer.bucket_of(i + 1)) << parameters[i].name;
    EXPECT_EQ(buffer.slot_of(i).offset, buffer.slot_of(i + 1).offset + buffer.slot_of(i + 1).elements);
  }
  EXPECT_EQ(groups, config.layers);
  // Every other parameter has a bucket of its own (4 bytes is less than any parameter).
  EXPECT_EQ(buffer.buckets().size(), parameters.size() - static_cast<size_t>(groups));
  const MicroBatch batch = micro_batch(0);
  for (int pass = 0; pass < 2; ++pass) {
    loss(*model, batch.inputs, batch.targets).backward();
    loss(*reference, batch.inputs, batch.targets).backward();
  }
  const std::vector<NamedParameter> expected = reference->named_parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_LT(testing::max_abs_difference(parameters[i].tensor.grad(), expected[i].tensor.grad()), 1e-5)
        << parameters[i].name;
  }
}

// zero() writes nothing: stale contents (NaN here, which an add would carry) are overwritten by
// the next backward's first contribution (the weight-gradient GEMMs with beta = 0, the norms'
// kernels, the embedding's accumulate) and added to by the next; materialize() writes a slot's zeros
// only where nothing arrived.
TEST(GradientBuffer, LazyZeroingGivesTheGradientsOfZeroedBuckets) {
  std::shared_ptr<LanguageModel> model = build_model(model_config());
  const std::vector<NamedParameter> parameters = model->named_parameters();
  GradientBuffer buffer(parameters, /*bucket_bytes=*/256, /*pad_multiple=*/4);
  buffer.attach();
  const MicroBatch batch = micro_batch(0);
  loss(*model, batch.inputs, batch.targets).backward();  // into the buckets as constructed: zeros
  std::vector<std::vector<double>> once;
  for (const NamedParameter& parameter : parameters) once.push_back(parameter.tensor.grad().to_vector());
  auto fill_slots_with_nan = [&] {
    for (size_t i = 0; i < parameters.size(); ++i) {
      parameters[i].tensor.grad().fill_(std::numeric_limits<double>::quiet_NaN());
    }
  };
  fill_slots_with_nan();
  buffer.zero();
  loss(*model, batch.inputs, batch.targets).backward();
  for (size_t b = 0; b < buffer.buckets().size(); ++b) buffer.materialize(b);
  for (size_t i = 0; i < parameters.size(); ++i) {
    const GradientBuffer::Slot& slot = buffer.slot_of(i);
    const Tensor view = buffer.buckets()[buffer.bucket_of(i)].data.narrow(0, slot.offset, slot.elements);
    EXPECT_EQ(view.to_vector(), once[i]) << parameters[i].name;
  }
  // Two micro-batches: the first writes, the second adds, as into buckets of written zeros.
  for (const NamedParameter& parameter : parameters) parameter.tensor.grad().zero_();
  loss(*model, batch.inputs, batch.targets).backward();
  loss(*model, batch.inputs, batch.targets).backward();
  std::vector<std::vector<double>> twice;
  for (const NamedParameter& parameter : parameters) twice.push_back(parameter.tensor.grad().to_vector());
  fill_slots_with_nan();
  buffer.zero();
  loss(*model, batch.inputs, batch.targets).backward();
  loss(*model, batch.inputs, batch.targets).backward();
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_EQ(parameters[i].tensor.grad().to_vector(), twice[i]) << parameters[i].name;
  }
  // No backward at all: every slot reads as zeros, through grad() and through materialize().
  fill_slots_with_nan();
  buffer.zero();
  for (size_t b = 0; b < buffer.buckets().size(); ++b) {
    buffer.materialize(b);
    for (double value : buffer.buckets()[b].data.to_vector()) ASSERT_EQ(value, 0.0);
  }
  fill_slots_with_nan();
  buffer.zero();
  EXPECT_EQ(clip_grad_norm(model->parameters(), 0.0), 0.0);
}

TEST(Segments, GptSegmentsNameEveryParameterAndTheTiedEmbeddingTwice) {
  std::shared_ptr<LanguageModel> model = build_model(model_config());
  const std::vector<ModelSegment> segments = model->segments();
  ASSERT_EQ(segments.size(), 4u);  // embedding, two blocks, head
  EXPECT_EQ(segments.front().name, "embedding");
  EXPECT_EQ(segments.back().name, "head");
  std::multiset<std::string> named;
  for (const ModelSegment& segment : segments) named.insert(segment.parameters.begin(), segment.parameters.end());
  for (const NamedParameter& parameter : model->named_parameters()) {
    EXPECT_EQ(named.count(parameter.name), parameter.name == "token_embedding.weight" ? 2u : 1u) << parameter.name;
  }
  const MicroBatch batch = micro_batch(3);
  EXPECT_EQ(testing::relative_error(run_segments(segments, batch.inputs), model->logits(batch.inputs)), 0.0);
}

TEST(StrategyGraph, ManualReducesAfterBackwardAndAutoOnEachBucketsSignal) {
  for (const std::string mode : {"manual", "auto"}) {
    std::shared_ptr<LanguageModel> model = build_model(model_config());
    StrategyOptions with_collectives = options(mode, 2);
    with_collectives.collectives_for_one_rank = true;
    with_collectives.zero_stage = 1;
    DataParallelStrategy strategy(make_local_process_group(Device::cpu(), "dp"), 0, *model, with_collectives);
    const graph::StepGraph& graph = strategy.step_graph();
    std::map<std::string, graph::NodeId> by_name;
    for (const graph::Node& node : graph.nodes()) by_name[node.name] = node.id;
    ASSERT_TRUE(by_name.count("backward embedding mb1") && by_name.count("all_reduce bucket 0")) << mode;
    const graph::NodeId last_backward = by_name.at("backward embedding mb1");
    const graph::Node& first_bucket = graph.node(by_name.at("all_reduce bucket 0"));
    EXPECT_EQ(first_bucket.stream, graph::StreamClass::kDpComm);
    if (mode == "manual") {
      EXPECT_EQ(first_bucket.dependencies, std::vector<graph::NodeId>{last_backward});
      EXPECT_EQ(by_name.count("bucket 0 ready"), 0u);
      // ZeRO's gathers close the step.
      EXPECT_GT(by_name.at("all_gather bucket 0"), by_name.at("optimizer"));
    } else {
      // The first bucket (the last blocks' parameters) hangs on a signal of a backward above the
      // embedding's, in the last micro-batch only.
      const graph::Node& signal = graph.node(first_bucket.dependencies.at(0));
      EXPECT_TRUE(signal.is_signal());
      EXPECT_EQ(signal.name, "bucket 0 ready");
      EXPECT_EQ(graph.node(signal.signal_of).micro_batch, 1);
      EXPECT_NE(signal.signal_of, last_backward);
      // ZeRO's gathers open the step, before the forwards that read their buckets.
      EXPECT_LT(by_name.at("all_gather bucket 0"), by_name.at("forward embedding mb0"));
      EXPECT_EQ(strategy.plan().stream_of[first_bucket.id], graph::StreamClass::kDpComm);
    }
  }
}

// The plain loop the strategy replaces: whole-model backward per micro-batch (each loss / M),
// clip, SGD.
void reference_step(LanguageModel& model, Optimizer& optimizer, int64_t micro_batches, uint64_t step) {
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    const MicroBatch batch = micro_batch(step * 100 + micro);
    Tensor value = loss(model, batch.inputs, batch.targets);
    if (micro_batches > 1) value = scale(value, 1.0 / static_cast<double>(micro_batches));
    value.backward();
  }
  clip_grad_norm(model.parameters(), 0.5);
  optimizer.step(0.5);
  optimizer.zero_grad();
}

TEST(Strategy, OneProcessMatchesThePlainLoopInBothModes) {
  for (const std::string mode : {"manual", "auto"}) {
    std::shared_ptr<LanguageModel> reference = build_model(model_config());
    auto optimizer = options(mode).make_optimizer(default_parameter_groups(reference->named_parameters(), 0.1));
    std::shared_ptr<LanguageModel> model = build_model(model_config());
    std::unique_ptr<Strategy> strategy = make_strategy(Mesh(1, 1, 1, 1), 0, *model, options(mode, 2));
    for (uint64_t step = 0; step < 3; ++step) {
      reference_step(*reference, *optimizer, 2, step);
      auto count = std::make_shared<uint64_t>(0);
      const StepReport report =
          strategy->step(static_cast<int64_t>(step) + 1, 0.5, [&, count] { return micro_batch(step * 100 + (*count)++); });
      EXPECT_EQ(report.comm_ms, 0.0) << "one process communicates nothing";
      EXPECT_GT(report.loss, 0.0);
    }
    const auto expected = reference->state_dict();
    for (const auto& [name, tensor] : model->state_dict()) {
      EXPECT_LE(testing::relative_error(tensor, expected.at(name)), 1e-6) << mode << " " << name;
    }
  }
}

// Targets equal to -100 (cross_entropy's ignore_index) are not counted: the step's loss is the mean
// over the others, as the model's own loss computes it, for i64 and i32 ids.
TEST(Strategy, IgnoredTargetsAreLeftOutOfTheMean) {
  for (DType dtype : {kInt64, kInt32}) {
    SCOPED_TRACE(dtype_name(dtype));
    MicroBatch batch = micro_batch(0);
    for (int64_t t = 0; t < 3; ++t) batch.targets.set({0, t}, -100);
    batch.targets.set({1, 4}, -100);
    batch = {batch.inputs.to(dtype), batch.targets.to(dtype)};
    std::shared_ptr<LanguageModel> reference = build_model(model_config());
    const double expected = loss(*reference, batch.inputs, batch.targets).item();
    std::shared_ptr<LanguageModel> model = build_model(model_config());
    std::unique_ptr<Strategy> strategy = make_strategy(Mesh(1, 1, 1, 1), 0, *model, options("manual"));
    const StepReport report = strategy->step(1, 0.5, [batch] { return batch; });
    EXPECT_NEAR(report.loss, expected, 1e-6);
  }
}

TEST(Strategy, OneProcessWithZeroMatchesWithoutInBothModes) {
  // ZeRO on one rank: the shard is the whole model, reached through copies in and out.
  std::shared_ptr<LanguageModel> reference = build_model(model_config());
  std::unique_ptr<Strategy> plain = make_strategy(Mesh(1, 1, 1, 1), 0, *reference, options("manual"));
  std::vector<std::shared_ptr<LanguageModel>> models;
  std::vector<std::unique_ptr<Strategy>> strategies;
  for (const int64_t zero : {1, 2}) {
    for (const std::string mode : {"manual", "auto"}) {
      StrategyOptions sharded = options(mode);
      sharded.zero_stage = zero;
      models.push_back(build_model(model_config()));
      strategies.push_back(make_strategy(Mesh(1, 1, 1, 1), 0, *models.back(), sharded));
    }
  }
  for (int64_t step = 1; step <= 3; ++step) {
    const StepReport expected = plain->step(step, 0.5, [step] { return micro_batch(static_cast<uint64_t>(step)); });
    for (auto& strategy : strategies) {
      const StepReport report = strategy->step(step, 0.5, [step] { return micro_batch(static_cast<uint64_t>(step)); });
      EXPECT_NEAR(report.loss, expected.loss, 1e-6 * expected.loss) << "step " << step;
    }
  }
  const auto expected = reference->state_dict();
  for (size_t k = 0; k < models.size(); ++k) {
    strategies[k]->complete_parameter_updates();
    for (const auto& [name, tensor] : models[k]->state_dict()) {
      EXPECT_LE(testing::relative_error(tensor, expected.at(name)), 1e-6) << "run " << k << " " << name;
    }
  }
}

// A custom model that does not cut itself: one segment, and training still works.
class TinyUncutModel : public LanguageModel {
 public:
  explicit TinyUncutModel(const LayerContext& context) {
    embedding_ = register_module("embedding", std::make_shared<Embedding>(context.config.vocab, 8, context));
    head_ = register_module("head", std::make_shared<Linear>(8, context.config.vocab, true, context));
  }
  std::string type_name() const override { return "TinyUncut"; }
  Tensor logits(const Tensor& ids) override { return head_->forward(embedding_->forward(ids)); }

 private:
  std::shared_ptr<Embedding> embedding_;
  std::shared_ptr<Linear> head_;
};

// Identity forward whose backward multiplies by infinity: a finite loss with a non-finite gradient.
class InfiniteGradientFunction final : public autograd::Function {
 public:
  std::string name() const override { return "InfiniteGradientBackward"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return {inputs[0] * 1.0}; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return {grads[0] * std::numeric_limits<double>::infinity()};
  }
};

class InfiniteGradientModel : public TinyUncutModel {
 public:
  using TinyUncutModel::TinyUncutModel;
  Tensor logits(const Tensor& ids) override {
    return autograd::apply<InfiniteGradientFunction>({TinyUncutModel::logits(ids)})[0];
  }
};

TEST(Strategy, ANonFiniteGradientNormFollowsTheNanPolicyWithAFiniteLoss) {
  for (const std::string policy : {"stop", "skip"}) {
    ModelConfig config = model_config();
    uint64_t offset = 0;
    InfiniteGradientModel model(LayerContext{config, &offset});
    std::map<std::string, Tensor> before;  // copies: state_dict() hands out the live tensors
    for (const auto& [name, tensor] : model.state_dict()) before[name] = tensor.clone();
    StrategyOptions guarded = options("auto");
    guarded.on_nan = policy;
    std::unique_ptr<Strategy> strategy = make_strategy(Mesh(1, 1, 1, 1), 0, model, guarded);
    if (policy == "stop") {
      try {
        strategy->step(3, 0.5, [] { return micro_batch(0); });
        FAIL() << "expected weft::Error";
      } catch (const weft::Error& error) {
        // inf times the zero gradients of some elements: the norm is NaN.
        const std::string message = error.what();
        EXPECT_EQ(message.rfind("the gradient norm is ", 0), 0u) << message;
        EXPECT_NE(message.find("at step 3 (train.on_nan: stop)"), std::string::npos) << message;
      }
    } else {
      const StepReport report = strategy->step(3, 0.5, [] { return micro_batch(0); });
      EXPECT_TRUE(report.skipped);
      EXPECT_TRUE(std::isfinite(report.loss));
      EXPECT_FALSE(std::isfinite(report.grad_norm)) << "a skipped step reports the norm that skipped it";
    }
    for (const auto& [name, tensor] : model.state_dict()) {
      EXPECT_EQ(testing::relative_error(tensor, before.at(name)), 0.0) << policy << ": " << name << " was updated";
    }
  }
}

// Two steps in flight (issue_step ahead of finish_step) compute what one step at a time computes:
// the same reports, the same weights, in both comm modes and with ZeRO 1; while a step is in flight
// the weights may not be read, and a third step may not be issued.
TEST(Strategy, StepsInFlightMatchOneStepAtATime) {
  for (const int64_t zero : {0, 1}) {
    for (const std::string mode : {"manual", "auto"}) {
      const std::string run = mode + " zero " + std::to_string(zero);
      StrategyOptions chosen = options(mode);
      chosen.zero_stage = zero;
      std::shared_ptr<LanguageModel> reference = build_model(model_config());
      std::shared_ptr<LanguageModel> ahead = build_model(model_config());
      std::unique_ptr<Strategy> one_at_a_time = make_strategy(Mesh(1, 1, 1, 1), 0, *reference, chosen);
      std::unique_ptr<Strategy> in_flight = make_strategy(Mesh(1, 1, 1, 1), 0, *ahead, chosen);
      ASSERT_EQ(in_flight->max_steps_in_flight(), 2) << run;
      auto batch = [](int64_t step) { return [step] { return micro_batch(static_cast<uint64_t>(step)); }; };
      std::vector<StepReport> expected;
      for (int64_t step = 1; step <= 4; ++step) expected.push_back(one_at_a_time->step(step, 0.5, batch(step)));
      std::vector<StepReport> reports;
      in_flight->issue_step(1, 0.5, batch(1));
      for (int64_t step = 2; step <= 4; ++step) {
        in_flight->issue_step(step, 0.5, batch(step));
        if (step == 2) {
          EXPECT_THROW(in_flight->issue_step(3, 0.5, batch(3)), weft::Error) << run;
          EXPECT_THROW(in_flight->model_state(), weft::Error) << run;
        }
        reports.push_back(in_flight->finish_step());
      }
      reports.push_back(in_flight->finish_step());
      EXPECT_THROW(in_flight->finish_step(), weft::Error) << run;
      for (size_t k = 0; k < expected.size(); ++k) {
        EXPECT_EQ(reports[k].loss, expected[k].loss) << run << ", step " << k + 1;
        EXPECT_EQ(reports[k].grad_norm, expected[k].grad_norm) << run << ", step " << k + 1;
        EXPECT_GT(reports[k].end_clock_ms, 0.0) << run;
      }
      one_at_a_time->complete_parameter_updates();
      in_flight->complete_parameter_updates();
      const auto expected_weights = reference->state_dict();
      for (const auto& [name, tensor] : ahead->state_dict()) {
        EXPECT_EQ(testing::relative_error(tensor, expected_weights.at(name)), 0.0) << run << ": " << name;
      }
    }
  }
}

// A model whose loss is NaN for a micro-batch whose first input id is kMarker: a chosen step is
// skipped under on_nan: skip.
class NanOnMarkedBatchModel : public TinyUncutModel {
 public:
  static constexpr int64_t kMarker = 15;
  using TinyUncutModel::TinyUncutModel;
  Tensor logits(const Tensor& ids) override {
    const Tensor logits = TinyUncutModel::logits(ids);
    return ids.contiguous().data<int64_t>()[0] == kMarker ? logits * std::nan("") : logits;
  }
};

// on_nan: skip with two steps in flight (a skipped step is read only after the next was issued,
// whose AdamW update must then use the counts the skip leaves) computes what one step at a time
// computes: the same reports, weights and optimizer state, in both comm modes and with ZeRO 1, for
// a lone skipped step and two in a row.
TEST(Strategy, StepsInFlightWithSkippedStepsMatchOneStepAtATime) {
  const std::set<int64_t> skipped = {2, 4, 5};
  const auto batch = [&skipped](int64_t step) {
    return [step, &skipped] {
      MicroBatch micro_batch_of_step = micro_batch(static_cast<uint64_t>(step));
      micro_batch_of_step.inputs.data<int64_t>()[0] = skipped.count(step) ? NanOnMarkedBatchModel::kMarker : 0;
      return micro_batch_of_step;
    };
  };
  for (const int64_t zero : {0, 1}) {
    for (const std::string mode : {"manual", "auto"}) {
      const std::string run = mode + " zero " + std::to_string(zero);
      StrategyOptions chosen = options(mode);
      chosen.zero_stage = zero;
      chosen.on_nan = "skip";
      chosen.make_optimizer = [](std::vector<ParameterGroup> groups) { return make_adamw(std::move(groups), {}); };
      uint64_t reference_offset = 0, ahead_offset = 0;
      NanOnMarkedBatchModel reference(LayerContext{model_config(), &reference_offset});
      NanOnMarkedBatchModel ahead(LayerContext{model_config(), &ahead_offset});
      std::unique_ptr<Strategy> one_at_a_time = make_strategy(Mesh(1, 1, 1, 1), 0, reference, chosen);
      std::unique_ptr<Strategy> in_flight = make_strategy(Mesh(1, 1, 1, 1), 0, ahead, chosen);
      ASSERT_EQ(in_flight->max_steps_in_flight(), 2) << run;
      std::vector<StepReport> expected;
      for (int64_t step = 1; step <= 6; ++step) expected.push_back(one_at_a_time->step(step, 0.5, batch(step)));
      std::vector<StepReport> reports;
      in_flight->issue_step(1, 0.5, batch(1));
      for (int64_t step = 2; step <= 6; ++step) {
        in_flight->issue_step(step, 0.5, batch(step));
        reports.push_back(in_flight->finish_step());
      }
      reports.push_back(in_flight->finish_step());
      for (size_t k = 0; k < expected.size(); ++k) {
        const int64_t step = static_cast<int64_t>(k) + 1;
        EXPECT_EQ(reports[k].skipped, skipped.count(step) > 0) << run << ", step " << step;
        EXPECT_EQ(expected[k].skipped, skipped.count(step) > 0) << run << ", step " << step;
        if (!skipped.count(step)) {
          EXPECT_EQ(reports[k].loss, expected[k].loss) << run << ", step " << step;
          EXPECT_EQ(reports[k].grad_norm, expected[k].grad_norm) << run << ", step " << step;
        }
      }
      one_at_a_time->complete_parameter_updates();
      in_flight->complete_parameter_updates();
      const auto expected_weights = one_at_a_time->model_state();
      for (const auto& [name, tensor] : in_flight->model_state()) {
        EXPECT_EQ(testing::relative_error(tensor, expected_weights.at(name)), 0.0) << run << ": " << name;
      }
      const auto expected_state = one_at_a_time->optimizer_state();
      for (const auto& [name, tensor] : in_flight->optimizer_state()) {
        EXPECT_EQ(testing::relative_error(tensor, expected_state.at(name)), 0.0) << run << ": " << name;
      }
    }
  }
}

// Each segment's weight gradients deferred to the second stream's launch (parallel/step/
// weight_gradient_overlap.h; on the CPU they run in line when launched) give the bits the undeferred
// backward gives: GPT with its biases (taken with dX or from the norms under the deferral too) and
// a tied embedding (read by the first segment and the last), Llama without biases, one and two
// micro-batches, both comm modes.
TEST(Strategy, WeightGradientsOnTheirOwnStreamGiveTheSameBits) {
  for (const std::string type : {"gpt", "llama"}) {
    for (const int64_t micro_batches : {1, 2}) {
      for (const std::string mode : {"manual", "auto"}) {
        SCOPED_TRACE(type + " " + mode + " micro-batches " + std::to_string(micro_batches));
        ModelConfig config = model_config();
        config.type = type;
        std::map<std::string, Tensor> states[2];
        for (const bool overlap : {false, true}) {
          std::shared_ptr<LanguageModel> model = build_model(config);
          StrategyOptions chosen = options(mode, micro_batches);
          chosen.weight_gradient_stream = overlap;
          std::unique_ptr<Strategy> strategy = make_strategy(Mesh(1, 1, 1, 1), 0, *model, chosen);
          const int64_t launched = weight_gradient_items_launched_for_testing();
          for (uint64_t step = 0; step < 3; ++step) {
            auto count = std::make_shared<uint64_t>(0);
            strategy->step(static_cast<int64_t>(step) + 1, 0.5,
                           [&, count] { return micro_batch(step * 100 + (*count)++); });
          }
          // Three steps of each deferred item per micro-batch, or none: a block's qkv, proj, fc (Llama:
          // the gate and up pair, one item) and MLP proj, and the head (tied for GPT, not for Llama).
          const int64_t linears = 4 * config.layers + 1;
          EXPECT_EQ(weight_gradient_items_launched_for_testing() - launched,
                    overlap ? 3 * micro_batches * linears : 0);
          states[overlap] = model->state_dict();
        }
        for (const auto& [name, tensor] : states[1]) {
          EXPECT_EQ(tensor.to_vector(), states[0].at(name).to_vector()) << name;
        }
      }
    }
  }
}

TEST(Strategy, AModelThatDoesNotCutItselfIsOneSegmentAndTrains) {
  ModelConfig config = model_config();
  uint64_t offset = 0;
  TinyUncutModel model(LayerContext{config, &offset});
  ASSERT_EQ(model.segments().size(), 1u);
  std::unique_ptr<Strategy> strategy = make_strategy(Mesh(1, 1, 1, 1), 0, model, options("auto"));
  double first = 0, last = 0;
  for (int64_t step = 1; step <= 20; ++step) {
    const StepReport report = strategy->step(step, 0.5, [] { return micro_batch(0); });
    (step == 1 ? first : last) = report.loss;
  }
  EXPECT_LT(last, first - 0.5) << "the loss on one repeated batch did not fall";
}

}  // namespace
}  // namespace weft
