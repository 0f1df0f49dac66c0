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
  return node;
}

std::vector<graph::NodeId> ManualReducer::backward_finished(graph::StepGraph& graph, graph::NodeId last_backward) {
  nodes_.clear();
  for (size_t bucket = 0; bucket < reductions_.bytes.size(); ++bucket) add_bucket(graph, bucket, last_backward);
  return nodes_;
}

void OverlappedReducer::segment_backward_added(graph::StepGraph& graph, int segment, graph::NodeId backward) {
  // Buckets are in backward order, so those ready after this segment come in bucket order.
  for (size_t bucket = 0; bucket < reductions_.bytes.size(); ++bucket) {
    if (reductions_.ready_segment[bucket] == segment) add_bucket(graph, bucket, backward);
  }
}

std::vector<graph::NodeId> OverlappedReducer::backward_finished(graph::StepGraph& graph, graph::NodeId last_backward) {
  WEFT_CHECK(nodes_.size() == reductions_.bytes.size(), "overlapped reducer: ", nodes_.size(), " of ",
             reductions_.bytes.size(), " buckets were placed; a bucket's ready segment is out of range");
  return nodes_;
}

}  // namespace weft
