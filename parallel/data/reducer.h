// Reducer: when a gradient bucket's collective runs, as graph nodes of the step.
//
// The step builder (parallel/step/step_builder.h) tells the reducer where backward is; the reducer
// adds one collective node per bucket (kind collective, stream dp_comm, its bytes) whose work is
// `reduce(bucket, context)`. The two comm modes differ only in where those nodes hang:
//
//   ManualReducer      every bucket after the whole backward (the last micro-batch's last segment),
//                      as a hand-written loop does; the manual scheduler then runs them on the
//                      compute stream, each waited for at once.
//   OverlappedReducer  bucket b as soon as its last gradient of the last micro-batch is ready
//                      (earlier micro-batches only accumulate): on a signal node "bucket b ready"
//                      produced by the backward of segment ready_segment[b], fired from the
//                      parameters' grad-ready hooks (gradient_ready) when the last of the bucket's
//                      parameters that this backward finishes has accumulated, or at the latest
//                      when that backward ends. The auto scheduler runs it on the dp_comm stream
//                      while backward goes on.
//
// Either way the collectives and their order on the dp group are the same, so both modes give the
// same bits. backward_finished returns the nodes the optimizer must wait for.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/graph/step_graph.h"

namespace weft {

struct BucketReductions {
  std::vector<int> ready_segment;     // per bucket: the segment whose backward completes it
  std::vector<size_t> bucket_of_parameter;   // per parameter (GradientBuffer's indices)
  std::vector<int> final_segment;     // per parameter: the segment whose backward finishes its gradient
  std::vector<int64_t> bytes;         // per bucket, this rank's contribution
  std::string operation;              // "all_reduce" or "reduce_scatter", for node names
  std::function<CompletionPtr(size_t bucket, const graph::NodeContext&)> reduce;
  // Per bucket, or empty for none: its reduce first exchanges a gradient shared with another
  // pipeline stage (a tied embedding), waiting on the host for that stage.
  std::vector<char> exchanges_with_stage;
};

class Reducer {
 public:
  explicit Reducer(BucketReductions reductions) : reductions_(std::move(reductions)) {}
  virtual ~Reducer() = default;
  // The backward of `segment` for the step's last micro-batch was just added as `backward`.
  virtual void segment_backward_added(graph::StepGraph& graph, int segment, graph::NodeId backward) = 0;
  // Every backward node is in; `last_backward` is the last one. Returns the bucket nodes.
  virtual std::vector<graph::NodeId> backward_finished(graph::StepGraph& graph, graph::NodeId last_backward) = 0;
  // After backward_finished: the buckets that exchange with another stage wait for `node` too (the
  // pipeline's last send, so that the exchange's host wait never holds back a message the other
  // stage needs first).
  void order_exchanges_after(graph::StepGraph& graph, graph::NodeId node);

  // While a step runs: the step builder brackets each segment backward with these, and every
  // parameter's grad-ready hook calls gradient_ready with its index (one thread: compute's).
  virtual void backward_begins(int segment, bool last_micro_batch, const graph::NodeContext& context) {}
  virtual void backward_ends() {}
  virtual void gradient_ready(size_t parameter) {}

 protected:
  graph::NodeId add_bucket(graph::StepGraph& graph, size_t bucket, graph::NodeId after);
  BucketReductions reductions_;
  std::vector<graph::NodeId> nodes_;
  std::vector<graph::NodeId> node_of_bucket_;  // per bucket: its collective node (-1 before it is added)
};

class ManualReducer final : public Reducer {
 public:
  using Reducer::Reducer;
  void segment_backward_added(graph::StepGraph&, int, graph::NodeId) override {}
  std::vector<graph::NodeId> backward_finished(graph::StepGraph& graph, graph::NodeId last_backward) override;
};

class OverlappedReducer final : public Reducer {
 public:
  explicit OverlappedReducer(BucketReductions reductions);
  void segment_backward_added(graph::StepGraph& graph, int segment, graph::NodeId backward) override;
  std::vector<graph::NodeId> backward_finished(graph::StepGraph& graph, graph::NodeId last_backward) override;
  void backward_begins(int segment, bool last_micro_batch, const graph::NodeContext& context) override;
  void backward_ends() override;
  void gradient_ready(size_t parameter) override;

 private:
  std::vector<graph::NodeId> signals_;     // per bucket
  std::vector<int> expected_;              // per bucket: parameters its ready segment finishes
  std::vector<int> remaining_;             // of those, not yet ready in the running backward
  int active_segment_ = -1;                // the last micro-batch's backward now running, or -1
  const graph::NodeContext* context_ = nullptr;
};

}  // namespace weft
