// The run config a checkpoint was trained with, as programs that start from a checkpoint alone read
// it (weft-generate, weft-export).
//
// weft-train stores its merged config as YAML in state.json ("config"); this parses it with the same
// loader as a run's YAML files, so every key is checked the same way. model.init_from is cleared: the
// checkpoint holds the weights, and the model keys that the Hugging Face config.json set are in the
// stored config already, so the published weights need not be at hand any more.
#pragma once

#include "launcher/checkpoint.h"
#include "launcher/run_config.h"

namespace weft {

// Throws weft::Error when `checkpoint` holds no stored config (not written by weft-train).
RunConfig checkpoint_run_config(const LoadedCheckpoint& checkpoint);

}  // namespace weft
