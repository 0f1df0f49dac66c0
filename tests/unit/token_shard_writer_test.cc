// TokenShardWriter: shards that the token shard reader (TokenShardFiles) reads back as the stream
// that was appended, llm.c's header and names, shards cut at shard_tokens, the validation split's
// size on small and large streams, and a failed write that leaves no shard behind.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "launcher/token_shard_dataset.h"
#include "launcher/token_shard_writer.h"
#include "runtime/error.h"
#include "tests/support/error_expectations.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

namespace fs = std::filesystem;

class TokenShardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    folder_ = fs::temp_directory_path() / ("weft_shard_writer_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(folder_);
    fs::create_directories(folder_);
  }
  void TearDown() override { fs::remove_all(folder_); }

  TokenShardWriterOptions options(uint64_t shard_tokens, uint64_t val_tokens) const {
    return {folder_.string(), "corpus", shard_tokens, val_tokens};
  }
  std::string path(const std::string& name) const { return (folder_ / name).string(); }
  std::vector<std::string> file_names() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(folder_)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path folder_;
};

// Tokens 0, 1, 2, ... (mod 50257, the GPT-2 vocabulary).
std::vector<int32_t> counting_tokens(int64_t count, int64_t first = 0) {
  std::vector<int32_t> tokens;
  for (int64_t index = 0; index < count; ++index) tokens.push_back(static_cast<int32_t>((first + index) % 50257));
  return tokens;
}

// The tokens of every shard `pattern` matches, concatenated by the reader weft-train uses.
std::vector<int64_t> read_back(const std::string& pattern) {
  TokenShardFiles files(pattern, 65536, "test");
  std::vector<int64_t> tokens(files.token_count());
  files.read(0, static_cast<int64_t>(tokens.size()), tokens.data());
  return tokens;
}

TEST_F(TokenShardWriterTest, ShardsRoundTripThroughTheReaderWithLlmcHeaderAndNames) {
  TokenShardWriter writer(options(1000, 1000));
  // Appended in uneven pieces, as documents arrive, so that pieces straddle the shard boundaries.
  const std::vector<int32_t> stream = counting_tokens(2500, 50000);  // wraps past 50256 to 0
  size_t offset = 0;
  for (size_t piece : {1u, 7u, 993u, 1000u, 499u}) {
    writer.append(std::span<const int32_t>(stream.data() + offset, piece));
    offset += piece;
  }
  ASSERT_EQ(offset, stream.size());
  const std::vector<TokenShardFile> shards = writer.finish();

  // 2500 tokens, fewer than 10 * 1000: the validation split is 2500 / 10 = 250 tokens; the training
  // 2250 are cut at 1000.
  ASSERT_EQ(shards.size(), 4u);
  EXPECT_EQ(shards[0].path, path("corpus_val_000000.bin"));
  EXPECT_TRUE(shards[0].validation);
  EXPECT_EQ(shards[0].tokens, 250u);
  EXPECT_EQ(shards[1].path, path("corpus_train_000001.bin"));
  EXPECT_EQ(shards[1].tokens, 1000u);
  EXPECT_EQ(shards[2].path, path("corpus_train_000002.bin"));
  EXPECT_EQ(shards[2].tokens, 1000u);
  EXPECT_EQ(shards[3].path, path("corpus_train_000003.bin"));
  EXPECT_EQ(shards[3].tokens, 250u);
  EXPECT_FALSE(shards[3].validation);
  EXPECT_EQ(file_names(), (std::vector<std::string>{"corpus_train_000001.bin", "corpus_train_000002.bin",
                                                    "corpus_train_000003.bin", "corpus_val_000000.bin"}));

  // The header, byte for byte: magic, version, count, then zeros; the file is 1024 + 2 * count bytes.
  std::ifstream file(shards[1].path, std::ios::binary);
  int32_t header[256];
  file.read(reinterpret_cast<char*>(header), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 1000);
  for (int index = 3; index < 256; ++index) ASSERT_EQ(header[index], 0) << "header[" << index << "]";
  EXPECT_EQ(fs::file_size(shards[1].path), 1024u + 2 * 1000u);

  std::vector<int64_t> expected(stream.begin(), stream.end());
  std::vector<int64_t> val = read_back(path("corpus_val_*.bin"));
  std::vector<int64_t> train = read_back(path("corpus_train_*.bin"));
  EXPECT_EQ(val, std::vector<int64_t>(expected.begin(), expected.begin() + 250));
  EXPECT_EQ(train, std::vector<int64_t>(expected.begin() + 250, expected.end()));
}

TEST_F(TokenShardWriterTest, ALargeStreamPutsValTokensInValidationShardsCutAtShardTokens) {
  // 10 * val_tokens = 500 tokens decide the split: val 50 tokens in shards of 20 (20, 20, 10), then
  // training shards of 20; the stream's 2001 tokens leave a last training shard of 11.
  TokenShardWriter writer(options(20, 50));
  const std::vector<int32_t> stream = counting_tokens(2001);
  writer.append(std::span<const int32_t>(stream.data(), 499));
  EXPECT_TRUE(file_names().empty()) << "nothing is written before the split is decided";
  writer.append(std::span<const int32_t>(stream.data() + 499, 1));
  EXPECT_FALSE(file_names().empty()) << "500 tokens decide the split";
  writer.append(std::span<const int32_t>(stream.data() + 500, stream.size() - 500));
  const std::vector<TokenShardFile> shards = writer.finish();

  ASSERT_EQ(shards.size(), 3u + 97u + 1u);
  EXPECT_EQ(shards[0].path, path("corpus_val_000000.bin"));
  EXPECT_EQ(shards[2].path, path("corpus_val_000002.bin"));
  EXPECT_EQ(shards[2].tokens, 10u);
  EXPECT_EQ(shards[3].path, path("corpus_train_000003.bin"));
  for (size_t index = 3; index + 1 < shards.size(); ++index) ASSERT_EQ(shards[index].tokens, 20u) << index;
  EXPECT_EQ(shards.back().tokens, 11u);
  EXPECT_EQ(shards.back().path, path("corpus_train_000100.bin"));
  EXPECT_EQ(read_back(path("corpus_val_*.bin")).size(), 50u);
  const std::vector<int64_t> train = read_back(path("corpus_train_*.bin"));
  ASSERT_EQ(train.size(), 1951u);
  EXPECT_EQ(train.front(), 50);
  EXPECT_EQ(train.back(), 2000);
}

TEST_F(TokenShardWriterTest, TheSmallestStreamGetsOneTokenInEachSplit) {
  TokenShardWriter writer(options(100, 1000));
  const std::vector<int32_t> stream = {50256, 42};
  writer.append(stream);
  const std::vector<TokenShardFile> shards = writer.finish();
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(read_back(path("corpus_val_*.bin")), std::vector<int64_t>{50256});
  EXPECT_EQ(read_back(path("corpus_train_*.bin")), std::vector<int64_t>{42});

  TokenShardWriter lonely({folder_.string(), "lonely", 100, 10});
  lonely.append(std::vector<int32_t>{50256});
  expect_contains(error_message([&] { lonely.finish(); }), {"1 tokens", "at least 2"});
}

TEST_F(TokenShardWriterTest, BadTokensAndOptionsAreNamedErrors) {
  TokenShardWriter writer(options(100, 10));
  expect_contains(error_message([&] { writer.append(std::vector<int32_t>{1, 2, 65536}); }),
                  {"token 65536", "position 2", "uint16", "65536"});
  expect_contains(error_message([&] { writer.append(std::vector<int32_t>{-1}); }), {"token -1"});
  expect_contains(error_message([&] { TokenShardWriter(options(0, 10)); }), {"--shard-tokens"});
  expect_contains(error_message([&] { TokenShardWriter(options(uint64_t{1} << 31, 10)); }),
                  {"--shard-tokens 2147483648", "int32"});
  expect_contains(error_message([&] { TokenShardWriter(options(100, 0)); }), {"--val-tokens"});
  expect_contains(error_message([&] { TokenShardWriter({folder_.string(), "a/b", 100, 10}); }), {"'a/b'", "--name"});
}

// A shard is written whole or not at all: a write that fails half-way (here the file size limit,
// as a full disk would) throws and leaves neither the shard nor its temporary file.
TEST_F(TokenShardWriterTest, AFailedWriteLeavesNoPartialShard) {
  TokenShardWriter writer(options(4000, 10));
  const std::vector<int32_t> stream = counting_tokens(5000);
  writer.append(std::span<const int32_t>(stream.data(), 100));  // decides the split: one val shard
  ASSERT_EQ(file_names(), std::vector<std::string>{"corpus_val_000000.bin"});

  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* previous_handler = std::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead
  struct rlimit limited = saved;
  limited.rlim_cur = 4096;  // a 4000-token shard is 9024 bytes
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  const std::string message = error_message([&] { writer.append(std::span<const int32_t>(stream.data() + 100, 4000)); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous_handler);

  expect_contains(message, {"corpus_train_000001.bin.tmp", "failed"});
  EXPECT_EQ(file_names(), std::vector<std::string>{"corpus_val_000000.bin"});
}

}  // namespace
}  // namespace weft
