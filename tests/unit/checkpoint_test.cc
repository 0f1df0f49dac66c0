// Checkpoints: a round trip of tensors in their own dtypes plus the JSON state, `latest`, replacing a
// step, and that corruption, truncation, a crash's leftovers and a wrong path are clear errors that
// never disturb the last good checkpoint; a damaged tensor is named with its step; version 1 files
// still load; checkpoint.keep's pruning removes only old step folders.
#include <cstdint>
#include <cstring>
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
#include "launcher/crc32c.h"
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

void flip_byte(const std::string& file, uint64_t position) {
  std::fstream stream(file, std::ios::binary | std::ios::in | std::ios::out);
  stream.seekg(static_cast<std::streamoff>(position));
  char byte = 0;
  stream.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x10);
  stream.seekp(static_cast<std::streamoff>(position));
  stream.write(&byte, 1);
}

std::string read_bytes(const std::string& file) {
  std::ifstream stream(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>());
}

// Where the raw bytes of `value` first occur in `file` (the test's tensors hold distinct values).
uint64_t position_of(const std::string& file, float value) {
  const std::string bytes = read_bytes(file);
  const auto position = bytes.find(std::string(reinterpret_cast<const char*>(&value), sizeof(value)));
  EXPECT_NE(position, std::string::npos) << value;
  return position;
}

TEST(Crc32cTest, MatchesTheStandardCheckValues) {
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xe3069283u);
  const std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xff);  // RFC 3720, B.4
  EXPECT_EQ(crc32c(0, zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(crc32c(0, ones.data(), ones.size()), 0x62a8ab43u);
  // Continuing from a part's CRC gives the CRC of the whole, wherever the parts are cut.
  const std::string text = "weft checkpoints carry a CRC32C of every tensor";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    EXPECT_EQ(crc32c(crc32c(0, text.data(), cut), text.data() + cut, text.size() - cut),
              crc32c(0, text.data(), text.size()))
        << cut;
  }
}

TEST_F(CheckpointTest, AFlippedByteInATensorNamesTheTensorTheStepAndThePreviousCheckpoint) {
  const std::map<std::string, Tensor> tensors = {
      {"alpha", Tensor::from_vector(std::vector<float>{11, 12, 13, 14}, {4}, kFloat32)},
      {"beta", Tensor::from_vector(std::vector<float>{21, 22, 23, 24}, {2, 2}, kFloat32)},
  };
  save_checkpoint(dir_, 4, tensors, {});
  for (const auto& [name, value] : std::map<std::string, float>{{"alpha", 13.0f}, {"beta", 22.0f}}) {
    save_checkpoint(dir_, 5, tensors, {});
    flip_byte(tensors_file(5), position_of(tensors_file(5), value) + 1);
    const std::string message = error_message([&] { load_checkpoint(dir_); });
    expect_contains(message, {tensors_file(5) + "'", "the tensor '" + name + "' of step 5",
                              "does not match its checksum",
                              "checkpoint.resume: " + (fs::path(dir_) / "step_00000004").string()});
    // Only the damaged tensor is named.
    EXPECT_EQ(message.find(name == "alpha" ? "'beta'" : "'alpha'"), std::string::npos) << message;
  }

  // The same damage in the only checkpoint there is: nothing earlier to resume from.
  fs::remove_all(fs::path(dir_) / "step_00000004");
  expect_contains(error_message([&] { load_checkpoint(dir_); }),
                  {"the tensor 'beta' of step 5", "no earlier checkpoint in '" + dir_ + "'"});

  // A flipped byte in the header (here the entry count) is the header's checksum's error.
  save_checkpoint(dir_, 5, tensors, {});
  flip_byte(tensors_file(5), 24);
  expect_contains(error_message([&] { load_checkpoint(dir_); }),
                  {"tensors.bin'", "the header of step 5 does not match its checksum"});
  // A flipped byte in the magic says it is not a checkpoint at all.
  {
    std::fstream stream(tensors_file(5), std::ios::binary | std::ios::in | std::ios::out);
    stream.write("X", 1);
  }
  expect_contains(error_message([&] { load_checkpoint(dir_); }), {"tensors.bin'", "not a weft checkpoint"});
}

TEST_F(CheckpointTest, AFlippedByteAnywhereIsAnError) {
  // Every byte of a small file in turn, to be sure no byte goes unchecked.
  const std::map<std::string, Tensor> tensors = {
      {"w", Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}, kFloat32)},
      {"b", Tensor::from_vector(std::vector<float>{4}, {1}, kBFloat16)},
  };
  save_checkpoint(dir_, 1, tensors, {});
  const std::string good = read_bytes(tensors_file(1));
  for (uint64_t position = 0; position < good.size(); ++position) {
    std::ofstream(tensors_file(1), std::ios::binary) << good;
    flip_byte(tensors_file(1), position);
    EXPECT_FALSE(error_message([&] { load_checkpoint(dir_); }).empty()) << "byte " << position;
  }
}

// Writes tensors.bin as weft wrote it before per-tensor checksums: format version 1, one FNV-1a 64
// of the whole file at its end.
class Version1Writer {
 public:
  template <class T>
  void value(const T& value) {
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  void text(const std::string& text) {
    value(static_cast<uint32_t>(text.size()));
    bytes_ += text;
  }
  void tensor(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
              const void* data, uint64_t bytes) {
    text(name);
    text(dtype);
    value(static_cast<uint32_t>(shape.size()));
    for (const int64_t size : shape) value(size);
    value(bytes);
    bytes_.append(static_cast<const char*>(data), bytes);
    ++entries_;
  }
  void write(const std::string& path) const {
    std::string file = "WEFTCKPT";
    const uint32_t version = 1, reserved = 0;
    const uint64_t file_bytes = 8 + 4 + 4 + 8 + 8 + bytes_.size() + 8;
    file.append(reinterpret_cast<const char*>(&version), 4);
    file.append(reinterpret_cast<const char*>(&reserved), 4);
    file.append(reinterpret_cast<const char*>(&file_bytes), 8);
    file.append(reinterpret_cast<const char*>(&entries_), 8);
    file += bytes_;
    uint64_t hash = 14695981039346656037ull;
    for (const char byte : file) {
      hash ^= static_cast<unsigned char>(byte);
      hash *= 1099511628211ull;
    }
    file.append(reinterpret_cast<const char*>(&hash), 8);
    std::ofstream(path, std::ios::binary) << file;
  }

 private:
  std::string bytes_;
  uint64_t entries_ = 0;
};

TEST_F(CheckpointTest, AVersion1CheckpointStillLoads) {
  const std::vector<float> weights = {1.5f, -2.25f, 3.0f, 0.1f, -0.0f, 1e-20f};
  const std::vector<int64_t> counts = {0, -1, int64_t{1} << 40};
  const uint16_t half_bits[2] = {0x3f80, 0xbf00};  // bf16 1.0, -0.5
  Version1Writer writer;
  writer.tensor("model.bf16", "bf16", {2}, half_bits, sizeof(half_bits));
  writer.tensor("model.weight", "f32", {2, 3}, weights.data(), weights.size() * sizeof(float));
  writer.tensor("optimizer.step", "i64", {3}, counts.data(), counts.size() * sizeof(int64_t));
  const fs::path step = fs::path(dir_) / "step_00000007";
  fs::create_directories(step);
  writer.write((step / "tensors.bin").string());
  std::ofstream(step / "state.json") << "{\"step\": 7, \"seed\": 3}\n";
  std::ofstream(fs::path(dir_) / "latest") << "step_00000007\n";

  const LoadedCheckpoint loaded = load_checkpoint(dir_);
  EXPECT_EQ(loaded.step, 7);
  EXPECT_EQ(loaded.state["seed"], 3);
  expect_same_tensors({{"model.bf16", Tensor::from_vector(std::vector<float>{1.0f, -0.5f}, {2}, kBFloat16)},
                       {"model.weight", Tensor::from_vector(weights, {2, 3}, kFloat32)},
                       {"optimizer.step", Tensor::from_vector(counts, {3}, kInt64)}},
                      loaded.tensors);

  // Its whole-file checksum is still checked.
  flip_byte((step / "tensors.bin").string(), fs::file_size(step / "tensors.bin") / 2);
  expect_contains(error_message([&] { load_checkpoint(dir_); }),
                  {"tensors.bin' (step 7)", "checksum mismatch: the file is corrupt or truncated"});
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

// checkpoint.keep: saves steps 1..`last`, pruning to `keep` after each save as the trainer does.
std::vector<std::string> save_and_prune(const std::string& dir, int64_t last, int64_t keep,
                                        const std::function<void(const std::string&)>& warn = {}) {
  std::vector<std::string> removed;
  for (int64_t step = 1; step <= last; ++step) {
    save_checkpoint(dir, step, sample_tensors(static_cast<float>(step)), {});
    for (const std::string& name : prune_checkpoints(dir, keep, warn)) removed.push_back(name);
  }
  return removed;
}

TEST_F(CheckpointTest, KeepTwoLeavesTheTwoNewestAndLatest) {
  EXPECT_EQ(save_and_prune(dir_, 5, 2),
            (std::vector<std::string>{"step_00000001", "step_00000002", "step_00000003"}));
  EXPECT_EQ(entries(), (std::set<std::string>{"latest", "step_00000004", "step_00000005"}));
  EXPECT_EQ(latest_checkpoint(dir_), (fs::path(dir_) / "step_00000005").string());
  EXPECT_EQ(load_checkpoint(dir_).tensors.at("scalar").item(), 35.0);
  EXPECT_EQ(load_checkpoint((fs::path(dir_) / "step_00000004").string()).step, 4);
}

TEST_F(CheckpointTest, KeepZeroKeepsAll) {
  EXPECT_TRUE(save_and_prune(dir_, 4, 0).empty());
  EXPECT_EQ(entries(),
            (std::set<std::string>{"latest", "step_00000001", "step_00000002", "step_00000003", "step_00000004"}));
}

TEST_F(CheckpointTest, PruningNeverRemovesWhatLatestNames) {
  save_and_prune(dir_, 5, 0);
  // A run resumed from step 2 writes step 3 again: `latest` names an older step than step 5's.
  save_checkpoint(dir_, 3, sample_tensors(30.0f), {});
  EXPECT_EQ(prune_checkpoints(dir_, 2), (std::vector<std::string>{"step_00000001", "step_00000002", "step_00000004"}));
  EXPECT_EQ(entries(), (std::set<std::string>{"latest", "step_00000003", "step_00000005"}));
  EXPECT_EQ(load_checkpoint(dir_).step, 3);
  EXPECT_EQ(prune_checkpoints(dir_, 1), (std::vector<std::string>{"step_00000005"}));
  EXPECT_EQ(entries(), (std::set<std::string>{"latest", "step_00000003"}));
  // Without `latest` nothing is known to be safe to remove.
  fs::remove(fs::path(dir_) / "latest");
  EXPECT_TRUE(prune_checkpoints(dir_, 1).empty());
}

TEST_F(CheckpointTest, PruningRemovesOnlyStepFolders) {
  // Folders and files that are not step folders, however close their names.
  const std::set<std::string> strays = {"notes", "step_1", "step_00000001.bak", "step_000000001", "step_0000000x"};
  for (const std::string& name : strays) fs::create_directories(fs::path(dir_) / name / "inside");
  std::ofstream(fs::path(dir_) / "step_00000000") << "a file, not a folder";
  // A link named like a step folder is not one of ours either.
  fs::create_directories(folder_ / "elsewhere");
  fs::create_directory_symlink(folder_ / "elsewhere", fs::path(dir_) / "step_00000009");

  save_and_prune(dir_, 4, 1);
  std::set<std::string> expected = strays;
  expected.insert({"latest", "step_00000004", "step_00000000", "step_00000009"});
  EXPECT_EQ(entries(), expected);
  EXPECT_TRUE(fs::exists(fs::path(dir_) / "notes" / "inside"));
  EXPECT_TRUE(fs::exists(folder_ / "elsewhere"));
}

TEST_F(CheckpointTest, AFolderThatCannotBeRemovedIsAWarning) {
  save_and_prune(dir_, 2, 0);
  // The name pruning renames step 1 to is taken by a folder that is not empty, so the rename fails.
  const fs::path taken = fs::path(dir_) / (".tmp-removing-step_00000001-" + std::to_string(::getpid()));
  fs::create_directories(taken / "inside");
  std::vector<std::string> warnings;
  std::vector<std::string> removed;
  EXPECT_NO_THROW(removed = prune_checkpoints(dir_, 1, [&](const std::string& text) { warnings.push_back(text); }));
  EXPECT_TRUE(removed.empty());
  ASSERT_EQ(warnings.size(), 1u);
  expect_contains(warnings[0], {"checkpoint.keep", "cannot remove", "step_00000001'"});
  EXPECT_TRUE(fs::exists(fs::path(dir_) / "step_00000001" / "tensors.bin"));
  EXPECT_EQ(load_checkpoint(dir_).step, 2);
}

}  // namespace
}  // namespace weft
