#include "launcher/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <unistd.h>

#include "launcher/config_loader.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"
#include "runtime/ops/softmax.h"
#include "runtime/random.h"

namespace weft {
namespace {

// The run config saved in a checkpoint, parsed with the same loader as a YAML file.
RunConfig stored_config(const LoadedCheckpoint& checkpoint) {
  WEFT_CHECK(checkpoint.state.contains("config") && checkpoint.state.at("config").is_string(), "checkpoint ",
             checkpoint.path, " has no stored config in state.json; it was not written by weft-train");
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("weft-generate-config-" + std::to_string(getpid()) + ".yaml");
  {
    std::ofstream out(file);
    out << checkpoint.state.at("config").get<std::string>();
  }
  RunConfig config;
  try {
    config = load_config({file.string()}, {});
  } catch (...) {
    std::filesystem::remove(file);
    throw;
  }
  std::filesystem::remove(file);
  return config;
}

}  // namespace

Sampler::Sampler(const LoadedCheckpoint& checkpoint) : config_(stored_config(checkpoint)) {
  model_ = build_model(config_.model);
  std::map<std::string, Tensor> weights;
  for (const auto& [name, tensor] : checkpoint.tensors) {
    if (name.rfind("model.", 0) == 0) weights[name.substr(6)] = tensor.to(kFloat32);
  }
  model_->load_state_dict(weights);
  model_->eval();
}

std::vector<int64_t> Sampler::sample(const std::vector<int64_t>& prompt, const SamplingOptions& options) {
  WEFT_CHECK(options.temperature > 0, "temperature must be positive, got ", options.temperature);
  WEFT_CHECK(!prompt.empty(), "the prompt is empty; give at least one token");
  autograd::NoGradGuard no_grad;
  std::vector<int64_t> tokens = prompt;
  const int64_t vocabulary = config_.model.vocab;
  for (int64_t i = 0; i < options.tokens; ++i) {
    const int64_t window = std::min<int64_t>(static_cast<int64_t>(tokens.size()), config_.model.seq_len);
    std::vector<int64_t> context(tokens.end() - window, tokens.end());
    Tensor logits = model_->logits(Tensor::from_vector(absl::Span<const int64_t>(context), {1, window}));
    std::vector<double> last = logits.select(1, window - 1).reshape({vocabulary}).to_vector();
    // Temperature, then keep the top k (ties at the threshold kept), then normalise.
    for (double& value : last) value /= options.temperature;
    if (options.top_k > 0 && options.top_k < vocabulary) {
      std::vector<double> sorted = last;
      std::nth_element(sorted.begin(), sorted.begin() + (options.top_k - 1), sorted.end(), std::greater<>());
      const double threshold = sorted[options.top_k - 1];
      for (double& value : last) {
        if (value < threshold) value = -INFINITY;
      }
    }
    const double maximum = *std::max_element(last.begin(), last.end());
    double total = 0;
    for (double& value : last) total += (value = std::exp(value - maximum));
    const double draw = philox_uniform(options.seed, static_cast<uint64_t>(i)) * total;
    double cumulative = 0;
    int64_t choice = vocabulary - 1;
    for (int64_t v = 0; v < vocabulary; ++v) {
      cumulative += last[v];
      if (draw < cumulative) {
        choice = v;
        break;
      }
    }
    tokens.push_back(choice);
  }
  return std::vector<int64_t>(tokens.begin() + static_cast<int64_t>(prompt.size()), tokens.end());
}

std::string Sampler::generate(const std::string& prompt, const SamplingOptions& options) {
  if (config_.data.format == "text") {
    std::vector<int64_t> ids;
    for (unsigned char byte : prompt) ids.push_back(byte);
    std::string text = prompt;
    for (int64_t id : sample(ids, options)) text.push_back(static_cast<char>(id));
    return text;
  }
  std::vector<int64_t> ids;
  std::istringstream words(prompt);
  for (int64_t id; words >> id;) {
    WEFT_CHECK(id >= 0 && id < config_.model.vocab, "prompt token ", id, " is outside [0, ", config_.model.vocab, ")");
    ids.push_back(id);
  }
  WEFT_CHECK(!ids.empty(), "this model reads token ids (data.format: tokens): give the prompt as space-separated ids");
  std::ostringstream out;
  for (int64_t id : sample(ids, options)) out << id << ' ';
  return out.str();
}

}  // namespace weft
