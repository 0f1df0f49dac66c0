// DataParallelStrategy: data parallelism (ZeRO 0, 1, 2) in either comm mode, one process included.
//
// Every dp rank holds the whole model and computes gradients on its own rows of each global batch;
// the strategy turns them into one update that is identical on every rank:
//
//   zero 0  each gradient bucket (gradient_buffer.h) is averaged with an all-reduce; every rank
//           runs the whole optimizer;
//   zero 1  as zero 0, and each rank keeps the optimizer state and f32 weights of its chunk of
//           every bucket only (zero_sharding.h), updates them, and all-gathers them back;
//   zero 2  as zero 1, but buckets are reduce-scattered: each rank receives only its chunk's mean.
//
// The comm mode picks the reducer (reducer.h) and where the gathers go: manual reduces after
// backward and gathers at the step's end, on the compute stream, each collective waited for at
// once; auto reduces each bucket on the dp_comm stream as soon as backward has produced it and
// gathers each bucket at the next step's start, before the first forward that reads it. Both run
// the same collectives on the same buffers, so on the CPU they give the same bits.
//
// Over a model split by tensor parallelism (options.tensor_parallel) the same holds per tp rank:
// its buckets hold its shards' gradients; a partial-gradient parameter (NamedParameter) is summed
// over tp when the last micro-batch's backward finishes it, before its bucket is reduced; the
// gradient norm counts replicated parameters once and sums split ones over tp; the loss is
// vocabulary-parallel; checkpoints hold full tensors (gathered over tp, sharded again on load).
//
// With one dp rank the group is the local group of one and no collective is added, unless ZeRO is
// on (its collectives are then copies into and out of the shard) or
// options.collectives_for_one_rank asks for them (stream-ordering tests).
//
// On a pipeline (a PipelineStage, parallel/pipeline/pipeline_stage.h) the same holds per stage:
// the rank trains the parameters of its segments only; its graph is the stage's
// (pipeline_step_builder.h) ordered by the schedule; a shared parameter's gradient (a tied embedding)
// is summed with the other stage's before its bucket is reduced; the loss and the gradient norm are
// summed over the stages; evaluation hands activations down the stages; checkpoints are gathered on
// stage 0.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/data/gradient_buffer.h"
#include "parallel/data/reducer.h"
#include "parallel/data/zero_sharding.h"
#include "parallel/pipeline/pipeline_stage.h"
#include "parallel/step/step_builder.h"
#include "parallel/strategy.h"
#include "runtime/graph/executor.h"
#include "runtime/graph/scheduler.h"

namespace weft {

class DataParallelStrategy final : public Strategy {
 public:
  // `pipeline`: this rank's stage of a pipeline, or null.
  DataParallelStrategy(std::shared_ptr<ProcessGroup> group, int world_rank, LanguageModel& model,
                       const StrategyOptions& options, std::shared_ptr<PipelineStage> pipeline = nullptr);

  void issue_step(int64_t step, double lr, const MicroBatchSource& next_micro_batch) override;
  StepReport finish_step() override;
  int max_steps_in_flight() const override;
  void complete_parameter_updates() override;
  double average(double value) override;
  double evaluation_loss(const Tensor& inputs, const Tensor& targets) override;
  std::map<std::string, Tensor> model_state() override;
  void load_model_state(const std::map<std::string, Tensor>& state) override;
  void wait_for_all_ranks() override;
  std::map<std::string, Tensor> optimizer_state() override;
  void load_optimizer_state(const std::map<std::string, Tensor>& state) override;
  std::map<std::string, uint64_t> random_state(const std::map<std::string, uint64_t>& local) override;
  int64_t optimizer_state_bytes() const override;
  void write_graph(const std::string& path) const override;
  void write_trace(const std::string& path) override;
  std::vector<std::string> description() const override;
  std::vector<double> per_stage(double value) override;

  // For tests: the graph and plan every step runs.
  const graph::StepGraph& step_graph() const { return graph_; }
  const graph::ExecutionPlan& plan() const { return plan_; }

 private:
  // Throws unless every issued step has been finished: `what` reads or writes what they update.
  void check_no_step_in_flight(const char* what) const;
  // The CommStream a collective node runs on, from where the executor runs it.
  CommStream stream_for(const graph::NodeContext& context) const;
  void update(StepState& state);
  // Squared gradient norms [n] of `grads` with split parameters' summed over tp (`split` [n] 1/0).
  Tensor tensor_parallel_squares(const Tensor& squares, const Tensor& split) const;
  // The parameter an optimizer-state key ("<parameter>.<kind>") belongs to; null for "step".
  const NamedParameter* owner_of(const std::string& key) const;

  std::shared_ptr<ProcessGroup> group_;
  LanguageModel& model_;
  std::shared_ptr<TensorParallelGroup> tp_;  // null: no tensor parallelism
  std::shared_ptr<PipelineStage> pipeline_;  // null: no pipeline
  std::vector<ModelSegment> segments_;      // what the step and evaluation run
  LossFunction loss_;                       // null: cross_entropy
  Tensor split_mask_;                       // [parameters] 1 where split over tp (zero 0 clipping)
  Tensor counted_mask_;                     // [parameters] 0 for a pipeline's second copy (zero 0 clipping)
  std::shared_ptr<char> alive_;             // the partial-gradient hooks hold it weakly
  int world_rank_;
  StrategyOptions options_;
  graph::CommMode mode_;
  Device device_;
  std::vector<Tensor> parameters_;          // the model's, for clipping (zero 0)
  GradientBuffer buffer_;
  std::unique_ptr<ZeroSharding> zero_;
  std::unique_ptr<Optimizer> optimizer_;
  std::shared_ptr<Reducer> reducer_;        // shared: the grad-ready hooks hold it weakly
  std::vector<char> gather_pending_;        // per bucket: updated, not yet gathered (zero, auto)
  CommStream dp_comm_;                      // CPU: the executor's dp_comm thread's own stream
  StepState state_;
  graph::StepGraph graph_;
  graph::ExecutionPlan plan_;
  graph::Executor executor_;
  double origin_ms_ = 0.0;                  // clock_ms() after the ranks met: the trace's zero
  // What a step issued and not yet finished keeps for its report, oldest first.
  struct IssuedStep {
    int64_t step = 0;
    CollectiveRecorder::Step recorded;      // the tp layers' collectives (tensor_parallel only)
  };
  std::deque<IssuedStep> issued_;
  // The last update's guard (one element on the device): the next update's previous guard while
  // that step is in flight.
  Tensor last_guard_;
  std::string trace_events_;
};

}  // namespace weft
