// Datasets: the window order (a pure function of seed, epoch and cursor; every window once per
// epoch), resuming through position()/seek(), data-parallel row slicing, the text and llm.c shard
// readers, and the errors that bad data gives.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "gtest/gtest.h"
#include "tests/support/error_expectations.h"
#include "launcher/dataset.h"
#include "launcher/text_dataset.h"
#include "launcher/token_shard_dataset.h"
#include "runtime/error.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

namespace fs = std::filesystem;

// A fresh folder per test, removed afterwards.
class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    folder_ = fs::temp_directory_path() /
              ("weft_dataset_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(folder_);
    fs::create_directories(folder_);
  }
  void TearDown() override { fs::remove_all(folder_); }

  std::string path(const std::string& name) const { return (folder_ / name).string(); }
  std::string write_file(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }

  fs::path folder_;
};

// Byte i is i % 251: a prime period, so a window's first byte and its start differ for every
// window start the tests use.
std::string counting_text(size_t bytes) {
  std::string text(bytes, '\0');
  for (size_t index = 0; index < bytes; ++index) text[index] = static_cast<char>(index % 251);
  return text;
}

std::vector<int64_t> row(const Tensor& tensor, int64_t index) {
  std::vector<int64_t> values(static_cast<size_t>(tensor.size(1)));
  const int64_t* data = tensor.data<int64_t>() + index * tensor.size(1);
  std::copy(data, data + tensor.size(1), values.begin());
  return values;
}

std::vector<std::vector<int64_t>> rows(const Tensor& tensor) {
  std::vector<std::vector<int64_t>> result;
  for (int64_t index = 0; index < tensor.size(0); ++index) result.push_back(row(tensor, index));
  return result;
}

std::unique_ptr<TextDataset> text_dataset(const std::string& file, int64_t steps, uint64_t seed) {
  return open_text_datasets(file, "", 0.0, steps, seed).train;
}

TEST_F(DatasetTest, TextTargetsAreInputsShiftedByOneAndWindowsStartAtMultiplesOfT) {
  const std::string text = counting_text(1000);
  auto dataset = text_dataset(write_file("text", text), 8, 1);
  EXPECT_EQ(dataset->vocabulary(), 256);
  EXPECT_EQ(dataset->token_count(), 1000u);
  const TokenBatch batch = dataset->next_batch(4, 8);
  ASSERT_EQ(batch.inputs.shape(), (Shape{4, 8}));
  ASSERT_EQ(batch.targets.shape(), (Shape{4, 8}));
  EXPECT_EQ(batch.inputs.dtype(), kInt64);
  EXPECT_EQ(batch.targets.dtype(), kInt64);
  for (int64_t index = 0; index < 4; ++index) {
    const std::vector<int64_t> inputs = row(batch.inputs, index), targets = row(batch.targets, index);
    // The window start whose bytes these are: a multiple of 8 inside the text.
    int64_t start = -1;
    for (int64_t candidate = 0; candidate + 9 <= 1000; candidate += 8) {
      if (static_cast<unsigned char>(text[candidate]) == inputs[0] &&
          static_cast<unsigned char>(text[candidate + 1]) == inputs[1]) {
        start = candidate;
      }
    }
    ASSERT_GE(start, 0) << "row " << index << " does not start at a multiple of T";
    for (int64_t step = 0; step < 8; ++step) {
      EXPECT_EQ(inputs[step], static_cast<unsigned char>(text[start + step]));
      EXPECT_EQ(targets[step], static_cast<unsigned char>(text[start + step + 1]));
    }
  }
}

TEST_F(DatasetTest, OrderIsAFunctionOfTheSeed) {
  const std::string file = write_file("text", counting_text(4000));
  auto first = text_dataset(file, 16, 7), second = text_dataset(file, 16, 7), other = text_dataset(file, 16, 8);
  bool any_difference = false;
  for (int call = 0; call < 5; ++call) {
    const TokenBatch a = first->next_batch(8, 16), b = second->next_batch(8, 16), c = other->next_batch(8, 16);
    EXPECT_EQ(rows(a.inputs), rows(b.inputs));
    EXPECT_EQ(rows(a.targets), rows(b.targets));
    any_difference = any_difference || rows(a.inputs) != rows(c.inputs);
  }
  EXPECT_TRUE(any_difference) << "seeds 7 and 8 gave the same 40 windows";
  // Epochs are shuffled differently from each other, and not left in file order.
  EXPECT_NE(window_permutation(7, 0, 100), window_permutation(7, 1, 100));
  std::vector<uint64_t> identity(100);
  for (uint64_t index = 0; index < 100; ++index) identity[index] = index;
  EXPECT_NE(window_permutation(7, 0, 100), identity);
}

TEST_F(DatasetTest, AnEpochVisitsEveryWindowExactlyOnce) {
  // Token i is i, so a row's first input is its window's start. 401 tokens make 50 windows of 8
  // (the last window needs the token after it as its last target).
  std::vector<uint16_t> tokens(401);
  for (uint16_t index = 0; index < 401; ++index) tokens[index] = index;
  write_token_shard(path("counting.bin"), tokens);
  TokenShardDataset dataset(path("counting.bin"), 401, 3);
  ASSERT_EQ(dataset.windows_per_epoch(8), 50u);
  std::multiset<int64_t> starts;
  for (int call = 0; call < 10; ++call) {
    const TokenBatch batch = dataset.next_batch(5, 8);
    for (int64_t index = 0; index < 5; ++index) starts.insert(batch.inputs.data<int64_t>()[index * 8]);
  }
  std::set<int64_t> expected;
  for (int64_t window = 0; window < 50; ++window) expected.insert(window * 8);
  EXPECT_EQ(std::set<int64_t>(starts.begin(), starts.end()), expected);
  EXPECT_EQ(starts.size(), 50u);
  EXPECT_EQ(dataset.position().epoch, 1u);
  EXPECT_EQ(dataset.position().cursor, 0u);
  // The permutation itself: every index once.
  std::vector<uint64_t> order = window_permutation(3, 5, 1000);
  std::sort(order.begin(), order.end());
  for (uint64_t index = 0; index < 1000; ++index) ASSERT_EQ(order[index], index);
}

TEST_F(DatasetTest, SeekToASavedPositionReplaysTheSameBatchesAcrossEpochs) {
  const std::string file = write_file("text", counting_text(801));  // 100 windows of 8
  auto original = text_dataset(file, 8, 11);
  for (int call = 0; call < 3; ++call) original->next_batch(30, 8);
  const DatasetPosition saved = original->position();
  EXPECT_EQ(saved.epoch, 0u);
  EXPECT_EQ(saved.cursor, 90u);
  // Through JSON, as a checkpoint stores it.
  const nlohmann::json json = saved;
  EXPECT_EQ(json.dump(), R"({"cursor":90,"epoch":0,"seed":11})");
  std::vector<std::vector<int64_t>> expected;
  for (int call = 0; call < 3; ++call) {
    for (auto& values : rows(original->next_batch(30, 8).inputs)) expected.push_back(values);
  }

  // A dataset made with another seed adopts the saved one.
  auto resumed = text_dataset(file, 8, 999);
  resumed->seek(json.get<DatasetPosition>());
  std::vector<std::vector<int64_t>> replayed;
  for (int call = 0; call < 3; ++call) {
    for (auto& values : rows(resumed->next_batch(30, 8).inputs)) replayed.push_back(values);
  }
  EXPECT_EQ(replayed, expected);
  EXPECT_EQ(resumed->position(), original->position());
  EXPECT_EQ(resumed->position().epoch, 1u);
}

TEST_F(DatasetTest, ShardedRanksConcatenateToTheSingleProcessBatch) {
  const std::string file = write_file("text", counting_text(3000));
  for (const int64_t world : {2, 3}) {
    auto whole = text_dataset(file, 16, 5);
    std::vector<std::unique_ptr<TextDataset>> ranks;
    for (int64_t rank = 0; rank < world; ++rank) {
      ranks.push_back(text_dataset(file, 16, 5));
      ranks.back()->set_shard(rank, world);
    }
    for (int call = 0; call < 4; ++call) {
      const TokenBatch global = whole->next_batch(7, 16);  // 7 rows: uneven for both world sizes
      std::vector<std::vector<int64_t>> inputs, targets;
      for (int64_t rank = 0; rank < world; ++rank) {
        const TokenBatch local = ranks[rank]->next_batch(7, 16);
        EXPECT_EQ(local.inputs.size(0), (rank + 1) * 7 / world - rank * 7 / world);
        for (auto& values : rows(local.inputs)) inputs.push_back(values);
        for (auto& values : rows(local.targets)) targets.push_back(values);
        EXPECT_EQ(ranks[rank]->position(), whole->position()) << "every rank advances by the global batch";
      }
      EXPECT_EQ(inputs, rows(global.inputs)) << "world " << world;
      EXPECT_EQ(targets, rows(global.targets)) << "world " << world;
    }
  }
  auto dataset = text_dataset(file, 16, 5);
  expect_contains(error_message([&] { dataset->set_shard(2, 2); }), {"rank 2", "world 2"});
  dataset->set_shard(1, 4);
  expect_contains(error_message([&] { dataset->next_batch(3, 16); }), {"global batch of 3", "4 ranks"});
}

TEST_F(DatasetTest, ValidationSplitIsTheTailUnlessAValPathIsGiven) {
  const std::string text = counting_text(1000);
  const std::string file = write_file("text", text);
  TextDatasets split = open_text_datasets(file, "", 0.1, 8, 1);
  EXPECT_EQ(split.train->token_count(), 900u);
  ASSERT_NE(split.val, nullptr);
  EXPECT_EQ(split.val->token_count(), 100u);
  // The val stream is bytes [900, 1000): every value it returns comes from there.
  const std::string tail = text.substr(900);
  const TokenBatch batch = split.val->next_batch(12, 8);
  for (const auto& values : rows(batch.inputs)) {
    const std::string window(values.begin(), values.end());
    EXPECT_NE(tail.find(window), std::string::npos);
  }

  EXPECT_EQ(open_text_datasets(file, "", 0.0, 8, 1).val, nullptr);

  const std::string val_file = write_file("val", counting_text(50));
  TextDatasets separate = open_text_datasets(file, val_file, 0.1, 8, 1);
  EXPECT_EQ(separate.train->token_count(), 1000u);
  EXPECT_EQ(separate.val->token_count(), 50u);

  expect_contains(error_message([&] { open_text_datasets(file, "", 0.005, 8, 1); }),
                  {"validation split", "5 bytes", "seq_len + 1 = 9", "data.val_fraction"});
  expect_contains(error_message([&] { open_text_datasets(file, "", 1.5, 8, 1); }), {"data.val_fraction", "1.5"});
}

TEST_F(DatasetTest, AFolderIsItsTextFilesInNameOrderSkippingIndexesAndLinks) {
  fs::create_directories(folder_ / "fortunes");
  write_file("fortunes/b", "bravo\n%\n");
  write_file("fortunes/a", "alpha\n%\n");
  write_file("fortunes/a.dat", std::string("\x00\x00\x00\x02binary", 10));
  write_file("fortunes/.hidden", "hidden\n");
  fs::create_symlink("a", folder_ / "fortunes" / "a.u8");
  fs::create_symlink("b", folder_ / "fortunes" / "link");
  fs::create_directories(folder_ / "fortunes" / "off");
  write_file("fortunes/off/c", "offensive\n");
  EXPECT_EQ(read_text_source(path("fortunes"), "data.train"), "alpha\n%\nbravo\n%\n");

  fs::create_directories(folder_ / "only_indexes");
  write_file("only_indexes/x.dat", "index");
  expect_contains(error_message([&] { read_text_source(path("only_indexes"), "data.train"); }),
                  {"data.train", "holds no text files"});
}

TEST_F(DatasetTest, MissingEmptyAndTooShortTextAreNamedErrors) {
  expect_contains(error_message([&] { open_text_datasets(path("missing.txt"), "", 0.0, 8, 1); }),
                  {"data.train: no such file or folder '", "missing.txt'", "tools/setup-deps"});
  expect_contains(error_message([&] { open_text_datasets(write_file("t", counting_text(100)), path("nope"), 0.0, 8, 1); }),
                  {"data.val: no such file or folder", "nope"});
  expect_contains(error_message([&] { open_text_datasets(write_file("empty", ""), "", 0.0, 8, 1); }),
                  {"data.train", "is empty"});
  expect_contains(error_message([&] { open_text_datasets(write_file("short", "12345"), "", 0.0, 8, 1); }),
                  {"data.train", "short'", "5 bytes", "seq_len + 1 = 9"});
  // Exactly seq_len + 1 bytes is one window.
  auto dataset = text_dataset(write_file("nine", "123456789"), 8, 1);
  EXPECT_EQ(dataset->windows_per_epoch(8), 1u);
  EXPECT_EQ(row(dataset->next_batch(1, 8).targets, 0), (std::vector<int64_t>{'2', '3', '4', '5', '6', '7', '8', '9'}));
  // A longer sequence than the stream holds, asked for later, is an error too.
  expect_contains(error_message([&] { dataset->next_batch(1, 9); }), {"9 tokens", "seq_len 9"});
  // A position from other data is refused rather than read silently.
  dataset->seek(DatasetPosition{0, 5, 1});
  expect_contains(error_message([&] { dataset->next_batch(1, 8); }), {"cursor 5", "beyond"});
}

TEST_F(DatasetTest, TokenShardsMatchedByAGlobRoundTripInSortedOrder) {
  std::vector<uint16_t> first(100), second(150);
  for (uint16_t index = 0; index < 100; ++index) first[index] = index;
  for (uint16_t index = 0; index < 150; ++index) second[index] = static_cast<uint16_t>(100 + index);
  // Written in reverse name order: the stream still follows the sorted names.
  write_token_shard(path("tiny_train_001.bin"), second);
  write_token_shard(path("tiny_train_000.bin"), first);
  write_token_shard(path("tiny_val_000.bin"), {7, 7, 7});
  EXPECT_EQ(fs::file_size(path("tiny_train_000.bin")), 1024u + 2 * 100);

  TokenShardDataset dataset(path("tiny_train_*.bin"), 1000, 1);
  EXPECT_EQ(dataset.token_count(), 250u);
  EXPECT_EQ(dataset.vocabulary(), 1000);
  // One window of 249 spans both shards: inputs 0..248, targets 1..249.
  const TokenBatch batch = dataset.next_batch(1, 249);
  for (int64_t index = 0; index < 249; ++index) {
    ASSERT_EQ(batch.inputs.data<int64_t>()[index], index);
    ASSERT_EQ(batch.targets.data<int64_t>()[index], index + 1);
  }
  expect_contains(dataset.describe(), {"2 files", "vocabulary 1000"});

  // Without a vocabulary, it is the largest token + 1.
  EXPECT_EQ(TokenShardDataset(path("tiny_train_000.bin"), 0, 1).vocabulary(), 100);

  TokenShardDatasets split = open_token_shard_datasets(path("tiny_train_*.bin"), "", 0.2, 1000, 8, 1);
  EXPECT_EQ(split.train->token_count(), 200u);
  EXPECT_EQ(split.val->token_count(), 50u);
  const TokenBatch val = split.val->next_batch(2, 8);
  for (const double token : val.inputs.to_vector()) EXPECT_GE(token, 200);
  expect_contains(error_message([&] { open_token_shard_datasets(path("tiny_train_*.bin"), path("tiny_val_*.bin"),
                                                                0.0, 1000, 8, 1); }),
                  {"data.val", "3 tokens", "seq_len + 1 = 9"});
}

TEST_F(DatasetTest, BadTokenShardsAreNamedErrors) {
  std::vector<uint16_t> tokens(64);
  for (uint16_t index = 0; index < 64; ++index) tokens[index] = index;

  // Corrupt magic.
  write_token_shard(path("magic.bin"), tokens);
  {
    std::fstream file(path("magic.bin"), std::ios::binary | std::ios::in | std::ios::out);
    const int32_t wrong = 12345;
    file.write(reinterpret_cast<const char*>(&wrong), sizeof(wrong));
  }
  expect_contains(error_message([&] { TokenShardDataset(path("magic.bin"), 100, 1); }),
                  {"data.train", "magic.bin'", "magic 12345", "20240520", "not an llm.c token shard"});

  // Wrong version.
  write_token_shard(path("version.bin"), tokens);
  {
    std::fstream file(path("version.bin"), std::ios::binary | std::ios::in | std::ios::out);
    file.seekp(4);
    const int32_t version = 2;
    file.write(reinterpret_cast<const char*>(&version), sizeof(version));
  }
  expect_contains(error_message([&] { TokenShardDataset(path("version.bin"), 100, 1); }),
                  {"version.bin'", "version 2", "version 1"});

  // Truncated: the header counts 64 tokens but the file holds 60.
  write_token_shard(path("truncated.bin"), tokens);
  fs::resize_file(path("truncated.bin"), 1024 + 2 * 60);
  expect_contains(error_message([&] { TokenShardDataset(path("truncated.bin"), 100, 1); }),
                  {"truncated.bin'", "1144 bytes", "64 tokens", "1152", "truncated"});
  fs::resize_file(path("truncated.bin"), 100);
  expect_contains(error_message([&] { TokenShardDataset(path("truncated.bin"), 100, 1); }),
                  {"100 bytes", "header"});

  // A token outside the vocabulary, in the second shard of a glob.
  write_token_shard(path("vocab_0.bin"), tokens);
  std::vector<uint16_t> bad = tokens;
  bad[37] = 50300;
  write_token_shard(path("vocab_1.bin"), bad);
  expect_contains(error_message([&] { TokenShardDataset(path("vocab_*.bin"), 50257, 1); }),
                  {"vocab_1.bin'", "token 37", "50300", "vocabulary 50257"});

  // Nothing to read.
  expect_contains(error_message([&] { TokenShardDataset(path("none_*.bin"), 100, 1); }),
                  {"data.train", "no files match", "none_*.bin"});
  expect_contains(error_message([&] { TokenShardDataset(path("absent.bin"), 100, 1, "data.val"); }),
                  {"data.val: no such file", "absent.bin"});
  expect_contains(error_message([&] { TokenShardDataset(folder_.string(), 100, 1); }), {"is a folder", "glob"});
}

}  // namespace
}  // namespace weft
