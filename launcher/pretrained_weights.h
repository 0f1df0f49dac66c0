// model.init_from: the start of a run from published Hugging Face weights (GPT-2 or Llama).
//
//   model.init_from: PATH    a model.safetensors file, a model-0000N-of-0000M.safetensors set's
//                            model.safetensors.index.json, or a folder holding either (and usually
//                            config.json, which sets the model keys: launcher/hugging_face_config.h)
//
// The weights are read (memory-mapped, launcher/safetensors.h), converted to f32, mapped to
// weft's names and layouts (launcher/hugging_face_names.h) and checked as full tensors, then each
// rank keeps its part of each under tensor parallelism (parallel/tensor/sharding.h: the same shards
// a one-process model's weights give), before the model is cast, moved to the device and handed
// to the strategy. So every dp, tp and pp layout, in both comm modes, starts from the same weights.
// A run that resumes from a checkpoint takes its weights from the checkpoint instead.
#pragma once

#include <string>
#include <vector>

#include "layers/language_model.h"
#include "parallel/tensor/tensor_parallel_group.h"

namespace weft {

// The safetensors files `init_from` names (one file, or the shards an index lists), and their
// tensors (full, f32, weft's names) for the model `config` describes. `notes` gets the line for
// the start-up log (file, tensor count, dtype conversion) and what was adapted.
std::map<std::string, Tensor> read_pretrained_weights(const std::string& init_from, const ModelConfig& config,
                                                      std::vector<std::string>* notes);

// Reads them and loads this rank's part into `model` (the whole model when `tensor_parallel` is
// null; this rank's shards otherwise). Returns the lines for the start-up log.
std::vector<std::string> load_pretrained_weights(LanguageModel& model, const TensorParallelGroup* tensor_parallel,
                                                 const std::string& init_from, const ModelConfig& config);

}  // namespace weft
