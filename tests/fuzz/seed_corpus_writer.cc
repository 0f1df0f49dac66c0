// Writes the binary seeds of tests/fuzz/corpus/ with weft's own writers, so the seeds are valid
// files of the formats as weft writes them now:
//   seed_corpus_writer tests/fuzz/corpus
// writes token_shard/{tiny,empty}.bin, checkpoint/{tiny,scalar_and_empty}.seed (state.json, a
// NUL, tensors.bin, as tests/fuzz/checkpoint_fuzz.cc reads them) and safetensors/*.safetensors (one
// file per dtype weft reads, and one without __metadata__). Run it again after a format change.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "launcher/checkpoint.h"
#include "launcher/safetensors.h"
#include "launcher/token_shard_dataset.h"
#include "nlohmann/json.hpp"
#include "runtime/tensor.h"

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream stream(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>());
}

// One checkpoint seed: a save of `tensors` as step 1, then its two files joined by a NUL.
void write_checkpoint_seed(const fs::path& output, const std::map<std::string, weft::Tensor>& tensors) {
  const fs::path scratch = fs::temp_directory_path() / "weft-seed-corpus-writer";
  fs::remove_all(scratch);
  weft::save_checkpoint(scratch.string(), 1, tensors, {{"data_position", 3}, {"seed", 7}});
  const fs::path step = scratch / weft::checkpoint_folder_name(1);
  std::ofstream stream(output, std::ios::binary | std::ios::trunc);
  stream << read_file(step / "state.json") << '\0' << read_file(step / "tensors.bin");
  fs::remove_all(scratch);
}

// A safetensors file as weft writes it, less its __metadata__: write_safetensors always adds
// {"format": "pt"}, but files from other writers may have none, so the header is written again
// without it (padded as the writer pads it, the data unchanged, its offsets already relative).
void drop_safetensors_metadata(const fs::path& path) {
  const std::string file = read_file(path);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), 8);
  nlohmann::ordered_json header = nlohmann::ordered_json::parse(file.substr(8, header_bytes));
  header.erase("__metadata__");
  std::string header_text = header.dump();
  header_text.append((8 - (8 + header_text.size()) % 8) % 8, ' ');
  const uint64_t new_header_bytes = header_text.size();
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  stream.write(reinterpret_cast<const char*>(&new_header_bytes), 8);
  stream << header_text << file.substr(8 + header_bytes);
}

void write_safetensors_seeds(const fs::path& folder) {
  using weft::Tensor;
  // Values that survive no conversion unchanged (0.1), overflow f16 (1e5), and the edges (inf, nan,
  // denormals), so reads with conversion meet all of them.
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> values = {0.1, -2.5, 1e5, -1e-8, inf, nan};
  weft::write_safetensors((folder / "f32.safetensors").string(),
                          {{"weight", Tensor::from_vector(values, {2, 3}, weft::kFloat32)},
                           {"bias", Tensor::from_vector(std::vector<double>{1, -1}, {2}, weft::kFloat32)}});
  weft::write_safetensors((folder / "f16.safetensors").string(),
                          {{"weight", Tensor::from_vector(values, {3, 2}, weft::kFloat16)},
                           {"scale", Tensor::full({}, 0.5, weft::kFloat16)}});
  weft::write_safetensors((folder / "bf16.safetensors").string(),
                          {{"weight", Tensor::from_vector(values, {6}, weft::kBFloat16)},
                           {"empty", Tensor::empty({0, 4}, weft::kBFloat16)}},
                          {{"source", "seed_corpus_writer"}});
  weft::write_safetensors((folder / "f64.safetensors").string(),
                          {{"weight", Tensor::from_vector(values, {1, 6}, weft::kFloat64)}});
  const fs::path mixed = folder / "mixed_without_metadata.safetensors";
  weft::write_safetensors(mixed.string(), {{"a.f32", Tensor::from_vector(values, {2, 3}, weft::kFloat32)},
                                           {"b.f16", Tensor::from_vector(values, {6}, weft::kFloat16)},
                                           {"c.bf16", Tensor::from_vector(values, {3, 2}, weft::kBFloat16)},
                                           {"d.f64", Tensor::from_vector(values, {6, 1}, weft::kFloat64)}});
  drop_safetensors_metadata(mixed);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_FOLDER (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const fs::path corpus = argv[1];
  fs::create_directories(corpus / "token_shard");
  fs::create_directories(corpus / "checkpoint");
  fs::create_directories(corpus / "safetensors");
  weft::write_token_shard((corpus / "token_shard" / "tiny.bin").string(), {0, 5, 17, 3, 99, 42, 1, 8});
  weft::write_token_shard((corpus / "token_shard" / "empty.bin").string(), {});

  write_checkpoint_seed(corpus / "checkpoint" / "tiny.seed",
                        {{"weight", weft::Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3})},
                         {"step_count", weft::Tensor::from_vector(std::vector<int64_t>{9}, {1})}});
  write_checkpoint_seed(corpus / "checkpoint" / "scalar_and_empty.seed",
                        {{"scalar", weft::Tensor::full({}, 0.5, weft::kBFloat16)},
                         {"empty", weft::Tensor::empty({0, 4}, weft::kFloat32)}});
  write_safetensors_seeds(corpus / "safetensors");
  std::printf("wrote the seeds under %s\n", corpus.c_str());
  return 0;
}
