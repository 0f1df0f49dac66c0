// ModelSegment: one piece of a language model's forward, the unit the step graph schedules.
//
// A model is cut into segments that run one after the other: segment 0 takes the token ids
// [B, T], each later one takes the output of the one before, and the last one returns the logits
// [B, T, V]. Composing every segment's forward in order is the model's logits(). The step builder
// (parallel/step/) makes one graph node per (segment, micro-batch, forward | backward), runs a
// segment's backward from the gradient of its output down to its input, and uses `parameters` to
// know which gradients are final once that backward is done (data-parallel buckets start their
// collectives then) and which parameters a forward needs (ZeRO's all-gathers).
//
// Invariants:
// - `parameters` names every parameter the segment's forward reads (full dotted names, as
//   Module::named_parameters() gives them). A parameter may be read by several segments (a tied
//   embedding is read by the first and the last); its gradient is final after the backward of the
//   first segment that reads it, which backward reaches last.
// - `forward` reads parameters at call time (Module::to() replaces them), so a segment list stays
//   valid after the model is converted, but the list itself is cheap to rebuild.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/named_parameter.h"
#include "runtime/tensor.h"

namespace weft {

struct ModelSegment {
  std::string name;                                 // "embedding", "blocks 0-3", "head"
  std::function<Tensor(const Tensor&)> forward;     // input (ids [B, T] or [B, T, C]) -> output
  std::vector<std::string> parameters;              // full dotted names of the parameters it reads
  // Under sequence parallelism (auto comm mode), whether the segment takes / gives its [B, T, C]
  // split along the sequence: a GPT's blocks do both, its head takes one; where a segment gives
  // what the next does not take, the runtime changes the layout between them.
  bool sequence_split_input = false;
  bool sequence_split_output = false;
};

// Runs `segments` one after the other on `input`: what LanguageModel::logits is for a cut model.
Tensor run_segments(const std::vector<ModelSegment>& segments, const Tensor& input);

// The segments of a decoder cut as layers/gpt.h's: "embedding" (index 0: token_embedding.*,
// position_embedding.*), "block N" (index N + 1: blocks.N.*, sequence-split in and out) for each
// of `blocks`, and "head" (index blocks + 1: final_norm.* and head.*, or token_embedding.* when
// `tied`; sequence-split in). `run(index, input)` runs segment `index`; `parameters` are the
// model's. GptModel and parallel/manual's TensorParallelGpt share it.
std::vector<ModelSegment> decoder_segments(const std::vector<NamedParameter>& parameters, size_t blocks, bool tied,
                                           const std::function<Tensor(size_t, const Tensor&)>& run);

}  // namespace weft
