// The weft side of the GPT-2 tokenizer's oracle test (run_gpt2_tokenizer_golden.sh): encodes each
// line of a corpus (split at '\n', the '\n' left out) and the whole file with Gpt2Tokenizer and
// writes the ids to JSON, {"lines": [[ids], ...], "whole": [ids]}, for gpt2_tokenizer_golden.js to
// compare with tiktoken's. Every encoding is also decoded back and checked against its text.
//
//   gpt2_tokenizer_golden CORPUS OUTPUT_JSON
//   gpt2_tokenizer_golden --speed CORPUS MEGABYTES   (encode speed, one thread, on the corpus
//                                                      repeated to about MEGABYTES)
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launcher/gpt2_tokenizer.h"
#include "runtime/error.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  WEFT_CHECK(in, "cannot read ", path);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::vector<int32_t> encode_checked(const weft::Gpt2Tokenizer& tokenizer, const std::string& text) {
  std::vector<int32_t> ids = tokenizer.encode(text);
  WEFT_CHECK(tokenizer.decode(ids) == text, "decode(encode(x)) != x for the text '", text, "'");
  return ids;
}

int measure_speed(const weft::Gpt2Tokenizer& tokenizer, const std::string& corpus, double megabytes) {
  std::string text;
  while (static_cast<double>(text.size()) < megabytes * 1e6) text += corpus;
  // The thread's CPU time, not the wall clock: on a shared machine other work would count too.
  auto cpu_seconds = [] {
    timespec now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
  };
  const double start = cpu_seconds();
  const std::vector<int32_t> ids = tokenizer.encode(text);
  const double seconds = cpu_seconds() - start;
  std::printf("encoded %.1f MB into %zu tokens in %.3f s of CPU time: %.1f MB/s (one thread)\n", text.size() / 1e6,
              ids.size(), seconds, text.size() / 1e6 / seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const bool speed = argc == 4 && std::string(argv[1]) == "--speed";
    if (!speed && argc != 3) {
      std::fprintf(stderr, "usage: %s CORPUS OUTPUT_JSON | --speed CORPUS MEGABYTES\n", argv[0]);
      return 2;
    }
    const weft::Gpt2Tokenizer tokenizer = weft::Gpt2Tokenizer::load(weft::Gpt2Tokenizer::default_directory());
    const std::string corpus = read_file(argv[speed ? 2 : 1]);
    if (speed) return measure_speed(tokenizer, corpus, std::atof(argv[3]));
    nlohmann::json result;
    result["lines"] = nlohmann::json::array();
    for (size_t start = 0;;) {
      const size_t end = corpus.find('\n', start);
      result["lines"].push_back(encode_checked(tokenizer, corpus.substr(start, end - start)));
      if (end == std::string::npos) break;
      start = end + 1;
    }
    result["whole"] = encode_checked(tokenizer, corpus);
    std::ofstream(argv[2]) << result.dump() << "\n";
  } catch (const weft::Error& error) {
    std::fprintf(stderr, "gpt2_tokenizer_golden: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
