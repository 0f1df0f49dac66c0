// ParallelPlanEntry: how a layer asks to be split across the tensor-parallel group — data only.
//
// A module declares, for itself or its children (Module::tensor_parallel_plan), which parallel
// style each takes; parallel/tensor/tensor_parallel_plan.h applies the declarations from outside
// the model in the auto comm mode, turning each layout change they imply into its collective. No
// layer names a collective: a layer only computes with the local sizes its parameters have.
//
//   column           a LinearLayer y = x W^T + b split along its outputs: W, b Split(0) (in
//                    `blocks` when the outputs are several matrices side by side, as fused q/k/v);
//                    input replicated (sequence-split under sequence parallelism: all-gathered),
//                    output split along the last dim
//   row              a LinearLayer split along its inputs: W Split(1), b replicated and added once;
//                    input split along the last dim, output replicated (an all-reduce of the
//                    partial products) or, under sequence parallelism, sequence-split (reduce-scatter)
//   vocabulary       an Embedding split along its rows (the vocabulary): a lookup gives a partial
//                    sum (rows outside the shard are zeros), all-reduced
//   sequence         a module that works row by row (a norm) or holds dropout on the residual
//                    stream: under sequence parallelism it runs on this rank's sequence chunk, its
//                    own parameters' gradients are partial sums over tp, and its dropout masks are
//                    the chunk's part of the one-process masks. Nothing without sequence parallelism.
//
// `module` is relative to the declaring module: "qkv", "mlp.fc", or "" for the module itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft {

enum class ParallelStyle : uint8_t { kColumn, kRow, kVocabulary, kSequence };

struct ParallelPlanEntry {
  std::string module;
  ParallelStyle style;
  std::vector<int64_t> blocks;  // column only: sizes of the output blocks (empty: one block)
};

// "column", "row", "vocabulary", "sequence"; parse_parallel_style throws weft::Error listing them.
const char* parallel_style_name(ParallelStyle style);
ParallelStyle parse_parallel_style(const std::string& name);

}  // namespace weft
