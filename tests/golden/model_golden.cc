// Golden test, weft side: whole models built by build_model (layers/), forward and backward in f64,
// written to JSON so that tests/golden/model_golden.py can rebuild them in plain PyTorch from the
// same weights and compare the loss and the gradient of every parameter.
//
// Two models (B = 2, T = 16, V = 50, C = 32, H = 4, 2 blocks):
//   gpt:   layer_norm, gelu_mlp, learned positions, biases, output tied to the token embedding
//   llama: rms_norm, swiglu_mlp, rope, grouped-query attention with KV = 2, no biases, untied head
// Weights are weft's own seeded draws (f32, converted exactly to f64); then every parameter is
// moved by a small seeded amount so that norm weights are not all one and biases not all zero, which
// would hide a swapped or dropped term. Usage: model_golden OUTPUT.json
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "layers/language_model.h"
#include "runtime/weft.h"
#include "tests/golden/tensor_json.h"

namespace {

using nlohmann::ordered_json;
using weft::Tensor;
using weft::golden::index_json;
using weft::golden::tensor_json;

constexpr int64_t kBatch = 2;   // B
constexpr int64_t kTime = 16;   // T
constexpr int64_t kIgnoreIndex = -100;

weft::ModelConfig base_config() {
  weft::ModelConfig config;
  config.layers = 2;
  config.dim = 32;
  config.heads = 4;
  config.vocab = 50;
  config.seq_len = 16;
  config.init_std = 0.1;
  config.seed = 20240612;
  return config;
}

weft::ModelConfig gpt_config() {
  weft::ModelConfig config = base_config();
  config.type = "gpt";
  return config;
}

weft::ModelConfig llama_config() {
  weft::ModelConfig config = base_config();
  config.type = "llama";  // the factory forces rms_norm, swiglu_mlp, rope, no bias, untied
  config.kv_heads = 2;
  config.rope_theta = 500.0;  // small, so the rotation angles vary a lot over 16 positions
  return config;
}

// ids [B, T] in [0, V) with repeats, targets [B, T] = the next token, one of them ignored.
std::pair<Tensor, Tensor> make_batch(int64_t vocab, uint64_t seed) {
  const std::vector<double> draws = Tensor::uniform({kBatch * (kTime + 1)}, seed, 0, 0.0, 1.0).to_vector();
  std::vector<int64_t> ids, targets;
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t t = 0; t < kTime; ++t) {
      const auto draw = [&](int64_t position) {
        return static_cast<int64_t>(draws[b * (kTime + 1) + position] * vocab) % vocab;
      };
      ids.push_back(draw(t));
      targets.push_back(draw(t + 1));
    }
  }
  ids[5] = ids[2];
  targets[7] = kIgnoreIndex;
  return {Tensor::from_vector(absl::Span<const int64_t>(ids), {kBatch, kTime}),
          Tensor::from_vector(absl::Span<const int64_t>(targets), {kBatch, kTime})};
}

ordered_json config_json(const weft::ModelConfig& config) {
  return {{"type", config.type},         {"layers", config.layers},     {"dim", config.dim},
          {"heads", config.heads},       {"kv_heads", config.kv_heads}, {"vocab", config.vocab},
          {"seq_len", config.seq_len},   {"hidden_dim", config.hidden_dim}, {"rope_theta", config.rope_theta},
          {"norm_eps", config.norm_eps}, {"seed", config.seed}};
}

ordered_json run(const weft::ModelConfig& config, const Tensor& ids, const Tensor& targets) {
  const std::shared_ptr<weft::LanguageModel> model = weft::build_model(config);
  model->to(weft::kFloat64);
  std::map<std::string, Tensor> moved;
  uint64_t offset = 0;
  for (const weft::NamedParameter& entry : model->named_parameters()) {
    const Tensor noise = Tensor::normal(entry.tensor.shape(), config.seed + 1, offset, 0.0, 0.05, weft::kFloat64);
    offset += static_cast<uint64_t>(entry.tensor.numel());
    moved.emplace(entry.name, weft::add(entry.tensor.detach(), noise));
  }
  model->load_state_dict(moved);

  const Tensor loss = weft::loss(*model, ids, targets, kIgnoreIndex);
  loss.backward();

  ordered_json out;
  out["config"] = config_json(config);
  out["summary"] = model->summary();
  out["loss"] = loss.item();
  std::vector<std::pair<std::string, Tensor>> named;
  for (const weft::NamedParameter& entry : model->named_parameters()) named.emplace_back(entry.name, entry.tensor);
  weft::golden::add_weights_and_grads(out, named);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  return weft::golden::golden_main(argc, argv, "model_golden", [] {
    const auto [ids, targets] = make_batch(base_config().vocab, base_config().seed + 7);
    ordered_json document;
    document["batch"] = kBatch;
    document["time"] = kTime;
    document["ignore_index"] = kIgnoreIndex;
    document["ids"] = index_json(ids);
    document["targets"] = index_json(targets);
    document["models"] = ordered_json::array({run(gpt_config(), ids, targets), run(llama_config(), ids, targets)});
    return document;
  });
}
