// ManualReducer and OverlappedReducer (reducer.h).
#include "parallel/data/reducer.h"

#include "runtime/error.h"

namespace weft {

graph::NodeId Reducer::add_bucket(graph::StepGraph& graph, size_t bucket, graph::NodeId after) {
  const graph::NodeId node = graph.add_node(
      {graph::NodeKind::kCollective, str(reductions_.operation, " bucket ", bucket), -1, graph::StreamClass::kDpComm,
       reductions_.bytes[bucket],
       [reduce = reductions_.reduce, bucket](const graph::NodeContext& context) { return reduce(bucket, context); }},
      {after});
  nodes_.push_back(node);
  if (node_of_bucket_.size() <= bucket) node_of_bucket_.resize(reductions_.bytes.size(), -1);
  node_of_bucket_[bucket] = node;
  return node;
}

void Reducer::order_exchanges_after(graph::StepGraph& graph, graph::NodeId node) {
  for (size_t bucket = 0; bucket < reductions_.exchanges_with_stage.size(); ++bucket) {
    if (!reductions_.exchanges_with_stage[bucket]) continue;
    WEFT_CHECK(bucket < node_of_bucket_.size() && node_of_bucket_[bucket] >= 0, "reducer: bucket ", bucket,
               " exchanges with another stage but has no node yet (call after backward_finished)");
    graph.add_edge(node, node_of_bucket_[bucket]);
  }
}

std::vector<graph::NodeId> ManualReducer::backward_finished(graph::StepGraph& graph, graph::NodeId last_backward) {
  nodes_.clear();
  for (size_t bucket = 0; bucket < reductions_.bytes.size(); ++bucket) add_bucket(graph, bucket, last_backward);
  return nodes_;
}

OverlappedReducer::OverlappedReducer(BucketReductions reductions) : Reducer(std::move(reductions)) {
  const size_t buckets = reductions_.bytes.size();
  WEFT_CHECK(reductions_.ready_segment.size() == buckets &&
                 reductions_.bucket_of_parameter.size() == reductions_.final_segment.size(),
             "overlapped reducer: inconsistent bucket tables");
  signals_.assign(buckets, -1);
  expected_.assign(buckets, 0);
  for (size_t parameter = 0; parameter < reductions_.bucket_of_parameter.size(); ++parameter) {
    const size_t bucket = reductions_.bucket_of_parameter[parameter];
    if (reductions_.final_segment[parameter] == reductions_.ready_segment[bucket]) ++expected_[bucket];
  }
  remaining_ = expected_;
}

void OverlappedReducer::segment_backward_added(graph::StepGraph& graph, int segment, graph::NodeId backward) {
  // Buckets are in backward order, so those ready in this segment come in bucket order.
  for (size_t bucket = 0; bucket < reductions_.bytes.size(); ++bucket) {
    if (reductions_.ready_segment[bucket] != segment) continue;
    signals_[bucket] = graph.add_signal(str("bucket ", bucket, " ready"), backward);
    add_bucket(graph, bucket, signals_[bucket]);
  }
}

std::vector<graph::NodeId> OverlappedReducer::backward_finished(graph::StepGraph& graph, graph::NodeId last_backward) {
  WEFT_CHECK(nodes_.size() == reductions_.bytes.size(), "overlapped reducer: ", nodes_.size(), " of ",
             reductions_.bytes.size(), " buckets were placed; a bucket's ready segment is out of range");
  return nodes_;
}

void OverlappedReducer::backward_begins(int segment, bool last_micro_batch, const graph::NodeContext& context) {
  if (!last_micro_batch) return;  // earlier micro-batches only accumulate
  active_segment_ = segment;
  context_ = &context;
  for (size_t bucket = 0; bucket < remaining_.size(); ++bucket) {
    if (reductions_.ready_segment[bucket] == segment) remaining_[bucket] = expected_[bucket];
  }
}

void OverlappedReducer::backward_ends() {
  // A signal not fired yet (a parameter that got no gradient) fires as its producer ends.
  active_segment_ = -1;
  context_ = nullptr;
}

void OverlappedReducer::gradient_ready(size_t parameter) {
  if (context_ == nullptr || reductions_.final_segment[parameter] != active_segment_) return;
  const size_t bucket = reductions_.bucket_of_parameter[parameter];
  if (reductions_.ready_segment[bucket] != active_segment_) return;
  if (--remaining_[bucket] == 0) context_->fire(signals_[bucket]);
}

}  // namespace weft
