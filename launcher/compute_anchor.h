// The cost model's compute anchor: one micro-batch of the run's own model, forward and backward,
// timed on one rank and set against what the calibrated rates predict for it. The ratio becomes
// ComputeRates::scale, which every modelled compute duration is multiplied by.
//
// Why: the rates are measured op by op at the model's shapes (parallel/cost/calibration.h), while a
// training step also pays for its autograd graph, its allocations and many small ops. On a GPU the
// kernels queue ahead and hide most of that (the model predicts GPT-2 124M within 2-4 %); on the CPU
// each op pays it in line, and a small model's step measured about 1.4x the modelled time on one
// rank. The anchor is measured on the CPU only: there it is cheap (a small model, host memory), while
// on a GPU a second copy of a large model could take memory the run needs.
//
// Invariants: collective over the world (every rank calls; the host's first rank times while the
// others wait in a barrier, so that ranks sharing cores do not disturb the figure, as for the rates;
// the slowest host's figure is kept, the same on every rank). `model.compute.scale` must be 1 on the call.
#pragma once

#include <string>
#include <vector>

#include "launcher/run_config.h"
#include "parallel/cost/cost_model.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace weft {

// Measures the anchor for `config` (its model at its micro-batch on one rank: train.batch_size /
// parallel.dp / train.micro_batches sequences, unsplit) and sets model.compute.scale; returns the
// line that says what was measured, or why nothing was (not the CPU, a model too large).
std::string anchor_compute(const RunConfig& config, Device device, DType dtype, const std::vector<int>& host_ids,
                           CostModel& model);

}  // namespace weft
