// TransformerBlock: one pre-norm decoder block (GPT-2, Llama).
//
//   x [B, T, C] -> x + attention(norm1(x)) -> x + mlp(norm2(x)) -> [B, T, C]
//
// The norms and the MLP are created by name through LayerRegistry (config.norm, config.mlp), so a
// user's registered norm or MLP plugs in without touching this file; each must map [..., C] to
// [..., C] through Module::forward. Construction (and weight draw) order: norm1, attention, norm2,
// mlp. Registered as "transformer_block". With a LayerNorm or RmsNorm as norm2, the first residual
// add and norm2 run as one op (add_layer_norm, add_rms_norm: runtime/ops/normalization.h), and
// with a built-in MLP (GeluMlp, SwigluMlp) the second add happens inside the MLP's output
// projection (linear_add, runtime/ops/matmul.h); the result is the same.
//
// Activation recomputation (config.recompute, from train.recompute; runtime/autograd/recompute.h):
// - none: every op keeps what its backward needs.
// - selective: the block runs as with none, but the built-in MLPs free their hidden activation
//   [B, T, hidden] once the output projection has read it and rebuild it in backward from the
//   tensors its producer keeps anyway (GELU of fc's pre-activation, SwiGLU of gate and up), and
//   with rope the attention frees its rotated q and k and rotates them again in backward. Only
//   elementwise passes rerun: no matmul, no attention kernel (the fused kernel keeps no [T, T]
//   matrix to free) and no collective.
// - full: the block keeps only its input; backward reruns the whole block with autograd recording
//   (its dropout masks replayed from the same Philox offsets) and backpropagates through it.
// Gradients are bitwise those of none on the CPU. The setting lives in ModelConfig because the
// layers that own the activations (attention, the MLPs, their tensor-parallel versions in
// parallel/manual/) are built from it through the registry, and it is read once, at construction.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "layers/attention.h"
#include "layers/module.h"
#include "layers/registry.h"

namespace weft {

class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const LayerContext& context);

  std::string type_name() const override { return "TransformerBlock"; }
  std::string settings() const override;
  // x [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override;

 private:
  // The block's computation, x [B, T, C] -> [B, T, C]: what forward runs, directly or recomputed.
  Tensor compute(const Tensor& x);
  // residual + mlp(normalized) [B, T, C]: the built-in MLPs add it inside their output projection.
  Tensor mlp_adding(const Tensor& normalized, const Tensor& residual);

  std::shared_ptr<Module> norm1_;                    // config.norm over C
  std::shared_ptr<CausalSelfAttention> attention_;
  std::shared_ptr<Module> norm2_;                    // config.norm over C
  std::shared_ptr<Module> mlp_;                      // config.mlp, C -> C
  bool recompute_full_;                              // config.recompute == "full"
};

// recompute(...) of `module`'s forward `function` on x as one region (full recomputation): its
// dropout streams are replayed and its parameters' gradients arrive in the rerun's backward.
// ParallelTransformerBlock (parallel/manual/) shares it.
Tensor recompute_module(Module& module, const std::function<Tensor(const Tensor&)>& function, const Tensor& x);

}  // namespace weft
