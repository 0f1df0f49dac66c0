// The small model configuration shared by the layer tests: two blocks, C = 8, H = 2, V = 7,
// T_max = 6, init_std 0.4 (weights large enough that every path carries signal), seed 5. Tests
// change fields on the copy they get.
#pragma once

#include "layers/model_config.h"

namespace weft::testing {

inline ModelConfig small_model_config() {
  ModelConfig config;
  config.layers = 2;
  config.dim = 8;
  config.heads = 2;
  config.vocab = 7;
  config.seq_len = 6;
  config.init_std = 0.4;
  config.seed = 5;
  return config;
}

}  // namespace weft::testing
