// How the golden programs hand tensors to their PyTorch scripts: {"shape": [...], "values": [...]}
// with values in row-major order (floats as doubles, integer ids as integers), read back by the
// scripts with torch.tensor(values).reshape(shape).
#pragma once

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/tensor.h"

namespace weft::golden {

inline nlohmann::ordered_json tensor_json(const Tensor& tensor) {
  nlohmann::ordered_json entry;
  entry["shape"] = std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end());
  entry["values"] = tensor.to_vector();
  return entry;
}

inline nlohmann::ordered_json index_json(const Tensor& tensor) {
  nlohmann::ordered_json entry;
  entry["shape"] = std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end());
  std::vector<int64_t> values;
  for (double value : tensor.to_vector()) values.push_back(static_cast<int64_t>(value));
  entry["values"] = values;
  return entry;
}

// Writes `document` to `path` (nlohmann prints doubles with full precision); throws on failure, so
// the golden program's main reports it and exits non-zero.
inline void write_document(const nlohmann::ordered_json& document, const std::string& path) {
  std::ofstream file(path);
  if (!file) throw std::runtime_error("cannot open " + path + " for writing");
  file << document.dump() << "\n";
  if (!file) throw std::runtime_error("writing " + path + " failed");
}

}  // namespace weft::golden
