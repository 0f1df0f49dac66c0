// Module: the building block of models — named parameters, named submodules, a forward.
//
// A layer subclasses Module, creates its parameters with register_parameter (each with a layout
// declaration: how it is laid out across tensor-parallel ranks, Replicate for now) and its children
// with register_module, and implements forward. Names nest with dots ("blocks.3.attention.qkv.weight")
// in registration order, which is also the order of parameters(), state_dict() and checkpoints.
// Custom layers outside the tree are written exactly like the built-in ones (see layers/registry.h).
//
// Buffers are tensors a layer derives from its settings (RoPE's cos/sin tables): not trained, not in
// state_dict(), but converted by to() along with the parameters. A buffer keeps the exact values it
// was registered with (usually f64), so converting to f64 later recovers them rather than widening
// an f32 rounding.
//
// Layers read their parameters and buffers back through parameter(name) / buffer(name) at forward
// time instead of caching Tensor copies, because to() replaces them with new tensors.
//
// Tensor parallelism is applied from outside a layer (parallel/tensor/ plans) or written into it
// (parallel/manual/): shard_parameter replaces a parameter with this rank's shard and its layout,
// mark_partial_gradient flags a replicated parameter whose gradient is a partial sum over the tp
// group, and wrap_forward puts a plan's code around the layer's forward (the layout changes and
// their collectives). Parents call their children through call(), which runs the wrapper, so a
// wrapped layer stays wrapped wherever it is used; forward() itself is the layer's own computation.
//
// Invariants: parameter tensors are leaves with requires_grad set; a name is registered once per
// module (parameters, buffers and children share one namespace); train()/eval() and to() propagate
// to every submodule.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "layers/dropout_stream.h"
#include "layers/parallel_plan.h"
#include "runtime/layout.h"
#include "runtime/named_parameter.h"
#include "runtime/tensor.h"

namespace weft {

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The layer's type name as YAML and summaries show it ("Linear", "GPT").
  virtual std::string type_name() const = 0;
  // One line of settings for summary() ("768 -> 3072, bias").
  virtual std::string settings() const { return ""; }
  // The single-tensor forward that most layers have. Layers with other signatures (a model taking
  // ids) add their own and may leave this one throwing.
  virtual Tensor forward(const Tensor& input);
  // forward through the wrapper wrap_forward installed, or forward itself: how a parent runs a child.
  Tensor call(const Tensor& input);

  // Receives the input and the layer's own forward; returns the output (parallel/tensor/ plans).
  using ForwardWrapper = std::function<Tensor(const Tensor& input, const std::function<Tensor(const Tensor&)>& forward)>;
  // Installs `wrapper` around forward for call(); a module takes one wrapper (a second is an error).
  void wrap_forward(ForwardWrapper wrapper);
  bool has_forward_wrapper() const { return forward_wrapper_ != nullptr; }

  // How this module and its children are split across the tensor-parallel group in the auto comm
  // mode (layers/parallel_plan.h): entries relative to this module. Default: none.
  virtual std::vector<ParallelPlanEntry> tensor_parallel_plan() const { return {}; }
  // The child at dotted relative path `path` ("" is this module); null when there is none.
  Module* find_module(const std::string& path);

  void train(bool training = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Registers `tensor` (made a leaf that requires grad) under `name`; returns it.
  Tensor register_parameter(const std::string& name, Tensor tensor, Layout layout = Layout::replicate());
  // Registers a non-trained tensor derived from settings: `exact` is kept, and the live buffer is
  // exact.to(dtype); returns the live buffer.
  Tensor register_buffer(const std::string& name, Tensor exact, DType dtype);
  // Replaces own parameter `name` with `shard` (made a leaf requiring grad), laid out as `layout`:
  // this rank's part of the full parameter. Nothing else about the parameter changes.
  void shard_parameter(const std::string& name, Tensor shard, Layout layout);
  // Own parameter `name`'s gradient is a partial sum over the tensor-parallel group
  // (NamedParameter::partial_gradient).
  void mark_partial_gradient(const std::string& name);
  // The parameters at `paths` (dotted, relative to this module, consecutive in registration order,
  // e.g. {"gate.weight", "up.weight"}) have their gradients written by one product
  // (runtime/ops/swiglu_linear.h): named_parameters() gives them one gradient_group, so that a
  // gradient buffer lays their slots next to each other in one bucket.
  void keep_gradients_adjacent(std::vector<std::string> paths);
  // The live parameter / buffer registered on this module (not a child) as `name`.
  Tensor parameter(const std::string& name) const;
  Tensor buffer(const std::string& name) const;

  // Converts every parameter (and buffer) of this module and its children in place to `dtype` /
  // `device`: each parameter becomes a new leaf requiring grad (gradients are dropped), with the
  // same name and layout. Call it before handing parameters to an optimizer.
  void to(DType dtype);
  void to(Device device);
  // Registers a child; returns it.
  template <class ModuleType>
  std::shared_ptr<ModuleType> register_module(const std::string& name, std::shared_ptr<ModuleType> module) {
    add_child(name, module);
    return module;
  }

  // Every parameter, depth first in registration order, with dotted names.
  std::vector<NamedParameter> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t parameter_count() const;
  // Direct children in registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

  // Name -> parameter tensor (the live tensors, not copies).
  std::map<std::string, Tensor> state_dict() const;
  // Copies values into the parameters. Missing or unexpected names, and shape mismatches, are errors
  // naming the parameter; nothing is modified unless everything matches.
  void load_state_dict(const std::map<std::string, Tensor>& state);

  // One line per layer: indented name, type, settings, parameter count; a total at the end.
  std::string summary() const;

  // Registers a dropout stream owned by this module, so its position (which masks come next) is
  // part of random_state() and a checkpoint resumes with the same masks.
  void register_random_stream(const std::string& name, DropoutStream* stream);
  // Dotted stream name -> offset of its next mask, for this module and every child.
  std::map<std::string, uint64_t> random_state() const;
  // Restores random_state() output; a missing or unexpected name is an error naming it, and nothing
  // is changed unless every name matches.
  void load_random_state(const std::map<std::string, uint64_t>& state);
  // Data parallelism: every dropout stream of this module and its children draws this rank's part
  // of the one-process masks (DropoutStream::set_shard).
  void set_random_shard(int64_t rank, int64_t world);
  // Sequence parallelism: every dropout stream's inputs are sequence chunk `rank` of `size`
  // (DropoutStream::set_sequence_shard).
  void set_random_sequence_shard(int64_t rank, int64_t size);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void collect(const std::string& prefix, std::vector<NamedParameter>& out) const;
  std::vector<std::vector<std::string>> gradient_groups_;  // keep_gradients_adjacent's paths
  struct SummaryRow {
    std::string label;  // indented name and Type(settings)
    int64_t parameters;
  };
  void summarize(const std::string& name, int depth, std::vector<SummaryRow>& rows) const;
  void check_new_name(const std::string& name) const;

  struct NamedBuffer {
    std::string name;
    Tensor exact;  // as registered, never converted
    Tensor live;   // exact in the module's current dtype and device
  };

  std::vector<NamedParameter> parameters_;  // own parameters, local names
  std::vector<NamedBuffer> buffers_;        // own buffers, local names
  std::vector<std::pair<std::string, DropoutStream*>> random_streams_;  // owned by the subclass
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  ForwardWrapper forward_wrapper_;
  bool training_ = true;
};

}  // namespace weft
