// ParallelTransformerBlock: layers/transformer_block.h's pre-norm block built from the manual
// mode's parallel attention and MLP.
//
//   x [B, T, C] -> x + attention(norm1(x)) -> x + mlp(norm2(x)) -> [B, T, C]
//
// The norms are config.norm from the registry, applied to the rank's whole activations (replicated:
// every rank computes the same) or, under sequence parallelism, to its [B, T/N, C] chunk, whose
// norm gradients are then partial sums over tp (marked so). Names and draw order
// (norm1, attention, norm2, mlp) are TransformerBlock's, as is the fused residual add + LayerNorm.
// config.recompute full reruns the whole block in backward (layers/transformer_block.h), and with it
// the block's forward collectives: each block's communication runs once more per micro-batch.
#pragma once

#include <memory>
#include <string>

#include "layers/module.h"
#include "layers/registry.h"
#include "parallel/manual/parallel_attention.h"

namespace weft {

// Marks every parameter of `module` and its children as having a partial gradient over tp (a layer
// applied to this rank's sequence chunk only).
void mark_partial_gradients(Module& module);

class ParallelTransformerBlock : public Module {
 public:
  ParallelTransformerBlock(const LayerContext& context, const TensorParallelGroup& tp, bool sequence_parallel);

  std::string type_name() const override { return "ParallelTransformerBlock"; }
  // x [B, T, C] -> [B, T, C] (sequence parallel: [B, T/N, C])
  Tensor forward(const Tensor& x) override;

 private:
  Tensor compute(const Tensor& x);  // the block, what forward runs directly or recomputed

  bool recompute_full_;                            // config.recompute == "full"
  std::shared_ptr<Module> norm1_;                  // config.norm over C
  std::shared_ptr<ParallelAttention> attention_;
  std::shared_ptr<Module> norm2_;                  // config.norm over C
  std::shared_ptr<Module> mlp_;                    // ParallelGeluMlp or ParallelSwigluMlp
};

}  // namespace weft
