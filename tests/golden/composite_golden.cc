// Golden test, weft side: one GPT-style transformer block, forward and backward, written to JSON so
// that tests/golden/composite_golden.py can rebuild the same computation in PyTorch from the exact
// same weights and compare the loss and every gradient.
//
// The composite (B = 2, T = 8, V = 17, C = 16, H = 2 heads of D = 8):
//   ids [B, T] -> embedding(wte [V, C]) + embedding(positions, wpe [T, C])        x [B, T, C]
//   x = x + proj(causal_attention(split_heads(linear(layer_norm_1(x), w_qkv, b_qkv))))
//   x = x + linear(gelu(linear(layer_norm_2(x), w_fc, b_fc)), w_proj, b_proj)
//   logits = linear(layer_norm_f(x), wte)  (tied, no bias)                        [B*T, V]
//   loss = cross_entropy(logits, targets [B*T], ignore_index = -100), one target ignored.
//
// It runs twice, in f64 (for a tight comparison) and in f32. Every weight is drawn by weft's
// counter-based generator in f32 (so the f64 run holds the same values, exactly), then marked as a
// parameter. Usage: composite_golden OUTPUT.json
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/weft.h"
#include "tests/golden/tensor_json.h"

namespace {

using nlohmann::ordered_json;
using weft::Tensor;
using weft::golden::index_json;
using weft::golden::tensor_json;

constexpr int64_t kBatch = 2;      // B
constexpr int64_t kTime = 8;       // T
constexpr int64_t kVocab = 17;     // V
constexpr int64_t kChannels = 16;  // C
constexpr int64_t kHeads = 2;      // H
constexpr int64_t kHeadDim = kChannels / kHeads;  // D
constexpr int64_t kIgnoreIndex = -100;
constexpr uint64_t kSeed = 20240611;

// The model's parameters, in the order they are written to JSON.
struct Parameters {
  std::vector<std::pair<std::string, Tensor>> named;
  const Tensor& operator[](const std::string& name) const {
    for (const auto& [parameter_name, tensor] : named) {
      if (parameter_name == name) return tensor;
    }
    throw weft::Error("no parameter named " + name);
  }
};

// Draws every parameter from (kSeed, a distinct counter range), in f32, converted to `dtype`.
Parameters make_parameters(weft::DType dtype) {
  Parameters parameters;
  uint64_t offset = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, double mean, double std) {
    Tensor values = Tensor::normal(shape, kSeed, offset, mean, std, weft::kFloat32).to(dtype);
    offset += static_cast<uint64_t>(values.numel());
    values.set_requires_grad(true);
    parameters.named.emplace_back(name, values);
  };
  const int64_t C = kChannels;
  add("wte", {kVocab, C}, 0.0, 0.2);       // [V, C], also the output head (tied)
  add("wpe", {kTime, C}, 0.0, 0.2);        // [T, C]
  add("ln1_weight", {C}, 1.0, 0.1);        // [C]
  add("ln1_bias", {C}, 0.0, 0.1);          // [C]
  add("attn_qkv_weight", {3 * C, C}, 0.0, 0.2);  // [3C, C]
  add("attn_qkv_bias", {3 * C}, 0.0, 0.1);       // [3C]
  add("attn_proj_weight", {C, C}, 0.0, 0.2);     // [C, C]
  add("attn_proj_bias", {C}, 0.0, 0.1);          // [C]
  add("ln2_weight", {C}, 1.0, 0.1);              // [C]
  add("ln2_bias", {C}, 0.0, 0.1);                // [C]
  add("mlp_fc_weight", {4 * C, C}, 0.0, 0.2);    // [4C, C]
  add("mlp_fc_bias", {4 * C}, 0.0, 0.1);         // [4C]
  add("mlp_proj_weight", {C, 4 * C}, 0.0, 0.2);  // [C, 4C]
  add("mlp_proj_bias", {C}, 0.0, 0.1);           // [C]
  add("lnf_weight", {C}, 1.0, 0.1);              // [C]
  add("lnf_bias", {C}, 0.0, 0.1);                // [C]
  return parameters;
}

// Token ids [B, T] in [0, V) with repeats (so the embedding gradient must accumulate rows), and
// targets [B*T] = the next token, with one row set to kIgnoreIndex.
std::pair<Tensor, Tensor> make_batch() {
  const std::vector<double> draws = Tensor::uniform({kBatch * (kTime + 1)}, kSeed + 1, 0, 0.0, 1.0).to_vector();
  std::vector<int64_t> ids, targets;
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t t = 0; t < kTime; ++t) {
      const auto draw = [&](int64_t position) {
        return static_cast<int64_t>(draws[b * (kTime + 1) + position] * kVocab) % kVocab;
      };
      ids.push_back(draw(t));
      targets.push_back(draw(t + 1));
    }
  }
  ids[3] = ids[1];  // a guaranteed repeat
  targets[5] = kIgnoreIndex;
  return {Tensor::from_vector(absl::Span<const int64_t>(ids), {kBatch, kTime}),
          Tensor::from_vector(absl::Span<const int64_t>(targets), {kBatch * kTime})};
}

// [B, T, C] -> [B, H, T, D]
Tensor split_heads(const Tensor& x) { return x.view({kBatch, kTime, kHeads, kHeadDim}).permute({0, 2, 1, 3}); }

// [B, H, T, D] -> [B, T, C]
Tensor merge_heads(const Tensor& x) { return x.permute({0, 2, 1, 3}).contiguous().view({kBatch, kTime, kChannels}); }

struct Result {
  Tensor logits;  // [B*T, V]
  Tensor loss;    // scalar
};

Result forward(const Parameters& p, const Tensor& ids, const Tensor& targets) {
  const Tensor positions = Tensor::arange(kTime);                                           // [T]
  Tensor x = weft::embedding(ids, p["wte"]) + weft::embedding(positions, p["wpe"]);      // [B, T, C]

  const Tensor qkv = weft::linear(weft::layer_norm(x, p["ln1_weight"], p["ln1_bias"]), p["attn_qkv_weight"],
                                  p["attn_qkv_bias"]);                                   // [B, T, 3C]
  const std::vector<Tensor> q_k_v = weft::split(qkv, {kChannels, kChannels, kChannels}, -1);  // 3 x [B, T, C]
  const Tensor attended = weft::causal_attention(split_heads(q_k_v[0]), split_heads(q_k_v[1]),
                                                 split_heads(q_k_v[2]));                 // [B, H, T, D]
  x = x + weft::linear(merge_heads(attended), p["attn_proj_weight"], p["attn_proj_bias"]);

  const Tensor hidden = weft::gelu(weft::linear(weft::layer_norm(x, p["ln2_weight"], p["ln2_bias"]),
                                                p["mlp_fc_weight"], p["mlp_fc_bias"]));  // [B, T, 4C]
  x = x + weft::linear(hidden, p["mlp_proj_weight"], p["mlp_proj_bias"]);

  const Tensor final_x = weft::layer_norm(x, p["lnf_weight"], p["lnf_bias"]).view({kBatch * kTime, kChannels});
  Result result;
  result.logits = weft::linear(final_x, p["wte"]);  // [B*T, V]
  result.loss = weft::cross_entropy(result.logits, targets, kIgnoreIndex);
  return result;
}

ordered_json run(weft::DType dtype, const Tensor& ids, const Tensor& targets) {
  const Parameters parameters = make_parameters(dtype);
  const Result result = forward(parameters, ids, targets);
  result.loss.backward();

  ordered_json out;
  out["dtype"] = std::string(weft::dtype_name(dtype));
  out["loss"] = result.loss.item();
  out["logits"] = tensor_json(result.logits.detach());
  weft::golden::add_weights_and_grads(out, parameters.named);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  return weft::golden::golden_main(argc, argv, "composite_golden", [] {
    const auto [ids, targets] = make_batch();
    ordered_json document;
    document["config"] = {{"batch", kBatch},       {"time", kTime},   {"vocab", kVocab},
                          {"channels", kChannels}, {"heads", kHeads}, {"head_dim", kHeadDim},
                          {"ignore_index", kIgnoreIndex}, {"layer_norm_eps", 1e-5}, {"seed", kSeed}};
    document["ids"] = index_json(ids);
    document["targets"] = index_json(targets);
    document["runs"] = ordered_json::array({run(weft::kFloat64, ids, targets), run(weft::kFloat32, ids, targets)});
    return document;
  });
}
