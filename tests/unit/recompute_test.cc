// Activation recomputation (runtime/autograd/recompute.h, train.recompute): the recompute function
// and release_until_backward against finite differences in f64; GPT and Llama models with
// recompute selective and full give bitwise the losses and gradients of none in f32 (with and
// without dropout, with interleaved micro-batches as 1F1B runs them, and with deferred weight
// gradients); and the peak of live host bytes falls from none to selective to full.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "layers/attention.h"
#include "layers/language_model.h"
#include "layers/rope.h"
#include "runtime/autograd/deferred_weight_gradients.h"
#include "runtime/autograd/recompute.h"
#include "runtime/cpu_caching_allocator.h"
#include "runtime/ops/rotary.h"
#include "runtime/ops/swiglu.h"
#include "runtime/weft.h"
#include "tests/support/gradient_check.h"
#include "tests/support/small_model_config.h"

namespace weft {
namespace {

using testing::expect_gradients_match;
using testing::random_leaf;

TEST(RecomputeTest, GradientsMatchFiniteDifferences) {
  // Two inputs, two outputs, and a parameter read from the closure (its gradient comes from the rerun).
  const auto function = [](const std::vector<Tensor>& in) {
    const Tensor weight = in[2];
    const auto region = [weight](const std::vector<Tensor>& inputs) {
      const Tensor hidden = gelu(matmul(inputs[0], weight));  // [4, 3]
      return std::vector<Tensor>{mul(hidden, inputs[1]), tanh(hidden)};
    };
    const std::vector<Tensor> out = autograd::recompute(region, {in[0], in[1]}, {weight});
    return add(mul(out[0], out[0]), out[1]);
  };
  expect_gradients_match(function, {random_leaf({4, 5}, 1), random_leaf({4, 3}, 2), random_leaf({5, 3}, 3)});
}

TEST(RecomputeTest, ParametersGetGradientsWhenNoInputRequiresGrad) {
  const Tensor x = random_leaf({4, 5}, 4, /*requires_grad=*/false);
  const Tensor weight = random_leaf({5, 3}, 5);
  const auto region = [weight](const std::vector<Tensor>& inputs) {
    return std::vector<Tensor>{tanh(matmul(inputs[0], weight))};
  };
  sum(autograd::recompute(region, {x}, {weight})[0]).backward();
  const Tensor expected_grad = Tensor(weight).grad().clone();
  Tensor(weight).zero_grad();
  sum(tanh(matmul(x, weight))).backward();
  EXPECT_EQ(Tensor(weight).grad().to_vector(), expected_grad.to_vector());
}

TEST(RecomputeTest, ReplaysCountersAndRestoresThemAfterwards) {
  // A counter the function advances each run, as a dropout stream does: the rerun sees the first
  // run's value, and backward leaves the counter where the later forwards put it.
  uint64_t counter = 10;
  autograd::ReplayedCounters counters;
  counters.read = [&counter] { return std::vector<uint64_t>{counter}; };
  counters.write = [&counter](const std::vector<uint64_t>& values) { counter = values[0]; };
  std::vector<uint64_t> seen;
  const auto region = [&](const std::vector<Tensor>& inputs) {
    seen.push_back(counter);
    const double factor = static_cast<double>(counter++);
    return std::vector<Tensor>{weft::scale(inputs[0], factor)};
  };
  const Tensor x = random_leaf({3}, 6);
  const Tensor first = autograd::recompute(region, {x}, {}, counters)[0];
  const Tensor second = autograd::recompute(region, {x}, {}, counters)[0];
  sum(first).backward();
  EXPECT_EQ(seen, (std::vector<uint64_t>{10, 11, 10}));
  EXPECT_EQ(counter, 12u);
  EXPECT_EQ(Tensor(x).grad().to_vector(), std::vector<double>(3, 10.0));
  sum(second).backward();
  EXPECT_EQ(seen, (std::vector<uint64_t>{10, 11, 10, 11}));
  EXPECT_EQ(Tensor(x).grad().to_vector(), std::vector<double>(3, 21.0));
}

TEST(RecomputeTest, ReleasedActivationIsRebuiltBeforeItsConsumersBackward) {
  const auto function = [](const std::vector<Tensor>& in) {
    const Tensor pre = matmul(in[0], in[1]);  // [4, 6]
    const Tensor hidden = gelu(pre);
    const Tensor out = autograd::release_until_backward(matmul(hidden, in[2]), hidden, [pre] { return gelu(pre); });
    // Released whenever a backward will come (the finite differences evaluate without history).
    EXPECT_EQ(hidden.storage()->released(), out.requires_grad());
    return out;
  };
  expect_gradients_match(function, {random_leaf({4, 5}, 7), random_leaf({5, 6}, 8), random_leaf({6, 3}, 9)});
}

TEST(RecomputeTest, OutputRebuilderComputesAgainFromWhatTheOpSaved) {
  const Tensor x = random_leaf({4, 5}, 11), weight = random_leaf({6, 5}, 12), bias = random_leaf({6}, 13);
  const Tensor gate = random_leaf({4, 6}, 14), up = random_leaf({4, 6}, 15);
  // linear_gelu's fused op from its pre-activation, gelu from its input, swiglu from gate and up:
  // bitwise the forward's values on the CPU.
  for (const Tensor& output : {linear_gelu(x, weight, bias), gelu(x), swiglu(gate, up)}) {
    const std::function<Tensor()> rebuild = autograd::output_rebuilder(output);
    ASSERT_NE(rebuild, nullptr) << output.grad_fn()->name();
    const Tensor rebuilt = rebuild();
    EXPECT_FALSE(rebuilt.requires_grad());
    EXPECT_EQ(rebuilt.shape(), output.shape());
    EXPECT_EQ(rebuilt.to_vector(), output.to_vector()) << output.grad_fn()->name();
  }
  // An op that keeps nothing to rebuild from, a leaf, and an output without history have none.
  EXPECT_EQ(autograd::output_rebuilder(add(x, x)), nullptr);
  EXPECT_EQ(autograd::output_rebuilder(linear(x, weight, bias)), nullptr);
  EXPECT_EQ(autograd::output_rebuilder(x), nullptr);
  EXPECT_EQ(autograd::output_rebuilder(gelu(x.detach())), nullptr);
  // Once the producer's backward has freed its saved tensors, rebuilding is an error, not garbage.
  const Tensor hidden = gelu(x);
  const std::function<Tensor()> rebuild = autograd::output_rebuilder(hidden);
  sum(hidden).backward();
  try {
    rebuild();
    FAIL() << "rebuild after the producer's backward did not throw";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("cannot be rebuilt: its saved tensors were freed"), std::string::npos)
        << error.what();
  }
}

TEST(RecomputeTest, PermutedActivationIsRebuiltInItsLayout) {
  // Rotary's output for heads split off a [B, T, H D] projection keeps the heads inner in memory
  // ([B, H, T, D] over [B, T, H, D] bytes): released and rebuilt in that layout, whether the
  // rebuild gives it so or contiguous (then copied into it).
  const auto [cos, sin] = rotary_tables(3, 4, 10000.0);  // [T, D]
  for (const bool contiguous_rebuild : {false, true}) {
    const auto function = [&, contiguous_rebuild](const std::vector<Tensor>& in) {
      const Tensor q = in[0].permute({0, 2, 1, 3});  // [B, H, T, D] view of [B, T, H, D]
      const Tensor rotated = apply_rotary_embedding(q, cos, sin);
      EXPECT_FALSE(rotated.is_contiguous());
      const Tensor out = autograd::release_until_backward(
          mul(rotated, in[1]), rotated, [q_in = q.detach(), cos = cos, sin = sin, contiguous_rebuild] {
            const Tensor again = apply_rotary_embedding(q_in, cos, sin);
            return contiguous_rebuild ? again.contiguous() : again;
          });
      EXPECT_EQ(rotated.storage()->released(), out.requires_grad());
      return out;
    };
    expect_gradients_match(function, {random_leaf({2, 3, 2, 4}, 16), random_leaf({2, 2, 3, 4}, 17)});
  }
}

TEST(RecomputeTest, SelectiveAttentionFreesTheRotatedQueriesAndKeys) {
  // What one rope attention layer holds after its forward: selective frees the rotated q [B, H, T, D]
  // and k [B, KV, T, D], and nothing else changes (the same output, bitwise).
  const int64_t batch = 2, time = 16;
  std::vector<int64_t> held;
  std::vector<std::vector<double>> outputs;
  for (const std::string recompute : {"none", "selective"}) {
    ModelConfig config;
    config.dim = 32;
    config.heads = 4;
    config.kv_heads = 2;
    config.seq_len = time;
    config.positions = "rope";
    config.recompute = recompute;
    uint64_t offset = 0;
    CausalSelfAttention attention(LayerContext{config, &offset});
    Tensor x = random_leaf({batch, time, config.dim}, 18).to(kFloat32).detach();
    x.set_requires_grad(true);
    const int64_t before = cpu_memory_stats().in_use_bytes;
    const Tensor out = attention.call(x);
    held.push_back(cpu_memory_stats().in_use_bytes - before);
    outputs.push_back(out.to_vector());
    sum(out).backward();
  }
  const int64_t rotated_bytes = batch * time * (4 + 2) * 8 * static_cast<int64_t>(sizeof(float));  // q and k
  EXPECT_EQ(held[0] - held[1], rotated_bytes) << "none " << held[0] << ", selective " << held[1];
  EXPECT_EQ(outputs[0], outputs[1]);
}

// --- Whole models ---------------------------------------------------------------------------

struct StepResult {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> gradients;
};

Tensor token_ids(int64_t batch, int64_t time, int64_t vocab, int64_t shift) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < batch * time; ++i) ids.push_back((7 * i + 3 * shift + 1) % vocab);
  return Tensor::from_vector(absl::Span<const int64_t>(ids), {batch, time});
}

// Two micro-batches in 1F1B's order (forward 1, forward 2, backward 1, backward 2), with weight
// gradients deferred to the end when `defer`.
StepResult train_step(ModelConfig config, const std::string& recompute, bool defer) {
  config.recompute = recompute;
  const auto model = build_model(config);
  model->train();
  StepResult result;
  const Tensor ids_1 = token_ids(2, config.seq_len, config.vocab, 1);
  const Tensor ids_2 = token_ids(2, config.seq_len, config.vocab, 2);
  const Tensor loss_1 = loss(*model, ids_1, token_ids(2, config.seq_len, config.vocab, 3));
  const Tensor loss_2 = loss(*model, ids_2, token_ids(2, config.seq_len, config.vocab, 4));
  autograd::DeferredWeightGradients weight_work;
  {
    std::unique_ptr<autograd::DeferWeightGradients> deferral;
    if (defer) deferral = std::make_unique<autograd::DeferWeightGradients>(weight_work);
    loss_1.backward();
    loss_2.backward();
  }
  EXPECT_EQ(weight_work.empty(), !defer);
  weight_work.run();
  result.losses = {loss_1.item(), loss_2.item()};
  for (const NamedParameter& parameter : model->named_parameters()) {
    EXPECT_TRUE(parameter.tensor.grad().defined()) << recompute << ": " << parameter.name;
    result.gradients[parameter.name] = parameter.tensor.grad().to_vector();
  }
  return result;
}

void expect_recompute_is_bitwise_none(const ModelConfig& config, bool defer = false) {
  const StepResult none = train_step(config, "none", defer);
  for (const std::string recompute : {"selective", "full"}) {
    const StepResult recomputed = train_step(config, recompute, defer);
    EXPECT_EQ(recomputed.losses, none.losses) << recompute;
    for (const auto& [name, gradient] : none.gradients) {
      EXPECT_EQ(recomputed.gradients.at(name), gradient) << recompute << ": " << name;
    }
  }
}

ModelConfig gpt_config(double dropout) {
  ModelConfig config = testing::small_model_config();
  config.layers = 3;
  config.dropout = dropout;
  return config;
}

ModelConfig llama_config(double dropout) {
  ModelConfig config = testing::small_model_config();
  config.type = "llama";
  config.layers = 3;
  config.kv_heads = 1;
  config.hidden_dim = 12;
  config.dropout = dropout;
  return config;
}

TEST(RecomputeModelTest, GptIsBitwiseNone) { expect_recompute_is_bitwise_none(gpt_config(0.0)); }
TEST(RecomputeModelTest, GptWithDropoutIsBitwiseNone) { expect_recompute_is_bitwise_none(gpt_config(0.1)); }
TEST(RecomputeModelTest, LlamaIsBitwiseNone) { expect_recompute_is_bitwise_none(llama_config(0.0)); }
TEST(RecomputeModelTest, LlamaWithDropoutIsBitwiseNone) { expect_recompute_is_bitwise_none(llama_config(0.1)); }

TEST(RecomputeModelTest, UntiedRopeSwigluGptIsBitwiseNone) {
  ModelConfig config = gpt_config(0.1);
  config.tie_embeddings = false;
  config.positions = "rope";
  config.mlp = "swiglu_mlp";
  config.hidden_dim = 12;
  expect_recompute_is_bitwise_none(config);
}

TEST(RecomputeModelTest, DeferredWeightGradientsAreBitwiseNone) {
  expect_recompute_is_bitwise_none(gpt_config(0.1), /*defer=*/true);
  expect_recompute_is_bitwise_none(llama_config(0.1), /*defer=*/true);
}

TEST(RecomputeModelTest, UnknownSettingIsAnError) {
  ModelConfig config = gpt_config(0.0);
  config.recompute = "some";
  try {
    build_model(config);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("train.recompute = 'some' is not one of: none, selective, full"),
              std::string::npos)
        << error.what();
  }
}

// Peak live host bytes above what was live before one forward and backward, at a shape where the
// blocks' activations dominate (the logits are small beside them).
int64_t peak_activation_bytes(const std::string& type, const std::string& recompute) {
  ModelConfig config;
  config.type = type;
  config.layers = 6;
  config.dim = 64;
  config.heads = 4;
  config.vocab = 64;
  config.seq_len = 128;
  config.recompute = recompute;
  if (type == "llama") config.kv_heads = 2;
  const auto model = build_model(config);
  model->train();
  const Tensor ids = token_ids(4, config.seq_len, config.vocab, 1);
  const Tensor targets = token_ids(4, config.seq_len, config.vocab, 2);
  const int64_t before = cpu_memory_stats().in_use_bytes;
  reset_cpu_peak();
  loss(*model, ids, targets).backward();
  return cpu_memory_stats().peak_in_use_bytes - before;
}

TEST(RecomputeMemoryTest, PeakFallsFromNoneToSelectiveToFull) {
  for (const std::string type : {"gpt", "llama"}) {
    const int64_t none = peak_activation_bytes(type, "none");
    const int64_t selective = peak_activation_bytes(type, "selective");
    const int64_t full = peak_activation_bytes(type, "full");
    std::printf("%s peak activation bytes: none %lld, selective %lld, full %lld\n", type.c_str(),
                static_cast<long long>(none), static_cast<long long>(selective), static_cast<long long>(full));
    // Selective drops at least the MLP's hidden activation (4C of about 20C per token and block);
    // full keeps one block's input per block.
    EXPECT_LT(selective, none * 9 / 10) << type;
    EXPECT_LT(full, selective / 2) << type;
  }
}

}  // namespace
}  // namespace weft
