// Fuzz target for the checkpoint reader (launcher/checkpoint.h): load_checkpoint of a step folder.
//
// Input: state.json's text, a NUL byte, then tensors.bin's bytes (JSON holds no NUL, tensors.bin
// does, so it comes last). Both are written into a step folder in a scratch folder, which is then
// loaded. Version 2 files check their header's CRC32C before any other field, so most mutations of
// the header would only ever test that check: each input is loaded a second time with the header's
// checksum recomputed, which lets the file size and entry count fields be fuzzed too.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "launcher/checkpoint.h"
#include "launcher/crc32c.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

// tensors.bin's header (launcher/checkpoint.h): magic, u32 version, u32 CRC32C, u64 bytes, u64 entries.
constexpr size_t kHeaderBytes = 32;
constexpr size_t kHeaderChecksumOffset = 12;

void load(const std::filesystem::path& folder, const std::string& tensors) {
  weft::fuzz::write_file(folder / "tensors.bin", tensors);
  try {
    const weft::LoadedCheckpoint checkpoint = weft::load_checkpoint(folder.string());
    // Every byte of every tensor is read, so a tensor smaller than its shape says is found.
    uint64_t sum = 0;
    for (const auto& [name, tensor] : checkpoint.tensors) {
      // A shape whose sizes multiply past int64 makes numel() and the strides wrap: the reader must
      // reject it (UBSan reports it; without a sanitizer the wrap is silent).
      int64_t extent = tensor.element_size();
      for (const int64_t size : tensor.shape()) {
        if (__builtin_mul_overflow(extent, std::max<int64_t>(size, 1), &extent)) {
          std::fprintf(stderr, "load_checkpoint accepted the tensor '%s', whose shape overflows int64\n", name.c_str());
          std::abort();
        }
      }
      const auto* bytes = static_cast<const uint8_t*>(tensor.raw_data());
      const auto count = static_cast<uint64_t>(tensor.numel() * tensor.element_size());
      for (uint64_t index = 0; index < count; ++index) sum += bytes[index];
    }
    if (sum == 1) std::abort();  // never true for the seeds; keeps the loop from being optimized away
  } catch (const weft::Error&) {
    // bad input, reported as it should be
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> parts = weft::fuzz::split_on_nul(data, size, 2);
  const std::filesystem::path folder = weft::fuzz::scratch_folder() / "step_00000001";
  std::filesystem::create_directories(folder);
  weft::fuzz::write_file(folder / "state.json", parts[0]);
  std::string tensors(parts.size() > 1 ? parts[1] : std::string_view());
  load(folder, tensors);

  uint32_t version = 0;
  if (tensors.size() >= kHeaderBytes) std::memcpy(&version, tensors.data() + 8, 4);
  if (version == 2) {
    std::memset(tensors.data() + kHeaderChecksumOffset, 0, 4);
    const uint32_t checksum = weft::crc32c(0, tensors.data(), kHeaderBytes);
    std::memcpy(tensors.data() + kHeaderChecksumOffset, &checksum, 4);
    load(folder, tensors);
  }
  return 0;
}
