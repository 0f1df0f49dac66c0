// Cost-model setup for a run: the cost model (parallel/cost/) a RunConfig asks for, measured at
// start-up or read from comm.calibration_file, and the run's layout and workload as the step
// simulator takes them — shared by weft-train (its predicted step time and the auto mode's choices)
// and weft-plan.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/run_config.h"
#include "nlohmann/json.hpp"
#include "parallel/cost/calibration.h"
#include "parallel/cost/cost_model.h"
#include "parallel/cost/step_simulator.h"
#include "parallel/tensor/tensor_parallel_group.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace weft {

struct CostModelSetup {
  std::shared_ptr<const CostModel> model;  // null when the run has none (comm.calibrate off, no file)
  std::vector<int> host_ids;               // host of every world rank (parallel/cost/host_topology.h)
  std::vector<std::string> lines;          // what was measured or read, for the start-up log
};

// comm.calibrate and comm.calibration_file decide (config_options.cc's help says how): read the
// file when it exists (unless calibrate is on), else measure when calibrate is on, or auto in
// comm.mode auto; a measurement is written to the file by world rank 0. Collective over the world.
//
// `resumed_state`: the state.json of the checkpoint this run resumes, or null. Where the run would
// measure because calibrate is auto (not on) and that state holds the figures the run it continues
// chose by ("cost_model", saved by weft-train), those figures are taken instead, on every rank, if
// they were measured on this kind of device in this dtype and saved at this run's dp, tp and pp
// (otherwise the run measures, and its log says why).
// Why: a measurement repeats only to its noise, so a new one can tip a choice made from it (the auto
// mode's bucket size); a different bucket layout sums the gradient norm's f32 squares on a GPU in
// another order, and the resumed run would then not be bitwise the run it continues.
CostModelSetup prepare_cost_model(const RunConfig& config, Device device, DType dtype, int world_rank,
                                  const nlohmann::json* resumed_state = nullptr);

// Tokens of one micro-batch on one dp rank: batch_size / dp / micro_batches sequences of seq_len.
int64_t micro_batch_tokens(const RunConfig& config);
// The compute shapes of one micro-batch of `config` on a rank of a tp group of `tp` (heads, the
// MLP width and the vocabulary split by tp), for calibrate().
CalibrationShapes calibration_shapes(const RunConfig& config, int64_t tp);

// Sets tp.ring_chunks, how the auto mode's sequence-parallel linears communicate, from
// comm.collective_matmul (auto: choose_collective_matmul_chunks on this run's shapes, the ring
// without a cost model) and returns the line that says what was chosen and why.
std::string choose_ring_chunks(const RunConfig& config, TensorParallelGroup& tp, const CostModelSetup& cost);

// The run's parallel layout and workload for the step simulator.
ParallelLayout layout_of(const RunConfig& config);
Workload workload_of(const RunConfig& config);

// "predicted step 41.2 ms: compute 30.1, communication 12.0 (exposed 5.1), optimizer 1.2, bubble 20%; 520 MB per rank".
std::string describe_prediction(const StepPrediction& prediction);

}  // namespace weft
