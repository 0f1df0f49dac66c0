// weft-generate: samples text from a model saved by weft-train.
//
//   weft-generate CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T] [--top_k K] [--seed S]
//
// CHECKPOINT is a step folder (checkpoints/step_00000200) or a checkpoint dir (its `latest` is used).
// The model is rebuilt from the config stored in the checkpoint. Byte-level (data.format: text)
// models print text; token-shard models print token ids, since weft ships no BPE tokenizer.
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
ABSL_FLAG(int, seed, 1, "sampling seed");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Samples text from a weft checkpoint.\n  weft-generate CHECKPOINT [--prompt TEXT] [--tokens N] "
      "[--temperature T] [--top_k K] [--seed S]");
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
    options.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
    weft::Sampler sampler(weft::load_checkpoint(positional[1]));
    std::printf("%s\n", sampler.generate(absl::GetFlag(FLAGS_prompt), options).c_str());
  } catch (const weft::Error& error) {
    std::fprintf(stderr, "weft-generate: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "weft-generate: internal error: %s\n", error.what());
    return 1;
  }
  return 0;
}
