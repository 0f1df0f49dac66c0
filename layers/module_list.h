// ModuleList: an ordered list of child modules named "0", "1", ... (as torch.nn.ModuleList), so a
// model's blocks get names like "blocks.3.attention.qkv.weight". It has no forward of its own.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "layers/module.h"

namespace weft {

class ModuleList : public Module {
 public:
  std::string type_name() const override { return "ModuleList"; }
  std::string settings() const override { return std::to_string(size()); }

  // Registers `module` as child "<size()>".
  void append(std::shared_ptr<Module> module) { register_module(std::to_string(size()), std::move(module)); }
  size_t size() const { return children().size(); }
  Module& operator[](size_t index) const { return *children().at(index).second; }
};

}  // namespace weft
