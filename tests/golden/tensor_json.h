// How the golden programs hand tensors to their PyTorch scripts: {"shape": [...], "values": [...]}
// with values in row-major order (floats as doubles, integer ids as integers), read back by the
// scripts with torch.tensor(values).reshape(shape).
#pragma once

#include <cstdint>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <utility>
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

// Sets out["weights"] and out["grads"] to {name: tensor} of `named` (name, parameter) pairs, in
// their order. A parameter that got no gradient is written as null; the comparison reports it.
inline void add_weights_and_grads(nlohmann::ordered_json& out,
                                  const std::vector<std::pair<std::string, Tensor>>& named) {
  nlohmann::ordered_json weights = nlohmann::ordered_json::object(), grads = nlohmann::ordered_json::object();
  for (const auto& [name, tensor] : named) {
    weights[name] = tensor_json(tensor.detach());
    grads[name] = tensor.grad().defined() ? tensor_json(tensor.grad()) : nlohmann::ordered_json(nullptr);
  }
  out["weights"] = std::move(weights);
  out["grads"] = std::move(grads);
}

// Writes `document` to `path` (nlohmann prints doubles with full precision); throws on failure.
inline void write_document(const nlohmann::ordered_json& document, const std::string& path) {
  std::ofstream file(path);
  if (!file) throw std::runtime_error("cannot open " + path + " for writing");
  file << document.dump() << "\n";
  if (!file) throw std::runtime_error("writing " + path + " failed");
}

// A golden program's main: `program OUTPUT.json` writes build() there. Exit status 2 for a wrong
// command line, 1 (with "program: message") when building or writing the document throws.
inline int golden_main(int argc, char** argv, const char* program,
                       const std::function<nlohmann::ordered_json()>& build) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " OUTPUT.json\n";
    return 2;
  }
  try {
    write_document(build(), argv[1]);
    std::cout << program << ": wrote " << argv[1] << "\n";
  } catch (const std::exception& error) {
    std::cerr << program << ": " << error.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace weft::golden
