#include "launcher/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "launcher/checkpoint_run_config.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"
#include "runtime/ops/softmax.h"
#include "runtime/random.h"

namespace weft {

void check_sampling_options(const SamplingOptions& options) {
  WEFT_CHECK(options.tokens >= 0, "tokens must be >= 0, got ", options.tokens);
  WEFT_CHECK(options.temperature > 0 && std::isfinite(options.temperature),
             "temperature must be positive, got ", options.temperature);
  WEFT_CHECK(options.top_k >= 0, "top_k must be >= 0 (0: every token), got ", options.top_k);
  WEFT_CHECK(options.top_p > 0 && options.top_p <= 1, "top_p must be in (0, 1] (1: every token), got ",
             options.top_p);
}

std::string resolved_tokenizer(const RunConfig& config) {
  if (config.data.tokenizer != "auto") return config.data.tokenizer;
  if (config.data.format == "text") return "bytes";
  return config.model.vocab >= Gpt2Tokenizer::kVocabSize ? "gpt2" : "ids";  // GPT-2's vocabulary, padded or not
}

void keep_top_k(std::vector<double>& logits, int64_t k) {
  if (k <= 0 || k >= static_cast<int64_t>(logits.size())) return;
  std::vector<double> sorted = logits;
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<>());
  const double threshold = sorted[k - 1];
  for (double& value : logits) {
    if (value < threshold) value = -INFINITY;
  }
}

void keep_top_p(std::vector<double>& logits, double p) {
  if (p >= 1) return;
  const double maximum = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probabilities(logits.size());
  double total = 0;
  for (size_t v = 0; v < logits.size(); ++v) total += (probabilities[v] = std::exp(logits[v] - maximum));
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t left, int64_t right) { return probabilities[left] > probabilities[right]; });
  double cumulative = 0;
  size_t kept = 0;
  while (kept < order.size() && cumulative < p * total) cumulative += probabilities[order[kept++]];
  for (size_t rank = kept; rank < order.size(); ++rank) logits[order[rank]] = -INFINITY;
}

Sampler::Sampler(const LoadedCheckpoint& checkpoint, const std::string& tokenizer)
    : config_(checkpoint_run_config(checkpoint)), tokenizer_(tokenizer.empty() ? resolved_tokenizer(config_) : tokenizer) {
  WEFT_CHECK(tokenizer_ == "bytes" || tokenizer_ == "gpt2" || tokenizer_ == "ids",
             "the tokenizer must be bytes, gpt2 or ids, got '", tokenizer_, "'");
  if (tokenizer_ == "gpt2") {
    WEFT_CHECK(config_.model.vocab >= Gpt2Tokenizer::kVocabSize, "the gpt2 tokenizer gives ids up to ",
               Gpt2Tokenizer::kVocabSize - 1, ", but this model has model.vocab = ",
               config_.model.vocab, "; use the ids tokenizer");
    gpt2_ = Gpt2Tokenizer::load(config_.data.tokenizer_dir.empty() ? Gpt2Tokenizer::default_directory()
                                                                    : config_.data.tokenizer_dir);
  }
  model_ = build_model(config_.model);
  std::map<std::string, Tensor> weights;
  for (const auto& [name, tensor] : checkpoint.tensors) {
    if (name.rfind("model.", 0) == 0) weights[name.substr(6)] = tensor.to(kFloat32);
  }
  model_->load_state_dict(weights);
  model_->eval();
}

std::vector<int64_t> Sampler::sample(const std::vector<int64_t>& prompt, const SamplingOptions& options) {
  check_sampling_options(options);
  WEFT_CHECK(!prompt.empty(), "the prompt is empty; give at least one token");
  autograd::NoGradGuard no_grad;
  std::vector<int64_t> tokens = prompt;
  const int64_t vocabulary = config_.model.vocab;
  // A GPT-2 model's vocabulary is often padded (llm.c: 50304); the padding ids are no tokens.
  const int64_t drawn_vocabulary = gpt2_ ? gpt2_->vocab_size() : vocabulary;
  for (int64_t i = 0; i < options.tokens; ++i) {
    const int64_t window = std::min<int64_t>(static_cast<int64_t>(tokens.size()), config_.model.seq_len);
    std::vector<int64_t> context(tokens.end() - window, tokens.end());
    Tensor logits = model_->logits(Tensor::from_vector(absl::Span<const int64_t>(context), {1, window}));
    std::vector<double> last = logits.select(1, window - 1).reshape({vocabulary}).to_vector();
    // Temperature, then the top k, then the top p of what is left, then normalise.
    last.resize(static_cast<size_t>(drawn_vocabulary));
    for (double& value : last) value /= options.temperature;
    keep_top_k(last, options.top_k);
    keep_top_p(last, options.top_p);
    const double maximum = *std::max_element(last.begin(), last.end());
    double total = 0;
    for (double& value : last) total += (value = std::exp(value - maximum));
    const double draw = philox_uniform(options.seed, static_cast<uint64_t>(i)) * total;
    double cumulative = 0;
    int64_t choice = drawn_vocabulary - 1;
    for (int64_t v = 0; v < drawn_vocabulary; ++v) {
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
  if (tokenizer_ == "bytes") {
    std::vector<int64_t> ids;
    for (unsigned char byte : prompt) {
      WEFT_CHECK(byte < config_.model.vocab, "prompt byte ", int{byte}, " is outside the model's vocabulary [0, ",
                 config_.model.vocab, ")");
      ids.push_back(byte);
    }
    std::string text = prompt;
    for (int64_t id : sample(ids, options)) text.push_back(static_cast<char>(id));
    return text;
  }
  if (tokenizer_ == "gpt2") {
    const std::vector<int32_t> encoded = gpt2_->encode(prompt);
    std::vector<int64_t> ids(encoded.begin(), encoded.end());
    if (ids.empty()) ids.push_back(gpt2_->end_of_text());
    const std::vector<int64_t> sampled = sample(ids, options);
    return prompt + gpt2_->decode(std::vector<int32_t>(sampled.begin(), sampled.end()));
  }
  std::vector<int64_t> ids;
  std::istringstream words(prompt);
  for (int64_t id; words >> id;) {
    WEFT_CHECK(id >= 0 && id < config_.model.vocab, "prompt token ", id, " is outside [0, ", config_.model.vocab, ")");
    ids.push_back(id);
  }
  WEFT_CHECK(!ids.empty(), "this model reads token ids (tokenizer ids): give the prompt as space-separated ids");
  std::ostringstream out;
  for (int64_t id : sample(ids, options)) out << id << ' ';
  return out.str();
}

}  // namespace weft
