// Module: parameter bookkeeping, state dicts, dtype/device conversion and the summary (module.h).
#include "layers/module.h"

#include <algorithm>
#include <set>

#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"

namespace weft {
namespace {

// Parameter and buffer names are one path component each; dots belong to nesting.
void check_local_name(const std::string& name, const char* what) {
  WEFT_CHECK(!name.empty() && name.find('.') == std::string::npos, what, " name '", name,
             "' must be non-empty and contain no '.' (dots separate nested modules)");
}

// 1234567 -> "1,234,567": parameter counts are read by people.
std::string with_thousands(int64_t value) {
  std::string digits = std::to_string(value);
  std::string out;
  const int lead = static_cast<int>(digits.size()) % 3;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (static_cast<int>(i) - lead) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// A fresh leaf requiring grad that holds `converted` (which has no history: made under no-grad).
Tensor as_parameter(Tensor converted) {
  if (!converted.is_leaf() || converted.requires_grad()) converted = converted.detach();
  converted.set_requires_grad(true);
  return converted;
}

}  // namespace

Tensor Module::forward(const Tensor& input) {
  WEFT_FAIL(type_name(), " has no single-tensor forward(); call its own entry point (a language model: logits(ids))");
}

void Module::train(bool training) {
  training_ = training;
  for (auto& [name, child] : children_) child->train(training);
}

void Module::check_new_name(const std::string& name) const {
  const auto same = [&](const auto& entry) { return entry.name == name; };
  const bool taken = std::any_of(parameters_.begin(), parameters_.end(), same) ||
                     std::any_of(buffers_.begin(), buffers_.end(), same) ||
                     std::any_of(children_.begin(), children_.end(), [&](const auto& c) { return c.first == name; });
  WEFT_CHECK(!taken, type_name(), ": the name '", name, "' is already registered on this module");
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor, Layout layout) {
  check_local_name(name, "parameter");
  check_new_name(name);
  WEFT_CHECK(tensor.defined(), type_name(), ": parameter '", name, "' is an undefined tensor");
  WEFT_CHECK(is_floating(tensor.dtype()), type_name(), ": parameter '", name, "' must be floating, got ",
             tensor.describe());
  // A tensor computed by ops (a scaled draw, a converted copy) becomes a leaf of its own.
  if (!tensor.is_leaf()) tensor = tensor.detach();
  tensor.set_requires_grad(true);
  parameters_.push_back(NamedParameter{name, tensor, layout});
  return tensor;
}

void Module::shard_parameter(const std::string& name, Tensor shard, Layout layout) {
  for (NamedParameter& entry : parameters_) {
    if (entry.name != name) continue;
    WEFT_CHECK(shard.defined() && shard.dtype() == entry.tensor.dtype() && shard.device() == entry.tensor.device(),
               type_name(), ": the shard of parameter '", name, "' must be ", entry.tensor.describe(),
               "'s dtype and device, got ", shard.describe());
    if (!shard.is_leaf()) shard = shard.detach();
    shard.set_requires_grad(true);
    entry.tensor = shard;
    entry.layout = std::move(layout);
    return;
  }
  WEFT_FAIL(type_name(), " has no parameter '", name, "' to shard");
}

void Module::mark_partial_gradient(const std::string& name) {
  for (NamedParameter& entry : parameters_) {
    if (entry.name == name) {
      entry.partial_gradient = true;
      return;
    }
  }
  WEFT_FAIL(type_name(), " has no parameter '", name, "'");
}

Module* Module::find_module(const std::string& path) {
  if (path.empty()) return this;
  const size_t dot = path.find('.');
  const std::string head = path.substr(0, dot);
  for (auto& [name, child] : children_) {
    if (name == head) return dot == std::string::npos ? child.get() : child->find_module(path.substr(dot + 1));
  }
  return nullptr;
}

Tensor Module::call(const Tensor& input) {
  if (forward_wrapper_ == nullptr) return forward(input);
  return forward_wrapper_(input, [this](const Tensor& x) { return forward(x); });
}

void Module::wrap_forward(ForwardWrapper wrapper) {
  WEFT_CHECK(wrapper != nullptr, type_name(), ".wrap_forward: the wrapper is empty");
  WEFT_CHECK(forward_wrapper_ == nullptr, type_name(), ": its forward is already wrapped (one plan per layer)");
  forward_wrapper_ = std::move(wrapper);
}

Tensor Module::register_buffer(const std::string& name, Tensor exact, DType dtype) {
  check_local_name(name, "buffer");
  check_new_name(name);
  WEFT_CHECK(exact.defined(), type_name(), ": buffer '", name, "' is an undefined tensor");
  autograd::NoGradGuard no_grad;
  exact = exact.detach();
  Tensor live = exact.to(dtype).detach();
  buffers_.push_back(NamedBuffer{name, exact, live});
  return live;
}

Tensor Module::parameter(const std::string& name) const {
  for (const NamedParameter& entry : parameters_) {
    if (entry.name == name) return entry.tensor;
  }
  WEFT_FAIL(type_name(), " has no parameter '", name, "'");
}

Tensor Module::buffer(const std::string& name) const {
  for (const NamedBuffer& entry : buffers_) {
    if (entry.name == name) return entry.live;
  }
  WEFT_FAIL(type_name(), " has no buffer '", name, "'");
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_local_name(name, "module");
  check_new_name(name);
  WEFT_CHECK(module != nullptr, type_name(), ": child module '", name, "' is null");
  module->train(training_);
  children_.emplace_back(name, std::move(module));
}

void Module::keep_gradients_adjacent(std::vector<std::string> paths) {
  WEFT_CHECK(paths.size() >= 2, type_name(), ": keep_gradients_adjacent needs at least two parameters");
  gradient_groups_.push_back(std::move(paths));
}

void Module::collect(const std::string& prefix, std::vector<NamedParameter>& out) const {
  const size_t first = out.size();
  for (const NamedParameter& entry : parameters_) {
    NamedParameter named = entry;
    named.name = prefix + entry.name;
    out.push_back(std::move(named));
  }
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
  for (size_t group = 0; group < gradient_groups_.size(); ++group) {
    const std::vector<std::string>& paths = gradient_groups_[group];
    // The group's members, found in order among this module's entries: one run, in the paths' order.
    size_t at = first;
    while (at < out.size() && out[at].name != prefix + paths[0]) ++at;
    for (size_t member = 0; member < paths.size(); ++member) {
      WEFT_CHECK(at + member < out.size() && out[at + member].name == prefix + paths[member], type_name(),
                 ": keep_gradients_adjacent: '", prefix + paths[member],
                 "' is not a parameter registered right after the group's previous one");
      out[at + member].gradient_group = str(prefix, "#", group);
    }
  }
}

std::vector<NamedParameter> Module::named_parameters() const {
  std::vector<NamedParameter> out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (NamedParameter& entry : named_parameters()) out.push_back(std::move(entry.tensor));
  return out;
}

int64_t Module::parameter_count() const {
  int64_t count = 0;
  for (const NamedParameter& entry : named_parameters()) count += entry.tensor.numel();
  return count;
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> state;
  for (NamedParameter& entry : named_parameters()) state.emplace(std::move(entry.name), std::move(entry.tensor));
  return state;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state) {
  const std::vector<NamedParameter> own = named_parameters();
  // Check everything first, so that a bad checkpoint leaves the model as it was.
  std::vector<std::string> problems;
  std::set<std::string> known;
  for (const NamedParameter& entry : own) {
    known.insert(entry.name);
    const auto found = state.find(entry.name);
    if (found == state.end()) {
      problems.push_back(str("missing parameter '", entry.name, "' (", entry.tensor.describe(), ")"));
    } else if (!found->second.defined()) {
      problems.push_back(str("parameter '", entry.name, "' is an undefined tensor"));
    } else if (found->second.shape() != entry.tensor.shape()) {
      problems.push_back(str("parameter '", entry.name, "' has shape ", shape_string(found->second.shape()),
                             " but the model expects ", shape_string(entry.tensor.shape())));
    } else if (!is_floating(found->second.dtype())) {
      problems.push_back(str("parameter '", entry.name, "' is ", found->second.describe(), ", not floating"));
    }
  }
  for (const auto& [name, tensor] : state) {
    if (!known.contains(name)) problems.push_back(str("unexpected parameter '", name, "' (", tensor.describe(), ")"));
  }
  if (!problems.empty()) {
    std::string message = str(type_name(), ".load_state_dict: ", problems.size(), " problem(s), nothing loaded:");
    for (const std::string& problem : problems) message += "\n  " + problem;
    throw Error(message);
  }
  autograd::NoGradGuard no_grad;
  // copy_ converts dtype, so an f32 checkpoint loads into a bf16 model.
  for (const NamedParameter& entry : own) Tensor(entry.tensor).copy_(state.at(entry.name));
}

void Module::to(DType dtype) {
  WEFT_CHECK(is_floating(dtype), type_name(), ".to: parameters must stay floating, got ", dtype_name(dtype));
  autograd::NoGradGuard no_grad;
  for (NamedParameter& entry : parameters_) {
    if (entry.tensor.dtype() != dtype) entry.tensor = as_parameter(entry.tensor.detach().to(dtype));
  }
  for (NamedBuffer& entry : buffers_) {
    entry.live = entry.exact.to(dtype).to(entry.live.device()).detach();
  }
  for (auto& [name, child] : children_) child->to(dtype);
}

void Module::to(Device device) {
  autograd::NoGradGuard no_grad;
  for (NamedParameter& entry : parameters_) {
    if (entry.tensor.device() != device) entry.tensor = as_parameter(entry.tensor.detach().to(device));
  }
  for (NamedBuffer& entry : buffers_) {
    entry.live = entry.exact.to(entry.live.dtype()).to(device).detach();
  }
  for (auto& [name, child] : children_) child->to(device);
}

void Module::summarize(const std::string& name, int depth, std::vector<SummaryRow>& rows) const {
  std::string label(static_cast<size_t>(depth) * 2, ' ');
  if (!name.empty()) label += name + "  ";
  label += type_name();
  const std::string own_settings = settings();
  if (!own_settings.empty()) label += "(" + own_settings + ")";
  rows.push_back(SummaryRow{label, parameter_count()});
  for (const auto& [child_name, child] : children_) child->summarize(child_name, depth + 1, rows);
}

std::string Module::summary() const {
  std::vector<SummaryRow> rows;
  summarize("", 0, rows);
  rows.push_back(SummaryRow{"total parameters", parameter_count()});
  // Counts line up in one column; the root's line (a model's settings are long) is left out of the
  // width so that it does not push the column far to the right.
  size_t label_width = 0, count_width = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i != 0 || rows.size() == 2) label_width = std::max(label_width, rows[i].label.size());
    count_width = std::max(count_width, with_thousands(rows[i].parameters).size());
  }
  std::string out;
  for (const SummaryRow& row : rows) {
    const std::string count = with_thousands(row.parameters);
    const size_t padding = row.label.size() < label_width ? label_width - row.label.size() : 0;
    out += row.label + std::string(padding + 2, ' ') + std::string(count_width - count.size(), ' ') + count + "\n";
  }
  return out;
}

}  // namespace weft

namespace weft {

void Module::register_random_stream(const std::string& name, DropoutStream* stream) {
  for (const auto& [existing, unused] : random_streams_) {
    WEFT_CHECK(existing != name, type_name(), ": random stream '", name, "' is registered twice");
  }
  random_streams_.emplace_back(name, stream);
}

std::map<std::string, uint64_t> Module::random_state() const {
  std::map<std::string, uint64_t> state;
  std::vector<std::pair<std::string, const Module*>> pending = {{"", this}};
  while (!pending.empty()) {
    auto [prefix, module] = pending.back();
    pending.pop_back();
    for (const auto& [name, stream] : module->random_streams_) state[prefix + name] = stream->offset();
    for (const auto& [name, child] : module->children_) pending.emplace_back(prefix + name + ".", child.get());
  }
  return state;
}

void Module::load_random_state(const std::map<std::string, uint64_t>& state) {
  std::map<std::string, DropoutStream*> streams;
  std::vector<std::pair<std::string, const Module*>> pending = {{"", this}};
  while (!pending.empty()) {
    auto [prefix, module] = pending.back();
    pending.pop_back();
    for (const auto& [name, stream] : module->random_streams_) streams[prefix + name] = stream;
    for (const auto& [name, child] : module->children_) pending.emplace_back(prefix + name + ".", child.get());
  }
  for (const auto& [name, offset] : state) {
    WEFT_CHECK(streams.count(name) == 1, "load_random_state: unexpected random stream '", name,
               "' (the checkpoint is from a different model)");
  }
  for (const auto& [name, stream] : streams) {
    WEFT_CHECK(state.count(name) == 1, "load_random_state: random stream '", name, "' is missing from the state");
  }
  for (const auto& [name, stream] : streams) stream->set_offset(state.at(name));
}

void Module::set_random_shard(int64_t rank, int64_t world) {
  for (auto& [name, stream] : random_streams_) stream->set_shard(rank, world);
  for (auto& [name, child] : children_) child->set_random_shard(rank, world);
}

void Module::set_random_sequence_shard(int64_t rank, int64_t size) {
  for (auto& [name, stream] : random_streams_) stream->set_sequence_shard(rank, size);
  for (auto& [name, child] : children_) child->set_random_sequence_shard(rank, size);
}

}  // namespace weft
