// What the fuzz targets share: the libFuzzer entry point they each define, a scratch folder for the
// readers that take file paths, and the split of one input into the parts of a multi-file input.
//
// Every target (tests/fuzz/*_fuzz.cc) defines LLVMFuzzerTestOneInput, which hands the input to one
// reader and catches weft::Error: an Error is the reader's correct answer to bad input. Anything
// else that leaves the target (another exception, a crash, a sanitizer report) is a bug. The same
// target links either with libFuzzer (WEFT_FUZZ_WITH_LIBFUZZER=ON) or with tests/fuzz/fuzz_driver.cc.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace weft::fuzz {

// One temporary folder per process, made on first use and removed at exit; each input overwrites
// the files in it, so a run of many inputs does not pile up folders.
inline const std::filesystem::path& scratch_folder() {
  struct Folder {
    std::filesystem::path path;
    Folder() {
      std::string pattern = (std::filesystem::temp_directory_path() / "weft-fuzz-XXXXXX").string();
      if (::mkdtemp(pattern.data()) == nullptr) std::abort();  // no scratch space: nothing can be fuzzed
      path = pattern;
    }
    ~Folder() {
      std::error_code error;
      std::filesystem::remove_all(path, error);
    }
  };
  static const Folder folder;
  return folder.path;
}

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  stream.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The input cut at its first `most_parts` - 1 NUL bytes. Text formats (YAML, JSON, --set values)
// hold no NUL, so a NUL separates the parts of one input unambiguously; the last part keeps all
// that follows, NULs included, so a binary file can come last.
inline std::vector<std::string_view> split_on_nul(const uint8_t* data, size_t size, size_t most_parts) {
  std::vector<std::string_view> parts;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (parts.size() + 1 < most_parts) {
    const size_t nul = rest.find('\0');
    if (nul == std::string_view::npos) break;
    parts.push_back(rest.substr(0, nul));
    rest.remove_prefix(nul + 1);
  }
  parts.push_back(rest);
  return parts;
}

}  // namespace weft::fuzz
