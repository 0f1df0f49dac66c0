// Sampler: autoregressive sampling from a trained LanguageModel restored from a checkpoint.
//
// The model is rebuilt from the run config stored in the checkpoint's state.json and loaded with
// its weights. Each new token is drawn from softmax(logits / temperature), optionally restricted
// to the top k and then to the top p of probability (nucleus sampling), with Philox(seed) draws,
// so a sample is reproducible. The context is the last model.seq_len tokens.
//
// Text goes in and out through the run's data.tokenizer (or the one given): bytes (each byte a
// token), gpt2 (launcher/gpt2_tokenizer.h, from data.tokenizer_dir or its default folder) or ids
// (space-separated numbers).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/checkpoint.h"
#include "launcher/gpt2_tokenizer.h"
#include "launcher/run_config.h"
#include "layers/language_model.h"

namespace weft {

struct SamplingOptions {
  int64_t tokens = 200;      // new tokens, >= 0
  double temperature = 0.8;  // > 0
  int64_t top_k = 0;         // >= 0; 0: every token
  double top_p = 1.0;        // in (0, 1]; 1: every token
  uint64_t seed = 1;
};

// Throws weft::Error naming the first option out of its range.
void check_sampling_options(const SamplingOptions& options);

// data.tokenizer with auto resolved: bytes for data.format text, gpt2 for data.format tokens with
// model.vocab >= 50257, ids otherwise.
std::string resolved_tokenizer(const RunConfig& config);

// The filters sample() applies, in this order, to one position's logits / temperature [vocab]:
// tokens left out become -inf. keep_top_k keeps the k largest (ties at the k-th value kept; k <= 0
// or >= vocab keeps all). keep_top_p keeps the fewest most probable tokens (ties by lower id) whose
// softmax probabilities add up to at least p, so the token that crosses p is kept (p >= 1 keeps all).
void keep_top_k(std::vector<double>& logits, int64_t k);
void keep_top_p(std::vector<double>& logits, double p);

class Sampler {
 public:
  // `tokenizer`: bytes | gpt2 | ids, or empty for the checkpoint's data.tokenizer. Throws
  // weft::Error when it does not fit the model (bytes: model.vocab < 256; gpt2: < 50257) or the
  // gpt2 files are missing.
  explicit Sampler(const LoadedCheckpoint& checkpoint, const std::string& tokenizer = "");
  // Token ids after `prompt` ids.
  std::vector<int64_t> sample(const std::vector<int64_t>& prompt, const SamplingOptions& options);
  // bytes and gpt2: the prompt followed by the sampled text (gpt2: an empty prompt starts from
  // <|endoftext|>, as GPT-2 was trained); ids: the sampled ids written as numbers (the prompt is
  // then read as space-separated ids).
  std::string generate(const std::string& prompt, const SamplingOptions& options);
  const RunConfig& config() const { return config_; }
  const std::string& tokenizer() const { return tokenizer_; }

 private:
  RunConfig config_;
  std::shared_ptr<LanguageModel> model_;
  std::string tokenizer_;                      // bytes | gpt2 | ids
  std::optional<Gpt2Tokenizer> gpt2_;          // loaded when tokenizer_ is gpt2
};

}  // namespace weft
