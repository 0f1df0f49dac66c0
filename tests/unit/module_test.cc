// Module, LayerRegistry and build_model: names, state dicts, conversion, summaries, errors.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/error_expectations.h"
#include "tests/support/small_model_config.h"
#include "layers/gpt.h"
#include "layers/language_model.h"
#include "layers/linear.h"
#include "layers/llama.h"
#include "layers/mlp.h"
#include "layers/registry.h"
#include "layers/dropout_stream.h"
#include "runtime/weft.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

// gmock is not linked into the unit tests; this is the one matcher they need.
#define EXPECT_CONTAINS(text, part)                                                     \
  do {                                                                                  \
    const std::string contains_text = (text);                                           \
    EXPECT_NE(contains_text.find(part), std::string::npos)                              \
        << "expected to find: " << (part) << "\nin: " << contains_text;                \
  } while (0)

// The layer tests' small config (tests/support) with V = 11 and the given model type.
ModelConfig tiny_config(const std::string& type = "gpt") {
  ModelConfig config = testing::small_model_config();
  config.type = type;
  config.vocab = 11;
  return config;
}

std::vector<std::string> names_of(const Module& module) {
  std::vector<std::string> names;
  for (const NamedParameter& entry : module.named_parameters()) names.push_back(entry.name);
  return names;
}

// Two levels of hand-made modules, to pin down naming without the built-in layers.
class Leaf : public Module {
 public:
  explicit Leaf(int64_t size) {
    register_parameter("a", Tensor::zeros({size}));
    register_parameter("b", Tensor::ones({size, 2}));
  }
  std::string type_name() const override { return "Leaf"; }
};

class Tree : public Module {
 public:
  Tree() {
    register_parameter("root", Tensor::zeros({3}));
    first = register_module("first", std::make_shared<Leaf>(2));
    second = register_module("second", std::make_shared<Leaf>(4));
  }
  std::string type_name() const override { return "Tree"; }
  std::shared_ptr<Leaf> first, second;
};

TEST(ModuleTest, NamesAreDottedInRegistrationOrder) {
  Tree tree;
  EXPECT_EQ(names_of(tree), (std::vector<std::string>{"root", "first.a", "first.b", "second.a", "second.b"}));
  EXPECT_EQ(tree.parameter_count(), 3 + 2 + 4 + 4 + 8);
  ASSERT_EQ(tree.children().size(), 2u);
  EXPECT_EQ(tree.children()[1].first, "second");
}

TEST(ModuleTest, GptNamesFollowConstructionOrder) {
  const auto model = build_model(tiny_config());
  const std::vector<std::string> names = names_of(*model);
  const std::vector<std::string> expected_prefix = {
      "token_embedding.weight",        "position_embedding.weight",     "blocks.0.norm1.weight",
      "blocks.0.norm1.bias",           "blocks.0.attention.qkv.weight", "blocks.0.attention.qkv.bias",
      "blocks.0.attention.proj.weight", "blocks.0.attention.proj.bias", "blocks.0.norm2.weight",
      "blocks.0.norm2.bias",           "blocks.0.mlp.fc.weight",        "blocks.0.mlp.fc.bias",
      "blocks.0.mlp.proj.weight",      "blocks.0.mlp.proj.bias",        "blocks.1.norm1.weight"};
  ASSERT_GE(names.size(), expected_prefix.size());
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + expected_prefix.size()), expected_prefix);
  EXPECT_EQ(names[names.size() - 2], "final_norm.weight");
  EXPECT_EQ(names.back(), "final_norm.bias");  // tied: no head
}

// keep_gradients_adjacent: the named parameters (relative paths, consecutive in registration
// order) get one gradient_group, distinct per module instance; a path that is not the next
// registered parameter is an error naming it.
TEST(ModuleTest, GradientGroupsNameConsecutiveParameters) {
  class Grouped : public Module {
   public:
    explicit Grouped(std::vector<std::string> paths) {
      register_module("first", std::make_shared<Leaf>(2));
      register_module("second", std::make_shared<Leaf>(2));
      keep_gradients_adjacent(std::move(paths));
    }
    std::string type_name() const override { return "Grouped"; }
  };
  class Twice : public Module {
   public:
    Twice() {
      register_module("x", std::make_shared<Grouped>(std::vector<std::string>{"first.b", "second.a"}));
      register_module("y", std::make_shared<Grouped>(std::vector<std::string>{"first.b", "second.a"}));
    }
    std::string type_name() const override { return "Twice"; }
  };
  std::map<std::string, std::string> groups;
  for (const NamedParameter& entry : Twice().named_parameters()) groups[entry.name] = entry.gradient_group;
  EXPECT_TRUE(groups.at("x.first.a").empty());
  EXPECT_FALSE(groups.at("x.first.b").empty());
  EXPECT_EQ(groups.at("x.first.b"), groups.at("x.second.a"));
  EXPECT_TRUE(groups.at("x.second.b").empty());
  EXPECT_NE(groups.at("x.first.b"), groups.at("y.first.b"));
  EXPECT_EQ(groups.at("y.first.b"), groups.at("y.second.a"));
  // Not consecutive (first.b, then second.a, comes between first.a and second.b).
  const std::string message = error_message([] { Grouped({"first.a", "second.b"}).named_parameters(); });
  EXPECT_CONTAINS(message, "second.b");
  EXPECT_CONTAINS(message, "right after");
}

TEST(ModuleTest, ParametersAreLeavesRequiringGrad) {
  const auto model = build_model(tiny_config("llama"));
  for (const NamedParameter& entry : model->named_parameters()) {
    EXPECT_TRUE(entry.tensor.is_leaf()) << entry.name;
    EXPECT_TRUE(entry.tensor.requires_grad()) << entry.name;
    EXPECT_EQ(entry.layout, Layout::replicate()) << entry.name;
  }
}

TEST(ModuleTest, RegisterParameterDetachesResultsOfOps) {
  Tree tree;
  const Tensor source = Tensor::ones({2}).set_requires_grad(true);
  const Tensor computed = source * 2.0;
  ASSERT_FALSE(computed.is_leaf());
  const Tensor parameter = tree.register_parameter("computed", computed);
  EXPECT_TRUE(parameter.is_leaf());
  EXPECT_TRUE(parameter.requires_grad());
}

TEST(ModuleTest, NamesAreRegisteredOnce) {
  Tree tree;
  EXPECT_CONTAINS(error_message([&] { tree.register_parameter("root", Tensor::zeros({1})); }), "'root'");
  EXPECT_CONTAINS(error_message([&] { tree.register_module("first", std::make_shared<Leaf>(1)); }), "'first'");
  EXPECT_CONTAINS(error_message([&] { tree.register_parameter("a.b", Tensor::zeros({1})); }), "'.'");
  EXPECT_CONTAINS(error_message([&] { tree.register_parameter("ids", Tensor::zeros({1}, kInt64)); }),
              "floating");
}

TEST(ModuleTest, SameSeedBuildsSameWeightsAndOtherSeedsDiffer) {
  ModelConfig config = tiny_config("llama");
  const auto first = build_model(config);
  const auto second = build_model(config);
  config.seed = 2;
  const auto third = build_model(config);
  const auto a = first->state_dict(), b = second->state_dict(), c = third->state_dict();
  for (const auto& [name, tensor] : a) {
    EXPECT_EQ(tensor.to_vector(), b.at(name).to_vector()) << name;
  }
  EXPECT_NE(a.at("blocks.1.mlp.down.weight").to_vector(), c.at("blocks.1.mlp.down.weight").to_vector());
  // Distinct layers draw distinct weights (their offsets do not overlap).
  EXPECT_NE(a.at("blocks.0.attention.qkv.weight").to_vector(), a.at("blocks.1.attention.qkv.weight").to_vector());
}

TEST(ModuleTest, StateDictRoundTrip) {
  ModelConfig config = tiny_config();
  const auto source = build_model(config);
  config.seed = 7;
  const auto target = build_model(config);
  const auto state = source->state_dict();
  // state_dict() holds the live tensors.
  EXPECT_TRUE(state.at("token_embedding.weight").is_same(source->named_parameters()[0].tensor));
  target->load_state_dict(state);
  const auto loaded = target->state_dict();
  ASSERT_EQ(loaded.size(), state.size());
  for (const auto& [name, tensor] : state) {
    EXPECT_EQ(loaded.at(name).to_vector(), tensor.to_vector()) << name;
    EXPECT_FALSE(loaded.at(name).is_same(tensor)) << name << ": values are copied, not aliased";
    EXPECT_TRUE(loaded.at(name).is_leaf() && loaded.at(name).requires_grad()) << name;
  }
}

// Every error path: the message names the parameter, and the model is left as it was.
TEST(ModuleTest, LoadStateDictErrorsModifyNothing) {
  ModelConfig config = tiny_config();
  const auto model = build_model(config);
  config.seed = 9;
  const auto other = build_model(config);
  const std::map<std::string, Tensor> before = [&] {
    std::map<std::string, Tensor> copy;
    for (const auto& [name, tensor] : model->state_dict()) copy.emplace(name, tensor.clone());
    return copy;
  }();
  const auto expect_unchanged = [&] {
    for (const auto& [name, tensor] : model->state_dict()) EXPECT_EQ(tensor.to_vector(), before.at(name).to_vector()) << name;
  };

  auto missing = other->state_dict();
  missing.erase("blocks.1.mlp.fc.bias");
  EXPECT_CONTAINS(error_message([&] { model->load_state_dict(missing); }), "missing parameter 'blocks.1.mlp.fc.bias'");
  expect_unchanged();

  auto unexpected = other->state_dict();
  unexpected.emplace("blocks.9.mlp.fc.bias", Tensor::zeros({4}));
  EXPECT_CONTAINS(error_message([&] { model->load_state_dict(unexpected); }),
              "unexpected parameter 'blocks.9.mlp.fc.bias'");
  expect_unchanged();

  auto wrong_shape = other->state_dict();
  wrong_shape["final_norm.weight"] = Tensor::ones({9});
  const std::string message = error_message([&] { model->load_state_dict(wrong_shape); });
  EXPECT_CONTAINS(message, "'final_norm.weight' has shape [9]");
  EXPECT_CONTAINS(message, "expects [8]");
  expect_unchanged();
}

TEST(ModuleTest, LoadStateDictConvertsDtype) {
  const auto model = build_model(tiny_config());
  std::map<std::string, Tensor> state;
  for (const auto& [name, tensor] : model->state_dict()) state.emplace(name, Tensor::full(tensor.shape(), 0.5, kFloat64));
  model->load_state_dict(state);
  for (const auto& [name, tensor] : model->state_dict()) {
    EXPECT_EQ(tensor.dtype(), kFloat32);
    EXPECT_EQ(tensor.at(std::vector<int64_t>(tensor.dim(), 0)), 0.5) << name;
  }
}

TEST(ModuleTest, TrainAndEvalPropagate) {
  const auto model = build_model(tiny_config());
  const auto all_modes = [](const Module& root) {
    std::vector<bool> modes;
    std::function<void(const Module&)> walk = [&](const Module& module) {
      modes.push_back(module.is_training());
      for (const auto& [name, child] : module.children()) walk(*child);
    };
    walk(root);
    return modes;
  };
  const auto all_equal = [](const std::vector<bool>& modes, bool value) {
    return std::all_of(modes.begin(), modes.end(), [&](bool mode) { return mode == value; });
  };
  EXPECT_TRUE(all_equal(all_modes(*model), true));
  model->eval();
  EXPECT_GT(all_modes(*model).size(), 10u);
  EXPECT_TRUE(all_equal(all_modes(*model), false));
  model->train();
  EXPECT_TRUE(all_equal(all_modes(*model), true));
}

TEST(ModuleTest, ToConvertsParametersAndBuffersInPlace) {
  const auto model = build_model(tiny_config("llama"));
  const std::vector<std::string> names = names_of(*model);
  const auto before = model->state_dict();
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {1, 4});
  loss(*model, ids, ids).backward();
  model->to(kFloat64);
  EXPECT_EQ(names_of(*model), names);
  for (const auto& [name, tensor] : model->state_dict()) {
    EXPECT_EQ(tensor.dtype(), kFloat64) << name;
    EXPECT_TRUE(tensor.is_leaf() && tensor.requires_grad()) << name;
    EXPECT_FALSE(tensor.grad().defined()) << name << ": gradients are dropped";
    EXPECT_EQ(tensor.to_vector(), before.at(name).to_vector()) << name << ": f32 -> f64 is exact";
  }
  // The forward uses the converted tensors, buffers (rope tables) included.
  const Tensor logits = model->logits(ids);
  EXPECT_EQ(logits.dtype(), kFloat64);
  EXPECT_THROW(model->to(kInt64), Error);
}

TEST(ModuleTest, SummaryListsEveryLayerAndTheTotal) {
  ModelConfig config = tiny_config();
  config.tie_embeddings = false;
  const auto model = build_model(config);
  const std::string summary = model->summary();
  const int64_t C = 8, V = 11, T = 6, hidden = 4 * C;
  const int64_t block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (hidden * C + hidden) + (C * hidden + C);
  const int64_t expected = V * C + T * C + 2 * block + 2 * C + V * C;
  EXPECT_EQ(model->parameter_count(), expected);
  for (const char* part : {"GPT(", "token_embedding  Embedding(11 x 8)", "position_embedding  Embedding(6 x 8)",
                           "blocks  ModuleList(2)", "0  TransformerBlock", "1  TransformerBlock",
                           "attention  CausalSelfAttention(heads 2", "qkv  Linear(8 -> 24, bias)",
                           "mlp  GeluMlp(8 -> 32 -> 8)", "final_norm  LayerNorm(8", "head  Linear(8 -> 11)"}) {
    EXPECT_CONTAINS(summary, part);
  }
  EXPECT_CONTAINS(summary, "total parameters");
  ASSERT_EQ(expected, 1984);
  const std::string last_line = summary.substr(summary.rfind('\n', summary.size() - 2) + 1);
  EXPECT_EQ(last_line.substr(0, 16), "total parameters") << summary;
  EXPECT_EQ(last_line.substr(last_line.size() - 6), "1,984\n") << summary;
  // Children are indented below their parent.
  EXPECT_CONTAINS(summary, "\n    0  TransformerBlock");
  EXPECT_CONTAINS(summary, "\n      attention  CausalSelfAttention");
}

TEST(RegistryTest, BuiltInsAreRegistered) {
  for (const char* name : {"gpt", "llama", "layer_norm", "rms_norm", "gelu_mlp", "swiglu_mlp",
                           "causal_self_attention", "transformer_block"}) {
    EXPECT_TRUE(LayerRegistry::global().contains(name)) << name;
  }
}

TEST(RegistryTest, UnknownNameListsNamesAndNearest) {
  const ModelConfig config = tiny_config();
  uint64_t offset = 0;
  const LayerContext context{config, &offset};
  const std::string message = error_message([&] { LayerRegistry::global().create("swiglu_mpl", context); });
  EXPECT_CONTAINS(message, "unknown layer type 'swiglu_mpl'");
  EXPECT_CONTAINS(message, "gelu_mlp, gpt");
  EXPECT_CONTAINS(message, "did you mean 'swiglu_mlp'?");

  ModelConfig typo = tiny_config();
  typo.norm = "rmsnorm";
  EXPECT_CONTAINS(error_message([&] { build_model(typo); }), "did you mean 'rms_norm'?");
}

TEST(RegistryTest, DuplicateRegistrationIsAnError) {
  LayerRegistry registry;
  const LayerFactory factory = [](const LayerContext& context) { return std::make_shared<Leaf>(1); };
  registry.add("leaf", factory);
  EXPECT_CONTAINS(error_message([&] { registry.add("leaf", factory); }), "'leaf' is already registered");
  EXPECT_CONTAINS(error_message([&] { LayerRegistry::global().add("gpt", factory); }), "'gpt' is already registered");
}

// A user's MLP plugs into the built-in block by name, exactly like the built-in MLPs.
class SquaredReluMlp : public Module {
 public:
  explicit SquaredReluMlp(const LayerContext& context) {
    fc_ = register_module("fc", std::make_shared<Linear>(context.config.dim, 2 * context.config.dim, false, context));
    proj_ = register_module("proj", std::make_shared<Linear>(2 * context.config.dim, context.config.dim, false, context));
  }
  std::string type_name() const override { return "SquaredReluMlp"; }
  Tensor forward(const Tensor& x) override { return proj_->forward(square(relu(fc_->forward(x)))); }

 private:
  std::shared_ptr<Linear> fc_, proj_;
};

WEFT_REGISTER_LAYER("test_squared_relu_mlp",
                    [](const LayerContext& context) { return std::make_shared<SquaredReluMlp>(context); });

TEST(RegistryTest, CustomMlpPlugsInByName) {
  ModelConfig config = tiny_config();
  config.mlp = "test_squared_relu_mlp";
  const auto model = build_model(config);
  EXPECT_CONTAINS(model->summary(), "mlp  SquaredReluMlp");
  const auto state = model->state_dict();
  EXPECT_EQ(state.at("blocks.1.mlp.fc.weight").shape(), (Shape{16, 8}));
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  loss(*model, ids, ids).backward();
  EXPECT_TRUE(state.at("blocks.0.mlp.fc.weight").grad().defined());
}

TEST(BuildModelTest, ValidationNamesTheKey) {
  const auto message_for = [](const std::function<void(ModelConfig&)>& change) {
    ModelConfig config = tiny_config();
    change(config);
    return error_message([&] { build_model(config); });
  };
  EXPECT_CONTAINS(message_for([](ModelConfig& c) { c.dim = 64, c.heads = 5; }),
              "model.heads = 5 does not divide model.dim = 64");
  EXPECT_CONTAINS(message_for([](ModelConfig& c) { c.heads = 4, c.kv_heads = 3; }),
              "model.kv_heads = 3 does not divide model.heads = 4");
  EXPECT_CONTAINS(message_for([](ModelConfig& c) { c.positions = "alibi"; }), "model.positions = 'alibi'");
  EXPECT_CONTAINS(message_for([](ModelConfig& c) { c.seq_len = 0; }), "model.seq_len = 0");
  EXPECT_CONTAINS(message_for([](ModelConfig& c) { c.vocab = 0; }), "model.vocab = 0");
  EXPECT_CONTAINS(message_for([](ModelConfig& c) { c.dim = 6, c.heads = 2, c.positions = "rope"; }),
              "even head dim");
  EXPECT_CONTAINS(message_for([](ModelConfig& c) { c.type = "gelu_mlp"; }), "not a language model");
  EXPECT_CONTAINS(message_for([](ModelConfig& c) { c.type = "lama"; }), "did you mean 'llama'?");
}

TEST(BuildModelTest, LlamaForcesItsParts) {
  ModelConfig config = tiny_config("llama");
  config.kv_heads = 1;
  const auto model = build_model(config);
  const std::string summary = model->summary();
  EXPECT_CONTAINS(summary, "Llama(");
  EXPECT_CONTAINS(summary, "RmsNorm");
  EXPECT_CONTAINS(summary, "SwigluMlp(8 -> 2 x 64 -> 8)");
  EXPECT_CONTAINS(summary, "kv_heads 1");
  EXPECT_CONTAINS(summary, "rope");
  const auto state = model->state_dict();
  EXPECT_FALSE(state.contains("position_embedding.weight"));
  EXPECT_TRUE(state.contains("head.weight"));
  for (const auto& [name, tensor] : state) EXPECT_EQ(name.find("bias"), std::string::npos) << name;
  EXPECT_EQ(state.at("blocks.0.attention.qkv.weight").shape(), (Shape{(2 + 2 * 1) * 4, 8}));
}

TEST(BuildModelTest, LogitsShapeAndSequenceLimit) {
  const auto model = build_model(tiny_config());
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(model->logits(ids).shape(), (Shape{2, 3, 11}));
  const Tensor too_long = Tensor::zeros({1, 7}, kInt64);
  EXPECT_CONTAINS(error_message([&] { model->logits(too_long); }), "model.seq_len = 6");
}

TEST(DropoutTest, OnlyInTrainingAndFreshMaskPerCall) {
  ModelConfig config = tiny_config();
  config.dropout = 0.5;
  const auto model = build_model(config);
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  const std::vector<double> first = model->logits(ids).to_vector();
  const std::vector<double> second = model->logits(ids).to_vector();
  EXPECT_NE(first, second);
  model->eval();
  const std::vector<double> evaluated = model->logits(ids).to_vector();
  EXPECT_EQ(evaluated, model->logits(ids).to_vector());
  EXPECT_NE(evaluated, first);
  // Two builds replay the same masks.
  const auto twin = build_model(config);
  EXPECT_EQ(twin->logits(ids).to_vector(), first);
}

TEST(ModuleTest, ShardParameterReplacesTheTensorAndLayout) {
  Tree tree;
  tree.first->shard_parameter("b", Tensor::ones({1, 2}), Layout::split(0));
  tree.first->mark_partial_gradient("a");
  const std::vector<NamedParameter> parameters = tree.named_parameters();
  ASSERT_EQ(parameters[2].name, "first.b");
  EXPECT_EQ(parameters[2].tensor.shape(), (Shape{1, 2}));
  EXPECT_TRUE(parameters[2].tensor.requires_grad());
  EXPECT_EQ(parameters[2].layout, Layout::split(0));
  EXPECT_TRUE(parameters[1].partial_gradient);    // first.a
  EXPECT_FALSE(parameters[2].partial_gradient);
  tree.to(kFloat64);  // conversion keeps layouts and flags
  EXPECT_EQ(tree.named_parameters()[2].layout, Layout::split(0));
  EXPECT_TRUE(tree.named_parameters()[1].partial_gradient);
  EXPECT_CONTAINS(error_message([&] { tree.first->shard_parameter("c", Tensor::ones({1}), Layout::split(0)); }),
                  "no parameter 'c'");
  EXPECT_CONTAINS(error_message([&] { tree.first->shard_parameter("b", Tensor::ones({1, 2}, kFloat32), Layout::split(0)); }),
                  "dtype and device");
}

class Doubler : public Module {
 public:
  std::string type_name() const override { return "Doubler"; }
  Tensor forward(const Tensor& x) override { return scale(x, 2.0); }
};

TEST(ModuleTest, CallRunsTheForwardWrapper) {
  Doubler doubler;
  const Tensor x = Tensor::ones({2});
  EXPECT_EQ(doubler.call(x).to_vector(), (std::vector<double>{2, 2}));
  doubler.wrap_forward([](const Tensor& input, const std::function<Tensor(const Tensor&)>& forward) {
    return add(forward(input), Tensor::ones({2}));
  });
  EXPECT_TRUE(doubler.has_forward_wrapper());
  EXPECT_EQ(doubler.call(x).to_vector(), (std::vector<double>{3, 3}));
  EXPECT_EQ(doubler.forward(x).to_vector(), (std::vector<double>{2, 2}));  // forward is the layer's own
  EXPECT_CONTAINS(error_message([&] {
                    doubler.wrap_forward([](const Tensor& input, const std::function<Tensor(const Tensor&)>&) {
                      return input;
                    });
                  }),
                  "already wrapped");
}

TEST(DropoutTest, SequenceShardsDrawTheChunksOfTheOneProcessMask) {
  // [B 2, T 4, C 3] dropped in one process against the same tensor's sequence chunks on 2 "ranks"
  // (and on 2 dp ranks x 2 sequence ranks): every chunk gets the part of the mask it has there.
  const Tensor x = Tensor::uniform({4, 4, 3}, 7, 0, 1.0, 2.0);
  DropoutStream whole(0.5, 3, 11);
  const Tensor expected = whole.apply(x, true);  // [4, 4, 3]
  for (int64_t dp_world : {1, 2}) {
    for (int64_t dp_rank = 0; dp_rank < dp_world; ++dp_rank) {
      for (int64_t rank = 0; rank < 2; ++rank) {
        DropoutStream part(0.5, 3, 11);
        part.set_shard(dp_rank, dp_world);
        part.set_sequence_shard(rank, 2);
        const int64_t rows = 4 / dp_world;
        const Tensor chunk = x.narrow(0, dp_rank * rows, rows).narrow(1, rank * 2, 2);
        const Tensor got = part.apply(chunk, true);
        EXPECT_EQ(got.to_vector(), expected.narrow(0, dp_rank * rows, rows).narrow(1, rank * 2, 2).to_vector())
            << "dp " << dp_rank << "/" << dp_world << ", sequence " << rank;
        EXPECT_EQ(part.offset(), whole.offset());  // the counter advanced by the whole tensor
      }
    }
  }
}

}  // namespace
}  // namespace weft
