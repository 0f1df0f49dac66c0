// Fuzz target for the token-shard reader (launcher/token_shard_dataset.h): llm.c .bin shards.
//
// Input: the bytes of one shard file (a 256-int32 header, then uint16 tokens). It is opened with
// the vocabulary taken from the tokens and again with a small fixed vocabulary (so the token check
// fails somewhere inside), split as weft-train splits it, and every token is read back.
#include <cstdint>
#include <string>
#include <vector>

#include "launcher/token_shard_dataset.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

void open_and_read(const std::string& path, int64_t vocabulary) {
  try {
    weft::TokenShardDatasets datasets =
        weft::open_token_shard_datasets(path, "", /*val_fraction=*/0.25, vocabulary, /*sequence_length=*/2,
                                        /*seed=*/1);
    // Read through the shared mapping: every token must come from inside the file.
    const auto files = std::make_shared<const weft::TokenShardFiles>(path, vocabulary, "data.train");
    std::vector<int64_t> tokens(files->token_count());
    files->read(0, static_cast<int64_t>(tokens.size()), tokens.data());
    for (const int64_t token : tokens) {
      if (token < 0 || token >= files->vocabulary()) std::abort();  // the reader let a bad token through
    }
  } catch (const weft::Error&) {
    // bad input, reported as it should be
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = (weft::fuzz::scratch_folder() / "shard.bin").string();
  weft::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  open_and_read(path, /*vocabulary=*/0);
  open_and_read(path, /*vocabulary=*/100);
  return 0;
}
