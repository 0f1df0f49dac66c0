// The matmul tuning cache's file (runtime/cuda/matmul_tuning_cache.h), on the host: choices written by
// one instance are read by the next, other devices' entries are kept apart, broken lines are
// skipped without losing the good ones, processes appending at once leave whole lines (and one
// line for a product they all tuned), and the environment picks the path. The GPU side (a reused choice skips the timing and keeps the bits)
// is CudaMatmul.TuningCacheSkipsTheTimingAndKeepsTheBits.
#ifdef WEFT_HAVE_CUDA

#include "runtime/cuda/matmul_tuning_cache.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace weft::cuda {
namespace {

class MatmulTuningCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = std::filesystem::path(::testing::TempDir()) /
                 ("matmul_tuning_cache_" + std::to_string(::getpid()) + "_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(directory_);
    path_ = (directory_ / "nested" / "matmul-tuning.txt").string();
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }

  static MatmulTuningCache::Key key(int64_t m) {
    MatmulTuningCache::Key key = {};
    for (size_t i = 0; i < key.size(); ++i) key[i] = m * 100 + static_cast<int64_t>(i);
    key[1] = -1;  // negative fields occur (none today, but the format must not care)
    return key;
  }
  static MatmulTuningCache::Algorithm algorithm(uint64_t seed) {
    MatmulTuningCache::Algorithm algorithm = {};
    for (size_t i = 0; i < algorithm.size(); ++i) algorithm[i] = seed * 0x9e3779b97f4a7c15ull + i;
    algorithm[7] = ~0ull;  // every bit of a word survives the text
    return algorithm;
  }
  size_t line_count() const {
    std::ifstream file(path_);
    size_t lines = 0;
    for (std::string line; std::getline(file, line);) ++lines;
    return lines;
  }

  std::filesystem::path directory_;
  std::string path_;
};

TEST_F(MatmulTuningCacheTest, ChoicesSurviveIntoTheNextInstance) {
  {
    MatmulTuningCache cache(path_);  // the file and its folders do not exist yet
    EXPECT_EQ(cache.size(), 0u);
    EXPECT_FALSE(cache.find("H200/sm90/132sms/cublasLt130000", key(1)).has_value());
    cache.add("H200/sm90/132sms/cublasLt130000", key(1), algorithm(1));
    cache.add("H200/sm90/132sms/cublasLt130000", key(2), algorithm(2));
    cache.add("A100/sm80/108sms/cublasLt130000", key(1), algorithm(3));
    EXPECT_EQ(cache.find("H200/sm90/132sms/cublasLt130000", key(2)), algorithm(2));
  }
  EXPECT_EQ(line_count(), 3u);
  const MatmulTuningCache again(path_);
  EXPECT_EQ(again.size(), 3u);
  EXPECT_EQ(again.skipped_lines(), 0);
  EXPECT_EQ(again.find("H200/sm90/132sms/cublasLt130000", key(1)), algorithm(1));
  EXPECT_EQ(again.find("H200/sm90/132sms/cublasLt130000", key(2)), algorithm(2));
  EXPECT_EQ(again.find("A100/sm80/108sms/cublasLt130000", key(1)), algorithm(3)) << "devices are kept apart";
  EXPECT_FALSE(again.find("H200/sm90/132sms/cublasLt120900", key(1)).has_value()) << "another cuBLASLt";
  EXPECT_FALSE(again.find("H200/sm90/132sms/cublasLt130000", key(3)).has_value());
}

TEST_F(MatmulTuningCacheTest, BrokenLinesAreSkippedAndTheFirstChoiceWins) {
  {
    MatmulTuningCache cache(path_);
    cache.add("gpu", key(1), algorithm(1));
  }
  {
    std::ofstream file(path_, std::ios::app);
    file << "weft-matmul-tuning 1 gpu 1 2 3\n";                          // cut short by a killed process
    file << "weft-matmul-tuning 2 gpu";  // another format, of the right length
    for (int i = 0; i < 32; ++i) file << " 0";
    file << "\n";
    file << "garbage\n\n";  // the empty line is not counted
  }
  {
    MatmulTuningCache cache(path_);
    EXPECT_EQ(cache.skipped_lines(), 3);
    cache.add("gpu", key(1), algorithm(9));  // a second process's line for the same key
    cache.add("gpu", key(2), algorithm(2));
  }
  const MatmulTuningCache again(path_);
  EXPECT_EQ(again.find("gpu", key(1)), algorithm(1)) << "the first line for a key wins";
  EXPECT_EQ(again.find("gpu", key(2)), algorithm(2)) << "lines after broken ones are read";
  EXPECT_EQ(again.skipped_lines(), 3);
}

TEST_F(MatmulTuningCacheTest, ALineCutShortDoesNotSwallowTheNextChoice) {
  {
    MatmulTuningCache cache(path_);
    cache.add("gpu", key(1), algorithm(1));
  }
  std::ofstream(path_, std::ios::app) << "weft-matmul-tuning 1 gpu 1 2";  // killed mid-write: no newline
  {
    MatmulTuningCache cache(path_);
    EXPECT_EQ(cache.skipped_lines(), 0) << "a line without its newline may still be being written";
    cache.add("gpu", key(2), algorithm(2));
  }
  const MatmulTuningCache again(path_);
  EXPECT_EQ(again.find("gpu", key(2)), algorithm(2)) << "the choice after the cut line is read whole";
  EXPECT_EQ(again.find("gpu", key(1)), algorithm(1));
  EXPECT_EQ(again.skipped_lines(), 1);
}

TEST_F(MatmulTuningCacheTest, ProcessesAppendingAtOnceLeaveWholeLines) {
  constexpr int kProcesses = 4, kChoices = 200;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
  std::vector<pid_t> children;
  for (int process = 0; process < kProcesses; ++process) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      MatmulTuningCache cache(path_);
      for (int i = 0; i < kChoices; ++i) cache.add("gpu", key(process * kChoices + i), algorithm(process));
      ::_exit(0);
    }
    children.push_back(child);
  }
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  const MatmulTuningCache cache(path_);
  EXPECT_EQ(cache.skipped_lines(), 0);
  EXPECT_EQ(cache.size(), static_cast<size_t>(kProcesses * kChoices));
  for (int process = 0; process < kProcesses; ++process) {
    EXPECT_EQ(cache.find("gpu", key(process * kChoices + kChoices - 1)), algorithm(process));
  }
}

TEST_F(MatmulTuningCacheTest, ProcessesTuningTheSameProductLeaveOneLineForIt) {
  // Two instances that read the file before either chose: the second to choose finds the first's
  // line, writes none of its own and takes that choice.
  MatmulTuningCache first(path_), second(path_);
  first.add("gpu", key(1), algorithm(1));
  second.add("gpu", key(1), algorithm(9));
  second.add("gpu", key(2), algorithm(2));
  EXPECT_EQ(line_count(), 2u);
  EXPECT_EQ(second.find("gpu", key(1)), algorithm(1)) << "the file's choice, as every later process will read";
  first.add("gpu", key(3), algorithm(3));  // reads the second's line for key 2 on the way
  EXPECT_EQ(first.find("gpu", key(2)), algorithm(2));
  EXPECT_EQ(line_count(), 3u);

  // Ranks of a host tuning the same products at once: one line per product, whoever wins. The
  // children start together (the closed pipe releases them all), so that they race for each key.
  constexpr int kProcesses = 4, kChoices = 300;
  int start[2];
  ASSERT_EQ(::pipe(start), 0);
  std::vector<pid_t> children;
  for (int process = 0; process < kProcesses; ++process) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(start[1]);
      char byte;
      while (::read(start[0], &byte, 1) > 0) {
      }
      MatmulTuningCache cache(path_);
      for (int i = 0; i < kChoices; ++i) cache.add("gpu", key(100 + i), algorithm(process));
      ::_exit(0);
    }
    children.push_back(child);
  }
  ::close(start[0]);
  ::close(start[1]);
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(line_count(), 3u + kChoices);
  const MatmulTuningCache cache(path_);
  EXPECT_EQ(cache.skipped_lines(), 0);
  EXPECT_EQ(cache.size(), 3u + kChoices);
}

TEST_F(MatmulTuningCacheTest, WithoutAFileChoicesStayInMemory) {
  MatmulTuningCache cache("");
  cache.add("gpu", key(1), algorithm(1));
  EXPECT_EQ(cache.find("gpu", key(1)), algorithm(1));
  // A path that cannot be created: the choice is still kept, and nothing throws.
  const std::string blocked = (directory_ / "file").string();
  std::filesystem::create_directories(directory_);
  std::ofstream(blocked) << "not a folder\n";
  MatmulTuningCache unwritable(blocked + "/matmul-tuning.txt");
  unwritable.add("gpu", key(1), algorithm(1));
  EXPECT_EQ(unwritable.find("gpu", key(1)), algorithm(1));
}

TEST_F(MatmulTuningCacheTest, TheEnvironmentNamesThePath) {
  const char* saved_named = std::getenv("WEFT_MATMUL_TUNING_CACHE");
  const char* saved_xdg = std::getenv("XDG_CACHE_HOME");
  const char* saved_home = std::getenv("HOME");
  const std::optional<std::string> named = saved_named ? std::optional<std::string>(saved_named) : std::nullopt;
  const std::optional<std::string> xdg = saved_xdg ? std::optional<std::string>(saved_xdg) : std::nullopt;
  const std::optional<std::string> home = saved_home ? std::optional<std::string>(saved_home) : std::nullopt;

  ::unsetenv("WEFT_MATMUL_TUNING_CACHE");
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(MatmulTuningCache::path_from_environment(), "/home/someone/.cache/weft/matmul-tuning.txt");
  ::setenv("XDG_CACHE_HOME", "/var/cache/me", 1);
  EXPECT_EQ(MatmulTuningCache::path_from_environment(), "/var/cache/me/weft/matmul-tuning.txt");
  ::setenv("WEFT_MATMUL_TUNING_CACHE", "/scratch/tuning.txt", 1);
  EXPECT_EQ(MatmulTuningCache::path_from_environment(), "/scratch/tuning.txt");
  ::setenv("WEFT_MATMUL_TUNING_CACHE", "off", 1);
  EXPECT_EQ(MatmulTuningCache::path_from_environment(), "");
  ::unsetenv("WEFT_MATMUL_TUNING_CACHE");
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");
  EXPECT_EQ(MatmulTuningCache::path_from_environment(), "") << "no home: no file";

  auto restore = [](const char* name, const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  };
  restore("WEFT_MATMUL_TUNING_CACHE", named);
  restore("XDG_CACHE_HOME", xdg);
  restore("HOME", home);
}

}  // namespace
}  // namespace weft::cuda

#endif  // WEFT_HAVE_CUDA
