// prepare_token_shards with a stand-in tokenizer (one token per byte, slower on some documents so
// that threads finish out of order): the same bytes for any thread count and batch size, every
// document after an end-of-text token in input order, the output folder's rules (empty, or
// --overwrite replacing only this name's shards), the progress, and an empty corpus.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "launcher/corpus_preparation.h"
#include "launcher/token_shard_dataset.h"
#include "runtime/error.h"
#include "tests/support/error_expectations.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

namespace fs = std::filesystem;

constexpr int32_t kEndOfText = 50256;

// Token = byte value + 1; every third document (by its length) takes a little longer.
std::vector<int32_t> byte_tokens(std::string_view text) {
  if (text.size() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
  std::vector<int32_t> tokens;
  for (char byte : text) tokens.push_back(static_cast<unsigned char>(byte) + 1);
  return tokens;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream stream(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>()};
}

class CorpusPreparationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    folder_ = fs::temp_directory_path() / ("weft_corpus_preparation_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(folder_);
    fs::create_directories(folder_ / "in");
    // 300 fortunes of different lengths in two files, and a JSON lines file of 50 documents.
    std::ofstream fortunes(folder_ / "in" / "fortunes");
    for (int index = 0; index < 200; ++index) {
      fortunes << "fortune " << index << std::string(static_cast<size_t>(index % 17), '!') << "\n%\n";
    }
    std::ofstream more(folder_ / "in" / "more");
    for (int index = 0; index < 100; ++index) more << static_cast<char>('a' + index % 26) << " more " << index << "\n%\n";
    std::ofstream jsonl(folder_ / "in" / "lines.jsonl");
    for (int index = 0; index < 50; ++index) jsonl << "{\"text\": \"line " << index << "\"}\n";
  }
  void TearDown() override { fs::remove_all(folder_); }

  PreparationOptions options(const std::string& out, int threads) const {
    PreparationOptions result;
    result.inputs = {(folder_ / "in" / "fortunes").string(), (folder_ / "in" / "more").string(),
                     (folder_ / "in" / "lines.jsonl").string()};
    result.documents.separator_line = "%";
    result.output_folder = (folder_ / out).string();
    result.shard_tokens = 1000;
    result.val_tokens = 300;
    result.threads = threads;
    result.batch_bytes_per_thread = 200;  // many batches, a few documents each
    return result;
  }
  PreparationSummary prepare(const PreparationOptions& options) const {
    return prepare_token_shards(options, byte_tokens, kEndOfText, {});
  }
  std::vector<std::string> file_names(const std::string& out) const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(folder_ / out)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path folder_;
};

TEST_F(CorpusPreparationTest, ShardsAreTheSameBytesForAnyThreadCountWithDocumentsInInputOrder) {
  const PreparationSummary one = prepare(options("one", 1));
  PreparationOptions three_options = options("three", 3);
  three_options.batch_bytes_per_thread = 1 << 20;  // one batch: all documents tokenized at once
  const PreparationSummary three = prepare(three_options);

  EXPECT_EQ(one.name, "fortunes");
  EXPECT_EQ(one.documents, 350u);
  EXPECT_EQ(one.skipped_documents, 0u);
  EXPECT_EQ(one.bytes, fs::file_size(folder_ / "in" / "fortunes") + fs::file_size(folder_ / "in" / "more") +
                           fs::file_size(folder_ / "in" / "lines.jsonl"));
  EXPECT_EQ(one.val_tokens + one.train_tokens, one.tokens);
  EXPECT_EQ(one.val_tokens, 300u) << "the corpus holds more than 10 * val_tokens";
  EXPECT_EQ(one.train_pattern, (folder_ / "one" / "fortunes_train_*.bin").string());
  EXPECT_EQ(one.val_pattern, (folder_ / "one" / "fortunes_val_*.bin").string());
  ASSERT_EQ(file_names("one"), file_names("three"));
  ASSERT_EQ(one.shards.size(), three.shards.size());
  for (const std::string& name : file_names("one")) {
    EXPECT_EQ(read_bytes(folder_ / "one" / name), read_bytes(folder_ / "three" / name)) << name;
  }

  // The stream: per document, end-of-text then its bytes + 1, in input order.
  std::vector<int64_t> expected;
  for (const std::string& file : {"fortunes", "more"}) {
    std::ifstream stream(folder_ / "in" / file);
    std::string line;
    while (std::getline(stream, line)) {
      if (line == "%") continue;
      expected.push_back(kEndOfText);
      for (char byte : line + "\n") expected.push_back(static_cast<unsigned char>(byte) + 1);
    }
  }
  for (int index = 0; index < 50; ++index) {
    expected.push_back(kEndOfText);
    for (char byte : "line " + std::to_string(index)) expected.push_back(static_cast<unsigned char>(byte) + 1);
  }
  ASSERT_EQ(one.tokens, expected.size());
  TokenShardFiles val(one.val_pattern, 0, "val");
  TokenShardFiles train(one.train_pattern, 0, "train");
  std::vector<int64_t> stream(val.token_count() + train.token_count());
  val.read(0, static_cast<int64_t>(val.token_count()), stream.data());
  train.read(0, static_cast<int64_t>(train.token_count()), stream.data() + val.token_count());
  EXPECT_EQ(stream, expected);
  EXPECT_EQ(stream.front(), kEndOfText);
}

TEST_F(CorpusPreparationTest, ProgressReachesTheTotalAndCountsDocuments) {
  std::vector<PreparationProgress> reports;
  const PreparationSummary summary = prepare_token_shards(
      options("out", 2), byte_tokens, kEndOfText, [&](const PreparationProgress& report) { reports.push_back(report); });
  ASSERT_GT(reports.size(), 10u) << "one report per batch of about 400 bytes";
  for (size_t index = 1; index < reports.size(); ++index) {
    EXPECT_GE(reports[index].bytes_read, reports[index - 1].bytes_read);
    EXPECT_GE(reports[index].tokens, reports[index - 1].tokens);
  }
  EXPECT_EQ(reports.back().bytes_read, reports.back().total_bytes);
  EXPECT_EQ(reports.back().documents, summary.documents);
  EXPECT_EQ(reports.back().tokens, summary.tokens);
}

TEST_F(CorpusPreparationTest, ANonEmptyOutputFolderNeedsOverwriteWhichReplacesOnlyThisNamesShards) {
  PreparationOptions first = options("out", 1);
  first.shard_tokens = 100;  // many training shards
  prepare(first);
  const size_t first_files = file_names("out").size();
  std::ofstream(folder_ / "out" / "notes.txt") << "mine\n";
  std::ofstream(folder_ / "out" / "fortunes_train_000999.bin.tmp") << "left by an interrupted run";
  std::ofstream(folder_ / "out" / "other_train_000001.bin") << "another corpus";

  const std::string message = error_message([&] { prepare(options("out", 1)); });
  expect_contains(message, {(folder_ / "out").string(), "is not empty", "--overwrite"});

  PreparationOptions again = options("out", 1);
  again.overwrite = true;
  const PreparationSummary summary = prepare(again);
  std::vector<std::string> expected = {"notes.txt", "other_train_000001.bin"};
  for (const TokenShardFile& shard : summary.shards) expected.push_back(fs::path(shard.path).filename().string());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(file_names("out"), expected);
  EXPECT_LT(summary.shards.size(), first_files) << "the first run's extra shards are gone";
  EXPECT_NO_THROW(TokenShardFiles(summary.train_pattern, 0, "train"));
}

TEST_F(CorpusPreparationTest, AFailedRunRemovesTheShardsItWroteAndLeavesOtherFiles) {
  // The tokenizer fails on the last document, after several shards were written.
  const auto failing = [](std::string_view text) -> std::vector<int32_t> {
    if (text.find("line 49") != std::string_view::npos) throw Error("tokenizer failed on purpose");
    return byte_tokens(text);
  };
  fs::create_directories(folder_ / "kept");
  std::ofstream(folder_ / "kept" / "README") << "mine";
  PreparationOptions kept = options("kept", 2);
  kept.overwrite = true;
  expect_contains(error_message([&] { prepare_token_shards(kept, failing, kEndOfText, {}); }),
                  {"tokenizer failed on purpose"});
  EXPECT_EQ(file_names("kept"), std::vector<std::string>{"README"});
  expect_contains(error_message([&] { prepare_token_shards(options("new", 2), failing, kEndOfText, {}); }),
                  {"tokenizer failed on purpose"});
  EXPECT_FALSE(fs::exists(folder_ / "new"));
}

TEST_F(CorpusPreparationTest, AnEmptyCorpusAndBadOptionsAreNamedErrors) {
  std::ofstream(folder_ / "in" / "blank.txt") << "\n  \n";
  PreparationOptions blank = options("out", 2);
  blank.inputs = {(folder_ / "in" / "blank.txt").string()};
  blank.documents.separator_line.clear();
  expect_contains(error_message([&] { prepare(blank); }), {"the corpus is empty", "1 empty or white-space-only"});
  EXPECT_FALSE(fs::exists(folder_ / "out")) << "a failed run left the folder it created";

  PreparationOptions no_threads = options("out", 0);
  expect_contains(error_message([&] { prepare(no_threads); }), {"--threads"});
  std::ofstream(folder_ / "a_file") << "x";
  PreparationOptions file_out = options("a_file", 1);
  expect_contains(error_message([&] { prepare(file_out); }), {"--out", "is not a folder"});
  EXPECT_EQ(default_shard_name("data/tiny.shakespeare.txt"), "tiny.shakespeare");
  EXPECT_EQ(default_shard_name("/usr/share/games/fortunes/computers"), "computers");
}

}  // namespace
}  // namespace weft
