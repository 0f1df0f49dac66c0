// The auto comm mode's tensor parallelism: the plans layers declare, applied from outside the model.
//
// apply_tensor_parallel_plan walks a model built as for one process (its full, one-process
// weights), collects every module's declared ParallelPlanEntry (layers/parallel_plan.h) under its
// full dotted name, lets `overrides` (parallel.tp_plan in YAML: a custom layer's layout, or a
// change to a built-in one) replace or add entries, and applies each:
//
//   column      LinearLayer: weight and bias -> this rank's Split(0) shard (in blocks); forward
//               through column_parallel_linear (input gradient all-reduced under the weight-gradient
//               matmul) or, under sequence parallelism, all_gather_linear (the gather pipelined with
//               the matmul chunks); a fused GELU runs after it
//   row         LinearLayer: weight -> Split(1); forward through row_parallel_linear (all-reduce)
//               or linear_reduce_scatter (sequence parallelism: the reduce-scatter pipelined with the
//               matmul chunks; the bias gradient then partial)
//   vocabulary  Embedding: weight -> Split(0); the lookup gives a partial sum, all-reduced
//   sequence    sequence parallelism only: own parameters' gradients partial, dropout masks of the
//               sequence chunk
//
// and tensor_parallel_segments puts the layout change between segments that sequence parallelism
// needs (the embedding's whole sequence into the first block's chunk). Every collective comes from
// a layout change (parallel/tensor/layout_transition.h, collective_matmul.h, vocab_parallel.h);
// the layers of layers/ contain none. With tp = 1 nothing is applied.
//
// Invariants: a run at tp = N starts from exactly the one-process weights (each rank keeps its
// shard of them, parallel/tensor/sharding.h); the logits come out split along the vocabulary
// (Split(-1)), for vocab_parallel_cross_entropy.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "layers/language_model.h"
#include "parallel/tensor/tensor_parallel_group.h"

namespace weft {

// One applied entry: full module name and style, for the start-up log and tests.
struct AppliedPlanEntry {
  std::string module;
  ParallelStyle style;
};

// `overrides`: full module name, with "*" matching one name component ("blocks.*.mlp.up"), ->
// style name. Throws weft::Error naming the module and the fix when an entry does not fit (a
// column/row style on a module that is not a LinearLayer, an override that matches nothing, a
// size that tp does not divide). Every rank calls it with the same arguments.
std::vector<AppliedPlanEntry> apply_tensor_parallel_plan(LanguageModel& model, const TensorParallelGroup& tp,
                                                         bool sequence_parallel,
                                                         const std::map<std::string, std::string>& overrides);

// `segments` with the layout changes sequence parallelism needs where one segment gives what the
// next does not take (ModelSegment's flags). Without sequence parallelism or at tp = 1: unchanged.
std::vector<ModelSegment> tensor_parallel_segments(std::vector<ModelSegment> segments, const TensorParallelGroup& tp,
                                                   bool sequence_parallel);

}  // namespace weft
