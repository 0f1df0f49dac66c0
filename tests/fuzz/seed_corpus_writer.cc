// Writes the binary seeds of tests/fuzz/corpus/ with weft's own writers, so the seeds are valid
// files of the formats as weft writes them now:
//   seed_corpus_writer tests/fuzz/corpus
// writes token_shard/{tiny,empty}.bin and checkpoint/{tiny,scalar_and_empty}.seed (state.json, a
// NUL, tensors.bin, as tests/fuzz/checkpoint_fuzz.cc reads them). Run it again after a format change.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "launcher/checkpoint.h"
#include "launcher/token_shard_dataset.h"
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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_FOLDER (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const fs::path corpus = argv[1];
  fs::create_directories(corpus / "token_shard");
  fs::create_directories(corpus / "checkpoint");
  weft::write_token_shard((corpus / "token_shard" / "tiny.bin").string(), {0, 5, 17, 3, 99, 42, 1, 8});
  weft::write_token_shard((corpus / "token_shard" / "empty.bin").string(), {});

  write_checkpoint_seed(corpus / "checkpoint" / "tiny.seed",
                        {{"weight", weft::Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3})},
                         {"step_count", weft::Tensor::from_vector(std::vector<int64_t>{9}, {1})}});
  write_checkpoint_seed(corpus / "checkpoint" / "scalar_and_empty.seed",
                        {{"scalar", weft::Tensor::full({}, 0.5, weft::kBFloat16)},
                         {"empty", weft::Tensor::empty({0, 4}, weft::kFloat32)}});
  std::printf("wrote the seeds under %s\n", corpus.c_str());
  return 0;
}
