// The built-in layers: forwards against plain references, and every gradient (inputs and
// parameters) against finite differences in f64, from Linear up to whole GPT and Llama models.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "layers/attention.h"
#include "layers/embedding.h"
#include "layers/gpt.h"
#include "layers/language_model.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/llama.h"
#include "layers/mlp.h"
#include "layers/rms_norm.h"
#include "layers/rope.h"
#include "layers/transformer_block.h"
#include "runtime/weft.h"
#include "tests/support/gradient_check.h"
#include "tests/support/small_model_config.h"

namespace weft {
namespace {

using testing::expect_gradients_match;
using testing::random_leaf;
using testing::relative_error;
using testing::small_model_config;

constexpr int64_t kBatch = 2;  // B
constexpr int64_t kTime = 5;   // T

// Builds `Layer` from `config` the way a factory would.
template <class Layer>
std::shared_ptr<Layer> make(const ModelConfig& config) {
  uint64_t offset = 0;
  return std::make_shared<Layer>(LayerContext{config, &offset});
}

// Converts `module` to f64 and moves every parameter off its initial value (norm weights off one,
// biases off zero), so a gradient check sees no degenerate parameter. Returns the parameters.
std::vector<Tensor> f64_perturbed_parameters(Module& module, uint64_t seed) {
  module.to(kFloat64);
  std::map<std::string, Tensor> state;
  uint64_t offset = 0;
  for (const NamedParameter& entry : module.named_parameters()) {
    const Tensor noise = Tensor::normal(entry.tensor.shape(), seed, offset, 0.0, 0.3, kFloat64);
    offset += static_cast<uint64_t>(entry.tensor.numel());
    state.emplace(entry.name, add(entry.tensor.detach(), noise));
  }
  module.load_state_dict(state);
  return module.parameters();
}

// A layer's gradient check: input x [B, T, C] and every parameter.
void check_layer_gradients(Module& layer, int64_t channels, uint64_t seed) {
  std::vector<Tensor> inputs = {random_leaf({kBatch, kTime, channels}, seed)};
  for (const Tensor& parameter : f64_perturbed_parameters(layer, seed + 1)) inputs.push_back(parameter);
  expect_gradients_match([&](const std::vector<Tensor>& in) { return layer.forward(in[0]); }, inputs);
}

Tensor token_ids(int64_t vocab) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < kBatch * kTime; ++i) ids.push_back((3 * i + 1) % vocab);
  return Tensor::from_vector(absl::Span<const int64_t>(ids), {kBatch, kTime});
}

TEST(LinearTest, ForwardIsLinearAndGradientsMatch) {
  const ModelConfig config = small_model_config();
  uint64_t offset = 0;
  const LayerContext context{config, &offset};
  Linear with_bias(8, 6, true, context);
  EXPECT_EQ(offset, 48u);
  EXPECT_EQ(with_bias.weight().shape(), (Shape{6, 8}));
  // The weight is exactly the Philox draw at the context's offset.
  EXPECT_EQ(with_bias.weight().to_vector(), Tensor::normal({6, 8}, config.seed, 0, 0.0, 0.4).to_vector());
  EXPECT_EQ(with_bias.bias().to_vector(), std::vector<double>(6, 0.0));
  check_layer_gradients(with_bias, 8, 10);

  Linear without_bias(8, 3, false, context, 0.1);
  EXPECT_FALSE(without_bias.bias().defined());
  EXPECT_EQ(without_bias.named_parameters().size(), 1u);
  check_layer_gradients(without_bias, 8, 11);
}

TEST(EmbeddingTest, LooksUpRowsAndGradientsMatch) {
  const ModelConfig config = small_model_config();
  uint64_t offset = 0;
  auto table = std::make_shared<Embedding>(7, 4, LayerContext{config, &offset});
  const Tensor ids = token_ids(7);
  const Tensor out = table->forward(ids);  // [B, T, 4]
  ASSERT_EQ(out.shape(), (Shape{kBatch, kTime, 4}));
  const int64_t id = static_cast<int64_t>(ids.at({1, 2}));
  EXPECT_EQ(out.at({1, 2, 3}), table->weight().at({id, 3}));
  std::vector<Tensor> inputs = f64_perturbed_parameters(*table, 3);
  expect_gradients_match([&](const std::vector<Tensor>&) { return table->forward(ids); }, inputs);
}

TEST(NormTest, LayerNormAndRmsNormGradientsMatch) {
  LayerNorm layer_norm(8, 1e-5, true);
  EXPECT_EQ(layer_norm.weight().to_vector(), std::vector<double>(8, 1.0));
  check_layer_gradients(layer_norm, 8, 20);
  LayerNorm without_bias(8, 1e-5, false);
  EXPECT_EQ(without_bias.named_parameters().size(), 1u);
  RmsNorm rms_norm(8, 1e-6);
  check_layer_gradients(rms_norm, 8, 21);
}

TEST(NormTest, RegistryBuildsNormsFromConfig) {
  ModelConfig config = small_model_config();
  config.bias = false;
  uint64_t offset = 0;
  const auto norm = LayerRegistry::global().create("layer_norm", LayerContext{config, &offset});
  EXPECT_EQ(norm->type_name(), "LayerNorm");
  EXPECT_EQ(norm->named_parameters().size(), 1u);
  EXPECT_EQ(LayerRegistry::global().create("rms_norm", LayerContext{config, &offset})->type_name(), "RmsNorm");
}

// RoPE against the textbook formula: pair (i, i + D/2) rotated by t * theta^(-2i/D).
TEST(RopeTest, MatchesDirectFormula) {
  constexpr int64_t H = 3, D = 6;
  constexpr double theta = 500.0;
  const Tensor x = random_leaf({kBatch, H, kTime, D}, 30, false);
  const auto [cos, sin] = rotary_tables(kTime, D, theta);
  const Tensor out = apply_rotary_embedding(x, cos, sin);
  double worst = 0;
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < kTime; ++t) {
        for (int64_t i = 0; i < D / 2; ++i) {
          const double angle = t * std::pow(theta, -2.0 * i / D);
          const double first = x.at({b, h, t, i}), second = x.at({b, h, t, i + D / 2});
          worst = std::max(worst, std::fabs(out.at({b, h, t, i}) - (first * std::cos(angle) - second * std::sin(angle))));
          worst = std::max(worst, std::fabs(out.at({b, h, t, i + D / 2}) -
                                            (second * std::cos(angle) + first * std::sin(angle))));
        }
      }
    }
  }
  EXPECT_LT(worst, 1e-14);
  // Position 0 is not rotated; rotation keeps each pair's length.
  EXPECT_EQ(out.select(2, 0).to_vector(), x.select(2, 0).to_vector());
}

TEST(RopeTest, GradientsMatch) {
  const auto [cos, sin] = rotary_tables(kTime, 4, 10000.0);
  expect_gradients_match([&](const std::vector<Tensor>& in) { return apply_rotary_embedding(in[0], cos, sin); },
                         {random_leaf({kBatch, 2, kTime, 4}, 31)});
  EXPECT_THROW(rotary_tables(4, 5, 10000.0), Error);
}

TEST(AttentionTest, LearnedPositionsGradientsMatch) {
  auto attention = make<CausalSelfAttention>(small_model_config());
  EXPECT_EQ(attention->head_dim(), 4);
  check_layer_gradients(*attention, 8, 40);
}

TEST(AttentionTest, RopeGradientsMatch) {
  ModelConfig config = small_model_config();
  config.positions = "rope";
  auto attention = make<CausalSelfAttention>(config);
  EXPECT_TRUE(attention->uses_rope());
  check_layer_gradients(*attention, 8, 41);
}

TEST(AttentionTest, GroupedQueryRopeGradientsMatch) {
  ModelConfig config = small_model_config();
  config.heads = 4;
  config.kv_heads = 2;  // D = 2
  config.positions = "rope";
  config.bias = false;
  auto attention = make<CausalSelfAttention>(config);
  EXPECT_EQ(attention->state_dict().at("qkv.weight").shape(), (Shape{(4 + 2 * 2) * 2, 8}));
  check_layer_gradients(*attention, 8, 42);
}

// Grouped-query attention is multi-head attention whose k/v heads repeat: query head h reads kv
// head h / (H / KV). So a GQA layer equals an MHA layer built with those k/v rows repeated.
TEST(AttentionTest, GroupedQueryEqualsMultiHeadWithRepeatedKeyValueHeads) {
  ModelConfig config = small_model_config();
  config.dim = 16;
  config.heads = 4;
  config.kv_heads = 2;
  config.positions = "rope";
  auto grouped = make<CausalSelfAttention>(config);
  config.kv_heads = 0;
  auto full = make<CausalSelfAttention>(config);
  grouped->to(kFloat64);
  full->to(kFloat64);

  const int64_t H = 4, KV = 2, D = 4;
  const auto grouped_state = grouped->state_dict();
  const Tensor w = grouped_state.at("qkv.weight");  // [(H + 2KV) D, C]
  const Tensor b = grouped_state.at("qkv.bias");    // [(H + 2KV) D]
  const auto repeat_rows = [&](const Tensor& t, int64_t start) {  // KV heads of D rows -> H heads
    std::vector<Tensor> heads;
    for (int64_t h = 0; h < H; ++h) heads.push_back(t.narrow(0, start + (h / (H / KV)) * D, D));
    return concat(heads, 0);
  };
  std::map<std::string, Tensor> state = grouped_state;
  state["qkv.weight"] = concat({w.narrow(0, 0, H * D), repeat_rows(w, H * D), repeat_rows(w, (H + KV) * D)}, 0);
  state["qkv.bias"] = concat({b.narrow(0, 0, H * D), repeat_rows(b, H * D), repeat_rows(b, (H + KV) * D)}, 0);
  full->load_state_dict(state);

  const Tensor x = random_leaf({kBatch, kTime, 16}, 43, false);
  EXPECT_LT(relative_error(grouped->forward(x), full->forward(x)), 1e-14);
}

TEST(MlpTest, GeluMlpGradientsMatch) {
  auto mlp = make<GeluMlp>(small_model_config());
  EXPECT_EQ(mlp->hidden_dim(), 32);
  check_layer_gradients(*mlp, 8, 50);
}

TEST(MlpTest, SwigluMlpGradientsMatch) {
  ModelConfig config = small_model_config();
  config.hidden_dim = 12;
  auto mlp = make<SwigluMlp>(config);
  EXPECT_EQ(mlp->hidden_dim(), 12);
  check_layer_gradients(*mlp, 8, 51);
}

TEST(MlpTest, SwigluHiddenDefaultIsLlamaRule) {
  EXPECT_EQ(swiglu_hidden_dim(8, 0), 64);
  EXPECT_EQ(swiglu_hidden_dim(768, 0), 2048);
  // Llama 7B's 11008 rounds to 256; weft rounds to 64 (model_config.h).
  EXPECT_EQ(swiglu_hidden_dim(4096, 0), 10944);
  EXPECT_EQ(swiglu_hidden_dim(4096, 100), 100);
}

// Output projections writing into the residual stream are drawn with init_std / sqrt(2 * layers).
TEST(MlpTest, ResidualProjectionsAreScaled) {
  ModelConfig config = small_model_config();
  config.layers = 8;
  config.init_std = 1.0;
  auto mlp = make<GeluMlp>(config);
  const auto state = mlp->state_dict();
  const auto spread = [](const Tensor& t) {
    double sum = 0;
    for (double value : t.to_vector()) sum += value * value;
    return std::sqrt(sum / static_cast<double>(t.numel()));
  };
  EXPECT_NEAR(spread(state.at("fc.weight")), 1.0, 0.15);
  EXPECT_NEAR(spread(state.at("proj.weight")), 0.25, 0.04);
}

TEST(BlockTest, GradientsMatch) {
  auto block = make<TransformerBlock>(small_model_config());
  check_layer_gradients(*block, 8, 60);
}

TEST(BlockTest, LlamaPartsGradientsMatch) {
  ModelConfig config = llama_config(small_model_config());
  config.hidden_dim = 12;
  auto block = make<TransformerBlock>(config);
  check_layer_gradients(*block, 8, 61);
}

// Whole models: gradient of the logits with respect to every parameter.
void check_model_gradients(const ModelConfig& config, uint64_t seed) {
  const auto model = build_model(config);
  const Tensor ids = token_ids(config.vocab);
  const std::vector<Tensor> parameters = f64_perturbed_parameters(*model, seed);
  expect_gradients_match([&](const std::vector<Tensor>&) { return model->logits(ids); }, parameters);
  // The loss helper agrees with cross-entropy over the flattened logits and reaches every parameter.
  for (const Tensor& parameter : parameters) Tensor(parameter).zero_grad();
  const Tensor value = loss(*model, ids, ids);
  value.backward();
  const Tensor logits = model->logits(ids);
  EXPECT_DOUBLE_EQ(value.item(), cross_entropy(logits.reshape({-1, config.vocab}), ids.reshape({-1})).item());
  for (const NamedParameter& entry : model->named_parameters()) EXPECT_TRUE(entry.tensor.grad().defined()) << entry.name;
}

TEST(ModelTest, GptGradientsMatch) { check_model_gradients(small_model_config(), 70); }

TEST(ModelTest, GptUntiedRopeGradientsMatch) {
  ModelConfig config = small_model_config();
  config.tie_embeddings = false;
  config.positions = "rope";
  config.mlp = "swiglu_mlp";
  config.hidden_dim = 12;
  check_model_gradients(config, 71);
}

TEST(ModelTest, LlamaGradientsMatch) {
  ModelConfig config = small_model_config();
  config.type = "llama";
  config.kv_heads = 1;
  config.hidden_dim = 12;
  check_model_gradients(config, 72);
}

}  // namespace
}  // namespace weft
