// NamedParameter: one trained tensor with the name and layout it is known by outside its module.
//
// Module::named_parameters() hands these out (layers/module.h), and the code that works on a whole
// model's parameters without knowing its layers (optimizers, data parallelism, checkpoints) takes
// them. It lives in runtime/ so that such code depends on runtime/ only.
//
// Invariants: `name` is the full dotted name ("blocks.3.attention.qkv.weight"), unique within a
// model; `tensor` aliases the trained storage (the module's parameter, or a view of it for a shard),
// so updating it in place updates the model.
#pragma once

#include <string>

#include "runtime/layout.h"
#include "runtime/tensor.h"

namespace weft {

struct NamedParameter {
  std::string name;  // full dotted name
  Tensor tensor;     // the parameter itself (or a view of it), not a copy
  Layout layout;     // across the tensor-parallel ranks: `tensor` is this rank's shard of it
  // The gradient this rank computes is a partial sum over the tensor-parallel group (a replicated
  // parameter applied to this rank's sequence chunk: norms and biases under sequence parallelism);
  // the strategy sums it over tp before the update.
  bool partial_gradient = false;
  // Non-empty for parameters whose gradients one product writes together (swiglu_linear's gate and
  // up weights), the same string for each of them (Module::keep_gradients_adjacent): consecutive in
  // registration order, and a gradient buffer keeps their slots next to each other in one bucket.
  std::string gradient_group{};
};

}  // namespace weft
