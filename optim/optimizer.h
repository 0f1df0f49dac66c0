// Optimizers: update parameters from their accumulated gradients.
//
// An Optimizer holds parameter groups (weight decay applies to matrices, not to norms and biases),
// its per-parameter state (momentum, Adam moments) and, when the model computes in bf16/f16, the
// f32 master weights (master_weights.h: for bf16 stored as low halves beside the parameter):
// step() updates the master weights and writes them back rounded.
// Gradients are read from each parameter's .grad (any floating dtype) and are not cleared by step();
// call zero_grad(). All state is f32 (f64 for f64 parameters) and is part of the checkpoint.
//
// As in PyTorch, a parameter whose .grad is undefined at step() is skipped: no decay, no state
// change. State is allocated (zeros) when the optimizer is built, so state_dict() always has every
// entry. The implementations are sgd.h and adamw.h; master_weights.h says how a master copy stays
// in step with a parameter that is written outside the optimizer (for example by loading weights).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/named_parameter.h"
#include "runtime/tensor.h"

namespace weft {

struct ParameterGroup {
  std::vector<NamedParameter> parameters;
  double weight_decay = 0.0;
};

// Splits parameters into a decayed group (2-D and higher: matrices and embeddings) and a group
// without decay (1-D: biases and norm weights), as GPT-2 and Llama training do.
std::vector<ParameterGroup> default_parameter_groups(const std::vector<NamedParameter>& parameters,
                                                     double weight_decay);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update with learning rate `lr` (the schedule is applied by the caller). `guard`, when given,
  // is one element on the parameters' device: the device applies the update only if it is finite,
  // with no host read (runtime/optimizer_update.h), so a step graph can pass its loss and leave the
  // NaN policy to the device. The step counts advance either way; once the caller has read the
  // guard and found it non-finite, undo_step() takes them back.
  // `previous_guard`, with steps in flight: the guard of the step issued before this one, which the
  // caller has not read yet. Where it is not finite that step was skipped, and an optimizer whose
  // update depends on its counts (AdamW's bias corrections) updates with the counts one lower, as
  // it would after undo_step() (runtime/optimizer_update.h); the caller still calls undo_step(1)
  // for that step once it has read it.
  virtual void step(double lr, const Tensor& guard = Tensor(), const Tensor& previous_guard = Tensor()) = 0;
  // Whether step_with_gradient_scale is offered (AdamW): gradient clipping can then hand its factor
  // to the update instead of scaling every gradient first.
  virtual bool takes_gradient_scale() const { return false; }
  // step() with every gradient read multiplied by `gradient_scale` (one element on the parameters'
  // device, as runtime/optimizer_update.h says); the .grad tensors are left as they are. Only where
  // takes_gradient_scale().
  virtual void step_with_gradient_scale(double lr, const Tensor& guard, const Tensor& gradient_scale,
                                        const Tensor& previous_guard = Tensor());
  // Forgets the counts of a step() its guard skipped: the last one, or with `later_steps` the one
  // that many step() calls before it (a step in flight read after the next was issued). Bias
  // corrections and steps_taken() are then as if it had not been called. Throws weft::Error when
  // there is no such step to undo (the last two steps can be undone, each once).
  virtual void undo_step(int later_steps = 0) = 0;
  void zero_grad();
  // Optimizer state for checkpoints: "<parameter name>.<state name>" -> tensor, plus "step".
  virtual std::map<std::string, Tensor> state_dict() const = 0;
  // Restores state_dict() output; missing or mismatched entries are errors naming them.
  virtual void load_state_dict(const std::map<std::string, Tensor>& state) = 0;
  int64_t steps_taken() const { return steps_; }
  // Bytes of the state this optimizer keeps, as stored (a bf16 parameter's master counts its 2
  // bytes of low halves, not the 4 of the f32 values state_dict() shows); nothing is copied.
  int64_t state_bytes() const;
  const std::vector<ParameterGroup>& parameter_groups() const { return groups_; }

 protected:
  // Checks that every parameter is a defined, contiguous floating tensor with a unique name.
  explicit Optimizer(std::vector<ParameterGroup> groups);
  // Registers a live state tensor under `key` ("<parameter name>.<state name>"); the subclass keeps
  // its own handle to the same tensor and updates it in place, so restore_state() reaches it.
  void register_state(const std::string& key, const Tensor& tensor);
  // Registers the master of `parameter` (make_master_weights) under `key` ("<parameter name>.master"):
  // the state dict holds its f32 values whatever its storage (master_values / master_from_values).
  void register_master(const std::string& key, const Tensor& parameter, const Tensor& master);
  // The shared halves of state_dict() / load_state_dict(): copies of every registered tensor plus
  // "step" (i64 scalar). restore_state checks everything (missing, unexpected, shape, dtype) before
  // it copies anything, so a failed load leaves the optimizer as it was.
  std::map<std::string, Tensor> snapshot_state() const;
  void restore_state(const std::map<std::string, Tensor>& state);

  std::vector<ParameterGroup> groups_;
  int64_t steps_ = 0;

 private:
  std::map<std::string, Tensor> state_;  // key -> live state tensor (aliases the subclass's handles)
  std::map<std::string, Tensor> master_parameters_;  // key of a master in state_ -> its parameter
};

struct SgdOptions {
  double momentum = 0.0;
  bool nesterov = false;
};

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

std::unique_ptr<Optimizer> make_sgd(std::vector<ParameterGroup> groups, const SgdOptions& options);
std::unique_ptr<Optimizer> make_adamw(std::vector<ParameterGroup> groups, const AdamWOptions& options);

}  // namespace weft
