// weft-generate: samples text from a model saved by weft-train.
//
//   weft-generate CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T] [--top_k K] [--top_p P]
//                 [--seed S] [--tokenizer bytes|gpt2|ids]
//
// CHECKPOINT is a step folder (checkpoints/step_00000200) or a checkpoint dir (its `latest` is used).
// The model is rebuilt from the config stored in the checkpoint, and text goes through its
// data.tokenizer: byte-level (data.format: text) models read and print bytes; GPT-2 token-shard
// models (model.vocab >= 50257) encode the prompt and decode the sample with weft's GPT-2 BPE
// tokenizer (launcher/gpt2_tokenizer.h; its files from data.tokenizer_dir or tools/setup-deps);
// other token-shard models read and print token ids. --tokenizer ids prints a GPT-2 model's ids.
// The same seed and options give the same sample.
#include <cstdio>
#include <exception>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "launcher/checkpoint.h"
#include "launcher/sampler.h"
#include "runtime/error.h"

ABSL_FLAG(std::string, prompt, "The ", "text the sample continues");
ABSL_FLAG(int, tokens, 200, "tokens to generate");
ABSL_FLAG(double, temperature, 0.8, "softmax temperature (> 0; lower is more conservative)");
ABSL_FLAG(int, top_k, 0, "sample among the k most likely tokens only (0: all)");
ABSL_FLAG(double, top_p, 1.0,
          "nucleus sampling: among the fewest most likely tokens whose probabilities add up to p, in (0, 1] "
          "(1: all); applied after top_k");
ABSL_FLAG(int, seed, 1, "sampling seed");
ABSL_FLAG(std::string, tokenizer, "",
          "how the prompt is read and the sample written: bytes, gpt2 or ids (empty: the checkpoint's "
          "data.tokenizer)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Samples text from a weft checkpoint.\n  weft-generate CHECKPOINT [--prompt TEXT] [--tokens N] "
      "[--temperature T] [--top_k K] [--top_p P] [--seed S] [--tokenizer bytes|gpt2|ids]");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() != 2) {
    std::fprintf(stderr, "weft-generate: expected one checkpoint path, got %zu\n%s\n", positional.size() - 1,
                 absl::ProgramUsageMessage().data());
    return 2;
  }
  try {
    weft::SamplingOptions options;
    options.tokens = absl::GetFlag(FLAGS_tokens);
    options.temperature = absl::GetFlag(FLAGS_temperature);
    options.top_k = absl::GetFlag(FLAGS_top_k);
    options.top_p = absl::GetFlag(FLAGS_top_p);
    options.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
    // Options first: a mistake is named before the model loads.
    weft::check_sampling_options(options);
    weft::Sampler sampler(weft::load_checkpoint(positional[1]), absl::GetFlag(FLAGS_tokenizer));
    // fwrite, not printf's %s: a GPT-2 sample may hold a zero byte.
    const std::string text = sampler.generate(absl::GetFlag(FLAGS_prompt), options) + "\n";
    std::fwrite(text.data(), 1, text.size(), stdout);
  } catch (const weft::Error& error) {
    std::fprintf(stderr, "weft-generate: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "weft-generate: internal error: %s\n", error.what());
    return 1;
  }
  return 0;
}
