// Sampler: autoregressive sampling from a trained LanguageModel restored from a checkpoint.
//
// The model is rebuilt from the run config stored in the checkpoint's state.json and loaded with
// its weights. Each new token is drawn from softmax(logits / temperature), optionally restricted
// to the top k, with Philox(seed) draws, so a sample is reproducible. The context is the last
// model.seq_len tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "launcher/checkpoint.h"
#include "launcher/run_config.h"
#include "layers/language_model.h"

namespace weft {

struct SamplingOptions {
  int64_t tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 0;
  uint64_t seed = 1;
};

class Sampler {
 public:
  explicit Sampler(const LoadedCheckpoint& checkpoint);
  // Token ids after `prompt` ids.
  std::vector<int64_t> sample(const std::vector<int64_t>& prompt, const SamplingOptions& options);
  // For byte-level models: the prompt followed by the sampled text; for token models: the sampled
  // ids written as numbers (the prompt is then read as space-separated ids).
  std::string generate(const std::string& prompt, const SamplingOptions& options);
  const RunConfig& config() const { return config_; }

 private:
  RunConfig config_;
  std::shared_ptr<LanguageModel> model_;
};

}  // namespace weft
