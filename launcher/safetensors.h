// safetensors files: the tensor format of Hugging Face checkpoints (model.safetensors), read and
// written without the safetensors library.
//
// Layout (all integers little-endian):
//   u64 N                        bytes of the JSON header that follows
//   N bytes of JSON              {"NAME": {"dtype": "F32", "shape": [V, C], "data_offsets": [BEGIN, END]},
//                                 ..., "__metadata__": {"format": "pt"} (optional, text -> text)}
//   the data                     each tensor's row-major bytes at [BEGIN, END) of this part
//
// Reading maps the file (mmap) and checks everything before a tensor is handed out: the header
// length against the file, the JSON, each entry's fields, END - BEGIN against shape x dtype size,
// offsets inside the data and no two byte ranges overlapping. Every error is a weft::Error naming
// the file and, where there is one, the tensor. F32, F16, BF16 and F64 are read (read() converts
// them to the dtype asked for); another dtype is an error naming it.
//
// Writing is atomic: a temporary file in the target's folder, fsynced, renamed over the target
// (then the folder fsynced), so a crash leaves either the old file or the whole new one. Names are
// written sorted, data in that order and 8-byte aligned (the header is padded with spaces, as the
// safetensors library does), with __metadata__ {"format": "pt"}, which transformers expects.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/shape.h"
#include "runtime/tensor.h"

namespace weft {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;     // as written in the file: "F32", "BF16", ...
  Shape shape;
  int64_t begin = 0;     // byte range [begin, end) within the data part
  int64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws weft::Error naming the file (and tensor) on any problem.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Every tensor, in name order.
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A CPU tensor of `dtype` (floating) holding a copy of tensor `name`, converted from its stored
  // dtype. Throws weft::Error when the name is absent.
  Tensor read(const std::string& name, DType dtype = kFloat32) const;

 private:
  std::string path_;
  const uint8_t* mapped_ = nullptr;  // the whole file
  int64_t file_bytes_ = 0;
  int64_t data_start_ = 0;           // 8 + header length
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// The weft dtype of a safetensors dtype name ("F32" -> f32, "F16", "BF16", "F64"), or throws
// weft::Error naming `what` (file and tensor) and the dtypes weft reads.
DType safetensors_dtype(const std::string& name, const std::string& what);
// "F32", "BF16", "F16", "F64", "I32", "I64" for a weft dtype.
std::string safetensors_dtype_name(DType dtype);

// Writes `tensors` (any device, any dtype; contiguous copies are taken) to `path` atomically, as
// the header describes. `metadata` goes into __metadata__ ({"format": "pt"} is always included).
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace weft
