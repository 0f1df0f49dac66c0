// The layer registry: YAML `type:` names resolve to factories here.
//
// Built-in layers register themselves exactly as a user's custom layer does:
//
//   WEFT_REGISTER_LAYER("squared_relu_mlp", [](const weft::LayerContext& context) {
//     return std::make_shared<SquaredReluMlp>(context.config.dim, context.config.hidden_dim);
//   });
//
// at namespace scope in the layer's .cc file. A factory receives the model config and a context
// (the role it is built for and a Philox offset range for its initial weights, so every layer
// draws distinct, reproducible weights). Unknown names are errors listing the registered ones.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layers/model_config.h"
#include "layers/module.h"

namespace weft {

// What a factory gets: the model settings and where to draw initial weights from.
struct LayerContext {
  const ModelConfig& config;
  // Philox counter range start for this layer's weights; factories take ranges from it with
  // next_offset(count) so that layers built in the same order draw the same weights.
  uint64_t* offset;
  uint64_t next_offset(uint64_t count) const {
    const uint64_t start = *offset;
    *offset += count;
    return start;
  }
};

using LayerFactory = std::function<std::shared_ptr<Module>(const LayerContext&)>;

class LayerRegistry {
 public:
  static LayerRegistry& global();
  // Registers a factory; registering a name twice is an error.
  void add(const std::string& name, LayerFactory factory);
  bool contains(const std::string& name) const;
  // Builds the layer registered as `name`; an unknown name is an error listing the registered ones
  // and the nearest match.
  std::shared_ptr<Module> create(const std::string& name, const LayerContext& context) const;
  std::vector<std::string> names() const;

 private:
  std::map<std::string, LayerFactory> factories_;
};

// Registers at static-initialization time; see the example above.
struct LayerRegistration {
  LayerRegistration(const std::string& name, LayerFactory factory) {
    LayerRegistry::global().add(name, std::move(factory));
  }
};

}  // namespace weft

#define WEFT_REGISTER_LAYER_CONCAT_INNER(a, b) a##b
#define WEFT_REGISTER_LAYER_CONCAT(a, b) WEFT_REGISTER_LAYER_CONCAT_INNER(a, b)
#define WEFT_REGISTER_LAYER(name, factory)                                                          \
  static ::weft::LayerRegistration WEFT_REGISTER_LAYER_CONCAT(weft_layer_registration_, __LINE__)( \
      name, factory)
