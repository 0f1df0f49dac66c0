// weft-generate's sampling filters and options: top-k and top-p (nucleus) selection on known
// distributions, the options' ranges, and which tokenizer data.tokenizer: auto resolves to.
// tests/launcher/generate_from_checkpoint.sh samples from real checkpoints.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "launcher/run_config.h"
#include "launcher/sampler.h"
#include "tests/support/error_expectations.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

// Logits whose softmax is `probabilities`.
std::vector<double> logits_of(const std::vector<double>& probabilities) {
  std::vector<double> logits;
  for (double probability : probabilities) logits.push_back(std::log(probability));
  return logits;
}

// The ids a filter left finite.
std::vector<int> kept(const std::vector<double>& logits) {
  std::vector<int> ids;
  for (size_t id = 0; id < logits.size(); ++id) {
    if (std::isfinite(logits[id])) ids.push_back(static_cast<int>(id));
  }
  return ids;
}

std::vector<int> after_top_p(std::vector<double> logits, double p) {
  keep_top_p(logits, p);
  return kept(logits);
}

TEST(SamplerTest, TopPKeepsTheFewestLikeliestTokensReachingP) {
  // Sorted by probability: id 1 (0.4), id 3 (0.3), id 2 (0.2), id 0 (0.1); cumulative 0.4, 0.7, 0.9, 1.
  const std::vector<double> logits = logits_of({0.1, 0.4, 0.2, 0.3});
  EXPECT_EQ(after_top_p(logits, 0.39), (std::vector<int>{1}));
  EXPECT_EQ(after_top_p(logits, 0.5), (std::vector<int>{1, 3}));  // 3 crosses 0.5 and is kept
  EXPECT_EQ(after_top_p(logits, 0.69), (std::vector<int>{1, 3}));
  EXPECT_EQ(after_top_p(logits, 0.71), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(after_top_p(logits, 0.95), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(after_top_p(logits, 1.0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(after_top_p(logits, 1e-9), (std::vector<int>{1}));  // the likeliest token always stays
  // Kept logits are unchanged (sampling renormalises them), and ties go to the lower id.
  std::vector<double> filtered = logits;
  keep_top_p(filtered, 0.5);
  EXPECT_EQ(filtered[1], logits[1]);
  EXPECT_EQ(filtered[3], logits[3]);
  EXPECT_EQ(after_top_p({2.0, 2.0, 2.0, 2.0}, 0.6), (std::vector<int>{0, 1, 2}));
}

TEST(SamplerTest, TopPAfterTopKWorksOnWhatTopKLeft) {
  // top_k 2 leaves ids 1 and 3 (0.4 and 0.3, renormalised 4/7 and 3/7): p 0.5 keeps only id 1.
  std::vector<double> logits = logits_of({0.1, 0.4, 0.2, 0.3});
  keep_top_k(logits, 2);
  EXPECT_EQ(kept(logits), (std::vector<int>{1, 3}));
  keep_top_p(logits, 0.5);
  EXPECT_EQ(kept(logits), (std::vector<int>{1}));
  // k of 0 or beyond the vocabulary keeps everything; ties at the k-th value are kept.
  std::vector<double> all = logits_of({0.1, 0.4, 0.2, 0.3});
  keep_top_k(all, 0);
  keep_top_k(all, 9);
  EXPECT_EQ(kept(all).size(), 4u);
  std::vector<double> ties = {1.0, 3.0, 3.0, 0.0};
  keep_top_k(ties, 1);
  EXPECT_EQ(kept(ties), (std::vector<int>{1, 2}));
}

TEST(SamplerTest, OptionsOutOfRangeAreNamed) {
  SamplingOptions options;
  check_sampling_options(options);
  options.top_p = 0;
  expect_contains(error_message([&] { check_sampling_options(options); }), {"top_p", "(0, 1]", "got 0"});
  options.top_p = 1.5;
  expect_contains(error_message([&] { check_sampling_options(options); }), {"top_p", "got 1.5"});
  options.top_p = 0.9;
  options.top_k = -1;
  expect_contains(error_message([&] { check_sampling_options(options); }), {"top_k", ">= 0", "got -1"});
  options.top_k = 0;
  options.temperature = 0;
  expect_contains(error_message([&] { check_sampling_options(options); }), {"temperature", "positive"});
  options.temperature = 1;
  options.tokens = -3;
  expect_contains(error_message([&] { check_sampling_options(options); }), {"tokens", "got -3"});
}

TEST(SamplerTest, AutoTokenizerFollowsTheDataFormatAndVocabulary) {
  RunConfig config;
  EXPECT_EQ(resolved_tokenizer(config), "bytes");  // data.format text
  config.data.format = "tokens";
  config.model.vocab = 50257;
  EXPECT_EQ(resolved_tokenizer(config), "gpt2");
  config.model.vocab = 50304;  // llm.c's padded GPT-2 vocabulary
  EXPECT_EQ(resolved_tokenizer(config), "gpt2");
  config.model.vocab = 1000;
  EXPECT_EQ(resolved_tokenizer(config), "ids");
  config.data.tokenizer = "bytes";
  EXPECT_EQ(resolved_tokenizer(config), "bytes");
}

}  // namespace
}  // namespace weft
