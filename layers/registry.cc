// LayerRegistry: name -> factory, with errors that help a user fix a typo (registry.h).
#include "layers/registry.h"

#include <algorithm>
#include <limits>

#include "runtime/error.h"

namespace weft {
namespace {

// Levenshtein distance, for "did you mean" in the unknown-name error.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitution = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitution});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

LayerRegistry& LayerRegistry::global() {
  // A function-local static: registrations run during static initialization of other files, in
  // an order C++ does not fix, and this is constructed on first use.
  static LayerRegistry registry;
  return registry;
}

void LayerRegistry::add(const std::string& name, LayerFactory factory) {
  WEFT_CHECK(!name.empty(), "LayerRegistry: a layer type needs a non-empty name");
  WEFT_CHECK(factory != nullptr, "LayerRegistry: layer type '", name, "' was registered with an empty factory");
  WEFT_CHECK(!factories_.contains(name), "LayerRegistry: layer type '", name,
             "' is already registered; pick another name for the new layer");
  factories_.emplace(name, std::move(factory));
}

bool LayerRegistry::contains(const std::string& name) const { return factories_.contains(name); }

std::shared_ptr<Module> LayerRegistry::create(const std::string& name, const LayerContext& context) const {
  const auto found = factories_.find(name);
  if (found == factories_.end()) {
    std::string nearest;
    size_t best = std::numeric_limits<size_t>::max();
    for (const auto& [candidate, factory] : factories_) {
      const size_t distance = edit_distance(name, candidate);
      if (distance < best) best = distance, nearest = candidate;
    }
    std::string message = str("unknown layer type '", name, "'; registered types: ", joined(names()));
    if (!nearest.empty()) message += str("; did you mean '", nearest, "'?");
    throw Error(message);
  }
  std::shared_ptr<Module> module = found->second(context);
  WEFT_CHECK(module != nullptr, "LayerRegistry: the factory of '", name, "' returned no module");
  return module;
}

std::vector<std::string> LayerRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, factory] : factories_) out.push_back(name);
  return out;
}

}  // namespace weft
