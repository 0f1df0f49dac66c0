// Strategy: how a run spreads one optimizer step over its ranks — the one object the trainer sees.
//
// make_strategy builds it once per run from the mesh, the model (already converted to its dtype
// and device) and the options: it places the model's segments on this rank, owns the gradient
// buffer, the reducer, the step graph, the scheduler's plan, the executor and the optimizer, and
// runs one step per step() call. The trainer keeps the loop, evaluation, checkpoints and metrics;
// it has no "if data parallel" branch and includes nothing of runtime/graph/. A single process is
// the data-parallel strategy over a group of one, which adds no collectives.
//
// Every call marked collective must be made by every rank, in the same order.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/language_model.h"
#include "optim/optimizer.h"
#include "parallel/cost/cost_model.h"
#include "parallel/mesh.h"
#include "parallel/pipeline/pipeline_stage.h"
#include "parallel/step/micro_batch.h"
#include "parallel/tensor/tensor_parallel_group.h"

namespace weft {

class HierarchicalAllReduce;

struct StrategyOptions {
  std::string comm_mode = "manual";   // manual | auto
  int64_t zero_stage = 0;             // 0 | 1 | 2
  int64_t bucket_bytes = 0;           // gradient bucket size; 0: default_bucket_bytes(device)
  int64_t micro_batches = 1;
  double weight_decay = 0.0;          // for the decayed group (2-D and larger parameters)
  double grad_clip = 0.0;             // global grad-norm clip (0: off)
  std::string on_nan = "stop";        // stop | skip: a non-finite loss or gradient norm
  bool trace = false;                 // keep every step's timeline for write_trace
  // With one dp rank, still add the bucket collectives (copies on a group of one): lets a test
  // check stream ordering on one GPU.
  bool collectives_for_one_rank = false;
  // One process on one GPU without collectives: each segment's weight-gradient products on a second
  // stream (parallel/step/weight_gradient_overlap.h). Unset: WEFT_WEIGHT_GRADIENT_STREAM decides.
  // Where a run has collectives, a pipeline or tensor parallelism it is not used either way. Tests set
  // it true on the CPU, where the products are deferred and run in line.
  std::optional<bool> weight_gradient_stream;
  // Tensor parallelism: the tp group the model is split over (build_parallel_model); null at tp 1.
  // The logits are then split along the vocabulary and the loss is vocabulary-parallel.
  std::shared_ptr<TensorParallelGroup> tensor_parallel;
  // Sequence parallelism (with tensor_parallel, auto mode): the layout changes between segments.
  bool sequence_parallel = false;
  // Pipeline parallelism (mesh.pp() > 1): the schedule, chunks per rank and the cut.
  PipelineOptions pipeline;
  // The cost model (parallel/cost/cost_model.h), when the run calibrated or read one, and the host
  // of every world rank (parallel/cost/host_topology.h): the auto mode then chooses the gradient
  // bucket size by the model when bucket_bytes is 0 (parallel/cost/bucket_choice.h).
  std::shared_ptr<const CostModel> cost_model;
  std::vector<int> host_ids;
  int64_t micro_batch_tokens = 0;     // tokens of one micro-batch on this rank, for the cost model
  // The dp gradient all-reduce where the dp group spans hosts (comm.dp_all_reduce): auto (by the
  // cost model; flat without one), flat, or hierarchical (parallel/comm/hierarchical_all_reduce.h).
  std::string dp_all_reduce = "auto";
  // Set by make_strategy when the two-level all-reduce is taken.
  std::shared_ptr<HierarchicalAllReduce> hierarchical_all_reduce;
  // Start-up lines the strategy adds to description() (filled by make_strategy: what it chose and why).
  std::vector<std::string> notes;
  // Builds the optimizer over the given groups (make_adamw / make_sgd with the run's options).
  std::function<std::unique_ptr<Optimizer>(std::vector<ParameterGroup>)> make_optimizer;
};

// What one step did, for the step log.
struct StepReport {
  double loss = 0.0;            // mean over the global batch
  double grad_norm = 0.0;       // before clipping (NaN or infinite where that skipped the step)
  bool skipped = false;
  double compute_ms = 0.0;
  double comm_ms = 0.0;
  double exposed_comm_ms = 0.0;
  double overlap_ratio = 0.0;
  // Pipelines: the measured bubble (mean over stages) and the schedule's in theory; 0 without.
  double pipeline_bubble = 0.0;
  double pipeline_bubble_theory = 0.0;
  // clock_ms() by which the step's work had ended (graph::StepTimeline::end_clock_ms): with steps in
  // flight, a step's wall time runs from the later of its issue and the last step's end to this.
  double end_clock_ms = 0.0;
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  // One optimizer step at learning rate `lr`: every micro-batch from `next_micro_batch`, the
  // collectives, the update. Collective. issue_step and finish_step in a row; no step may be in flight.
  StepReport step(int64_t step, double lr, const MicroBatchSource& next_micro_batch) {
    issue_step(step, lr, next_micro_batch);
    return finish_step();
  }
  // The same step in two halves: issue_step hands the step's work to the device and returns (on a
  // GPU before it has run; `next_micro_batch` is called inside it), finish_step waits for the oldest
  // step issued and reports it. Up to max_steps_in_flight() steps may be issued before the first of
  // them is finished, so that the device runs the next step while the host reads the last one's
  // loss. A step's update is applied on the device before the next step reads the weights, so the
  // steps compute exactly what they compute one at a time. finish_step applies train.on_nan (it
  // throws for `stop`). Both collective.
  virtual void issue_step(int64_t step, double lr, const MicroBatchSource& next_micro_batch) = 0;
  virtual StepReport finish_step() = 0;
  // 2 where a step may be issued before the last is finished; 1 where each step's report must be
  // known before the next is issued: pipelines (their sends are completed per step). With on_nan
  // "skip" the step issued after a skipped one updates with the counts the skip left (the device
  // reads the skipped step's guard: runtime/optimizer_update.h), and finish_step takes the skipped
  // step's counts back on the host.
  virtual int max_steps_in_flight() const = 0;
  // Brings every parameter up to date with the last update (ZeRO's auto mode gathers them at the
  // next step's start): call before evaluating or saving, with no step in flight. Collective.
  virtual void complete_parameter_updates() = 0;

  // The mean over the dp group of a per-rank value (the validation loss). Collective.
  virtual double average(double value) = 0;
  // Waits for every rank, without the collectives' deadline (a checkpoint write may be slow).
  virtual void wait_for_all_ranks() = 0;

  // The mean loss of a batch (ids and targets [B, T] on the host) under the current weights, no
  // gradients: what evaluation runs, through the same segments and loss as training. Collective
  // over the tp group.
  virtual double evaluation_loss(const Tensor& inputs, const Tensor& targets) = 0;

  // Checkpoints, in a layout that does not depend on the ranks (the parameters' full, unsharded
  // shapes: a run saved at one dp, tp and ZeRO stage resumes at another). Collective.
  virtual std::map<std::string, Tensor> model_state() = 0;
  virtual void load_model_state(const std::map<std::string, Tensor>& state) = 0;
  // The optimizer state ("<parameter>.<kind>" of the parameter's full shape, "<parameter>.step",
  // "step"), and its restore, after the model's parameters were loaded.
  virtual std::map<std::string, Tensor> optimizer_state() = 0;
  virtual void load_optimizer_state(const std::map<std::string, Tensor>& state) = 0;
  // The dropout streams' positions of the whole model (Module::random_state) from this rank's
  // `local` ones: on a pipeline each stage advances only its own modules' streams, so each stream's
  // position is taken from the stage that runs it. Collective.
  virtual std::map<std::string, uint64_t> random_state(const std::map<std::string, uint64_t>& local) { return local; }
  // Bytes of optimizer state this rank keeps.
  virtual int64_t optimizer_state_bytes() const = 0;

  // The step graph as log.graph_file writes it (.json or .dot).
  virtual void write_graph(const std::string& path) const = 0;
  // `value` of every pipeline stage, stage 0 first ({value} without a pipeline): the memory each
  // stage holds, for the step log. Collective.
  virtual std::vector<double> per_stage(double value) { return {value}; }
  // Lines for the start-up log (a pipeline's cut and schedule); empty when there is nothing to say.
  virtual std::vector<std::string> description() const { return {}; }
  // Every rank's timelines of the steps so far (options.trace) as one Chrome trace: a process row
  // per rank, a thread row per stream. Collective; rank 0 writes `path`.
  virtual void write_trace(const std::string& path) = 0;
};

// The gradient bucket size when none is configured, from measurements (docs/performance.md): 25 MB
// on GPUs, where NCCL's all-reduce reaches about three quarters of its peak bus bandwidth at that
// size and smaller buckets lose it; 1 MB on the CPU, where MPI's cost per collective is small and
// the smaller buckets hide almost all communication under backward (97-99% against 17% at 25 MB on
// a 4-block, dim-256 model over 2 ranks).
int64_t default_bucket_bytes(Device device);

// The strategy for `mesh`: data parallelism (ZeRO, the two comm modes) over a model that may be
// split over its tp group (options.tensor_parallel) and cut into pipeline stages (mesh.pp() > 1,
// options.pipeline). Collective.
std::unique_ptr<Strategy> make_strategy(const Mesh& mesh, int world_rank, LanguageModel& model,
                                        const StrategyOptions& options);

// The sizes tensor parallelism splits evenly, each named by its config key: model.heads,
// model.kv_heads, model.vocab, the MLP width, and model.seq_len with sequence parallelism.
std::vector<std::pair<std::string, int64_t>> tensor_parallel_splits(const ModelConfig& config, bool sequence_parallel);

// The model this rank trains, with its weights in f32 on the host. tp = 1: build_model(config).
// tp > 1: the tp group on `device` and the model split over it, from exactly the one-process
// weights — in the manual comm mode the Megatron-style layers of parallel/manual/, in the auto mode
// the plain layers with their declared plan and `plan_overrides` applied (parallel/tensor/). Errors
// name the keys (parallel.tp against model.heads, model.kv_heads, model.vocab, the MLP width,
// model.seq_len with parallel.sp) and suggest values. Collective.
struct ParallelModel {
  std::shared_ptr<LanguageModel> model;
  std::shared_ptr<TensorParallelGroup> tensor_parallel;  // null at tp 1
  std::vector<std::string> plan;                          // "blocks.0.attention.qkv: column", auto mode
};
ParallelModel build_parallel_model(const ModelConfig& config, const Mesh& mesh, Device device,
                                   const std::string& comm_mode, bool sequence_parallel,
                                   const std::map<std::string, std::string>& plan_overrides);

}  // namespace weft
