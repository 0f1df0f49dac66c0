// Reading model.init_from's weights and loading them (pretrained_weights.h).
#include "launcher/pretrained_weights.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include "launcher/hugging_face_names.h"
#include "launcher/safetensors.h"
#include "nlohmann/json.hpp"
#include "parallel/tensor/sharding.h"
#include "runtime/error.h"

namespace weft {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// The files of a sharded set, from its index's weight_map (name -> file beside the index).
std::vector<std::string> files_of_index(const fs::path& index, std::map<std::string, std::string>* weight_map) {
  std::ifstream file(index);
  WEFT_CHECK(file, "model.init_from: cannot read '", index.string(), "'");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& error) {
    WEFT_FAIL("model.init_from: '", index.string(), "' is not valid JSON: ", error.what());
  }
  WEFT_CHECK(json.is_object() && json.contains("weight_map") && json.at("weight_map").is_object(), "model.init_from: '",
             index.string(), "' has no weight_map object (tensor name -> file)");
  std::set<std::string> files;
  for (const auto& [name, value] : json.at("weight_map").items()) {
    WEFT_CHECK(value.is_string(), "model.init_from: '", index.string(), "': weight_map entry '", name,
               "' must name a file");
    (*weight_map)[name] = value.get<std::string>();
    files.insert((index.parent_path() / value.get<std::string>()).string());
  }
  return {files.begin(), files.end()};
}

}  // namespace

std::map<std::string, Tensor> read_pretrained_weights(const std::string& init_from, const ModelConfig& config,
                                                      std::vector<std::string>* notes) {
  std::error_code error;
  const fs::path path(init_from);
  WEFT_CHECK(fs::exists(path, error), "model.init_from: '", init_from, "' does not exist; give a model.safetensors "
             "file or a folder holding model.safetensors (and config.json), as Hugging Face publishes them");
  fs::path chosen = path;
  if (fs::is_directory(path, error)) {
    if (fs::is_regular_file(path / kSingleFile, error)) {
      chosen = path / kSingleFile;
    } else if (fs::is_regular_file(path / kIndexFile, error)) {
      chosen = path / kIndexFile;
    } else {
      WEFT_FAIL("model.init_from: the folder '", init_from, "' holds neither ", kSingleFile, " nor ", kIndexFile,
                "; weft reads Hugging Face weights in the safetensors format (convert a pytorch_model.bin first)");
    }
  }
  std::map<std::string, std::string> weight_map;  // sharded: tensor -> file name
  std::vector<std::string> files;
  const std::string chosen_name = chosen.filename().string();
  if (chosen_name.size() >= 11 && chosen_name.compare(chosen_name.size() - 11, 11, ".index.json") == 0) {
    files = files_of_index(chosen, &weight_map);
  } else {
    files = {chosen.string()};
  }

  std::vector<std::shared_ptr<SafetensorsFile>> opened;
  HuggingFaceTensorSource source;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> owner;
  std::set<std::string> stored_dtypes;
  for (const std::string& file : files) {
    auto safetensors = std::make_shared<SafetensorsFile>(file);
    for (const auto& [name, entry] : safetensors->entries()) {
      WEFT_CHECK(owner.count(name) == 0, "model.init_from: tensor '", name, "' is in both '", owner.at(name)->path(),
                 "' and '", file, "'");
      owner[name] = safetensors;
      source.shapes[name] = entry.shape;
      stored_dtypes.insert(entry.dtype);
    }
  }
  for (const auto& [name, file] : weight_map) {
    const auto found = owner.find(name);
    WEFT_CHECK(found != owner.end() && fs::path(found->second->path()).filename() == file, "model.init_from: ",
               chosen.string(), " puts tensor '", name, "' in ", file, ", which does not hold it");
  }
  source.description = files.size() == 1 ? files[0] : str(chosen.string(), " (", files.size(), " files)");
  source.read = [&owner](const std::string& name) { return owner.at(name)->read(name, kFloat32); };

  const HuggingFaceFormat format = hugging_face_format_of(config);
  std::vector<std::string> adapted;
  std::map<std::string, Tensor> parameters = weft_parameters_from_hugging_face(source, config, format, &adapted);
  std::string dtypes;
  for (const std::string& dtype : stored_dtypes) dtypes += (dtypes.empty() ? "" : ", ") + dtype;
  const bool converted = !(stored_dtypes.size() == 1 && *stored_dtypes.begin() == "F32");
  if (notes != nullptr) {
    notes->push_back(str("model.init_from: ", parameters.size(), " parameters from ", source.shapes.size(), " ",
                         hugging_face_format_name(format), " tensors of ", source.description, " (",
                         dtypes.empty() ? "no tensors" : dtypes, converted ? " converted to f32" : ", kept as f32", ")"));
    for (const std::string& line : adapted) notes->push_back("model.init_from: " + line);
  }
  return parameters;
}

std::vector<std::string> load_pretrained_weights(LanguageModel& model, const TensorParallelGroup* tensor_parallel,
                                                 const std::string& init_from, const ModelConfig& config) {
  std::vector<std::string> notes;
  std::map<std::string, Tensor> parameters = read_pretrained_weights(init_from, config, &notes);
  if (tensor_parallel != nullptr) {
    // This rank's shards, as the one-process weights give them (sharding.h).
    for (const NamedParameter& parameter : model.named_parameters()) {
      const auto found = parameters.find(parameter.name);
      if (found == parameters.end()) continue;  // load_state_dict names what is missing
      found->second = shard_of(found->second, parameter.layout, tensor_parallel->rank(), tensor_parallel->size());
    }
  }
  model.load_state_dict(parameters);
  return notes;
}

}  // namespace weft
