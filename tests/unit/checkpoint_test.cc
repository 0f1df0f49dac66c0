// Checkpoints: a round trip of tensors in their own dtypes plus the JSON state, `latest`, replacing a
// step, and that corruption, truncation, a crash's leftovers and a wrong path are clear errors that
// never disturb the last good checkpoint.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "gtest/gtest.h"
#include "tests/support/error_expectations.h"
#include "launcher/checkpoint.h"
#include "runtime/error.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    folder_ = fs::temp_directory_path() /
              ("weft_checkpoint_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(folder_);
    dir_ = (folder_ / "checkpoints").string();
  }
  void TearDown() override { fs::remove_all(folder_); }

  std::string tensors_file(int64_t step) const {
    return (fs::path(dir_) / checkpoint_folder_name(step) / "tensors.bin").string();
  }
  std::set<std::string> entries() const {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.insert(entry.path().filename().string());
    return names;
  }

  fs::path folder_;
  std::string dir_;
};

std::map<std::string, Tensor> sample_tensors(float scale) {
  const std::vector<float> weights = {1.5f * scale, -2.25f, 3.0f, 0.1f, -0.0f, 1e-20f};
  const std::vector<float> bf16_values = {1.0f, -0.5f, 3.140625f, 65280.0f * scale};
  const std::vector<int64_t> indices = {0, -1, int64_t{1} << 40};
  return {
      {"model.weight", Tensor::from_vector(weights, {2, 3}, kFloat32)},
      {"model.bf16", Tensor::from_vector(bf16_values, {4}, kBFloat16)},
      {"optimizer.step", Tensor::from_vector(indices, {3}, kInt64)},
      {"scalar", Tensor::scalar(7.0 * scale)},
      {"empty", Tensor::zeros({0, 5})},
      // A non-contiguous view is saved as its own elements, not its storage's.
      {"transposed", Tensor::from_vector(weights, {2, 3}, kFloat32).transpose(0, 1)},
  };
}

void expect_same_tensors(const std::map<std::string, Tensor>& saved, const std::map<std::string, Tensor>& loaded) {
  ASSERT_EQ(saved.size(), loaded.size());
  for (const auto& [name, tensor] : saved) {
    ASSERT_TRUE(loaded.count(name)) << name;
    const Tensor& other = loaded.at(name);
    EXPECT_EQ(other.dtype(), tensor.dtype()) << name;
    EXPECT_EQ(other.shape(), tensor.shape()) << name;
    EXPECT_TRUE(other.is_contiguous()) << name;
    EXPECT_TRUE(other.device().is_cpu()) << name;
    EXPECT_EQ(other.to_vector(), tensor.to_vector()) << name;
  }
}

TEST_F(CheckpointTest, TensorsInTheirOwnDtypesAndTheStateRoundTrip) {
  const auto tensors = sample_tensors(1.0f);
  const nlohmann::json state = {{"data", {{"epoch", 2}, {"cursor", 17}, {"seed", 1}}},
                                {"seed", 1234},
                                {"config", "model:\n  type: gpt2\n"}};
  save_checkpoint(dir_, 200, tensors, state);

  const LoadedCheckpoint loaded = load_checkpoint(dir_);
  EXPECT_EQ(loaded.step, 200);
  EXPECT_EQ(loaded.path, (fs::path(dir_) / "step_00000200").string());
  expect_same_tensors(tensors, loaded.tensors);
  // The bf16 bits are the saved ones, not a round trip through another type.
  EXPECT_EQ(loaded.tensors.at("model.bf16").data<BFloat16>()[2].bits,
            tensors.at("model.bf16").data<BFloat16>()[2].bits);
  EXPECT_EQ(loaded.state["step"], 200);
  EXPECT_EQ(loaded.state["seed"], 1234);
  EXPECT_EQ(loaded.state["config"], "model:\n  type: gpt2\n");
  EXPECT_EQ(loaded.state["data"]["cursor"], 17);

  // The step folder itself loads the same.
  EXPECT_EQ(load_checkpoint(loaded.path).step, 200);
}

TEST_F(CheckpointTest, LatestNamesTheLastSave) {
  EXPECT_EQ(latest_checkpoint(dir_), "");  // nothing saved yet (the folder does not even exist)
  save_checkpoint(dir_, 1, sample_tensors(1.0f), nlohmann::json::object());
  EXPECT_EQ(latest_checkpoint(dir_), (fs::path(dir_) / "step_00000001").string());
  save_checkpoint(dir_, 2, sample_tensors(2.0f), nullptr);
  EXPECT_EQ(latest_checkpoint(dir_), (fs::path(dir_) / "step_00000002").string());
  std::ifstream latest(fs::path(dir_) / "latest");
  std::string line;
  std::getline(latest, line);
  EXPECT_EQ(line, "step_00000002");
  EXPECT_EQ(load_checkpoint(dir_).step, 2);
  EXPECT_EQ(load_checkpoint(dir_).tensors.at("scalar").item(), 14.0);
  EXPECT_EQ(load_checkpoint((fs::path(dir_) / "step_00000001").string()).tensors.at("scalar").item(), 7.0);
  // Nothing temporary is left behind.
  EXPECT_EQ(entries(), (std::set<std::string>{"latest", "step_00000001", "step_00000002"}));
}

TEST_F(CheckpointTest, SavingTheSameStepAgainReplacesIt) {
  save_checkpoint(dir_, 3, sample_tensors(1.0f), {{"version", "first"}});
  save_checkpoint(dir_, 3, sample_tensors(2.0f), {{"version", "second"}});
  const LoadedCheckpoint loaded = load_checkpoint(dir_);
  EXPECT_EQ(loaded.state["version"], "second");
  expect_same_tensors(sample_tensors(2.0f), loaded.tensors);
  EXPECT_EQ(entries(), (std::set<std::string>{"latest", "step_00000003"}));
}

TEST_F(CheckpointTest, AFlippedByteIsAChecksumError) {
  save_checkpoint(dir_, 5, sample_tensors(1.0f), {});
  const std::string file = tensors_file(5);
  const auto size = fs::file_size(file);
  for (const uint64_t position : {size / 2, size - 20}) {
    save_checkpoint(dir_, 5, sample_tensors(1.0f), {});
    {
      std::fstream stream(file, std::ios::binary | std::ios::in | std::ios::out);
      stream.seekg(static_cast<std::streamoff>(position));
      char byte = 0;
      stream.read(&byte, 1);
      byte = static_cast<char>(byte ^ 0x10);
      stream.seekp(static_cast<std::streamoff>(position));
      stream.write(&byte, 1);
    }
    expect_contains(error_message([&] { load_checkpoint(dir_); }),
                    {"tensors.bin'", "checksum mismatch: the file is corrupt or truncated"});
  }
  // A flipped byte in the magic says it is not a checkpoint at all.
  {
    std::fstream stream(file, std::ios::binary | std::ios::in | std::ios::out);
    stream.write("X", 1);
  }
  expect_contains(error_message([&] { load_checkpoint(dir_); }), {"tensors.bin'", "not a weft checkpoint"});
}

TEST_F(CheckpointTest, ATruncatedFileIsAClearError) {
  save_checkpoint(dir_, 5, sample_tensors(1.0f), {});
  const std::string file = tensors_file(5);
  const auto size = fs::file_size(file);
  fs::resize_file(file, size - 9);
  expect_contains(error_message([&] { load_checkpoint(dir_); }),
                  {"tensors.bin'", std::to_string(size - 9) + " bytes", std::to_string(size), "truncated"});
  fs::resize_file(file, 10);
  expect_contains(error_message([&] { load_checkpoint(dir_); }), {"tensors.bin'", "10 bytes", "truncated"});
  fs::resize_file(file, 0);
  expect_contains(error_message([&] { load_checkpoint(dir_); }), {"0 bytes", "truncated"});
}

TEST_F(CheckpointTest, ACrashedSaveLeavesLatestAndLoadingIntact) {
  save_checkpoint(dir_, 10, sample_tensors(1.0f), {{"good", true}});
  // What a process killed mid-save leaves: a half-written temporary folder.
  const fs::path leftover = fs::path(dir_) / ".tmp-step_00000020-99999";
  fs::create_directories(leftover);
  std::ofstream(leftover / "tensors.bin") << "WEFTCKPT partial";
  std::ofstream(fs::path(dir_) / ".latest.tmp-99999") << "step_00000020";

  EXPECT_EQ(latest_checkpoint(dir_), (fs::path(dir_) / "step_00000010").string());
  const LoadedCheckpoint loaded = load_checkpoint(dir_);
  EXPECT_EQ(loaded.step, 10);
  EXPECT_EQ(loaded.state["good"], true);
  // The next save works beside the leftovers.
  save_checkpoint(dir_, 20, sample_tensors(2.0f), {});
  EXPECT_EQ(load_checkpoint(dir_).step, 20);
}

TEST_F(CheckpointTest, WrongPathsAndBadStateAreClearErrors) {
  expect_contains(error_message([&] { load_checkpoint((folder_ / "nowhere").string()); }),
                  {"no such checkpoint folder", "nowhere'"});
  fs::create_directories(folder_ / "not_a_checkpoint");
  expect_contains(error_message([&] { load_checkpoint((folder_ / "not_a_checkpoint").string()); }),
                  {"not_a_checkpoint'", "no tensors.bin", "no 'latest'"});

  save_checkpoint(dir_, 1, sample_tensors(1.0f), {});
  std::ofstream(fs::path(dir_) / "step_00000001" / "state.json") << "{\"step\": 1,";
  expect_contains(error_message([&] { load_checkpoint(dir_); }), {"state.json'", "not valid JSON"});

  std::ofstream(fs::path(dir_) / "latest") << "step_00000042\n";
  expect_contains(error_message([&] { load_checkpoint(dir_); }), {"latest'", "step_00000042", "no folder"});

  expect_contains(error_message([&] { save_checkpoint(dir_, 2, sample_tensors(1.0f), nlohmann::json::array()); }),
                  {"JSON object"});
  expect_contains(error_message([&] { save_checkpoint(dir_, 2, {{"undefined", Tensor()}}, {}); }),
                  {"'undefined'", "undefined"});
  // A failed save leaves nothing behind and `latest` as it was.
  EXPECT_EQ(entries(), (std::set<std::string>{"latest", "step_00000001"}));
}

}  // namespace
}  // namespace weft
