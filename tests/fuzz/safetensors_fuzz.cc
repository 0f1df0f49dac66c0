// Fuzz target for the safetensors reader (launcher/safetensors.h): SafetensorsFile, which maps a
// model.safetensors file and validates its header, and read(), which copies one tensor out.
//
// Input: the bytes of one safetensors file (u64 header length, JSON header, data). It is written to
// a scratch file and opened; every tensor is then read as each dtype read() converts to (F32, F16,
// BF16, F64), and every byte of each copy is touched, so a tensor whose bytes lie outside the file,
// or whose shape disagrees with its byte range, is found. A name the file lacks must be an error.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "launcher/safetensors.h"
#include "runtime/error.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

constexpr weft::DType kReadDTypes[] = {weft::kFloat32, weft::kFloat16, weft::kBFloat16, weft::kFloat64};

[[noreturn]] void fail(const std::string& what, const std::string& name) {
  std::fprintf(stderr, "SafetensorsFile: tensor '%s': %s\n", name.c_str(), what.c_str());
  std::abort();
}

void read_every_tensor(const weft::SafetensorsFile& file) {
  uint64_t sum = 0;
  for (const auto& [key, text] : file.metadata()) sum += key.size() + text.size();
  for (const auto& [name, entry] : file.entries()) {
    // A shape whose sizes (each 0 taken as 1) multiply past int64 makes the tensor's strides wrap:
    // the reader must reject it (UBSan reports the wrap; without a sanitizer it is silent).
    int64_t extent = 8;
    for (const int64_t size : entry.shape) {
      if (size < 0 || __builtin_mul_overflow(extent, std::max<int64_t>(size, 1), &extent)) {
        fail("the reader accepted a shape that overflows int64", name);
      }
    }
    const weft::DType stored = weft::safetensors_dtype(entry.dtype, name);
    for (const weft::DType dtype : kReadDTypes) {
      const weft::Tensor tensor = file.read(name, dtype);
      if (tensor.dtype() != dtype || !std::equal(tensor.shape().begin(), tensor.shape().end(), entry.shape.begin(),
                                                 entry.shape.end())) {
        fail("read() gave another dtype or shape than asked for / listed", name);
      }
      if (tensor.numel() * weft::dtype_size(stored) != entry.end - entry.begin) {
        fail("the tensor's byte range does not hold its shape", name);
      }
      const auto* bytes = static_cast<const uint8_t*>(tensor.raw_data());
      const auto count = static_cast<uint64_t>(tensor.numel() * tensor.element_size());
      for (uint64_t index = 0; index < count; ++index) sum += bytes[index];
    }
  }
  if (sum == 1) std::abort();  // never true for the seeds; keeps the loops from being optimized away
  try {
    file.read("no tensor has this name", weft::kFloat32);
  } catch (const weft::Error&) {
    return;
  }
  fail("read() of a missing name did not throw weft::Error", "no tensor has this name");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = (weft::fuzz::scratch_folder() / "model.safetensors").string();
  weft::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const weft::SafetensorsFile file(path);
    read_every_tensor(file);
  } catch (const weft::Error&) {
    // bad input, reported as it should be
  }
  return 0;
}
