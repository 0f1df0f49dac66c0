// weft-export's work: a weft checkpoint written as a Hugging Face model folder.
//
//   OUT_DIR/model.safetensors   the model's parameters under GPT-2 or Llama names (hugging_face_names.h)
//   OUT_DIR/config.json         what transformers' from_pretrained(OUT_DIR) reads (hugging_face_config.h)
//
// The model is described by the run config stored in the checkpoint (state.json), read with
// model.init_from cleared: a run started from published weights exports without them at hand. Both
// files are written atomically (a temporary file, fsync, rename), weights first. A model the
// format cannot express is an error naming the setting, before anything is written.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "launcher/checkpoint.h"
#include "launcher/checkpoint_run_config.h"
#include "launcher/hugging_face_names.h"
#include "launcher/run_config.h"

namespace weft {

// The model's parameters of `checkpoint` (its "model." tensors without the prefix), as f32.
std::map<std::string, Tensor> checkpoint_model_parameters(const LoadedCheckpoint& checkpoint);

struct HuggingFaceExport {
  std::string weights_path;  // OUT_DIR/model.safetensors
  std::string config_path;   // OUT_DIR/config.json
  int64_t tensors = 0;
  int64_t parameters = 0;    // elements
};

// Writes `checkpoint` to `out_dir` (created when missing) as `format` with weights in `dtype`
// (f32, bf16 or f16).
HuggingFaceExport export_hugging_face(const LoadedCheckpoint& checkpoint, const std::string& out_dir,
                                      HuggingFaceFormat format, DType dtype = kFloat32);

}  // namespace weft
