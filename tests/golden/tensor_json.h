// How the golden programs hand tensors to their PyTorch scripts: {"shape": [...], "values": [...]}
// with values in row-major order (floats as doubles, integer ids as integers), read back by the
// scripts with torch.tensor(values).reshape(shape).
#pragma once

#include <cstdint>
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

}  // namespace weft::golden
